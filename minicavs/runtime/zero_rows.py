"""Skipping work on rows that are known to be zero.

Many rows of a batch's dynamic tensors are exactly zero, for structural reasons: a leaf has no
children, so every ``gather`` of the first level is a block of zero rows; an internal vertex of
a parse tree has no word, so its pulled embedding row is zero (index -1). Products with those
rows — ``U·[h_l, h_r]`` at the leaves, the children's gradients ``δ·Uᵀ`` of the leaves, their
share of the parameter gradient ``[h_l, h_r]ᵀ·δ`` — cost GEMM time and produce zeros.

The runtime tracks, for every per-row value, a range ``(lo, hi)`` of rows outside which the
value is exactly zero, and propagates it through the ops: each op says how with its
``zero_rows`` rule (a product with a parameter, a slice, ``mul``, a sum of per-row values keep
zero rows zero; the range algebra and the shared rules are in minicavs/ops/rows.py). A step
whose outputs are zero on all rows of a task is skipped; a whole-batch product with a parameter
runs on the nonzero rows only; a parameter-gradient product ``Xᵀ·G`` runs over the rows where
both are nonzero; where X (or G) concatenates columns nonzero on different rows (the gate
gradients of a Tree-LSTM: the forget gates' are zero at the leaves), each block of columns
runs on its own rows. A part of a concatenation keeps the rows the level loop wrote it, and an
output a run step made from zeros on a level counts as zero there. Results are unchanged: every
skipped value is exactly zero, and an op without a rule is taken to have no zero rows.
"""

from ..ops.batching import row_domain
from ..ops.rows import (EMPTY, FULL, hull, index_rows, intersect,  # noqa: F401 (re-exported)
                        is_empty)


def node_range(node, args):
    """The zero-row range of ``node``'s value from its arguments': ``args`` holds, per input,
    its range if it is a per-row value, or None if it is shared by all rows."""
    if row_domain(node.shape) is None:
        return None
    rule = node.op.zero_rows
    if rule is None or all(r is None for r in args):
        return FULL
    return rule(args, **node.attrs)


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
            args = [local[x.key] if x.key in local else range_of(x) for x in m.inputs]
            local[m.key] = node_range(m, args)
        return [local[o.key] for o in self.outputs]

    def zero_outputs(self, zero):
        """Per output, whether it is zero on a level where the per-row values ``zero`` (keys)
        are."""
        ranges = self(lambda x: (EMPTY if x.key in zero else FULL) if row_domain(x.shape)
                      else None)
        return [r is not None and is_empty(r) for r in ranges]


take_rows_range = index_rows  # the rows of take_rows(table, ids) that can be nonzero
