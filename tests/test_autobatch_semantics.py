"""Autobatched code keeps eager semantics where recording and running are apart in time or in
threads: data is read when an op is recorded, minicavs' writers run the pending ops first,
backward refuses values changed since the forward pass, values handed out are read-only, a
block belongs to its thread, constants are told apart by their bytes, and an op with no
batching rule runs node by node instead of failing. Each test runs under both recorders."""

import contextlib
import threading

import numpy as np
import pytest

import minicavs as mc
from minicavs.autobatch import signature
from test_autobatch import recorder  # noqa: F401  (every test here under each recorder)


def _eager_and_batched(program, strategy="agenda+"):
    """``program()`` -> (value Tensor, parameters), run eagerly and in a block: both results
    (values and the parameters' gradients)."""
    results = []
    for batched in (False, True):
        if batched:
            with mc.autobatch(strategy):
                out, params = program()
                out.backward()
        else:
            out, params = program()
            out.backward()
        results.append((out.numpy().copy(), [p.grad.numpy().copy() for p in params]))
    return results


def test_data_is_read_when_the_op_is_recorded_not_when_the_block_runs():
    W = mc.Parameter(np.array([1.0, 2.0, 3.0]))
    buf = np.zeros(3)
    outs, raw = [], []
    with mc.autobatch():
        for t in range(6):  # (from the third call on, the recorder's fast path takes it)
            buf[:] = t + 1
            outs.append(mc.sum(mc.tensor(buf) * W))  # a Tensor wrapping the buffer
            raw.append(mc.sum(W * buf))  # the buffer itself
    expected = [6.0 * (t + 1) for t in range(6)]
    assert [o.item() for o in outs] == expected
    assert [o.item() for o in raw] == expected


def test_minicavs_writers_run_the_pending_ops_first():
    W = mc.Parameter(np.array([1.0, 2.0]))
    x = np.array([3.0, 4.0])
    with mc.autobatch():
        y = mc.sum(mc.tensor(x) * W)
        W.data = np.array([10.0, 10.0])  # ``.data =``
        z = mc.sum(mc.tensor(x) * W)
        with mc.no_grad():
            W.mul_(2.0)  # an in-place op
        u = mc.sum(mc.tensor(x) * W)
        W.data[...] = 0.0  # a write through .data
    assert (y.item(), z.item(), u.item()) == (11.0, 70.0, 140.0)

    V = mc.Parameter(np.array([1.0, 2.0]))
    opt = mc.nn.optim.SGD([V], lr=1.0)
    with mc.autobatch():
        loss = mc.sum(mc.tensor(x) * V)
        loss.backward()
        after = mc.sum(mc.tensor(x) * V)  # recorded before the step, not yet run
        opt.step()
    assert after.item() == 11.0
    np.testing.assert_array_equal(V.numpy(), [-2.0, -2.0])


def test_backward_refuses_a_parameter_changed_in_place_after_the_forward_pass():
    W = mc.Parameter(np.array([1.0, 2.0]), name="W")
    x = np.array([3.0, 4.0])
    with mc.autobatch():
        y = mc.sum(mc.tensor(x) * W * W)
        y.item()
        with mc.no_grad():
            W.mul_(10.0)
        with pytest.raises(mc.InPlaceModificationError,  # (as eager code names it: it said
                           # "argument 0" of every op, the position in its own list)
                           match="argument 1 of op 'mul', a parameter 'W'.*changed in place"):
            y.backward()


def test_values_handed_out_are_read_only_and_the_gradient_stands():
    W = mc.Parameter(np.array([1.0, 2.0]))
    x = np.array([3.0, 4.0])
    with mc.autobatch():
        h = mc.tensor(x) * W
        y = mc.sum(h * h)
        with pytest.raises(ValueError, match="read-only"):
            h.numpy()[:] = 0
        y.backward()
    np.testing.assert_array_equal(W.grad.numpy(), 2 * x * x * W.numpy())
    with mc.no_grad(), pytest.raises(mc.UnsupportedError, match="read-only.*mc.autobatch"):
        h.add_(1.0)


