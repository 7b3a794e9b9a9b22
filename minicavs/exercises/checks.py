"""The checks of the exercises: ``CHECKS[name] = (title, check)``; ``check(module)`` returns a
message or raises :class:`ExerciseFailed`. Each check uses the library's own tools; none
changes the library (an op an exercise defines is a private, unregistered ``Op``)."""

import warnings

import numpy as np

import minicavs as mc
from minicavs.ops.registry import Aval, Op, apply


class ExerciseFailed(Exception):
    """The reader's file does not pass yet; the message says why."""


def _call(what, fn, *args):
    try:
        return fn(*args)
    except ExerciseFailed:
        raise
    except NotImplementedError:
        raise ExerciseFailed(f"{what} is not written yet (it raises NotImplementedError)")
    except Exception as error:
        raise ExerciseFailed(f"{what} raised {type(error).__name__}: {error}") from error


def _prediction(module, truth):
    predicted = getattr(module, "PREDICTION", None)
    if not isinstance(predicted, dict) or any(predicted.get(k) is None for k in truth):
        raise ExerciseFailed(f"fill in every entry of PREDICTION ({', '.join(truth)})")
    wrong = [k for k in truth if _plain(predicted[k]) != _plain(truth[k])]
    if wrong:
        raise ExerciseFailed("these predictions differ from what the library computes: "
                             + ", ".join(f"{k} (you said {predicted[k]!r})" for k in wrong)
                             + ". Run the code and read the output to see why.")
    return "Every prediction matches: " + ", ".join(f"{k} = {truth[k]!r}" for k in truth)


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _softsign_forward(xp, x):
    return x / (1 + xp.abs(x))


# --- 1 tensors ------------------------------------------------------------------------------

def check_tensors(module):
    x = np.random.default_rng(0).standard_normal((3, 4))
    out = _call("softsign(x)", module.softsign, mc.tensor(x))
    if not isinstance(out, mc.Tensor) or not np.allclose(out.numpy(), x / (1 + np.abs(x))):
        raise ExerciseFailed("softsign(x) is not x / (1 + |x|) on a Tensor")
    try:
        mc.gradcheck(module.softsign, [x])
    except mc.GradientCheckError as error:
        raise ExerciseFailed(f"the gradient is wrong: {error}")
    graph = _call("tracing softsign", mc.trace, module.softsign, mc.spec((2, 3), "float64"))
    return f"values, gradients (gradcheck) and a trace on symbols: {graph}"


# --- 2 autodiff -----------------------------------------------------------------------------

def check_autodiff(module):
    op = Op("exercise:softsign", _softsign_forward, lambda x: Aval(tuple(x.shape), x.dtype),
            vjp=module.vjp)                                  # private: never registered
    x = np.random.default_rng(1).standard_normal((2, 5))
    try:
        _call("gradcheck of your vjp", mc.gradcheck, lambda t: apply(op, t), [x])
    except ExerciseFailed as failure:
        raise ExerciseFailed(f"{failure}") from None
    return "gradcheck agrees with your VJP at every entry"


# --- 3 gradcheck ----------------------------------------------------------------------------

def _cube_vjp_with_a_bug(g, out, x):
    # Right for |x| <= 2; 10% off beyond. A test that never draws |x| > 2 passes.
    return (g * 3 * x * x * mc.where(mc.abs(x) > 2, 1.1, 1.0),)


def check_gradcheck(module):
    from hypothesis import HealthCheck, given, settings

    cube = Op("exercise:cube", lambda xp, x: x * x * x, lambda x: Aval(tuple(x.shape), x.dtype),
              vjp=_cube_vjp_with_a_bug)
    strategy = _call("inputs()", module.inputs)

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def gradient_is_right(x):
        x = np.asarray(x, dtype=np.float64)
        mc.gradcheck(lambda t: apply(cube, t), [x])

    try:
        gradient_is_right()
    except mc.GradientCheckError as error:
        return f"your strategy found the bug: {str(error)[:160]}"
    except Exception as error:
        raise ExerciseFailed(f"the property failed for another reason: "
                             f"{type(error).__name__}: {error}") from error
    raise ExerciseFailed("60 examples from your strategy, and gradcheck passed on all: the bug "
                         "hides where your inputs never go")


