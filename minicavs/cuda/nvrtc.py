"""Compile CUDA sources to PTX with NVRTC, without a GPU.

NVRTC is a plain host library, so every kernel source can be compiled on a machine with no GPU
and no driver: CuPy's thin binding ``cupy_backends.cuda.libs.nvrtc`` talks to ``libnvrtc.so.12``
from the ``nvidia-cuda-nvrtc-cu12`` wheel. Recent CuPy finds that wheel itself (through
``cuda-pathfinder``); older CuPy only asks the dynamic loader for ``libnvrtc.so.12``, which fails
for a wheel outside ``LD_LIBRARY_PATH``. So before importing the binding we load the wheel's
libraries with ``ctypes`` (``RTLD_GLOBAL``): a later ``dlopen("libnvrtc.so.12")`` then finds the
library already in the process, whichever CuPy is installed. ``MINICAVS_NVRTC_LIB`` may name a
``libnvrtc.so`` to use instead.

The options matter as much as the source. Every minicavs kernel is compiled with
:data:`KERNEL_OPTIONS`, and CuPy adds its own after them (:data:`CUPY_APPENDED_OPTIONS`), the
last word on ``-ftz``; :func:`cupy_compile_options` assembles the whole list as CuPy does,
including the CUDA toolkit headers CuPy 14 compiles every kernel against. The compile checks use
it, so they see the code the GPU runs, not a friendlier variant.
"""

import ctypes
import functools
import glob
import os
import re
import sys

from ..csource import numbered
from ..errors import KernelCompileError, ToolchainError

DEFAULT_ARCH = "compute_90"  # Hopper (H100/H200); PTX for it is what the tests check
INSTALL_HINT = ("pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12   "
                "(or: pip install 'minicavs[test]')")
HEADERS_HINT = ("pip install 'cupy-cuda12x[ctk]'   (or: pip install 'minicavs[cuda]'): the CUDA "
                "12 headers, found before any other CUDA's")

# The options of every minicavs kernel, on the GPU (cupy.RawKernel / ElementwiseKernel) and in
# the compile checks: no contraction of a*b + c into one fused multiply-add, so a kernel rounds
# each operation as NumPy does, and as the CPU shim does (g++ -ffp-contract=off). The kernels
# are memory-bound: an FMA would buy no speed.
KERNEL_OPTIONS = ("--fmad=false",)
# What CuPy adds after a kernel's own options (cupy/cuda/compiler.py: _compile_with_cache_cuda
# and _compile_using_nvrtc_no_warning, CuPy 13 and 14). The last -ftz wins, so float32
# arithmetic in every CuPy kernel flushes subnormals to zero, whatever the kernel asks;
# tests/test_cuda_kernels.py checks that the installed CuPy still does this.
CUPY_APPENDED_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")

_preloaded = []  # the ctypes handles, kept so the libraries stay loaded


def wheel_library_dirs():
    """``nvidia/cuda_nvrtc/lib`` folders of the ``nvidia-cuda-nvrtc-cu12`` wheel on ``sys.path``."""
    dirs = []
    try:
        import nvidia.cuda_nvrtc as package  # a namespace package: no __file__, only __path__

        dirs.extend(os.path.join(p, "lib") for p in package.__path__)
    except ImportError:
        pass
    for entry in sys.path:  # in case the namespace package is shadowed by another "nvidia"
        dirs.append(os.path.join(entry or os.getcwd(), "nvidia", "cuda_nvrtc", "lib"))
    seen, found = set(), []
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(real):
            seen.add(real)
            found.append(real)
    return found


def _candidate_libraries():
    """Paths of libnvrtc to preload, the builtins library first (libnvrtc opens it by name)."""
    override = os.environ.get("MINICAVS_NVRTC_LIB")
    if override and not os.path.isfile(override):  # not silently some other libnvrtc
        raise ToolchainError(f"environment variable MINICAVS_NVRTC_LIB={override!r}: no such "
                             f"file; point it at a libnvrtc.so.*, or unset it")
    if override:
        folder = os.path.dirname(os.path.abspath(override))
        return sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))) + [override]
    for folder in wheel_library_dirs():
        main = sorted(p for p in glob.glob(os.path.join(folder, "libnvrtc.so.*"))
                      if ".alt." not in p)
        if main:
            builtins = sorted(p for p in glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))
                              if ".alt." not in p)
            return builtins + main[:1]
    return []