def test_reading_parameters_every_step_never_wears_a_record_out():
    W = mc.Parameter(np.array([1.0, 2.0]))
    with mc.autobatch():
        loss = 0
        for i in range(100):  # more steps than fingerprints are kept of distinct contents
            loss = loss + mc.sum(W * float(i))
            W.data  # a read (handed out: it might be written through)
        loss.backward()
    np.testing.assert_array_equal(W.grad.numpy(), [4950.0, 4950.0])


def test_a_block_belongs_to_its_thread():
    W = mc.Parameter(np.array([1.0, 2.0]))
    recorded, other = threading.Event(), threading.Event()
    seen = {}

    def block():
        with mc.autobatch():
            y = mc.sum(W * 2.0)
            recorded.set()
            other.wait(10)
            seen["block"] = y.item()

    def eager():
        recorded.wait(10)
        z = mc.sum(W * 3.0)  # while the other thread's block records
        seen["eager"] = (type(z).__name__, z.item())
        other.set()

    threads = [threading.Thread(target=block), threading.Thread(target=eager)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"block": 6.0, "eager": ("Tensor", 9.0)}


def test_two_threads_each_with_a_block():
    W = mc.Parameter(np.array([1.0, 2.0]))
    both = threading.Barrier(2, timeout=10)
    seen = {}

    def block(k):
        try:
            with mc.autobatch():
                both.wait()  # both blocks open at once
                y = mc.sum(W * float(k))
                y.backward()
                both.wait()
                seen[k] = y.item()
        except Exception as exc:  # (reported by the assertion, not lost in the thread)
            seen[k] = repr(exc)

    threads = [threading.Thread(target=block, args=(k,)) for k in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {2: 6.0, 3: 9.0}
    np.testing.assert_array_equal(W.grad.numpy(), [5.0, 5.0])


def test_constants_are_told_apart_by_their_bytes():
    W = mc.Parameter(np.array([1.0, 2.0]))
    x = np.array([3.0, 4.0])
    with np.errstate(divide="ignore", invalid="ignore"):
        with mc.autobatch():
            pos = 1 / (mc.tensor(x) * W * 0.0)
            neg = 1 / (mc.tensor(x) * W * -0.0)
        assert list(pos.numpy()) == [np.inf, np.inf] and list(neg.numpy()) == [-np.inf, -np.inf]
        with mc.autobatch() as ab:
            nans = [mc.sum(mc.tensor(x + i) * float("nan")) for i in range(8)]
        assert all(np.isnan(v.item()) for v in nans)
    by_label = ab.segments[0].stats["by_signature"]
    assert [batches for label, (batches, _) in by_label.items() if label.startswith("mul")] == [1]


def test_the_kernel_cache_is_bounded():
    W = mc.Parameter(np.array([1.0, 2.0]))
    kept = signature._KERNELS_KEPT
    signature._KERNELS_KEPT = 8
    try:
        with mc.autobatch():
            values = [mc.sum(W * (i + 0.25)) for i in range(20)]  # a constant each: 20 kernels
        assert [v.item() for v in values] == [3.0 * (i + 0.25) for i in range(20)]
        assert len(signature._KERNELS) <= 8
    finally:
        signature._KERNELS_KEPT = kept


@pytest.mark.parametrize("form", ["reverse", "flip", "fancy", "iadd", "einsum_diagonal",
                                  "vector_times_stack"])
def test_an_op_with_no_batching_rule_for_its_operands_runs_node_by_node(form):
    rng = np.random.default_rng(0)
    W = mc.Parameter(rng.standard_normal(4))
    S = mc.Parameter(rng.standard_normal((3, 4, 2)))
    forms = {
        "reverse": lambda h: h[::-1],
        "flip": lambda h: mc.flip(h, 0),
        "fancy": lambda h: h[np.array([0, 2, 2])],
        "iadd": lambda h: h.__iadd__(W),
        "einsum_diagonal": lambda h: mc.einsum("ii", mc.reshape(h, (2, 2))),
        "vector_times_stack": lambda h: mc.matmul(h, S),
    }

    def program():
        W.grad = S.grad = None
        terms = [mc.sum(forms[form](mc.tanh(W * float(k))) * float(k + 1)) for k in range(3)]
        return mc.sum(mc.stack(terms)), [W] + ([S] if form == "vector_times_stack" else [])

    (value, grads), (batched_value, batched_grads) = _eager_and_batched(program)
    np.testing.assert_allclose(batched_value, value, rtol=1e-12)
    for g, b in zip(grads, batched_grads):
        np.testing.assert_allclose(b, g, rtol=1e-12, atol=1e-15)


def test_a_failed_run_does_not_poison_the_rest_of_the_block():
    W = mc.Parameter(np.array([1.0, 2.0]))
    with mc.autobatch():
        table = W.reshape(2, 1)
        rows = [mc.embedding(table, np.array(i)) for i in (1, 5)]  # 5: fails when it runs
        bad = rows[1]
        with pytest.raises(mc.IndexRangeError) as failed:  # (which call, which op, which line)
            bad.numpy()
        message = str(failed.value)
        assert "index 5 at position" in message and "in an mc.autobatch batch of" in message
        assert "test_autobatch_semantics.py" in message and "mc.embedding(table" in message
        with pytest.raises(mc.MinicavsError, match="whose run failed"):
            bad.numpy()
        good = mc.sum(W * 2.0)
        good.backward()
    assert good.item() == 6.0
    np.testing.assert_array_equal(W.grad.numpy(), [2.0, 2.0])


def test_backward_checks_the_gradient_as_eager_code_does():
    W = mc.Parameter(np.array([1.0, 2.0]))
    with mc.autobatch():
        y = W * 2.0
        with pytest.raises(mc.ShapeError, match="dtype float32, the tensor has shape"):
            y.backward(np.ones(2, np.float32))


def test_a_zero_dimensional_value_is_an_array():
    W = mc.Parameter(np.array([1.0, 2.0]))
    with mc.autobatch():
        y = mc.sum(W * 2.0)
    assert np.asarray(y).shape == () and float(np.asarray(y)) == 6.0


def test_grad_mode_is_per_thread():
    """Another thread's ``no_grad`` (a data-loading thread) leaves this thread's gradients, in
    a block and eagerly, as PyTorch's grad mode does."""
    W = mc.Parameter(np.array([1.0, 2.0]))
    inside, done = threading.Event(), threading.Event()

    def loader():
        with mc.no_grad():
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=loader)
    thread.start()
    inside.wait(10)
    try:
        eager = mc.sum(W * 3.0)
        with mc.autobatch():
            batched = mc.sum(W * 2.0)
        assert eager.requires_grad and batched.requires_grad
    finally:
        done.set()
        thread.join(10)
    (eager + batched.detach()).backward()
    np.testing.assert_array_equal(W.grad.numpy(), [3.0, 3.0])



