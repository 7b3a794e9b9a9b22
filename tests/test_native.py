"""The native CPU backend (runtime/native.py on cpu/): compiled level loops equal the interpreter, the
code cache compiles a source once, and every way of not running natively is said, not hidden.

The batched == per-sample property tests (test_vertex_runtime.py) run on both backends through
the ``cpu_backend`` fixture; here: the native loop really runs where it should, equals the
interpreter on the same batch, and the policy around it."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.cpu import build
from minicavs.runtime import codegen, interpreter_only
from minicavs.vertex.graphs import BatchIndices
from minicavs.errors import KernelCompileError

from graph_strategies import forests
from vertex_cells import binary_tree_lstm, child_sum_tree_lstm, embedding_tree_lstm, k_ary_cell, \
    rntn

E, H = 3, 4
needs_native = pytest.mark.skipif(build.unavailable() is not None,
                                  reason=f"the native backend is off: {build.unavailable()}")


def _run(F, params, batch, X, weights):
    out = F(batch, pull=X)
    loss = (out * mc.tensor(weights)).sum() + (out * out).sum()
    loss.backward()
    leaves = ([X] if X.requires_grad else []) + params
    results = [out.numpy()] + [t.grad.numpy() if t.grad is not None else None for t in leaves]
    for t in leaves:
        t.grad = None
    stats = F.explain()
    return results, (stats["forward_backend"], stats["backward_backend"])


def _native_and_interpreter(F, params, graphs, seed, X=None):
    rng = np.random.default_rng(seed)
    batch = mc.GraphBatch(graphs)
    if X is None:
        X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    weights = rng.standard_normal((batch.num_vertices,) + F.push_shape)
    got, backends = _run(F, params, batch, X, weights)
    with interpreter_only():
        want, interpreted = _run(F, params, batch, X, weights)
    assert interpreted == ("interpreter (interpreter_only() is active)",) * 2
    for k, (g, w) in enumerate(zip(got, want)):
        assert (g is None) == (w is None), k
        if g is not None:
            error = np.max(np.abs(g - w) / np.maximum(1.0, np.abs(w)), initial=0.0)
            assert error <= 1e-9, f"result {k}: native differs from the interpreter by {error}"
    return backends


# The passes that only change what the native loop does: each on and off.
NATIVE_PASSES = ("direct_gathers", "inline_windows", "direct_scatters")

CELLS = {
    "binary": lambda rng, o: binary_tree_lstm(E, H, rng, options=o),
    "3-ary": lambda rng, o: k_ary_cell(E, H, 3, rng, options=o),
    "chain": lambda rng, o: k_ary_cell(E, H, 1, rng, options=o),
    "rntn": lambda rng, o: rntn(E, H, rng, options=o),
}


@needs_native
@given(st.sampled_from(sorted(CELLS)), st.booleans(), st.booleans(),
       forests(max_arity=3, max_vertices=14, kinds=("tree", "dag")), st.integers(0, 2**16),
       st.fixed_dictionaries({name: st.booleans() for name in NATIVE_PASSES}))
def test_native_loops_run_and_equal_the_interpreter(cell, fuse, strided, graphs, seed,
                                                    native_passes):
    if cell in ("binary", "rntn"):
        graphs = [g for g in graphs if g.max_arity <= 2] or [mc.InputGraph.chain(3)]
    if cell == "chain":
        graphs = [g for g in graphs if g.max_arity <= 1] or [mc.InputGraph.chain(4)]
    F, params = CELLS[cell](np.random.default_rng(seed),
                            {"fuse": fuse, "strided_gathers": strided, **native_passes})
    assert _native_and_interpreter(F, params, graphs, seed) == ("native", "native")


@needs_native
@pytest.mark.parametrize("interface", ["cblas", "fortran32", "no gemv"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_row_levels_run_their_products_on_the_blas_gemv(interface, dtype, monkeypatch):
    """A level of one row runs its products — h U forward, δ Uᵀ backward — as the BLAS's gemv
    where the loop's own kernel is not chosen (``MINICAVS_KERNELS=blas``), through the CBLAS
    and through SciPy's Fortran BLAS, and as its gemm where the BLAS has no gemv: values and
    gradients equal the interpreter's."""
    from minicavs.cpu import blas, calibrate

    monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")
    if interface == "no gemv":
        monkeypatch.setattr(calibrate, "gemv", lambda d: (None,) + calibrate.gemm(d)[1:])
    if interface == "fortran32":
        for routine in ("gemm", "gemv"):
            monkeypatch.setattr(calibrate, routine, lambda d, r=routine: (blas._scipy_routine(
                {"float32": "s", "float64": "d"}[np.dtype(d).name] + r), "fortran32", "SciPy"))
    rng = np.random.default_rng(17)
    e, h = 7, 11  # (a program of its own: compiled for this interface)
    W = mc.Parameter(rng.standard_normal((e, h)).astype(dtype) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((h, h)).astype(dtype) * 0.5, name="U")
    F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() @ W + v.gather(0) @ U)),
                          arity=1, pull_shape=(e,), scatter_shape=(h,), dtype=dtype)
    batch = mc.GraphBatch([mc.InputGraph.chain(6)])  # every level one row
    X = mc.tensor(rng.standard_normal((6, e)).astype(dtype), requires_grad=True)
    weights = rng.standard_normal((6, h)).astype(dtype)
    got, backends = _run(F, [W, U], batch, X, weights)
    assert backends == ("native", "native")
    with interpreter_only():
        want, _ = _run(F, [W, U], batch, X, weights)
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance)


# Rows that are tensors inside the level loop: each vertex's value seen as an (A, B) matrix
# (reshape), multiplied by a broadcast row, column or shared matrix, and summed over one or
# both axes (with or without keepdims) — the shapes an RNTN-like cell makes.
ROW_OPERANDS = ("row", "column", "shared", "shared_row", "broadcast_to")


@needs_native
@given(st.integers(1, 4), st.integers(1, 5), st.sampled_from(ROW_OPERANDS),
       st.sampled_from([(0,), (1,), (-1,), (0, 1), (-2, -1)]), st.booleans(),
       forests(max_arity=2, max_vertices=12), st.integers(0, 2**16))
def test_rows_of_several_axes_run_natively_and_equal_the_interpreter(A, B, operand, axes,
                                                                       keepdims, graphs, seed):
    rng = np.random.default_rng(seed)
    W = mc.Parameter(rng.standard_normal((E, A * B)) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((H, A * B)) * 0.5, name="U")
    M = mc.Parameter(rng.standard_normal((A, B)), name="M")
    R = mc.Parameter(rng.standard_normal((1, B)), name="R")
    P = mc.Parameter(rng.standard_normal((B, H)) * 0.5, name="P")

    def cell(v):
        flat = mc.tanh(v.pull() @ W + (v.gather(0) + v.gather(1)) @ U)  # (A·B,) a vertex
        rows = mc.reshape(flat, (A, B))
        other = {"row": lambda: mc.reshape(flat, (A, B))[:1],  # (1, B): broadcast over A
                 "column": lambda: mc.sum(rows, axis=1, keepdims=True),  # (A, 1): over B
                 "shared": lambda: M, "shared_row": lambda: R,
                 "broadcast_to": lambda: mc.broadcast_to(mc.sum(rows, axis=1, keepdims=True),
                                                         (A, B))}[operand]()
        total = mc.sum(rows * other + rows, axis=axes, keepdims=keepdims)
        total = mc.reshape(total, (-1,))  # (A,), (B,) or (1,)
        h = mc.tanh(mc.sum(total) + flat[:B] @ P)
        v.scatter(h)
        v.push(h * h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), push_shape=(H,), arity=2,
                          dtype="float64")
    graphs = [g for g in graphs if g.max_arity <= 2] or [mc.InputGraph.chain(3)]
    assert _native_and_interpreter(F, [W, U, M, R, P], graphs, seed) == ("native", "native")


