"""An emulated CUDA device: the whole CuPy path of minicavs run on the CPU, launches counted.

Selected by ``MINICAVS_CUDA_EMULATE=1`` (read when CuPy is first asked for): then
``backend._import_cupy()`` returns :data:`cupy`, a stand-in for the ``cupy`` module, instead of
CuPy, and ``set_device("cuda")`` works without a GPU. Everything above ``backend`` runs its CuPy
branch unchanged:

* **device memory** is host memory, typed :class:`ndarray` (a ``numpy.ndarray`` subclass, so
  ``is_cupy_array`` is true, ``.get()`` copies out and a plain NumPy array beside a device
  array in a ufunc is refused, as CuPy refuses it);
* **kernels**: ``RawKernel`` runs its CUDA source through the g++ shim (``shim.py``), and
  ``ElementwiseKernel`` wraps its body into a grid-stride RawKernel and does the same, so the
  generated fused kernels and the row kernels execute the code a GPU would;
* **library products** (``matmul``, ``dot``, ``einsum``...: cuBLAS on a GPU) and every other
  array function are NumPy's, on the host arrays;
* **streams, events, devices, pools** are stand-ins that do nothing (one device).

Every operation a GPU would launch is counted in :data:`counter` by what it is: ``kernel``
(RawKernel / ElementwiseKernel through the shim), ``library`` (a cuBLAS-like product),
``elementwise`` (a NumPy-forwarded ufunc, reduction or array function: one CuPy kernel each),
``copy`` (host→device, device→host, and device copies: fancy-index gathers, setitem,
concatenation, ``astype``; ``counter.uploads`` tallies the host→device ones, host index
arrays included), ``fill`` (zeros, ones, full). Views (reshape, slicing, transpose,
broadcast) and ``empty`` launch nothing. Functions CuPy runs as several kernels (sort, unique,
nonzero) count one: the counts are a floor, never padded.

What it cannot emulate: timing (a launch costs 25-40 µs from Python on an H100, nothing
here), concurrency and stream order, ``__syncthreads``/shared-memory kernels (the shim runs
one thread at a time), and ``numpy.asarray(device_array)`` (CuPy refuses it; a NumPy subclass
cannot). See ``README.md`` in this folder.
"""

import contextlib
import ctypes
import functools
import re
import time
import types
from collections import Counter

import numpy as np

from ..csource import C_TYPES  # (the C type of each dtype, as the generated kernels write them)

CATEGORIES = ("kernel", "library", "elementwise", "copy", "fill")


class LaunchCounter:
    """Launches issued so far, by category (see the module docstring)."""

    def __init__(self):
        self.counts = Counter()
        self.uploads = 0  # host->device copies among the "copy" launches (each a sync on a GPU)
        self.seconds = 0.0  # spent running kernels, products and ufuncs: the device's work
        self.log = None  # a list to append (category, what) to, while one looks closer
        # Seconds spent inside the emulated library (the shim's kernels, NumPy's work, the
        # stand-in's own bookkeeping): what is left of a loop's time is minicavs' own Python,
        # the host time a GPU's launches wait on.
        self.device_seconds = 0.0
        self._depth = 0
        # Each kernel source a GPU would compile (NVRTC, once per process and source): a
        # source that names a batch's size would grow this with every new shape.
        self.compiled = set()

    @property
    def compiles(self):
        return len(self.compiled)

    def add(self, category, n=1, what=None):
        self.counts[category] += n
        if self.log is not None:
            self.log.append((category, what or _caller()))

    @property
    def total(self):
        return sum(self.counts.values())

    def timed(self, run, *args, **kwargs):
        """``run(*args, **kwargs)``, its time added to :attr:`seconds`."""
        began = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began

    def snapshot(self):
        return dict(self.counts)

    def since(self, snapshot):
        """Launches by category since ``snapshot`` (a :meth:`snapshot`)."""
        return {k: v - snapshot.get(k, 0) for k, v in self.counts.items()
                if v - snapshot.get(k, 0)}

    @contextlib.contextmanager
    def measure(self):
        """``with counter.measure() as got: ...`` — ``got`` holds the launches by category."""
        got = {}
        before = self.snapshot()
        try:
            yield got
        finally:
            got.update(self.since(before))


