"""Elementwise primitives. Each broadcasts like NumPy; its VJP sums the gradient back to each
input's shape (:func:`unbroadcast`). ``c`` is the C expression the fusion code generator uses:
``{0}, {1}, ...`` are the operands, ``{T}`` is the C type, other fields are attributes. ``into``
is the NumPy writer: a ufunc takes its output array as the positional argument after its
inputs, so ``np.add`` is already a writer ``np.add(a, b, out)``, with no Python layer between."""

import numpy as np

from . import batching, reduce, shape
from .formula import c_expr, writer
from .registry import Aval, Op, apply, broadcast_shapes, common_dtype, register, require_float
from .rows import HULL, INTERSECT, KEEPS


def unbroadcast(g, target_shape):
    """Sum ``g`` over the axes that broadcasting added or stretched, back to ``target_shape``."""
    target_shape = tuple(target_shape)
    g_shape = tuple(g.shape)
    if g_shape == target_shape:
        return g
    lead = len(g_shape) - len(target_shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(target_shape) if d == 1 and g_shape[lead + i] != 1)
    return shape.reshape(reduce.sum(g, axis=axes, keepdims=True), target_shape)


def _infer(name, float_only=False, out_dtype=None, skip=()):
    def infer(*avals, **attrs):
        out_shape = broadcast_shapes(name, avals)
        checked = [i for i in range(len(avals)) if i not in skip]
        dtype = common_dtype(name, avals, checked)
        if float_only:
            require_float(name, avals[checked[0]], checked[0])
        return Aval(out_shape, np.dtype(out_dtype) if out_dtype else dtype)
    return infer


def elementwise(name, *, vjp, forward=None, c=None, into=None, in_place=True, formula=None,
                quiet_overflow=False, float_only=False, out_dtype=None, skip=(), **rules):
    """Register an elementwise op: it batches by broadcasting (``batching.elementwise_rule``),
    and has a C expression ``c`` and a NumPy writer ``into``, by default in place. A
    ``formula`` (see formula.py) gives forward, ``c`` and ``into`` from one definition.
    ``rules``: the other fields of :class:`Op` (zero_rows, commutative, ...)."""
    if formula is not None:
        forward, c, into = formula, c_expr(formula), writer(formula)
    if into is None:
        raise ValueError(f"elementwise op {name!r} needs a NumPy writer (into) or a formula")
    if quiet_overflow:
        forward = _quietly(forward)
    return register(Op(name, forward, _infer(name, float_only, out_dtype, skip), vjp, c,
                       batch=batching.elementwise_rule, into=into, in_place=in_place,
                       quiet_overflow=quiet_overflow, **rules))


def _quietly(forward):
    def quiet(xp, *args, **attrs):
        with np.errstate(over="ignore", under="ignore"):
            return forward(xp, *args, **attrs)
    return quiet


def _sigmoid(xp, x):
    # e^-x overflows to inf for very negative x, giving the right limit 0. As four SIMD ufuncs
    # (the writer) this is about 4x faster than scipy.special.expit (benchmarks/fusion_cpu.py).
    return 1 / (1 + xp.exp(-x))


def _pow_into(x, out, exponent):
    np.power(x, out.dtype.type(exponent), out=out)


def _relu_into(x, out):
    np.maximum(x, out.dtype.type(0), out=out)


def _maximum_into(a, b, out):
    np.maximum(a, b, out=out)  # (NumPy deprecates a positional out for maximum and minimum)


def _where_into(cond, a, b, out):
    # Two copies: the second overwrites the first where cond holds, so out must not be a or b.
    np.copyto(out, b)
    np.copyto(out, a, where=cond)


def _astype_into(x, out, dtype):
    np.copyto(out, x, casting="unsafe")


# add and mul are exactly commutative in IEEE arithmetic, and associative up to rounding.
ADD = elementwise("add", forward=lambda xp, a, b: xp.add(a, b),
                  vjp=lambda g, out, a, b: (unbroadcast(g, a.shape), unbroadcast(g, b.shape)),
                  c="({0} + {1})", into=np.add, zero_rows=HULL, commutative=True,
                  associative=True)
SUB = elementwise("sub", forward=lambda xp, a, b: xp.subtract(a, b),
                  vjp=lambda g, out, a, b: (unbroadcast(g, a.shape), unbroadcast(neg(g), b.shape)),
                  c="({0} - {1})", into=np.subtract, zero_rows=HULL)
MUL = elementwise("mul", forward=lambda xp, a, b: xp.multiply(a, b),
                  vjp=lambda g, out, a, b: (unbroadcast(g * b, a.shape),
                                            unbroadcast(g * a, b.shape)),
                  c="({0} * {1})", into=np.multiply, zero_rows=INTERSECT, commutative=True,
                  associative=True)
DIV = elementwise("div", forward=lambda xp, a, b: xp.divide(a, b),
                  vjp=lambda g, out, a, b: (unbroadcast(g / b, a.shape),
                                            unbroadcast(neg(g * out / b), b.shape)),
                  c="({0} / {1})", into=np.divide, float_only=True)  # 0/0 is not 0: no zero_rows
NEG = elementwise("neg", forward=lambda xp, x: xp.negative(x), vjp=lambda g, out, x: (neg(g),),
                  c="(-{0})", into=np.negative, zero_rows=KEEPS)
