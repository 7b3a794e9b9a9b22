"""Elementwise primitives. Each broadcasts like NumPy; its VJP sums the gradient back to each
input's shape (:func:`unbroadcast`). ``c`` is the C expression the fusion code generator uses:
``{0}, {1}, ...`` are the operands, ``{T}`` is the C type, other fields are attributes. ``into``
is the NumPy writer: a ufunc takes its output array as the positional argument after its
inputs, so ``np.add`` is already a writer ``np.add(a, b, out)``, with no Python layer between.
At the end of the module, elementwise functions composed from these primitives (abs, sign,
sqrt, logical operations, isnan, ...)."""

import re

import numpy as np

from . import batching, reduce, shape
from .formula import c_expr, writer
from .registry import (Aval, Op, apply, broadcast_shapes, common_dtype, is_scalar, register,
                       require_float, result_dtype)
from ..errors import ArgumentError, DTypeError
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


def infer_of_kinds(name, kinds, what, note):
    """The shape/dtype rule of an op on the dtype ``kinds`` only; another dtype is refused:
    "arguments must be {what}, got dtype d ({note})"."""
    def infer(*avals):
        out_shape, dtype = broadcast_shapes(name, avals), common_dtype(name, avals)
        if dtype.kind not in kinds:
            raise DTypeError(f"op '{name}': arguments must be {what}, got dtype {dtype} ({note})")
        return Aval(out_shape, dtype)
    return infer


def elementwise(name, *, vjp, forward=None, c=None, into=None, in_place=True, formula=None,
                quiet_overflow=False, float_only=False, out_dtype=None, skip=(), infer=None,
                promotes=None, **rules):
    """Register an elementwise op: it batches by broadcasting (``batching.elementwise_rule``),
    and has a C expression ``c`` and a NumPy writer ``into``, by default in place. A
    ``formula`` (see formula.py) gives forward, ``c`` and ``into`` from one definition.
    The operands (``{0}``, ``{1}``, ... of ``c``) but those in ``skip`` (a mask) are promoted
    to one dtype; ``float_only``: to a float dtype (registry.py, "Type promotion").
    ``infer`` replaces the shape/dtype rule and ``promotes`` the promoted operands (astype,
    whose output dtype is an attribute, promotes nothing). ``rules``: the other fields of
    :class:`Op` (zero_rows, commutative, ...)."""
    if formula is not None:
        forward, c, into = formula, c_expr(formula), writer(formula)
    if into is None:
        raise ValueError(f"elementwise op {name!r} needs a NumPy writer (into) or a formula")
    if quiet_overflow:
        forward = _quietly(forward)
    arity = 1 + max(int(k) for k in re.findall(r"{(\d+)}", c))
    if promotes is None:
        promotes = tuple(i for i in range(arity) if i not in skip)
    return register(Op(name, forward, infer or _infer(name, float_only, out_dtype, skip), vjp,
                       c, batch=batching.elementwise_rule, into=into, in_place=in_place,
                       quiet_overflow=quiet_overflow, promotes=promotes,
                       promotes_to_float=float_only, **rules))


def math_function(name, vjp, **rules):
    """A float op that NumPy, CuPy and C's <math.h> all call ``name`` (exp, log, floor, ...)."""
    return elementwise(name, forward=lambda xp, x: getattr(xp, name)(x), vjp=vjp,
                       c=f"{name}({{0}})", into=getattr(np, name), float_only=True, **rules)


def zero_vjp(g, out, *inputs):
    """The VJP of a piecewise constant op: zero, not missing (as in PyTorch)."""
    return tuple(unbroadcast(zeros_like(g), x.shape) for x in inputs)


def _quietly(forward):
    def quiet(xp, *args, **attrs):
        with np.errstate(over="ignore", under="ignore"):
            return forward(xp, *args, **attrs)
    return quiet


def _sigmoid(xp, x):
    # e^-x overflows to inf for very negative x, giving the right limit 0. As four SIMD ufuncs
    # (the writer) this is about 4x faster than scipy.special.expit (benchmarks/fusion_cpu.py).
    return 1 / (1 + xp.exp(-x))


def _pow_grad(g, x, exponent):
    if exponent == 0:  # x ** 0 is 1 everywhere, also at 0, where x ** -1 is inf
        return zeros_like(g)
    return g * exponent * pow(x, exponent - 1)


def _power(xp, x, y):
    if x.dtype.kind in "iu" and y.size and bool((y < 0).any()):
        raise DTypeError("op 'power': integers to negative integer powers are not allowed "
                         "(as in NumPy); convert the base to a float first (x.astype('float32'))")
    return xp.power(x, y)


def _power_vjp(g, out, x, y):
    """d/dx = y x^(y-1) (0 where y is 0); d/dy = x^y log x (0 where x is 0 and y >= 0, the
    limit PyTorch uses too; NaN for a negative base, whose power is not real nearby)."""
    safe_y = where(equal(y, 0), 1, y)
    gx = where(equal(y, 0), 0, g * y * apply(POWER, x, safe_y - 1))
    zero_limit = logical_and(equal(x, 0), greater_equal(y, 0))
    gy = where(zero_limit, 0, g * out * log(where(zero_limit, 1, x)))
    return unbroadcast(gx, x.shape), unbroadcast(gy, y.shape)