counter = LaunchCounter()


def _library(func):
    """Time ``func`` as the emulated library's work (outermost calls only: they nest)."""
    @functools.wraps(func)
    def timed(*args, **kwargs):
        if counter._depth:
            return func(*args, **kwargs)
        counter._depth += 1
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            counter.device_seconds += time.perf_counter() - started
            counter._depth -= 1
    return timed


def _caller():
    """Where a launch came from, for :attr:`LaunchCounter.log`: the first frame outside this
    module and NumPy."""
    import sys

    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or "/numpy/" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"


def launches():
    """Launches by category since the process started (a copy)."""
    return counter.snapshot()


# --- device arrays ------------------------------------------------------------------------------

def _host_error(what):
    return TypeError(f"emulated CUDA: {what} got a NumPy array beside device arrays; CuPy "
                     "refuses implicit host-device mixing (move it with xp.asarray first)")


def _unwrap(x, what):
    """A device array as its host ndarray; host arrays refused (CuPy does); scalars pass."""
    if isinstance(x, ndarray):
        return x.view(np.ndarray)
    if isinstance(x, np.ndarray):
        raise _host_error(what)
    return x


def _unwrap_all(x):
    """Device arrays anywhere in nested lists/tuples as host ndarrays (for array functions)."""
    if isinstance(x, ndarray):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap_all(v) for v in x)
    return x


def _wrap(result):
    """NumPy results as device arrays (a scalar becomes a 0-d device array, as in CuPy)."""
    if isinstance(result, np.ndarray):
        return result if isinstance(result, ndarray) else result.view(ndarray)
    if isinstance(result, np.generic):
        return np.asarray(result).view(ndarray)
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    if isinstance(result, list):
        return [_wrap(r) for r in result]
    return result


@_library
def _apply_ufunc(ufunc, method, inputs, kwargs):
    what = f"ufunc '{ufunc.__name__}'"
    args = [_unwrap(x, what) for x in inputs]
    out = kwargs.get("out")
    if out is not None:
        out = out if isinstance(out, tuple) else (out,)
        kwargs = dict(kwargs, out=tuple(_unwrap(o, what) for o in out))
    if "where" in kwargs:
        kwargs["where"] = _unwrap(kwargs["where"], what)
    counter.add("library" if ufunc is np.matmul else "elementwise",
                what=f"{ufunc.__name__}.{method} " + _caller())
    result = counter.timed(getattr(ufunc, method), *args, **kwargs)
    if method == "at":
        return None
    if out is not None:
        return out[0] if len(out) == 1 else out
    return _wrap(result)


def _read_back(convert):
    """A method that reads a device array's value on the host: one copy."""
    def read(self, *args):
        counter.add("copy")
        return convert(self.view(np.ndarray), *args)
    return read


