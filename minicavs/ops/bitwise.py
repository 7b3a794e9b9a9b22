"""Bitwise operations and shifts, elementwise primitives on integer tensors (and, for and, or,
xor and not, on bools: there they are the logical operations). Not differentiable: they take
no floats.

Shifts follow NumPy: a shift by the type's width or more (or by a negative amount) gives 0,
and for a right shift of a negative value -1, never C's undefined behaviour; the C forms say
so explicitly, and shift in ``unsigned long long`` so that a negative value shifted left
wraps as NumPy's does.
"""

import numpy as np

from . import elementwise as ew
from .elementwise import elementwise
from .registry import apply
from .rows import INTERSECT, HULL

_WIDE_ENOUGH = "((unsigned long long){1} < 8 * sizeof({T}))"


def _bits(name, ufunc, c, kinds="biu", what="integer or bool tensors", **rules):
    return elementwise(name, forward=lambda xp, *args: getattr(xp, ufunc)(*args), vjp=None,
                       c=c, into=getattr(np, ufunc),
                       infer=ew.infer_of_kinds(name, kinds, what, "as in NumPy and PyTorch"),
                       **rules)


BITWISE_AND = _bits("bitwise_and", "bitwise_and", "({0} & {1})", commutative=True,
                    zero_rows=INTERSECT)
BITWISE_OR = _bits("bitwise_or", "bitwise_or", "({0} | {1})", commutative=True, zero_rows=HULL)
BITWISE_XOR = _bits("bitwise_xor", "bitwise_xor", "({0} ^ {1})", commutative=True,
                    zero_rows=HULL)
# on bools ~ is logical not (C's ~true is -2, which is true again): bitwise_not sends bools to
# logical_not, so this primitive sees integers only
BITWISE_NOT = _bits("bitwise_not", "invert", "({T})(~{0})", kinds="iu",
                    what="integer tensors (for bools use logical_not)")
LEFT_SHIFT = _bits("left_shift", "left_shift",
                   "(" + _WIDE_ENOUGH + " ? ({T})((unsigned long long){0} << {1}) : ({T})0)",
                   kinds="iu", what="integer tensors")
RIGHT_SHIFT = _bits("right_shift", "right_shift",
                    "(" + _WIDE_ENOUGH + " ? ({T})({0} >> {1}) : ({T})({0} < 0 ? -1 : 0))",
                    kinds="iu", what="integer tensors")


def bitwise_and(a, b):
    """``a & b``: bitwise on integers, logical on bools."""
    return apply(BITWISE_AND, a, b)


def bitwise_or(a, b):
    return apply(BITWISE_OR, a, b)


def bitwise_xor(a, b):
    return apply(BITWISE_XOR, a, b)


def bitwise_not(x):
    """``~x``: every bit flipped for integers, logical not for bools."""
    if ew._dtype(x).kind == "b":
        return ew.logical_not(x)
    return apply(BITWISE_NOT, x)


def left_shift(a, b):
    """``a << b`` on integers (NumPy's rules for shifts by the width or more)."""
    return apply(LEFT_SHIFT, a, b)


def right_shift(a, b):
    """``a >> b`` on integers: arithmetic for signed types (the sign is kept)."""
    return apply(RIGHT_SHIFT, a, b)
