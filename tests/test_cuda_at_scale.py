"""The CUDA layer on a GPU at the sizes it meets in training, not one block's worth.

Every test here carries the ``gpu`` marker: ``pytest -m gpu`` runs them with the other GPU tests
of the suite (``HYPOTHESIS_PROFILE=gpu`` for many examples); where no GPU is visible they are
skipped, with the reason. What they look for cannot be seen on the CPU (minicavs/cuda/README.md):

* row kernels and a fused kernel past 2**24 ≈ 16.7 M elements (where a float index or a 32-bit
  element count would go wrong), equal to their NumPy twins bit for bit (fused: to rounding);
* heavy-duplicate scatters — 1 M rows into 10 target rows, 20 times: the deterministic kernel
  gives the same bits every run, equal to NumPy's sequential sum (float32 subnormals included,
  which CuPy's -ftz=true would flush in a plain "+"), and the atomic kernel stays within its
  rounding and flush-to-zero bound on every run;
* the vertex runtime at H = 512 over 256 trees and DAGs, on one stream and on two, equal to the
  NumPy runtime: forward values and every gradient.
"""

import functools

import numpy as np
import pytest

import minicavs as mc
from minicavs.runtime.executor import NumpyFusedKernel
from minicavs.cuda import kernels
from minicavs.cuda.streams import SIDE
from minicavs.data import random_binary_tree

from test_cuda_kernels import assert_bits_equal, atomic_bound
from vertex_cells import binary_tree_lstm, child_sum_tree_lstm

pytestmark = pytest.mark.gpu

PAST_2_24 = (1 << 24) + 4099  # elements: past 16.7 M, and not a multiple of a block
DTYPES = [np.float32, np.float64]
IDS = ["float32", "float64"]


def _cupy():
    mc.set_device("cuda")
    import cupy

    return cupy