# --- 4 symbolic -----------------------------------------------------------------------------

def check_symbolic(module):
    from minicavs.runtime.analysis import fusion_groups, merge_common_subexpressions

    W = mc.Parameter(np.ones((3, 3)))

    def f(x):  # the function of the template
        return mc.exp(x @ W) * mc.sigmoid(x @ W) + mc.tanh(x)

    graph = mc.trace(f, mc.spec((2, 3), "float64"))
    merged = merge_common_subexpressions(graph)
    groups = fusion_groups(merged)
    truth = {"ops": len(graph.op_nodes()), "ops_after_cse": len(merged.op_nodes()),
             "fused_groups": len(groups), "largest_group": max((len(g) for g in groups),
                                                               default=0)}
    return _prediction(module, truth)


# --- 5 vertex -------------------------------------------------------------------------------

def _random_trees(seed, count=6):
    rng = np.random.default_rng(seed)
    trees = []
    for _ in range(count):
        leaves = int(rng.integers(1, 7))
        nodes = [[] for _ in range(leaves)]
        ready = list(range(leaves))
        while len(ready) > 1:
            a, b = (ready.pop(int(rng.integers(len(ready)))) for _ in range(2))
            nodes.append([a, b])
            ready.append(len(nodes) - 1)
        trees.append(nodes)
    return trees


def _subtree_sizes(children):
    size = [0] * len(children)
    for v in range(len(children)):  # children come before parents in these trees
        size[v] = 1 + sum(size[c] for c in children[v])
    return size


def check_vertex(module):
    from minicavs.vertex import evaluate_per_sample

    F = _call("VertexFunction(cell)", lambda: mc.VertexFunction(
        module.cell, scatter_shape=(1,), arity=2, dtype="float64"))
    trees = _random_trees(2)
    batch = mc.GraphBatch([mc.InputGraph(t) for t in trees])
    out = _call("F(batch)", F, batch).numpy()[:, 0]
    want = np.concatenate([_subtree_sizes(t) for t in trees])
    if not np.allclose(out, want):
        raise ExerciseFailed(f"subtree sizes differ: got {out[:8].tolist()}..., want "
                             f"{want[:8].tolist()}...")
    reference = evaluate_per_sample(F, batch, None).numpy()[:, 0]
    assert np.allclose(reference, out)
    return f"F counts the subtree of every vertex of {len(trees)} random trees, batched and " \
           f"per sample"


# --- 6 schedule -----------------------------------------------------------------------------

def check_schedule(module):
    rng = np.random.default_rng(3)
    graphs = [mc.InputGraph(t) for t in _random_trees(4)]
    for _ in range(4):  # DAGs: each vertex picks up to 3 children among the earlier ones
        n = int(rng.integers(2, 9))
        graphs.append(mc.InputGraph([sorted(set(rng.integers(0, v, int(rng.integers(0, 4)))
                                                .tolist())) if v else [] for v in range(n)]))
    for g in graphs:
        children = [list(map(int, g.children(v))) for v in range(g.num_vertices)]
        got = _call("levels(children)", module.levels, children)
        want = mc.GraphBatch([g]).level.tolist()
        if list(map(int, got)) != want:
            raise ExerciseFailed(f"for children={children}: you gave {list(got)}, the batch "
                                 f"schedules {want}")
    return f"your levels equal GraphBatch's on {len(graphs)} trees and DAGs"


# --- 7 program ------------------------------------------------------------------------------

def _tree_cell(with_bias=True, with_head=True):
    E, H = 3, 4
    rng = np.random.default_rng(0)
    W, U = mc.Parameter(rng.standard_normal((E, H))), mc.Parameter(rng.standard_normal((2 * H, H)))
    b, W_out = mc.Parameter(np.zeros(H)), mc.Parameter(rng.standard_normal((H, 2)))

    def cell(v):
        pre = v.pull() @ W + mc.concat([v.gather(0), v.gather(1)]) @ U
        h = mc.sigmoid(pre + b if with_bias else pre)
        v.scatter(h)
        if with_head:
            v.push(h @ W_out)

    return cell, dict(pull_shape=(E,), scatter_shape=(H,), push_shape=(2,) if with_head else
                      None, arity=2)