class ndarray(np.ndarray):
    """A device array of the emulated GPU: host memory, CuPy's interface (``get``, ``set``)."""

    __array_priority__ = 1000

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _apply_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _call_function(func.__name__, func, args, kwargs)

    # CuPy's transfers
    @_library
    def get(self, stream=None, out=None):  # noqa: ARG002
        counter.add("copy")
        if out is not None:
            out[...] = self.view(np.ndarray)
            return out
        return self.view(np.ndarray).copy()

    @_library
    def set(self, array, stream=None):  # noqa: ARG002
        counter.add("copy")
        self.view(np.ndarray)[...] = array

    # a device-to-host copy and a sync on a GPU
    item = _read_back(np.ndarray.item)
    tolist = _read_back(np.ndarray.tolist)
    __float__ = _read_back(float)
    __int__ = _read_back(int)
    __bool__ = _read_back(bool)
    __index__ = _read_back(np.ndarray.__index__)

    # copies and fills (not ufuncs: counted here)
    @_library
    def copy(self, order="C"):
        counter.add("copy")
        return self.view(np.ndarray).copy(order).view(ndarray)

    @_library
    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):  # noqa: ARG002
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        counter.add("copy")
        return self.view(np.ndarray).astype(dtype, order=order, casting=casting).view(ndarray)

    @_library
    def fill(self, value):
        counter.add("fill")
        self.view(np.ndarray).fill(value)

    def flatten(self, order="C"):
        counter.add("copy")
        return self.view(np.ndarray).flatten(order).view(ndarray)

    @_library
    def ravel(self, order="C"):
        host = self.view(np.ndarray)
        return _view_or_copy(host.ravel(order), host)

    @_library
    def reshape(self, *shape, **kwargs):
        host = self.view(np.ndarray)
        return _view_or_copy(host.reshape(*shape, **kwargs), host)

    def dot(self, other, out=None):
        counter.add("library")
        return _wrap(counter.timed(np.dot, self.view(np.ndarray), _unwrap(other, "dot"),
                                   out=None if out is None else _unwrap(out, "dot")))

    @_library
    def __getitem__(self, key):
        host = self.view(np.ndarray)
        _upload_host_indices(key)
        key = _unwrap_all(key)
        if _advanced(key):
            counter.add("copy")  # a gather kernel
        return _wrap(host[key])

    @_library
    def __setitem__(self, key, value):
        host = self.view(np.ndarray)
        _upload_host_indices(key)
        key = _unwrap_all(key)
        if isinstance(value, np.ndarray) and not isinstance(value, ndarray):
            counter.add("copy")  # CuPy copies a host value up first
            counter.uploads += 1
        counter.add("copy" if isinstance(value, np.ndarray) else "fill")
        host[key] = value.view(np.ndarray) if isinstance(value, np.ndarray) else value

    def __repr__(self):
        return "emulated_cuda_" + repr(self.view(np.ndarray))

    @property
    def device(self):
        return Device(0)


def _view_or_copy(result, host):
    """A reshape or ravel of ``host`` on the device: a copy where it is not a view."""
    if isinstance(result, np.ndarray) and result.size and not np.shares_memory(result, host):
        counter.add("copy")
    return _wrap(result)


def _upload_host_indices(key):
    """CuPy copies each host index array of an index up first (a copy and a sync on a GPU)."""
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, list) or (isinstance(k, np.ndarray) and not isinstance(k, ndarray)):
            counter.add("copy")
            counter.uploads += 1


def _advanced(key):
    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (np.ndarray, list)) for k in parts)


# --- array functions forwarded to NumPy ---------------------------------------------------------

# No launch: views, metadata, allocation without initialisation.
_NO_LAUNCH = frozenset("""
reshape transpose swapaxes moveaxis rollaxis broadcast_to broadcast_arrays expand_dims squeeze
atleast_1d atleast_2d atleast_3d shape ndim size result_type may_share_memory shares_memory
empty empty_like iinfo finfo dtype can_cast promote_types isscalar split array_split hsplit
vsplit dsplit diagonal real imag flip fliplr flipud rot90 broadcast_shapes min_scalar_type
issubdtype isdtype unravel_index ravel_multi_index get_array_module asnumpy
""".split())
_LIBRARY = frozenset("matmul dot vdot tensordot einsum inner kron".split())
_COPY = frozenset("""
concatenate stack hstack vstack dstack column_stack take take_along_axis put put_along_axis
copy copyto repeat tile pad array asarray ascontiguousarray asfortranarray require
""".split())
_FILL = frozenset("zeros ones full zeros_like ones_like full_like arange eye identity "
                  "linspace".split())


def _category(name):
    if name in _NO_LAUNCH:
        return None
    if name in _LIBRARY:
        return "library"
    if name in _COPY:
        return "copy"
    if name in _FILL:
        return "fill"
    return "elementwise"


