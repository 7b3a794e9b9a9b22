"""Graphs grown at run time: structures decided from values computed along the way (the
recursion paper §6.4: TD-TreeLSTM; incremental decoding).

``grow(F, root_pull, decide)`` starts one root per sample and repeats, top-down:

1. run F once on the **frontier** of every sample (one batching task: F's Program — eager,
   core for one level, lazy — on the frontier's rows, its gathers reading the parents' states
   kept from the step before);
2. call ``decide(frontier)`` once for the whole frontier: from F's pushed outputs it says how
   many children each frontier vertex gets and what each child pulls (argmax, sampling from a
   seeded generator, a threshold, or any user function — see :class:`Frontier`);
3. append the children; stop when no sample has a frontier left, or at the ``max_vertices``
   budget of a sample (an error, or a truncation the caller chose).

A grown vertex reads its **parent's** state with ``v.gather(0)`` (zeros at a root), so the
structure found is an ordinary input graph for F in which each vertex's one child (slot 0) is
its parent: levels are depths, and F called on it recomputes exactly what the growth computed.
That is how gradients work: the growth itself runs without a record; ``Growth.output`` is
``F(growth.batch, pull)`` on the structure found when gradients are enabled — the ordinary ∂F
then runs through the same tasks (one more batched forward, no per-vertex work). Teacher forcing
is the same F on a given structure (:func:`top_down`); a loss on generated structures
(REINFORCE: the log-probabilities of the choices made, weighted by a reward) backpropagates
through ``Growth.output``.

:func:`grow_per_sample` grows each sample alone, the cell run eagerly vertex by vertex — the
reference the batched growth is tested against.
"""

from collections import namedtuple
from functools import cached_property

import numpy as np

from .. import backend, validate
from ..autodiff.tensor import Tensor, is_grad_enabled
from ..errors import ArgumentError, DTypeError, GraphError, NonFiniteError, ShapeError
from ..ops import index as index_ops, shape as shape_ops
from ..ops.registry import describe
from . import interpreter, memory
from .function import VertexFunction
from .graphs import GraphBatch, InputGraph
from .reference import _EagerVertex

ON_BUDGET = ("error", "truncate")


# --- what a decision sees and returns ------------------------------------------------------------

class Frontier:
    """The vertices F just ran on, one row each, grouped by sample (in sample order):
    ``push`` (F's pushed outputs, or its states if it pushes nothing), ``state``, ``pull``,
    ``sample_of`` (which sample), ``vertex`` (its index in that sample, in growth order; 0 is
    the root), ``depth`` and ``slot`` (its position among its parent's children; 0 at a root).
    Arrays are NumPy or CuPy (the device's).

    ``decide(frontier)`` returns ``(counts, child_pull)``: ``counts[i]`` children for row i,
    and one pulled row per child — row i's children first, in slot order, then row i+1's —
    shape ``(counts.sum(), *F.pull_shape)`` (None if F pulls nothing). The helpers below make
    the usual choices batched: :meth:`argmax`, :meth:`sample`, :meth:`above`.
    """

    def __init__(self, push, state, pull, sample, vertex, depth, slot, streams):
        self.push, self.state, self.pull = push, state, pull
        self.sample_of, self.vertex, self.depth, self.slot = sample, vertex, depth, slot
        self._streams = streams

    def __len__(self):
        return len(self.sample_of)

    def argmax(self, values=None):
        """Per row, the index of the largest entry of ``values`` (default: ``push``), last
        axis."""
        values = self.push if values is None else values
        return backend.get_array_module(values).argmax(values, axis=-1)

    def above(self, values, threshold=0.0):
        """Per row, 1 where ``values`` (one per row) exceeds ``threshold``, else 0."""
        xp = backend.get_array_module(values)
        return (xp.reshape(values, (len(self),)) > threshold).astype(np.int64)

    def uniform(self, size=()):
        """Uniform numbers in [0, 1), shape ``(len(self), *size)``, drawn from each sample's
        own seeded generator: a sample draws the same numbers whether it grows alone or in a
        batch, and whatever the other samples do."""
        return self._streams.uniform(self.sample_of, size)

    def sample(self, logits=None, temperature=1.0):
        """Per row, an index drawn from softmax(``logits`` / temperature) (default logits:
        ``push``) with :meth:`uniform` — seeded, per sample."""
        logits = np.asarray(backend.to_numpy(self.push if logits is None else logits),
                            np.float64)
        validate.number(temperature, "temperature", "Frontier.sample", open_minimum=True,
                        minimum=0)
        bad = ~np.isfinite(logits).all(axis=-1)
        if bad.any():  # no probabilities to draw from: say where, do not draw index 0
            i = int(np.flatnonzero(bad)[0])
            raise NonFiniteError(f"Frontier.sample: the logits of sample "
                                 f"{int(self.sample_of[i])}, vertex {int(self.vertex[i])} are "
                                 f"not finite "
                                 f"({logits[i][~np.isfinite(logits[i])][0]})")
        z = logits / temperature
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        cdf = np.cumsum(p, axis=-1)
        u = self.uniform() * cdf[:, -1]
        return np.minimum((cdf <= u[:, None]).sum(axis=-1), logits.shape[-1] - 1)