def check_program(module):
    cell, shapes = _tree_cell(with_bias=False, with_head=True)
    F = mc.VertexFunction(cell, **shapes)
    counts = [(len(p.eager), len(p.core), len(p.lazy)) for p in (F.program, F.backward_program)]
    return _prediction(module, {"F": list(counts[0]), "dF": list(counts[1])})


# --- 8 lazy ---------------------------------------------------------------------------------

def check_lazy(module):
    cell, shapes = _tree_cell(with_bias=True, with_head=True)
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(4) for _ in range(3)])
    X = mc.tensor(np.random.default_rng(5).standard_normal((batch.num_vertices, 3)))
    truth = {}
    for key, options in (("with", None), ("without", {"lazy_batching": False})):
        F = mc.VertexFunction(cell, options=options, **shapes)
        mc.sum(F(batch, pull=X)).backward()
        truth[key] = F.explain()["backward_ops_per_level"]
    return _prediction(module, truth)


# --- 9 autobatch ----------------------------------------------------------------------------

def check_autobatch(module):
    def vjp(g, out, x):
        s = mc.sum(x, axis=-1, keepdims=True)
        return (g / s - mc.sum(g * x, axis=-1, keepdims=True) / (s * s),)

    normalize = Op("exercise:normalize", lambda xp, x: x / x.sum(axis=-1, keepdims=True),
                   lambda x: Aval(tuple(x.shape), x.dtype), vjp=vjp, batch=module.rule)
    rng = np.random.default_rng(6)
    W = mc.Parameter(rng.random((3, 4)) + 0.5)
    samples = [rng.random((k, 3)) + 0.1 for k in (2, 2, 3, 2)]

    def model(xs):  # plain per-sample code
        return mc.sum(mc.stack([mc.sum(apply(normalize, mc.tensor(x) @ W) ** 2) for x in xs]))

    eager = model(samples)
    eager.backward()
    eager_grad, W.grad = W.grad.numpy().copy(), None
    with mc.autobatch("agenda+"):
        batched = _call("autobatched code with your rule", model, samples)
        _call("its backward", batched.backward)
    if not np.isclose(float(batched.detach()), float(eager)):
        raise ExerciseFailed(f"batched value {float(batched.detach()):.6f} != per-sample "
                             f"{float(eager):.6f}: the rule mixes the rows of a batch")
    if not np.allclose(W.grad.numpy(), eager_grad):
        raise ExerciseFailed("the values agree but the gradients do not")
    return "autobatched == per-sample eager, value and gradient"


# --- 10 kinds -------------------------------------------------------------------------------

def _heights(children):
    h = [0] * len(children)
    for v in range(len(children)):
        h[v] = 1 + max(h[c] for c in children[v]) if children[v] else 0
    return h


def check_kinds(module):
    height = module.height
    if not isinstance(height, mc.RecursiveFunction):
        raise ExerciseFailed("height must stay decorated with @mc.recursive(...)")
    trees = _random_trees(7)
    batch = mc.GraphBatch([mc.InputGraph(t) for t in trees])
    zeros = mc.tensor(np.zeros((batch.num_vertices, 1), np.float32))
    out = _call("height(batch, pull=zeros)", height, batch, zeros).numpy()[:, 0]
    want = np.concatenate([_heights(t) for t in trees])
    if not np.allclose(out, want):
        raise ExerciseFailed(f"heights differ: got {out[:8].tolist()}..., want "
                             f"{want[:8].tolist()}...")
    return f"the heights of {len(trees)} random trees, one trace per kind: " \
           f"{sorted(height.explain()['kinds'])}"


# --- 11 growth ------------------------------------------------------------------------------