@needs_native
@given(forests(max_arity=2, max_vertices=16), st.integers(0, 2**16))
def test_embedded_words_run_natively(graphs, seed):
    rng = np.random.default_rng(seed)
    F, params = embedding_tree_lstm(E, H, 7, rng)
    batch = mc.GraphBatch(graphs)
    words = mc.tensor(np.where(batch.num_children == 0, rng.integers(0, 7, batch.num_vertices),
                               -1))
    assert _native_and_interpreter(F, params, graphs, seed, X=words) == ("native", "native")


@needs_native
def test_float32_native_is_close_to_the_interpreter():
    rng = np.random.default_rng(1)
    F, params = binary_tree_lstm(E, 16, rng, dtype="float32")
    graphs = [mc.InputGraph.complete_binary(8), mc.InputGraph([[], [], [0, 1]])]
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)).astype("float32"))
    weights = rng.standard_normal((batch.num_vertices,) + F.push_shape).astype("float32")
    got, backends = _run(F, params, batch, X, weights)
    with interpreter_only():
        want, _ = _run(F, params, batch, X, weights)
    assert backends == ("native", "native")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@needs_native
def test_what_the_native_loop_does_not_compile_runs_on_the_interpreter_and_says_why():
    F, params = child_sum_tree_lstm(E, H, np.random.default_rng(0))  # gather_sum: edge lists
    backends = _native_and_interpreter(F, params, [mc.InputGraph([[], [], [], [0, 1, 2]])], 0)
    assert all(b.startswith("interpreter (") and "gather_sum" in b for b in backends), backends
    F, params = binary_tree_lstm(E, H, np.random.default_rng(0),
                                 options={"lazy_batching": False})  # U's gradient per level
    backends = _native_and_interpreter(F, params, [mc.InputGraph([[], [], [0, 1]])], 0)
    assert backends[1].startswith("interpreter (") and "sum" in backends[1], backends


@needs_native
def test_the_generated_source_names_the_instructions_it_came_from():
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0))
    source = codegen.generate(F.program).source
    for line in F.program.dump().splitlines():
        if line.strip().startswith("gather "):
            assert " ".join(line.split()) in source
    assert "gemm_rows(" in source and "#pragma omp simd" in source


@needs_native
def test_a_source_compiles_once_then_comes_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    source = 'extern "C" int minicavs_answer(void) { return 42; }\n'
    lib, compiled = build.build(source, "test")
    assert compiled and lib.minicavs_answer() == 42
    lib, compiled = build.build(source, "test")
    assert not compiled and lib.minicavs_answer() == 42
    assert os.path.exists(build.library_path(source, "test"))
    assert os.path.exists(build.library_path(source, "test")[:-3] + ".cpp")


@needs_native
def test_a_compile_error_shows_the_numbered_source_and_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    source = "// generated\nextern \"C\" int f(void) { return undefined_name; }\n"
    with pytest.raises(KernelCompileError) as info:
        build.build(source, "broken", origin="program 'demo'")
    message = str(info.value)
    assert "program 'demo'" in message and "undefined_name" in info.value.log
    assert "2 | extern \"C\" int f(void)" in message
    assert not [f for f in os.listdir(tmp_path / "native") if f.startswith("broken")]


_SUBPROCESS = textwrap.dedent("""
    import warnings
    import numpy as np
    import minicavs as mc
    warnings.simplefilter("always")
    W = mc.Parameter(np.ones((2, 2)) * 0.5, name="W")
    F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() + v.gather(0) @ W)),
                          pull_shape=(2,), scatter_shape=(2,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(4)])
    with warnings.catch_warnings(record=True) as caught:
        for _ in range(2):
            out = F(batch, pull=mc.tensor(np.ones((4, 2))))
            out.sum().backward()
    notes = [str(w.message) for w in caught if "native CPU backend" in str(w.message)]
    print(len(notes), "|", notes[0] if notes else "", "|", F.explain()["forward_backend"], "|",
          round(float(out.numpy().sum()), 12))
""")


