"""The host time of the calls a GPU level step is made of, on the GPU at hand (issue 41).

    python benchmarks/cuda_host_costs.py          # on a machine with a GPU and CuPy

At the sizes of a level step the GPU waits on the host (run 6 in minicavs/cuda/README.md), so
what matters is the microseconds Python and CuPy take to issue each call, not the kernel's
time. Each row times a call issued many times in a row (the median of 5 rounds of 200 calls,
the device synchronised after each round: with a full launch queue the host would wait on the
device, which is not what is measured here), for a level's shapes (64 rows, H = 256): CuPy's
matmul against cuda/blas.py's direct cuBLAS call, for whole arrays and column windows; a
generated kernel's launch through ``RawKernel``; an element-wise ufunc; ``empty``; a small
host-to-device copy; a device-to-host read (a synchronisation). Then the floors a native
launcher would stand on: the same kernel launched by CuPy with nothing of ours around it, and
by the driver's ``cuLaunchKernel`` through ctypes; the bare cuBLAS binding; and the direct
product when every call has a different number of rows, as a level loop's do (cuBLAS picks its
kernel per shape). Before timing, the direct products and the driver's launch are checked
against CuPy's. On the emulated device (``MINICAVS_CUDA_EMULATE=1``) it
runs, but its times are the CPU's arithmetic, not a GPU's host cost.
"""

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUNDS, CALLS = 5, 200


def host_us(call, sync):
    """Median over rounds of the host microseconds one ``call()`` takes, issued back to back."""
    call()
    sync()
    rounds = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        for _ in range(CALLS):
            call()
        rounds.append((time.perf_counter() - began) / CALLS * 1e6)
        sync()
    return statistics.median(rounds)


