"""The CUDA row kernels, checked without a GPU: every source compiles with NVRTC, with the options
CuPy compiles it with, for every architecture from sm_50 to Hopper; and every kernel, run on the
CPU through the g++ shim with float32 subnormals flushed as CuPy's ``-ftz=true`` makes the GPU
do, equals its NumPy twin bit for bit (the atomic scatter-add: within its rounding bound, or bit
for bit against the flushed sum). NVRTC and g++ are part of the test environment (the ``[test]``
extra), so nothing here is skipped for want of them; only the ``gpu`` tests at the end need a
device."""

import inspect
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from minicavs.cuda import kernels, nvrtc, shim
from minicavs.errors import DTypeError, IndexRangeError, KernelCompileError, ShapeError

FLOAT_DTYPES = [np.float32, np.float64]
ROW_SHAPES = [(), (1,), (3,), (2, 3), (0,), (5, 1, 2)]


def assert_bits_equal(got, want):
    """Same shape, dtype and bits (NaN payloads and the sign of zero included)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    uint = np.dtype(f"u{got.dtype.itemsize}")
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(uint),
                                  np.ascontiguousarray(want).view(uint))


# ----------------------------------------------------------------------------- strategies

TINY32 = float(np.finfo(np.float32).tiny)  # the smallest normal float32; below it, subnormals


@st.composite
def row_arrays(draw, num_rows=None, dtype=None, finite=False, row_shape=None):
    dtype = np.dtype(dtype or draw(st.sampled_from(FLOAT_DTYPES)))
    num_rows = draw(st.integers(0, 9)) if num_rows is None else num_rows
    row_shape = draw(st.sampled_from(ROW_SHAPES)) if row_shape is None else row_shape
    width = 8 * dtype.itemsize
    if finite:  # sums of bounded values: no overflow, no NaN payload questions; values near
        # float32's subnormal range often, where flushing to zero would show
        elements = st.one_of(st.floats(-1e3, 1e3, width=width),
                             st.floats(-4 * TINY32, 4 * TINY32, width=width))
    else:
        elements = st.floats(width=width, allow_nan=True, allow_infinity=True)
    return draw(hnp.arrays(dtype, (num_rows,) + row_shape, elements=elements))


@st.composite
def indices(draw, num_rows, length=None, shape=None, allow_missing=True):
    """int32 indices into ``num_rows`` rows, -1 ("no row") included, repeats likely."""
    shape = shape or ((draw(st.integers(0, 14)) if length is None else length),)
    low = -1 if allow_missing else 0
    if num_rows == 0:
        low = -1
    return draw(hnp.arrays(np.int32, shape, elements=st.integers(low, max(num_rows - 1, low))))


@st.composite
def gather_cases(draw):
    src = draw(row_arrays())
    return src, draw(indices(src.shape[0]))


@st.composite
def scatter_cases(draw, unique=False, finite=True):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    row_shape = draw(st.sampled_from(ROW_SHAPES))
    num_rows = draw(st.integers(0, 8))
    if unique:
        n = draw(st.integers(0, num_rows))
        perm = np.array(draw(st.permutations(range(num_rows))), dtype=np.int32)[:n]
        missing = draw(hnp.arrays(np.bool_, (n,)))
        idx = np.where(missing, -1, perm).astype(np.int32) if n else perm
    else:
        idx = draw(indices(num_rows))
    values = draw(row_arrays(num_rows=idx.shape[0], dtype=dtype, finite=finite,
                             row_shape=row_shape))
    out = draw(row_arrays(num_rows=num_rows, dtype=dtype, finite=finite, row_shape=row_shape))
    return values, idx, out


# ----------------------------------------------------------------------------- NVRTC

def test_nvrtc_is_available_and_targets_hopper():
    # Not a skip: the [test] extra installs NVRTC, and these tests exist to run it in CI.
    assert nvrtc.nvrtc_version() >= (12, 0)
    assert 90 in nvrtc.supported_archs()


AS_CUPY = nvrtc.KERNEL_OPTIONS + nvrtc.CUPY_APPENDED_OPTIONS  # -ftz=true last, as CuPy has it
ARCHS = ["compute_50", "compute_60", "compute_90"]  # NVRTC 12's oldest, the first with native
# double atomics, Hopper


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", kernels.all_kernel_sources(), ids=lambda s: s.name)
def test_every_kernel_compiles_with_cupys_options_for_every_arch(source, arch):
    ptx = nvrtc.compile_to_ptx(source.code, source.name, arch=arch, options=AS_CUPY)
    assert f".target sm_{arch.split('_')[1]}" in ptx
    assert nvrtc.ptx_entries(ptx) == [source.name]  # extern "C": the name is not mangled
    assert source.name.startswith("minicavs_")


def test_atomic_scatter_uses_native_atomics_where_the_arch_has_them():
    for dtype, suffix in ((np.float32, "f32"), (np.float64, "f64")):
        source = kernels.kernel_source("scatter_add_rows", dtype)
        assert f"atom.global.add.{suffix}" in nvrtc.compile_to_ptx(source.code, source.name,
                                                                    options=AS_CUPY)
    # Below sm_60 a double add is a compare-and-swap loop on the 64-bit pattern.
    source = kernels.kernel_source("scatter_add_rows", np.float64)
    old = nvrtc.compile_to_ptx(source.code, source.name, arch="compute_50", options=AS_CUPY)
    assert "atom.global.cas.b64" in old and "atom.global.add.f64" not in old


@pytest.mark.parametrize("reduce, plain", [
    ("add", ("minicavs_add_noftz(acc, v)", "acc + v")),
    ("multiply", ("minicavs_mul_noftz(acc, v)", "acc * v")),
    ("maximum", ("minicavs_greater(acc, v)", "acc > v")),
    ("minimum", ("minicavs_greater(v, acc)", "v > acc"))])
def test_scatter_folds_keep_subnormals_under_cupys_ftz(reduce, plain):
    # No float32 instruction of the fold flushes (CuPy appends -ftz=true, which turns a plain
    # "+" into add.ftz.f32: the sum is add.rn.f32, a product mul.rn.f32, an order is decided on
    # the bits); the same fold written plainly does, so the check can fail.
    source = kernels.kernel_source(f"scatter_{reduce}_sorted", np.float32)
    flushing = re.compile(r"\b\w+(?:\.\w+)*\.ftz(?:\.\w+)*\b")
    assert not flushing.findall(nvrtc.compile_to_ptx(source.code, source.name, options=AS_CUPY))
    written_plainly = source.code.replace(*plain)
    assert written_plainly != source.code
    assert flushing.findall(nvrtc.compile_to_ptx(written_plainly, source.name, options=AS_CUPY))


def test_the_installed_cupy_appends_what_nvrtc_py_says():
    from cupy.cuda import compiler

    appended = inspect.getsource(compiler._compile_with_cache_cuda)
    assert "options += ('-ftz=true',)" in appended  # after the kernel's own options: it wins
    assert "'--device-as-default-execution-space'" in inspect.getsource(
        compiler._compile_using_nvrtc_no_warning)
    assert nvrtc.CUPY_APPENDED_OPTIONS == ("-ftz=true", "--device-as-default-execution-space")


def test_cupy_compile_options_are_cupys_with_the_cuda_headers():
    options = nvrtc.cupy_compile_options()
    assert options[-len(nvrtc.CUPY_APPENDED_OPTIONS):] == nvrtc.CUPY_APPENDED_OPTIONS
    assert options.index("--fmad=false") < options.index("-ftz=true")
    folder = nvrtc.cuda_header_dir(options)
    assert folder is not None, f"no CUDA headers among CuPy's options {options}"
    assert nvrtc.cuda_headers_version(folder) >= (12, 0)
    source = kernels.kernel_source("scatter_add_sorted", np.float32)
    assert nvrtc.ptx_entries(nvrtc.compile_to_ptx(source.code, source.name, options=options)) \
        == [source.name]


def test_cuda_headers_version_is_read_from_cudart_version(tmp_path):
    (tmp_path / "cuda_runtime_api.h").write_text("#pragma once\n#define CUDART_VERSION  12090\n")
    assert nvrtc.cuda_header_dir(("--std=c++17", f"-I{tmp_path}")) == str(tmp_path)
    assert nvrtc.cuda_headers_version(str(tmp_path)) == (12, 9)
    assert nvrtc.cuda_header_dir(("-I/no/such/folder",)) is None
    assert nvrtc.cuda_headers_version("/no/such/folder") is None


def test_nvrtc_error_carries_log_and_numbered_source():
    source = 'extern "C" __global__ void minicavs_broken(float* x)\n{\n    x[0] = y;\n}\n'
    with pytest.raises(KernelCompileError) as info:
        nvrtc.compile_to_ptx(source, "minicavs_broken")
    message = str(info.value)
    assert '"y" is undefined' in info.value.log and '"y" is undefined' in message
    assert "3 |     x[0] = y;" in message  # the source, with line numbers


def test_kernel_factories_are_memoised_and_named_by_dtype():
    a = kernels.kernel_source("gather_rows", np.float32)
    assert a is kernels.kernel_source("gather_rows", np.dtype("float32"))
    assert a.name == "minicavs_gather_rows_f32"
    assert "double" in kernels.kernel_source("gather_rows", np.float64).code
    assert "__syncthreads" not in "".join(s.code for s in kernels.all_kernel_sources())
    with pytest.raises(DTypeError, match="float32 and float64 only"):
        kernels.kernel_source("gather_rows", np.float16)


# ----------------------------------------------------------------------------- the shim itself

def test_shim_runs_a_kernel_with_every_block_and_thread():
    source = """
