"""The per-sample reference of growing: each sample alone, the cell run eagerly vertex by
vertex — what the batched :func:`~.loop.grow` is tested against."""

import numpy as np

from ...autodiff.tensor import Tensor
from ...ops import shape as shape_ops
from ..reference import _EagerVertex
from .checks import apply_budget, check_arguments, check_children, kept_children
from .frontier import Frontier, SampleStreams
from .result import Growth


def grow_per_sample(F, root_pull, decide, *, num_samples=None, max_vertices=1024,
                    on_budget="error", seed=0):
    """The reference :func:`grow` is tested against: each sample grown alone, level by level,
    the cell run eagerly vertex by vertex (no batching, no Program), ``decide`` called on that
    sample's frontier only. Returns a :class:`Growth` whose ``output`` is the eager Tensors
    of the growth itself (differentiable with the eager autodiff)."""
    where = "grow_per_sample"
    pull, n = check_arguments(F, root_pull, num_samples, max_vertices, on_budget, seed,
                                where)
    streams = SampleStreams(seed)
    records, outputs = [], []
    made, truncated = np.ones(n, np.int64), np.zeros(n, bool)
    roots = root_pull if isinstance(root_pull, Tensor) else \
        (Tensor(pull) if pull is not None else None)
    steps = {}
    for s in range(n):
        frontier_pull = None if pull is None else [roots[s]]
        parents_state, parent_of = [None], np.full(1, -1)
        vertex, depth, slot, parent = [np.zeros(1, np.int64) for _ in range(3)] + [np.full(1, -1)]
        step = 0
        while len(vertex):
            states, pushes = [], []
            for i in range(len(vertex)):
                kids = [] if parent_of[i] < 0 else [parents_state[parent_of[i]]]
                v = _EagerVertex(F, None if pull is None else frontier_pull[i], kids)
                F.cell(v)
                states.append(v.scattered)
                pushes.append(v.pushed if F.push_output is not None else v.scattered)
            outputs.append((s, vertex, pushes))
            state = np.stack([t.numpy() for t in states])
            push = np.stack([t.numpy() for t in pushes])
            rows_pull = None if pull is None else np.stack(
                [np.asarray(p.numpy() if isinstance(p, Tensor) else p) for p in frontier_pull])
            sample = np.full(len(vertex), s)
            records.append(dict(sample=sample, vertex=vertex, depth=depth, slot=slot,
                                parent=parent, pull=rows_pull, state=state, push=push))
            steps[step] = steps.get(step, 0) + len(vertex)
            step += 1

            def names(i, vertex=vertex):
                return f"sample {s}, vertex {int(vertex[i])}"

            frontier = Frontier(push, state, rows_pull, sample, vertex, depth, slot, streams)
            counts, child_pull = check_children(F, decide(frontier), frontier, names, where)
            first_new = int(made[s])
            counts, asked = apply_budget(counts, sample, made, max_vertices, on_budget,
                                         truncated, where)
            parent_of = np.repeat(np.arange(len(vertex)), counts)
            slot = np.arange(len(parent_of)) - np.repeat(np.cumsum(counts) - counts, counts)
            parent = vertex[parent_of]
            vertex = first_new + np.arange(len(parent_of))
            depth = depth[parent_of] + 1
            parents_state = states
            if child_pull is not None:
                rows = np.asarray(child_pull)
                if asked is not None:
                    rows = rows[kept_children(asked, counts)]
                frontier_pull = [Tensor(row) for row in rows]
    growth = Growth(F, n, records, truncated, root_pull, [steps[t] for t in sorted(steps)])
    rows = [None] * growth.num_vertices
    for s, vertex, pushes in outputs:
        for v, out in zip(vertex, pushes):
            rows[int(growth.offsets[s]) + int(v)] = shape_ops.reshape(out, (1,) + tuple(out.shape))
    shape = F.push_shape if F.push_output is not None else F.scatter_shape
    growth._output = shape_ops.concat(rows, axis=0) if rows else \
        Tensor(np.zeros((0,) + shape, F.dtype))
    return growth
