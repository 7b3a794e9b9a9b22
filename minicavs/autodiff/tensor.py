"""Eager tensors with reverse-mode autodiff.

Every op applied to a Tensor runs at once and, when gradients are wanted, records
``(op, inputs, attrs)`` on its output. ``backward()`` sorts the recorded graph topologically
(iteratively: a chain of 100,000 ops is fine) and walks it in reverse, calling each op's VJP.
Because VJPs are written with ops, running them with recording switched on
(``create_graph=True``) gives gradients that can themselves be differentiated.

A second ``backward()`` through the same graph is an error unless the first one passed
``retain_graph=True``: backward releases the recorded graph so its intermediates can be freed,
and refusing is better than silently producing gradients from a half-released graph. With
``retain_graph=True`` the second call is allowed and, like every backward, *adds* into ``.grad``.
"""

import contextlib
import threading
import weakref

import numpy as np

from .. import backend, validate
from ..errors import DeviceError, DTypeError, MinicavsError, ShapeError
from ..ops import registry
from ..ops.operators import OperatorMixin
from . import debug, inplace, versions
from ..locations import user_location

class _GradMode(threading.local):
    """Whether ops are recorded for autodiff: per thread, as in PyTorch (a data-loading
    thread's ``no_grad`` must not switch off the training thread's gradients)."""

    enabled = True


grad_mode = _GradMode()
# Held while a backward pass adds into a leaf's .grad: two threads' backward passes through
# one parameter both count (as PyTorch's AccumulateGrad), none overwrites the other.
grad_lock = threading.Lock()


@contextlib.contextmanager
def _grad_mode_set(enabled):
    previous, grad_mode.enabled = grad_mode.enabled, enabled
    registry.grad_mode_changed(enabled)
    try:
        yield
    finally:
        grad_mode.enabled = previous
        registry.grad_mode_changed(previous)


def no_grad():
    """Within this block ops are not recorded: nothing can be differentiated, nothing is kept."""
    return _grad_mode_set(False)


def enable_grad():
    return _grad_mode_set(True)


def is_grad_enabled():
    return grad_mode.enabled


_RELEASED = object()  # marks a tensor whose recorded graph a backward() has released