def _assert_batched_equals_eager(eager, batched):
    """``[loss value, gradient, ...]`` of the eager run and of the batched one are equal."""
    assert batched[0] == pytest.approx(eager[0], rel=1e-12)
    for got, want in zip(batched[1:], eager[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("strategy", ["agenda", "agenda+", "depth"])
def test_a_tensor_computed_before_the_block_passes_its_gradient_on(strategy):
    """A tensor made from a parameter before the block (``W * 2``, ``tanh(x)``), read inside
    it as a shared operand, hands its gradient on through its own tape to the parameter: it
    was accumulated into the tensor's ``.grad`` as if it were a parameter (the parameter got
    none), and ``y * y`` of such a tensor gave half the gradient."""
    rng = np.random.default_rng(0)
    W0, X, x0 = rng.standard_normal((3, 3)), rng.standard_normal((2, 3)), rng.standard_normal(3)
    results = []
    for batched in (False, True):
        W, x = mc.Parameter(W0.copy()), mc.Parameter(x0.copy())
        Wc, y = W * 2.0, mc.tanh(x)  # eager: made before the block
        with mc.autobatch(strategy) if batched else contextlib.nullcontext():
            loss = mc.sum(mc.tanh(mc.tensor(X) @ Wc)) + mc.sum(y * y) + mc.sum(y * 3.0)
            loss.backward()
        results.append([loss.item(), W.grad.numpy(), x.grad.numpy()])
    _assert_batched_equals_eager(*results)


@pytest.mark.parametrize("strategy", ["agenda", "agenda+"])
def test_a_vertex_function_called_in_a_block_runs_whole_and_differentiates(strategy):
    """A vertex function batches its own vertices: inside a block it runs at once, and the
    block's ops on its output send their gradient back through its own backward. (It was
    recorded as a node, and its backward traced: "backward(create_graph=True) through a
    vertex function is not supported".)"""
    rng = np.random.default_rng(0)
    U0, X = rng.standard_normal((4, 4)) * 0.5, rng.standard_normal((5, 4))
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]])])
    results = []
    for batched in (False, True):
        U = mc.Parameter(U0.copy())

        def cell(v):
            v.scatter(mc.tanh(v.pull() @ U + v.gather(0) + v.gather(1)))

        F = mc.VertexFunction(cell, pull_shape=(4,), scatter_shape=(4,), arity=2,
                              dtype="float64")
        pull = mc.tensor(X, requires_grad=True)
        with mc.autobatch(strategy) if batched else contextlib.nullcontext():
            out = F(batch, pull=pull)
            per_vertex = [mc.sum(mc.tanh(out[v] * float(v + 1))) for v in range(5)]
            loss = mc.add_n(per_vertex) + mc.sum(out * out)
            loss.backward()
        results.append([loss.item(), U.grad.numpy(), pull.grad.numpy()])
    _assert_batched_equals_eager(*results)