def _in_subprocess(**env):
    environment = dict(os.environ, **env)
    result = subprocess.run([sys.executable, "-c", _SUBPROCESS], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    return [part.strip() for part in result.stdout.split("|")]


def test_minicavs_native_0_runs_the_interpreter_after_one_warning():
    count, note, backend, total = _in_subprocess(MINICAVS_NATIVE="0")
    assert count == "1" and "MINICAVS_NATIVE=0" in note and "interpreter" in note
    assert backend == "interpreter (MINICAVS_NATIVE=0 is set)"
    if build.unavailable() is None:  # the same result natively
        assert _in_subprocess(MINICAVS_NATIVE="1")[2:] == ["native", total]


def test_without_a_compiler_the_interpreter_runs_after_one_warning(tmp_path):
    count, note, backend, _ = _in_subprocess(CXX=str(tmp_path / "no-such-compiler"),
                                             MINICAVS_CACHE_DIR=str(tmp_path))
    assert count == "1" and "no C++ compiler" in note and "apt-get install g++" in note
    assert backend.startswith("interpreter (no C++ compiler")


def test_doctor_reports_the_cpu_backend():
    from minicavs.doctor import run_doctor
    import io

    text = io.StringIO()
    status = run_doctor(text)
    line = next(x for x in text.getvalue().splitlines() if "cpu backend" in x)
    if build.unavailable() is None:
        assert "native C++ level loops (ok" in line and status == 0
    else:
        assert "NumPy interpreter" in line


@needs_native
def test_native_scratch_is_the_widest_level_kept_for_the_next_call():
    F, _ = binary_tree_lstm(E, 64, np.random.default_rng(0))

    def run(copies):
        batch = mc.GraphBatch([mc.InputGraph.complete_binary(2)] * copies)
        with mc.no_grad():
            F(batch, pull=mc.tensor(np.ones((batch.num_vertices, E))))

    run(40)  # the widest level first
    scratch = dict(F.executable.native._scratch.arrays)
    assert scratch and all(len(a) == 80 for a in scratch.values())  # 40 trees: 80 leaves
    for copies in range(1, 40):  # narrower levels reuse it: no allocation, no page faults
        run(copies)
    assert F.executable.native._scratch.arrays == scratch


@needs_native
def test_softmax_cross_entropy_kernel_equals_numpy():
    from minicavs.cpu import kernels

    rng = np.random.default_rng(0)
    for dtype, tolerance in (("float64", 1e-12), ("float32", 1e-5)):
        x = (rng.standard_normal((37, 1001)) * 8).astype(dtype)
        labels = rng.integers(0, 1001, 37)
        g = rng.standard_normal(37).astype(dtype)
        shifted = x - x.max(-1, keepdims=True)
        p = np.exp(shifted.astype("float64"))
        losses = np.log(p.sum(-1)) - shifted[np.arange(37), labels]
        p /= p.sum(-1, keepdims=True)
        p[np.arange(37), labels] -= 1
        np.testing.assert_allclose(kernels.softmax_cross_entropy(x, labels), losses,
                                   rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(kernels.softmax_cross_entropy_grad(x, labels, g),
                                   p * g[:, None], rtol=tolerance, atol=tolerance)
        # a summed loss's gradient, one number broadcast to every row (it ran NumPy's form)
        one = np.broadcast_to(np.asarray(g[0]), g.shape)
        np.testing.assert_allclose(kernels.softmax_cross_entropy_grad(x, labels, one),
                                   p * g[0], rtol=tolerance, atol=tolerance)
    assert kernels.softmax_cross_entropy(x[:, ::2], labels) is None  # not contiguous: NumPy runs



@needs_native
def test_take_rows_kernel_reads_ids_in_any_layout():
    """The embedding lookup's kernel against NumPy, a zero row for -1, with the ids a column of
    a wider array (TreeRNN's [word, internal] pulls: they ran NumPy's masked form); an id out
    of range leaves it to the caller's check."""
    from minicavs.cpu import kernels

    rng = np.random.default_rng(0)
    table = rng.standard_normal((9, 5)).astype("float32")
    pulls = np.stack([rng.integers(-1, 9, 20), rng.integers(0, 2, 20)], axis=1)
    ids = pulls[:, 0]
    expected = np.where((ids >= 0)[:, None], table[np.maximum(ids, 0)], 0)
    np.testing.assert_array_equal(kernels.take_rows(table, ids), expected)
    pulls[3, 0] = 9
    assert kernels.take_rows(table, pulls[:, 0]) is None


@needs_native
@pytest.mark.parametrize("forget", [0, 1, 2])
def test_lstm_cell_kernels_equal_the_formulas(forget):
    """The one-pass LSTM cell and its gradient (cpu/kernels.py, used by ops.lstm_cell) against
    the formulas written out here in float64, for each number of forget gates."""
    from minicavs.cpu import kernels

    def s(x):
        return 1 / (1 + np.exp(-x))

    rng = np.random.default_rng(forget)
    H = 13  # (not a multiple of the vector width: the loop's remainder runs too)
    pre64 = rng.standard_normal((7, (3 + forget) * H)) * 4
    cs64 = [rng.standard_normal((7, H)) for _ in range(forget)]
    g64 = rng.standard_normal((7, 2 * H))
    gates = np.split(pre64, 3 + forget, axis=-1)
    i, fs, o, u = s(gates[0]), [s(f) for f in gates[1:1 + forget]], s(gates[-2]), \
        np.tanh(gates[-1])
    c = i * u + sum(f * cp for f, cp in zip(fs, cs64))
    h = o * np.tanh(c)
    gh, gc = g64[:, :H], g64[:, H:]
    dc = gc + gh * o * (1 - np.tanh(c) ** 2)
    expected_grad = np.concatenate(
        [dc * u * i * (1 - i)] + [dc * cp * f * (1 - f) for f, cp in zip(fs, cs64)]
        + [gh * np.tanh(c) * o * (1 - o), dc * i * (1 - u * u)] + [dc * f for f in fs], axis=-1)
    for dtype, tolerance in (("float64", 1e-12), ("float32", 1e-5)):
        pre, g = pre64.astype(dtype), g64.astype(dtype)
        cs = [cp.astype(dtype) for cp in cs64]
        out = kernels.lstm_cell(pre, cs)
        np.testing.assert_allclose(out, np.concatenate([h, c], -1), rtol=tolerance,
                                   atol=tolerance)
        np.testing.assert_allclose(kernels.lstm_cell_grad(pre, cs, out, g), expected_grad,
                                   rtol=tolerance, atol=tolerance)
    if cs:  # the previous cells as the c half of [h, c] rows: strided rows, read in place,
        # each at its own stride (a Tree-LSTM's children from slabs of two widths: it ran
        # NumPy's form), and the output and its cotangent as windows of wider rows
        states = [np.concatenate([np.zeros((7, H * (1 + j)), dtype), cp], -1)
                  for j, cp in enumerate(cs)]
        strided = [st[:, -H:] for st in states]
        np.testing.assert_allclose(kernels.lstm_cell(pre, strided), out, rtol=0, atol=0)
        wide_out = np.concatenate([out, np.zeros_like(out)], -1)[:, :2 * H]
        wide_g = np.concatenate([np.zeros_like(g), g], -1)[:, 2 * H:]
        np.testing.assert_allclose(kernels.lstm_cell_grad(pre, strided, wide_out, wide_g),
                                   expected_grad, rtol=tolerance, atol=tolerance)
        assert kernels.lstm_cell(pre, [cs[0][:, ::-1]] + cs[1:]) is None  # reversed: NumPy
    assert kernels.lstm_cell(pre[:, ::-1], cs) is None  # not contiguous: NumPy runs
    if cs:  # mixed dtypes: NumPy runs
        assert kernels.lstm_cell(pre, [cs[0].astype("float64")] + cs[1:]) is None


@needs_native
@pytest.mark.parametrize("forget", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lstm_cell_sum_adds_in_order_keeps_the_sum_and_runs_the_cell(forget, dtype, monkeypatch):
    """An LSTM step's ``(x·W + h·U) + b`` added in the cell's pass (cpu/kernels.lstm_cell_sum,
    runtime/executor.SummedCellStep): the sum bit for bit as the fused group adds it, the cell
    as the one-pass cell on that sum, on the team's threads too (``own``: every loop splits);
    a term read as a column window of a wider array; what it cannot read declines."""
    from minicavs.cpu import kernels, products

    monkeypatch.setenv("MINICAVS_KERNELS", "own")
    rng = np.random.default_rng(forget)
    H, rows = 13, 301
    width = (3 + forget) * H
    xw = rng.standard_normal((rows, width + 5)).astype(dtype)[:, 5:]  # a column window
    hu = rng.standard_normal((rows, width)).astype(dtype)
    b = rng.standard_normal(width).astype(dtype)
    states = [rng.standard_normal((rows, 2 * H)).astype(dtype) for _ in range(forget)]
    cs = [st[:, H:] for st in states]  # the c halves of [h, c] rows
    want_pre = (xw + hu) + b
    with products.team_products():
        pre, out = kernels.lstm_cell_sum([xw, hu, b], cs)
    assert np.array_equal(pre, want_pre)
    assert np.array_equal(out, kernels.lstm_cell(want_pre, cs))
    into_pre, into_out = np.empty_like(pre), np.empty_like(out)
    got = kernels.lstm_cell_sum([b, hu], cs, into_out, into_pre)
    assert got[0] is into_pre and got[1] is into_out and np.array_equal(into_pre, b + hu)
    strided = np.repeat(b, 2)[::2]  # a bias read through a stride: its values, not its memory
    assert np.array_equal(kernels.lstm_cell_sum([xw, hu, strided], cs)[0], want_pre)
    assert kernels.lstm_cell_sum([xw, hu[:1]], cs) is None  # one row of a 2-D term
    assert kernels.lstm_cell_sum([xw, np.ones((), dtype)], cs) is None  # a scalar term
    assert kernels.lstm_cell_sum([xw, hu.astype(np.float16)], cs) is None  # another dtype
    assert kernels.lstm_cell_sum([xw, hu[:, ::-1]], cs) is None  # reversed columns
    assert kernels.lstm_cell_sum([xw], cs) is None  # one term: no sum to fuse


# --- layouts: every array the generated code reads is in a layout it supports ---------------------

def _view(values, layout, rng):
    """``values`` (2-D or 1-D) as an array of the same values in another memory layout: what a
    user can hand a Parameter (``p.data = view``) or capture through DLPack."""
    if layout == "contiguous":
        return values
    if layout == "reversed rows":  # negative row stride
        return np.ascontiguousarray(values[::-1])[::-1]
    if layout == "reversed columns":  # negative column stride
        return np.ascontiguousarray(values[..., ::-1])[..., ::-1]
    if layout == "fortran":
        return np.asfortranarray(values)
    if layout == "strided":  # every other row and a column step of 3 out of a larger block
        big = np.zeros((2 * values.shape[0],) + (3 * values.shape[-1],) if values.ndim == 2
                       else (3 * values.shape[0],), values.dtype)
        view = big[::2, ::3] if values.ndim == 2 else big[::3]
        view[...] = values
        return view
    if layout == "offset":  # a window starting past the first element
        big = np.zeros((values.shape[0] + 1,) + values.shape[1:], values.dtype)
        big[1:] = values
        return big[1:]
    if layout == "broadcast":  # stride 0: one row repeated (the values become that row's)
        return np.broadcast_to(values[:1], values.shape)
    if layout == "dlpack":
        return np.from_dlpack(np.asfortranarray(values))
    raise AssertionError(layout)


LAYOUTS = ["contiguous", "reversed rows", "reversed columns", "fortran", "strided", "offset",
           "broadcast", "dlpack"]


@needs_native
@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS),
       st.sampled_from(["float64", "float32"]), st.integers(0, 2**16))
def test_native_equals_the_interpreter_for_weights_in_any_layout(w_layout, u_layout, b_layout,
                                                                dtype, seed):
    """A captured weight whose rows are reversed, broadcast, strided, offset, Fortran-ordered
    or shared through DLPack gives the interpreter's outputs and gradients natively."""
    rng = np.random.default_rng(seed)
    F, params = binary_tree_lstm(E, H, rng, dtype=dtype)
    W, U, b, _ = params
    for p, layout in ((W, w_layout), (U, u_layout), (b, b_layout)):
        p.data = _view(np.array(p.data), layout, rng)
    graphs = [mc.InputGraph.complete_binary(4), mc.InputGraph([[], [], [0, 1], [], [2, 3]])]
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)).astype(dtype),
                  requires_grad=True)
    weights = rng.standard_normal((batch.num_vertices,) + F.push_shape).astype(dtype)
    got, backends = _run(F, params, batch, X, weights)
    with interpreter_only():
        want, _ = _run(F, params, batch, X, weights)
    assert backends == ("native", "native")
    tolerance = 1e-9 if dtype == "float64" else 1e-4
    for k, (g, w) in enumerate(zip(got, want)):
        error = np.max(np.abs(g - w) / np.maximum(1.0, np.abs(w)), initial=0.0)
        assert error <= tolerance, f"result {k}: native differs from the interpreter by {error}"


