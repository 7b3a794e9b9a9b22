"""The fused-kernel code generator, checked without a GPU (this file runs in CI; nothing in it is
skipped there). For every fused group of the example cells' F and ∂F — binary and child-sum
Tree-LSTM, Tree-FC, LSTM chain — in float32 and float64, the generated body

* compiles with NVRTC for compute_90 (as the grid-stride RawKernel that wraps it), and
* run on the CPU through the g++ shim (inputs broadcast to the full shape on the host, the body
  in a loop over i; float32 with subnormals flushed, as CuPy builds it) equals the NumPy path,
  NumpyFusedKernel and op-by-op, on hypothesis inputs;
* the C expression of every elementwise op gives NumPy's results on NaN, infinities, signed
  zeros and subnormals (bit for bit where the operation is exactly rounded), and a product
  followed by a sum stays two roundings on the GPU (no FMA contraction).

A whole vertex function run with every fused group in generated C equals the NumPy runtime, and a
broken C expression is a KernelCompileError that shows the numbered source and the ops."""

import functools
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from minicavs.runtime import executor
from minicavs.runtime.analysis import FusedGroup, fusion_groups
from minicavs.runtime.executor import GroupStep, NumpyFusedKernel, OpByOpKernel
from minicavs.autodiff.symbolic import Symbol
from minicavs import csource
from minicavs.cuda import fusion, nvrtc
from minicavs.errors import KernelCompileError
from minicavs.ops import OPS
from minicavs.ops.registry import Op
from minicavs.vertex.batching import instantiate

from vertex_cells import binary_tree_lstm, child_sum_tree_lstm

E, H = 3, 4
DTYPES = [np.float32, np.float64]
TOLERANCE = {np.dtype(np.float32): dict(rtol=2e-5, atol=2e-6),
             np.dtype(np.float64): dict(rtol=1e-12, atol=1e-13)}


# ----------------------------------------------------------------------------- the example cells

def tree_fc(E, H, rng, dtype="float64"):
    """Tree-FC (Looks et al.; Cavs §5): h = tanh(W [h_l, h_r] + W_x x + b)."""
    W = mc.Parameter(rng.standard_normal((2 * H, H)).astype(dtype) * 0.4, name="W")
    W_x = mc.Parameter(rng.standard_normal((E, H)).astype(dtype) * 0.4, name="W_x")
    b = mc.Parameter(rng.standard_normal(H).astype(dtype) * 0.1, name="b")

    def cell(v):
        h = mc.tanh(mc.concat([v.gather(0), v.gather(1)]) @ W + v.pull() @ W_x + b)
        v.scatter(h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), arity=2, dtype=dtype)
    return F, [W, W_x, b]


def lstm_chain(E, H, rng, dtype="float64"):
    """An LSTM over a chain: gates = x W + h U + b, then lstm_gates (state [h, c])."""
    W = mc.Parameter(rng.standard_normal((E, 4 * H)).astype(dtype) * 0.4, name="W")
    U = mc.Parameter(rng.standard_normal((H, 4 * H)).astype(dtype) * 0.4, name="U")
    b = mc.Parameter(rng.standard_normal(4 * H).astype(dtype) * 0.1, name="b")

    def cell(v):
        h_prev, c_prev = mc.split(v.gather(0), 2)
        h, c = mc.lstm_gates(v.pull() @ W + h_prev @ U + b, c_prev)
        v.scatter(mc.concat([h, c]))
        v.push(h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(2 * H,), push_shape=(H,),
                          arity=1, dtype=dtype)
    return F, [W, U, b]


CELLS = {"binary_tree_lstm": binary_tree_lstm, "child_sum_tree_lstm": child_sum_tree_lstm,
         "tree_fc": tree_fc, "lstm_chain": lstm_chain}