class _Streams:
    """One seeded generator per sample, made when the sample first draws."""

    def __init__(self, seed):
        self.seed = seed
        self._rngs = {}

    def uniform(self, sample, size):
        sample = backend.to_numpy(sample)
        size = tuple(np.atleast_1d(size)) if np.ndim(size) or size != () else ()
        out = np.empty((len(sample),) + size)
        starts = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]]) if len(sample) else []
        for lo, hi in zip(starts, list(starts[1:]) + [len(sample)]):
            s = int(sample[lo])
            if s not in self._rngs:
                self._rngs[s] = np.random.default_rng([self.seed, s])
            out[lo:hi] = self._rngs[s].random((hi - lo,) + size)
        return out


# --- running F on a frontier ---------------------------------------------------------------------

class _FrontierRows:
    """A frontier as the interpreter reads a batch (the interface of ``BatchIndices``): one
    level of ``n`` rows whose child 0 is a row of the parents' states (-1 at a root: the spare
    zero row)."""

    num_levels, num_edges, is_forest = 1, 0, True

    def __init__(self, xp, parent_rows, names):
        put = (lambda a: a) if xp is np else (lambda a: xp.asarray(a.astype(np.int32)))
        self.num_vertices = n = len(parent_rows)
        self.order = self.row_of = put(np.arange(n))
        self._parents = put(parent_rows)
        self.level_offsets = np.array([0, n], dtype=np.int64)  # (the native loop reads these)
        present = np.flatnonzero(parent_rows >= 0)
        self._hull = (int(present[0]), int(present[-1]) + 1) if present.size else (0, 0)
        self._names = names  # row -> "sample s, vertex v"

    def size(self, rows):
        return self.num_vertices if rows == "V" else 0

    def vertices(self, t):
        return (0, self.num_vertices)

    def edges(self, t):
        return (0, 0)

    def has_child(self, slot, t):
        return slot == 0 and self._hull[1] > self._hull[0]

    def hull(self, slot):
        return self._hull if slot == 0 else (0, 0)

    def strided(self, slot, t):
        return None

    def child_rows(self, slot, window):
        return self._parents

    def slot_rows(self, slot):
        return self._parents

    def vertex_name(self, row):
        return self._names(row)


def _check_growable(f):
    if not isinstance(f, VertexFunction):
        raise GraphError(f"grow: F must be a VertexFunction, got {type(f).__name__}")
    if f.edge_child_input is not None:
        raise GraphError(f"grow: vertex function {f.name!r} uses gather_sum, but a grown vertex "
                         f"has one parent; read its state with v.gather(0)")
    if any(k != 0 for k in f.gather_slots):
        raise GraphError(f"grow: vertex function {f.name!r} gathers child slot(s) "
                         f"{[k for k in f.gather_slots if k != 0]}, but a grown vertex reads "
                         f"only its parent, with v.gather(0)")