def _extremum_vjp(g, wins, a, b):
    half = where(equal(a, b), g * 0.5, 0)
    return (unbroadcast(where(wins(a, b), g, half), a.shape),
            unbroadcast(where(wins(b, a), g, half), b.shape))


def _special(xp):
    if xp is np:  # (imported where first used: SciPy is a fifth of ``import minicavs``)
        import scipy.special

        return scipy.special
    from ..cuda import cupyx_ops  # (only reached with CuPy arrays)

    return cupyx_ops.special()


def _where_into(cond, a, b, out):
    # Two copies: the second overwrites the first where cond holds, so out must not be a or b.
    np.copyto(out, b)
    np.copyto(out, a, where=cond)


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
                  vjp=lambda g, out, x, exponent: (_pow_grad(g, x, exponent),),
                  c="({exponent!r} == 0.5 ? sqrt({0}) : pow({0}, ({T}){exponent!r}))",
                  into=lambda x, out, exponent: np.power(x, out.dtype.type(exponent), out=out))
POWER = elementwise("power", forward=lambda xp, x, y: _power(xp, x, y), vjp=_power_vjp,
                    c="pow({0}, {1})", into=np.power)
EXP = math_function("exp", lambda g, out, x: (g * out,))
EXPM1 = math_function("expm1", lambda g, out, x: (g * (out + 1),), zero_rows=KEEPS)
LOG = math_function("log", lambda g, out, x: (g / x,))
LOG1P = math_function("log1p", lambda g, out, x: (g / (x + 1),), zero_rows=KEEPS)
TANH = math_function("tanh", lambda g, out, x: (g * (1 - out * out),), zero_rows=KEEPS)
SIGMOID = elementwise("sigmoid", formula=_sigmoid, vjp=lambda g, out, x: (g * out * (1 - out),),
                      quiet_overflow=True, float_only=True)
SIN = math_function("sin", lambda g, out, x: (g * cos(x),), zero_rows=KEEPS)
COS = math_function("cos", lambda g, out, x: (neg(g * sin(x)),))
ERF = elementwise("erf", forward=lambda xp, x: _special(xp).erf(x),
                  vjp=lambda g, out, x: (g * (2 / np.sqrt(np.pi)) * exp(neg(x * x)),),
                  c="erf({0})", into=lambda x, out: _special(np).erf(x, out=out),
                  float_only=True, zero_rows=KEEPS)
# Rounding: piecewise constant, so the gradient is zero (as in PyTorch), not missing. C's rint
# rounds half to even in the default rounding mode, as NumPy's rint and round do.
FLOOR = math_function("floor", zero_vjp, zero_rows=KEEPS)
CEIL = math_function("ceil", zero_vjp, zero_rows=KEEPS)
RINT = math_function("rint", zero_vjp, zero_rows=KEEPS)
# maximum and minimum as NumPy computes them: a NaN operand is the result (the first of two
# NaNs), and otherwise a > b ? a : b, so of two equal zeros the second is returned
# (maximum(-0.0, 0.0) is 0.0, maximum(0.0, -0.0) is -0.0; x != x tests for NaN without
# <math.h>, for any C type). The zero signs make them not exactly commutative. A tie splits
# the gradient evenly between the two sides, as PyTorch does and as the reduction max does.
# (NumPy deprecates a positional out for maximum and minimum: their writers name it.)
RELU = elementwise("relu", forward=lambda xp, x: xp.maximum(x, 0),
                   vjp=lambda g, out, x: (where(greater(out, 0), g, 0),),
                   c="(({0} > 0 || {0} != {0}) ? {0} : ({T})0)",
                   into=lambda x, out: np.maximum(x, out.dtype.type(0), out=out), zero_rows=KEEPS)
MAXIMUM = elementwise("maximum", forward=lambda xp, a, b: xp.maximum(a, b),
                      vjp=lambda g, out, a, b: _extremum_vjp(g, greater, a, b),
                      c="(({0} > {1} || {0} != {0}) ? {0} : {1})",
                      into=lambda a, b, out: np.maximum(a, b, out=out))
MINIMUM = elementwise("minimum", forward=lambda xp, a, b: xp.minimum(a, b),
                      vjp=lambda g, out, a, b: _extremum_vjp(g, less, a, b),
                      c="(({0} < {1} || {0} != {0}) ? {0} : {1})",
                      into=lambda a, b, out: np.minimum(a, b, out=out))
WHERE = elementwise(
    "where", forward=lambda xp, cond, a, b: xp.where(cond, a, b),
    vjp=lambda g, out, cond, a, b: (None, unbroadcast(where(cond, g, 0), a.shape),
                                    unbroadcast(where(cond, 0, g), b.shape)),
    c="({0} ? {1} : {2})", into=_where_into, in_place=False, skip=(0,), nondiff_args=(0,))