@functools.lru_cache(maxsize=None)
def cell_groups(cell, dtype):
    """Every fused group the runtime runs for the cell's F and ∂F (its GroupSteps), then the
    groups ``fusion_groups`` finds in the whole F and ∂F graphs with no class split and
    ``min_size=1`` (larger groups, and lone ops: what a GPU plan might fuse), one per signature.
    Returns ``[(where, group)]``."""
    F, _ = CELLS[cell](E, H, np.random.default_rng(0), dtype=np.dtype(dtype).name)
    found, seen = [], set()

    def add(where, group):
        if group.signature() not in seen:
            seen.add(group.signature())
            found.append((where, group))

    for which, program in (("F", F.program), ("dF", F.backward_program)):
        for phase in ("eager", "core", "lazy"):
            for ins in getattr(program, phase):
                if isinstance(getattr(ins, "step", None), GroupStep):
                    add(f"{which} {phase}", ins.step.group)
    runtime_groups = len(found)
    for which, graph in (("F", F.graph), ("dF", F.backward_graph)):
        for group in fusion_groups(graph, min_size=1):
            add(f"{which} unsplit", group)
    assert runtime_groups >= 2, f"{cell}: the runtime fuses nothing?"
    return found


def sources_of(cell, dtype):
    return [csource.elementwise_source(g, dtype) for _, g in cell_groups(cell, dtype)]


CASES = [(cell, dtype) for cell in CELLS for dtype in DTYPES]
CASE_IDS = [f"{cell}-{np.dtype(dtype).name}" for cell, dtype in CASES]


# ----------------------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("cell, dtype", CASES, ids=CASE_IDS)
def test_every_fused_kernel_compiles_with_nvrtc_for_compute_90(cell, dtype):
    for source in sources_of(cell, dtype):
        ptx = fusion.compile_ptx(source, arch="compute_90")
        assert ".target sm_90" in ptx
        assert nvrtc.ptx_entries(ptx) == [source.name]
        if np.dtype(dtype) == np.float32:  # no silent promotion to double anywhere
            assert ".f64" not in ptx, f"{source.describe()} computes in double"


def cupy_kernel_code(source, input_ndims):
    """The CUDA source CuPy itself generates for ``cupy.ElementwiseKernel`` of ``source`` on
    inputs of the given ranks (32-bit indexing; CuPy broadcasts every input to the output's
    rank first, so a lower-rank input is a non-contiguous view), with the headers CuPy prepends,
    and CuPy's NVRTC options (its header folders and the CUDA toolkit's, minicavs' options,
    then -ftz=true). It is made by CuPy's *private* code generator
    (``cupy._core._kernel._get_elementwise_kernel_code``, CuPy >= 13), which needs no GPU; if a
    CuPy release changes that, this helper (not the library) needs updating."""
    import cupy
    from cupy._core import _carray, _kernel, core

    ndim = max(input_ndims, default=0)
    params = (_kernel._get_param_info(source.in_params, True)
              + _kernel._get_param_info(source.out_params, False)
              + _kernel._get_param_info("CIndexer _ind", False))
    ndarray, indexer = 1, 2  # _ArgKind: ARG_KIND_NDARRAY = 1, ARG_KIND_INDEXER = 2
    arginfos = tuple(
        _kernel._ArgInfo(ndarray, cupy.ndarray, np.dtype(d).type, ndim, nd == ndim, True)
        for (d, _, _), nd in zip(source.inputs + source.outputs,
                                 list(input_ndims) + [ndim] * len(source.outputs)))
    arginfos += (_kernel._ArgInfo(indexer, _carray.Indexer, None, ndim, True, True),)
    type_map = _kernel._TypeMap((("T", np.dtype(source.dtype).type),))
    code = _kernel._get_elementwise_kernel_code(arginfos, type_map, params, source.operation,
                                                source.name, source.preamble)
    header = "".join(f"#include <{h}>\n" for h in core._cupy_header_list)
    return header + code, nvrtc.cupy_compile_options()


@pytest.mark.parametrize("cell, dtype", CASES, ids=CASE_IDS)
def test_the_code_cupy_generates_for_every_fused_kernel_compiles_with_nvrtc(cell, dtype):
    for where, group in cell_groups(cell, dtype):
        source = csource.elementwise_source(group, dtype)
        code, options = cupy_kernel_code(source, [len(x.shape) for x in group.inputs])
        assert f'extern "C" __global__ void {source.name}(' in code
        try:
            ptx = nvrtc.compile_to_ptx(code, source.name, arch="compute_90", options=options)
        except KernelCompileError as exc:
            raise AssertionError(f"{cell} {where}: {source.describe()}\n{exc}") from None
        assert nvrtc.ptx_entries(ptx) == [source.name]


