"""A plain per-sample evaluation of a vertex function: the cell run eagerly, vertex by vertex.

This is the definition the batched runtime must match, in values and gradients (it is what
the property tests compare against). It is slow on purpose: one eager op call per op per
vertex, the way a dynamic-declaration framework without batching would run it.
"""

import numpy as np

from ..autodiff.tensor import Tensor
from ..errors import GraphError
from ..ops import reshape, concat
from .graphs import GraphBatch


class _EagerVertex:
    def __init__(self, f, pulled, child_states):
        self._f = f
        self._pulled = pulled
        self._children = child_states
        self._sums = 0
        self.scattered = None
        self.pushed = None

    def pull(self):
        return self._pulled

    def gather(self, k):
        if k < len(self._children):
            return self._children[k]
        return Tensor(np.zeros(self._f.scatter_shape, self._f.dtype))

    def gather_sum(self, fn=None):
        shape = self._f.gather_sum_shapes[self._sums]
        self._sums += 1
        total = Tensor(np.zeros(shape, self._f.dtype))
        for state in self._children:
            total = total + (state if fn is None else fn(state))
        return total

    def scatter(self, x):
        self.scattered = x

    def push(self, x):
        self.pushed = x


def evaluate_per_sample(f, batch, pull=None):
    """Run ``f``'s cell eagerly on each vertex of ``batch``; return what ``f(batch, pull)``
    returns (rows in the batch's vertex order), differentiable with the eager autodiff."""
    if not isinstance(batch, GraphBatch):
        raise GraphError("evaluate_per_sample expects a GraphBatch")
    states, outputs = {}, {}
    order = np.argsort(batch.level, kind="stable")  # children before parents
    for v in order.tolist():
        kids = batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]].tolist()
        vertex = _EagerVertex(f, pull[v] if pull is not None else None,
                              [states[c] for c in kids])
        f.cell(vertex)
        states[v] = vertex.scattered
        outputs[v] = vertex.pushed if f.push_output is not None else vertex.scattered
    rows = [reshape(outputs[v], (1,) + tuple(outputs[v].shape)) for v in range(batch.num_vertices)]
    return concat(rows, axis=0)
