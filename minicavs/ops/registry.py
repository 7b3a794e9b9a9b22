"""The op registry: one definition per primitive, used three ways.

A primitive (:class:`Op`) bundles everything minicavs knows about an operation:

* ``forward(xp, *arrays, **attrs)`` computes it on NumPy or CuPy arrays;
* ``infer(*avals, **attrs)`` gives the output's shape and dtype from the inputs' (anything with
  ``.shape`` and ``.dtype``) and raises a clear error for inputs that do not fit;
* ``vjp(g, out, *inputs, **attrs)`` returns the gradient for each input, written *with ops*, so
  the same rule runs on eager Tensors (backward), on Symbols (a symbolic backward graph) and with
  ``create_graph=True`` (higher derivatives);
* ``c_expr``, for elementwise ops, a C expression template (``"tanh({0})"``) from which the
  fusion code generator writes CPU and CUDA kernels.

:func:`apply` is the single entry point. It converts Python scalars to constants of the
operands' dtype and hands the call to the handler of the "highest" operand kind present: a
Symbol turns the call into a graph node, a Tensor runs it eagerly and records it for backward.
"""

from collections import namedtuple

import numpy as np

from ..errors import DTypeError, ShapeError

Aval = namedtuple("Aval", "shape dtype")
Aval.__doc__ = "An abstract value: the shape and dtype of an array, without its data."

_SCALARS = (bool, int, float, np.number, np.bool_)


class Op:
    """A primitive operation. See the module docstring for the meaning of each field."""

    def __init__(self, name, forward, infer, vjp=None, c_expr=None, nondiff_args=(),
                 multi_output=False):
        self.name = name
        # A multi-output op returns a tuple; its vjp gets a list of output gradients (None for
        # an output no one used) and the tuple of outputs. Only eager calls of whole static
        # functions are multi-output; traced graphs use single-output primitives.
        self.multi_output = multi_output
        self.forward = forward
        self.infer = infer
        self.vjp = vjp  # None: not differentiable (comparisons, one_hot)
        self.c_expr = c_expr
        self.nondiff_args = frozenset(nondiff_args)  # argument positions that get no gradient

    @property
    def is_elementwise(self):
        return self.c_expr is not None

    def __repr__(self):
        return f"Op({self.name})"


OPS = {}  # name -> Op: the registry itself


def register(op):
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is defined twice")
    OPS[op.name] = op
    return op


# --- dispatch ---------------------------------------------------------------------------------

# The stack of active symbolic tracers (see autodiff/symbolic.py). While one is active, an op on
# Tensors that require grad is recorded in the graph too, so ``W.T`` inside a traced function
# stays connected to ``W`` instead of becoming a frozen constant.
tracing = []

_default_handler = None  # set by minicavs.autodiff.tensor: plain arrays run eagerly as Tensors


def set_default_handler(handler):
    global _default_handler
    _default_handler = handler


def is_scalar(x):
    return isinstance(x, _SCALARS)


def _scalar_dtype(args):
    """The dtype a Python scalar takes in an expression: that of the first array operand."""
    for a in args:
        dtype = getattr(a, "dtype", None)
        if dtype is not None and not is_scalar(a) and np.dtype(dtype) != np.bool_:
            return np.dtype(dtype)
    from ..backend import default_dtype

    return default_dtype()


def apply(op, *args, **attrs):
    """Apply primitive ``op`` to ``args``: Tensors, Symbols, arrays or Python scalars."""
    if any(is_scalar(a) for a in args):
        dtype = _scalar_dtype(args)
        args = tuple(dtype.type(a) if is_scalar(a) else a for a in args)
    handler, priority = _default_handler, -1
    for a in args:
        p = getattr(type(a), "__minicavs_priority__", None)
        if p is not None and p > priority:
            handler, priority = type(a).__minicavs_apply__, p
    return handler(op, args, attrs)


# --- shape and dtype rules shared by many ops -------------------------------------------------

def describe(shape):
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast_shapes(opname, avals):
    """NumPy broadcasting of the avals' shapes; an error names the op, positions and shapes."""
    result = ()
    for i, a in enumerate(avals):
        try:
            result = np.broadcast_shapes(result, tuple(a.shape))
        except ValueError:
            first = next(j for j in range(i) if _clashes(avals[j].shape, a.shape)) if i else 0
            raise ShapeError(
                f"op '{opname}': argument {first} has shape {describe(avals[first].shape)} and "
                f"argument {i} has shape {describe(a.shape)}, which do not broadcast together"
            ) from None
    return result


def _clashes(s1, s2):
    try:
        np.broadcast_shapes(tuple(s1), tuple(s2))
        return False
    except ValueError:
        return True


def common_dtype(opname, avals, positions=None):
    """All operands must share one dtype; float32 and float64 are never mixed silently."""
    positions = range(len(avals)) if positions is None else positions
    dtype = None
    first = None
    for i in positions:
        d = np.dtype(avals[i].dtype)
        if dtype is None:
            dtype, first = d, i
        elif d != dtype:
            raise DTypeError(
                f"op '{opname}': argument {first} has dtype {dtype} and argument {i} has dtype "
                f"{d}; convert one explicitly (e.g. x.astype('{dtype}'))"
            )
    return dtype


def require_float(opname, aval, position=0):
    if np.dtype(aval.dtype).kind != "f":
        raise DTypeError(f"op '{opname}': argument {position} must be a float array, "
                         f"got dtype {np.dtype(aval.dtype)}")


def require_int(opname, aval, position):
    if np.dtype(aval.dtype).kind not in "iu":
        raise DTypeError(f"op '{opname}': argument {position} must be an integer array of "
                         f"indices, got dtype {np.dtype(aval.dtype)}")


def normalize_axis(opname, axis, ndim, position=0):
    if not -ndim <= axis < ndim:
        raise ShapeError(f"op '{opname}': axis {axis} is out of range for argument {position} "
                         f"with {ndim} dimension(s)")
    return axis % ndim


def normalize_axes(opname, axis, ndim):
    """None -> all axes; int or sequence -> sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = tuple(sorted({normalize_axis(opname, int(a), ndim) for a in axes}))
    if len(out) != len(axes):
        raise ShapeError(f"op '{opname}': repeated axis in {axis}")
    return out