class Tensor(OperatorMixin):
    """An array (NumPy or CuPy) with an optional gradient and the op that produced it."""

    __slots__ = ("_array", "_versions", "grad", "requires_grad", "_creator", "name",
                 "__weakref__")
    __minicavs_priority__ = 1

    def __init__(self, data, requires_grad=False, name=None):
        shared = None
        if isinstance(data, Tensor):
            data, shared = data._array, data._versions
        if isinstance(data, np.generic) or not backend.is_array(data):
            data = _to_numpy(data)
        _check_numeric(data)
        if requires_grad and np.dtype(data.dtype).kind != "f":
            raise DTypeError(f"only float tensors can require gradients, got dtype {data.dtype}")
        self._array = data
        self._versions = shared or versions.Version()  # shared with tensors of the same array
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._creator = None  # (op, inputs, attrs) for a recorded result
        self.name = name

    # --- the array it holds ---------------------------------------------------------------------
    @property
    def data(self):
        """The NumPy or CuPy array. Writing into it between a forward pass and its backward is
        detected at backward (``autodiff/versions.py``)."""
        versions.exposed(self)
        return self._array

    @data.setter
    def data(self, array):
        versions.writing(self)
        self._array = array
        versions.changed(self)

    @property
    def version(self):
        """How many times the values may have changed in place (see ``versions.py``)."""
        return self._versions.count

    @property
    def shape(self):
        return self._array.shape

    @property
    def dtype(self):
        return self._array.dtype

    @property
    def device(self):
        return "cuda" if backend.is_cupy_array(self._array) else "cpu"

    @property
    def is_leaf(self):
        return self._creator is None

    def numpy(self):
        """The values as a NumPy array (copied from the GPU if needed)."""
        array = self._array
        if backend.is_cupy_array(array):  # a copy: writing into it cannot reach the tensor, so
            return backend.to_numpy(array)  # nothing is exposed (no fingerprint: two syncs)
        return backend.to_numpy(self.data)

    def item(self):
        """The one element as a Python number."""
        return self._one_element("item()").item()

    def tolist(self):
        """The values as (nested) Python lists of Python numbers."""
        return self.numpy().tolist()

    # --- conversions: Python numbers, NumPy, DLPack, CUDA -----------------------------------------
    def _one_element(self, what):
        if self._array.size != 1:
            raise ShapeError(f"{what} needs a tensor with one element, got shape "
                             f"{tuple(self.shape)} ({self._array.size} elements); use .any() or "
                             f".all() for a mask, or index one element")
        return self.numpy().reshape(())

    def __bool__(self):
        return bool(self._one_element("the truth value of a tensor"))

    def __float__(self):
        return float(self._one_element("float()"))

    def __int__(self):
        return int(self._one_element("int()"))

    def __index__(self):
        if np.dtype(self.dtype).kind not in "iu":
            raise DTypeError(f"only an integer tensor can be used as an index, got dtype "
                             f"{self.dtype}")
        return int(self._one_element("an index"))

    def __format__(self, spec):
        if spec and self.data.size == 1:  # f"{loss:.4f}"
            return format(self.item(), spec)
        return format(str(self), spec)

    def __array__(self, dtype=None, copy=None):
        """NumPy's view of the data (``np.asarray(t)``); CUDA data is not copied implicitly."""
        if backend.is_cupy_array(self.data):
            raise DeviceError("a CUDA tensor cannot become a NumPy array implicitly (that would "
                              "be a hidden device-to-host copy); call t.numpy() to copy it")
        if dtype is not None and np.dtype(dtype) != self.data.dtype:
            if copy is False:
                raise ValueError(f"np.asarray(t, dtype={np.dtype(dtype)}, copy=False): the "
                                 f"tensor is {self.dtype}, converting it needs a copy")
            return self.data.astype(dtype)
        return self.data.copy() if copy else self.data

    def __dlpack__(self, *args, **kwargs):
        """The DLPack protocol (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``, JAX, CuPy):
        the consumer shares the memory, no copy. A read-only view (a broadcast) is copied
        first, as DLPack cannot say "read-only" to every consumer."""
        data = self.data
        if not getattr(getattr(data, "flags", None), "writeable", True):
            data = data.copy()
        return data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()

    @property
    def __cuda_array_interface__(self):
        """The CUDA array interface of CUDA data (Numba, PyTorch, CuPy read it); a CPU tensor
        has none, so ``hasattr(t, "__cuda_array_interface__")`` says whether there is one."""
        if not backend.is_cupy_array(self.data):
            raise AttributeError("a CPU tensor has no __cuda_array_interface__")
        return self.data.__cuda_array_interface__

    def detach(self):
        """The same data (and version counter), cut off from the recorded graph."""
        return Tensor(self)

    def to(self, device):
        return Tensor(backend.to_device(self._array, device), requires_grad=self.requires_grad)

    def zero_grad(self):
        self.grad = None

    # --- in-place updates (``inplace.py``: under no_grad, for optimiser-style code) ------------
    __iadd__ = inplace.in_place_operator("__iadd__")
    __isub__ = inplace.in_place_operator("__isub__")
    __imul__ = inplace.in_place_operator("__imul__")
    __itruediv__ = inplace.in_place_operator("__itruediv__")
    __ifloordiv__ = inplace.in_place_operator("__ifloordiv__")
    __imod__ = inplace.in_place_operator("__imod__")

    def add_(self, other, alpha=1):
        """``self += alpha * other`` in place (see ``inplace.py``); returns ``self``."""
        return inplace.add(self, other, alpha)

    def sub_(self, other, alpha=1):
        return inplace.sub(self, other, alpha)

    def mul_(self, other):
        return inplace.update(self, lambda t, o: t * o, (other,), "mul_")

    def div_(self, other):
        return inplace.update(self, lambda t, o: t / o, (other,), "div_")

    def copy_(self, source):
        """This tensor's values replaced by ``source``'s (broadcast, converted)."""
        return inplace.copy(self, source)

    def fill_(self, value):
        return inplace.fill(self, value)

    def zero_(self):
        return inplace.fill(self, 0, "zero_")

    def __repr__(self):
        flag = ", requires_grad=True" if self.requires_grad else ""
        name = f", name={self.name!r}" if self.name else ""
        body = np.array2string(backend.to_numpy(self._array), separator=", ", threshold=20,
                               prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{flag}{name})"

    # --- eager execution --------------------------------------------------------------------------
    @classmethod
    def __minicavs_apply__(cls, op, args, attrs):
        # While this thread has an automatic-batching scope (``minicavs/autobatch``), ops on
        # Tensors go to its recorder instead of being run (``registry.recording``).
        tracers = registry.tracers() if registry.tracing_threads else None
        if registry.recording_threads and not tracers:
            recorder = registry.recording.recorder
            if recorder is not None:
                return recorder(op, args, attrs)
        if tracers and any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return tracers[-1].record(op, args, attrs)
        inputs = [a if isinstance(a, Tensor) else Tensor(a) for a in args]
        op.infer(*inputs, **attrs)  # shape and dtype errors name the op and the arguments
        arrays = [t._array for t in inputs]
        xp = backend.get_array_module(*arrays, op=op.name)
        result = op.forward(xp, *backend.scalars_to(xp, arrays), **attrs)
        outputs = [Tensor(r) for r in result] if op.multi_output else [Tensor(result)]
        if debug.enabled:
            debug.check_eager(op, inputs, outputs)
        if grad_mode.enabled and op.vjp is not None and any(
                t.requires_grad for i, t in enumerate(inputs) if i not in op.nondiff_args):
            record = _Record(op, inputs, attrs, outputs)
            for index, out in enumerate(outputs):
                if np.dtype(out.dtype).kind == "f":  # a cast to int or bool ends the gradient
                    out.requires_grad = True
                    out._creator = (record, index)
        return tuple(outputs) if op.multi_output else outputs[0]

    # --- reverse mode -----------------------------------------------------------------------------
    def backward(self, grad=None, retain_graph=False, create_graph=False):
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

        ``grad`` is the gradient flowing into ``self``; it may be omitted only for a tensor with
        one element. ``retain_graph`` keeps the recorded graph for another backward;
        ``create_graph`` records the backward computation so gradients can be differentiated.
        """
        grad = backward_seed(self, grad)
        if grad is None:
            grad = Tensor(backend.get_array_module(self._array).ones_like(self._array))
        with (enable_grad() if create_graph else no_grad()):
            _backpropagate(self, grad, retain_graph or create_graph, create_graph)


def backward_seed(t, grad):
    """``grad`` of ``t.backward(grad)`` as a Tensor, checked (None: the default, 1)."""
    if not t.requires_grad:
        raise MinicavsError("backward() on a tensor that does not require grad: no input of "
                            "the computation had requires_grad=True")
    if grad is None:
        if int(np.prod(t.shape)) != 1:
            raise ShapeError(f"backward() without a gradient needs a tensor with one element, "
                             f"got shape {t.shape}; pass grad= explicitly")
        return None
    grad = grad if isinstance(grad, Tensor) else Tensor(grad)
    if tuple(grad.shape) != tuple(t.shape) or grad.dtype != t.dtype:
        raise ShapeError(f"backward(): grad has shape {grad.shape} and dtype {grad.dtype}, the "
                         f"tensor has shape {t.shape} and dtype {t.dtype}")
    return grad


class _Record:
    """One recorded op application: what backward needs to call its VJP, the versions of the
    tensors it saved (``versions.py``) and, in debug mode, the user's line that made it."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "saved", "where")
    release = None  # (a record holding more than its tape — a block of mc.autobatch — frees
    # it here when backward releases the graph: autobatch/scope._TapeRecord)

    def __init__(self, op, inputs, attrs, outputs):
        self.op, self.inputs, self.attrs = op, inputs, attrs
        # Outputs are held weakly: a result nobody keeps has no gradient, and is not kept alive.
        self.outputs = [weakref.ref(t) for t in outputs]
        self.saved = versions.save(inputs + outputs)
        self.where = user_location() if debug.enabled else None

    def check_saved(self, outs):
        """Refuse to differentiate if an input or a kept output changed in place since."""
        roles = [self.op.argument_name(i) for i in range(len(self.inputs))] + [
            "its output" if len(outs) == 1 else f"its output {k}" for k in range(len(outs))]
        versions.check(self.inputs + outs, self.saved, self.op.name, self.where, roles)


