"""Every front-end from several threads at once, on shared parameters: eager ops, static
functions traced in a thread while others run, a vertex function, a recursive function with
kinds, and autobatched per-sample code — each call's value and its input's gradient equal the
same call made alone, and the parameters' gradients add up to the sum of the calls'.

(A trace in one thread once recorded another thread's eager ops, and a recursive function's
trace took another thread's call for a call on a child: docs/bad_input.md, "Session 42".)"""

import sys

import numpy as np

import minicavs as mc

from threads import run_in_threads

E = H = 3


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    U, V, W = (mc.Parameter(rng.standard_normal(s) * 0.5) for s in ((E, H), (H, H), (E, H)))

    def cell(v):
        v.scatter(mc.tanh(v.pull() @ U + (v.gather(0) + v.gather(1)) @ V))

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), arity=2, dtype="float64")

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def R(node):
        h = node.pull() @ (W if node.is_leaf else U)
        for child in node.children:
            h = h + R(child) @ V
        return mc.tanh(h)

    trees = [[[]], [[], [], [0, 1]], [[], [], [0, 1], [], [2, 3]], [[], [], [], [1, 2], [0, 3]]]
    batches = [mc.GraphBatch([mc.InputGraph(trees[k % 4]), mc.InputGraph(trees[(k + 1) % 4])])
               for k in range(4)]
    pulls = [rng.standard_normal((b.num_vertices, E)) for b in batches]
    return (U, V, W), F, R, batches, pulls


def _per_sample(x, n, U, V):
    """Autobatched per-sample code: a chain over each row of ``x``, summed."""
    h = mc.tensor(np.zeros((1, H)))
    for t in range(n):
        h = mc.tanh(x[t:t + 1] @ U + h @ V)
    return mc.sum(h * h)


def _call(kind, k, params, F, R, batches, pulls):
    U, V, W = params
    x = mc.tensor(pulls[k], requires_grad=True)
    if kind == "vertex":
        loss = mc.sum(F(batches[k], pull=x) ** 2)
    elif kind == "recursive":
        loss = mc.sum(R(batches[k], pull=x) ** 2)
    elif kind == "static":  # a new function each call: traced here, beside the other threads
        f = mc.symbolic(lambda a: mc.tanh(a @ W) * 2.0)
        loss = mc.sum(f(x) ** 2)
    elif kind == "eager":
        loss = mc.sum(mc.tanh(x @ U @ V) ** 2)
    else:
        with mc.autobatch(kind):
            n = len(pulls[k])
            loss = mc.add_n([_per_sample(x[i:i + 2], min(2, n - i), U, V)
                             for i in range(0, n, 2)])
            loss.backward()
        return loss.item(), x.grad.numpy()
    loss.backward()
    return loss.item(), x.grad.numpy()


KINDS = ("vertex", "recursive", "static", "eager", "agenda+", "depth")


def test_every_front_end_from_several_threads_at_once():
    params, F, R, batches, pulls = _setup()
    calls = [(kind, k) for kind in KINDS for k in range(len(batches))]
    alone = {c: _call(*c, params, F, R, batches, pulls) for c in calls}
    for p in params:
        p.grad = None
    for c in calls:  # (the parameters' gradients of all the calls, one thread)
        _call(*c, params, F, R, batches, pulls)
    total = [p.grad.numpy().copy() for p in params]

    params2, F2, R2, batches2, pulls2 = _setup()  # (fresh: traced in the threads)
    rounds = 2

    def work(t):
        for i in range(rounds * len(calls)):
            kind, k = calls[(t * 5 + i) % len(calls)]
            value, grad = _call(kind, k, params2, F2, R2, batches2, pulls2)
            want_value, want_grad = alone[kind, k]
            assert abs(value - want_value) <= 1e-9 * max(1.0, abs(want_value)), (kind, k)
            np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12,
                                       err_msg=f"{kind} {k}")

    threads = 6
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads interleave every few bytecodes: races show)
    try:
        run_in_threads(work, threads)
    finally:
        sys.setswitchinterval(switch)
    for p, want in zip(params2, total):  # every call made threads * rounds times in all
        np.testing.assert_allclose(p.grad.numpy(), want * threads * rounds, rtol=1e-9,
                                   atol=1e-12)


def test_bounded_caches_evicted_by_several_threads_at_once(monkeypatch):
    """Autobatch's caches of kernels and learned call forms drop their oldest entries when
    full; threads filling them together (a new constant each op: a kernel each) get right
    values and no error (a key taken by another thread between finding and dropping it
    raised KeyError)."""
    signature = sys.modules["minicavs.autobatch.signature"]
    scope = sys.modules["minicavs.autobatch.scope"]
    monkeypatch.setattr(signature, "_KERNELS_KEPT", 4)
    monkeypatch.setattr(scope, "_LEARNED_KEPT", 4)
    W = mc.Parameter(np.array([1.0, 2.0]))

    def work(t):
        for r in range(30):
            with mc.autobatch():
                values = [mc.sum(W * (t + 0.5 * i + 0.125 * r)) for i in range(6)]
            assert [v.item() for v in values] == [3.0 * (t + 0.5 * i + 0.125 * r)
                                                  for i in range(6)]

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        run_in_threads(work, 6)
    finally:
        sys.setswitchinterval(switch)
    assert len(signature._KERNELS) <= 4 + 6  # (each thread may add one past the bound)