# ----------------------------------------------------------------------------- shim vs NumPy

def _elements(dtype, low=-3.0, high=3.0):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return st.booleans()
    if dtype.kind in "iu":
        return st.integers(-3 if dtype.kind == "i" else 0, 3)
    # No subnormal inputs: the float32 kernels flush them, as on the GPU, and NumPy does not,
    # so a comparison of a subnormal with zero may rightly differ (FTZ is tested on its own).
    return st.floats(low, high, width=8 * dtype.itemsize, allow_subnormal=False)


def draw_inputs(data, group, dtype, n, e, domains=None):
    """Arrays for ``group.inputs`` for a task of n vertices and e edges: constants keep their
    value (in ``dtype``), float inputs of the traced dtype become ``dtype``."""
    traced = csource.compute_dtype(group)
    arrays = []
    for k, x in enumerate(group.inputs):
        run_dtype = np.dtype(dtype) if x.dtype == traced else x.dtype
        if x.kind == "const":
            arrays.append(np.asarray(x.value).astype(run_dtype))
            continue
        shape = instantiate(tuple(x.shape), n, e)
        low, high = (domains or {}).get(k, (-3.0, 3.0))
        arrays.append(data.draw(hnp.arrays(run_dtype, shape,
                                           elements=_elements(run_dtype, low, high))))
    return arrays


def random_inputs(group, dtype, n, e, rng):
    """Like :func:`draw_inputs`, from a NumPy generator (for large tasks)."""
    traced = csource.compute_dtype(group)
    arrays = []
    for x in group.inputs:
        run_dtype = np.dtype(dtype) if x.dtype == traced else x.dtype
        if x.kind == "const":
            arrays.append(np.asarray(x.value).astype(run_dtype))
        else:
            shape = instantiate(tuple(x.shape), n, e)
            arrays.append((rng.uniform(-3, 3, shape) if run_dtype.kind == "f" else
                           rng.integers(0, 2, shape)).astype(run_dtype))
    return arrays


def assert_outputs_close(got, want, dtype, what, chained=False):
    """Equal (integers, masks) or close. ``chained``: the outputs of a long chain of ops, where
    a few ulps per op add up and a cancellation late in the chain leaves them as an absolute
    error of the size of the values cancelled: the absolute tolerance then scales with the
    largest value of the output (hypothesis found -0.069670 against -0.069674 in float32, the
    other entries 3.25: 3.8e-6 off, 1.2e-6 of the scale)."""
    assert len(got) == len(want), what
    tolerance = TOLERANCE[np.dtype(dtype)]
    for p, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: output {p}"
        if a.dtype == np.bool_ or a.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: output {p}")
            continue
        atol = tolerance["atol"]
        if chained and b.size:
            finite = np.abs(b[np.isfinite(b)])
            atol *= max(1.0, float(finite.max())) if finite.size else 1.0
        np.testing.assert_allclose(a, b, rtol=tolerance["rtol"], atol=atol,
                                   err_msg=f"{what}: output {p}")


@pytest.mark.parametrize("cell, dtype", CASES, ids=CASE_IDS)
@given(data=st.data())
def test_fused_kernels_in_the_shim_equal_numpy(cell, dtype, data):
    groups = cell_groups(cell, dtype)
    fusion.build_shim_kernels(sources_of(cell, dtype))  # one g++ run for all of them
    n, e = data.draw(st.integers(0, 6), label="vertices"), data.draw(st.integers(0, 7),
                                                                     label="edges")
    for where, group in groups:
        inputs = draw_inputs(data, group, dtype, n, e)
        shim = fusion.ShimFusedKernel(group, np, dtype)
        got = shim(*inputs)
        what = f"{cell} {where} {shim!r}"
        assert_outputs_close(got, NumpyFusedKernel(group, np, dtype)(*inputs), dtype, what)
        assert_outputs_close(got, OpByOpKernel(group, np, dtype)(*inputs), dtype, what)