extern "C" __global__ void minicavs_test_ids(int* out, const int n)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) out[t] = t * 1000 + blockIdx.x * 10 + threadIdx.x + gridDim.x * 0;
}
"""
    kernel = shim.shim_kernel(source, "minicavs_test_ids")
    out = np.full(12, -7, dtype=np.int32)
    kernel((3,), (4,), (out, 11))
    t = np.arange(12)
    want = np.where(t < 11, t * 1000 + (t // 4) * 10 + t % 4, -7)
    np.testing.assert_array_equal(out, want)


def test_shim_checks_argument_types_against_the_signature():
    kernel = shim.shim_kernel(kernels.kernel_source("gather_rows", np.float32).code,
                              "minicavs_gather_rows_f32")
    src = np.zeros((2, 3), np.float64)  # double where the kernel reads float
    with pytest.raises(DTypeError, match="argument 'src': expected dtype float32"):
        kernel((1,), (32,), (src, np.zeros(1, np.int32), np.zeros((1, 3), np.float32), 1, 3))
    with pytest.raises(ShapeError, match="takes 5 arguments"):
        kernel((1,), (32,), (src,))


def test_shim_compile_error_carries_log_and_rejects_syncthreads():
    source = """
extern "C" __global__ void minicavs_test_sync(float* x)
{
    __syncthreads();
    x[threadIdx.x] = 0;
}
"""
    with pytest.raises(KernelCompileError, match="__syncthreads"):
        shim.shim_module(source)


def test_shim_caches_compiled_libraries_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICAVS_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void minicavs_test_cache(float* x) { x[0] = 1.0f; }\n'
    first = shim.ShimModule(source)
    assert first.path.startswith(str(tmp_path))
    mtime = (tmp_path / "shim" / first.path.rsplit("/", 1)[1]).stat().st_mtime_ns
    second = shim.ShimModule(source)  # a fresh object: the .so is reused, not rebuilt
    assert second.path == first.path
    assert (tmp_path / "shim" / first.path.rsplit("/", 1)[1]).stat().st_mtime_ns == mtime
    x = np.zeros(1, np.float32)
    second.get_function("minicavs_test_cache")((1,), (1,), (x,))
    assert x[0] == 1.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_elementwise_body_runs_in_the_shim_and_compiles_with_nvrtc(dtype):
    ctype = "float" if dtype == np.float32 else "double"
    source = shim.elementwise_raw_source(
        f"minicavs_test_axpb_{ctype}", [(ctype, "x"), (ctype, "a"), (ctype, "b")],
        [(ctype, "y")], "y = x * a + b;")
    name = f"minicavs_test_axpb_{ctype}"
    assert nvrtc.ptx_entries(nvrtc.compile_to_ptx(source, name)) == [name]
    rng = np.random.default_rng(1)
    x, a, b = (rng.standard_normal(1000).astype(dtype) for _ in range(3))
    y = np.empty_like(x)
    shim.shim_kernel(source, name)((3,), (128,), (x, a, b, y, x.size))
    assert_bits_equal(y, x * a + b)  # no FMA contraction: the same two roundings as NumPy
    # ... and on the GPU neither: with minicavs' options NVRTC emits a multiply and an add.
    ptx = nvrtc.compile_to_ptx(source, name, options=AS_CUPY)
    assert "fma" not in ptx and re.search(r"\bmul(\.\w+)*\.f(32|64)", ptx)
    assert "fma.rn" in nvrtc.compile_to_ptx(source, name)  # NVRTC's default would contract


def test_shim_ftz_mode_flushes_float32_as_cupy_compiles_it():
    source = shim.elementwise_raw_source(
        "minicavs_test_ftz", [("float", "x"), ("float", "a"), ("float", "b")], [("float", "y")],
        "y = x * a + b;")
    kernel = shim.shim_kernel(source, "minicavs_test_ftz")
    assert kernel.float32_only
    sub = np.float32(3e-39)  # subnormal
    x = np.array([sub, 1e-20, 1.0, 2.0, -sub, 1.5e-38, 0.0], np.float32)
    a = np.array([1.0, 1e-20, sub, 0.5, 1.0, 0.5, 1.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, sub, -0.0, 0.0, -sub], np.float32)
    f = kernels.flush_subnormals
    flushed = f(f(f(x) * f(a)) + f(b))  # operands and results of both operations
    ieee = x * a + b
    assert not np.array_equal(flushed, ieee)  # the inputs do reach the subnormal range
    y = np.empty_like(x)
    kernel((1,), (32,), (x, a, b, y, x.size))  # float32 kernel: FTZ, as on the GPU
    assert_bits_equal(y, flushed)
    kernel((1,), (32,), (x, a, b, y, x.size), ftz=False)
    assert_bits_equal(y, ieee)
    kernel((1,), (32,), (x, a, b, y, x.size), ftz=True)
    assert_bits_equal(y, flushed)
    assert np.signbit(y[4]) and y[4] == 0  # flushed to a zero of the operand's sign
    # The mode is restored after the launch: NumPy on this thread keeps its subnormals.
    assert np.float32(sub) * np.float32(1.0) == sub


def test_shim_ftz_mode_is_for_float32_kernels_only():
    source = shim.elementwise_raw_source("minicavs_test_ftz64", [("double", "x")],
                                         [("double", "y")], "y = x * 0.5;")
    kernel = shim.shim_kernel(source, "minicavs_test_ftz64")
    x = np.array([1e-310, 4e-308], np.float64)  # float64 subnormals never flush on a GPU
    y = np.empty_like(x)
    kernel((1,), (32,), (x, y, x.size))
    assert_bits_equal(y, x * 0.5)
    with pytest.raises(DTypeError, match="FTZ mode models float32 code.*ftz=False"):
        kernel((1,), (32,), (x, y, x.size), ftz=True)


def test_shim_float_atomics_flush_like_atom_global_add_f32():
    source = """
