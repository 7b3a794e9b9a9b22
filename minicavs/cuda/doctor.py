"""The CUDA part of ``python -m minicavs doctor`` (``minicavs/doctor.py``): what the CUDA layer
can use here, and what to install.

One line per piece: Python, NumPy, CuPy, the CUDA driver and runtime, NVRTC, a visible GPU,
the C++ compiler of the CPU shim, the CUDA headers CuPy compiles with. Then one kernel — the
float32 deterministic scatter-add, whose sum must keep subnormals although CuPy compiles with
``-ftz=true`` — is compiled with NVRTC, compiled again with the options and headers CuPy
assembles for it, run through the CPU shim, and, where a GPU is visible, launched through
CuPy's own compile path (``cupy.RawKernel``); every run is compared bit for bit with its NumPy
twin. Its last line, ``gpu path``, says what ``device="cuda"`` does on this machine: a GPU's
launches issued from Python, the emulated device, or nothing. A missing piece is a line saying
what to install, not a failure: the exit status is 1
only when something present does not work (a kernel that fails to compile or gives a wrong
answer; on a machine with a GPU, CuPy without CUDA headers is such a failure).
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
    from ..backend import _import_cupy, cuda_emulated

    report.append(("python", f"{platform.python_version()} ({sys.executable})", None, False))
    report.append(("numpy", np.__version__, None, False))

    cupy = _import_cupy()
    gpu_count = 0
    if cuda_emulated():  # (CuPy's stand-in: no versions, driver or GPU to ask)
        report.append(("cupy", "the emulated device's stand-in (MINICAVS_CUDA_EMULATE=1)", None,
                       False))
        report.append(("gpu", "emulated on the CPU", None, False))
        cupy = None
    elif cupy is None:
        report.append(("cupy", "not installed",
                       "pip install 'cupy-cuda12x[ctk]'   (or: pip install 'minicavs[cuda]')",
                       False))
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
            gpu_count = count
        except Exception as exc:
            report.append(("gpu", f"none visible ({type(exc).__name__})", GPU_HINT, False))

    from . import nvrtc, shim
    from ..errors import ToolchainError

    version = None
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

    source = kernels.kernel_source("scatter_add_sorted", np.float32)
    cupy_options = None
    if cupy is not None and have_nvrtc:
        cupy_options = _probe_headers(report, nvrtc, version)
    if have_nvrtc:
        _compile_row(report, f"nvrtc compile ({nvrtc.DEFAULT_ARCH})", nvrtc, source,
                     nvrtc.KERNEL_OPTIONS + nvrtc.CUPY_APPENDED_OPTIONS)
    if cupy_options is not None:
        _compile_row(report, f"cupy compile ({nvrtc.DEFAULT_ARCH})", nvrtc, source, cupy_options)
    if have_cxx:
        _run_row(report, "shim run", source, "shim", f"cache {shim.cache_dir()}")
    if gpu_count:
        _run_row(report, "gpu run", source, "cupy", "cupy.RawKernel",
                 hint=nvrtc.HEADERS_HINT if cupy_options is None else None)
    report.append(("gpu path", _gpu_path(cupy, gpu_count, have_cxx), None, False))


def _gpu_path(cupy, gpu_count, have_cxx):
    """What ``device="cuda"`` does on this machine, in a line."""
    from ..backend import cuda_emulated

    if cuda_emulated():
        return ("emulated (MINICAVS_CUDA_EMULATE=1): the CUDA path's host code on the CPU, "
                "every kernel through the shim, every launch counted (F.explain()); its times "
                "are the CPU's")
    if gpu_count:
        try:
            cache = cupy.cuda.compiler.get_cache_dir()
        except Exception:  # noqa: BLE001  (a CuPy without the function: say less)
            cache = "CuPy's kernel cache"
        from . import issuer

        levels = ("issued from C (cuda/issuer.py: cuLaunchKernel and cuBLAS called from a "
                  "table per level plan)" if issuer.enabled() else
                  "issued from Python (MINICAVS_CUDA_ISSUER=python)")
        return (f"a level step is a few launches {levels}, an autobatched batch a few "
                "launches issued from Python (gathers and fused element-wise work as generated "
                f"kernels, products through cuBLAS); kernels compile once per source, kept in "
                f"{cache}. At the benchmark's sizes the host, not the GPU, sets the pace: "
                "benchmarks/cuda_profile.py measures which")
    if cupy is not None and have_cxx:
        return ("none here (no GPU); MINICAVS_CUDA_EMULATE=1 runs its host code on the CPU "
                "with every launch counted")
    return "none here (no GPU)"


def _probe_headers(report, nvrtc, nvrtc_version):
    """The CUDA headers CuPy would compile with; returns CuPy's options, or None."""
    from ..errors import ToolchainError

    try:
        options = nvrtc.cupy_compile_options()
    except ToolchainError as exc:
        report.append(("cuda headers", f"not found ({str(exc).split(';')[0]})",
                       nvrtc.HEADERS_HINT, False))
        return None
    folder = nvrtc.cuda_header_dir(options)
    headers = nvrtc.cuda_headers_version(folder) if folder else None
    if headers is None:
        report.append(("cuda headers", f"{folder or 'in CuPy'} (version unknown)", None, False))
        return options
    # Headers newer than the compiler may use what it does not know (CuPy picks the first CUDA
    # that cuda-pathfinder finds, which need not be NVRTC's).
    mismatch = headers[0] != nvrtc_version[0] or headers > tuple(nvrtc_version)
    report.append(("cuda headers", f"CUDA {headers[0]}.{headers[1]} in {folder}"
                   + (f" (NVRTC is {nvrtc_version[0]}.{nvrtc_version[1]})" if mismatch else ""),
                   nvrtc.HEADERS_HINT if mismatch else None, False))
    return options


