"""Teacher forcing: a given structure laid out as :func:`~.loop.grow` would have found it."""

from collections import namedtuple

import numpy as np

from ...errors import GraphError
from ..graphs import GraphBatch, InputGraph

TopDown = namedtuple("TopDown", "batch vertex slot depth")


def top_down(graphs):
    """Given trees (InputGraphs, children lists), the GraphBatch :func:`grow` would have found
    for them — each vertex's child 0 is its parent, vertices renumbered in growth order (breadth
    first) — as ``TopDown(batch, vertex, slot, depth)``: per vertex of that batch, its index in
    the given tree, its slot among its siblings and its depth. F on it is teacher forcing."""
    if isinstance(graphs, InputGraph):
        graphs = [graphs]
    grown, original, slots, depths = [], [], [], []
    for s, g in enumerate(graphs):
        if not isinstance(g, InputGraph):
            raise GraphError(f"top_down: sample {s}: expected an InputGraph, got "
                             f"{type(g).__name__}")
        n = g.num_vertices
        if len(g.roots) != 1 or np.bincount(g.child_ids, minlength=n).max(initial=0) > 1:
            raise GraphError(f"top_down: sample {s} is not a tree (one root, one parent per "
                             f"vertex): {len(g.roots)} root(s)")
        parent, slot = np.full(n, -1), np.zeros(n, np.int64)
        owner = np.repeat(np.arange(n), g.num_children)
        parent[g.child_ids] = owner
        slot[g.child_ids] = np.arange(len(g.child_ids)) - g.child_ptr[owner]
        depth = np.zeros(n, np.int64)
        order = [int(g.roots[0])]  # breadth first: growth order
        for v in order:
            for c in g.children(v):
                depth[c] = depth[v] + 1
                order.append(c)
        order = np.array(order)
        new = np.empty(n, np.int64)
        new[order] = np.arange(n)
        p = parent[order]
        p = np.where(p >= 0, new[np.maximum(p, 0)], -1)
        grown.append(InputGraph._from_csr((p >= 0).astype(np.int64), p[p >= 0], sample=s))
        original.append(order)
        slots.append(slot[order])
        depths.append(depth[order])
    return TopDown(GraphBatch(grown), np.concatenate(original), np.concatenate(slots),
                   np.concatenate(depths))