def _run_frontier(f, xp, pull, parent_rows, parent_states, names):
    """F's Program on one frontier: returns (states, outputs, what the next frontier gathers)
    in frontier order. ``parent_states`` holds the previous frontier's states plus one zero row
    (what a root gathers): the scattered state's own buffer, whose spare row stays zero."""
    program = f.program
    rows = _FrontierRows(xp, parent_rows, names)
    views = {key: xp.zeros((n,) + shape, dtype) for key, (n, shape, dtype, _) in
             memory.buffer_specs(program, rows).items()}
    env = interpreter.constants(program, xp)
    for symbol, tensor in zip(f.graph.params, f.params):
        env[id(symbol)] = tensor._array  # (no .data: handing it out counts as a write)
    if f.pull_input is not None:
        env[id(f.pull_input)] = pull
    memory.bind_buffers(program, env, views, rows)
    ranges = {id(s): rows.hull(slot) for slot, s in f.source_slots}
    states = parent_states if parent_states is not None else \
        xp.zeros((1,) + f.scatter_shape, f.dtype)
    interpreter.run(program, xp, env, ranges, rows, interpreter.RowMoves(xp, rows, states=states))
    outputs = program.graph.outputs
    gathered = views[id(program.gathers_from)] if program.gathers_from is not None else None
    return env[id(outputs[0])], env[id(outputs[-1])], gathered


# --- the result ----------------------------------------------------------------------------------

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


# --- growing -------------------------------------------------------------------------------------

def _check_arguments(f, root_pull, num_samples, max_vertices, on_budget, seed, where):
    _check_growable(f)
    validate.integer(max_vertices, "max_vertices (the most vertices one sample may grow)", where,
                     minimum=1)
    validate.integer(seed, "seed (of the per-sample generators)", where, minimum=0)
    if on_budget not in ON_BUDGET:
        raise ArgumentError(f"{where}: on_budget must be 'error' or 'truncate', got "
                            f"{validate.shown(on_budget)}")
    if f.pull_input is None:
        if root_pull is not None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing, but "
                             f"root_pull was given; pass num_samples= instead")
        if num_samples is None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing: say how many "
                             f"samples to grow with num_samples=")
        validate.integer(num_samples, "num_samples", where, minimum=0)
        return None, int(num_samples)
    if root_pull is None:
        raise GraphError(f"{where}: vertex function {f.name!r} pulls: give root_pull, one "
                         f"row per sample (what each root pulls)")
    array = root_pull._array if isinstance(root_pull, Tensor) else \
        root_pull if backend.is_cupy_array(root_pull) else np.asarray(root_pull)
    expected = (array.shape[0] if array.ndim else None,) + f.pull_shape
    if array.ndim == 0 or tuple(array.shape) != expected:
        raise ShapeError(f"{where}: root_pull has shape {describe(array.shape)}, expected "
                         f"(samples, {', '.join(map(str, f.pull_shape))}) — one row of "
                         f"vertex function {f.name!r}'s pull_shape {describe(f.pull_shape)} "
                         f"per sample")
    if num_samples is not None and num_samples != array.shape[0]:
        raise ShapeError(f"{where}: num_samples={num_samples} but root_pull has "
                         f"{array.shape[0]} rows")
    if not np.can_cast(array.dtype, f.pull_dtype, "same_kind"):
        raise DTypeError(f"{where}: root_pull has dtype {array.dtype}, but vertex function "
                         f"{f.name!r} pulls {f.pull_dtype}")
    return array.astype(f.pull_dtype, copy=False), int(array.shape[0])