@pytest.mark.parametrize("cell, dtype", CASES, ids=CASE_IDS)
def test_fused_kernels_in_the_shim_walk_the_grid_stride_loop(cell, dtype, monkeypatch):
    # 40 vertices x 20 columns: more elements than the 2 x 256 threads launched.
    monkeypatch.setattr(fusion, "MAX_BLOCKS", 2)
    fusion.build_shim_kernels(sources_of(cell, dtype))
    rng = np.random.default_rng(0)
    for where, group in cell_groups(cell, dtype):
        inputs = random_inputs(group, dtype, 40, 50, rng)
        got = fusion.ShimFusedKernel(group, np, dtype)(*inputs)
        assert_outputs_close(got, NumpyFusedKernel(group, np, dtype)(*inputs), dtype,
                             f"{cell} {where}")


def _all_elementwise_ops_graph(dtype):
    """A traced function that uses every elementwise primitive once (and a broadcast bias)."""
    def fn(x, y, b):
        pos = mc.exp(x * 0.5)  # > 0: the domain of log and of the fractional power
        t = mc.log(pos) / (mc.sigmoid(y) + 0.5) - mc.neg(mc.tanh(y))
        t = t + pos ** 0.5 + mc.relu(x) * mc.maximum(x, y) + b
        mask = mc.greater(x, y)
        t = mc.where(mask, t, mc.astype(mc.greater_equal(y, 0.25), x.dtype) - t)
        t = t * mc.astype(mc.equal(mc.astype(mask, np.int32), 1), x.dtype) + t ** 2
        t = t + mc.minimum(x, y) + pos ** y + mc.expm1(y) * mc.log1p(pos) + mc.erf(x)
        t = t + mc.sin(x) * mc.cos(y) + mc.floor(x) - mc.ceil(y) + mc.rint(x * 3.0)
        # (divisors of the inputs themselves: a step of % or // is no ulp away from them)
        t = t + mc.trunc(x * 3.0) + mc.copysign(y, x) + mc.fmod(x, y) + y % x + x // y
        i, j = _small_ints(x * 4.0), _small_ints(y * 4.0)  # (ints from floats: see below)
        bits = ((i & j) | (i ^ 3)) + (~i) + (i << 2) + (j >> 1) + i % (j | 1) + i // (j | 1)
        return t + mc.astype(bits + mc.fmod(i, j | 1), x.dtype)

    return mc.trace(fn, ((5, 3), dtype), ((5, 3), dtype), ((3,), dtype))


def _small_ints(x):
    """``x`` as int32, with NaN, infinities and values beyond ±100 (whose conversion C leaves
    undefined) as 0."""
    return mc.astype(mc.where(mc.less(mc.abs(x), 100.0), x, 0.0), np.int32)


def _on_ints(fn, nonzero=False):
    """A special-value case of an integer op: the float inputs as small ints (``nonzero``: a
    zero divisor as 7, where eager code raises), the result back as floats."""
    def case(a, b):
        i, j = _small_ints(a), _small_ints(b)
        if nonzero:
            j = mc.where(mc.equal(j, 0), 7, j)
        return mc.astype(fn(i, j), a.dtype)
    return case


def test_the_generator_covers_every_elementwise_primitive():
    graph = _all_elementwise_ops_graph(np.float64)
    used = {n.op.name for n in graph.op_nodes()}
    with_c = {name for name, op in OPS.items() if op.c_expr is not None}
    assert with_c <= used, f"add these ops to _all_elementwise_ops_graph: {with_c - used}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@given(data=st.data())
def test_every_c_expression_in_the_shim_equals_numpy(dtype, data):
    graph = _all_elementwise_ops_graph(dtype)
    (group,) = [g for g in fusion_groups(graph, min_size=1) if len(g) > 5]
    source = csource.elementwise_source(group, dtype)
    assert nvrtc.ptx_entries(fusion.compile_ptx(source)) == [source.name]
    assert "const bool t" in source.operation and "int32 x" in source.in_params  # masks and
    assert "const int t" in source.operation  # integer casts keep their own types
    code, options = cupy_kernel_code(source, [len(x.shape) for x in group.inputs])
    assert nvrtc.ptx_entries(nvrtc.compile_to_ptx(code, source.name, options=options)) \
        == [source.name]
    inputs = draw_inputs(data, group, dtype, 5, 0)
    got = fusion.ShimFusedKernel(group, np, dtype)(*inputs)
    assert_outputs_close(got, NumpyFusedKernel(group, np, dtype)(*inputs), dtype, "all ops",
                         chained=True)
    assert_outputs_close(got, OpByOpKernel(group, np, dtype)(*inputs), dtype, "all ops",
                         chained=True)