extern "C" __global__ void minicavs_test_atomic(float* total, const float* values, const int n)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) atomicAdd(total, values[t]);
}
"""
    kernel = shim.shim_kernel(source, "minicavs_test_atomic")
    values = np.array([2e-39, 3e-39, 1.0, -1.0, 1.5e-38], np.float32)
    for ftz in (False, True):  # whatever the compiler flags: the atomic unit flushes
        total = np.zeros(1, np.float32)
        kernel((1,), (8,), (total, values, values.size), ftz=ftz)
        assert total[0] == 1.5e-38  # the subnormals vanished; 1.5e-38 is normal


# ----------------------------------------------------------------------------- kernels vs twins

@given(gather_cases())
def test_gather_rows_shim_equals_numpy_twin(case):
    src, idx = case
    got = kernels.gather_rows(src, idx, runner="shim")
    want = kernels.gather_rows_numpy(src, idx)
    assert_bits_equal(got, want)
    # The twin's meaning, spelled independently, and the ops layer's take_rows agree with it.
    present = (idx >= 0).reshape((-1,) + (1,) * (src.ndim - 1))
    picked = src[np.maximum(idx, 0)] if src.shape[0] else np.zeros_like(want)
    assert_bits_equal(want, np.where(present, picked, np.zeros((), src.dtype)))
    assert_bits_equal(mc.take_rows(src, idx).numpy(), want)


@given(gather_cases(), st.data())
def test_gather_rows_overwrites_a_given_out(case, data):
    src, idx = case
    out = data.draw(row_arrays(num_rows=idx.shape[0], dtype=src.dtype, row_shape=src.shape[1:]))
    result = kernels.gather_rows(src, idx, out, runner="shim")
    assert result is out
    assert_bits_equal(out, kernels.gather_rows_numpy(src, idx))


@st.composite
def children_cases(draw):
    src = draw(row_arrays())
    n, k = draw(st.integers(0, 7)), draw(st.integers(0, 3))
    return src, draw(indices(src.shape[0], shape=(n, k)))


@given(children_cases())
def test_gather_children_shim_equals_numpy_twin(case):
    src, child_idx = case
    got = kernels.gather_children(src, child_idx, runner="shim")
    want = kernels.gather_children_numpy(src, child_idx)
    assert got.shape == (child_idx.shape[1], child_idx.shape[0]) + src.shape[1:]
    assert_bits_equal(got, want)
    for c in range(child_idx.shape[1]):  # out[c] is gather(c): one contiguous block per child
        assert got[c].flags.c_contiguous
        assert_bits_equal(got[c], kernels.gather_rows_numpy(src, child_idx[:, c].copy()))


@given(scatter_cases())
def test_deterministic_scatter_add_is_bitwise_a_sequential_sum(case):
    values, idx, out = case
    want = kernels.scatter_add_rows_numpy(values, idx, out.copy())
    got = kernels.scatter_add_rows(values, idx, out.copy(), deterministic=True, runner="shim")
    assert_bits_equal(got, want)
    # The same, spelled as "sort by target row (stably), then add in that order".
    spelled = out.copy()
    for i in np.argsort(idx, kind="stable"):
        if idx[i] >= 0:
            spelled[idx[i]] = spelled[idx[i]] + values[i]
    assert_bits_equal(want, spelled)
    # ... and it is what the ops layer's scatter_add_rows computes (into zeros).
    zeros = np.zeros_like(out)
    assert_bits_equal(mc.scatter_add_rows(values, idx, out.shape[0]).numpy(),
                      kernels.scatter_add_rows(values, idx, zeros, deterministic=True,
                                               runner="shim"))


def assert_same_numbers(got, want):
    """NaN where ``want`` has NaN (any payload), the same bits everywhere else (the sign of
    zero included)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert_bits_equal(np.where(nan, 0, got), np.where(nan, 0, want))


@pytest.mark.parametrize("reduce", list(kernels.SCATTER_FOLDS))
@given(case=scatter_cases(finite=False))
def test_scatter_reduce_rows_shim_is_numpys_ufunc_at(reduce, case):
    # Any floats: NaN, infinities, signed zeros, subnormals; repeated and missing indices.
    values, idx, out = case
    with np.errstate(all="ignore"):  # products overflow, inf * 0
        want = kernels.scatter_reduce_rows_numpy(values, idx, out.copy(), reduce)
        # The same, spelled as a loop over the rows in index order with NumPy's ufunc.
        spelled = out.copy()
        for i in range(len(idx)):
            if idx[i] >= 0:
                spelled[idx[i]] = getattr(np, reduce)(spelled[idx[i]], values[i])
    assert_same_numbers(kernels.scatter_reduce_rows(values, idx, out.copy(), reduce,
                                                    runner="shim"), want)
    assert_same_numbers(want, spelled)