def _check_children(f, answer, frontier, names, where):
    """``decide``'s answer as (counts: int64 NumPy, child_pull: array or None), checked."""
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise GraphError(f"{where}: decide(frontier) must return (counts, child_pull), got "
                         f"{type(answer).__name__} {validate.shown(answer)}")
    counts, child_pull = answer
    counts = np.asarray(backend.to_numpy(counts))
    n = len(frontier)
    if counts.shape != (n,):
        raise ShapeError(f"{where}: decide's counts have shape {describe(counts.shape)}, "
                         f"expected ({n},): one number of children per frontier vertex")
    if n and counts.dtype.kind not in "iub":
        if counts.dtype.kind != "f" or not (counts == np.round(counts)).all():
            raise DTypeError(f"{where}: decide's counts must be integers, got dtype "
                             f"{counts.dtype}")
    counts = counts.astype(np.int64)
    if (counts < 0).any():
        i = int(np.flatnonzero(counts < 0)[0])
        raise GraphError(f"{where}: {names(i)}: decide asked for {int(counts[i])} children "
                         f"(a count must be >= 0)")
    if f.arity is not None and f.arity < 1 and counts.any():
        raise GraphError(f"{where}: vertex function {f.name!r} declares arity {f.arity}, so "
                         f"a grown vertex cannot read its parent; declare arity=1")
    total = int(counts.sum())
    if f.pull_input is None:
        if child_pull is not None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing, so decide's "
                             f"child_pull must be None")
        return counts, None
    if child_pull is None:
        if total:
            raise GraphError(f"{where}: decide gave no child_pull for {total} children; "
                             f"vertex function {f.name!r} pulls {describe(f.pull_shape)}")
        xp = backend.get_array_module(frontier.pull)
        return counts, xp.zeros((0,) + f.pull_shape, f.pull_dtype)
    xp = backend.get_array_module(frontier.pull)
    child_pull = child_pull._array if isinstance(child_pull, Tensor) else xp.asarray(child_pull)
    if tuple(child_pull.shape) != (total,) + f.pull_shape:
        raise ShapeError(f"{where}: decide's child_pull has shape {describe(child_pull.shape)}, "
                         f"expected {describe((total,) + f.pull_shape)}: one row of pull_shape "
                         f"per child ({total} children asked for)")
    if not np.can_cast(child_pull.dtype, f.pull_dtype, "same_kind"):
        raise DTypeError(f"{where}: decide's child_pull has dtype {child_pull.dtype}, but "
                         f"vertex function {f.name!r} pulls {f.pull_dtype}")
    return counts, child_pull.astype(f.pull_dtype, copy=False)


def _budget(counts, sample, made, max_vertices, on_budget, truncated, where):
    """Cut ``counts`` so that no sample passes ``max_vertices`` (or raise); ``made``: per
    sample, the vertices grown so far (updated)."""
    child_sample = np.repeat(sample, counts)
    asked = np.bincount(child_sample, minlength=len(made))
    over = np.flatnonzero(made + asked > max_vertices)
    if over.size and on_budget == "error":
        s = int(over[0])
        raise GraphError(
            f"{where}: sample {s} reached max_vertices={max_vertices}: it has {int(made[s])} "
            f"vertices and decide asks for {int(asked[s])} more (its stop rule has not "
            f"fired); raise max_vertices, check the stop rule, or pass on_budget='truncate' "
            f"to keep the first {max_vertices} vertices")
    keep = np.ones(len(child_sample), bool)
    if over.size:
        first = np.searchsorted(child_sample, child_sample)  # children are grouped by sample
        rank = np.arange(len(child_sample)) - first
        keep = made[child_sample] + rank < max_vertices
        truncated[over] = True
        parent = np.repeat(np.arange(len(counts)), counts)
        counts = np.bincount(parent[keep], minlength=len(counts))
    made += np.bincount(child_sample[keep], minlength=len(made))
    return counts, keep