@_library
def _call_function(name, func, args, kwargs):
    if name in ("asarray", "array", "ascontiguousarray"):
        return _to_device(name, *args, **kwargs)
    host_args = _unwrap_all(args)
    host_kwargs = {k: _unwrap_all(v) for k, v in kwargs.items()}
    category = _category(name)
    if name in ("ravel", "reshape") and args:
        return _view_or_copy(func(*host_args, **host_kwargs), np.asarray(host_args[0]))
    if category is not None:
        counter.add(category)
    return _wrap(counter.timed(func, *host_args, **host_kwargs))


@_library
def _to_device(name, a, dtype=None, *args, copy=None, **kwargs):
    """``asarray``/``array``/``ascontiguousarray``: a host value copied up (one copy), a device
    array kept (or copied, converted or made contiguous: one copy)."""
    if isinstance(a, ndarray):
        host = a.view(np.ndarray)
        need = (name == "array" and copy is not False) or (
            dtype is not None and np.dtype(dtype) != a.dtype) or (
            name == "ascontiguousarray" and not host.flags.c_contiguous)
        if not need:
            return a
        counter.add("copy")
        if name == "ascontiguousarray":
            return np.ascontiguousarray(host, dtype=dtype).view(ndarray)
        return np.array(host, dtype=dtype, copy=True).view(ndarray)
    counter.add("copy")  # host -> device
    counter.uploads += 1
    host = np.array(_unwrap_all(a), dtype=dtype, copy=True, *args, **kwargs)
    # (C order, its rank kept: np.ascontiguousarray would make a 0-d value (1,), CuPy does not)
    return np.array(host, order="C", copy=not host.flags.c_contiguous).view(ndarray)


class _Ufunc:
    """``cupy.<ufunc>``: NumPy's ufunc on device arrays, refusing host arrays."""

    def __init__(self, ufunc):
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *inputs, **kwargs):
        return _apply_ufunc(self._ufunc, "__call__", inputs, kwargs)

    def __getattr__(self, name):
        attr = getattr(self._ufunc, name)
        if name in ("reduce", "accumulate", "reduceat", "outer", "at"):
            return lambda *inputs, **kwargs: _apply_ufunc(self._ufunc, name, inputs, kwargs)
        return attr


@functools.lru_cache(maxsize=None)
def _forwarder(name):
    func = getattr(np, name)

    @functools.wraps(func)
    def forward(*args, **kwargs):
        return _call_function(name, func, args, kwargs)

    return forward


# --- kernels: CUDA source through the g++ shim --------------------------------------------------

class RawKernel:
    """``cupy.RawKernel``: the source compiled by the shim on first launch, run on the CPU."""

    def __init__(self, code, name, options=(), backend="nvrtc", **kwargs):  # noqa: ARG002
        self.code, self.name, self.options = code, name, options

    @property
    def _kernel(self):
        # (not functools.cached_property: before Python 3.12 its lock is the class's, so one
        # kernel compiling held up every other's, compiled ahead side by side or not)
        kernel = self.__dict__.get("_compiled")
        if kernel is None:
            from . import shim

            counter.compiled.add((self.code, self.name))
            kernel = self.__dict__["_compiled"] = shim.shim_kernel(self.code, self.name)
        return kernel

    def compile(self, log_stream=None):  # noqa: ARG002 (CuPy's signature)
        """Compile now (``RawKernel.compile``), not at the first launch."""
        self._kernel

    @_library
    def __call__(self, grid, block, args, shared_mem=0, stream=None):  # noqa: ARG002
        counter.add("kernel")
        counter.timed(self._kernel, grid, block, tuple(
            a.view(np.ndarray) if isinstance(a, ndarray) else a for a in args))


class RawModule:
    """``cupy.RawModule``: its kernels through the shim."""

    def __init__(self, code, options=(), **kwargs):  # noqa: ARG002
        self.code, self.options = code, options

    def get_function(self, name):
        return RawKernel(self.code, name, self.options)


_PARAM = re.compile(r"^\s*(?:raw\s+)?(\w+)\s+(\w+)\s*$")
_BLOCK_SIZE, _MAX_BLOCKS = 256, 4096