@needs_native
def test_scatter_add_rows_kernel_equals_numpy():
    from minicavs.cpu import kernels

    rng = np.random.default_rng(1)
    for dtype in ("float64", "float32"):
        out = rng.standard_normal((9, 5)).astype(dtype)
        idx = rng.integers(-1, 9, 40)  # repeats and absent (-1) rows
        values = rng.standard_normal((40, 5)).astype(dtype)
        want = out.copy()
        np.add.at(want, idx[idx >= 0], values[idx >= 0])
        assert kernels.scatter_add_rows(out, idx, values)
        np.testing.assert_allclose(out, want, rtol=1e-6 if dtype == "float32" else 1e-12)
        # strided rows on both sides: columns 3:8 of a gradient slab, a slice of a wider g
        slab = rng.standard_normal((9, 12)).astype(dtype)
        wide = rng.standard_normal((40, 11)).astype(dtype)
        want = slab.copy()
        np.add.at(want[:, 3:8], idx[idx >= 0], wide[idx >= 0, 2:7])
        assert kernels.scatter_add_rows(slab[:, 3:8], idx, wide[:, 2:7])
        np.testing.assert_allclose(slab, want, rtol=1e-6 if dtype == "float32" else 1e-12)
    assert not kernels.scatter_add_rows(out, idx, values.astype("float64"))  # NumPy runs
    assert not kernels.scatter_add_rows(out, idx, values[:, ::2].repeat(3, 1)[:, :5][::-1])
    assert not kernels.scatter_add_rows(np.zeros((9, 5, 2))[:, :, 0], idx, values)  # strided


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("cols", [5, 16, 37, 256, 300])
def test_scatter_add_rows_on_threads_is_the_one_core_sum_bit_for_bit(threads, cols, monkeypatch):
    """The team splits a scatter-add by columns, each element's adds in row order: the same bits
    as NumPy's ``add.at`` (sequential) on any team, for repeated and absent rows, whole
    matrices and windows of wider ones."""
    from minicavs.cpu import calibrate, kernels

    monkeypatch.setattr(calibrate, "threads_for", lambda elements: threads)
    rng = np.random.default_rng(cols)
    for dtype in ("float32", "float64"):
        idx = rng.integers(-1, 7, 500)
        wide = rng.standard_normal((500, cols + 3)).astype(dtype)
        slab = rng.standard_normal((7, cols + 5)).astype(dtype)
        want = slab.copy()
        np.add.at(want[:, 1:1 + cols], idx[idx >= 0], wide[idx >= 0, 2:2 + cols])
        assert kernels.scatter_add_rows(slab[:, 1:1 + cols], idx, wide[:, 2:2 + cols])
        np.testing.assert_array_equal(slab, want)


@needs_native
@pytest.mark.parametrize("kind", ["Adam", "AdamW"])
def test_native_adam_equals_the_numpy_update(kind):
    rng = np.random.default_rng(2)
    shapes = [(7, 3), (5,), (4, 2, 2)]
    values = [rng.standard_normal(s) for s in shapes]
    native = [mc.Parameter(v.copy()) for v in values]
    numpy_ = [mc.Parameter(v.copy()) for v in values]
    opts = [getattr(mc.nn, kind)(ps, lr=0.01) for ps in (native, numpy_)]
    opts[1].step = lambda o=opts[1]: mc.nn.Optimizer.step(o)  # the one-by-one NumPy form
    for _ in range(3):
        grads = [rng.standard_normal(s) for s in shapes]
        for ps, opt in zip((native, numpy_), opts):
            for p, g in zip(ps, grads):
                p.grad = mc.tensor(g.copy())
            opt.step()
    for a, b in zip(native, numpy_):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)
    assert opts[0].state_dict()["state"][0]["step"] == 3


def test_the_native_passes_fire_on_a_tree_lstm():
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0), options={"inline_windows": True})
    forward, backward = F.program.dump(), F.backward_program.dump()
    assert "[native: into its readers' rows]" in forward  # the gathers
    assert "native: computed where read" in forward  # x W + b + h U, inside the gates
    assert "[native: from its concat's parts]" in backward  # [dh, dc] of each child
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0), options=dict.fromkeys(
        NATIVE_PASSES, False))
    assert "native" not in F.program.dump() + F.backward_program.dump()


def _random_binary_tree(rng, leaves):
    children, frontier = [[] for _ in range(leaves)], list(range(leaves))
    while len(frontier) > 1:
        i, j = sorted(rng.choice(len(frontier), 2, replace=False))
        children.append([frontier[i], frontier[j]])
        frontier = [v for k, v in enumerate(frontier) if k not in (i, j)] + [len(children) - 1]
    return mc.InputGraph(children)