@functools.lru_cache(maxsize=None)
def load_nvrtc():
    """Return CuPy's NVRTC binding with a working libnvrtc, or raise :class:`ToolchainError`."""
    for path in _candidate_libraries():
        try:
            _preloaded.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        except OSError:
            pass  # the binding may still find a system libnvrtc; the check below decides
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception as exc:  # ImportError: no CuPy; OSError & co: a broken install
        raise ToolchainError(f"NVRTC is not usable: cannot import CuPy's NVRTC binding ({exc}); "
                             f"install it with: {INSTALL_HINT}") from None
    try:
        nvrtc.getVersion()
    except Exception as exc:  # the binding loads libnvrtc lazily: this is where it is missing
        raise ToolchainError(f"NVRTC is not usable: libnvrtc.so.12 cannot be loaded ({exc}); "
                             f"install it with: {INSTALL_HINT}") from None
    return nvrtc


def cupy_for_kernels():
    """CuPy (or the emulated device) for building kernels, NVRTC preloaded first so that CuPy
    < 14 finds the wheel's too."""
    from ..backend import _import_cupy

    cupy = _import_cupy()
    try:
        load_nvrtc()
    except ToolchainError:
        pass  # CuPy may still find a system NVRTC; if not, its own error says so
    return cupy


def cupy_compile_options():
    """The NVRTC options of a minicavs kernel as CuPy assembles them (less ``-arch``): CuPy's
    header folders and the CUDA toolkit's (found by cuda-pathfinder), :data:`KERNEL_OPTIONS`,
    then :data:`CUPY_APPENDED_OPTIONS`. Raises :class:`ToolchainError` when CuPy is missing or
    cannot find CUDA headers (CuPy 14 needs them for every kernel, its own ufuncs included)."""
    load_nvrtc()
    try:
        from cupy._core import core
    except Exception as exc:
        raise ToolchainError(f"CuPy's compiler options are not available: cannot import "
                             f"cupy._core.core ({exc}); install it with: {INSTALL_HINT}") from None
    try:
        options = tuple(core.assemble_cupy_compiler_options(KERNEL_OPTIONS))
    except RuntimeError as exc:  # CuPy 14: "Failed to find CUDA headers ..."
        raise ToolchainError(f"CuPy cannot compile any kernel here: {exc}; install them with: "
                             f"{HEADERS_HINT}") from None
    return options + CUPY_APPENDED_OPTIONS


def cuda_header_dir(options):
    """The ``-I`` folder of ``options`` that holds the CUDA runtime headers (None if none)."""
    for option in options:
        if option.startswith("-I") and os.path.isfile(
                os.path.join(option[2:], "cuda_runtime_api.h")):
            return option[2:]
    return None


def cuda_headers_version(folder):
    """(major, minor) of the CUDA headers in ``folder``, from ``CUDART_VERSION``, or None."""
    try:
        with open(os.path.join(folder, "cuda_runtime_api.h"), errors="replace") as f:
            match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if match is None:
        return None
    version = int(match.group(1))
    return version // 1000, version % 1000 // 10


def nvrtc_version():
    """NVRTC's (major, minor) version; raises :class:`ToolchainError` when it is missing."""
    return tuple(load_nvrtc().getVersion())


def supported_archs():
    """The ``sm_XX`` numbers this NVRTC can target, e.g. (..., 80, 86, 89, 90, ...)."""
    return tuple(load_nvrtc().getSupportedArchs())


@functools.lru_cache(maxsize=256)
def compile_to_ptx(source, name, arch=DEFAULT_ARCH, options=()):
    """Compile ``source`` (a CUDA C++ string) for virtual ``arch`` and return the PTX text.

    ``name`` is the program's file name in messages (``name.cu``). A source that does not compile
    raises :class:`KernelCompileError` with NVRTC's log and the source with numbered lines.
    Results are cached by (source, name, arch, options).
    """
    nvrtc = load_nvrtc()
    args = (f"--gpu-architecture={arch}",) + tuple(options)
    program = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(args))
        except nvrtc.NVRTCError as exc:
            log = _log(nvrtc, program)
            raise KernelCompileError(
                f"NVRTC could not compile kernel source '{name}' for {arch} ({exc}).\n"
                f"--- NVRTC log ---\n{log}\n--- source ---\n{numbered(source)}",
                log=log, source=source) from None
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def _log(nvrtc, program):
    try:
        log = nvrtc.getProgramLog(program)
    except Exception as exc:  # the log itself failed: say so rather than hide the first error
        return f"(no log: {exc})"
    return (log.decode(errors="replace") if isinstance(log, bytes) else log).strip()


def ptx_entries(ptx):
    """Names of the kernels (``.entry``) a PTX text defines."""
    names = []
    for line in ptx.splitlines():
        parts = line.split()
        if ".entry" in parts:
            names.append(parts[parts.index(".entry") + 1].rstrip("("))
    return names