def _compile_row(report, label, nvrtc, source, options):
    try:
        ptx = nvrtc.compile_to_ptx(source.code, source.name, options=tuple(options))
        ok = source.name in nvrtc.ptx_entries(ptx)
        report.append((label, f"{source.name}: {'ok' if ok else 'no entry in PTX'} "
                       f"({len(ptx)} bytes of PTX)", None, not ok))
    except Exception as exc:
        report.append((label, f"FAILED: {exc}", None, True))


def _run_row(report, label, source, runner, where, hint=None):
    """Run the deterministic scatter-add on subnormal values with ``runner``; compare bits."""
    from . import kernels

    tiny = np.float32(1e-40)  # subnormal: a flushing add would lose it
    values = np.array([[tiny, 1.0], [tiny, -1.0], [3.0, 2e-45]], np.float32)
    idx = np.array([0, 0, 2], np.int32)
    want = kernels.scatter_add_rows_numpy(values, idx, np.zeros((3, 2), np.float32))
    try:
        if runner == "cupy":
            import cupy

            got = kernels.scatter_add_rows(cupy.asarray(values), cupy.asarray(idx),
                                           cupy.zeros((3, 2), np.float32),
                                           deterministic=True).get()
        else:
            got = kernels.scatter_add_rows(values, idx, np.zeros((3, 2), np.float32),
                                           deterministic=True, runner=runner)
        ok = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        report.append((label, f"{source.name}: {'ok' if ok else 'WRONG RESULT'} ({where})",
                       None, not ok))
    except Exception as exc:
        report.append((label, f"FAILED: {type(exc).__name__}: {exc}", hint, True))


def probe(report):
    """Append the CUDA layer's (label, value, hint-or-None, failed) rows to ``report``; a
    doctor reports, it does not crash."""
    try:
        _probe(report)
    except Exception as exc:  # noqa: BLE001
        report.append(("doctor", f"FAILED: {type(exc).__name__}: {exc}", None, True))
