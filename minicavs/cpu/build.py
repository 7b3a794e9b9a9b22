"""Compiling generated C++ into a shared library, once: the native backend's code cache.

A source is compiled by the system compiler (``$CXX``, else ``g++``) with :data:`CXX_FLAGS` and
kept on disk under a hash of everything that decides the machine code — the source, the
compiler's version line, the flags and the CPU's feature flags (``-march=native`` code must not
run on another CPU) — as CuPy's kernel cache and TorchInductor's code cache do. A second run,
or a second process, finds the library and compiles nothing.

The flags, and why:

* ``-O3 -march=native``: the loops are vectorised for this CPU (AVX2/AVX-512);
* ``-fopenmp``: rows of a level are split between cores (``#pragma omp parallel for``), and
  ``#pragma omp simd`` loops call glibc's vector math (libmvec: ``_ZGVdN8v_expf`` is 8 ``expf``
  at once);
* ``-mprefer-vector-width=512`` where the CPU has AVX-512 (:func:`cxx_flags`): 16 floats per
  vector, and libmvec's ``_ZGVeN16v_expf``; gcc picks 256-bit vectors without it;
* ``-fno-math-errno -fno-trapping-math -D__FAST_MATH__``: what glibc's ``math.h`` needs to
  declare the vector variants of ``exp``/``tanh``/``log`` — *without* ``-ffast-math``, so NaN and
  infinity keep IEEE semantics, sums are not reassociated, and no ``crtfastmath.o`` is linked
  (it would set flush-to-zero for the whole Python process).

A source that does not compile raises :class:`~minicavs.errors.KernelCompileError` with the
compiler log and the source with line numbers; the generated source names, in comments, the
instruction each block came from.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

from ..cuda.errors import numbered
from ..errors import KernelCompileError, ToolchainError

CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
             "-D__FAST_MATH__", "-fPIC", "-std=c++17", "-w")
# On a CPU with AVX-512, 512-bit vectors (and libmvec's 16-wide exp/tanh): gcc prefers 256
# otherwise. Measured on the fused gate groups of the Tree-LSTM (benchmarks, issue 22).
WIDE_VECTORS = ("-mprefer-vector-width=512",)
LINK_FLAGS = ("-shared", "-fopenmp", "-lmvec", "-lm")
INSTALL_HINT = "install a C++ compiler (apt-get install g++), or set CXX to one"


def unavailable():
    """Why no native code runs in this process (None: it can): ``MINICAVS_NATIVE=0``, or no
    C++ compiler."""
    if os.environ.get("MINICAVS_NATIVE", "1").strip() == "0":
        return "MINICAVS_NATIVE=0 is set"
    try:
        compiler()
    except ToolchainError as exc:
        return str(exc)
    return None


def compiler():
    """``(path, version line)`` of the C++ compiler; raises :class:`ToolchainError` if there is
    none that runs."""
    return find_compiler("native code", INSTALL_HINT)


@functools.lru_cache(maxsize=None)
def find_compiler(user, hint):
    """``(path, version line)`` of ``$CXX``, else g++, for ``user`` (named in the error, with
    ``hint``). Shared by the native backend and the CUDA layer's CPU shim."""
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise ToolchainError(f"no C++ compiler for {user}: '{cxx}' was not found; {hint}")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        raise ToolchainError(f"the C++ compiler '{path}' does not run ({exc}); {hint}")
    return path, version


@functools.lru_cache(maxsize=None)
def cpu_signature():
    """The CPU's model and feature flags: part of the cache key of ``-march=native`` code."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "".join(lines)


def cache_dir(kind="native"):
    """Where compiled libraries of ``kind`` are kept: ``$MINICAVS_CACHE_DIR/<kind>``, else
    ``~/.cache/minicavs/<kind>``, else a per-user folder in the temp dir (the CUDA shim's
    kind is "shim")."""
    candidates = []
    if os.environ.get("MINICAVS_CACHE_DIR"):
        candidates.append(os.path.join(os.environ["MINICAVS_CACHE_DIR"], kind))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(os.path.join(base, "minicavs", kind))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates.append(os.path.join(tempfile.gettempdir(), f"minicavs-{kind}-{uid}"))
    for folder in candidates:
        try:
            os.makedirs(folder, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise ToolchainError(f"no writable cache folder for compiled {kind} code (tried "
                         f"{candidates}); set MINICAVS_CACHE_DIR")


@functools.lru_cache(maxsize=None)
def cxx_flags():
    """:data:`CXX_FLAGS`, with :data:`WIDE_VECTORS` where the CPU has AVX-512."""
    wide = " avx512f" in cpu_signature() and os.environ.get("MINICAVS_VECTOR_WIDTH") != "256"
    return CXX_FLAGS + (WIDE_VECTORS if wide else ())


def library_path(source, tag):
    """The path of ``source``'s compiled library in the cache (it may not exist yet)."""
    _, version = compiler()
    key = hashlib.sha256("\0".join((source, version, cpu_signature(), *cxx_flags(), *LINK_FLAGS))
                         .encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"{tag}-{key}.so")


def build(source, tag, origin=""):
    """Compile ``source`` (unless cached) and load it: ``(ctypes.CDLL, compiled)``, ``compiled``
    False when the library came from the cache. ``origin`` says, in an error, what the source
    was generated from."""
    # Idle OpenMP threads sleep instead of spinning: spinning starves OpenBLAS's threads (and
    # other processes) on a machine with few cores. Read when libgomp loads, so set first.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    target = library_path(source, tag)
    if os.path.exists(target):
        return ctypes.CDLL(target), False
    cxx, version = compiler()
    folder = os.path.dirname(target)
    # Unique scratch names, then atomic renames: concurrent builds of one key (several
    # processes) never see each other's half-written files.
    fd, cpp = tempfile.mkstemp(prefix=f"{tag}-", suffix=".cpp.part", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, obj = tempfile.mkstemp(prefix=f"{tag}-", suffix=".o.part", dir=folder)
    os.close(fd)
    fd, partial = tempfile.mkstemp(prefix=f"{tag}-", suffix=".so.part", dir=folder)
    os.close(fd)
    try:
        for command in ([cxx, *cxx_flags(), "-x", "c++", "-c", "-o", obj, cpp],
                        [cxx, "-o", partial, obj, *LINK_FLAGS]):
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if result.returncode != 0:
                log = (result.stderr or result.stdout).strip()
                raise KernelCompileError(
                    f"native code for {origin or tag} did not compile ({version}).\n"
                    f"--- compiler log ---\n{log}\n--- generated source ---\n{numbered(source)}",
                    log=log, source=source)
        os.replace(cpp, target[:-3] + ".cpp")  # kept beside the library, for reading
        os.replace(partial, target)
    finally:
        for scratch in (cpp, obj, partial):
            if os.path.exists(scratch):
                os.remove(scratch)
    return ctypes.CDLL(target), True