def _topological_order(root):
    """Records reachable from ``root``, every record after the records of its inputs."""
    order, visited = [], set()
    stack = [(root._creator, False)] if root._creator is not None else []  # a leaf: nothing
    while stack:
        creator, inputs_done = stack.pop()
        if creator is _RELEASED:
            raise MinicavsError(
                "backward() through a graph a second time: the first backward() released it. "
                "Pass retain_graph=True to the first backward() if you need to go through it "
                "again (gradients then add up in .grad).")
        record = creator[0]
        if inputs_done:
            order.append(record)
            continue
        if id(record) in visited:
            continue
        visited.add(id(record))
        stack.append((creator, True))
        for x in record.inputs:
            if x.requires_grad and x._creator is not None and (
                    x._creator is _RELEASED or id(x._creator[0]) not in visited):
                stack.append((x._creator, False))
    return order


def _backpropagate(root, grad, retain_graph, create_graph):
    grads = {id(root): (grad, root)}  # id(tensor) -> (gradient, tensor)
    leaves = {}
    if root._creator is None:
        leaves[id(root)] = root
    for record in reversed(_topological_order(root)):
        outs = [ref() for ref in record.outputs]
        out_grads = [grads.pop(id(o), (None,))[0] if o is not None else None for o in outs]
        if all(g is None for g in out_grads):
            continue
        record.check_saved(outs)
        op = record.op
        debug.backward_of = record
        try:
            if op.multi_output:
                input_grads = op.vjp(out_grads, outs, *record.inputs, **record.attrs)
            else:
                input_grads = op.vjp(out_grads[0], outs[0], *record.inputs, **record.attrs)
        finally:
            debug.backward_of = None
        for i, (x, gx) in enumerate(zip(record.inputs, input_grads)):
            if gx is None or not x.requires_grad or i in op.nondiff_args:
                continue
            previous = grads.get(id(x))
            grads[id(x)] = gx if previous is None else previous[0] + gx, x
            if x._creator is None:
                leaves[id(x)] = x
        if not retain_graph:
            for o in outs:
                if o is not None:
                    o._creator = _RELEASED
            if record.release is not None:
                record.release()
    for key, t in leaves.items():
        g = grads[key][0]
        if not create_graph:
            g = g.detach()
        with grad_lock:
            t.grad = g if t.grad is None else t.grad + g