def grow(F, root_pull, decide, *, num_samples=None, max_vertices=1024, on_budget="error",
         seed=0):
    """Grow one structure per sample from its root, top-down, F run on every sample's frontier
    at once (see the module docstring). ``root_pull``: one row per sample, what each root
    pulls (a Tensor — gradients reach it through ``Growth.output`` — or an array; None with
    ``num_samples=`` if F pulls nothing). ``decide(frontier)`` -> ``(counts, child_pull)``
    (:class:`Frontier`). ``max_vertices``: the most vertices one sample may have; past it,
    ``on_budget="error"`` raises a GraphError, ``"truncate"`` keeps the first ones and marks
    the sample in ``Growth.truncated``. ``seed``: of the per-sample generators behind
    ``Frontier.uniform``/``sample``. Returns a :class:`Growth`."""
    where = "grow"
    pull, n = _check_arguments(F, root_pull, num_samples, max_vertices, on_budget, seed,
                                where)
    if not callable(decide):
        raise ArgumentError(f"{where}: decide must be a function decide(frontier) -> (counts, "
                            f"child_pull), got {type(decide).__name__}")
    xp = backend.device_module()  # F runs where its parameters and F(batch, pull) would
    streams = _Streams(seed)
    made = np.ones(n, np.int64)
    truncated = np.zeros(n, bool)
    sample, vertex = np.arange(n), np.zeros(n, np.int64)
    depth, slot, parent = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1)
    parent_rows, parent_states = np.full(n, -1), None
    records, sizes = [], []
    if pull is not None:
        pull = backend.to_device(pull)
    while len(sample):
        def names(i, sample=sample, vertex=vertex):
            return f"sample {int(sample[i])}, vertex {int(vertex[i])}"

        state, push, parent_states = _run_frontier(F, xp, pull, parent_rows, parent_states,
                                                   names)
        records.append(dict(sample=sample, vertex=vertex, depth=depth, slot=slot, parent=parent,
                            pull=pull, state=state, push=push))
        sizes.append(len(sample))
        frontier = Frontier(push, state, pull, sample, vertex, depth, slot, streams)
        counts, child_pull = _check_children(F, decide(frontier), frontier, names, where)
        first_new = made.copy()
        counts, keep = _budget(counts, sample, made, max_vertices, on_budget, truncated, where)
        parent_rows = np.repeat(np.arange(len(sample)), counts)
        starts = np.cumsum(counts) - counts
        slot = np.arange(len(parent_rows)) - np.repeat(starts, counts)
        parent = vertex[parent_rows]
        sample = sample[parent_rows]
        vertex = first_new[sample] + np.arange(len(sample)) - np.searchsorted(sample, sample)
        depth = depth[parent_rows] + 1
        if child_pull is not None:
            pull = child_pull[xp.asarray(np.flatnonzero(keep))] if not keep.all() else child_pull
    return Growth(F, n, records, truncated, root_pull, sizes)


def grow_per_sample(F, root_pull, decide, *, num_samples=None, max_vertices=1024,
                    on_budget="error", seed=0):
    """The reference :func:`grow` is tested against: each sample grown alone, level by level,
    the cell run eagerly vertex by vertex (no batching, no Program), ``decide`` called on that
    sample's frontier only. Returns a :class:`Growth` whose ``output`` is the eager Tensors
    of the growth itself (differentiable with the eager autodiff)."""
    where = "grow_per_sample"
    pull, n = _check_arguments(F, root_pull, num_samples, max_vertices, on_budget, seed,
                                where)
    streams = _Streams(seed)
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
            counts, child_pull = _check_children(F, decide(frontier), frontier, names, where)
            first_new = int(made[s])
            counts, keep = _budget(counts, sample, made, max_vertices, on_budget, truncated,
                                   where)
            parent_of = np.repeat(np.arange(len(vertex)), counts)
            slot = np.arange(len(parent_of)) - np.repeat(np.cumsum(counts) - counts, counts)
            parent = vertex[parent_of]
            vertex = first_new + np.arange(len(parent_of))
            depth = depth[parent_of] + 1
            parents_state = states
            if child_pull is not None:
                frontier_pull = [Tensor(row) for row in np.asarray(child_pull)[keep]]
    growth = Growth(F, n, records, truncated, root_pull, [steps[t] for t in sorted(steps)])
    rows = [None] * growth.num_vertices
    for s, vertex, pushes in outputs:
        for v, out in zip(vertex, pushes):
            rows[int(growth.offsets[s]) + int(v)] = shape_ops.reshape(out, (1,) + tuple(out.shape))
    shape = F.push_shape if F.push_output is not None else F.scatter_shape
    growth._output = shape_ops.concat(rows, axis=0) if rows else \
        Tensor(np.zeros((0,) + shape, F.dtype))
    return growth


# --- teacher forcing: a given structure, top-down ------------------------------------------------

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
