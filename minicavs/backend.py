"""Array backend: NumPy on the CPU, CuPy on a GPU.

This module and ``minicavs/cuda/`` are the only places that import CuPy, and they do so lazily,
so ``import minicavs`` works on a machine without CuPy or without a GPU. Everything else asks
:func:`get_array_module` for ``xp`` and writes ``xp.tanh(x)``, never ``numpy.tanh(x)``.
"""

import os
import sys
import weakref

import numpy as np

from .errors import DeviceError, DTypeError

_DEVICES = ("cpu", "cuda")
_default_dtype = np.dtype(np.float32)
_cupy = None  # the cupy module once imported; False once known to be missing
_gpu_seen = None  # the cupy module through which a GPU was found: a process keeps its
# devices (each look is a driver call, about 0.1 ms, and tensors move there many times a step)


def _import_cupy():
    """Return the cupy module or None, importing it at most once."""
    global _cupy
    if _cupy is None:
        if cuda_emulated():  # the whole CUDA path on the CPU (minicavs/cuda/emulated.py)
            from .cuda import emulated

            _cupy = emulated.cupy
            return _cupy
        try:
            import cupy  # noqa: F401  (the one import of cupy outside minicavs/cuda/)

            _cupy = cupy
        except Exception:  # ImportError, or a CUDA library that fails to load
            _cupy = False
    return _cupy or None


def cuda_emulated():
    """Whether ``MINICAVS_CUDA_EMULATE=1`` asks for the emulated CUDA device (no GPU needed)."""
    return os.environ.get("MINICAVS_CUDA_EMULATE", "").strip() == "1"


def cupy_or_error():
    """Return cupy with a usable GPU, or raise :class:`DeviceError` saying what is missing."""
    global _gpu_seen
    cupy = _import_cupy()
    if cupy is not None and cupy is _gpu_seen:
        return cupy
    if cupy is None:
        raise DeviceError(
            "device 'cuda' needs CuPy, which is not installed (or failed to import); "
            "install it with: pip install 'minicavs[cuda]'  (that is cupy-cuda12x[ctk]: CuPy "
            "with the CUDA 12 headers and libraries it compiles and links against)"
        )
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or the driver cannot see a device
        raise DeviceError(
            f"device 'cuda' needs a GPU, but the CUDA runtime found none ({exc}); "
            "run on a machine with an NVIDIA GPU and driver, or use set_device('cpu')"
        ) from None
    if count == 0:
        raise DeviceError("device 'cuda' needs a GPU, but the CUDA runtime found none; "
                          "use set_device('cpu')")
    _gpu_seen = cupy
    return cupy


def gpu_available():
    """True when CuPy imports and sees at least one GPU."""
    try:
        cupy_or_error()
        return True
    except DeviceError:
        return False


def _device_name(name, where=""):
    name = name.strip().lower()
    if name not in _DEVICES:
        raise DeviceError(f"unknown device {name!r}{where}; expected one of {_DEVICES}")
    return name


_device = _device_name(os.environ.get("MINICAVS_DEVICE", "").strip() or "cpu",
                       " in environment variable MINICAVS_DEVICE")


def set_device(name):
    """Select where new tensors live: ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy)."""
    global _device
    name = _device_name(str(name))
    if name == "cuda":
        cupy_or_error()
    _device = name


def gpu_count():
    """How many GPUs this process sees (a DeviceError without CuPy or a GPU)."""
    return cupy_or_error().cuda.runtime.getDeviceCount()


def select_gpu(index):
    """Make GPU ``index`` (modulo the number of GPUs) the current one for this process and
    return its id: each data-parallel rank on a machine takes its own GPU."""
    device = int(index) % gpu_count()
    cupy_or_error().cuda.Device(device).use()
    return device


def get_device():
    """The current device name, ``"cpu"`` or ``"cuda"``."""
    return _device


def device_module():
    """``xp`` for the current device."""
    return cupy_or_error() if _device == "cuda" else np


def is_cupy_array(a):
    cupy = _cupy or None  # never import cupy just to answer "no"
    if cupy is None and _cupy is None and "cupy" in sys.modules:
        cupy = _import_cupy()  # the caller imported CuPy itself and made arrays with it
    return cupy is not None and isinstance(a, cupy.ndarray)


def is_array(a):
    """Whether ``a`` is an array: NumPy's, CuPy's (whose arrays from CuPy 14 have no
    ``__array_namespace__``), or another array-API one."""
    return isinstance(a, np.ndarray) or hasattr(a, "__array_namespace__") or is_cupy_array(a)


def get_array_module(*arrays, op=None):
    """Return numpy or cupy for ``arrays``; mixing the two is an error naming ``op``."""
    # Scalars (Python or NumPy, and the 0-d arrays promotion makes of them) combine with either
    # kind of array; the caller moves a 0-d array to the device (``scalars_to``).
    on_gpu = [is_cupy_array(a) for a in arrays
              if a is not None and not isinstance(a, (int, float, bool, np.generic))
              and not (type(a) is np.ndarray and a.ndim == 0)]
    if any(on_gpu):
        if not all(on_gpu):
            where = f" in op '{op}'" if op else ""
            raise DTypeError(f"cannot mix numpy (cpu) and cupy (cuda) arrays{where}; "
                             "move them to one device first")
        return _cupy
    return np


def scalars_to(xp, arrays):
    """``arrays`` with their 0-d NumPy arrays (promoted scalars, a label) made ``xp``'s."""
    if xp is np:
        return arrays
    return [xp.asarray(a) if type(a) is np.ndarray and a.ndim == 0 else a for a in arrays]