@pytest.mark.parametrize("reduce", list(kernels.SCATTER_FOLDS))
def test_scatter_reduce_rows_keep_float32_subnormals(reduce):
    # Under the shim's FTZ mode (CuPy's -ftz=true) as on the GPU: products, maxima and minima
    # of subnormals are NumPy's, bit for bit.
    pairs = [(1e-20, 1e-20), (1e-40, 2), (1e-40, -1), (-1e-40, 0.0), (-1e-40, -2e-40),
             (2e-40, 1e-40), (-0.0, 1e-40)]
    values = np.array([[v] for v, _ in pairs], np.float32)
    out = np.array([[o] for _, o in pairs], np.float32)
    idx = np.arange(len(pairs), dtype=np.int32)
    want = kernels.scatter_reduce_rows_numpy(values, idx, out.copy(), reduce)
    assert (np.abs(want[want != 0]) < TINY32).any()  # subnormal results, which FTZ would lose
    assert_bits_equal(kernels.scatter_reduce_rows(values, idx, out.copy(), reduce,
                                                  runner="shim"), want)


def test_scatter_reduce_rows_ties_and_nans_follow_numpy():
    values = np.array([[0.0], [-0.0], [np.nan], [2.0], [-0.0], [0.0]])
    idx = np.array([0, 0, 1, 1, 2, 2], np.int32)
    out = np.array([[-1.0], [1.0], [1.0]])
    got = kernels.scatter_reduce_rows(values, idx, out.copy(), "maximum", runner="shim")
    assert np.signbit(got[0, 0]) and got[0, 0] == 0  # max(0, -0) takes the second, as NumPy 2
    assert np.isnan(got[1, 0])  # a NaN stays, whatever comes after it
    assert not np.signbit(got[2, 0])
    got = kernels.scatter_reduce_rows(values, idx, out.copy(), "minimum", runner="shim")
    assert np.signbit(got[0, 0]) and got[0, 0] == -1
    with pytest.raises(ValueError, match="reduce must be one of"):
        kernels.scatter_reduce_rows(values, idx, out.copy(), "subtract", runner="shim")


def atomic_bound(values, idx, out):
    """How far an atomic scatter-add may be from the sequential sum: the threads reach repeated
    rows in any order, so (number of terms) * eps * (sum of magnitudes); and in float32 each
    add may flush a subnormal operand, the other operand and its result (each < tiny)."""
    magnitude = kernels.scatter_add_rows_numpy(np.abs(values.astype(np.float64)), idx,
                                               np.abs(out.astype(np.float64)))
    terms = np.bincount(idx[idx >= 0], minlength=out.shape[0]) + 1
    terms = terms.reshape((-1,) + (1,) * (out.ndim - 1))
    flushed = 3 * TINY32 if out.dtype == np.float32 else 0.0
    return terms * (np.finfo(out.dtype).eps * magnitude + flushed)


@given(scatter_cases())
def test_atomic_scatter_add_agrees_up_to_summation_order_and_ftz(case):
    values, idx, out = case
    want = kernels.scatter_add_rows_numpy(values, idx, out.copy())
    got = kernels.scatter_add_rows(values, idx, out.copy(), runner="shim")
    assert np.all(np.abs(got.astype(np.float64) - want) <= atomic_bound(values, idx, out))


@given(scatter_cases(unique=True))
def test_atomic_scatter_add_without_repeats_is_the_flushed_sum(case):
    values, idx, out = case
    got = kernels.scatter_add_rows(values, idx, out.copy(), runner="shim")
    # One add per row: exactly flush(flush(out) + flush(value)) in float32, out + value in
    # float64; rows no index names are untouched.
    f = kernels.flush_subnormals
    present = idx >= 0
    want = out.copy()
    want[idx[present]] = f(f(out[idx[present]]) + f(values[present]))
    assert_bits_equal(got, want)


def test_deterministic_scatter_keeps_the_subnormals_atomics_flush():
    tiny = np.float32(1e-40)
    values = np.full((5, 2), tiny, np.float32)
    idx = np.array([0, 0, 0, 1, -1], np.int32)
    want = kernels.scatter_add_rows_numpy(values, idx, np.zeros((2, 2), np.float32))
    assert np.all(want > 0)  # 3e-40 and 1e-40: subnormal sums NumPy keeps
    det = kernels.scatter_add_rows(values, idx, np.zeros((2, 2), np.float32),
                                   deterministic=True, runner="shim")
    assert_bits_equal(det, want)
    atomic = kernels.scatter_add_rows(values, idx, np.zeros((2, 2), np.float32), runner="shim")
    assert not atomic.any()  # every operand flushed


@given(scatter_cases())
def test_scatter_plan_groups_rows_by_target_in_original_order(case):
    values, idx, out = case
    plan = kernels.scatter_plan(idx, out.shape[0])
    # Positions in the values are int64 (2**31 rows or more), target rows int32.
    assert (plan.order.dtype, plan.targets.dtype, plan.starts.dtype) == (np.int64, np.int32,
                                                                         np.int64)
    kept = np.flatnonzero(idx >= 0)
    assert sorted(plan.order.tolist()) == kept.tolist()
    assert plan.starts[0] == 0 and plan.starts[-1] == kept.size
    assert np.all(np.diff(plan.targets) > 0)  # each target once, ascending
    for s, target in enumerate(plan.targets):
        group = plan.order[plan.starts[s]:plan.starts[s + 1]]
        assert np.all(idx[group] == target) and np.all(np.diff(group) > 0)
    # A ready plan gives the same bits as one built inside the call.
    a = kernels.scatter_add_rows(values, idx, out.copy(), deterministic=True, plan=plan,
                                 runner="shim")
    assert_bits_equal(a, kernels.scatter_add_rows_numpy(values, idx, out.copy()))


def test_a_plan_of_other_index_widths_is_refused():
    idx = np.array([1, 0, 1], np.int32)
    plan = kernels.scatter_plan(idx, 2)
    narrow = kernels.ScatterPlan(plan.order.astype(np.int32), plan.targets,
                                 plan.starts.astype(np.int32), 2)
    with pytest.raises(DTypeError, match=r"plan.order must be a 1-D int64 array.*scatter_plan"):
        kernels.scatter_add_rows(np.ones((3, 2), np.float32), idx,
                                 np.zeros((2, 2), np.float32), deterministic=True, plan=narrow,
                                 runner="shim")


@given(scatter_cases(unique=True))
def test_scatter_rows_shim_equals_numpy_twin(case):
    values, idx, out = case
    want = kernels.scatter_rows_numpy(values, idx, out.copy())
    assert_bits_equal(kernels.scatter_rows(values, idx, out.copy(), runner="shim"), want)


@st.composite
def copy_cases(draw):
    src = draw(row_arrays())
    num_out = draw(st.integers(0, 8))
    n = draw(st.integers(0, num_out + 2))
    dst = list(draw(st.permutations(range(num_out))))[:n]
    dst = np.array(dst + [-1] * (n - len(dst)), dtype=np.int32)
    dst = dst[np.array(draw(st.permutations(range(n))), dtype=np.intp)] if n else dst
    src_idx = draw(indices(src.shape[0], length=n))
    out = draw(row_arrays(num_rows=num_out, dtype=src.dtype, row_shape=src.shape[1:]))
    return src, src_idx, out, dst