# NumPy computes x ** 0.5 as sqrt(x): (-inf) ** 0.5 is NaN and (-0.0) ** 0.5 is -0.0, where C's
# pow gives inf and 0.0. The C expression does the same; the exponent is a constant, so the
# compiler keeps one branch.
POW = elementwise("pow", forward=lambda xp, x, exponent: xp.power(x, exponent),
                  vjp=lambda g, out, x, exponent: (g * exponent * pow(x, exponent - 1),),
                  c="({exponent!r} == 0.5 ? sqrt({0}) : pow({0}, ({T}){exponent!r}))",
                  into=_pow_into, float_only=True)
EXP = elementwise("exp", forward=lambda xp, x: xp.exp(x), vjp=lambda g, out, x: (g * out,),
                  c="exp({0})", into=np.exp, float_only=True)
LOG = elementwise("log", forward=lambda xp, x: xp.log(x), vjp=lambda g, out, x: (g / x,),
                  c="log({0})", into=np.log, float_only=True)
TANH = elementwise("tanh", forward=lambda xp, x: xp.tanh(x),
                   vjp=lambda g, out, x: (g * (1 - out * out),), c="tanh({0})", into=np.tanh,
                   zero_rows=KEEPS, float_only=True)
SIGMOID = elementwise("sigmoid", formula=_sigmoid, vjp=lambda g, out, x: (g * out * (1 - out),),
                      quiet_overflow=True, float_only=True)
# maximum as NumPy computes it: a NaN operand is the result (the first of two NaNs), and
# otherwise a > b ? a : b, so of two equal zeros the second is returned (maximum(-0.0, 0.0) is
# 0.0, maximum(0.0, -0.0) is -0.0; x != x tests for NaN without <math.h>, for any C type).
RELU = elementwise("relu", forward=lambda xp, x: xp.maximum(x, 0),
                   vjp=lambda g, out, x: (where(greater(out, 0), g, 0),),
                   c="(({0} > 0 || {0} != {0}) ? {0} : ({T})0)", into=_relu_into,
                   zero_rows=KEEPS)
MAXIMUM = elementwise(
    "maximum", forward=lambda xp, a, b: xp.maximum(a, b),
    vjp=lambda g, out, a, b: (unbroadcast(where(greater_equal(a, b), g, 0), a.shape),
                              unbroadcast(where(greater_equal(a, b), 0, g), b.shape)),
    c="(({0} > {1} || {0} != {0}) ? {0} : {1})", into=_maximum_into)
WHERE = elementwise(
    "where", forward=lambda xp, cond, a, b: xp.where(cond, a, b),
    vjp=lambda g, out, cond, a, b: (None, unbroadcast(where(cond, g, 0), a.shape),
                                    unbroadcast(where(cond, 0, g), b.shape)),
    c="({0} ? {1} : {2})", into=_where_into, in_place=False, skip=(0,), nondiff_args=(0,))
# A float -> integer cast of NaN or of a value out of range is undefined in C and platform-
# dependent in NumPy (which warns): fused code does not promise NumPy's bits there.
ASTYPE = elementwise("astype", forward=lambda xp, x, dtype: x.astype(dtype, copy=False),
                     vjp=lambda g, out, x, dtype: (astype(g, x.dtype),), c="(({T}){0})",
                     into=_astype_into, zero_rows=KEEPS)
ASTYPE.infer = lambda x, dtype: Aval(tuple(x.shape), np.dtype(dtype))

# Comparisons give boolean masks (for where); they have no gradient.
GREATER = elementwise("greater", forward=lambda xp, a, b: xp.greater(a, b), vjp=None,
                      c="({0} > {1})", into=np.greater, out_dtype=np.bool_)
GREATER_EQUAL = elementwise("greater_equal", forward=lambda xp, a, b: xp.greater_equal(a, b),
                            vjp=None, c="({0} >= {1})", into=np.greater_equal,
                            out_dtype=np.bool_)
EQUAL = elementwise("equal", forward=lambda xp, a, b: xp.equal(a, b), vjp=None,
                    c="({0} == {1})", into=np.equal, out_dtype=np.bool_)


def add(a, b): return apply(ADD, a, b)
def sub(a, b): return apply(SUB, a, b)
def mul(a, b): return apply(MUL, a, b)
def div(a, b): return apply(DIV, a, b)
def neg(x): return apply(NEG, x)
def exp(x): return apply(EXP, x)
def log(x): return apply(LOG, x)
def tanh(x): return apply(TANH, x)
def sigmoid(x): return apply(SIGMOID, x)
def relu(x): return apply(RELU, x)
def maximum(a, b): return apply(MAXIMUM, a, b)
def greater(a, b): return apply(GREATER, a, b)
def greater_equal(a, b): return apply(GREATER_EQUAL, a, b)
def less(a, b): return apply(GREATER, b, a)
def less_equal(a, b): return apply(GREATER_EQUAL, b, a)
def equal(a, b): return apply(EQUAL, a, b)


def pow(x, exponent):  # noqa: A001 (mirrors the Python operator)
    """``x ** exponent`` for a Python scalar exponent."""
    if not isinstance(exponent, (int, float)):
        raise TypeError(f"op 'pow': the exponent must be a Python number, got {type(exponent).__name__}")
    return apply(POW, x, exponent=float(exponent))


def where(cond, a, b):
    """``a`` where ``cond`` (a boolean mask) holds, else ``b``."""
    return apply(WHERE, cond, a, b)


def astype(x, dtype):
    dtype = np.dtype(dtype)
    if np.dtype(x.dtype) == dtype:
        return x
    return apply(ASTYPE, x, dtype=dtype)