@needs_native
@pytest.mark.parametrize("dag, trees", [(False, 40), (False, 400), (True, 80)])
def test_wide_levels_split_between_threads_equal_the_interpreter(dag, trees, monkeypatch):
    """Levels wide enough run on a team of threads (rows split; a product's out split along
    its longer side: 40 trees give levels of fewer rows than its 200 columns, split by columns,
    400 trees levels of more, split by rows); in a DAG the adds into shared children stay on
    one thread. ``MINICAVS_KERNELS=own``: every level of at least a row a thread splits,
    whatever this machine measured."""
    from minicavs.cpu import calibrate, team
    from minicavs.runtime import native

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
    rng = np.random.default_rng(3)
    if dag:  # two parents share both children on every level
        graphs = [mc.InputGraph([[], [], [0, 1], [0, 1], [2, 3]]) for _ in range(trees)]
    else:
        graphs = [_random_binary_tree(rng, int(rng.integers(2, 9))) for _ in range(trees)]
    batch = mc.GraphBatch(graphs)
    widest_internal = int(np.diff(batch.level_offsets)[1:].max())
    assert (widest_internal > 200) == (trees == 400)  # (the product's side each case splits)
    F, params = binary_tree_lstm(E, 40, rng)  # 200 gate columns
    assert _native_and_interpreter(F, params, graphs, 3) == ("native", "native")
    threads = team.team_size()
    if threads > 1:
        spec = SimpleNamespace(row_work=(80 * 200, 200))
        assert native.split_at(spec, threads) == (threads, 1024)  # (forced: a MAC an element)
        assert native.team_size(BatchIndices(batch, np), spec) == (threads, threads, 1024)


@needs_native
def test_levels_split_from_the_work_measured_to_pay_for_a_team(monkeypatch):
    """The rows from which a level splits, and the multiply-adds from which a product in it
    does, come from this CPU's measured costs (``calibrate.split_rate``): their work in elements
    at least the measured break-even; more rows for a lighter row, never fewer than a row a
    thread, never without a team."""
    from minicavs.cpu import calibrate
    from minicavs.runtime import native

    monkeypatch.setattr(calibrate, "split_rate", lambda threads: (1 << 16, 2.0**-30, 2.0**-37))
    heavy, light = (SimpleNamespace(row_work=w) for w in ((100_000, 1000), (0, 100)))
    # 65536 / (1000 + 100000 / 128) elements a row; a multiply-add costs 1/128 of an element
    assert native.split_at(heavy, 4) == (37, 65536 * 128)
    assert native.split_at(light, 4)[0] == 656
    assert native.split_at(SimpleNamespace(row_work=(10**9, 1)), 4)[0] == 4
    monkeypatch.setattr(calibrate, "split_rate", lambda threads: None)  # the team never pays
    assert min(native.split_at(heavy, 4)) > 10**12


@needs_native
def test_large_products_on_the_native_team_equal_numpy(monkeypatch):
    from minicavs.cpu import calibrate, products, team

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # the team wherever it applies
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 700))
    # outside a call of native loops, a product below products.LARGE: NumPy's BLAS (a larger
    # one: test_cpu_kernels_isa.py)
    assert products.matmul(a[:50], b[:, :300]) is None
    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)),
                 (a, b[:, :124]), (a.T.copy().T[:, :], b[:, 5:129])):
        with products.team_products():
            got = products.matmul(x, y)
        if team.team_size() > 1:
            np.testing.assert_allclose(got, x @ y, rtol=1e-12, atol=1e-12)
        else:
            assert got is None  # one core, or a BLAS that cannot be told one thread
    with products.team_products():
        assert products.matmul(a.astype("float32"), b) is None  # mixed dtypes: NumPy
    monkeypatch.setenv(calibrate.ENVIRONMENT, "blas")  # (as where the BLAS measured faster)
    with products.team_products():
        assert products.matmul(a, b) is None


def test_data_addresses_read_from_the_array_struct_equal_numpys():
    """``kernels.data_address`` reads the address from NumPy's array struct (a probe at import
    checked the layout): it must equal ``ndarray.ctypes.data`` for views, offsets, transposes,
    Fortran order, empty and 0-d arrays."""
    from minicavs.cpu import kernels

    base = np.arange(60.0).reshape(6, 10)
    for a in (base, base[2:, 3:], base.T, base[:, 5], np.asfortranarray(base)[1:], np.empty(0),
              np.array(3.0), base.astype(np.float32)[::2], base.reshape(60)[7:]):
        assert kernels.data_address(a) == a.ctypes.data


@needs_native
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_products_with_an_invariant_weight_run_on_its_packed_panels_and_equal_numpy(
        monkeypatch, dtype):
    """A product with few rows whose right operand — or its transpose — is an array declared
    unchanging (a step's weight) runs on panels packed once; values equal NumPy's for every
    row tail (1-5 rows past the 6-row blocks), a last panel cut short, strided rows and a
    given ``out``; anything else is left to NumPy or the team."""
    from minicavs.cpu import calibrate, products

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # the panels wherever they apply
    rng = np.random.default_rng(5)  # (on one core the panels run on one thread: still tested)
    W = rng.standard_normal((300, 1000)).astype(dtype)  # a last panel cut short
    wide = rng.standard_normal((70, 700)).astype(dtype)
    tol = 1e-12 if dtype == "float64" else 2e-5
    with products.team_products(), products.invariant_operands([W]):
        for m in (2, 3, 5, 6, 7, 13, 64):
            strided = wide[:m, :300]  # rows 700 apart
            transposed = rng.standard_normal((m, 1000)).astype(dtype)  # backward: G · Wᵀ
            for x, w in ((strided, W), (transposed, W.T)):
                got = products.matmul(x, w)
                assert got is not None, (m, w.shape)
                expect = x.astype(np.float64) @ w.astype(np.float64)
                np.testing.assert_allclose(got, expect, rtol=tol, atol=tol * 30)
        out = np.full((5, 1000), np.nan, dtype)
        assert products.matmul(wide[:5, :300], W, out) is out
        np.testing.assert_allclose(out, wide[:5, :300].astype(np.float64) @ W, rtol=tol,
                                   atol=tol * 30)
        assert products.packed_matmul(wide[:5, :300], W.copy()) is None  # not declared
        assert products.packed_matmul(wide[:5, :300], W[:, :100]) is None  # a part of it
    with products.team_products():
        assert products.packed_matmul(wide[:5, :300], W) is None  # the block has ended


