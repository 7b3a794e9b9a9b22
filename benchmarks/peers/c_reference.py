"""The hand-written C Tree-LSTM level loop (``shared/reference/c_treelstm/``): the CPU ceiling.

Not a framework: a prototype written for one model, the harness's own ``tree_lstm`` workload
(and ``tree_lstm_256``), whose whole training step is one C call per batch (OpenMP split by
hidden units, OpenBLAS single-threaded in each thread; see its README). It is built here with
the system compiler and the flags of its Makefile (for ``MINICAVS_MARCH``'s target where that
is set: :func:`flags`), against SciPy's bundled OpenBLAS, into
minicavs's compiled-code cache, and run through the reference's own ``driver.py`` (loaded from
the shared folder, not copied). Missing — with the reason — when the shared folder, a C
compiler or SciPy's OpenBLAS is absent; other workloads are skipped by ``run.py``.

``breakdown``: the C step's own timers (thread 0's view), per epoch.
"""

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchmarks import common

WORKLOADS = ("tree_lstm",)  # kinds it runs
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp",
         "-fPIC", "-w")


def flags():
    """Its Makefile's flags; with ``MINICAVS_MARCH`` set (the AVX2 build of minicavs's native
    code, ``-march=x86-64-v3``, on any machine) built for that target too, as it would be on
    such a CPU: the table of an AVX2 build compares two AVX2 builds."""
    march = os.environ.get("MINICAVS_MARCH", "").strip()
    if not march:
        return FLAGS
    return tuple(f"-march={march}" if f == "-march=native" else f for f in FLAGS
                 if f != "-mprefer-vector-width=512")


def folder():
    """The reference's folder: ``$MINICAVS_C_REFERENCE``, else ``shared/reference/c_treelstm``
    beside the checkout."""
    given = os.environ.get("MINICAVS_C_REFERENCE")
    return Path(given) if given else common.REPO.parent / "shared" / "reference" / "c_treelstm"


def _openblas():
    import scipy

    libs = Path(scipy.__file__).resolve().parent.parent / "scipy.libs"
    found = sorted(libs.glob("libscipy_openblas*.so")) if libs.is_dir() else []
    return found[0] if found else None


def available():
    where = folder()
    if not (where / "treelstm.c").is_file() or not (where / "driver.py").is_file():
        return f"no C reference at {where} (set MINICAVS_C_REFERENCE)"
    if not shutil.which(os.environ.get("CC", "gcc")):
        return "no C compiler (gcc, or $CC)"
    try:
        blas = _openblas()
    except ImportError:
        return "SciPy is not installed (the reference links SciPy's OpenBLAS)"
    if blas is None:
        return "SciPy's bundled OpenBLAS (scipy.libs/libscipy_openblas*.so) not found"
    return None


@functools.lru_cache(maxsize=None)
def library():
    """The compiled reference, built once per source, flags and compiler."""
    from minicavs.cpu import build

    source = (folder() / "treelstm.c").read_bytes()
    compiler = os.environ.get("CC", "gcc")
    blas = _openblas()
    key = hashlib.sha256(source + repr((flags(), compiler, str(blas))).encode()).hexdigest()[:24]
    out = Path(build.cache_dir("c_reference")) / f"treelstm-{key}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([compiler, *flags(), "-shared", str(folder() / "treelstm.c"), "-o",
                        str(tmp), f"-L{blas.parent}", f"-l:{blas.name}",
                        f"-Wl,-rpath,{blas.parent}", "-lm"], check=True, capture_output=True)
        os.replace(tmp, out)
    return out


def _driver():
    spec = importlib.util.spec_from_file_location("c_reference_driver", folder() / "driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(data, params, epochs, warmup, options=None):
    if data["kind"] not in WORKLOADS:
        raise ValueError(f"the C reference runs the Tree-LSTM workloads only, not {data['kind']}")
    driver = _driver()
    lib = driver.load_lib(library())
    threads = int(os.environ.get("BENCH_THREADS") or os.cpu_count() or 1)
    model = driver.Model(lib, data, params, common, threads, blas_threads=1)
    seconds, parts, first, last = [], [], None, None
    for epoch in range(warmup + epochs):
        common.take_turn()
        model.timers(reset=True)
        started = time.perf_counter()
        for b in range(len(model.bounds)):
            loss = model.step(b)
            first = loss if first is None else first
            last = loss
        elapsed = time.perf_counter() - started
        if epoch >= warmup:
            seconds.append(elapsed)
            timers = model.timers(reset=True)
            timers.pop("total", None)
            parts.append(timers)
    loop = {"epoch_seconds": seconds, "parts": parts, "first_loss": first, "last_loss": last}
    return common.summarize(loop, data, threads=threads)