def check_growth(module):
    table = mc.Parameter(np.random.default_rng(8).standard_normal((4, 4)))

    def cell(v):
        h = mc.tanh(mc.embedding(table, v.pull()) + v.gather(0))
        v.scatter(h)
        v.push(h)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(4,),
                          push_shape=(4,), arity=1)
    grown = _call("mc.grow with your decide", mc.grow, F, np.arange(3), module.decide)
    for s in range(3):
        tree = grown.tree(s)
        children = [list(tree.children(v)) for v in range(tree.num_vertices)]
        if tree.num_vertices != 7 or sorted(len(c) for c in children) != [0] * 4 + [2] * 3:
            raise ExerciseFailed(f"sample {s} grew {tree.num_vertices} vertices with child "
                                 f"counts {[len(c) for c in children]}: a complete binary tree "
                                 f"of depth 2 has 7, three with two children")
    return f"{grown}: three complete binary trees of depth 2"


# --- 12 native ------------------------------------------------------------------------------

def check_native(module):
    rng = np.random.default_rng(9)
    U = mc.Parameter(rng.standard_normal((4, 4)))
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(4)])
    X = mc.tensor(rng.standard_normal((batch.num_vertices, 4)))

    def plain(v):
        v.scatter(mc.tanh(v.pull() + v.gather(0) @ U))

    def with_softmax(v):
        v.scatter(mc.tanh(v.pull() + mc.softmax(v.gather(0) @ U)))

    truth = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, cell in (("plain", plain), ("with_softmax", with_softmax)):
            F = mc.VertexFunction(cell, pull_shape=(4,), scatter_shape=(4,), arity=2)
            F(batch, pull=X)
            truth[name] = F.explain()["forward_backend"].split(" ")[0]
    return _prediction(module, truth)


# --- 13 cuda --------------------------------------------------------------------------------

def check_cuda(module):
    from minicavs.cuda.shim import shim_kernel

    source = getattr(module, "SOURCE", None)
    if not isinstance(source, str) or "axpy" not in source:
        raise ExerciseFailed("SOURCE must be the CUDA source of a kernel named axpy")
    kernel = _call("compiling SOURCE with the g++ shim", shim_kernel, source, "axpy")
    rng = np.random.default_rng(10)
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    want = np.float32(2.5) * x + y
    _call("running axpy", kernel, (4,), (64,), (np.float32(2.5), x, y, np.int64(len(x))))
    if not np.array_equal(y, want):
        bad = int(np.flatnonzero(y != want)[0])
        raise ExerciseFailed(f"y[{bad}] = {y[bad]} after the kernel, want {want[bad]} (4 blocks "
                             f"of 64 threads for 1000 elements: each thread must loop)")
    try:
        from minicavs.cuda import nvrtc
        nvrtc.compile_to_ptx(source, "axpy.cu")
        compiled = "and NVRTC compiles it for the GPU"
    except mc.KernelCompileError as error:
        raise ExerciseFailed(f"the shim runs it but NVRTC does not compile it: {error}")
    except Exception as error:  # no NVRTC here: the shim's check stands alone
        compiled = f"(NVRTC is not available here: {type(error).__name__})"
    return f"the shim runs your kernel and it equals NumPy, {compiled}"


# --- 14 distributed -------------------------------------------------------------------------

def check_distributed(module):
    rng = np.random.default_rng(11)
    data = rng.standard_normal((8, 3))
    W = mc.Parameter(rng.standard_normal((3, 2)))

    def losses(rows):
        return [mc.sum((mc.tensor(r) @ W) ** 2) for r in rows]

    mc.mean(mc.stack(losses(data))).backward()  # one process: the mean over the batch
    want, W.grad = W.grad.numpy().copy(), None
    total = np.zeros_like(want)
    for share in (data[:3], data[3:]):  # two ranks, unequal shares; allreduce = the sum
        loss = _call("rank_loss", module.rank_loss, losses(share), len(data))
        loss.backward()
        total += W.grad.numpy()
        W.grad = None
    if not np.allclose(total, want):
        raise ExerciseFailed("the ranks' summed gradient differs from one process's: each rank "
                             "divides by what?")
    return "the sum over the ranks equals one process's gradient, with shares of 3 and 5"


