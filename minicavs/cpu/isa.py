"""The instruction sets the hand-written kernels are written for, and which one runs here.

A register-blocked kernel is fast only while its block fits the registers: a block of 6 rows by
4 vectors of 64 bytes (24 accumulators, 4 loads of B, one broadcast of A: 29 registers) fits
AVX-512's 32 zmm registers; on AVX2's 16 ymm registers the same C is split into twice as many
256-bit halves and spills (measured on an AVX2 EPYC: (64, 256) @ (256, 1024) float32 in 9.8 ms
against 0.43 ms for NumPy's BLAS). So each kernel is compiled once per target, in one source
(:func:`variants`), with the block the target's register count allows — as BLIS has a
micro-kernel per instruction set (6 x 16 floats on Haswell):

========  ===============  =============  ==========================================
target    vector, regs     block MR x NV  registers used (MR NV + NV + 1)
========  ===============  =============  ==========================================
avx512    64 B, 32         6 x 4          29
avx2      32 B (FMA), 16   6 x 2          15
portable  16 B, 16         6 x 2          15 (SSE2's 16 xmm; NEON has 32)
========  ===============  =============  ==========================================

``MINICAVS_CPU_TARGET`` (``avx512``, ``avx2``, ``portable``) forces one (tests force each);
otherwise the widest the CPU has runs. A target the CPU lacks is an error, not a crash.
"""

import collections
import functools
import os
import platform

from ..errors import ArgumentError

Target = collections.namedtuple("Target", "pragma vector rows vectors registers needs")
TARGETS = {  # gcc target pragma, vector bytes, block MR x NV, vector registers, CPU flags
    "avx512": Target("avx512f,avx2,fma", 64, 6, 4, 32, ("avx512f", "fma")),
    "avx2": Target("avx2,fma", 32, 6, 2, 16, ("avx2", "fma")),
    "portable": Target(None, 16, 6, 2, 16, ()),
}
ENVIRONMENT = "MINICAVS_CPU_TARGET"


@functools.lru_cache(maxsize=None)
def cpu_flags():
    """The CPU's feature flags (``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def x86():
    return platform.machine().lower() in ("x86_64", "amd64")


def runs_here(name):
    """Whether this CPU can run the ``name`` variant."""
    needs = TARGETS[name].needs
    return not needs or (x86() and all(flag in cpu_flags() for flag in needs))


def target():
    """The variant the kernels run: ``MINICAVS_CPU_TARGET``, else the widest this CPU runs."""
    chosen = os.environ.get(ENVIRONMENT, "").strip().lower()
    if not chosen:
        return next(name for name in TARGETS if runs_here(name))
    if chosen not in TARGETS:
        raise ArgumentError(f"environment variable {ENVIRONMENT}={chosen!r} is not one of "
                            f"{', '.join(TARGETS)}; unset it to pick the CPU's widest")
    if not runs_here(chosen):
        raise ArgumentError(f"environment variable {ENVIRONMENT}={chosen} asks for "
                            f"instructions this CPU lacks (it needs "
                            f"{', '.join(TARGETS[chosen].needs)}); unset it, or pick one of "
                            f"{', '.join(n for n in TARGETS if runs_here(n))}")
    return chosen


def describe(name=None):
    """One line for people: the target, its vectors and register block."""
    name = name or target()
    width, rows, vectors = TARGETS[name].vector, TARGETS[name].rows, TARGETS[name].vectors
    return (f"{name} ({width}-byte vectors, {rows} x {vectors} register block = {rows} x "
            f"{vectors * width // 4} float32)")


def variants(text, unit=""):
    """``text`` (C++ using ``VB``, ``MR``, ``NV``, ``REGS`` and prefixing its exported names
    with ``NAME_``) once per target, each in its own namespace and compiled for its instructions
    (``#pragma GCC target``): every variant is in the library (so every one is compiled and
    tested for compiling everywhere), and the caller picks which one runs. The x86 variants
    are left out on other machines. ``unit`` begins each (``build.UNIT``: then each compiles
    beside the others, after the source's preamble)."""
    parts = []
    for name, (pragma, width, rows, vectors, registers, _) in TARGETS.items():
        body = (f"namespace {name} {{\nconstexpr int VB = {width}, MR = {rows}, NV = {vectors}, "
                f"REGS = {registers};\n" + text.replace("NAME_", f"{name}_")
                + f"}}  // namespace {name}\n")
        if pragma:
            body = (f"#if defined(__x86_64__)\n#pragma GCC push_options\n"
                    f"#pragma GCC target(\"{pragma}\")\n{body}#pragma GCC pop_options\n#endif\n")
        parts.append(unit + body)
    return "\n".join(parts)
