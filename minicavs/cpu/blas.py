"""The BLAS NumPy already runs, for generated code: no new dependency, no link step.

Generated code receives a gemm's address once, when its library is loaded, and calls it from
the level loop. Which gemm, in order of preference:

1. **NumPy's own BLAS** (the OpenBLAS its wheels carry, already loaded in the process): its
   CBLAS ``sgemm``/``dgemm``, 64-bit or 32-bit integers, found among the loaded libraries. One
   BLAS for the whole process means one pool of BLAS threads: a second pool (SciPy's wheels
   carry another OpenBLAS) spins against the first, which measured 2–8× slower on 2 cores.
2. **SciPy's** Fortran ``sgemm``/``dgemm``, exported by ``scipy.linalg.cython_blas`` as
   function pointers in capsules (``__pyx_capi__``), when NumPy's is not found (another NumPy
   build, another platform).

:func:`gemm` returns ``(address, interface)``; the interface (``"cblas64"``, ``"cblas32"``,
``"fortran32"``) tells the code generator which call to write.

Beside it, :func:`mkl_gemm`: Intel's MKL where it is installed (``pip install mkl``), on its
sequential layer, whose calls run on the calling thread as a team member's must. It is not
preferred for being MKL: ``cpu/calibrate.py`` (:func:`~.calibrate.gemm`) measures both gemms
here and the library's own products (level loops, the team's) call the faster.
"""

import ctypes
import functools
import glob
import os
import sys
import threading

import numpy as np

# CBLAS symbol names, by interface, that NumPy's BLAS builds export ({} is "s" or "d").
_CBLAS_SYMBOLS = (("scipy_cblas_{}gemm64_", "cblas64"), ("cblas_{}gemm64_", "cblas64"),
                  ("cblas_{}gemm", "cblas32"))


def operand(x):
    """``(transposed, leading dimension, array)`` of a 2-D matrix as a gemm reads it: its rows
    (or its transpose's) unit-stride where they are, else a contiguous copy."""
    item = x.itemsize
    if x.strides[1] == item and x.strides[0] >= max(1, x.shape[1]) * item:
        return 0, x.strides[0] // item, x
    if x.strides[0] == item and x.strides[1] >= max(1, x.shape[0]) * item:
        return 1, x.strides[1] // item, x
    x = np.ascontiguousarray(x)
    return 0, max(1, x.shape[1]), x


def _loaded_blas_libraries():
    """Paths of loaded shared libraries that look like a BLAS (NumPy's first)."""
    import numpy  # noqa: F401  (loads NumPy's BLAS)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    names = ("openblas", "blas", "mkl_rt")
    found = [p for p in paths if any(n in os.path.basename(p).lower() for n in names)]
    return sorted(found, key=lambda p: "numpy" not in p)


@functools.lru_cache(maxsize=None)
def gemm(dtype, routine="gemm"):
    """``(address, interface)`` of the gemm for ``dtype`` (float32 or float64); ``routine``
    ``"gemv"``: the same library's gemv (a one-row product: a gemm packs the whole matrix for
    it, OpenBLAS's Haswell sgemm 87 us against its sgemv's 18 at 1 x 256 x 1024)."""
    letter = {"float32": "s", "float64": "d"}[str(dtype)]
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol, interface in _CBLAS_SYMBOLS:
            function = getattr(lib, symbol.format(letter), None)
            if function is not None:
                if routine != "gemm":  # (None where this BLAS lacks it: the gemm runs)
                    function = getattr(lib, symbol.format(letter).replace("gemm", routine),
                                       None)
                return ctypes.cast(function, ctypes.c_void_p).value, interface
    return _scipy_routine(letter + routine), "fortran32"


