"""Compile CUDA sources to PTX with NVRTC, without a GPU.

NVRTC is a plain host library, so every kernel source can be compiled on a machine with no GPU
and no driver: CuPy's thin binding ``cupy_backends.cuda.libs.nvrtc`` talks to ``libnvrtc.so.12``
from the ``nvidia-cuda-nvrtc-cu12`` wheel. Recent CuPy finds that wheel itself (through
``cuda-pathfinder``); older CuPy only asks the dynamic loader for ``libnvrtc.so.12``, which fails
for a wheel outside ``LD_LIBRARY_PATH``. So before importing the binding we load the wheel's
libraries with ``ctypes`` (``RTLD_GLOBAL``): a later ``dlopen("libnvrtc.so.12")`` then finds the
library already in the process, whichever CuPy is installed. ``MINICAVS_NVRTC_LIB`` may name a
``libnvrtc.so`` to use instead.
"""

import ctypes
import functools
import glob
import os
import sys

from .errors import KernelCompileError, ToolchainError, numbered

DEFAULT_ARCH = "compute_90"  # Hopper (H100/H200); PTX for it is what the tests check
INSTALL_HINT = ("pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12   "
                "(or: pip install 'minicavs[test]')")

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
