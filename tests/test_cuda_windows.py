"""The level's row moves as one launch each (minicavs/cuda/windows.py): generated sources compile
with NVRTC as CuPy compiles them, and the g++ shim runs them as their NumPy twins."""

import numpy as np
import pytest

from minicavs.cuda import nvrtc, windows
from minicavs.ops.batching import packed_strides

AS_CUPY = nvrtc.KERNEL_OPTIONS + nvrtc.CUPY_APPENDED_OPTIONS

# The Tree-LSTM's: child 0's h into columns 0:3 of [h_l, h_r] and its c into a buffer of its
# own; child 1's h into columns 3:6, its c into another buffer (state rows [h, c], width 6).
# (child 1's c into a block of the level's own: rows 0..3)
GATHER = ((0, 0, 3, 0, 0, 6, 1), (0, 3, 3, 1, 0, 3, 1), (1, 0, 3, 0, 3, 6, 1), (1, 3, 3, 2, 0, 3, 0))
# ∂F's: per child, [dh, dc] from a column window of a product (dh: columns 0:3 or 3:6 of a
# (n, 6) value) and a (n, 3) value of its own.
SCATTER = ((0, 0, 0, 6, 3, 0), (0, 1, 0, 3, 3, 3), (1, 0, 3, 6, 3, 0), (1, 2, 0, 3, 3, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_generated_sources_compile_with_nvrtc(dtype):
    for source in (windows.gather_source(GATHER, 6, dtype),
                   windows.scatter_source(SCATTER, 6, dtype)):
        ptx = nvrtc.compile_to_ptx(source.code, source.name, arch="compute_90", options=AS_CUPY)
        assert nvrtc.ptx_entries(ptx) == [source.name]


def _level(rng, dtype):
    """A level of 4 rows (rows 5..8 of a batch of 10) over a state of 12 rows (-1: no child)."""
    idx = {0: np.full(10, -1, np.int32), 1: np.full(10, -1, np.int32)}
    idx[0][5:9] = [0, 3, -1, 11]
    idx[1][5:9] = [1, -1, 2, 10]
    return idx, rng.normal(size=(12, 6)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather_windows_on_the_shim_equals_its_numpy_twin(dtype):
    rng = np.random.default_rng(0)
    idx, states = _level(rng, dtype)
    got = [rng.normal(size=(10, w)).astype(dtype) for w in (6, 3, 3)]
    want = [a.copy() for a in got]
    windows.gather_windows(states, idx, got, GATHER, 4, 5, runner="shim")
    windows.gather_windows_numpy(states, idx, want, GATHER, 4, 5)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(want[0][5], np.concatenate([states[0, :3], states[1, :3]]))
    np.testing.assert_array_equal(want[2][2], states[2, 3:])  # level row 2: batch row 7
    np.testing.assert_array_equal(want[1][7], 0)  # no child 0: zeros
    np.testing.assert_array_equal(got[0][:5], want[0][:5])  # other levels' rows untouched
    np.testing.assert_array_equal(got[2][4:], want[2][4:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_windows_on_the_shim_equals_its_numpy_twin(dtype):
    rng = np.random.default_rng(1)
    idx, _ = _level(rng, dtype)
    idx[1][8] = 3  # a DAG: row 3 gets child 0's gradient from row 6 and child 1's from row 8
    values = [rng.normal(size=(4, w)).astype(dtype) for w in (6, 3, 3)]
    got = rng.normal(size=(12, 6)).astype(dtype)
    want = got.copy()
    windows.scatter_add_windows(values, idx, got, SCATTER, 4, 5, runner="shim")
    windows.scatter_add_windows_numpy(values, idx, want, SCATTER, 4, 5)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    before = rng.normal(size=(12, 6)).astype(dtype)
    after = before.copy()
    windows.scatter_add_windows_numpy(values, idx, after, SCATTER, 4, 5)
    np.testing.assert_allclose(after[0] - before[0],
                               np.concatenate([values[0][0, :3], values[1][0]]), rtol=1e-6)
    np.testing.assert_allclose(after[3] - before[3], np.concatenate(
        [values[0][1, :3] + values[0][3, 3:], values[1][1] + values[2][3]]), rtol=1e-6)


def _level_group(dtype):
    """s = a * b + c; y0 = tanh(s) - d * z + e, y1 = s * e: a fused group whose operands are
    read in every way a level kernel reads them."""
    import minicavs as mc
    from minicavs.runtime.analysis import fusion_groups

    def f(a, b, c, d, z, e):
        s = a * b + c
        return mc.tanh(s) - d * z + e, s * e

    graph = mc.trace(f,
                     ((4,), dtype), ((4,), dtype), ((4,), dtype), ((), dtype), ((4,), dtype),
                     ((1,), dtype))
    (group,) = fusion_groups(graph, min_size=1)
    role = {x.key: k for k, x in enumerate(graph.inputs)}
    return group, [role[x.key] for x in group.inputs]


# per input of _level_group (a..e, by role) and per output: (kind, row width, column, per column)
LEVEL_OPERANDS = {0: ("batch", 7, 2, True), 1: ("level", 5, 1, True), 2: ("shared", 0, 3, True),
                  3: ("shared", 0, 0, False), 4: ("zero", 4, 0, True), 5: ("batch", 1, 0, False)}
LEVEL_OUTPUTS = (("batch", 8, 4, True), ("level", 4, 0, True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_fused_group_on_a_level_of_whole_arrays_compiles_and_equals_numpy_on_the_views(dtype):
    from minicavs import csource

    group, roles = _level_group(dtype)
    operands = tuple(LEVEL_OPERANDS[r] for r in roles) + LEVEL_OUTPUTS
    source = windows.level_source(csource.elementwise_source(group, dtype), operands, 4)
    ptx = nvrtc.compile_to_ptx(source.code, source.name, arch="compute_90", options=AS_CUPY)
    assert nvrtc.ptx_entries(ptx) == [source.name]
    rng = np.random.default_rng(2)
    n, lo = 3, 5  # the level: rows 5..7 of a batch of 10
    a, b, c = (rng.normal(size=s).astype(dtype) for s in ((10, 7), (n, 5), (9,)))
    d, e = np.asarray(rng.normal(), dtype), rng.normal(size=(10, 1)).astype(dtype)
    y0, y1 = rng.normal(size=(10, 8)).astype(dtype), np.empty((n, 4), dtype)
    want0 = y0.copy()
    by_role = {0: a, 1: b, 2: c, 3: d, 5: e}
    windows.Launcher(source, runner="shim")(
        [by_role[r] for r in roles if r != 4] + [y0, y1], n, lo)
    av, ev = a[lo:lo + n, 2:6], e[lo:lo + n]
    want0[lo:lo + n, 4:] = np.tanh(av * b[:, 1:] + c[3:7]) - d * 0 + ev
    tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-13)
    np.testing.assert_allclose(y0, want0, **tol)  # (other rows and columns untouched)
    np.testing.assert_allclose(y1, (av * b[:, 1:] + c[3:7]) * ev, **tol)


def _mul_group(dtype):
    """y = a * b (one op) as the group a per-row tensor kernel computes."""
    import minicavs as mc
    from minicavs import csource
    from minicavs.runtime.analysis import fusion_groups

    graph = mc.trace(lambda a, b: a * b, ((2, 3), dtype), ((2, 3), dtype))
    (group,) = fusion_groups(graph, min_size=1)
    return csource.elementwise_source(group, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("summed", [(), (1,), (0,), (0, 1)])
def test_a_per_row_tensor_kernel_broadcasts_sums_and_equals_numpy(dtype, summed):
    """Rows of (2, 3) elements on a level (rows 5..7 of a batch): a batch value with its rows
    9 apart, read at an offset and broadcast along axis 0 (a (1, 3) row, RNTN's x), times a
    (2, 3) block of the level — every element written, or summed over the row's axes
    ``summed`` (the RNTN's bilinear term: axis 1), into rows 7 apart (keepdims: size 1 left)
    — and a zero input (no parameter: 0 read)."""
    source = _mul_group(dtype)
    dims = (2, 3)
    kept = [k for k in range(2) if k not in summed]
    out_steps = [0, 0]  # (0 along a summed axis)
    for k, step in zip(kept, packed_strides([dims[k] for k in kept])):
        out_steps[k] = step
    operands = ((9, (0, 1)), (6, (3, 1)), (7, tuple(out_steps)))
    made = windows.tensor_source(source, operands, dims, summed)
    ptx = nvrtc.compile_to_ptx(made.code, made.name, arch="compute_90", options=AS_CUPY)
    assert nvrtc.ptx_entries(ptx) == [made.name]
    rng = np.random.default_rng(3)
    n, lo = 3, 5
    a, b = rng.normal(size=(10, 9)).astype(dtype), rng.normal(size=(n, 6)).astype(dtype)
    out = rng.normal(size=(n, 7)).astype(dtype)
    want_out = out.copy()
    x = a[lo:lo + n, 2:5][:, None, :]  # (the level's first row at column 2)
    product = x * b.reshape(n, 2, 3)
    want = product.sum(axis=tuple(k + 1 for k in summed)) if summed else product
    want_out[:, :want.reshape(n, -1).shape[1]] = want.reshape(n, -1)
    windows.Launcher(made, runner="shim")([a.reshape(-1)[lo * 9 + 2:], b, out], n, lo)
    np.testing.assert_allclose(out, want_out, rtol=1e-6 if dtype == np.float32 else 1e-13)
    zero = windows.tensor_source(source, ((None,) + operands[1:]), dims, summed)
    windows.Launcher(zero, runner="shim")([b, out], n, lo)
    np.testing.assert_array_equal(out[:, :want.reshape(n, -1).shape[1]], 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_c_issuers_kernels_compile_with_nvrtc(dtype):
    """The zero-rows kernel of a level's buffer clears and the few-row product kernel of
    cuda/products.py (both layouts of B), as CuPy compiles them."""
    from minicavs.cuda import blas, products

    sources = [(windows.zero_source(5, 8, dtype).code, windows.zero_source(5, 8, dtype).name)]
    sources += [products.product_source(np.dtype(dtype), op)[::-1]
                for op in (blas.OP_N, blas.OP_T)]
    for code, name in sources:
        ptx = nvrtc.compile_to_ptx(code, name, arch="compute_90", options=AS_CUPY)
        assert nvrtc.ptx_entries(ptx) == [name]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_autobatchs_own_sources_compile_with_nvrtc(dtype):
    """The kernels autobatched batches issued from C add (autobatch/launches.py): a concat of
    column windows, a gradient added into some columns of rows; they run on the emulated
    device's shim in tests/test_cuda_emulated.py."""
    from minicavs.autobatch import launches

    for source in (launches._concat_source((3, 3, 1), dtype),
                   launches._add_source(6, 3, 10, dtype)):
        ptx = nvrtc.compile_to_ptx(source.code, source.name, arch="compute_90", options=AS_CUPY)
        assert nvrtc.ptx_entries(ptx) == [source.name]
