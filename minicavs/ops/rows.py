"""Zero rows: the range algebra, and the rules ops declare with it (``Op(zero_rows=...)``).

Many rows of a batch's per-row values are exactly zero (a leaf gathers no child state; an
internal vertex of a parse tree pulls no word). A *range* ``(lo, hi)`` says that a per-row
value is exactly zero outside rows [lo, hi); ``FULL`` says nothing is known, ``EMPTY`` that
every row is zero. The vertex runtime skips work on zero rows (minicavs/runtime/zero_rows.py).

An op's rule is ``rule(ranges, **attrs) -> range``: ``ranges[i]`` is None if input i is shared
by all rows (no vertex axis), else its range. It is asked only for an op whose output is per
row, with at least one per-row input. An op without a rule (``zero_rows=None``) gives ``FULL``:
nothing known is always safe, because a range only ever lets work be skipped.
"""

import numpy as np

from .. import backend

FULL = (0, 1 << 62)  # no rows known to be zero
EMPTY = (0, 0)


def intersect(a, b):
    return (max(a[0], b[0]), min(a[1], b[1]))


def hull(a, b):
    if is_empty(a):
        return b
    if is_empty(b):
        return a
    return (min(a[0], b[0]), max(a[1], b[1]))


def is_empty(r):
    return r[0] >= r[1]


def index_rows(idx):
    """The range of the rows whose index is not -1 (an op's ``row_index_arg``): where
    take_rows' output can be nonzero, which rows of scatter_add_rows' input are read.
    From a GPU this is three numbers in one copy (still a wait for the device), not the
    index array."""
    valid = (idx >= 0).reshape(-1)
    if valid.size == 0:
        return EMPTY
    if isinstance(valid, np.ndarray):
        found, first, last = bool(valid.any()), int(valid.argmax()), int(valid[::-1].argmax())
    else:
        xp = backend.get_array_module(valid)
        found, first, last = xp.stack((valid.any(), valid.argmax(), valid[::-1].argmax())) \
            .get().tolist()
    return (first, valid.size - last) if found else EMPTY


# --- the rules several ops share ----------------------------------------------------------------

def KEEPS(ranges, **attrs):
    """A zero row of the first input gives a zero row (neg, tanh, a slice, a reshape, ...)."""
    return FULL if ranges[0] is None else ranges[0]


def INTERSECT(ranges, **attrs):
    """Zero wherever any per-row input is zero (a product)."""
    out = FULL
    for r in ranges:
        if r is not None:
            out = intersect(out, r)
    return out


def HULL(ranges, **attrs):
    """Zero only where every input is zero (a sum, a concat); a shared input (a bias) makes
    every row nonzero."""
    if any(r is None for r in ranges):
        return FULL
    out = EMPTY
    for r in ranges:
        out = hull(out, r)
    return out