class Parameter(Tensor):
    """A trainable tensor: always requires grad; float32 unless given a float64 array."""

    __slots__ = ()

    def __init__(self, data, name=None):
        source = data._array if isinstance(data, Tensor) else data
        data = as_array(data)
        if data is source:  # own the array: optimisers update it in place
            data = data.copy()
        super().__init__(data, requires_grad=True, name=name)


def as_array(data, dtype=None, device=None):
    """An array on ``device``: NumPy/CuPy arrays keep their dtype, lists and scalars take the
    default dtype."""
    if isinstance(data, Tensor):
        data = data._array
    keeps_dtype = backend.is_array(data) or isinstance(data, np.generic)
    if dtype is None and not keeps_dtype:
        dtype = backend.default_dtype()
    if dtype is not None:
        dtype = validate.dtype(dtype, "dtype", "mc.tensor")
    if device is None and backend.is_cupy_array(data):
        device = "cuda"
    if not keeps_dtype:
        data = _to_numpy(data)
    array = backend.to_device(_check_numeric(data), device or backend.get_device())
    if dtype is not None and array.dtype != dtype:
        if dtype.kind in "iu" and array.dtype.kind == "f":
            _check_integral(array, dtype)
        array = array.astype(dtype)
    return array


def tensor(data, requires_grad=False, dtype=None, device=None, name=None):
    """Make a Tensor. A NumPy or CuPy array keeps its dtype; lists and scalars become float32
    (the default dtype) unless ``dtype`` is given. An array of the right dtype and device is
    wrapped without a copy, as ``torch.from_numpy`` wraps one: a write through your own
    reference to it after a forward pass read it is not seen by backward (only debug mode,
    ``with mc.debug():``, checks saved values' contents; ``autodiff/versions.py``), so pass
    ``array.copy()`` where you keep writing into the array."""
    return Tensor(as_array(data, dtype, device), requires_grad=requires_grad, name=name)