# ----------------------------------------------------------------------------- NaN, zeros, infinities

def _special_values(dtype):
    finfo = np.finfo(dtype)
    return np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0,
                     finfo.max, -finfo.tiny / 4, finfo.tiny / 2, 1e-3], dtype)


def _grid(values, arity):
    """Every combination of ``arity`` values, as ``arity`` flat arrays."""
    return [g.reshape(-1) for g in np.meshgrid(*[values] * arity, indexing="ij")]


# One case per elementwise op: (inputs' dtypes, fn on symbols, exactly rounded?). Exactly rounded
# ops must give NumPy's bits; the math functions (C's and NumPy's own) agree to a few ulp.
ONE_OP_CASES = {
    "add": (2, lambda a, b: a + b, True), "sub": (2, lambda a, b: a - b, True),
    "mul": (2, lambda a, b: a * b, True), "div": (2, lambda a, b: a / b, True),
    "neg": (1, mc.neg, True), "relu": (1, mc.relu, True), "maximum": (2, mc.maximum, True),
    "greater": (2, mc.greater, True), "greater_equal": (2, mc.greater_equal, True),
    "equal": (2, mc.equal, True),
    "pow": (1, lambda a: mc.concat([a ** 0.5, a ** 2.0, a ** -1.0, a ** 0.0]), False),
    "exp": (1, mc.exp, False), "log": (1, mc.log, False), "tanh": (1, mc.tanh, False),
    "sigmoid": (1, mc.sigmoid, False),
    "astype": (1, lambda a: mc.concat([  # float -> the other float -> back; float -> bool
        mc.astype(mc.astype(a, np.float32 if a.dtype == np.float64 else np.float64), a.dtype),
        mc.astype(mc.astype(a, np.bool_), a.dtype)]), True),
    "where": (2, lambda a, b: mc.where(mc.greater(a, b), a, b), True),
    "minimum": (2, mc.minimum, True), "floor": (1, mc.floor, True), "ceil": (1, mc.ceil, True),
    "rint": (1, mc.rint, True), "power": (2, lambda a, b: a ** b, False),
    "sin": (1, mc.sin, False), "cos": (1, mc.cos, False), "erf": (1, mc.erf, False),
    "expm1": (1, mc.expm1, False), "log1p": (1, mc.log1p, False),
    # one C body computes the division ops for floats (NumPy's npy_divmod) and for integers
    "trunc": (1, mc.trunc, True), "copysign": (2, mc.copysign, True),
    "fmod": (2, lambda a, b: mc.concat([mc.fmod(a, b), _on_ints(mc.fmod, True)(a, b)]), True),
    "remainder": (2, lambda a, b: mc.concat([a % b, _on_ints(mc.remainder, True)(a, b),
                                             _on_ints(lambda i, j: i % -1)(a, b)]), True),
    "floor_divide": (2, lambda a, b: mc.concat([a // b, _on_ints(mc.floor_divide, True)(a, b),
                                                _on_ints(lambda i, j: i // -1)(a, b)]), True),
    "bitwise_and": (2, _on_ints(mc.bitwise_and), True),
    "bitwise_or": (2, _on_ints(mc.bitwise_or), True),
    "bitwise_xor": (2, _on_ints(mc.bitwise_xor), True),
    "bitwise_not": (1, lambda a: _on_ints(lambda i, j: ~i)(a, a), True),
    # shifts by negative amounts and by the width or more (3 * 11 = 33) too
    "left_shift": (2, lambda a, b: mc.concat([_on_ints(lambda i, j: i << j)(a, b),
                                              _on_ints(lambda i, j: i << j * 11)(a, b)]), True),
    "right_shift": (2, lambda a, b: mc.concat([_on_ints(lambda i, j: i >> j)(a, b),
                                               _on_ints(lambda i, j: i >> j * 11)(a, b)]), True),
}


def test_the_special_value_cases_cover_every_elementwise_primitive():
    with_c = {name for name, op in OPS.items() if op.c_expr is not None}
    assert with_c <= set(ONE_OP_CASES), f"add cases for: {with_c - set(ONE_OP_CASES)}"


def _assert_same_results(got, want, exact, what):
    """NaN where NumPy has NaN; elsewhere the same bits (``exact``), or the same infinities and
    signs and values within a few ulp."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaNs")
    got, want = got[~np.isnan(want)], want[~np.isnan(want)]
    if exact:
        uint = f"u{got.itemsize}"
        bad = np.flatnonzero(got.view(uint) != want.view(uint))
        assert bad.size == 0, f"{what}: got {got[bad[:6]]}, NumPy {want[bad[:6]]}"
        return
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{what}: infinities")
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"{what}: signs")
    finfo = np.finfo(got.dtype)
    np.testing.assert_allclose(got, want, rtol=8 * finfo.eps, atol=finfo.tiny, err_msg=what)


@functools.lru_cache(maxsize=None)
def _one_op_groups(name, dtype):
    arity, fn, _ = ONE_OP_CASES[name]
    inputs = _grid(_special_values(dtype), arity)
    graph = mc.trace(fn, *[((len(inputs[0]),), np.dtype(dtype).name)] * arity)
    return inputs, graph, fusion_groups(graph, min_size=1)


@functools.lru_cache(maxsize=None)
def _build_one_op_kernels(dtype):
    """Every case's kernels in one g++ run per dtype (one run per case would cost seconds)."""
    fusion.build_shim_kernels([csource.elementwise_source(g, dtype) for name in ONE_OP_CASES
                               for g in _one_op_groups(name, dtype)[2]])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(ONE_OP_CASES))
def test_c_expressions_give_numpys_nans_zeros_and_infinities(name, dtype):
    _, _, exact = ONE_OP_CASES[name]
    _build_one_op_kernels(dtype)
    inputs, graph, groups = _one_op_groups(name, dtype)
    bound = {id(x): a for x, a in zip(graph.inputs, inputs)}
    assert any(m.op.name == name for g in groups for m in g.members), name
    for group in groups:
        args = [bound[id(x)] if id(x) in bound else np.asarray(x.value) for x in group.inputs]
        kernel = fusion.ShimFusedKernel(group, np, dtype, ftz=False)  # IEEE, as NumPy
        assert kernel.source is not None, f"{name}: no generated kernel"
        with np.errstate(all="ignore"):
            got = kernel(*args)
            want = OpByOpKernel(group, np, dtype)(*args)  # each op's NumPy forward
        for p, (g, w) in enumerate(zip(got, want)):
            _assert_same_results(g, w, exact, f"{name} ({np.dtype(dtype).name}) output {p}")


def test_a_product_and_a_sum_stay_two_roundings_on_the_gpu():
    graph = mc.trace(lambda a, b, c: a * b + c, *[((4,), "float32")] * 3)
    (group,) = fusion_groups(graph, min_size=1)
    source = csource.elementwise_source(group, np.float32)
    ptx = fusion.compile_ptx(source)  # minicavs' options: --fmad=false, then CuPy's -ftz=true
    assert "fma" not in ptx and "mul.rn.ftz.f32" in ptx and "add.rn.ftz.f32" in ptx
    assert "fma.rn" in nvrtc.compile_to_ptx(fusion.raw_source(source), source.name)  # NVRTC's default


# ----------------------------------------------------------------------------- the generated text

def test_generated_kernel_is_named_typed_and_shared_by_equal_signatures():
    groups = cell_groups("binary_tree_lstm", np.float32)
    (_, cell_group), = [(w, g) for w, g in groups if w == "F core" and len(g) == 12]
    f32 = csource.elementwise_source(cell_group, np.float32)
    f64 = csource.elementwise_source(cell_group, np.float64)
    assert re.fullmatch(r"minicavs_fused_[0-9a-f]{12}", f32.name)
    assert f32.name != f64.name and f32.operation == f64.operation  # the body is written in T
    assert f32.in_params == ", ".join(f"T x{k}" for k in range(7))
    assert f32.out_params == ", ".join(f"T y{p}" for p in range(len(cell_group.outputs)))
    assert f32.ops == tuple(m.op.name for m in cell_group.members)
    lines = f32.operation.splitlines()
    assert lines[0] == "const T t0 = (1 / (1 + exp(-x0)));  // sigmoid"
    assert len(lines) == len(cell_group) + len(cell_group.outputs)  # one statement per member
    assert csource.elementwise_source(cell_group, "float32") is f32  # cached
    # Two groups with one signature (the same chain on either side of a matmul): one kernel.
    W = mc.tensor(np.ones((3, 3), np.float32))
    graph = mc.trace(lambda a: mc.tanh((mc.tanh(a) * 2.0) @ W) * 2.0, ((4, 3), "float32"))
    groups = fusion_groups(graph)
    names = {csource.elementwise_source(g, np.float32).name for g in groups}
    assert len(groups) == 2 and len(names) == 1


def test_non_float_members_keep_their_c_types():
    def fn(x, y):
        return mc.where(mc.greater(x, y), x, y * 2)

    graph = mc.trace(fn, ((4,), "float64"), ((4,), "float64"))
    (group,) = fusion_groups(graph, min_size=1)
    source = csource.elementwise_source(group, np.float64)
    assert "const bool t0 = (x0 > x1);  // greater" in source.operation.splitlines()


def test_outs_are_written_and_returned_even_when_strided():
    (_, group), = [(w, g) for w, g in cell_groups("tree_fc", np.float64) if w == "F core"]
    kernel = fusion.ShimFusedKernel(group, np, np.float64)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(instantiate(tuple(x.shape), 5, 0)) for x in group.inputs]
    want = NumpyFusedKernel(group, np, np.float64)(*inputs)
    outs = [np.full((o.shape[1], 5), np.nan).T for o in group.outputs]  # not C-contiguous
    got = kernel(*inputs, outs=outs)
    assert all(g is o for g, o in zip(got, outs))
    assert_outputs_close(got, want, np.float64, "strided outs")


def test_a_group_whose_outputs_differ_in_shape_runs_op_by_op():
    # Outputs exp(b) + 1, (3,), and x * exp(b), (5, 3): not one elementwise launch.
    def fn(x, b):
        e = mc.exp(b)
        return x * e, e + 1

    graph = mc.trace(fn, ((5, 3), "float64"), ((3,), "float64"))
    (group,) = fusion_groups(graph, min_size=1)
    assert sorted(o.shape for o in group.outputs) == [(3,), (5, 3)]
    kernel = fusion.ShimFusedKernel(group, np, np.float64)
    bound = {id(graph.inputs[0]): np.random.default_rng(0).standard_normal((5, 3)),
             id(graph.inputs[1]): np.arange(3.0)}
    inputs = [bound[id(x)] if id(x) in bound else np.asarray(x.value) for x in group.inputs]
    got = kernel(*inputs)
    assert not any(plan.fused for plan in kernel._plans.values())
    assert_outputs_close(got, OpByOpKernel(group, np, np.float64)(*inputs), np.float64, "mixed")


# ----------------------------------------------------------------------------- compile errors

BROKEN = Op("broken_op", forward=lambda xp, x: x, infer=lambda x: x,
            c_expr="minicavs_no_such_function({0})")


def _broken_group():
    x = Symbol("input", (4,), np.float32, name="x")
    t = Symbol("op", (4,), np.float32, op=OPS["tanh"], inputs=[x])
    y = Symbol("op", (4,), np.float32, op=BROKEN, inputs=[t])
    return FusedGroup([t, y], [x], [y])


def test_a_broken_c_expression_is_a_compile_error_with_numbered_source_and_ops():
    source = csource.elementwise_source(_broken_group(), np.float32)
    with pytest.raises(KernelCompileError) as info:
        fusion.compile_ptx(source)
    message = str(info.value)
    assert f"fused kernel '{source.name}' (float32; ops: tanh broken_op)" in message
    assert "minicavs_no_such_function" in info.value.log
    assert re.search(r"\n *\d+ \| +const T t1 = minicavs_no_such_function\(t0\);  // broken_op",
                     message), message
    assert info.value.source == fusion.raw_source(source)
    # The g++ shim reports the same way (its log points at line 9, shown numbered).
    shim_report = r"(?s)ops: tanh broken_op.*g\+\+ shim.*cu:9:.*\n 9 \| "
    with pytest.raises(KernelCompileError, match=shim_report):
        fusion.ShimFusedKernel(_broken_group(), np, np.float32)(np.ones(4, np.float32))


def test_a_c_expression_missing_an_attribute_is_a_compile_error():
    op = Op("needs_attr", forward=None, infer=None, c_expr="({0} * {scale!r})")
    x = Symbol("input", (4,), np.float64)
    y = Symbol("op", (4,), np.float64, op=op, inputs=[x])
    with pytest.raises(KernelCompileError, match="'needs_attr' needs 'scale'"):
        csource.elementwise_source(FusedGroup([y], [x], [y]), np.float64)


# ----------------------------------------------------------------------------- end to end

@pytest.fixture
def generated_kernels_on_the_cpu():
    """The executor builds NumPy fused kernels from the generated C (run by the shim)."""
    executor.register_kernel_factory("numpy", fusion.ShimFusedKernel)
    yield
    executor.register_kernel_factory("numpy", NumpyFusedKernel)


def _run(F, params, batch, X, weights):
    out = F(batch, pull=X)
    ((out * mc.tensor(weights)).sum() + (out * out).sum()).backward()
    result = [out.numpy()] + [t.grad.numpy() for t in [X] + params]
    for t in [X] + params:
        t.grad = None
    return result


@pytest.mark.parametrize("cell", ["binary_tree_lstm", "child_sum_tree_lstm", "lstm_chain"])
def test_vertex_function_with_generated_kernels_equals_numpy_runtime(cell, request):
    graphs = [mc.InputGraph.complete_binary(4), mc.InputGraph([[], [0], [0, 1], [2, 1]])]
    if cell == "lstm_chain":
        graphs = [mc.InputGraph.chain(5), mc.InputGraph.chain(2)]
    batch = mc.GraphBatch(graphs)
    rng = np.random.default_rng(7)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    F, params = CELLS[cell](E, H, np.random.default_rng(3))
    weights = rng.standard_normal((batch.num_vertices,) + (F.push_shape or F.scatter_shape))
    want = _run(F, params, batch, X, weights)
    request.getfixturevalue("generated_kernels_on_the_cpu")
    F2, params2 = CELLS[cell](E, H, np.random.default_rng(3))  # fresh steps and kernels
    got = _run(F2, params2, batch, X, weights)
    kernels = [ins.step.kernel(np, np.dtype(np.float64))
               for p in (F2.program, F2.backward_program)
               for ins in p.eager + p.core + p.lazy
               if isinstance(getattr(ins, "step", None), GroupStep)]
    assert kernels and all(isinstance(k, fusion.ShimFusedKernel) for k in kernels)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


# ----------------------------------------------------------------------------- registration

def test_cupy_factory_is_registered_on_first_use_without_importing_cupy():
    code = """
import sys, types
import numpy as np
import minicavs as mc
from minicavs.runtime import executor
from minicavs.runtime.analysis import fusion_groups
assert "cupy" not in sys.modules and "minicavs.cuda.fusion" not in sys.modules
graph = mc.trace(lambda x: mc.tanh(x) * 2 + 1, ((4,), "float32"))
(group,) = fusion_groups(graph)
fake_cupy = types.SimpleNamespace(__name__="cupy")  # only the name matters to the factory
kernel = executor.make_fused_kernel(group, fake_cupy, np.float32)
assert type(kernel).__name__ == "CupyFusedKernel", kernel
assert kernel.source.name.startswith("minicavs_fused_")
assert "cupy" not in sys.modules  # built lazily: nothing compiled, nothing imported
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
