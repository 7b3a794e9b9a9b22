"""The host time of the calls a GPU level step is made of, on the GPU at hand (issue 41).

    python benchmarks/cuda_host_costs.py          # on a machine with a GPU and CuPy

At the sizes of a level step the GPU waits on the host (run 6 in minicavs/cuda/README.md), so
what matters is the microseconds Python and CuPy take to issue each call, not the kernel's
time. Each row times a call issued many times in a row (the median of 5 rounds of 200 calls,
the device synchronised after each round: with a full launch queue the host would wait on the
device, which is not what is measured here), for a level's shapes (64 rows, H = 256): CuPy's
matmul against cuda/blas.py's direct cuBLAS call, for whole arrays and column windows; a
generated kernel's launch through ``RawKernel``; an element-wise ufunc; ``empty``; a small
host-to-device copy; a device-to-host read (a synchronisation). Before timing, the direct
products are checked against CuPy's. On the emulated device (``MINICAVS_CUDA_EMULATE=1``) it
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
    ]
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"CuPy {getattr(cp, '__version__', '(emulated)')}: "
          f"host µs per call ({rows} rows, H = {H}; median of {ROUNDS} rounds of {CALLS})")
    for name, call in cases:
        print(f"  {name:<38} {host_us(call, sync):8.1f}")


if __name__ == "__main__":
    main()