@given(copy_cases())
def test_copy_rows_shim_equals_numpy_twin(case):
    src, src_idx, out, dst_idx = case
    want = kernels.copy_rows_numpy(src, src_idx, out.copy(), dst_idx)
    assert_bits_equal(kernels.copy_rows(src, src_idx, out.copy(), dst_idx, runner="shim"), want)
    # copy_rows is gather followed by scatter, in one launch.
    spelled = kernels.scatter_rows_numpy(kernels.gather_rows_numpy(src, src_idx), dst_idx,
                                         out.copy())
    assert_bits_equal(want, spelled)


@given(row_arrays(), st.randoms(use_true_random=False))
def test_push_undoes_pull(external, random):
    order = np.arange(external.shape[0], dtype=np.int32)
    random.shuffle(order)
    level = kernels.pull_rows(external, order, runner="shim")
    assert_bits_equal(level, kernels.gather_rows_numpy(external, order))
    back = kernels.push_rows(level, order, runner="shim")
    assert_bits_equal(back, external)
    assert_bits_equal(kernels.push_rows(level, order, runner="numpy"), external)


@pytest.mark.parametrize("blocks, threads", [(1, 32), (3, 7), (65535, 256)])
def test_grid_stride_loops_cover_any_grid(monkeypatch, blocks, threads):
    # Fewer threads than elements: each thread walks the grid-stride loop several times.
    monkeypatch.setattr(kernels, "MAX_BLOCKS", blocks)
    monkeypatch.setattr(kernels, "BLOCK_SIZE", threads)
    rng = np.random.default_rng(2)
    src = rng.standard_normal((300, 7)).astype(np.float32)
    idx = rng.integers(-1, 300, 1000).astype(np.int32)
    assert_bits_equal(kernels.gather_rows(src, idx, runner="shim"),
                      kernels.gather_rows_numpy(src, idx))
    child_idx = rng.integers(-1, 300, (400, 3)).astype(np.int32)
    assert_bits_equal(kernels.gather_children(src, child_idx, runner="shim"),
                      kernels.gather_children_numpy(src, child_idx))
    values = rng.standard_normal((1000, 7)).astype(np.float32)
    out = rng.standard_normal((300, 7)).astype(np.float32)
    assert_bits_equal(kernels.scatter_add_rows(values, idx, out.copy(), deterministic=True,
                                               runner="shim"),
                      kernels.scatter_add_rows_numpy(values, idx, out.copy()))
    np.testing.assert_allclose(kernels.scatter_add_rows(values, idx, out.copy(), runner="shim"),
                               kernels.scatter_add_rows_numpy(values, idx, out.copy()),
                               rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- launch checks

RUNNERS = ["numpy", "shim"]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("bad", [-2, 5, 2**31 - 1])
def test_out_of_range_index_is_an_error_before_launch(runner, bad):
    src = np.ones((5, 3), np.float32)
    idx = np.array([0, 4, bad, -1], np.int32)
    with pytest.raises(IndexRangeError, match=rf"index {bad} at position 2, out of range for 5"):
        kernels.gather_rows(src, idx, runner=runner)
    out = np.zeros((5, 3), np.float32)
    for deterministic in (False, True):
        with pytest.raises(IndexRangeError, match=rf"'scatter_add_rows'.*index {bad}"):
            kernels.scatter_add_rows(np.ones((4, 3), np.float32), idx, out,
                                     deterministic=deterministic, runner=runner)
    assert not out.any()  # nothing was written
    child_idx = np.array([[0, -1], [1, bad]], np.int32)
    with pytest.raises(IndexRangeError, match=r"'child_idx' has index .* at position \(1, 1\)"):
        kernels.gather_children(src, child_idx, runner=runner)


def test_gather_from_no_rows_allows_only_minus_one():
    src = np.ones((0, 2), np.float64)
    assert_bits_equal(kernels.gather_rows(src, np.array([-1, -1], np.int32), runner="shim"),
                      np.zeros((2, 2)))
    with pytest.raises(IndexRangeError, match="no rows"):
        kernels.gather_rows(src, np.array([0], np.int32), runner="shim")


@pytest.mark.parametrize("runner", RUNNERS)
def test_wrong_dtypes_are_errors(runner):
    src = np.ones((4, 2), np.float32)
    with pytest.raises(DTypeError, match="'idx' must be int32 indices, got int64"):
        kernels.gather_rows(src, np.array([0, 1]), runner=runner)
    with pytest.raises(DTypeError, match="float32 and float64 only"):
        kernels.gather_rows(src.astype(np.float16), np.array([0], np.int32), runner=runner)
    with pytest.raises(DTypeError, match="'out' must have dtype float32"):
        kernels.gather_rows(src, np.array([0], np.int32), np.zeros((1, 2)), runner=runner)
    with pytest.raises(DTypeError, match="'out' must have dtype float64"):
        kernels.scatter_add_rows(np.ones((1, 2)), np.array([0], np.int32), src, runner=runner)


@pytest.mark.parametrize("runner", RUNNERS)
def test_non_contiguous_arrays_are_errors(runner):
    src = np.ones((4, 6), np.float32)
    idx = np.array([0, 1, 2, 3], np.int32)
    with pytest.raises(ShapeError, match="'src' must be C-contiguous"):
        kernels.gather_rows(src[:, ::2], idx, runner=runner)
    with pytest.raises(ShapeError, match="'idx' must be C-contiguous"):
        kernels.gather_rows(src, np.arange(8, dtype=np.int32)[::2], runner=runner)
    with pytest.raises(ShapeError, match="'out' must be C-contiguous"):
        kernels.gather_rows(src, idx, np.ones((6, 4), np.float32).T, runner=runner)
    with pytest.raises(ShapeError, match="'child_idx' must be C-contiguous"):
        kernels.gather_children(src, np.zeros((2, 4), np.int32).T, runner=runner)


@pytest.mark.parametrize("runner", RUNNERS)
def test_wrong_shapes_are_errors(runner):
    src = np.ones((4, 2), np.float32)
    idx = np.array([0, 1], np.int32)
    with pytest.raises(ShapeError, match=r"'out' must have shape \(2, 2\)"):
        kernels.gather_rows(src, idx, np.zeros((3, 2), np.float32), runner=runner)
    with pytest.raises(ShapeError, match="'idx' must have 1 axis"):
        kernels.gather_rows(src, idx.reshape(1, 2), runner=runner)
    with pytest.raises(ShapeError, match="'child_idx' must have 2 axes"):
        kernels.gather_children(src, idx, runner=runner)
    with pytest.raises(ShapeError, match="one index per row of 'values'"):
        kernels.scatter_add_rows(src, idx, np.zeros((4, 2), np.float32), runner=runner)
    with pytest.raises(ShapeError, match="must have the same shape"):
        kernels.scatter_add_rows(src[:2], idx, np.zeros((4, 3), np.float32), runner=runner)


@pytest.mark.parametrize("runner", RUNNERS)
def test_out_may_not_alias_an_input(runner):
    a = np.ones((4, 2), np.float32)
    with pytest.raises(ShapeError, match="'out' overlaps argument 'src'"):
        kernels.gather_rows(a, np.array([3, 2], np.int32), a[:2], runner=runner)
    with pytest.raises(ShapeError, match="'out' overlaps argument 'values'"):
        kernels.scatter_add_rows(a[2:], np.array([0, 1], np.int32), a, runner=runner)


@pytest.mark.parametrize("runner", RUNNERS)
def test_scatter_rows_refuses_repeated_indices(runner):
    with pytest.raises(IndexRangeError, match=r"index 1 more than once \(positions 0 and 2\)"):
        kernels.scatter_rows(np.ones((3, 2)), np.array([1, -1, 1], np.int32), np.zeros((3, 2)),
                             runner=runner)
    with pytest.raises(IndexRangeError, match=r"'dst_idx' has index 0 more than once"):
        kernels.copy_rows(np.ones((3, 2)), np.array([1, 2, 0], np.int32), np.zeros((3, 2)),
                          np.array([0, 0, -1], np.int32), runner=runner)


def test_runner_must_match_the_arrays():
    with pytest.raises(DTypeError, match="runner 'cupy' needs CuPy arrays"):
        kernels.gather_rows(np.ones((2, 2)), np.zeros(1, np.int32), runner="cupy")
    with pytest.raises(ValueError, match="runner must be one of"):
        kernels.gather_rows(np.ones((2, 2)), np.zeros(1, np.int32), runner="gpu")


# ----------------------------------------------------------------------------- on a real GPU

def _to_gpu(*arrays):
    import cupy

    return [cupy.asarray(a) for a in arrays]


@pytest.mark.gpu
@given(gather_cases())
def test_gpu_gather_rows_equals_numpy(case):
    src, idx = case
    d_src, d_idx = _to_gpu(src, idx)
    assert_bits_equal(kernels.gather_rows(d_src, d_idx).get(), kernels.gather_rows_numpy(src, idx))


@pytest.mark.gpu
@given(children_cases())
def test_gpu_gather_children_equals_numpy(case):
    src, child_idx = case
    d_src, d_idx = _to_gpu(src, child_idx)
    assert_bits_equal(kernels.gather_children(d_src, d_idx).get(),
                      kernels.gather_children_numpy(src, child_idx))


@pytest.mark.gpu
@given(scatter_cases())
def test_gpu_scatter_add_rows_equals_numpy(case):
    values, idx, out = case
    want = kernels.scatter_add_rows_numpy(values, idx, out.copy())
    d_values, d_idx, d_out = _to_gpu(values, idx, out)
    got = kernels.scatter_add_rows(d_values, d_idx, d_out.copy(), deterministic=True).get()
    assert_bits_equal(got, want)
    atomic = kernels.scatter_add_rows(d_values, d_idx, d_out.copy()).get()
    assert np.all(np.abs(atomic.astype(np.float64) - want) <= atomic_bound(values, idx, out))


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", list(kernels.SCATTER_FOLDS))
@given(case=scatter_cases(finite=False))
def test_gpu_scatter_reduce_rows_equals_numpy(reduce, case):
    values, idx, out = case
    with np.errstate(all="ignore"):
        want = kernels.scatter_reduce_rows_numpy(values, idx, out.copy(), reduce)
    got = kernels.scatter_reduce_rows(*_to_gpu(values, idx, out), reduce).get()
    assert_same_numbers(got, want)


@pytest.mark.gpu
@given(scatter_cases(unique=True))
def test_gpu_atomic_scatter_without_repeats_is_the_flushed_sum(case):
    values, idx, out = case
    got = kernels.scatter_add_rows(*_to_gpu(values, idx, out)).get()
    assert_bits_equal(got, kernels.scatter_add_rows(values, idx, out.copy(), runner="shim"))


@pytest.mark.gpu
@given(row_arrays(), st.randoms(use_true_random=False))
def test_gpu_pull_and_push_equal_numpy(external, random):
    order = np.arange(external.shape[0], dtype=np.int32)
    random.shuffle(order)
    d_external, d_order = _to_gpu(external, order)
    level = kernels.pull_rows(d_external, d_order)
    assert_bits_equal(level.get(), kernels.gather_rows_numpy(external, order))
    assert_bits_equal(kernels.push_rows(level, d_order).get(), external)


@pytest.mark.gpu
@given(copy_cases())
def test_gpu_copy_rows_equals_numpy(case):
    src, src_idx, out, dst_idx = case
    want = kernels.copy_rows_numpy(src, src_idx, out.copy(), dst_idx)
    d_src, d_src_idx, d_out, d_dst_idx = _to_gpu(src, src_idx, out, dst_idx)
    assert_bits_equal(kernels.copy_rows(d_src, d_src_idx, d_out, d_dst_idx).get(), want)


@pytest.mark.gpu
def test_gpu_out_of_range_index_is_an_error_not_a_fault():
    d_src, d_idx = _to_gpu(np.ones((5, 3), np.float32), np.array([0, 5], np.int32))
    with pytest.raises(IndexRangeError, match="index 5 at position 1"):
        kernels.gather_rows(d_src, d_idx)


# --- the LSTM cell kernels: against the op's NumPy form -------------------------------------------

def _cell_case(k, dtype, rows=7, H=5, seed=0):
    """Pre-activations, k previous cells read as column windows of a wider state (strided rows),
    the cell's [h, c] and a gradient of it."""
    from minicavs.ops import cells

    rng = np.random.default_rng(seed)
    pre = (3 * rng.standard_normal((rows, (3 + k) * H))).astype(dtype)
    state = rng.standard_normal((rows, 2 * H * max(k, 1))).astype(dtype)
    c_prev = [state[:, (2 * j + 1) * H:(2 * j + 2) * H] for j in range(k)]
    i, forget, o, u = cells._gates(np, pre, k)
    c = i * u + sum((f * cj for f, cj in zip(forget, c_prev)), np.zeros_like(u))
    out = np.concatenate([o * np.tanh(c), c], axis=-1)
    g = rng.standard_normal((rows, 2 * H)).astype(dtype)
    return pre, c_prev, out, g


def _cell_grad_numpy(pre, c_prev, out, g, monkeypatch):
    from minicavs.cpu import kernels as native
    from minicavs.ops import cells

    monkeypatch.setattr(native, "lstm_cell_grad", lambda *args: None)  # the op's NumPy form
    return cells._grad_forward(np, pre, *c_prev, out, g)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_shim_lstm_cell_kernels_equal_the_ops_numpy_form(k, dtype, monkeypatch):
    pre, c_prev, out, g = _cell_case(k, dtype)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(kernels.lstm_cell(pre, c_prev, runner="shim"), out, rtol=rtol,
                               atol=rtol)
    slab = np.full((9, 2 * pre.shape[1] // (3 + k)), np.nan, dtype)  # into given rows
    kernels.lstm_cell(pre, c_prev, slab[1:8], runner="shim")
    np.testing.assert_allclose(slab[1:8], out, rtol=rtol, atol=rtol)
    assert np.isnan(slab[[0, 8]]).all()
    np.testing.assert_allclose(kernels.lstm_cell_grad(pre, c_prev, out, g, runner="shim"),
                               _cell_grad_numpy(pre, c_prev, out, g, monkeypatch), rtol=rtol,
                               atol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [0, 1, 2])
def test_shim_lstm_cell_sum_adds_its_terms_in_order_keeps_the_sum_and_runs_the_cell(k, dtype):
    """pre = (t0 + t1) + bias, as the fused group adds it (bit for bit), written to ``pre``
    and the cell run on it; two terms; a term that is not a row per row or a bias declines."""
    pre, c_prev, out, _ = _cell_case(k, dtype)
    rng = np.random.default_rng(k)
    t1 = rng.standard_normal(pre.shape).astype(dtype)
    bias = rng.standard_normal(pre.shape[1]).astype(dtype)
    t0 = (pre - t1 - bias).astype(dtype)
    want_pre = (t0 + t1) + bias
    got_pre, got = kernels.lstm_cell_sum([t0, t1, bias], c_prev, runner="shim")
    assert np.array_equal(got_pre, want_pre)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(got, kernels.lstm_cell(want_pre, c_prev, runner="shim"),
                               rtol=rtol, atol=rtol)
    two_pre, _ = kernels.lstm_cell_sum([t0, t1], c_prev, runner="shim")
    assert np.array_equal(two_pre, t0 + t1)
    assert kernels.lstm_cell_sum([t0, t1[:1]], c_prev, runner="shim") is None  # one row of 2-D
    assert kernels.lstm_cell_sum([t0, np.ones((), dtype)], c_prev, runner="shim") is None
    assert kernels.lstm_cell_sum([t0, t1], c_prev) is None  # NumPy arrays: the two steps


def test_the_lstm_cell_kernels_leave_what_they_do_not_fit_to_the_op():
    pre, c_prev, out, g = _cell_case(2, np.float32)
    assert kernels.lstm_cell(pre, c_prev * 2, runner="shim") is None  # k > 2
    assert kernels.lstm_cell(pre[:, ::2], c_prev, runner="shim") is None  # strided columns
    assert kernels.lstm_cell(pre, c_prev) is None  # NumPy arrays: the op's own C loop


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 1, 2])
def test_gpu_lstm_cell_kernels_equal_the_ops_numpy_form(k, monkeypatch):
    pre, c_prev, out, g = _cell_case(k, np.float32)
    d_pre, d_out, d_g = _to_gpu(pre, out, g)
    d_state = _to_gpu(np.concatenate([c for c in c_prev] or [np.zeros((7, 0), np.float32)], 1))
    d_cells = [d_state[0][:, j * 5:(j + 1) * 5] for j in range(k)]
    np.testing.assert_allclose(kernels.lstm_cell(d_pre, d_cells).get(), out, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(kernels.lstm_cell_grad(d_pre, d_cells, d_out, d_g).get(),
                               _cell_grad_numpy(pre, c_prev, out, g, monkeypatch), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 1, 2])
def test_gpu_lstm_cell_sum_equals_the_sum_then_the_cell(k):
    pre, c_prev, out, _ = _cell_case(k, np.float32)
    t1 = np.random.default_rng(k).standard_normal(pre.shape).astype(np.float32)
    bias = np.linspace(-1, 1, pre.shape[1], dtype=np.float32)
    t0 = pre - t1 - bias
    d_t0, d_t1, d_bias, *d_cells = _to_gpu(t0, t1, bias, *c_prev)
    got_pre, got = kernels.lstm_cell_sum([d_t0, d_t1, d_bias], d_cells)
    want_pre = (t0 + t1) + bias
    np.testing.assert_allclose(got_pre.get(), want_pre, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.get(), kernels.lstm_cell(_to_gpu(want_pre)[0], d_cells).get(),
                               rtol=1e-5, atol=1e-6)


# --- softmax cross-entropy kernels: against the op's NumPy form ------------------------------------

def _xent_case(dtype, rows=7, classes=9, seed=0, g_value=None):
    rng = np.random.default_rng(seed)
    logits = (3 * rng.standard_normal((rows, classes))).astype(dtype)
    logits[2, 4] = 60.0  # (a large logit: the row's max is subtracted first)
    labels = rng.integers(0, classes, rows)
    g = rng.standard_normal(rows).astype(dtype)
    if g_value is not None:
        g[:] = g_value
    shifted = logits - logits.max(-1, keepdims=True)
    losses = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(rows), labels]
    probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    grads = probs * g[:, None]
    grads[np.arange(rows), labels] -= g
    return logits, labels, g, losses, grads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shim_softmax_xent_kernels_equal_the_ops_numpy_form(dtype):
    logits, labels, g, losses, grads = _xent_case(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(kernels.softmax_xent(logits, labels, runner="shim"), losses,
                               rtol=tol, atol=tol)
    out = np.full(len(labels), np.nan, dtype)
    assert kernels.softmax_xent(logits, labels, out, runner="shim") is out
    np.testing.assert_allclose(out, losses, rtol=tol, atol=tol)
    np.testing.assert_allclose(kernels.softmax_xent_grad(logits, labels, g, runner="shim"),
                               grads, rtol=tol, atol=tol)
    mean = np.broadcast_to(dtype(0.25), g.shape)  # (a mean's gradient: one value, stride 0)
    np.testing.assert_allclose(
        kernels.softmax_xent_grad(logits, labels, mean, runner="shim"),
        _xent_case(dtype, g_value=0.25)[4], rtol=tol, atol=tol)
    strided = np.repeat(g, 2)[::2]  # (any other layout: the op's own form)
    assert kernels.softmax_xent_grad(logits, labels, strided, runner="shim") is None
    wide = np.zeros((len(labels), 12), dtype)  # rows at a stride: the first 9 columns
    wide[:, :9] = logits
    np.testing.assert_allclose(kernels.softmax_xent(wide[:, :9], labels, runner="shim"),
                               losses, rtol=tol, atol=tol)


def test_a_label_out_of_range_leaves_the_error_to_the_op():
    logits, labels, g, _, _ = _xent_case(np.float32)
    labels[3] = 9
    assert kernels.softmax_xent(logits, labels, runner="shim") is None
    assert kernels.softmax_xent(logits, labels.astype(np.int32), runner="shim") is None  # int32
    assert kernels.softmax_xent(logits, labels) is None  # NumPy arrays: the op's own loop


@pytest.mark.gpu
def test_gpu_softmax_xent_kernels_equal_the_ops_numpy_form():
    logits, labels, g, losses, grads = _xent_case(np.float32)
    d_logits, d_labels, d_g = _to_gpu(logits, labels, g)
    np.testing.assert_allclose(kernels.softmax_xent(d_logits, d_labels).get(), losses,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kernels.softmax_xent_grad(d_logits, d_labels, d_g).get(), grads,
                               rtol=1e-5, atol=1e-5)
    mean = d_g[:1].reshape(()) * 0 + 0.25  # (a mean's gradient: one value broadcast)
    import cupy
    np.testing.assert_allclose(
        kernels.softmax_xent_grad(d_logits, d_labels, cupy.broadcast_to(mean, d_g.shape)).get(),
        _xent_case(np.float32, g_value=0.25)[4], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------- adam

def _adam_case(dtype, optimizer, weight_decay, steps=3, shape=(37, 11), seed=7):
    """Parameters and moments after ``steps`` of the optimiser's NumPy form, the gradients, and
    the last step's hyperparameters as the kernel takes them. (37 x 11: not a multiple of a
    block.)"""
    rng = np.random.default_rng(seed)
    param = mc.Parameter(rng.standard_normal(shape).astype(dtype))
    opt = optimizer([param], lr=0.05, weight_decay=weight_decay)
    grads = [rng.standard_normal(shape).astype(dtype) for _ in range(steps)]
    for g in grads[:-1]:
        param.grad = mc.tensor(g)
        opt.step()
    before = [param.data.copy(), opt.state[0]["m"].copy(), opt.state[0]["v"].copy()]
    param.grad = mc.tensor(grads[-1])
    opt._step_one(0, param, opt.state[0], opt.param_groups[0])  # (the NumPy form)
    group, t = opt.param_groups[0], steps
    decay = 1 - group["lr"] * group["weight_decay"] if opt.decoupled_weight_decay else 1.0
    hyper = (*group["betas"], group["eps"], 1 - group["betas"][1] ** t,
             group["lr"] / (1 - group["betas"][0] ** t), decay)
    after = [param.data, opt.state[0]["m"], opt.state[0]["v"]]
    return before, grads[-1], hyper, after


# (Adam's L2 penalty is added to the gradient before the update: the kernel sees that gradient)
@pytest.mark.parametrize("optimizer, weight_decay", [(mc.nn.Adam, 0.0), (mc.nn.AdamW, 0.1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shim_adam_kernel_equals_the_optimisers_numpy_form(dtype, optimizer, weight_decay):
    (p, m, v), g, hyper, (p_ref, m_ref, v_ref) = _adam_case(dtype, optimizer, weight_decay)
    assert kernels.adam_many([p], [g], [m], [v], *hyper, runner="shim") is True
    tol = 1e-6 if dtype == np.float32 else 1e-14
    for got, want in ((m, m_ref), (v, v_ref), (p, p_ref)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert kernels.adam_many([p], [g], [m], [v], *hyper) is False  # NumPy: the optimiser's own
    assert kernels.adam_many([p], [g[:, :5]], [m], [v], *hyper,
                             runner="shim") is False  # (another shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shim_adam_many_steps_every_parameter_in_one_launch_as_the_numpy_form(dtype):
    """The multi-tensor kernel: parameters of four shapes (one of a single element) stepped in
    one launch from a table of their addresses, each as the optimiser's NumPy form steps it."""
    cases = [_adam_case(dtype, mc.nn.AdamW, 0.1, shape=shape, seed=k)
             for k, shape in enumerate([(37, 11), (5,), (2, 3, 4), (1,)])]
    hyper = cases[0][2]
    assert all(case[2] == hyper for case in cases)
    params, ms, vs = ([case[0][j] for case in cases] for j in range(3))
    grads = [case[1] for case in cases]
    assert kernels.adam_many(params, grads, ms, vs, *hyper, runner="shim") is True
    tol = 1e-6 if dtype == np.float32 else 1e-14
    for case, *got in zip(cases, params, ms, vs):
        for g, want in zip(got, case[3]):
            np.testing.assert_allclose(g, want, rtol=tol, atol=tol)
    assert kernels.adam_many(params, grads, ms, vs, *hyper) is False  # (NumPy: the CPU's own)
    assert kernels.adam_many(params, grads[:1] + [grads[0]] * 3, ms, vs, *hyper,
                             runner="shim") is False  # (a gradient of another shape)


@pytest.mark.gpu
def test_gpu_adam_many_equals_the_optimisers_numpy_form():
    import cupy

    cases = [_adam_case(np.float32, mc.nn.AdamW, 0.1, shape=shape, seed=k)
             for k, shape in enumerate([(37, 11), (5,), (1,)])]
    on_gpu = [[cupy.asarray(a) for a in case[0]] for case in cases]
    params, ms, vs = ([arrays[j] for arrays in on_gpu] for j in range(3))
    assert kernels.adam_many(params, [cupy.asarray(c[1]) for c in cases], ms, vs,
                             *cases[0][2]) is True
    for case, *got in zip(cases, params, ms, vs):
        for g, want in zip(got, case[3]):
            np.testing.assert_allclose(g.get(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_gpu_adam_kernel_equals_the_optimisers_numpy_form():
    (p, m, v), g, hyper, (p_ref, m_ref, v_ref) = _adam_case(np.float32, mc.nn.AdamW, 0.1)
    d_p, d_g, d_m, d_v = _to_gpu(p, g, m, v)
    assert kernels.adam_many([d_p], [d_g], [d_m], [d_v], *hyper) is True
    for got, want in ((d_m, m_ref), (d_v, v_ref), (d_p, p_ref)):
        np.testing.assert_allclose(got.get(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_products_through_cublas_equal_numpy_for_every_layout(dtype):
    """cuda/blas.py's direct cuBLAS call on a GPU (the emulated device checks the same call
    column-major on the host: tests/test_cuda_emulated.py)."""
    import cupy

    from minicavs.cuda import blas

    rng = np.random.default_rng(3)
    m, n, k = 37, 19, 23
    x, y = (rng.standard_normal(s).astype(dtype) for s in ((m, k), (k, n)))
    wide = lambda a: cupy.asarray(np.pad(a, ((0, 0), (2, 3))))[:, 2:2 + a.shape[1]]  # noqa: E731
    layouts = {"rows": lambda a: cupy.asarray(a), "window": wide,
               "transposed": lambda a: cupy.asarray(np.ascontiguousarray(a.T)).T,
               "transposed window": lambda a: wide(np.ascontiguousarray(a.T)).T}
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for name_a, lay_a in layouts.items():
        for name_b, lay_b in layouts.items():
            a, b = lay_a(x), lay_b(y)
            assert blas._plan(a, b, None), (name_a, name_b)
            out = wide(np.full((m, n), np.nan, dtype))
            assert blas.matmul(cupy, a, b, out) is out
            np.testing.assert_allclose(out.get(), x @ y, rtol=tol, atol=tol,
                                       err_msg=f"{name_a} @ {name_b}")