# A float -> integer cast of NaN or of a value out of range is undefined in C and platform-
# dependent in NumPy (which warns): fused code does not promise NumPy's bits there.
ASTYPE = elementwise("astype", forward=lambda xp, x, dtype: x.astype(dtype, copy=False),
                     vjp=lambda g, out, x, dtype: (astype(g, x.dtype),), c="(({T}){0})",
                     into=lambda x, out, dtype: np.copyto(out, x, casting="unsafe"),
                     zero_rows=KEEPS,
                     infer=lambda x, dtype: Aval(tuple(x.shape), np.dtype(dtype)),
                     promotes=())  # it is what promotion uses

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
def minimum(a, b): return apply(MINIMUM, a, b)
def expm1(x): return apply(EXPM1, x)
def log1p(x): return apply(LOG1P, x)
def sin(x): return apply(SIN, x)
def cos(x): return apply(COS, x)
def erf(x): return apply(ERF, x)
def floor(x): return apply(FLOOR, x)
def ceil(x): return apply(CEIL, x)
def rint(x): return apply(RINT, x)
def greater(a, b): return apply(GREATER, a, b)
def greater_equal(a, b): return apply(GREATER_EQUAL, a, b)
def less(a, b): return apply(GREATER, b, a)
def less_equal(a, b): return apply(GREATER_EQUAL, b, a)
def equal(a, b): return apply(EQUAL, a, b)


def pow(x, exponent):  # noqa: A001 (mirrors the Python operator)
    """``x ** exponent``. A Python number as the exponent is an attribute of the op (its C
    expression holds it as a literal); a tensor exponent, or a scalar base, is the binary op
    ``power`` (``2 ** x``: ``pow(2, x)``). Integers stay integers under a non-negative integer
    exponent (as in NumPy and PyTorch); a float exponent, even ``2.0``, computes in floats; a
    negative integer exponent of integers is refused (NumPy and PyTorch refuse it too: the
    result is not an integer)."""
    if is_scalar(exponent) and not is_scalar(x):
        if np.dtype(x.dtype).kind in "biu":
            if isinstance(exponent, (int, np.integer)) and exponent < 0:
                raise ArgumentError(f"op 'pow': an integer tensor ({x.dtype}) to the negative "
                                    f"integer power {exponent} is not an integer; convert it "
                                    f"to a float dtype first, or use a float exponent "
                                    f"({float(exponent)})")
            if isinstance(exponent, (int, np.integer)):
                x = astype(x, np.int64) if np.dtype(x.dtype).kind == "b" else x
                return apply(POW, x, exponent=int(exponent))
            x = astype(x, result_dtype([x.dtype], [exponent], to_float=True))
        return apply(POW, x, exponent=float(exponent))
    return apply(POWER, x, exponent)


def zeros_like(x):
    """Zeros of ``x``'s shape and dtype, made from ``x`` (``x > x`` is false everywhere, NaN
    and inf included), so that on a symbol it is a node of the same trace."""
    return astype(greater(x, x), x.dtype)


# --- composites ----------------------------------------------------------------------------------

def abs(x):  # noqa: A001 (mirrors numpy.abs)
    """``|x|``; at 0 the gradient is 0 (maximum splits a tie), as in PyTorch."""
    return maximum(x, neg(x)) if _dtype(x).kind != "b" else x


def sign(x):
    """-1, 0 or 1 (NaN stays NaN); its gradient is zero."""
    if _dtype(x).kind in "bu":
        return astype(greater(x, 0), x.dtype)
    return where(greater(x, 0), 1, where(less(x, 0), -1, x * 0))


def sqrt(x):
    return pow(x, 0.5)


def rsqrt(x):
    return pow(x, -0.5)


def _dtype(x):
    """The dtype of an operand: an array's, or the one NumPy gives a Python scalar."""
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _as_mask(x):
    return x if _dtype(x) == np.bool_ else not_equal(x, 0)


def logical_not(x):
    return equal(x, False) if _dtype(x) == np.bool_ else equal(x, 0)


def logical_and(a, b):
    """Elementwise ``a and b`` (nonzero is true), as a boolean mask."""
    return where(_as_mask(a), _as_mask(b), False)


def logical_or(a, b):
    return where(_as_mask(a), True, _as_mask(b))


def logical_xor(a, b):
    return not_equal(_as_mask(a), _as_mask(b))


def not_equal(a, b):
    return logical_not(equal(a, b))


def isnan(x):
    return not_equal(x, x)


def isfinite(x):
    """False at inf, -inf and NaN (NaN < inf is false too)."""
    if _dtype(x).kind != "f":
        return equal(x, x)
    return less(abs(x), float("inf"))


def isinf(x):
    if _dtype(x).kind != "f":
        return not_equal(x, x)
    return equal(abs(x), float("inf"))


def where(cond, a, b):
    """``a`` where ``cond`` (a boolean mask) holds, else ``b``."""
    return apply(WHERE, cond, a, b)


def astype(x, dtype):
    dtype = np.dtype(dtype)
    if np.dtype(x.dtype) == dtype:
        return x
    return apply(ASTYPE, x, dtype=dtype)