@pytest.mark.parametrize("strategy", ["agenda", "agenda+"])
def test_a_vertex_function_on_a_pending_value_differentiates(strategy):
    """A vertex function in a block on a value the block computed: its operand is handed to the
    eager tape, so the block's backward, through the function's output and its own ∂F, leads
    back into the block's earlier segment (it was refused: "needs a gradient"); a pending
    value without one is read as data."""
    rng = np.random.default_rng(3)
    A0, U0, X = (rng.standard_normal((4, 4)) * 0.5, rng.standard_normal((4, 4)) * 0.5,
                 rng.standard_normal((3, 4)))
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1]])])
    results = []
    for batched in (False, True):
        A, U = mc.Parameter(A0.copy()), mc.Parameter(U0.copy())

        def cell(v):
            v.scatter(mc.tanh(v.pull() @ U + v.gather(0) + v.gather(1)))

        F = mc.VertexFunction(cell, pull_shape=(4,), scatter_shape=(4,), arity=2,
                              dtype="float64")
        with mc.autobatch(strategy) if batched else contextlib.nullcontext():
            with mc.no_grad():
                data = mc.tanh(mc.tensor(X) @ A)  # no gradient: read as data
            pending = mc.tanh(mc.tensor(X) @ A)
            out = F(batch, pull=pending) + F(batch, pull=data)
            loss = mc.add_n([mc.sum(out[v] * pending[v]) for v in range(3)])
            loss.backward()
        results.append([loss.item(), A.grad.numpy(), U.grad.numpy()])
    _assert_batched_equals_eager(*results)


def test_a_static_function_in_a_block_is_inlined_and_batched():
    """``mc.symbolic`` functions called in a block record their ops with the block's (as
    inside another trace), so calls on several samples batch and differentiate as eager code:
    as one op, its ∂ was traced there and failed ("no value for Symbol(param p0 ...)")."""
    W0, X = np.eye(3) * 0.5 + 0.1, np.random.default_rng(0).standard_normal((4, 3))
    results = []
    for batched in (False, True):
        W = mc.Parameter(W0.copy())
        f = mc.symbolic(lambda x: mc.tanh(x @ W))
        x = mc.tensor(X, requires_grad=True)
        block = mc.autobatch() if batched else contextlib.nullcontext()
        with block:
            loss = mc.add_n([mc.sum(f(x[i:i + 1]) * f(mc.tanh(x[i:i + 1]))) for i in range(4)])
            loss.backward()
        results.append([loss.item(), W.grad.numpy(), x.grad.numpy()])
    _assert_batched_equals_eager(*results)
    stats = block.segments[0].stats
    assert stats["nodes"] > stats["batches"]  # (four samples' ops, batched)


