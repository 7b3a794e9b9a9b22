"""What a growth found: :class:`Growth` — the structure as a GraphBatch, each vertex's values,
and the differentiable output."""

from functools import cached_property

import numpy as np

from ... import backend
from ...autodiff.tensor import Tensor, is_grad_enabled
from ...ops import index as index_ops, shape as shape_ops
from ..graphs import GraphBatch, InputGraph


class Growth:
    """What :func:`grow` found. Per-vertex arrays are in the order of ``batch`` (sample by
    sample; within a sample in growth order, the root first):

    ``batch``      the structure as a GraphBatch for F (each vertex's child 0 is its parent);
                   None for zero samples
    ``parents``    per sample, the parent of each vertex (-1 at the root): the tree, top-down
    ``pull``, ``state``, ``push``  what each vertex pulled, scattered and pushed (arrays)
    ``depth``, ``slot``, ``sample_of``  per vertex; ``truncated``: per sample, whether the
                   ``max_vertices`` budget cut its growth
    ``frontier_sizes``  the vertices F ran on at each step
    ``output``     a Tensor of the pushed rows: under ``no_grad`` the growth's own values, else
                   ``F(batch, pull)`` — differentiable, the ordinary ∂F on the structure found
    """

    def __init__(self, f, num_samples, records, truncated, root_pull, frontier_sizes):
        self.F = f
        self.num_samples = num_samples
        self.truncated = truncated
        self.frontier_sizes = frontier_sizes
        xp = backend.get_array_module(records[0]["state"]) if records else np
        sample = np.concatenate([r["sample"] for r in records]) if records else \
            np.zeros(0, np.int64)
        vertex = np.concatenate([r["vertex"] for r in records]) if records else sample
        sizes = np.bincount(sample, minlength=num_samples)
        offsets = np.zeros(num_samples + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        where = offsets[sample] + vertex  # each record row's place in the batch
        order = np.empty_like(where)
        order[where] = np.arange(len(where))

        self._records, self._order, self._xp = records, order, xp
        self.sample_of = sample[order]
        self.depth, self.slot = self._joined("depth"), self._joined("slot")
        parent = self._joined("parent")  # the parent's vertex index in its sample, -1 at a root
        self.parents = [parent[offsets[s]:offsets[s + 1]] for s in range(num_samples)]
        self.offsets = offsets
        self._root_pull = root_pull
        self._output = None

    def _joined(self, key):
        """One per-vertex record of every step, in batch order."""
        parts = [r[key] for r in self._records]
        per_vertex_ints = key in ("vertex", "parent", "depth", "slot")
        if not parts or parts[0] is None:
            return np.zeros(0, np.int64) if per_vertex_ints else None
        if per_vertex_ints:
            return np.concatenate(parts)[self._order]
        xp = self._xp
        return xp.concatenate(parts)[self._order if xp is np else xp.asarray(self._order)]

    @cached_property
    def batch(self):
        """The structure found as a GraphBatch for F (each vertex's child 0 is its parent;
        made on first use); None for zero samples."""
        if not self.num_samples:
            return None
        return GraphBatch([InputGraph._from_csr((p >= 0).astype(np.int64), p[p >= 0], sample=s)
                           for s, p in enumerate(self.parents)])

    # (the values are joined on first use: a caller that only needs the structure, or the
    # replay's differentiable output, does not pay for copying every step's rows)
    @cached_property
    def pull(self):
        return self._joined("pull")

    @cached_property
    def state(self):
        return self._joined("state")

    @cached_property
    def push(self):
        return self._joined("push")

    @property
    def num_vertices(self):
        return int(self.offsets[-1])

    def tree(self, s):
        """Sample ``s`` as a top-down InputGraph: each vertex's children in slot order."""
        return InputGraph.from_parents(self.parents[s], sample=s)

    def pull_tensor(self):
        """The pulled rows as one Tensor in batch order; a root's row comes from the
        ``root_pull`` Tensor given to :func:`grow`, so gradients reach it."""
        f = self.F
        if f.pull_input is None:
            return None
        root = self._root_pull
        if not isinstance(root, Tensor) or not root.requires_grad:
            return Tensor(self.pull)
        roots = self.offsets[:-1]
        others = np.setdiff1d(np.arange(self.num_vertices), roots)
        rows = np.empty(self.num_vertices, np.int64)
        rows[roots] = np.arange(self.num_samples)
        rows[others] = self.num_samples + np.arange(len(others))
        xp = backend.get_array_module(self.pull)
        both = shape_ops.concat([root, Tensor(self.pull[xp.asarray(others)])], axis=0)
        return index_ops.take_rows(both, Tensor(xp.asarray(rows)))

    @property
    def output(self):
        """The pushed rows as a Tensor. With gradients enabled, ``F(batch, pull)`` on the
        structure found with the parameters' current values (made once, at the first such
        access: read it before an optimiser step); under ``no_grad``, the growth's values."""
        f = self.F
        if self.batch is None:
            shape = f.push_shape if f.push_output is not None else f.scatter_shape
            return Tensor(np.zeros((0,) + shape, f.dtype))
        if self._output is None and is_grad_enabled():
            self._output = f(self.batch, pull=self.pull_tensor())
        return self._output if self._output is not None else Tensor(self.push)

    def __repr__(self):
        return (f"Growth({self.num_samples} samples, {self.num_vertices} vertices, "
                f"{len(self.frontier_sizes)} steps, {int(np.sum(self.truncated))} truncated)")
