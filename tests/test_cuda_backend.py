"""minicavs on CuPy: every op, eager backward, the fused kernels and the vertex runtime on a GPU
equal the NumPy results (the ``gpu`` tests, which run whenever a GPU is lent and are skipped,
with the reason, where there is none); and the parts that need no GPU, checked here in CI: the
op table covers every primitive and runs on NumPy, and the two-stream scheduler keeps every
read after its write on the real F and ∂F programs (with a recording stand-in for the streams).
"""

import contextlib
import time
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.runtime.executor import NumpyFusedKernel
from minicavs.autodiff.tensor import Tensor
from minicavs.cuda import streams
from minicavs.cuda.streams import MAIN, SIDE
from minicavs.errors import IndexRangeError, KernelCompileError
from minicavs.ops import OPS

# (imported here, not inside a test: importing it inside a hypothesis test makes its module's
# @given run nested, a health-check failure when this file runs alone)
from test_cuda_fusion import _broken_group, cell_groups, random_inputs
from vertex_cells import binary_tree_lstm, child_sum_tree_lstm, recursive_tree_lstm

E, H = 3, 4


# ----------------------------------------------------------------------------- the op table

Case = namedtuple("Case", "name make fn")


def _cases():
    """Each case: ``make(rng)`` gives NumPy arrays (float arrays become Tensors that require
    grad, integer arrays plain Tensors); ``fn(*tensors)`` returns a Tensor."""
    f = lambda rng, *shape: rng.standard_normal(shape)  # noqa: E731
    idx64 = np.array([3, -1, 0, 3, 4, 1], np.int64)
    return [
        Case("arithmetic with broadcasting", lambda r: [f(r, 3, 4), f(r, 4)],
             lambda a, b: (a + b) * (a - b) / (b * b + 1) - (-a)),
        Case("pow exp log", lambda r: [f(r, 3, 4)],
             lambda a: mc.log(mc.exp(-a) + 1) ** 2 + mc.exp(a) ** 0.5),
        Case("tanh sigmoid relu maximum", lambda r: [f(r, 3, 4), f(r, 3, 4)],
             lambda a, b: mc.tanh(a) * mc.sigmoid(b) + mc.relu(a) + mc.maximum(a, b)),
        Case("where comparisons astype", lambda r: [f(r, 3, 4), f(r, 3, 4)],
             lambda a, b: mc.where(mc.greater(a, b), a, b * 2)
             + mc.astype(mc.greater_equal(a, 0.0), a.dtype)
             * mc.astype(mc.equal(mc.astype(mc.greater(b, 0.0), np.int32), 1), a.dtype)),
        Case("sum max mean", lambda r: [f(r, 3, 4)],
             lambda a: mc.sum(a, axis=1) + mc.max(a, axis=1) * mc.mean(a)),
        Case("shapes", lambda r: [f(r, 3, 4), f(r, 5)],
             lambda a, b: mc.pad_axis(mc.slice_axis(mc.concat(
                 [a, mc.reshape(mc.transpose(a), (3, 4))], axis=1), 1, 6, axis=1), 1, 2, axis=0)
             * mc.broadcast_to(b, (6, 5))),
        Case("matmul", lambda r: [f(r, 2, 3, 4), f(r, 4, 5)], lambda a, w: (a @ w) @ w.T),
        Case("take_rows int64", lambda r: [f(r, 5, 3), idx64], mc.take_rows),
        Case("take_rows int32 (row kernel)", lambda r: [f(r, 5, 3), idx64.astype(np.int32)],
             mc.take_rows),
        Case("scatter_add_rows int64", lambda r: [f(r, 6, 3), idx64],
             lambda v, i: mc.scatter_add_rows(v, i, 5)),
        Case("scatter_add_rows int32 (row kernel)", lambda r: [f(r, 6, 3), idx64.astype(np.int32)],
             lambda v, i: mc.scatter_add_rows(v, i, 5)),
        Case("embedding", lambda r: [f(r, 7, 3), np.array([[1, 2], [6, 0]])], mc.embedding),
        Case("embedding of one id (take_row)", lambda r: [f(r, 7, 3), np.array(5)],
             lambda table, i: mc.embedding(table, i) * mc.embedding(table, np.array(-1) + 2)),
        Case("one_hot", lambda r: [f(r, 3), np.array([[0, 4], [2, 2]])],
             lambda a, labels: mc.one_hot(labels, 5, a.dtype) * mc.sum(a)),
        Case("softmax_cross_entropy", lambda r: [f(r, 4, 5), np.array([0, 4, 2, 2])],
             lambda logits, labels: mc.softmax_cross_entropy(logits, labels, reduction="none")),
        Case("softmax log_softmax", lambda r: [f(r, 4, 5)],
             lambda a: mc.softmax(a) * mc.log_softmax(a, axis=0)),
        Case("lstm_gates", lambda r: [f(r, 3, 8), f(r, 3, 2)],
             lambda pre, c: mc.concat(list(mc.lstm_gates(pre, c)), axis=1)),
        Case("lstm_cell (two forget gates) and its gradient",
             lambda r: [f(r, 3, 10), f(r, 3, 2), f(r, 3, 2)], mc.lstm_cell),
        Case("lstm_step (x·W + h·U + b, the cell) and its gradient",
             lambda r: [f(r, 3, 4), f(r, 3, 4), f(r, 4, 8), f(r, 2, 8), f(r, 8)], mc.lstm_step),
        Case("lstm_step, the input's gates computed beforehand",
             lambda r: [f(r, 3, 8), f(r, 3, 4), f(r, 2, 8)], mc.lstm_step),
        Case("linear", lambda r: [f(r, 3, 4), f(r, 4, 5), f(r, 5)], mc.linear),
        Case("conv2d max_pool2d conv_transpose2d (unfold, fold)",
             lambda r: [f(r, 2, 3, 6, 5), f(r, 4, 3, 3, 2), f(r, 4, 2, 2, 2)],
             lambda x, w, wt: mc.conv_transpose2d(mc.max_pool2d(
                 mc.conv2d(x, w, stride=(1, 2), padding=1), 2, 1, 1, ceil_mode=True), wt,
                 stride=2, groups=2)),
        Case("avg_pool2d adaptive_avg_pool2d interpolate (NumPy constants moved to the GPU)",
             lambda r: [f(r, 2, 3, 6, 5)],
             lambda x: mc.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)
             + mc.adaptive_avg_pool2d(x, (4, 3))
             + mc.interpolate(x, size=(4, 3), mode="bilinear")
             + mc.interpolate(x, size=(4, 3), mode="nearest")),
        Case("minimum min prod power", lambda r: [f(r, 3, 4), f(r, 3, 4)],
             lambda a, b: mc.minimum(a, b) + mc.min(a, axis=1, keepdims=True)
             + mc.prod(a, axis=0) + mc.exp(a) ** b),
        Case("sin cos erf expm1 log1p", lambda r: [f(r, 3, 4)],
             lambda a: mc.sin(a) * mc.cos(a) + mc.erf(a) + mc.expm1(a) + mc.log1p(mc.exp(a))),
        Case("floor ceil rint cumsum", lambda r: [f(r, 3, 4)],
             lambda a: mc.floor(a) + mc.ceil(a) * mc.rint(a) + mc.cumsum(a, axis=1)),
        Case("argmax argmin", lambda r: [f(r, 3, 4)],
             lambda a: mc.astype(mc.argmax(a, axis=1) - mc.argmin(a[:, :3], axis=0), a.dtype)
             * mc.sum(a)),
        Case("trunc copysign fmod remainder floor_divide", lambda r: [f(r, 3, 4), f(r, 3, 4)],
             lambda a, b: mc.trunc(a * 3) + mc.copysign(a, b) + mc.fmod(a, b + 3)
             + a % (b + 3) + (a * 4) // 1.5),
        Case("integer // % and bitwise ops, shifts", lambda r: [f(r, 3, 4)],
             lambda a: mc.astype(_bits(mc.astype(a * 8, np.int64)), a.dtype) * a),
        Case("argsort sort topk", lambda r: [f(r, 3, 5)],
             lambda a: mc.sort(a, axis=1).values + mc.topk(a, 2, axis=0).values.sum()
             + mc.astype(mc.argsort(a, axis=0, descending=True), a.dtype)),
        Case("cumprod cummax cummin", lambda r: [f(r, 3, 4)],
             lambda a: mc.cumprod(a, axis=1) + mc.cummax(a, axis=0).values
             * mc.astype(mc.cummin(a, axis=1).indices, a.dtype)),
        Case("scatter_reduce (prod amax amin)", lambda r: [f(r, 3, 4), f(r, 2, 4)],
             lambda a, s: sum(mc.scatter_reduce(a, 0, np.array([[0, 1, 2, 0], [2, 1, 0, 0]]),
                                                s, reduce) for reduce in ("prod", "amax",
                                                                          "amin"))),
        Case("einsum", lambda r: [f(r, 2, 3, 4), f(r, 4, 3)],
             lambda a, b: mc.einsum("bij,ji->b", a, b) + mc.einsum("bij->j", a).sum()),
    ]