@needs_native
def test_a_products_route_is_worked_out_once_a_block_and_every_call_gets_the_product(
        monkeypatch):
    """Inside an invariant block the route of a product's form (b's panels, the team, NumPy; a's
    rows as the verdicts are keyed: a few by their count, more by power-of-two bucket) is worked
    out on its first call and looked up after; a later call of that form whose ``out`` the
    panels cannot fill (a column window) still gets the product, and a new block works the
    route out again."""
    from minicavs.cpu import calibrate, products

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # the panels wherever they apply
    rng = np.random.default_rng(7)
    W = rng.standard_normal((64, 96)).astype(np.float32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    expect = x.astype(np.float64) @ W.astype(np.float64)
    worked_out = []
    route = products._route
    monkeypatch.setattr(products, "_route", lambda a, b: worked_out.append(b.shape) or route(a, b))
    with products.team_products(), products.invariant_operands([W]):
        for _ in range(3):
            np.testing.assert_allclose(products.matmul(x, W), expect, rtol=2e-5, atol=1e-4)
        wide = np.full((3, 200), np.nan, np.float32)
        window = wide[:, 50:146]  # (rows 200 apart: not an out the panels write)
        done = products.matmul(x, W, window)
        if done is None:  # (declined: NumPy's matmul runs, as the ops' callers do)
            np.matmul(x, W, out=window)
        np.testing.assert_allclose(window, expect, rtol=2e-5, atol=1e-4)
        assert np.isnan(wide[:, :50]).all() and np.isnan(wide[:, 146:]).all()
        other = W.copy()  # (not declared unchanging: no panels; its own route)
        done = products.matmul(x, other)
        np.testing.assert_allclose(x @ other if done is None else done, expect, rtol=2e-5,
                                   atol=1e-4)
        assert worked_out == [(64, 96), (64, 96)]  # W's form once (the window's too), the copy's
        for rows in (4, 17, 20, 40):  # 4: a count of its own (few rows); 17 and 20: one
            more = rng.standard_normal((rows, 64)).astype(np.float32)  # bucket; 40: the next
            done = products.matmul(more, W)
            np.testing.assert_allclose(more @ W if done is None else done,
                                       more.astype(np.float64) @ W, rtol=2e-5, atol=1e-4)
        assert len(worked_out) == 5
    with products.team_products(), products.invariant_operands([W]):
        products.matmul(x, W)
    assert len(worked_out) == 6  # a new block works it out again


@needs_native
def test_numpy_products_in_a_native_call_run_on_one_blas_thread():
    """Inside a call of native loops, products too small for the team stay on NumPy's BLAS
    with one thread (its spinning pool would share the cores with the team), and the count
    the user had comes back after."""
    threadpoolctl = pytest.importorskip(
        "threadpoolctl", reason="threadpoolctl (which reads the BLAS thread count) is not "
                                "installed; the team-products test above checks the products")
    from minicavs.cpu import blas, products

    if blas.threads_local() is None:
        pytest.skip("this BLAS has no openblas_set_num_threads_local")

    numpy_blas = os.path.realpath(blas._loaded_blas_libraries()[0])  # (SciPy may bring its own)

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()
                if p["user_api"] == "blas" and os.path.realpath(p["filepath"]) == numpy_blas][0]

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        with products.team_products():
            assert blas_threads() == 1
            with products.team_products(False):  # nested: the outer call still owns the count
                assert blas_threads() == 1
        assert blas_threads() == 2


_IDLE_THREADS = textwrap.dedent("""
    import ctypes, time
    import numpy as np
    a = np.ones((600, 600), np.float32)
    a @ a  # NumPy first, its OpenBLAS pool started (with the default timeout unless set)
    import minicavs
    from minicavs.cpu import blas
    lib = ctypes.CDLL(blas._loaded_blas_libraries()[0])
    a @ a  # a threaded product on the pool made again
    began = time.process_time()
    time.sleep(0.2)
    print(lib.openblas_thread_timeout(), round(time.process_time() - began, 3), blas.idle_threads)
""")


def test_openblas_idle_threads_sleep_even_when_numpy_came_first():
    """OpenBLAS reads its thread timeout when NumPy loads it; importing minicavs afterwards
    still makes its idle threads sleep at once (no core left spinning after a product), and a
    timeout the user set is kept."""
    from minicavs.cpu import blas

    lib_path = blas._loaded_blas_libraries()[0]
    if "openblas" not in os.path.basename(lib_path).lower():
        pytest.skip("NumPy's BLAS is not OpenBLAS")

    def run(prelude="", **env):
        environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
        result = subprocess.run([sys.executable, "-c", prelude + _IDLE_THREADS],
                                capture_output=True,
                                text=True, env={**environ, "OPENBLAS_NUM_THREADS": "2", **env},
                                timeout=120)
        assert result.returncode == 0, result.stderr
        timeout, busy, state = result.stdout.split(maxsplit=2)
        return int(timeout), float(busy), state.strip()

    timeout, busy, state = run()
    assert timeout == blas.IDLE_TIMEOUT and state.endswith(f"2^{blas.IDLE_TIMEOUT} cycles")
    assert busy < 0.05  # a spinning thread would have burnt ~0.1 s of the 0.2 s sleep
    assert run(OPENBLAS_THREAD_TIMEOUT="12")[::2] == (12, "OPENBLAS_THREAD_TIMEOUT=12 (yours)")
    # Another thread running: the pool is left alone (it could be inside a BLAS call), and the
    # doctor's line says how to get the setting.
    waiting = ("import threading\n"
               "threading.Thread(target=threading.Event().wait, daemon=True).start()\n")
    timeout, _, state = run(waiting)
    assert timeout != blas.IDLE_TIMEOUT and "OPENBLAS_THREAD_TIMEOUT=4" in state


def test_the_loops_route_is_measured_per_product_layout_and_count(monkeypatch):
    """Each product's entries of rows — a few by their count, more by their power of two up to
    LAST_ROWS — get the measured (or forced) choice between the panels and the BLAS, each
    measured at its own count, for the layout of the weight asked for."""
    from minicavs.cpu import calibrate
    from minicavs.runtime import native

    assert codegen.ROW_COUNTS[:4] == (1, 2, 3, 4) and codegen.ROW_COUNTS[-1] == codegen.LAST_ROWS
    spec = SimpleNamespace(slots=range(3), products=((1, 16, 80),), dtype=np.float64)
    monkeypatch.setenv("MINICAVS_KERNELS", "own")
    assert all(native._panel_rows(spec, 1, 0))
    monkeypatch.setenv("MINICAVS_KERNELS", "blas")
    assert not any(native._panel_rows(spec, 1, 1))
    monkeypatch.delenv("MINICAVS_KERNELS")
    asked = []
    monkeypatch.setattr(native, "_panel_wins", {})
    monkeypatch.setattr(calibrate, "own_is_faster",
                        lambda name, make, **kwargs: asked.append(name) or
                        name.split()[3].startswith("3x"))
    entries = native._panel_rows(spec, 1, 1)
    asked = [name for name in asked if name.startswith("loop panels")]  # (not the gemm's own)
    assert all("16x80 Bᵀ" in name for name in asked)
    counts = [name.split()[3].split("x")[0] for name in asked]
    assert counts == [str(n) for n in range(1, codegen.EXACT_ROWS + 1)] + [
        f"<={1 << e}" for e in range(codegen.EXACT_BITS + 1, 10)]
    assert entries == [n == 3 for n in codegen.ROW_COUNTS]


@given(forests(max_arity=3, max_vertices=20, kinds=("tree", "dag")), st.integers(0, 2**16))
def test_level_plans_found_at_once_equal_the_plans_made_level_by_level(graphs, seed):
    """plans.per_level finds every level's plan with arrays over the levels; here each level's
    zero values and unneeded sinks are worked out one level at a time, as the rule reads."""
    from minicavs.ops.rows import intersect, is_empty

    rng = np.random.default_rng(seed)
    F, _ = k_ary_cell(E, H, 3, rng)
    batch = mc.GraphBatch(graphs)
    rows = batch.indices(np)
    assert F.program.zero_candidates and F.backward_program.skips_unread_sinks
    for exe in (F.executable, F.backward_executable):
        program = exe.program
        size = {"vertex": rows.num_vertices, "edge": rows.num_edges}
        ranges = {}
        for k, d in program.zero_candidates:  # random ranges, some empty, some past the end
            lo = int(rng.integers(0, size[d] + 2))
            ranges[k] = (lo, lo + int(rng.integers(0, size[d] + 2)))
        plans, which, _ = exe.plans.per_level(ranges, rows)
        for t in range(rows.num_levels):
            window = {"vertex": rows.vertices(t), "edge": rows.edges(t)}
            zero = frozenset(k for k, d in program.zero_candidates
                             if k in ranges and is_empty(intersect(ranges[k], window[d])))
            sinks = {s.key for s in program.sinks}
            slots = [(slot, s.key) for slot, s in program.slots if s.key in sinks]
            needed = {key for slot, key in slots if rows.has_child(slot, t)}
            unneeded = frozenset(key for _, key in slots if key not in needed) \
                if program.skips_unread_sinks else frozenset()
            assert plans[which[t]] == exe.plans.plan(zero, unneeded), (program.name, t)


