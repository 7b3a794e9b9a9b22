"""``python -m minicavs doctor``, the CLI around it, and the CUDA layer importing without CuPy."""

import io
import subprocess
import sys

import pytest

from minicavs.__main__ import COMMANDS, build_parser, main
from minicavs.doctor import run_doctor


def test_python_m_minicavs_doctor_runs_and_reports_ok():
    result = subprocess.run([sys.executable, "-m", "minicavs", "doctor"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("python", "numpy", "cupy", "cuda driver", "cuda runtime", "nvrtc", "gpu",
                  "c++ (shim)", "cuda headers", "nvrtc compile (compute_90)",
                  "cupy compile (compute_90)", "shim run"):
        assert f"  {label} " in result.stdout, label
    # The kernel compiled with CuPy's options and headers, and run in the shim with float32
    # subnormals flushed as on the GPU, keeps the subnormal sum NumPy computes.
    for label in ("nvrtc compile", "cupy compile", "shim run"):
        line = next(x for x in result.stdout.splitlines() if x.strip().startswith(label))
        assert "minicavs_scatter_add_sorted_f32: ok" in line, line
    assert "status: ok" in result.stdout
    # What device="cuda" would do here: this machine has no GPU, so the emulated device.
    from minicavs.backend import gpu_available
    path = next(x for x in result.stdout.splitlines() if x.strip().startswith("gpu path"))
    assert ("cuBLAS" in path) if gpu_available() else ("MINICAVS_CUDA_EMULATE=1" in path), path
    from minicavs.autobatch import native
    from minicavs.cpu import build
    if build.unavailable() is None:  # (native code off: the doctor stops at the backend row)
        recorder = next(x for x in result.stdout.splitlines() if "autobatch recorder" in x)
        assert ("C fast path" in recorder) == (native.unavailable() is None), recorder


def test_doctor_on_the_emulated_device_says_so_and_passes():
    import os

    # The stand-in for CuPy has no version, driver or GPU to ask; the doctor said FAILED on it.
    result = subprocess.run([sys.executable, "-m", "minicavs", "doctor"], capture_output=True,
                            text=True, timeout=300,
                            env=dict(os.environ, MINICAVS_CUDA_EMULATE="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("  ")[1].strip(): line for line in result.stdout.splitlines()
            if line.startswith("  ") and len(line.split("  ")) > 2}
    assert "emulated" in rows["cupy"] and "emulated" in rows["gpu"]
    assert "every launch counted" in rows["gpu path"]
    assert "FAILED" not in result.stdout


def test_doctor_gpu_path_line_on_a_machine_with_a_gpu(monkeypatch):
    from types import SimpleNamespace

    from minicavs.cuda import doctor

    # (No GPU here: the line a GPU machine prints, from a CuPy that names its kernel cache.)
    monkeypatch.delenv("MINICAVS_CUDA_EMULATE", raising=False)
    cupy = SimpleNamespace(cuda=SimpleNamespace(
        compiler=SimpleNamespace(get_cache_dir=lambda: "/cache/kernels")))
    monkeypatch.delenv("MINICAVS_CUDA_ISSUER", raising=False)
    line = doctor._gpu_path(cupy, gpu_count=1, have_cxx=True)
    assert "cuBLAS" in line and "/cache/kernels" in line and "cuda_profile.py" in line
    assert "issued from C" in line
    monkeypatch.setenv("MINICAVS_CUDA_ISSUER", "python")
    assert "issued from Python (MINICAVS_CUDA_ISSUER=python)" in doctor._gpu_path(
        cupy, gpu_count=1, have_cxx=True)
    line = doctor._gpu_path(SimpleNamespace(cuda=None), gpu_count=1, have_cxx=True)
    assert "CuPy's kernel cache" in line  # (a CuPy without get_cache_dir)
    assert doctor._gpu_path(None, gpu_count=0, have_cxx=False) == "none here (no GPU)"


def test_doctor_says_what_to_install_for_each_missing_piece():
    stream = io.StringIO()
    assert run_doctor(stream) == 0
    lines = stream.getvalue().splitlines()
    # On a machine without a GPU the driver and gpu lines are each followed by a hint.
    for i, line in enumerate(lines):
        if line.split()[:2] in (["gpu", "none"], ["cuda", "driver"]) and "none" in line:
            assert lines[i + 1].strip().startswith("->")


def test_cli_has_subcommands_and_requires_one():
    assert "doctor" in COMMANDS
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["no-such-command"])


def test_cuda_layer_imports_without_importing_cupy():
    code = ("import sys, minicavs, minicavs.cuda, minicavs.cuda.kernels, minicavs.cuda.shim, "
            "minicavs.cuda.nvrtc, minicavs.cuda.doctor, minicavs.__main__\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends')]\n"
            "assert not bad, bad\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def _doctor_in_subprocess(prelude="", env=None):
    import os

    code = prelude + "from minicavs.doctor import run_doctor\nraise SystemExit(run_doctor())\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_doctor_without_cupy_says_what_to_install():
    # sys.modules[name] = None makes "import name" fail, as on a machine without CuPy.
    result = _doctor_in_subprocess("import sys\nsys.modules['cupy'] = None\n"
                                   "sys.modules['cupy_backends'] = None\n")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    cupy_line = next(i for i, line in enumerate(lines) if line.split()[:1] == ["cupy"])
    assert "not installed" in lines[cupy_line]
    assert "pip install 'cupy-cuda12x[ctk]'" in lines[cupy_line + 1]
    nvrtc_line = next(i for i, line in enumerate(lines) if line.split()[:1] == ["nvrtc"])
    assert "nvidia-cuda-nvrtc-cu12" in lines[nvrtc_line + 1]
    assert "shim run" in result.stdout and "status: ok" in result.stdout


def test_doctor_without_cuda_headers_says_what_to_install():
    # cuda-pathfinder finding no headers is what CuPy 14 sees on a machine with neither the
    # toolkit nor the [ctk] wheels: it then cannot compile any kernel.
    result = _doctor_in_subprocess("import cuda.pathfinder\n"
                                   "cuda.pathfinder.find_nvidia_header_directory = "
                                   "lambda *a, **k: None\n")
    assert result.returncode == 0, result.stdout + result.stderr  # no GPU: a hint, not a fault
    lines = result.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:2] == ["cuda", "headers"])
    assert "not found" in lines[row] and "Failed to find CUDA headers" in lines[row]
    assert "pip install 'cupy-cuda12x[ctk]'" in lines[row + 1]
    assert not any(line.strip().startswith("cupy compile") for line in lines)
    assert "status: ok" in result.stdout


def test_doctor_without_a_compiler_says_what_to_install():
    result = _doctor_in_subprocess(env={"CXX": "minicavs-no-such-compiler"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not found" in result.stdout and "apt-get install g++" in result.stdout
