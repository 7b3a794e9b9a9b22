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
from .kinds import check_tag, kinds_of_vertices
from .recursive import Child, RecursiveFunction


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


def evaluate_per_sample(f, batch, pull=None, tag=None):
    """Run ``f``'s cell eagerly on each vertex of ``batch``; return what ``f(batch, pull)``
    returns (rows in the batch's vertex order), differentiable with the eager autodiff.
    For vertex kinds (``VertexFunction.by_kind``), each vertex runs the cell of its kind.
    For a recursive function, its definition runs eagerly on each node instead (a call on a
    child returns that child's result), with ``tag=`` as given to it."""
    if not isinstance(batch, GraphBatch):
        raise GraphError("evaluate_per_sample expects a GraphBatch")
    if isinstance(f, RecursiveFunction):
        return _evaluate_recursive(f, batch, pull, tag)
    if f.by == "tag":  # (a VertexFunction is the kinded function of one kind: by None)
        tag = check_tag(tag, batch, f"evaluate_per_sample({f.name!r})")
    keys, kind_of = kinds_of_vertices(batch, f.by, tag)
    if f.by is not None:
        f._check_kinds(batch, keys, kind_of)  # (a kind with no cell: the call's own error)
    cell_of = [f.cells[keys[k]] for k in kind_of.tolist()]  # each vertex: its kind's cell
    states, outputs = {}, {}
    order = np.argsort(batch.level, kind="stable")  # children before parents
    for v in order.tolist():
        kids = batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]].tolist()
        cell = cell_of[v]
        vertex = _EagerVertex(cell, pull[v] if pull is not None else None,
                              [states[c] for c in kids])
        cell.cell(vertex)
        states[v] = vertex.scattered
        outputs[v] = vertex.pushed if cell.push_output is not None else vertex.scattered
    rows = [reshape(outputs[v], (1,) + tuple(outputs[v].shape)) for v in range(batch.num_vertices)]
    return concat(rows, axis=0)


class _EagerNode:
    """A node of a recursive definition, evaluated eagerly: its children's results are known."""

    def __init__(self, pulled, child_states, tag):
        self.arity = len(child_states)
        self.is_leaf = self.arity == 0
        self.children = [Child(self, k) for k in range(self.arity)]
        self.tag = tag
        self._pulled, self._states = pulled, child_states
        self.pushed = None

    def pull(self):
        return self._pulled

    def push(self, x):
        self.pushed = x

    def state_of(self, child):
        return self._states[child.k]


def _evaluate_recursive(f, batch, pull, tag):
    tags = None if tag is None else np.asarray(tag).tolist()
    states, outputs = {}, {}
    for v in np.argsort(batch.level, kind="stable").tolist():  # children before parents
        kids = batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]].tolist()
        node = _EagerNode(pull[v] if pull is not None else None, [states[c] for c in kids],
                          None if tags is None else int(tags[v]))
        outer, f._tracing = f._tracing, node  # f(child) now returns the child's result
        try:
            states[v] = f.fn(node)
        finally:
            f._tracing = outer
        outputs[v] = node.pushed if node.pushed is not None else states[v]
    rows = [reshape(outputs[v], (1,) + tuple(outputs[v].shape)) for v in range(batch.num_vertices)]
    return concat(rows, axis=0)