# --- 15 explain -----------------------------------------------------------------------------

def check_explain(module):
    U = mc.Parameter(np.eye(2))

    def cell(v):
        v.scatter(mc.tanh(v.pull() + v.gather(0) @ U + v.gather(1) @ U))

    F = mc.VertexFunction(cell, pull_shape=(2,), scatter_shape=(2,), arity=2)
    batch = mc.GraphBatch([mc.InputGraph.chain(4), mc.InputGraph.complete_binary(4),
                           mc.InputGraph(children=[[], [0], [0, 1]])])
    F(batch, pull=mc.tensor(np.ones((batch.num_vertices, 2))))
    stats = F.explain()
    return _prediction(module, {"levels": stats["levels"],
                                "vertices_per_level": stats["vertices_per_level"]})


# --- 16 measure -----------------------------------------------------------------------------

def check_measure(module):
    from .. import training

    rng = np.random.default_rng(0)
    histories = [[], [(None, {"fine": float("nan")})],
                 [(None, {"fine": 0.4}), (None, {"fine": 0.5}), (None, {"fine": 0.5})],
                 [(None, {"loss": 0.3}), (None, {"fine": 0.2, "loss": 0.2})]]
    for _ in range(200):  # scores on a coarse grid, so ties are common; some missing
        histories.append([(None, {} if rng.random() < 0.1 else
                           {"fine": float("nan") if rng.random() < 0.1 else
                            float(rng.integers(0, 5)) / 4})
                          for _ in range(int(rng.integers(1, 8)))])
    for history in histories:
        expected = training.best_epoch(history, "fine")
        got = _call("best_epoch", module.best_epoch, history, "fine")
        if got != expected:
            scores = [metrics.get("fine") for _, metrics in history]
            raise ExerciseFailed(f"best_epoch for dev scores {scores} (epochs from 1) returned "
                                 f"{got!r}; the protocol keeps {expected!r}")
    for accuracy, n in ((0.45, 1101), (0.45, 2210), (0.85, 872), (0.5, 100), (1.0, 50)):
        expected = float(np.sqrt(accuracy * (1 - accuracy) / n))
        got = _call("standard_error", module.standard_error, accuracy, n)
        if not np.isclose(got, expected, rtol=1e-9, atol=1e-12):
            raise ExerciseFailed(f"standard_error({accuracy}, {n}) returned {got!r}; a "
                                 f"binomial proportion's is {expected:.5f}")
    return (f"the kept epochs match the library's on {len(histories)} histories; SST dev's "
            f"standard error at 45 %: {100 * module.standard_error(0.45, 1101):.1f} points")


CHECKS = {
    "tensors": ("1. write softsign with ops", check_tensors),
    "autodiff": ("2. the VJP of softsign, checked by gradcheck", check_autodiff),
    "gradcheck": ("3. a hypothesis strategy that finds a wrong VJP", check_gradcheck),
    "symbolic": ("4. predict a trace: ops, CSE, fused groups", check_symbolic),
    "vertex": ("5. a cell that counts each subtree", check_vertex),
    "schedule": ("6. the levels of a graph", check_schedule),
    "program": ("7. predict the instructions of F and dF", check_program),
    "lazy": ("8. switch lazy batching off: predict explain()", check_lazy),
    "autobatch": ("9. a batching rule, against per-sample code", check_autobatch),
    "kinds": ("10. a recursive definition of a tree's height", check_kinds),
    "growth": ("11. grow complete binary trees", check_growth),
    "native": ("12. predict which backend runs a level loop", check_native),
    "cuda": ("13. a CUDA kernel, run on the CPU by the shim", check_cuda),
    "distributed": ("14. a per-rank loss whose gradients add up", check_distributed),
    "explain": ("15. predict explain() for a batch", check_explain),
    "measure": ("16. the epoch a protocol keeps, and an accuracy's noise", check_measure),
}
