"""Rounding toward zero, signs, and division with a remainder: ``trunc``, ``copysign``,
``fmod`` (C's remainder: the sign of the dividend), ``remainder`` (Python's ``%``: the sign of
the divisor) and ``floor_divide`` (``//``), elementwise primitives; ``isclose`` and ``allclose``
composed from them.

The three division ops take integers and floats and keep the operands' dtype (``7 // 2`` of
int64 tensors is int64, as in NumPy and PyTorch); bools are refused, as PyTorch does. An
integer division by zero is an ``ArgumentError`` (PyTorch raises too; NumPy warns and gives 0),
and the C forms give NumPy's 0 there rather than trap, should one reach a fused kernel.

Their C forms hold NumPy's exact algorithms (``npy_divmod``), one body for both kinds of
operand: ``({T})0.5 == ({T})0`` holds for integer types only and is folded by the compiler,
and each branch compiles for every type (the integer branch computes ``a % b`` as
``a - (a / b) * b``, which is only correct for integers; ``fmod`` is exact in double, so a
float32 ``fmod`` through double is float32's). A lambda makes the body one expression.
"""

import numpy as np

from . import elementwise as ew, reduce
from .elementwise import elementwise, unbroadcast, where, zeros_like
from .registry import apply, describe, is_scalar
from .rows import KEEPS
from ..errors import ArgumentError

_IS_INT = "(({T})0.5 == ({T})0)"
_SIGNED = "(({T})-1 < ({T})0)"

_FMOD_C = (
    "[]({T} a, {T} b) {{ if (" + _IS_INT + ") return (b == 0 || (b == ({T})-1 && " + _SIGNED
    + ")) ? ({T})0 : ({T})(a - (a / b) * b); return ({T})fmod((double)a, (double)b); }}"
    "({0}, {1})")
_REMAINDER_C = (
    "[]({T} a, {T} b) {{ if (" + _IS_INT + ") {{ if (b == 0 || (b == ({T})-1 && " + _SIGNED
    + ")) return ({T})0; {T} r = ({T})(a - (a / b) * b); "
    "return (r != 0 && ((r < 0) != (b < 0))) ? ({T})(r + b) : r; }} "
    "{T} m = ({T})fmod((double)a, (double)b); "
    "if (m != 0) return ((b < 0) != (m < 0)) ? ({T})(m + b) : m; "
    "return ({T})copysign(0.0, (double)b); }}({0}, {1})")
_FLOOR_DIVIDE_C = (
    "[]({T} a, {T} b) {{ if (" + _IS_INT + ") {{ if (b == 0) return ({T})0; "
    "if (b == ({T})-1 && " + _SIGNED + ") return ({T})(0ULL - (unsigned long long)a); "
    "{T} q = ({T})(a / b); return (((a > 0) != (b > 0)) && ({T})(q * b) != a) ? "
    "({T})(q - 1) : q; }} "
    "if (b == 0) return ({T})(a / b); {T} m = ({T})fmod((double)a, (double)b); "
    "{T} d = ({T})((a - m) / b); if (m != 0 && ((b < 0) != (m < 0))) d = ({T})(d - 1); "
    "if (d != 0) {{ {T} f = ({T})floor((double)d); return (d - f > ({T})0.5) ? ({T})(f + 1) : f; }} "
    "return ({T})copysign(0.0, (double)(a / b)); }}({0}, {1})")


def _refuse_zero_divisor(name, b):
    if b.dtype.kind in "iu" and b.size and not bool((b != 0).all()):
        position = tuple(int(i[0]) for i in (b == 0).nonzero()) if b.ndim else ()
        raise ArgumentError(f"op '{name}': integer division by zero (argument 1, the divisor, "
                            f"is 0 at position {position} of shape {describe(b.shape)}); "
                            f"PyTorch raises here too, NumPy gives 0")


def _division(name):
    """The forward and the NumPy writer of the division op ``name`` (NumPy's function of that
    name): both refuse an integer division by zero first; float ones give inf and NaN quietly,
    as NumPy's do."""
    def forward(xp, a, b):
        _refuse_zero_divisor(name, b)
        with np.errstate(divide="ignore", invalid="ignore"):
            return getattr(xp, name)(a, b)

    def write(a, b, out):
        _refuse_zero_divisor(name, b)
        with np.errstate(divide="ignore", invalid="ignore"):
            getattr(np, name)(a, b, out)
    return dict(forward=forward, into=write, infer=ew.infer_of_kinds(
        name, "iuf", "integer or float arrays",
        "as in PyTorch; convert bools first, e.g. x.astype('int64')"))