def _parse_params(text):
    params = []
    for decl in filter(None, (d.strip() for d in text.split(","))):
        match = _PARAM.match(decl)
        if match is None or decl.startswith("raw"):
            raise NotImplementedError(f"emulated ElementwiseKernel: parameter {decl!r} "
                                      "(raw and indexed parameters are not emulated)")
        params.append(match.groups())  # (type name, parameter name)
    return params


class ElementwiseKernel:
    """``cupy.ElementwiseKernel``: the body wrapped into a grid-stride RawKernel over the
    broadcast shape (``shim.elementwise_raw_source``) and run by the shim, one per type T."""

    def __init__(self, in_params, out_params, operation, name="kernel", preamble="",
                 options=(), **kwargs):  # noqa: ARG002
        self.in_params, self.out_params = _parse_params(in_params), _parse_params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self._kernels = {}

    def _dtype(self, type_name, t_dtype):
        return t_dtype if type_name == "T" else np.dtype(type_name)

    @_library
    def __call__(self, *args, **kwargs):  # noqa: ARG002
        n_in = len(self.in_params)
        inputs, outs = list(args[:n_in]), list(args[n_in:])
        if any(isinstance(a, np.ndarray) and not isinstance(a, ndarray) for a in args):
            raise _host_error(f"ElementwiseKernel '{self.name}'")
        typed = [a for (t, _), a in zip(self.in_params + self.out_params, args)
                 if t == "T" and isinstance(a, np.ndarray)]
        t_dtype = typed[0].dtype if typed else None
        shapes = [np.shape(a) for a in args]
        full = np.broadcast_shapes(*shapes) if shapes else ()
        host_in = [np.ascontiguousarray(np.broadcast_to(
            np.asarray(_unwrap_all(a), dtype=self._dtype(t, t_dtype)), full))
            for (t, _), a in zip(self.in_params, inputs)]
        while len(outs) < len(self.out_params):
            t = self.out_params[len(outs)][0]
            outs.append(np.empty(full, self._dtype(t, t_dtype)).view(ndarray))
        host_out = []
        for (t, _), o in zip(self.out_params, outs):
            h = o.view(np.ndarray)
            ok = h.flags.c_contiguous and h.shape == full and h.dtype == self._dtype(t, t_dtype)
            host_out.append(h if ok else np.empty(full, self._dtype(t, t_dtype)))
        total = int(np.prod(full, dtype=np.int64))
        counter.add("kernel")
        if total:
            kernel = self._kernel(t_dtype, host_in, host_out)
            blocks = min(-(-total // _BLOCK_SIZE), _MAX_BLOCKS)
            counter.timed(kernel, (blocks,), (_BLOCK_SIZE,), (*host_in, *host_out, total))
        for o, h in zip(outs, host_out):
            if h is not o.view(np.ndarray) and not np.shares_memory(h, o.view(np.ndarray)):
                o.view(np.ndarray)[...] = h
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _kernel(self, t_dtype, host_in, host_out):
        key = (None if t_dtype is None else t_dtype.str,
               tuple(a.dtype.str for a in host_in + host_out))
        kernel = self._kernels.get(key)
        if kernel is None:
            from . import shim

            c = lambda a: C_TYPES[a.dtype]  # noqa: E731
            typedef = f"typedef {C_TYPES[t_dtype]} T;\n" if t_dtype is not None else ""
            source = shim.elementwise_raw_source(
                self.name, [(c(a), n) for a, (_, n) in zip(host_in, self.in_params)],
                [(c(a), n) for a, (_, n) in zip(host_out, self.out_params)],
                self.operation, typedef + self.preamble)
            counter.compiled.add((source, self.name))
            kernel = self._kernels[key] = shim.shim_kernel(source, self.name)
        return kernel


# --- the CUDA runtime stand-ins -----------------------------------------------------------------

class CompileException(Exception):
    """``cupy.cuda.compiler.CompileException`` (the shim raises KernelCompileError itself)."""


class Event:
    done = True

    def record(self, stream=None):  # noqa: ARG002
        pass

    def synchronize(self):
        pass


class Stream:
    """A stream: work runs at once, in order, so every wait is already satisfied."""

    def __init__(self, null=False, non_blocking=False, ptds=False):  # noqa: ARG002
        self.ptr = 0 if null else id(self)

    def record(self, event=None):
        return event or Event()

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass

    def use(self):
        return self

    @property
    def done(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_STREAM = Stream(null=True)


class Device:
    def __init__(self, device=0):
        self.id = int(device)

    def use(self):
        if self.id != 0:
            raise RuntimeError(f"emulated CUDA has one device (0), not {self.id}")

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_POOL = types.SimpleNamespace(  # the memory pools: host memory, nothing kept to report or free
    used_bytes=lambda: 0, free_bytes=lambda: 0, total_bytes=lambda: 0,
    free_all_blocks=lambda: None, set_limit=lambda size=None, fraction=None: None)

_runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1, getDevice=lambda: 0, deviceSynchronize=lambda: None,
    runtimeGetVersion=lambda: 12090, driverGetVersion=lambda: 12090,
    getDeviceProperties=lambda device: {"name": b"minicavs emulated CUDA device"},
    CUDARuntimeError=RuntimeError)

_cuda = types.SimpleNamespace(
    Stream=Stream, Event=Event, Device=Device, runtime=_runtime,
    get_current_stream=lambda: _NULL_STREAM,
    alloc_pinned_memory=lambda nbytes: bytearray(nbytes),
    compiler=types.SimpleNamespace(CompileException=CompileException),
    is_available=lambda: True)
Stream.null = _NULL_STREAM


# --- cuBLAS (the products cuda/blas.py calls): column-major, on the arrays' host memory -------

def _column_major(address, ld, shape, dtype):
    """The column-major ``shape`` matrix at ``address`` whose columns are ``ld`` apart."""
    rows, cols = shape
    if ld < max(1, rows):
        raise ValueError(f"emulated cuBLAS: leading dimension {ld} below the {rows} rows of a "
                         f"column-major operand (CUBLAS_STATUS_INVALID_VALUE on a GPU)")
    item = np.dtype(dtype).itemsize
    count = (cols - 1) * ld + rows
    flat = np.frombuffer((ctypes.c_char * (count * item)).from_address(address), dtype, count)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


def _gemm(dtype):
    @_library
    def gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):  # noqa: ARG001
        counter.add("library")
        a = _column_major(A, lda, (k, m) if transa else (m, k), dtype)
        b = _column_major(B, ldb, (n, k) if transb else (k, n), dtype)
        c = _column_major(C, ldc, (m, n), dtype)
        alpha, beta = (_column_major(p, 1, (1, 1), dtype)[0, 0] for p in (alpha, beta))
        product = alpha * ((a.T if transa else a) @ (b.T if transb else b))
        c[...] = product if beta == 0 else product + beta * c  # (beta 0: C is not read)
    return gemm


_cuda.cublas = types.SimpleNamespace(sgemm=_gemm(np.float32), dgemm=_gemm(np.float64))


# --- the C issuer's driver (issuer.py): cuLaunchKernel and the gemms as C function pointers ----

_LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_GEMM_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_int] * 5, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
_functions, _numbers = [None], {}  # the RawKernels named to the issuer (a CUfunction is not 0)
c_failure = []  # what a stand-in raised (its C caller sees a status): the issuer raises it


