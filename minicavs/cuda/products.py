"""A level's product of its rows with a shared matrix on the GPU: cuBLAS, or a kernel of our own
where it measures faster on this GPU.

A level step's product ``C = A · B`` (A: the level's n rows of K; B: a shared K x N matrix,
row-major or the transpose of one; C: n rows of N) has few rows, and the GPU idles between a
level's launches: what a product costs is the host's time to issue it. cuBLAS takes 11–35 µs of
it a call whatever the size (an H200, ``benchmarks/cuda_host_costs.py``), a kernel launched
from C 4–6 µs. :func:`product_source` is such a kernel: each thread computes 4 rows x 4 columns
of C, reading A's rows (the same for the threads of a row group: from cache) and B's rows or
columns; no shared memory, so the g++ shim runs it on the CPU. Which of the two a level runs is
measured, not assumed: :func:`most_rows` times both through the C issuer, per dtype, B's layout,
K and N, at 1 to 256 rows, and keeps the largest row count up to which ours was faster (0:
cuBLAS always). ``MINICAVS_KERNELS=own`` or ``=blas`` forces one (``cpu/calibrate.py``); on the
emulated device nothing is timed, so cuBLAS's stand-in runs unless ours is forced.
"""

import functools
import time
from string import Template

import numpy as np

from . import blas, issuer
from .kernels import DTYPES, device_address, make_kernel

_SOURCE = """
extern "C" __global__ void ${name}(const ${T}* __restrict__ a, const ${T}* __restrict__ b,
                                   ${T}* __restrict__ c, const long long lda,
                                   const long long ldb, const long long ldc, const long long N,
                                   const long long K, const long long n, const long long lo)
{
    const long long W = (N + 3) / 4, total = (n + 3) / 4 * W;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)blockDim.x * gridDim.x) {
        const long long r0 = e / W * 4, c0 = e % W * 4;
        ${T} acc[4][4];
        for (int r = 0; r < 4; ++r)
            for (int q = 0; q < 4; ++q) acc[r][q] = (${T})0;
        for (long long k = 0; k < K; ++k) {
            ${T} x[4], y[4];
            for (int r = 0; r < 4; ++r) x[r] = r0 + r < n ? a[(r0 + r) * lda + k] : (${T})0;
            for (int q = 0; q < 4; ++q) y[q] = c0 + q < N ? b[${b_at}] : (${T})0;
            for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) acc[r][q] = fma(x[r], y[q], acc[r][q]);
        }
        for (int r = 0; r < 4; ++r)
            for (int q = 0; q < 4; ++q)
                if (r0 + r < n && c0 + q < N) c[(r0 + r) * ldc + c0 + q] = acc[r][q];
    }
}
"""
ROWS_MEASURED = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ALWAYS = 2**62  # (forced: ours at any row count)


@functools.lru_cache(maxsize=None)
def product_source(dtype, op_b):
    """``(name, CUDA source)`` of our product kernel for ``dtype`` and B's layout
    (``blas.OP_N``: row-major, rows ``ldb`` apart; ``blas.OP_T``: the transpose of one)."""
    t, suffix = DTYPES[np.dtype(dtype)]
    b_at = "k * ldb + c0 + q" if op_b == blas.OP_N else "(c0 + q) * ldb + k"
    name = f"minicavs_rows_product_{suffix}_{'nt'[op_b]}"
    return name, Template(_SOURCE).substitute(name=name, T=t, b_at=b_at)


@functools.lru_cache(maxsize=None)
def _kernel(dtype, op_b, xp):
    name, code = product_source(dtype, op_b)
    if getattr(xp, "emulated", False):  # (the driver's own stand-in, whatever CuPy is here)
        return xp.RawKernel(code, name)
    return make_kernel(code, name, "cupy")