@needs_native
def test_a_profiling_loop_times_each_instruction_and_clears_what_it_read():
    code = textwrap.dedent("""
        import numpy as np, minicavs as mc
        from vertex_cells import binary_tree_lstm
        F, params = binary_tree_lstm(3, 4, np.random.default_rng(0))
        batch = mc.GraphBatch([mc.InputGraph.complete_binary(16)] * 4)
        X = mc.tensor(np.ones((batch.num_vertices, 3)))
        F(batch, pull=X).sum().backward()
        loop = F.executable.native
        first, again = loop.profile(), loop.profile()
        names = {n.key: k for k, n in enumerate(F.program.graph.nodes)}
        assert [note for note, _ in first] == [" ".join(i.dump(names).split())
                                               for i in F.program.core]
        assert all(s >= 0 for _, s in first) and sum(s for _, s in first) > 0
        assert all(s == 0 for _, s in again)
        print("profiled", len(first))""")
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MINICAVS_NATIVE_PROFILE="1",
               PYTHONPATH=tests + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["profiled", str(len(binary_tree_lstm(
        3, 4, np.random.default_rng(0))[0].program.core))]


@needs_native
@pytest.mark.parametrize("kernels", ["own", "blas"])
@pytest.mark.parametrize("trees", [1, 3, 5, 9, 40])
def test_products_on_the_panels_or_the_blas_equal_the_interpreter(trees, kernels, monkeypatch):
    """Every level's product runs on the panel kernel over the weight packed for the call
    where it was measured faster (∂F's x·Wᵀ too, and the product adding into the children's
    rows: panels that add), else on the BLAS: both forced here, 80 gate columns (a last panel
    part full), levels of 1 to 160 rows, split between the team's threads or not."""
    monkeypatch.setenv("MINICAVS_KERNELS", kernels)
    rng = np.random.default_rng(trees)
    F, params = binary_tree_lstm(E, 16, rng)
    graphs = [mc.InputGraph.complete_binary(4)] * trees + [mc.InputGraph.chain(3)]
    assert _native_and_interpreter(F, params, graphs, trees) == ("native", "native")


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_loops_panels_equal_numpy_for_every_range_layout_and_add(dtype):
    """The panel kernel as the level loop calls it (``packed_panels``): a range of panels (a
    thread's share), blocks of the target's rows and the rows past them, a last panel part
    full, w packed as stored or from its transpose, writing or adding into a wider out."""
    from minicavs.cpu import products

    kernel, width = products.panel_kernel(dtype), products.panel_width(dtype)
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 7, 13):
        for m in (5, width, 2 * width + 3):
            for transposed in (0, 1):
                k = 37
                w = rng.standard_normal((m, k) if transposed else (k, m)).astype(dtype)
                packed = products.pack_panels(w.T if transposed else w)
                x = rng.standard_normal((n, k)).astype(dtype)
                count = -(-m // width)
                for p0, p1 in ((0, count), (count // 2, count)):
                    for add in (0, 1):
                        out = rng.standard_normal((n, m + 2)).astype(dtype)
                        before = out.copy()
                        kernel(x.ctypes.data, k, packed.ctypes.data, n, m, k, out.ctypes.data,
                               m + 2, p0, p1, add)
                        want = before.copy()
                        cols = slice(p0 * width, min(p1 * width, m))
                        product = x.astype(np.float64) @ (w.T if transposed else w)
                        want[:, cols] = product[:, cols] + (before[:, cols] if add else 0)
                        np.testing.assert_allclose(
                            out, want, rtol=1e-4 if dtype == np.float32 else 1e-12,
                            atol=1e-4 if dtype == np.float32 else 1e-12,
                            err_msg=f"{n} x {k} x {m}, transposed {transposed}, panels "
                                    f"{p0}-{p1}, add {add}")


def _filled(array, value):
    if array.dtype.kind == "f":
        array.fill(value)
    return array


@needs_native
@given(forests(max_arity=2, max_vertices=15), st.integers(0, 2**16))
def test_steps_with_one_zero_input_run_their_variant_and_equal_the_interpreter(graphs, seed):
    """Tree-FC with its words embedded in the cell (-1 at internal vertices: x W is zero
    there) — ``tanh(x W + [h_l, h_r] U + b)``: on a leaf level the children's product is zero,
    elsewhere x W; the native loop runs the fused step's variant that reads 0 for it
    (codegen.VARIANTS) and does not write the leaves' zero product (no other step reads it),
    nor the eager x W its zero rows (only the loop reads it: Part.stale_rows, the rows a level
    reads cleared), nor the embedding the rows past the last word (its readers keep to its
    range): values and gradients equal the interpreter's."""
    from minicavs.runtime import native

    rng = np.random.default_rng(seed)
    table = mc.Parameter(rng.standard_normal((7, E)), name="table")
    W, U = (mc.Parameter(rng.standard_normal(shape) * 0.4, name=name)
            for name, shape in (("W", (E, H)), ("U", (2 * H, H))))
    b = mc.Parameter(rng.standard_normal(H) * 0.1, name="b")

    def cell(v):
        h = mc.tanh(mc.embedding(table, v.pull()) @ W +
                    mc.concat([v.gather(0), v.gather(1)]) @ U + b)
        v.scatter(h)
        v.push(h * h)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(H,),
                          push_shape=(H,), arity=2, dtype="float64")
    batch = mc.GraphBatch(graphs)
    ids = rng.integers(0, 7, batch.num_vertices)  # (some internal vertices have a word too:
    words = np.where((batch.num_children == 0) | (rng.random(batch.num_vertices) < 0.2), ids,
                     -1)  # x W nonzero on part of a level, whose other rows the loop clears)
    chosen = []
    variants = native._zero_variants

    def spy(codes, program, keys, zeros):
        before = codes.copy()
        variants(codes, program, keys, zeros)
        chosen.append((before, codes.copy()))
    empty = np.empty
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "_zero_variants", spy)
        # (new memory holds NaN: a row the loop reads without anyone writing it shows)
        patch.setattr(np, "empty", lambda *a, **k: _filled(empty(*a, **k), np.nan))
        backends = _native_and_interpreter(F, [table, W, U, b], graphs, seed,
                                           X=mc.tensor(words))
    assert backends[0] == "native", backends
    assert any((after >= codegen.VARIANTS).any() for _, after in chosen), chosen
    if (batch.num_children == 0).any():  # a leaf level: its product's zeros not written
        assert any(((before == 2) & (after == 0)).any() for before, after in chosen), chosen


def test_a_bad_word_id_past_the_last_good_one_is_named():
    """An id below -1 where take_rows writes only the rows up to the last good id, past that
    last one: the op's own error, from the forward call."""
    rng = np.random.default_rng(2)
    table = mc.Parameter(rng.standard_normal((2, E)), name="table")
    W = mc.Parameter(rng.standard_normal((E, E)), name="W")
    F = mc.VertexFunction(
        lambda v: v.scatter(mc.tanh(mc.embedding(table, v.pull()) @ W + v.gather(0) +
                                    v.gather(1))),
        pull_shape=(), pull_dtype="int64", scatter_shape=(E,), arity=2, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(8)] * 2)
    words = np.where(batch.num_children == 0, rng.integers(0, 2, batch.num_vertices), -1)
    words[-1] = -5  # (a root: past every leaf)
    with pytest.raises(mc.IndexRangeError, match=r"index -5 .* out of range for 2 rows"):
        F(batch, pull=mc.tensor(words))