def c_function(kernel):
    """The number the issuer passes as this RawKernel's ``CUfunction``."""
    number = _numbers.get(kernel)
    if number is None:
        number = _numbers[kernel] = len(_functions)
        _functions.append(kernel)
    return number


@_library
def _run_from_c(kernel, grid, block, params):
    shim = kernel._kernel
    counter.add("kernel")
    values = [ctypes.c_void_p.from_address(params[i]).value if p.pointer
              else p.ctype.from_address(params[i]).value for i, p in enumerate(shim.params)]
    counter.timed(shim._launch, int(shim.float32_only), *grid, *block, *values)


def _from_c(run):
    @_library  # (from its first line: the callback's own Python is the device's, not the host's)
    def call(*args):
        try:
            run(*args)
        except BaseException as error:  # noqa: BLE001 (handed to the issuer's caller)
            c_failure.append(error)
            return 1
        return 0
    return call


c_launch_function = _LAUNCH_T(_from_c(lambda f, gx, gy, gz, bx, by, bz, shared, stream, params,
                                       extra: _run_from_c(_functions[f], (gx, gy, gz),
                                                          (bx, by, bz), params)))
c_gemm_functions = [_GEMM_T(_from_c(_cuda.cublas.sgemm)), _GEMM_T(_from_c(_cuda.cublas.dgemm))]
c_launch = ctypes.cast(c_launch_function, ctypes.c_void_p).value
c_gemms = [ctypes.cast(g, ctypes.c_void_p).value for g in c_gemm_functions]
_cuda.get_cublas_handle = lambda: 0


