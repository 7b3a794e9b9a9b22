"""``python -m minicavs doctor``: what the CUDA layer can use here, and what to install.

One line per piece: Python, NumPy, CuPy, the CUDA driver and runtime, NVRTC, a visible GPU,
the C++ compiler of the CPU shim; then one test kernel is compiled with NVRTC and run through
the shim against its NumPy twin. A missing piece is a line saying what to install, not a failure:
the exit status is 1 only when something present does not work (a kernel that fails to compile
or gives a wrong answer).
"""

import platform
import sys

import numpy as np

GPU_HINT = "run on a machine with an NVIDIA GPU and driver (the CPU path needs neither)"
DRIVER_HINT = "install the NVIDIA driver (only on a machine with an NVIDIA GPU)"


def _cuda_version(v):
    return "none" if not v else f"{v // 1000}.{v % 1000 // 10}"


def _probe(report):
    """Fill ``report`` with (label, value, hint-or-None, failed) rows."""
    from ..backend import _import_cupy

    report.append(("python", f"{platform.python_version()} ({sys.executable})", None, False))
    report.append(("numpy", np.__version__, None, False))

    cupy = _import_cupy()
    if cupy is None:
        report.append(("cupy", "not installed",
                       "pip install cupy-cuda12x   (or: pip install 'minicavs[cuda]')", False))
        for label in ("cuda runtime", "cuda driver", "gpu"):
            report.append((label, "unknown (CuPy is needed to ask)", None, False))
    else:
        report.append(("cupy", cupy.__version__, None, False))
        runtime = cupy.cuda.runtime
        try:
            report.append(("cuda runtime", _cuda_version(runtime.runtimeGetVersion()), None, False))
        except Exception as exc:
            report.append(("cuda runtime", f"unavailable ({exc})",
                           "pip install nvidia-cuda-runtime-cu12", False))
        try:
            driver = runtime.driverGetVersion()
        except Exception:
            driver = 0
        report.append(("cuda driver", _cuda_version(driver), None if driver else DRIVER_HINT,
                       False))
        try:
            count = runtime.getDeviceCount()
            names = [runtime.getDeviceProperties(d)["name"].decode() for d in range(count)]
            report.append(("gpu", f"{count} visible: {', '.join(names)}" if count else "none",
                           None if count else GPU_HINT, False))
        except Exception as exc:
            report.append(("gpu", f"none visible ({type(exc).__name__})", GPU_HINT, False))

    from . import nvrtc, shim
    from .errors import ToolchainError

    try:
        version = nvrtc.nvrtc_version()
        report.append(("nvrtc", "%d.%d" % version, None, False))
        have_nvrtc = True
    except ToolchainError:
        report.append(("nvrtc", "not usable", nvrtc.INSTALL_HINT, False))
        have_nvrtc = False
    try:
        report.append(("c++ (shim)", shim.compiler()[1], None, False))
        have_cxx = True
    except ToolchainError:
        report.append(("c++ (shim)", "not found", shim.INSTALL_HINT, False))
        have_cxx = False

    from . import kernels

    source = kernels.kernel_source("gather_rows", np.float32)
    if have_nvrtc:
        try:
            ptx = nvrtc.compile_to_ptx(source.code, source.name)
            ok = source.name in nvrtc.ptx_entries(ptx)
            report.append((f"nvrtc compile ({nvrtc.DEFAULT_ARCH})",
                           f"{source.name}: {'ok' if ok else 'no entry in PTX'} "
                           f"({len(ptx)} bytes of PTX)", None, not ok))
        except Exception as exc:
            report.append((f"nvrtc compile ({nvrtc.DEFAULT_ARCH})", f"FAILED: {exc}", None, True))
    if have_cxx:
        try:
            src = np.arange(12, dtype=np.float32).reshape(4, 3)
            idx = np.array([3, -1, 0, 3], dtype=np.int32)
            got = kernels.gather_rows(src, idx, runner="shim")
            ok = np.array_equal(got, kernels.gather_rows_numpy(src, idx))
            report.append(("shim run", f"{source.name}: {'ok' if ok else 'WRONG RESULT'} "
                           f"(cache {shim.cache_dir()})", None, not ok))
        except Exception as exc:
            report.append(("shim run", f"FAILED: {exc}", None, True))


def run_doctor(file=None):
    """Print the report to ``file`` (stdout); return 0, or 1 if a present piece is broken."""
    file = file or sys.stdout
    report = []
    try:
        _probe(report)
    except Exception as exc:  # a doctor reports; it does not crash
        report.append(("doctor", f"FAILED: {type(exc).__name__}: {exc}", None, True))
    from .. import __version__

    print(f"minicavs {__version__} doctor", file=file)
    width = max(len(label) for label, *_ in report)
    for label, value, hint, failed in report:
        print(f"  {label:<{width}}  {value}", file=file)
        if hint:
            print(f"  {'':<{width}}  -> {hint}", file=file)
    broken = [label for label, _, _, failed in report if failed]
    print("  status: " + (f"BROKEN ({', '.join(broken)})" if broken else "ok"), file=file)
    return 1 if broken else 0