_NUMERIC_KINDS = "biuf"
_DTYPE_HINTS = {"U": " (strings)", "S": " (bytes)", "O": " (Python objects: None, or a mix of "
                "types)", "c": " (complex numbers are not supported)",
                "M": " (dates)", "m": " (time spans)", "V": " (raw or structured records)"}


def _check_numeric(array):
    kind = np.dtype(array.dtype).kind
    if kind not in _NUMERIC_KINDS:
        raise DTypeError(f"a tensor holds bool, integer or float values, got dtype "
                         f"{array.dtype}" + _DTYPE_HINTS.get(kind, ""))
    return array


def _check_integral(array, dtype):
    """Converting floats to ``dtype`` (an integer type) must not turn NaN, inf or values out of
    its range into arbitrary integers."""
    info = np.iinfo(dtype)
    xp = backend.get_array_module(array)
    fits = xp.isfinite(array) & (array >= info.min) & (array <= info.max)
    if not bool(fits.all()):
        bad = float(backend.to_numpy(array)[~backend.to_numpy(fits)][0])
        raise DTypeError(f"cannot convert {bad!r} to {dtype}: NaN, inf and values outside "
                         f"{info.min}..{info.max} have no {dtype} value")


def _to_numpy(data):
    """A Python scalar or (nested) list as a NumPy array, with a minicavs error for what is not
    one: None, strings, lists of different lengths."""
    if data is None:
        raise DTypeError("a tensor needs numbers, got None")
    try:
        return np.asarray(data)
    except (ValueError, TypeError):  # ragged nested lists, odd objects
        raise ShapeError(f"cannot make a tensor of {type(data).__name__} {_short(data)}: "
                         f"nested lists must be rectangular (every row of one length) and "
                         f"hold numbers") from None


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def from_dlpack(obj):
    """A Tensor sharing the memory of ``obj``, any DLPack producer (a PyTorch, JAX or CuPy
    array, a NumPy array): CPU memory becomes NumPy data, CUDA memory CuPy data. Its owner
    may write the memory behind minicavs' back, so a record that saves it keeps a checksum,
    and backward refuses it if it changed (``versions.py``)."""
    if not hasattr(obj, "__dlpack_device__"):
        raise DTypeError(f"from_dlpack: {type(obj).__name__} does not implement the DLPack "
                         f"protocol (__dlpack__ and __dlpack_device__)")
    device_type = int(obj.__dlpack_device__()[0])
    if device_type in (1, 3):  # kDLCPU, kDLCUDAHost
        tensor = Tensor(np.from_dlpack(obj))
    elif device_type in (2, 13):  # kDLCUDA, kDLCUDAManaged
        tensor = Tensor(backend.cupy_or_error().from_dlpack(obj))
    else:
        raise DeviceError(f"from_dlpack: DLPack device type {device_type} is neither the CPU nor "
                      f"a CUDA GPU")
    tensor._versions.external = True  # its owner may write it: records fingerprint it
    return tensor


registry.set_default_handler(Tensor.__minicavs_apply__)