class _Random:
    """``cupy.random``: NumPy's legacy generator, results on the device (one launch each)."""

    def seed(self, seed=None):
        np.random.seed(seed)

    def __getattr__(self, name):
        func = getattr(np.random, name)

        def draw(*args, **kwargs):
            counter.add("elementwise")
            return _wrap(np.asarray(func(*_unwrap_all(args), **kwargs)))
        return draw


class _Linalg:
    def __getattr__(self, name):
        func = getattr(np.linalg, name)

        def run(*args, **kwargs):
            counter.add("library")
            return _wrap(func(*_unwrap_all(args), **kwargs))
        return run


class _EmulatedCupy(types.ModuleType):
    """The stand-in for the ``cupy`` module (its ``__name__`` is ``"cupy``, so caches keyed on
    the module name treat it as CuPy)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(np, name)  # AttributeError for what NumPy lacks too
        if isinstance(attr, np.ufunc):
            attr = _Ufunc(attr)
        elif isinstance(attr, types.FunctionType) or type(attr).__name__ in (
                "_ArrayFunctionDispatcher", "builtin_function_or_method"):
            attr = _forwarder(name)
        setattr(self, name, attr)  # (found once: later lookups cost what CuPy's do)
        return attr  # and dtypes, scalar types, constants as they are


def _make_module():
    module = _EmulatedCupy("cupy", "minicavs' emulated CuPy (minicavs/cuda/emulated.py)")
    module.ndarray = ndarray
    module.cuda = _cuda
    module.RawKernel, module.RawModule = RawKernel, RawModule
    module.ElementwiseKernel = ElementwiseKernel
    module.random, module.linalg = _Random(), _Linalg()
    module.get_default_memory_pool = lambda: _POOL
    module.get_default_pinned_memory_pool = lambda: _POOL
    module.asnumpy = lambda a, stream=None, out=None: (  # noqa: ARG005
        a.get(out=out) if isinstance(a, ndarray) else np.asarray(a))
    module.get_array_module = lambda *arrays: module if any(
        isinstance(a, ndarray) for a in arrays) else np
    module.from_dlpack = lambda obj: _to_device("asarray", np.from_dlpack(obj))
    module.fromDlpack = module.from_dlpack
    module.launch_counter = counter  # what the runtime reads for explain()
    module.emulated = True
    return module


cupy = _make_module()


# --- cupyx --------------------------------------------------------------------------------------

def scatter_add(target, index, values):
    """``cupyx.scatter_add`` (one kernel with atomics on a GPU)."""
    counter.add("kernel")
    np.add.at(target.view(np.ndarray), _unwrap_all(index), _unwrap_all(values))


class _Special:
    """``cupyx.scipy.special``: SciPy's, one launch each."""

    def __getattr__(self, name):
        import scipy.special

        func = getattr(scipy.special, name)

        def run(*args, **kwargs):
            counter.add("elementwise")
            return _wrap(np.asarray(func(*[_unwrap(a, name) for a in args], **kwargs)))
        return run


special = _Special()
