"""Subnormal floats flushed to zero: ``mc.set_flush_denormal(True)``, as PyTorch's.

A float32 below 1.2e-38 is *subnormal*. Training makes them: a saturated gate's derivative
(``sigmoid(x) * (1 - sigmoid(x))`` far from zero) times a small gradient, step after step. On
Intel cores each operation reading or writing one takes a microcode assist, a hundred cycles
or more; AMD's Zen cores pay little. Measured on a 2-core Ice Lake Xeon, the Tree-LSTM
classifier (hidden 256, SGD) stepping over the same three batches of 64 trees: 99-125 ms a
step at first, 170-675 ms from the fourth step on as its values went subnormal, and 83-115 ms
throughout with them flushed. (The C reference of the benchmark is built with ``-ffast-math``,
which flushes them in the whole process.)

Flushing sets two bits of the x86 SSE control register, per thread: FTZ (results that would be
subnormal are zero) and DAZ (subnormal inputs read as zero). :func:`set_flush_denormal` sets
them on the calling thread — NumPy's ufuncs and single-thread products run there — and on
every thread of the native team (OpenMP's pool, which keeps its threads); OpenBLAS's pool is
shut down, to be made again by its next threaded product from this thread, whose setting new
threads inherit (only while no other Python thread runs, as one could be inside a BLAS call;
then OpenBLAS's threads keep theirs). It changes results only below 1.2e-38 (float32;
2.2e-308 for float64), where IEEE keeps gradual underflow and this gives zero — which is why
it is off unless asked for, as in PyTorch: other code in the process computes with the same
registers.
"""

import ctypes
import functools

from ..errors import ArgumentError
from . import blas, build, isa

SOURCE = r"""// minicavs: flush subnormal floats to zero (minicavs/cpu/denormals.py)
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MINICAVS_HAS_MXCSR 1
#endif

namespace {
const unsigned kFlushBits = 0x8040;  // FTZ (bit 15) and DAZ (bit 6) of MXCSR

void apply(int on) {
#ifdef MINICAVS_HAS_MXCSR
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | kFlushBits) : (csr & ~kFlushBits));
#else
  (void)on;
#endif
}
}  // namespace

// Sets or clears both bits on this thread and on each thread of a team of `threads`
// (OpenMP keeps its threads between regions).
extern "C" void minicavs_set_flush_denormal(int on, int threads) {
  apply(on);
  #pragma omp parallel num_threads(threads)
  apply(on);
}

// Whether this thread flushes now (both bits set).
extern "C" int minicavs_flushes_denormal(void) {
#ifdef MINICAVS_HAS_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return 0;
#endif
}
"""


@functools.lru_cache(maxsize=None)
def _library():
    lib = build.module_library(SOURCE, "denormals", "minicavs/cpu/denormals.py")
    lib.minicavs_set_flush_denormal.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.minicavs_set_flush_denormal.restype = None
    lib.minicavs_flushes_denormal.restype = ctypes.c_int
    return lib


def supported():
    """Whether this machine can flush: x86 with native code on (``build.unavailable``)."""
    return isa.x86() and build.unavailable() is None


def set_flush_denormal(enabled):
    """Flush subnormal floats (below 1.2e-38 in float32) to zero (``True``), or keep IEEE's
    gradual underflow (``False``, the default), on this thread, the native team and
    OpenBLAS's threads. On Intel cores every operation on a subnormal costs a microcode
    assist: a Tree-LSTM whose gradients go subnormal trained 2-6x slower a step on an Ice
    Lake Xeon (``minicavs/cpu/denormals.py``). Returns whether it is supported here — False,
    and nothing changed, where it is not (not x86, native code off), as
    ``torch.set_flush_denormal`` does."""
    if not isinstance(enabled, bool):
        raise ArgumentError(f"set_flush_denormal(enabled): expected True or False, got "
                            f"{enabled!r} ({type(enabled).__name__})")
    if not supported():
        return False
    from .team import team_size

    _library().minicavs_set_flush_denormal(int(enabled), max(team_size(), 1))
    blas.restart_threads()
    return True


def flushes_denormal():
    """Whether the calling thread flushes subnormal floats to zero now."""
    return supported() and bool(_library().minicavs_flushes_denormal())