def row_product(driver, weight, dtype, at_a, lda, at_b, at_c, ldc, add=False):
    """The issuer's operation (its integers) for ``C = A · weight`` (``add``: ``C +=``, cuBLAS
    with β = 1) over a level's or batch's rows — A ``dtype`` rows ``lda`` apart, C rows ``ldc``
    apart, the operands given as ``(slot, row bytes, offset)`` — our kernel up to the rows it
    measured faster at, else cuBLAS; None where cuBLAS cannot take them as they are (another
    dtype or layout)."""
    layout, gemm_dtype = blas.operand(weight), issuer.gemm_dtype(dtype)
    if layout is None or gemm_dtype is None or weight.dtype != np.dtype(dtype):
        return None
    (op_b, ldb), k, n_cols = layout, weight.shape[0], weight.shape[1]
    gemm = [gemm_dtype + add * issuer.ADD, op_b, blas.OP_N, n_cols, k, *at_b, ldb, *at_a, lda,
            *at_c, ldc]
    most = 0 if add else most_rows(driver, dtype, op_b, k, n_cols)  # (ours only writes C)
    if most:  # (our kernel up to that many rows, measured faster here)
        return [issuer.PRODUCT, most] + launch_body(driver, dtype, op_b, at_a, at_b, at_c, lda,
                                                    ldb, ldc, n_cols, k) + gemm
    return [issuer.GEMM] + gemm


def launch_body(driver, dtype, op_b, a, b, c, lda, ldb, ldc, n_cols, k):
    """The issuer's LAUNCH of our kernel (its integers after the operation code; a row of C is
    N / 4 threads), the operands given as ``(slot, row bytes, offset)``."""
    consts = [[issuer.CONST, v, 0, 0] for v in (lda, ldb, ldc, n_cols, k)]
    args = [[issuer.POINTER, *a], [issuer.POINTER, *b], [issuer.POINTER, *c], *consts,
            [issuer.ROWS, 0, 0, 0], [issuer.FIRST, 0, 0, 0]]
    kernel = _kernel(np.dtype(dtype), op_b, driver.xp)
    issuer.check_arguments(kernel, len(args))
    return [driver.function(kernel), -(-n_cols // 4), len(args)] + [
        x for arg in args for x in arg]


_measured = {}  # (dtype, op_b, K, N) -> the most rows ours runs


def most_rows(driver, dtype, op_b, k, n_cols):
    """Up to how many rows our kernel runs this product here (0: cuBLAS always)."""
    from ..cpu import calibrate

    force = calibrate.forced()
    if force is not None:
        return ALWAYS if force == "own" else 0
    if getattr(driver.xp, "emulated", False):
        return 0  # (nothing to time: the stand-ins' times are the CPU's)
    key = (np.dtype(dtype), op_b, k, n_cols)
    found = _measured.get(key)
    if found is None:
        found = _measured[key] = _measure(driver, *key)
    return found


def _measure(driver, dtype, op_b, k, n_cols):
    """The largest of :data:`ROWS_MEASURED` up to which ours was faster at every count."""
    most = 0
    for n, own, cublas in timings(driver, dtype, op_b, k, n_cols):
        if own >= cublas:
            break
        most = n
    return most


def timings(driver, dtype, op_b, k, n_cols, repeats=10):
    """``[(rows, ours, cuBLAS)]``: seconds a product takes at each of :data:`ROWS_MEASURED`
    rows, issued ``repeats`` times in a row through the C issuer as a level issues it (the
    better of two), until ours is the slower: some milliseconds, once per shape a process."""
    xp = driver.xp
    rows = ROWS_MEASURED[-1]
    a = xp.ones((rows, k), dtype)
    b = xp.ones((k, n_cols) if op_b == blas.OP_N else (n_cols, k), dtype)
    c = xp.empty((rows, n_cols), dtype)
    table = np.array([device_address(xp)(x) for x in (a, b, c)], np.int64)
    context = driver.context(table)
    ldb = n_cols if op_b == blas.OP_N else k
    gemm = [issuer.GEMM, issuer.gemm_dtype(dtype), op_b, blas.OP_N, n_cols, k,
            1, 0, 0, ldb, 0, 0, 0, k, 2, 0, 0, n_cols]
    own = [issuer.LAUNCH] + launch_body(driver, dtype, op_b, (0, 0, 0), (1, 0, 0), (2, 0, 0), k,
                                        ldb, n_cols, n_cols, k)
    tables = [issuer.Table(np.array([1] + code, np.int64), lambda op: "a product timed")
              for code in (own, gemm)]
    synchronize = xp.cuda.Device().synchronize
    found = []
    for n in ROWS_MEASURED:
        best = [float("inf"), float("inf")]
        for _ in range(2):
            for which, table in enumerate(tables):
                synchronize()
                began = time.perf_counter()
                for _ in range(repeats):
                    driver.issue(table, 0, n, context)
                synchronize()
                best[which] = min(best[which], (time.perf_counter() - began) / repeats)
        found.append((n, *best))
        if best[0] >= best[1]:
            break
    return found