def _bits(i):
    j = (i & 7) + 1
    return (i // j) + (i % j) + mc.fmod(i, j) + (i | j) + (i ^ j) + (~i) + (i << 2) + (i >> 1)


CASES = _cases()


def _run_case(case, device, dtype=np.float64, seed=0):
    """Values and input gradients of ``case`` (NumPy arrays), computed on ``device``."""
    arrays = case.make(np.random.default_rng(seed))
    tensors = [mc.tensor(a.astype(dtype) if a.dtype.kind == "f" else a, device=device,
                         requires_grad=a.dtype.kind == "f") for a in arrays]
    out = case.fn(*tensors)
    assert out.device == device, f"{case.name}: the result left the device"
    weights = np.random.default_rng(seed + 1).standard_normal(out.shape).astype(out.dtype)
    grads = []
    if out.requires_grad:
        (out * mc.tensor(weights, device=device)).sum().backward()
        grads = [t.grad.numpy() if t.grad is not None else None for t in tensors]
    return out.numpy(), grads


def test_the_backend_table_covers_every_primitive_and_runs_on_numpy(monkeypatch):
    seen = set()
    original = Tensor.__dict__["__minicavs_apply__"].__func__

    def recording(cls, op, args, attrs):
        seen.add(op.name)
        return original(cls, op, args, attrs)

    from minicavs.ops import registry

    monkeypatch.setattr(Tensor, "__minicavs_apply__", classmethod(recording))
    monkeypatch.setattr(registry, "_default_handler", Tensor.__minicavs_apply__)
    for case in CASES:
        values, grads = _run_case(case, "cpu")
        assert np.all(np.isfinite(values)), case.name
    missing = set(OPS) - seen
    assert not missing, f"add cases to tests/test_cuda_backend.py for: {sorted(missing)}"


# ----------------------------------------------------------------------------- streams (CPU)

class RecordingStreams:
    """A stand-in for :class:`streams.CupyStreams` that simulates two in-order queues and their
    event waits, and checks on every launch that each value it reads was made earlier on the
    same stream, or on the other stream before an event the launching stream waited for."""

    def __init__(self):
        self.current = MAIN
        self.launched = {MAIN: 0, SIDE: 0}
        # known[s][t]: how many launches of stream t stream s is ordered after (vector clock).
        self.known = {MAIN: {MAIN: 0, SIDE: 0}, SIDE: {MAIN: 0, SIDE: 0}}
        self.made = {}  # value id -> (stream, position)
        self.log = []

    @contextlib.contextmanager
    def use(self, which):
        previous, self.current = self.current, which
        try:
            yield
        finally:
            self.current = previous

    def wait(self, waiter, producer):
        self.log.append(("wait", waiter, producer))
        for t in (MAIN, SIDE):
            self.known[waiter][t] = max(self.known[waiter][t], self.known[producer][t])
        self.known[waiter][producer] = max(self.known[waiter][producer], self.launched[producer])

    def launch(self, reads, writes, what=""):
        s = self.current
        for r in reads:
            if r in self.made:
                made_on, position = self.made[r]
                assert made_on == s or self.known[s][made_on] > position, (
                    f"{what} on the {s} stream reads a value made on the {made_on} stream "
                    f"(launch {position}) without waiting for it")
        for w in writes:
            self.made[w] = (s, self.launched[s])
        self.log.append(("launch", s, what))
        self.launched[s] += 1

    def upload(self, which, array):
        # The block comes from the main stream's pool, where a block freed a moment ago may
        # still be read by main-stream launches already queued: the copy must follow them all.
        assert which == MAIN or self.known[which][MAIN] >= self.launched[MAIN], (
            "an upload overwrites a block before the main stream's queued launches ran")
        with self.use(which):
            self.launch([], [id(array)], "upload")
        return array.copy()


def _drive(program, sched, rec, levels=3):
    """Issue a program's launches the way the interpreter does: eager and lazy instructions
    through the scheduler, the core on the main stream per level (reading what the interpreter
    itself reads there, the sinks), then the results read on the main stream."""
    def launcher(ins):
        return lambda: rec.launch([id(x) for x in ins.reads], [id(o) for o in ins.writes],
                                  repr(ins.step))

    for ins in program.eager:
        sched.run(ins, launcher(ins))
    for _ in range(levels):
        for ins in program.core:
            rec.launch([id(x) for x in ins.reads], [id(o) for o in ins.writes], repr(ins))
        rec.launch([id(s) for s in program.sinks], [], "runtime reads")
    for ins in program.lazy:
        sched.run(ins, launcher(ins))
    sched.join()
    rec.launch([id(o) for o in program.graph.outputs], [], "results")


def _programs(cell):
    F, _ = cell(E, H, np.random.default_rng(0))
    return F.program, F.backward_program


@pytest.mark.parametrize("cell", [binary_tree_lstm, child_sum_tree_lstm],
                         ids=lambda c: c.__name__)
def test_streams_keep_every_read_after_its_write(cell):
    side_steps = 0
    for program in _programs(cell):
        rec = RecordingStreams()
        sched = streams.scheduler(np, program, streams=rec)
        _drive(program, sched, rec)
        side_steps += sum(1 for entry in rec.log if entry[:2] == ("launch", SIDE))
    assert side_steps > 0, "nothing ran on the side stream"


def test_stream_assignment_of_the_tree_lstm_backward():
    _, bw = _programs(binary_tree_lstm)
    side = [ins for ins in bw.eager + bw.lazy if ins.stream == SIDE]
    # The parameter-gradient products (Xᵀ·δ for W, U, Wo; the bias sum) go to the side stream...
    side_products = {ins.writes[0].shape for ins in side
                     if getattr(ins.step, "node", None) is not None
                     and ins.step.node.op is mc.ops.linalg.MATMUL}
    assert {(3, 20), (8, 20), (4, 3)} <= side_products
    # ... the gradient of the pulled input, and everything the core reads, stay on the main one.
    core_reads = {id(x) for ins in bw.core for x in ins.reads}
    assert not any(id(o) in core_reads for ins in side for o in ins.writes)
    assert all(getattr(ins, "stream", "main") == MAIN for ins in bw.core)


def test_a_scheduler_that_skips_a_wait_is_caught():
    class Careless(streams.StreamScheduler):
        def run(self, ins, fn, *args, **kwargs):
            with self.streams.use(ins.stream):
                fn(*args, **kwargs)

    _, bw = _programs(binary_tree_lstm)
    rec = RecordingStreams()
    with pytest.raises(AssertionError, match="without waiting"):
        _drive(bw, Careless(rec), rec)


def test_uploads_wait_for_the_main_streams_queued_work():
    rec = RecordingStreams()
    sched = streams.StreamScheduler(rec)
    rec.launch([], ["x"], "main-stream work still reading a block it freed")
    host = {"order": np.arange(4, dtype=np.int32), "rows": np.arange(3, dtype=np.int32)}
    uploaded = sched.upload(np, host, wait=False)
    assert rec.log[1] == ("wait", SIDE, MAIN)  # before the two copies
    assert [entry[:2] for entry in rec.log[2:]] == [("launch", SIDE)] * 2
    sched.join()
    assert rec.log[-1] == ("wait", MAIN, SIDE)
    np.testing.assert_array_equal(uploaded["rows"], host["rows"])

    class Careless(streams.StreamScheduler):  # the upload as it was: no wait first
        def upload(self, xp, arrays, wait=True):
            out = {k: self.streams.upload(SIDE, a) for k, a in arrays.items()}
            self._side_used = True
            return out

    rec = RecordingStreams()
    rec.launch([], ["x"], "main-stream work")
    with pytest.raises(AssertionError, match="overwrites a block"):
        Careless(rec).upload(np, host)


def test_a_failed_upload_joins_before_it_raises():
    class FailsOnSecond(RecordingStreams):
        def upload(self, which, array):
            if array.size == 3:
                raise MemoryError("pinned memory exhausted")
            return super().upload(which, array)

    rec = FailsOnSecond()
    sched = streams.StreamScheduler(rec)
    host = {"order": np.arange(4, dtype=np.int32), "rows": np.arange(3, dtype=np.int32)}
    with pytest.raises(MemoryError):
        sched.upload(np, host, wait=False)
    # The first copy was queued; before the error leaves, the main stream waits for it.
    assert rec.log[-1] == ("wait", MAIN, SIDE)


def test_a_scheduler_joins_when_its_block_ends_even_on_an_error():
    _, bw = _programs(binary_tree_lstm)
    side = next(ins for ins in bw.eager + bw.lazy if ins.stream == SIDE)
    rec = RecordingStreams()
    with pytest.raises(RuntimeError, match="a later step failed"):
        with streams.StreamScheduler(rec) as sched:
            sched.run(side, lambda: rec.launch([], [id(o) for o in side.writes], "side step"))
            raise RuntimeError("a later step failed")
    assert rec.log[-1] == ("wait", MAIN, SIDE)
    with streams.NO_STREAMS as none:
        assert none is streams.NO_STREAMS


def test_no_streams_on_numpy_or_when_switched_off():
    _, bw = _programs(binary_tree_lstm)
    assert streams.scheduler(np, bw) is streams.NO_STREAMS
    fake_cupy = type("FakeCupy", (), {"__name__": "cupy"})()
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0), options={"streams": False})
    assert streams.scheduler(fake_cupy, F.backward_program) is streams.NO_STREAMS
    calls = []
    streams.NO_STREAMS.run(None, calls.append, 1)
    streams.NO_STREAMS.join()
    assert calls == [1]
    host = {"order": np.arange(3)}
    assert streams.NO_STREAMS.upload(np, host)["order"] is host["order"]