def to_device(array, device=None):
    """Copy ``array`` to ``device`` (default: the current one) if it is not already there. An
    integer array copied from the host to a GPU has its range kept (:func:`known_range`)."""
    if (device or _device) == "cuda":
        out = cupy_or_error().asarray(array)
        if type(array) is np.ndarray and array.dtype.kind in "iu" and \
                0 < array.size <= _RANGE_KEPT_UP_TO:
            _keep_range(out, int(array.min()), int(array.max()))
        return out
    return to_numpy(array)


# Index arrays made on the host and copied to a GPU (word ids, labels, rows): their least and
# largest entries, taken on the host, so that a take of rows checks its indices without two
# reductions and a wait for the device. Kept per array (its memory's owner: a view, a reshape
# say, holds its entries only), while it lives and is not written: a minicavs write or a
# hand-out through ``.data`` forgets it (autodiff/versions.py).
_ranges = {}  # id(owner) -> (weak reference to it, least, largest)
_RANGE_KEPT_UP_TO = 1 << 20  # entries (a min and max on the host: 0.9 ms at 1 M, about their copy)


def _owner(array):
    """The array whose memory ``array`` views (itself if none): the end of its chain of bases
    (one step on CuPy; the emulated device's arrays wrap NumPy's, a few)."""
    base = getattr(array, "base", None)
    while base is not None:
        array, base = base, getattr(base, "base", None)
    return array


def _keep_range(array, least, largest):
    owner = _owner(array)
    key = id(owner)
    _ranges[key] = (weakref.ref(owner, lambda _, key=key: _ranges.pop(key, None)), least,
                    largest)


def known_range(array):
    """Bounds ``(least, largest)`` of every entry of a device index array copied from the host
    (or taken from such an array: :func:`share_range`), or of a view of one, unchanged since;
    or None."""
    owner = _owner(array)
    found = _ranges.get(id(owner))
    if found is None or found[0]() is not owner:
        return None
    return found[1], found[2]


def share_range(taken, source):
    """``taken`` (a new device array) holds entries of ``source`` only: the bounds kept for
    ``source`` hold for it too."""
    found = known_range(source)
    if found is not None:
        _keep_range(taken, *found)


def forget_range(array):
    """``array`` may be written: the range kept for its memory no longer holds."""
    _ranges.pop(id(_owner(array)), None)


def to_numpy(array):
    return array.get() if is_cupy_array(array) else np.asarray(array)


def default_dtype():
    """dtype of tensors made from Python lists and scalars (float32 unless changed)."""
    return _default_dtype


def set_default_dtype(dtype):
    global _default_dtype
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise DTypeError(f"the default dtype must be a float type, got {dtype}")
    _default_dtype = dtype


def seed(n):
    """Seed NumPy's global generator, CuPy's (if installed) and minicavs' own."""
    global _rng
    np.random.seed(n)
    _rng = np.random.default_rng(n)
    cupy = _import_cupy()
    if cupy is not None:
        try:
            cupy.random.seed(n)
        except Exception:  # CuPy without a device: nothing to seed
            pass


_rng = np.random.default_rng()


def rng():
    """minicavs' random generator (initialisers, synthetic data); reseeded by :func:`seed`."""
    return _rng


_threadpools = None  # threadpoolctl's controller, made on first use


def _blas_pools():
    global _threadpools
    if _threadpools is None:
        try:
            import threadpoolctl

            _threadpools = threadpoolctl.ThreadpoolController().select(user_api="blas")
        except Exception:  # no BLAS that threadpoolctl recognises
            _threadpools = False
    return _threadpools or None


def set_blas_threads(count):
    """Limit NumPy's BLAS to ``count`` threads for the rest of the process; return False if
    no BLAS library was found.

    The GEMMs of a batching task are small; on a busy 2-core machine a second BLAS thread spends
    more time waiting for its sibling than multiplying (the main job measured 2,250 trees/s
    with one thread against 390-560 with two while other work ran). On an idle machine two
    threads win slightly, so the examples default to one and the benchmark sets it per run.
    Switching the count inside a call costs more than it saves, so minicavs never does.
    """
    pools = _blas_pools()
    if pools is None:
        return False
    pools.limit(limits=int(count))  # applies now; the returned restorer is not used
    return True


def get_blas_threads():
    """The BLAS thread count, or None if no BLAS library was found."""
    pools = _blas_pools()
    if pools is None:
        return None
    return max(info["num_threads"] for info in pools.info())


# --- memory -----------------------------------------------------------------------------------

def available_memory(device=None):
    """Bytes this process may still allocate on ``device`` (default: the current one), or None
    if that cannot be found out. On the CPU: the least of the free physical memory
    (``MemAvailable``), what a cgroup limit leaves and what an address-space limit
    (``ulimit -v``) leaves; on a GPU: its free memory plus what CuPy's pool holds unused."""
    device = device or _device
    if device == "cuda" and not cuda_emulated():  # (an emulated device's memory is the host's)
        cupy = cupy_or_error()
        free, _ = cupy.cuda.runtime.memGetInfo()
        return int(free) + int(cupy.get_default_memory_pool().free_bytes())
    limits = [_meminfo_bytes("/proc/meminfo", "MemAvailable")]
    limits.append(_cgroup_headroom())
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            used = _meminfo_bytes("/proc/self/status", "VmSize") or 0
            limits.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError):
        pass
    known = [n for n in limits if n is not None]
    if not known:
        try:
            known = [os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
        except (ValueError, OSError, AttributeError):
            return None
    return min(known)


def _meminfo_bytes(path, key):
    """A ``key: <n> kB`` line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom():
    """What a cgroup (v2, else v1) memory limit leaves, in bytes; None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # no limit (v1 says "a huge number")
            return None
        return max(int(limit) - usage, 0)
    return None