@pytest.mark.parametrize("native", [True, False])
def test_an_embedding_the_caller_gets_is_written_whole(native):
    """A cell that pushes its embedded word (-1 at internal vertices: zero rows there) and
    the same word's product: the pushed rows the caller gets are written, zeros included, on
    new float memory filled with NaN, and the gradients are finite."""
    rng = np.random.default_rng(4)
    table = mc.Parameter(rng.standard_normal((5, E)), name="table")
    W = mc.Parameter(rng.standard_normal((E, E)), name="W")

    def cell(v):
        x = mc.embedding(table, v.pull())
        v.scatter(mc.tanh(x @ W + v.gather(0) + v.gather(1)))
        v.push(x)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(E,),
                          push_shape=(E,), arity=2, dtype="float64")
    graphs = [mc.InputGraph.complete_binary(4)] * 2
    batch = mc.GraphBatch(graphs)
    words = mc.tensor(np.where(batch.num_children == 0, rng.integers(0, 5, batch.num_vertices),
                               -1))
    empty = np.empty
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(np, "empty", lambda *a, **k: _filled(empty(*a, **k), np.nan))
        if native:
            out = F(batch, pull=words)
        else:
            with interpreter_only():
                out = F(batch, pull=words)
        (out * out).sum().backward()
    want = np.where((words.numpy() >= 0)[:, None], table.numpy()[np.maximum(words.numpy(), 0)],
                    0.0)
    np.testing.assert_array_equal(out.numpy(), want)
    assert np.isfinite(table.grad.numpy()).all() and np.isfinite(W.grad.numpy()).all()


FUSED_CASES = [(cell, dtype) for cell in ("binary_tree_lstm", "lstm_chain", "tree_fc")
               for dtype in (np.float32, np.float64)]


@needs_native
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cell, dtype", FUSED_CASES)
def test_fused_groups_as_native_loops_equal_the_numpy_plan(cell, dtype, seed):
    """cpu/fused.py runs a fused group over whole arrays as one native loop: its results equal
    the NumPy plan's (NumpyFusedKernel without the native loop), for per-row inputs that are
    whole arrays or column windows of wider ones, shared rows and values, columns; outputs
    written whole or into column windows."""
    from minicavs.runtime.executor import NumpyFusedKernel
    from minicavs.cpu import fused
    from minicavs import csource
    from test_cuda_fusion import assert_outputs_close, cell_groups, random_inputs

    rng = np.random.default_rng(seed)
    windows = rng.integers(0, 2, 12).astype(bool)  # which per-row inputs are column windows
    ran = 0
    for where, group in cell_groups(cell, dtype):
        if "unsplit" in where:
            continue  # (the runtime's own groups)
        inputs = random_inputs(group, dtype, 2048, 2048, rng)
        for k, a in enumerate(inputs):  # a column window of a wider array, same values
            if a.ndim == 2 and a.shape[1] > 1 and windows[k % len(windows)]:
                wide = np.zeros((a.shape[0], a.shape[1] + 7), a.dtype)
                wide[:, 3:3 + a.shape[1]] = a
                inputs[k] = wide[:, 3:3 + a.shape[1]]
        reference = NumpyFusedKernel(group, np, dtype)
        reference._native = None
        want = reference(*inputs)
        source = csource.elementwise_source(group, dtype)
        got = fused.run(source, inputs)
        if got is not None:
            ran += 1
            assert_outputs_close(got, want, dtype, f"{cell} {where}", chained=True)
            # written into column windows of wider arrays (a concat's columns), the columns
            # around them untouched
            wides = [np.full((w.shape[0], w.shape[1] + 5), np.nan, w.dtype) if w.ndim == 2
                     else None for w in want]
            outs = [None if wide is None else wide[:, 2:2 + w.shape[1]]
                    for w, wide in zip(want, wides)]
            into = fused.run(source, inputs, outs)
            assert into is not None
            for w, o, wide, made in zip(want, outs, wides, got):
                if wide is not None:
                    np.testing.assert_array_equal(o, made)
                    assert np.isnan(wide[:, :2]).all() and np.isnan(wide[:, 2 + w.shape[1]:]).all()
    assert ran, f"{cell}: no group ran as a native loop"


@needs_native
def test_a_fused_group_the_native_loop_cannot_read_runs_on_numpy():
    from minicavs.cpu import fused
    from minicavs import csource
    from test_cuda_fusion import cell_groups

    (where, group), *_ = cell_groups("tree_fc", np.float64)
    source = csource.elementwise_source(group, np.float64)
    rng = np.random.default_rng(0)
    strided = [rng.standard_normal((64, 2 * x.shape[-1]))[:, ::2] if len(x.shape) == 2 else
               np.asarray(rng.standard_normal(x.shape)) for x in group.inputs]
    assert fused.run(source, strided) is None  # a column stride: NumPy's plan runs it
    small = [np.ones((2, x.shape[-1])) if len(x.shape) == 2 else np.ones(x.shape)
             for x in group.inputs]
    assert fused.run(source, small) is None  # too small to be worth a native call


@needs_native
def test_the_benchmark_models_kernels_do_not_fall_back_to_numpy(monkeypatch):
    """The native kernels' wrappers return None (NumPy's form runs) where the operands' layout
    is not theirs; three did on models of the benchmark, silently (session 43's audit): the
    cross-entropy gradient for a summed loss (its gradient one number broadcast to every row),
    the embedding lookup for a column of ids (TreeRNN's [word, internal] pulls) and the LSTM
    cell for children read from slabs of two widths (the autobatched Tree-LSTM). Each call is
    counted here on small versions of those models; none may fall back."""
    from benchmarks import common
    from benchmarks.systems import minicavs_cpu
    from minicavs.cpu import kernels
    from minicavs.data import synthetic_treebank
    from minicavs.models.plain import PlainTreeLSTM

    fallbacks, calls = [], []
    for name in ("take_rows", "lstm_cell", "lstm_cell_sum", "lstm_cell_grad",
                 "softmax_cross_entropy", "softmax_cross_entropy_grad"):
        def counted(*args, _name=name, _kernel=getattr(kernels, name), **kwargs):
            done = _kernel(*args, **kwargs)
            calls.append(_name)
            if done is None:
                fallbacks.append((_name, [(getattr(a, "shape", None), getattr(a, "strides", None))
                                          for a in args]))
            return done
        monkeypatch.setattr(kernels, name, counted)
    for workload in ("tree_rnn", "tree_lstm"):  # (vertex functions, a summed loss each)
        data = common.load_workload(workload, 8)
        data["hidden"] = data["embed"] = 8
        F, params, prepare, loss_of = minicavs_cpu.build(data, common.init_params(data))
        loss_of(*prepare(data["batches"][0])).backward()
    trees, vocab = synthetic_treebank(12, seed=3)
    model = PlainTreeLSTM(len(vocab), embed=8, hidden=8)
    with mc.autobatch("agenda+"):
        mc.add_n([model.loss(t) for t in trees]).backward()
    assert {"take_rows", "lstm_cell", "lstm_cell_grad", "softmax_cross_entropy_grad"} <= set(calls)
    assert not fallbacks, fallbacks
