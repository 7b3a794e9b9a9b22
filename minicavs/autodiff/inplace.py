"""In-place updates of a Tensor's values, for optimiser-style code (docs/tensors.md gives the
rules)::

    with mc.no_grad():
        for p in params:
            p -= lr * p.grad          # or p.sub_(p.grad, alpha=lr), p.mul_(0.9), p.zero_()

A write goes into the tensor's own array (shared with the tensors of the same array, e.g. its
``detach()``) and bumps its version counter (``versions.py``), so a backward that saved the
old values refuses to run. Where gradients are recorded an update is refused (it would change
the meaning of a graph), except that ``+=``, ``-=``, ... on a computed result build a new
tensor, as Python does for immutable values (``loss += term`` keeps working). The result keeps
the tensor's shape and dtype, as in PyTorch; ``copy_`` converts like ``astype``.
"""

import numpy as np

from .. import backend
from ..errors import DTypeError, ShapeError, UnsupportedError
from ..ops import arithmetic, elementwise as ew
from ..ops.registry import describe
from . import versions


def _grad_involved(tensor, operands):
    from .tensor import Tensor, is_grad_enabled

    return is_grad_enabled() and (tensor.requires_grad or any(
        isinstance(o, Tensor) and o.requires_grad for o in operands))


def _refuse(tensor, what):
    kind = "parameter" if tensor.is_leaf else "tensor"
    raise UnsupportedError(f"{what}: an in-place update where gradients are recorded (this "
                           f"{kind} or an operand requires grad); wrap optimiser-style updates "
                           f"in `with mc.no_grad():`, or write x = x - y to build a new tensor")


def write(tensor, result, what, cast="same_kind"):
    """Write ``result`` (an array or Tensor) into ``tensor``'s array; return ``tensor``."""
    from .tensor import Tensor

    array = result._array if isinstance(result, Tensor) else result
    if backend.is_cupy_array(array) != backend.is_cupy_array(tensor._array):
        array = backend.to_device(array, tensor.device)
    target = tensor._array
    if not hasattr(array, "shape"):
        array = np.asarray(array)
    try:
        fits = np.broadcast_shapes(tuple(array.shape), tuple(target.shape)) == tuple(target.shape)
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(f"{what}: the result has shape {describe(array.shape)}, which does not "
                         f"fit the tensor's shape {describe(target.shape)} (an in-place update "
                         f"keeps the shape)")
    if not np.can_cast(array.dtype, target.dtype, casting=cast):
        raise DTypeError(f"{what}: the result has dtype {array.dtype}, which cannot be stored "
                         f"in the tensor's dtype {target.dtype} (as in PyTorch); convert the "
                         f"tensor first (x = x.astype('{array.dtype}'))")
    if not getattr(getattr(target, "flags", None), "writeable", True):
        raise UnsupportedError(f"{what}: the tensor's array is read-only (a broadcast, or a "
                               f"value computed under mc.autobatch, which lives in the block's "
                               f"storage); copy it first (x = x + 0)")
    versions.writing(tensor)
    target[...] = array
    versions.changed(tensor)
    return tensor


def update(tensor, fn, operands, what, operator=False):
    """``tensor`` updated in place to ``fn(tensor, *operands)``, computed without recording."""
    from .tensor import no_grad

    if _grad_involved(tensor, operands):
        if operator and not tensor.is_leaf:
            return fn(tensor, *operands)  # a computed result: a new tensor, as Python would
        _refuse(tensor, what)
    with no_grad():
        result = fn(tensor, *operands)
    return write(tensor, result, what)


def add(tensor, other, alpha=1):
    return update(tensor, lambda t, o: t + o * alpha if alpha != 1 else t + o, (other,),
                  "add_")


def sub(tensor, other, alpha=1):
    return update(tensor, lambda t, o: t - o * alpha if alpha != 1 else t - o, (other,),
                  "sub_")


def copy(tensor, source):
    """``tensor``'s values replaced by ``source``'s (broadcast; any dtype converts)."""
    if _grad_involved(tensor, (source,)):
        _refuse(tensor, "copy_")
    data = getattr(source, "_array", source)
    if not hasattr(data, "dtype"):
        data = np.asarray(data)
    return write(tensor, data.astype(tensor.dtype, copy=False), "copy_", cast="unsafe")


def fill(tensor, value, what="fill_"):
    if _grad_involved(tensor, ()):
        _refuse(tensor, what)
    xp = backend.get_array_module(tensor._array)
    return write(tensor, xp.asarray(np.asarray(value).astype(tensor.dtype)), what)


OPERATORS = {"__iadd__": (ew.add, "+="), "__isub__": (ew.sub, "-="), "__imul__": (ew.mul, "*="),
             "__itruediv__": (ew.div, "/="), "__ifloordiv__": (arithmetic.floor_divide, "//="),
             "__imod__": (arithmetic.remainder, "%=")}


def in_place_operator(name):
    fn, symbol = OPERATORS[name]

    def operator(self, other):
        return update(self, fn, (other,), f"operator {symbol}", operator=True)
    operator.__name__ = name
    return operator