def _with_subnormals(array, rng, share=0.01):
    """``array`` with a share of its entries replaced by float32 subnormals of either sign."""
    tiny = np.finfo(np.float32).tiny
    where = rng.random(array.shape) < share
    return np.where(where, rng.uniform(-tiny, tiny, array.shape), array).astype(array.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gpu_row_kernels_past_16_7_million_elements(dtype):
    cupy = _cupy()
    rng = np.random.default_rng(0)
    row = 17
    src = _with_subnormals(rng.standard_normal((PAST_2_24 // row + 1, row)).astype(dtype), rng)
    n = src.shape[0]
    assert src.size > 1 << 24
    idx = rng.integers(-1, n, n + 5).astype(np.int32)
    d_src, d_idx = cupy.asarray(src), cupy.asarray(idx)
    assert_bits_equal(kernels.gather_rows(d_src, d_idx).get(), kernels.gather_rows_numpy(src, idx))
    child_idx = rng.integers(-1, n, (n // 2, 2)).astype(np.int32)
    assert_bits_equal(kernels.gather_children(d_src, cupy.asarray(child_idx)).get(),
                      kernels.gather_children_numpy(src, child_idx))
    order = rng.permutation(n).astype(np.int32)
    d_order = cupy.asarray(order)
    level = kernels.pull_rows(d_src, d_order)
    assert_bits_equal(level.get(), kernels.gather_rows_numpy(src, order))
    assert_bits_equal(kernels.push_rows(level, d_order).get(), src)
    dst = rng.permutation(n).astype(np.int32)
    dst[::7] = -1
    out = np.zeros_like(src)
    assert_bits_equal(kernels.copy_rows(d_src, d_idx[:n], cupy.zeros_like(d_src),
                                        cupy.asarray(dst)).get(),
                      kernels.copy_rows_numpy(src, idx[:n], out, dst))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gpu_fused_kernel_past_16_7_million_elements(dtype):
    cupy = _cupy()
    from minicavs.cuda import fusion
    from test_cuda_fusion import cell_groups, random_inputs

    (where, group), = [(w, g) for w, g in cell_groups("binary_tree_lstm", dtype)
                       if w == "F core" and len(g) > 10]
    width = 4  # H of the test cell: a (V, 4) task of PAST_2_24 / 4 vertices
    inputs = random_inputs(group, dtype, PAST_2_24 // width, 0, np.random.default_rng(1))
    assert max(a.size for a in inputs) > 1 << 24
    want = NumpyFusedKernel(group, np, dtype)(*inputs)
    got = fusion.CupyFusedKernel(group, cupy, dtype)(*[cupy.asarray(a) for a in inputs])
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    for p, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.get(), w, err_msg=f"{where} output {p}", **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gpu_heavy_duplicate_scatters_are_stable_and_bounded(dtype):
    cupy = _cupy()
    rng = np.random.default_rng(2)
    rows, targets, row = 1_000_000, 10, 8
    values = _with_subnormals(rng.standard_normal((rows, row)).astype(dtype), rng, share=0.05)
    idx = rng.integers(-1, targets, rows).astype(np.int32)
    out = _with_subnormals(rng.standard_normal((targets, row)).astype(dtype), rng, share=0.2)
    want = kernels.scatter_add_rows_numpy(values, idx, out.copy())
    bound = atomic_bound(values, idx, out)
    d_values, d_idx, d_out = (cupy.asarray(a) for a in (values, idx, out))
    plan = kernels.scatter_plan(d_idx, targets)
    first = None
    for run in range(20):
        det = kernels.scatter_add_rows(d_values, d_idx, d_out.copy(), deterministic=True,
                                       plan=plan if run % 2 else None).get()
        first = det if first is None else first
        assert_bits_equal(det, first)  # the same bits on every run ...
        atomic = kernels.scatter_add_rows(d_values, d_idx, d_out.copy()).get()
        assert np.all(np.abs(atomic.astype(np.float64) - want) <= bound), f"run {run}"
    assert_bits_equal(first, want)  # ... and they are NumPy's sequential sum


def _random_dag(rng, num_vertices, arity):
    """Children numbered below their parents, picked from every earlier vertex: shared
    children (several parents) are common, and several roots."""
    children = [[] for _ in range(num_vertices)]
    for v in range(num_vertices // 3, num_vertices):
        k = int(rng.integers(1, arity + 1))
        children[v] = sorted(int(c) for c in rng.choice(v, size=min(k, v), replace=False))
    return mc.InputGraph(children)


def _forest(rng, arity):
    graphs = [mc.InputGraph(random_binary_tree(int(rng.integers(2, 40)), rng).children)
              for _ in range(224)]
    graphs += [_random_dag(rng, int(rng.integers(3, 60)), arity) for _ in range(32)]
    return mc.GraphBatch(graphs)


@functools.lru_cache(maxsize=None)
def _numpy_runtime(cell, dtype, arity):
    """The NumPy runtime's results on the batch (the same for either stream setting)."""
    batch = _forest(np.random.default_rng(5), arity)
    return batch, _runtime(cell, dtype, "cpu", batch, streams_on=False)


def _runtime(cell, dtype, device, batch, streams_on, E=64, H=512):
    F, params = cell(E, H, np.random.default_rng(3), dtype=np.dtype(dtype).name,
                     options={"streams": streams_on})
    side = [ins for program in (F.program, F.backward_program)
            for ins in program.eager + program.lazy if ins.stream == SIDE]
    assert bool(side) == streams_on  # two streams really are two here
    if device == "cuda":
        cupy = _cupy()
        for p in params:
            p.data = cupy.asarray(p.data)
    rng = np.random.default_rng(4)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)).astype(dtype), device=device,
                  requires_grad=True)
    weights = mc.tensor(rng.standard_normal((batch.num_vertices,) + F.push_shape)
                        .astype(dtype), device=device)
    out = F(batch, pull=X)
    ((out * weights).sum() + (out * out).sum()).backward()
    return [out.numpy(), X.grad.numpy()] + [p.grad.numpy() for p in params]


@pytest.mark.parametrize("streams_on", [True, False], ids=["two-streams", "one-stream"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("cell, arity", [(binary_tree_lstm, 2), (child_sum_tree_lstm, 4)],
                         ids=["binary", "child-sum"])
def test_gpu_runtime_at_h512_over_256_trees_and_dags(cell, arity, dtype, streams_on):
    batch, want = _numpy_runtime(cell, dtype, arity)
    assert batch.num_graphs == 256 and not batch.is_forest  # the DAGs share children
    got = _runtime(cell, dtype, "cuda", batch, streams_on)
    names = ["pushed outputs", "grad X"] + [f"grad param {k}" for k in range(len(got) - 2)]
    for name, g, w in zip(names, got, want):
        # Gradients of W sum over every vertex; GEMMs sum in another order on each side.
        scale = np.max(np.abs(w), initial=1.0)
        tol = 1e-9 if dtype == np.float64 else 2e-3
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale,
                                   err_msg=f"{cell.__name__} {name}")