def _fmod_vjp(g, out, a, b):
    # fmod(a, b) = a - trunc(a / b) * b
    return (unbroadcast(g, a.shape), unbroadcast(ew.neg(g * trunc(ew.div(a, b))), b.shape))


def _remainder_vjp(g, out, a, b):
    # remainder(a, b) = a - floor(a / b) * b
    return (unbroadcast(g, a.shape), unbroadcast(ew.neg(g * floor_divide(a, b)), b.shape))


def _copysign_vjp(g, out, a, b):
    # |a| with b's sign: d/da is ±1 (0 at a = 0, as in PyTorch); b only gives the sign.
    zero = ew.equal(a, 0)
    ratio = where(zero, 0, out / where(zero, 1, a))
    return unbroadcast(g * ratio, a.shape), unbroadcast(zeros_like(g), b.shape)


TRUNC = ew.math_function("trunc", ew.zero_vjp, zero_rows=KEEPS)
COPYSIGN = elementwise("copysign", forward=lambda xp, a, b: xp.copysign(a, b),
                       vjp=_copysign_vjp, c="copysign({0}, {1})", into=np.copysign,
                       float_only=True)
FMOD = elementwise("fmod", vjp=_fmod_vjp, c=_FMOD_C, **_division("fmod"))
REMAINDER = elementwise("remainder", vjp=_remainder_vjp, c=_REMAINDER_C, **_division("remainder"))
FLOOR_DIVIDE = elementwise("floor_divide", vjp=ew.zero_vjp, c=_FLOOR_DIVIDE_C,
                           **_division("floor_divide"))


def trunc(x):
    """``x`` rounded toward zero; the gradient is zero."""
    return apply(TRUNC, x)


def copysign(a, b):
    """``|a|`` with the sign of ``b`` (-0.0 counts as negative); integers become floats."""
    return apply(COPYSIGN, a, b)


def fmod(a, b):
    """The remainder of ``a / b`` rounded toward zero: the sign of ``a`` (C's ``fmod``,
    ``torch.fmod``, ``numpy.fmod``)."""
    return apply(FMOD, a, b)


def remainder(a, b):
    """``a % b`` as Python, NumPy and PyTorch define it: the sign of ``b``."""
    return apply(REMAINDER, a, b)


mod = remainder  # numpy.mod


def floor_divide(a, b):
    """``a // b``: the quotient rounded down; integers stay integers. The gradient is zero."""
    return apply(FLOOR_DIVIDE, a, b)


def isclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """``|a - b| <= atol + rtol * |b|`` elementwise (NumPy's and PyTorch's test, also their
    defaults), as a boolean tensor; equal infinities are close, NaN is close to NaN only with
    ``equal_nan``."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not is_scalar(value) or not value >= 0:
            raise ArgumentError(f"isclose: {name} must be a non-negative number, got {value!r}")
    if ew._dtype(a).kind == "b" or ew._dtype(b).kind == "b":
        return ew.equal(a, b)
    if ew._dtype(a).kind != "f" and ew._dtype(b).kind != "f":  # integers: exact in float64
        a, b = ew.astype(a, np.float64), ew.astype(b, np.float64)
    finite = ew.logical_and(ew.isfinite(a), ew.isfinite(b))
    a0, b0 = ew.where(finite, a, 0), ew.where(finite, b, 0)  # (no inf - inf to warn about)
    near = ew.less_equal(ew.abs(a0 - b0), atol + rtol * ew.abs(b0))
    close = ew.where(finite, near, ew.equal(a, b))  # infinities: only equal ones
    if equal_nan:
        close = ew.logical_or(close, ew.logical_and(ew.isnan(a), ew.isnan(b)))
    return close


def allclose(a, b, rtol=1e-5, atol=1e-8, equal_nan=False):
    """Whether every element of ``a`` is close to ``b`` (:func:`isclose`), as a Python bool."""
    return bool(reduce.all(isclose(a, b, rtol, atol, equal_nan)))
