"""Skipping work on rows that are known to be zero.

Many rows of a batch's dynamic tensors are exactly zero, for structural reasons: a leaf has no
children, so every ``gather`` of the first level is a block of zero rows; an internal vertex of
a parse tree has no word, so its pulled embedding row is zero (index -1). Products with those
rows — ``U·[h_l, h_r]`` at the leaves, the children's gradients ``δ·Uᵀ`` of the leaves, their
share of the parameter gradient ``[h_l, h_r]ᵀ·δ`` — cost GEMM time and produce zeros.

The runtime tracks, for every per-row value, a range ``(lo, hi)`` of rows outside which the
value is exactly zero, and propagates it through the ops that keep zero rows zero (a product
with a parameter, a slice, ``mul``, a sum of per-row values, ...). A step whose outputs are zero
on all rows of a task is skipped; a whole-batch product with a parameter runs on the nonzero
rows only; a parameter-gradient product ``Xᵀ·G`` runs over the rows where both are nonzero.
Results are unchanged: every skipped value is exactly zero.
"""

import numpy as np

from .batching import row_domain

FULL = (0, 1 << 62)  # no rows known to be zero
EMPTY = (0, 0)

# Ops whose output row is zero wherever their (first, per-row) input row is zero.
_KEEPS_ZERO_ROWS = {"neg", "tanh", "relu", "astype", "slice_axis", "pad_axis", "reshape",
                    "transpose", "sum", "max", "broadcast_to"}


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


def node_range(node, args):
    """The zero-row range of ``node``'s value from its arguments': ``args`` holds, per input,
    its range if it is a per-row value, or None if it is shared by all rows."""
    if row_domain(node.shape) is None:
        return None
    name = node.op.name
    rows = [r for r in args if r is not None]
    if not rows:
        return FULL
    if name in _KEEPS_ZERO_ROWS:
        if name in ("sum", "max") and 0 in node.attrs["axes"]:
            return FULL
        if name == "transpose" and node.attrs["axes"][0] != 0:
            return FULL
        return args[0] if args[0] is not None else FULL
    if name == "mul":
        out = FULL
        for r in rows:
            out = intersect(out, r)
        return out
    if name in ("add", "sub", "concat"):
        if len(rows) < len(args):  # a shared term (a bias) makes every row nonzero
            return FULL
        out = EMPTY
        for r in rows:
            out = hull(out, r)
        return out
    if name == "matmul" and args[0] is not None and args[1] is None:
        return args[0]
    return FULL


class ZeroRowRule:
    """Propagates zero-row ranges through one executor step (an op or a fused group)."""

    def __init__(self, step):
        self.members = getattr(step, "group", None)
        self.members = self.members.members if self.members is not None else [step.node]
        self.outputs = step.outputs
        # If the outputs are nonzero everywhere even when every per-row input is zero (a bias
        # is added, a sigmoid taken), there is nothing to track at run time.
        everything_zero = self(lambda x: EMPTY if row_domain(x.shape) else None)
        self.never_zero = all(r is None or r == FULL for r in everything_zero)

    def __call__(self, range_of):
        """``range_of(symbol)`` gives an input's range (None if shared). Returns the ranges of
        the step's outputs, in order."""
        local = {}
        for m in self.members:
            args = [local[id(x)] if id(x) in local else range_of(x) for x in m.inputs]
            local[id(m)] = node_range(m, args)
        return [local[id(o)] for o in self.outputs]


def take_rows_range(ids):
    """The rows of ``take_rows(table, ids)`` that can be nonzero: where ``ids >= 0``."""
    valid = np.flatnonzero(ids >= 0) if not hasattr(ids, "get") else np.flatnonzero(
        ids.get() >= 0)
    if valid.size == 0:
        return EMPTY
    return (int(valid[0]), int(valid[-1]) + 1)