def driver_launch(cp, kernel, blocks, threads, args):
    """``launch()``: ``kernel`` (a compiled ``cupy.RawKernel``) on ``blocks`` x ``threads`` run by
    ``cuLaunchKernel`` from ctypes with ``args`` (device arrays and ints) packed once; None where
    the driver library cannot be loaded."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    values = [ctypes.c_void_p(a.data.ptr) if hasattr(a, "data") else ctypes.c_longlong(a)
              for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    function = ctypes.c_void_p(kernel.kernel.ptr)
    stream = ctypes.c_void_p(cp.cuda.get_current_stream().ptr)
    launch_kernel = libcuda.cuLaunchKernel

    def launch(values=values):  # (values: the argument cells params points to, kept alive)
        status = launch_kernel(function, blocks, 1, 1, threads, 1, 1, 0, stream, params, None)
        if status:
            raise SystemExit(f"cuLaunchKernel failed: CUresult {status}")
    return launch


def cublas_direct(handle):
    """``sgemm(*args)``: ``cublasSgemm_v2`` of the libcublas CuPy loaded, called from ctypes on
    CuPy's handle (no ``cublasSetStream`` before each call, as CuPy's binding makes); None
    where it is not loaded."""
    import ctypes

    with open("/proc/self/maps") as maps:
        path = next((line.split()[-1] for line in maps
                     if "/libcublas.so" in line and "libcublasLt" not in line), None)
    if path is None:
        return None
    function = ctypes.CDLL(path).cublasSgemm_v2
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    function.argtypes = [pointer] + [integer] * 5 + [pointer, pointer, integer, pointer, integer,
                                                        pointer, pointer, integer]

    def sgemm(*args):
        status = function(handle, *args)
        if status:
            raise SystemExit(f"cublasSgemm_v2 failed: status {status}")
    return sgemm


def main():
    from minicavs import backend
    from minicavs.cuda import blas, kernels

    cp = backend.cupy_or_error()
    sync = cp.cuda.Device().synchronize
    rng = np.random.default_rng(0)
    rows, H = 64, 256
    x = cp.asarray(rng.standard_normal((rows, 2 * H)).astype(np.float32))
    wide = cp.asarray(rng.standard_normal((rows, 3 * H)).astype(np.float32))
    window = wide[:, H:3 * H]  # (a window of columns, as a level's gathered children are)
    U = cp.asarray(rng.standard_normal((2 * H, 5 * H)).astype(np.float32))
    out = cp.empty((rows, 5 * H), np.float32)
    transposed = cp.asarray(np.ascontiguousarray(x.get().T)).T  # (as a backward's xᵀ is)
    for a in (x, window, transposed):
        ref = cp.matmul(a, U).get()
        got = blas.matmul(cp, a, U, out).get()
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        if not err < 1e-5:
            raise SystemExit(f"cuda/blas.py's product differs from CuPy's: relative error {err}")
    ids = cp.asarray(rng.integers(0, rows, rows).astype(np.int32))
    gathered = cp.empty((rows, 2 * H), np.float32)
    small = np.arange(rows, dtype=np.int32)
    raw = kernels.raw_kernel("gather_rows", np.float32)
    raw_args = (x, ids, gathered, rows, 2 * H)
    blocks = min(-(-rows * 2 * H // kernels.BLOCK_SIZE), kernels.MAX_BLOCKS)
    cupy_args = tuple(np.int64(a) if isinstance(a, int) else a for a in raw_args)
    raw((blocks,), (kernels.BLOCK_SIZE,), cupy_args)
    by_driver = None if backend.cuda_emulated() else \
        driver_launch(cp, raw, blocks, kernels.BLOCK_SIZE, raw_args)
    if by_driver is not None:
        expected = gathered.get()
        gathered.fill(0)
        by_driver()
        if not np.array_equal(gathered.get(), expected):
            raise SystemExit("cuLaunchKernel's gather differs from CuPy's launch of it")
    many = cp.asarray(rng.standard_normal((1024, 2 * H)).astype(np.float32))
    many_out = cp.empty((512, 5 * H), np.float32)
    sizes = iter(np.tile(rng.permutation(np.arange(1, 513)), 64).tolist())
    for m in range(1, 513):  # (each shape's call planned once: then only cuBLAS sees new ones)
        blas.matmul(cp, many[:m], U, many_out[:m])
    handle, address = cp.cuda.get_cublas_handle(), kernels.device_address(cp)
    alpha, beta = blas._ALPHA_BETA[np.dtype(np.float32)]
    pu, px, po = address(U), address(x), address(out)
    direct = None if backend.cuda_emulated() else cublas_direct(handle)
    if direct is not None:
        expected = out.get()
        out.fill(0)
        direct(blas.OP_N, blas.OP_N, 5 * H, rows, 2 * H, alpha, pu, 5 * H, px, 2 * H, beta, po,
               5 * H)
        if not np.allclose(out.get(), expected, rtol=1e-4, atol=1e-3):
            raise SystemExit("cublasSgemm_v2 from ctypes differs from blas.matmul")
    pm, pmo = address(many), address(many_out)
    sizes_direct = iter(np.tile(rng.permutation(np.arange(1, 513)), 64).tolist())
    cases = [
        ("cupy.matmul, whole arrays", lambda: cp.matmul(x, U, out=out)),
        ("blas.matmul, whole arrays", lambda: blas.matmul(cp, x, U, out)),
        ("cupy.matmul, a column window", lambda: cp.matmul(window, U, out=out)),
        ("blas.matmul, a column window", lambda: blas.matmul(cp, window, U, out)),
        ("RawKernel launch (gather_rows)",
         lambda: kernels.gather_rows(x, ids, gathered, check_indices=False)),
        ("element-wise ufunc (tanh, out=)", lambda: cp.tanh(out, out=out)),
        ("cupy.empty", lambda: cp.empty((rows, 5 * H), np.float32)),
        ("host -> device, 64 int32", lambda: cp.asarray(small)),
        ("device -> host, one value (a sync)", lambda: float(out[0, 0])),
        ("the same kernel, CuPy's launch alone", lambda: raw((blocks,), (kernels.BLOCK_SIZE,),
                                                             cupy_args)),
        ("the same kernel, cuLaunchKernel (ctypes)", by_driver),
        ("cuBLAS sgemm binding alone", lambda: cp.cuda.cublas.sgemm(
            handle, blas.OP_N, blas.OP_N, 5 * H, rows, 2 * H, alpha, pu, 5 * H, px, 2 * H, beta,
            po, 5 * H)),
        ("blas.matmul, 1-512 rows, each call new",
         lambda: (lambda m: blas.matmul(cp, many[:m], U, many_out[:m]))(next(sizes))),
        ("cublasSgemm_v2 (ctypes)", direct and (lambda: direct(
            blas.OP_N, blas.OP_N, 5 * H, rows, 2 * H, alpha, pu, 5 * H, px, 2 * H, beta, po,
            5 * H))),
        ("cublasSgemm_v2 (ctypes), rows vary", direct and (lambda: direct(
            blas.OP_N, blas.OP_N, 5 * H, next(sizes_direct), 2 * H, alpha, pu, 5 * H, pm, 2 * H,
            beta, pmo, 5 * H))),
    ]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CuPy {getattr(cp, '__version__', '(emulated)')}: "
          f"host µs per call ({rows} rows, H = {H}; median of {ROUNDS} rounds of {CALLS})")
    for name, call in cases:
        print(f"  {name:<42} " + ("     n/a (needs a GPU)" if call is None else
                                  f"{host_us(call, sync):8.1f}"))
    # A level's product issued from C, cuBLAS's or our kernel (cuda/products.py), device time
    # included: what its choice measures, for the Tree-LSTM-256's shapes (F's, ∂F's).
    from minicavs.cuda import issuer, products

    driver = issuer.driver(cp)
    if isinstance(driver, str):
        print(f"  products issued from C: n/a ({driver})")
        return
    for op_b, k, n_cols in ((blas.OP_N, 2 * H, 5 * H), (blas.OP_T, 5 * H, 2 * H)):
        print(f"  a level's product ({'xW' if op_b == blas.OP_N else 'xWᵀ'}, K {k}, N {n_cols})"
              f" issued from C, µs per call, ours / cuBLAS:")
        for n, own, cublas in products.timings(driver, np.float32, op_b, k, n_cols):
            print(f"    {n:>4} rows {own * 1e6:8.1f} {cublas * 1e6:8.1f}")


if __name__ == "__main__":
    main()