@pytest.mark.parametrize("strategy", ["agenda", "agenda+", "depth+"])
def test_values_used_by_eager_code_after_the_block_pass_their_gradient_back(strategy):
    """Losses made in a block and summed after it, in eager code, differentiate as eager code
    does (it raised "after the block ended"): the scope is one record of the eager tape, after
    the tensors it read that have tapes of their own (``e``, read in the block and after it:
    its record must not be released before the scope hands its gradient on), and a view made
    in the block is an output of it too."""
    rng = np.random.default_rng(1)
    W0, xs = rng.standard_normal((4, 4)), [rng.standard_normal((1, 4)) for _ in range(3)]
    results = []
    for batched in (False, True):
        W = mc.Parameter(W0.copy())
        e = mc.tanh(W * 2.0)
        with mc.autobatch(strategy) if batched else contextlib.nullcontext():
            ys = [mc.tanh(mc.tensor(x) @ e) for x in xs]
            head = ys[1][:, :2]
        loss = mc.add_n([mc.sum(y * y) for y in ys]) + mc.sum(e) + mc.sum(head) * 3.0
        loss.backward()
        results.append([loss.item(), W.grad.numpy()])
    _assert_batched_equals_eager(*results)


def test_eager_code_after_two_chained_blocks_and_a_second_backward():
    """A block reading the values of an earlier one, both read by eager code after them; a
    second backward through them needs retain_graph=True on the first, as in eager code."""
    rng = np.random.default_rng(2)
    W0, X = rng.standard_normal((3, 3)), rng.standard_normal((1, 3))
    results = []
    for batched in (False, True):
        W = mc.Parameter(W0.copy())
        block = mc.autobatch if batched else contextlib.nullcontext
        with block():
            y = mc.tanh(mc.tensor(X) @ W)
        with block():
            z = mc.sigmoid(y @ W)
        loss = mc.sum(z * y)
        loss.backward(retain_graph=True)
        loss.backward()
        results.append([loss.item(), W.grad.numpy()])
        with pytest.raises(mc.MinicavsError, match="a second time"):
            loss.backward()
    _assert_batched_equals_eager(*results)


def test_eager_code_after_the_block_reads_values_without_a_gradient():
    """A value made under no_grad in a block, used after it beside a parameter (its record
    read the lazy value's version, which it had none of: an AttributeError), and a second
    order gradient through a block refused by name."""
    W = mc.Parameter(np.eye(2) * 0.5)
    with mc.autobatch():
        with mc.no_grad():
            frozen = mc.tanh(mc.tensor(np.ones((1, 2))) @ W)
        live = mc.tanh(mc.tensor(np.ones((1, 2))) @ W)
    mc.sum(frozen @ W).backward()
    np.testing.assert_allclose(W.grad.numpy(), np.tanh(0.5) * np.ones((2, 2)), rtol=1e-12)
    with pytest.raises(mc.UnsupportedError, match="create_graph"):
        mc.sum(live * live).backward(create_graph=True)


def test_a_block_read_by_eager_code_is_freed_without_the_garbage_collector():
    """The scope holds its tape record and the record only a weak reference back: a cycle
    kept every step's block (its slabs) alive until the garbage collector ran."""
    import gc
    import weakref

    W = mc.Parameter(np.eye(3))

    def step():
        with mc.autobatch() as block:
            ys = [mc.tanh(mc.tensor(np.ones((1, 3))) @ W) for _ in range(3)]
        mc.add_n([mc.sum(y) for y in ys]).backward()
        return weakref.ref(block)

    gc.disable()
    try:
        assert step()() is None
    finally:
        gc.enable()