# ----------------------------------------------------------------------------- on a GPU

def _cupy():
    mc.set_device("cuda")  # imports CuPy through the backend (and checks for a device)
    import cupy

    return cupy


def _close(got, want, dtype, what, loose=1.0):
    """Equal up to float rounding (``loose`` scales the float32 tolerance, for long chains of
    GEMMs whose summation order differs between cuBLAS and the CPU's BLAS)."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    tol = dict(rtol=1e-10, atol=1e-12) if np.dtype(dtype) == np.float64 else \
        dict(rtol=2e-4 * loose, atol=2e-5 * loose)
    np.testing.assert_allclose(got, want, err_msg=what, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gpu_op_and_its_backward_equal_numpy(case, dtype):
    _cupy()
    want_values, want_grads = _run_case(case, "cpu", dtype)
    got_values, got_grads = _run_case(case, "cuda", dtype)
    _close(got_values, want_values, dtype, f"{case.name}: values")
    for k, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert (g is None) == (w is None), f"{case.name}: gradient {k}"
        if g is not None:
            _close(g, w, dtype, f"{case.name}: gradient {k}")


@pytest.mark.gpu
def test_gpu_kernels_compile_ahead_on_a_worker_thread():
    """``cuda/ahead.py`` on a real GPU: a kernel compiles on a worker (its device made current
    there, as the module loads on it) without failing, and launches right."""
    cupy = _cupy()
    from minicavs.cuda import ahead, kernels

    name = "minicavs_gpu_ahead_check"
    code = (f'extern "C" __global__ void {name}(float* out, long long n) {{\n'
            f'  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n'
            f'  if (i < n) out[i] = 3.0f * (float)i;\n}}\n')
    kernel = kernels.make_kernel(code, name, "cupy")
    deadline = time.monotonic() + 60
    while ahead.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ahead.pending() == 0 and name not in [n for n, _ in ahead.failures()], \
        ahead.failures()
    out = cupy.empty(7, np.float32)
    ahead.ready(kernel)((1,), (32,), (out, np.int64(7)))
    np.testing.assert_array_equal(cupy.asnumpy(out), 3.0 * np.arange(7))


@pytest.mark.gpu
def test_gpu_operators_take_cupy_arrays_as_operands():
    # CuPy 14's arrays have no __array_namespace__; a Tensor operator that did not know them
    # left the array's reflected operator to take the Tensor as an array: no Tensor, no gradient.
    cupy = _cupy()
    x = mc.tensor(np.arange(1.0, 7.0).reshape(2, 3), device="cuda", requires_grad=True)
    raw = cupy.full((2, 3), 2.0)
    results = [x + raw, raw + x, x - raw, raw - x, x * raw, raw * x, x / raw, raw / x,
               x ** raw, raw ** x, x @ raw.T, raw @ x.T, mc.maximum(x, raw)]
    for k, result in enumerate(results):
        assert isinstance(result, Tensor) and result.requires_grad, f"result {k}"
        assert result.device == "cuda", f"result {k}"
    (raw / x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), -2.0 / x.numpy() ** 2)


@pytest.mark.gpu
def test_gpu_index_ops_check_ranges_before_the_row_kernels():
    cupy = _cupy()
    x = mc.tensor(np.ones((5, 3)), device="cuda")
    for idx in (np.array([0, 5], np.int32), np.array([0, -2], np.int32)):
        with pytest.raises(IndexRangeError, match="op 'take_rows'.*at position 1"):
            mc.take_rows(x, cupy.asarray(idx))
        with pytest.raises(IndexRangeError, match="op 'scatter_add_rows'.*at position 1"):
            mc.scatter_add_rows(mc.tensor(np.ones((2, 3)), device="cuda"), cupy.asarray(idx), 5)


@pytest.mark.gpu
def test_gpu_index_ops_use_the_row_kernels_for_any_integer_indices(monkeypatch):
    cupy = _cupy()
    from minicavs.cuda import kernels

    calls = []
    for name in ("gather_rows", "scatter_add_rows"):
        original = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _f=original, _n=name, **k:
                            (calls.append(_n), _f(*a, **k))[1])
    x = mc.tensor(np.arange(15.0).reshape(5, 3), device="cuda", requires_grad=True)
    for dtype in (np.int32, np.int64, np.int16):  # checked in range, then cast to int32
        calls.clear()
        rows = mc.take_rows(x, cupy.asarray(np.array([4, -1, 0, 4], dtype)))
        rows.sum().backward()
        assert calls == ["gather_rows", "scatter_add_rows"], dtype
        np.testing.assert_array_equal(rows.numpy()[1], 0)
        np.testing.assert_array_equal(x.grad.numpy()[:, 0], [1, 0, 0, 0, 2])
        x.grad = None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.int32], ids=["float16", "int32"])
def test_gpu_index_ops_on_rows_the_kernels_do_not_cover_equal_numpy(dtype):
    cupy = _cupy()
    from minicavs.ops.index import _scatter_add_rows_forward, _take_rows_forward

    rng = np.random.default_rng(0)
    table = rng.integers(-5, 5, (7, 3)).astype(dtype)
    idx = np.array([6, -1, 0, 6, -1, 2], np.int64)
    want = _take_rows_forward(np, table, idx)
    got = _take_rows_forward(cupy, cupy.asarray(table), cupy.asarray(idx))
    np.testing.assert_array_equal(got.get(), want)
    empty = _take_rows_forward(cupy, cupy.zeros((0, 3), dtype), cupy.full(2, -1, np.int64))
    np.testing.assert_array_equal(empty.get(), np.zeros((2, 3), dtype))
    values = rng.integers(-5, 5, (6, 3)).astype(dtype)
    want = _scatter_add_rows_forward(np, values, idx, 7)
    got = _scatter_add_rows_forward(cupy, cupy.asarray(values), cupy.asarray(idx), 7)
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["binary_tree_lstm", "child_sum_tree_lstm", "tree_fc",
                                  "lstm_chain"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@given(data=st.data())
def test_gpu_fused_kernels_equal_numpy(cell, dtype, data):
    cupy = _cupy()
    from minicavs.cuda import fusion

    n, e = data.draw(st.integers(0, 40)), data.draw(st.integers(0, 50))  # > one block of 256
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for where, group in cell_groups(cell, dtype):
        inputs = random_inputs(group, dtype, n, e, rng)
        want = NumpyFusedKernel(group, np, dtype)(*inputs)
        kernel = fusion.CupyFusedKernel(group, cupy, dtype)
        got = kernel(*[cupy.asarray(a) for a in inputs])
        outs = [cupy.full(w.shape, np.nan, w.dtype) for w in want]  # and into given arrays
        got_into = kernel(*[cupy.asarray(a) for a in inputs], outs=outs)
        assert all(g is o for g, o in zip(got_into, outs))
        for p, (g, gi, w) in enumerate(zip(got, got_into, want)):
            _close(g.get(), w, dtype, f"{cell} {where} {kernel!r} output {p}")
            _close(gi.get(), w, dtype, f"{cell} {where} {kernel!r} output {p} (outs)")


@pytest.mark.gpu
def test_gpu_broken_expression_is_a_kernel_compile_error():
    cupy = _cupy()
    from minicavs.cuda import fusion

    kernel = fusion.CupyFusedKernel(_broken_group(), cupy, np.float32)
    with pytest.raises(KernelCompileError, match=r"(?s)ops: tanh broken_op.*\| "):
        kernel(cupy.ones(4, np.float32))


@pytest.mark.gpu
def test_gpu_executor_uses_generated_kernels():
    cupy = _cupy()
    from minicavs.runtime.executor import make_fused_kernel
    from minicavs.cuda.fusion import CupyFusedKernel

    (_, group), *_ = cell_groups("binary_tree_lstm", np.float32)
    assert isinstance(make_fused_kernel(group, cupy, np.float32), CupyFusedKernel)


@pytest.mark.gpu
def test_gpu_stream_scheduler_orders_work_across_streams():
    cupy = _cupy()
    Step = namedtuple("Step", "reads writes stream")
    Symbol = namedtuple("Symbol", "key")  # what the scheduler reads of a step's values
    x, y = Symbol(object()), Symbol(object())
    side_step = Step([x], [y], SIDE)
    sched = streams.StreamScheduler(streams.CupyStreams(cupy))
    env = {}
    big = cupy.random.standard_normal((2048, 2048))
    env["x"] = big @ big  # long work on the main stream
    sched.run(side_step, lambda: env.__setitem__("y", env["x"].sum(axis=0)))
    main_step = Step([y], [Symbol(object())], MAIN)
    sched.run(main_step, lambda: env.__setitem__("z", env["y"] * 2))
    sched.join()
    want = (big.get() @ big.get()).sum(axis=0) * 2
    np.testing.assert_allclose(env["z"].get(), want, rtol=1e-9, atol=1e-6)
    uploaded = sched.upload(cupy, {"order": np.arange(10, dtype=np.int32)})
    assert isinstance(uploaded["order"], cupy.ndarray)
    assert uploaded["order"].get().tolist() == list(range(10))


@pytest.mark.gpu
def test_gpu_upload_never_overwrites_a_block_the_main_stream_still_reads():
    cupy = _cupy()
    sched = streams.StreamScheduler(streams.CupyStreams(cupy))
    n = 1 << 22
    big = cupy.random.standard_normal((4096, 4096), dtype=np.float32) * 1e-2
    pool = cupy.get_default_memory_pool()
    for attempt in range(5):
        pool.free_all_blocks()  # no free block but a's below (the last attempt left two)
        a = cupy.ones(n, np.float32)
        block = a.data.ptr
        slow = big
        for _ in range(30):  # tens of milliseconds queued on the main stream ...
            slow = slow @ big
        doubled = a * 2  # ... then a read of a
        del a  # a's block goes back to the main stream's pool now, with that read still queued
        uploaded = sched.upload(cupy, {"x": np.zeros(n, np.float32)}, wait=False)
        assert uploaded["x"].data.ptr == block, "CuPy's pool did not hand the block back"
        sched.join()
        assert float(doubled.sum()) == 2 * n, f"attempt {attempt}: the upload overwrote a"
        assert not uploaded["x"].any()
        del doubled, uploaded, slow


def _vertex_run(cell, dtype, device, batch, seed=3, streams_on=True, explained=False):
    F, params = {"binary_tree_lstm": binary_tree_lstm,
                 "child_sum_tree_lstm": child_sum_tree_lstm}[cell](
                     E, H, np.random.default_rng(seed), dtype=np.dtype(dtype).name,
                     options={"streams": streams_on})  # passes run when F is made
    if device == "cuda":
        cupy = _cupy()
        for p in params:
            p.data = cupy.asarray(p.data)
    rng = np.random.default_rng(seed + 1)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)).astype(dtype), device=device,
                  requires_grad=True)
    weights = mc.tensor(rng.standard_normal((batch.num_vertices,) + F.push_shape)
                        .astype(dtype), device=device)
    out = F(batch, pull=X)
    ((out * weights).sum() + (out * out).sum()).backward()
    return [out.numpy(), X.grad.numpy()] + [p.grad.numpy() for p in params] + [
        F.explain()] * explained


@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["binary_tree_lstm", "child_sum_tree_lstm"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("streams_on", [True, False], ids=["streams", "one-stream"])
def test_gpu_vertex_function_equals_numpy_runtime(cell, dtype, streams_on):
    graphs = [mc.InputGraph.complete_binary(8), mc.InputGraph.chain(6),
              mc.InputGraph([[], [0], [0, 1]])]  # a DAG: vertex 0 has two parents
    if cell == "child_sum_tree_lstm":
        graphs.append(mc.InputGraph([[], [], [], [0, 1, 2], [3], [4, 2]]))
    batch = mc.GraphBatch(graphs)
    want = _vertex_run(cell, dtype, "cpu", batch)
    got = _vertex_run(cell, dtype, "cuda", batch, streams_on=streams_on)
    names = ["pushed outputs", "grad X"] + [f"grad param {k}" for k in range(len(got) - 2)]
    for name, g, w in zip(names, got, want):
        _close(g, w, dtype, f"{cell}: {name}", loose=5.0)


def _recursive_run(dtype, device, batch, seed=5):
    """A recursive Tree-LSTM (a leaf kind over all its rows, an internal kind by levels) on
    ``device``: its pushed outputs and every gradient."""
    rng = np.random.default_rng(seed)
    model, params = recursive_tree_lstm(E, H, rng, dtype=np.dtype(dtype).name)
    if device == "cuda":
        for p in params:
            p.data = _cupy().asarray(p.data)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)).astype(dtype), device=device,
                  requires_grad=True)
    out = model(batch, pull=X)
    (out * out).sum().backward()
    return [out.numpy(), X.grad.numpy()] + [p.grad.numpy() for p in params]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_gpu_recursive_definition_equals_numpy(dtype):
    """mc.recursive on the GPU: its kinds' rows (a kind's child slots uploaded with its
    indices) and the leaf kind's whole-batch work give NumPy's values and gradients."""
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(8), mc.InputGraph([[], [], [0, 1]]),
                           mc.InputGraph([[]])])
    want = _recursive_run(dtype, "cpu", batch)
    got = _recursive_run(dtype, "cuda", batch)
    names = ["pushed outputs", "grad X", "grad W", "grad U", "grad b", "grad W_out"]
    for name, g, w in zip(names, got, want):
        _close(g, w, dtype, f"recursive: {name}", loose=5.0)


@pytest.mark.gpu
@pytest.mark.parametrize("issuer", ["c", "python"])
def test_gpu_levels_issued_from_c_equal_numpy(issuer, monkeypatch):
    """The level loop's launches issued from C (cuda/issuer.py: cuLaunchKernel and cuBLAS
    called through the driver's function pointers) and from Python give NumPy's results, and
    explain() names the issuer that ran (the emulated device checks the tables on the CPU)."""
    monkeypatch.setenv("MINICAVS_CUDA_ISSUER", issuer)
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(16), mc.InputGraph.chain(9),
                           mc.InputGraph([[], [0], [0, 1]])])
    want = _vertex_run("binary_tree_lstm", np.float32, "cpu", batch, explained=True)
    got = _vertex_run("binary_tree_lstm", np.float32, "cuda", batch, explained=True)
    for k, (g, w) in enumerate(zip(got[:-1], want[:-1])):
        _close(g, w, np.float32, f"issued from {issuer}: result {k}", loose=5.0)
    stats = got[-1]
    expected = "cupy (levels issued from C)" if issuer == "c" else "cupy"
    assert (stats["forward_backend"], stats["backward_backend"]) == (expected, expected), stats


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["own", "measure"])
def test_gpu_level_products_by_our_kernel_or_cublas_equal_numpy(kernels, monkeypatch):
    """A level's product through cuda/products.py's kernel (forced), or whichever measured
    faster on this GPU, gives NumPy's results; the measurement is a row count it tested."""
    from minicavs.cuda import issuer, products

    monkeypatch.setenv("MINICAVS_KERNELS", kernels)
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(16), mc.InputGraph.chain(9)])
    want = _vertex_run("binary_tree_lstm", np.float32, "cpu", batch)
    got = _vertex_run("binary_tree_lstm", np.float32, "cuda", batch)
    for k, (g, w) in enumerate(zip(got, want)):
        _close(g, w, np.float32, f"products ({kernels}): result {k}", loose=5.0)
    driver = issuer.driver(_cupy())
    assert not isinstance(driver, str), driver
    most = products.most_rows(driver, np.float32, 0, 2 * H, 5 * H)
    assert most in (0,) + products.ROWS_MEASURED or kernels == "own", most