@functools.lru_cache(maxsize=None)
def identity():
    """Which BLAS this is, for the calibration's key (``cpu/calibrate.py``): its file, size and
    (OpenBLAS) configuration line — a new BLAS is measured again."""
    parts = []
    for path in _loaded_blas_libraries()[:1]:
        try:
            parts.append(f"{path} {os.path.getsize(path)}")
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in ("scipy_openblas_get_config64_", "openblas_get_config",
                       "scipy_openblas_get_corename64_", "openblas_get_corename"):
            function = getattr(lib, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                parts.append(function().decode(errors="replace"))
    return " ".join(parts) or "scipy cython_blas"


@functools.lru_cache(maxsize=None)
def threads_local():
    """Address of the BLAS's ``openblas_set_num_threads_local`` (OpenBLAS >= 0.3.27: sets
    its threads, returning the previous count; in NumPy's pthreads build for the whole
    process, measured), or None. The native level loop sets one thread for its call and
    splits each product between its own threads, each running a one-thread gemm."""
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if getattr(lib, _CBLAS_SYMBOLS[0][0].format("s"), None) is None and \
                getattr(lib, "cblas_sgemm", None) is None:
            continue
        function = getattr(lib, "openblas_set_num_threads_local", None)
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value
    return None


# OpenBLAS's idle threads spin for 2^THREAD_TIMEOUT cycles after each threaded product (2^28,
# about 0.1 s, by default) before they sleep. A product of NumPy's outside a native call (the
# Var-LSTM's softmax layer) thereby left a core busy while the native team's next products
# needed it: the team's GEMMs ran at 116 GF/s in the step against 233-238 alone, and with 2^4
# the Var-LSTM epoch went 2.05 -> 1.76 s (2 threads; the tree models 1-3 %).
IDLE_TIMEOUT = 4  # OpenBLAS's smallest: threads sleep at once
idle_threads = "not set (minicavs was not imported)"  # what let_idle_threads_sleep did


def let_idle_threads_sleep():
    """Make the loaded OpenBLAS's idle threads sleep at once (called when minicavs is imported).
    OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` when it loads, with NumPy, usually before
    minicavs: then the variable is set, OpenBLAS re-reads it (``openblas_read_env``) and its
    thread pool is shut down (``blas_thread_shutdown_``, as its fork handler does) to be made
    again, with the new timeout, by the next threaded product — only while no other thread
    runs (one could be inside a BLAS call). A timeout the user set in the environment is
    kept."""
    global idle_threads
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        idle_threads = f"OPENBLAS_THREAD_TIMEOUT={os.environ['OPENBLAS_THREAD_TIMEOUT']} (yours)"
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(IDLE_TIMEOUT)
    idle_threads = "no OpenBLAS found"
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
            read_env, timeout = lib.openblas_read_env, lib.openblas_thread_timeout
            shutdown = lib.blas_thread_shutdown_
        except (OSError, AttributeError):  # another BLAS, or an OpenBLAS without them
            continue
        if timeout() != IDLE_TIMEOUT:
            if threading.active_count() > 1:  # another thread may be inside a BLAS call now
                idle_threads = ("OpenBLAS loaded before minicavs while other threads ran: its "
                                "idle threads spin (set OPENBLAS_THREAD_TIMEOUT=4 to avoid it)")
                continue
            read_env()
            shutdown()
        idle_threads = f"OpenBLAS idle threads sleep after 2^{timeout()} cycles"


def restart_threads():
    """Shut OpenBLAS's thread pool down (``blas_thread_shutdown_``, as its fork handler does),
    to be made again by its next threaded product from the calling thread, whose floating-point
    control settings new threads inherit (``cpu/denormals.py``) — only while no other thread
    runs (one could be inside a BLAS call). Returns whether a pool was shut down."""
    if threading.active_count() > 1:
        return False
    done = False
    for path in _loaded_blas_libraries():
        try:
            shutdown = ctypes.CDLL(path).blas_thread_shutdown_
        except (OSError, AttributeError):  # another BLAS, or an OpenBLAS without it
            continue
        shutdown()
        done = True
    return done


MKL_SEQUENTIAL = 1  # MKL_Set_Threading_Layer's MKL_THREADING_SEQUENTIAL


@functools.lru_cache(maxsize=None)
def mkl():
    """``(library, path)``: MKL's runtime library (``libmkl_rt``, from the ``mkl`` wheel in
    this Python's ``lib``) loaded privately and set to its sequential layer, or None: not
    installed, or already in the process (NumPy built on MKL: then :func:`gemm` is MKL, and
    its threading layer is NumPy's to keep). Loaded with local symbols: its ``cblas_sgemm``
    does not replace OpenBLAS's for NumPy."""
    if any("mkl_rt" in os.path.basename(p) for p in _loaded_blas_libraries()):
        return None
    for path in sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*"))):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            layer = lib.MKL_Set_Threading_Layer
        except (OSError, AttributeError):
            continue
        layer.restype, layer.argtypes = ctypes.c_int, [ctypes.c_int]
        if layer(MKL_SEQUENTIAL) != MKL_SEQUENTIAL:
            continue
        return lib, path
    return None


def mkl_gemm(dtype, routine="gemm"):
    """``(address, interface)`` of MKL's sequential CBLAS gemm (or ``routine``, e.g. gemv) for
    ``dtype`` (32-bit integers: libmkl_rt's default LP64 interface), or None (:func:`mkl`)."""
    found = mkl()
    if found is None:
        return None
    function = getattr(found[0], "cblas_{}{}".format({"float32": "s", "float64": "d"}[
        str(dtype)], routine), None)
    return ctypes.cast(function, ctypes.c_void_p).value, "cblas32"


def mkl_identity():
    """MKL's file and size, and the instructions it is told to use (``MKL_ENABLE_INSTRUCTIONS``,
    which picks its code path): a new MKL, or another path, is measured again. None without
    MKL."""
    found = mkl()
    if found is None:
        return None
    told = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "")
    return f"{found[1]} {os.path.getsize(found[1])}" + (f" ({told})" if told else "")


def _scipy_routine(name):
    from scipy.linalg import cython_blas

    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                 ctypes.c_char_p]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    capsule = cython_blas.__pyx_capi__[name]
    return get_pointer(capsule, get_name(capsule))
