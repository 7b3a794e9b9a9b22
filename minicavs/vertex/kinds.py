"""Vertex kinds: one vertex function with several cells, the cell chosen per vertex by graph data.

``mc.VertexFunction.by_kind({"leaf": leaf_cell, "internal": internal_cell}, by="leaf", ...)``
makes a :class:`KindedFunction`. Each cell is traced once (a :class:`~.cell.TracedCell`, with its
own Programs of F and ∂F); the kind of a vertex comes from its graph (``by="leaf"``: leaf or
internal; ``by="arity"``: its number of children) or from an integer per vertex given with the
call (``by="tag"``, ``F(batch, pull=X, tag=T)``). A plain
:class:`~minicavs.vertex.function.VertexFunction` is the case of one kind (``by=None``): every
vertex runs its one cell, and this is its call too.

How a call runs (no masked work: each kind's program sees its own rows only):

* the batch's rows are sorted by (kind, level), stably, so each kind owns one contiguous block of
  rows, and within it one contiguous block per level (:func:`kind_schedule`, once per batch and
  kind assignment). Each kind gets its own :class:`~minicavs.vertex.graphs.BatchIndices` over
  its block: its levels are the batch levels where it has vertices; its child rows point into
  the batch's rows, whatever the child's kind. With one kind present nothing is sorted: the
  kind's rows are the batch's own, in its level order;
* there is one state buffer for the whole batch: a kind's scattered state is its block of it, so
  a parent of any kind gathers the state a child of any kind scattered (one kind: its Program's
  own pooled state buffer);
* each kind's Program is bound as one part of the call (``runtime/call.py``) and the runtime's
  driver (``runtime/driver.py``) runs every kind's eager phase, then the levels of all kinds in
  step (bottom-up for F, top-down for ∂F), each kind's consecutive levels in one call of its
  backend (the native loop where it compiles), then every lazy phase; ∂F adds into one state
  gradient;
* a parameter several cells close over is one input of the op and gets the sum of their
  gradients.
"""

from collections import namedtuple
import functools
import operator
import time

import numpy as np

from .. import backend, validate
from ..autodiff.tensor import Tensor, is_grad_enabled
from ..errors import DTypeError, GraphError, IndexRangeError, ShapeError
from ..ops import registry, shape as shape_ops
from ..ops.index import scatter_add_into, take_rows
from ..ops.registry import Op, describe
from ..runtime import call, driver, memory
from .cell import TracedCell
from .frontend import BatchedFunction
from .graphs import BatchIndices, GraphBatch

SELECTORS = ("leaf", "arity", "tag")


def kinds_of_vertices(batch, by, tag=None):
    """The kind key of every vertex of ``batch`` (its vertex order), as a list of distinct keys
    and an int array of positions in it: ``"leaf"``/``"internal"``, the arity, or the tag
    (``by=None``: one kind, None). Memoised on the batch, as :func:`kind_schedule` is (a sort
    of the batch's vertices: 30-60 us a call of a recursive function, which asks twice)."""
    if by is None:
        return [None], np.zeros(batch.num_vertices, dtype=np.int64)
    memo = batch.__dict__.setdefault("_kinds_of_vertices", {})
    key = (by, None if by != "tag" else tag.tobytes())
    found = memo.get(key)
    if found is None:
        arity = batch.num_children
        if by == "leaf":
            found = ["leaf", "internal"], np.where(arity == 0, 0, 1)
        else:
            distinct, keys = np.unique(arity if by == "arity" else tag, return_inverse=True)
            found = distinct.tolist(), keys.reshape(-1)
        if len(memo) > 8:
            memo.clear()
        memo[key] = found
    return found


def check_tag(tag, batch, name):
    """``tag``: one integer per vertex of the batch (array-like or Tensor)."""
    if tag is None:
        raise GraphError(f"{name}: tag= is required (kinds are chosen by a tag per vertex)")
    array = np.asarray(tag.numpy() if isinstance(tag, Tensor) else tag)
    if array.dtype.kind not in "iu":
        raise DTypeError(f"{name}: tag must hold integers, one per vertex, got dtype "
                         f"{array.dtype}")
    if array.shape != (batch.num_vertices,):
        raise ShapeError(f"{name}: tag has shape {describe(array.shape)}, expected "
                         f"{describe((batch.num_vertices,))} (one per vertex of the batch)")
    if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
        # as int64 it would wrap around: 2**64 - 1 would run the cell of kind -1
        vertex = int(np.argmax(array > np.iinfo(np.int64).max))
        raise IndexRangeError(f"{name}: tag {int(array[vertex])} of vertex {vertex} is outside "
                              f"int64, the range of kind tags")
    return array.astype(np.int64)


class _KindBatch:
    """The rows of one kind, laid out as :class:`BatchIndices` reads a GraphBatch: its own rows
    (``num_vertices``, levels, edges by parent row) counted from the first row of its block, and
    its children's rows counted in the whole batch (where the states are)."""

    def __init__(self, batch, order, first, stop, edges):
        self.first, self.stop = first, stop
        self.num_vertices = stop - first
        self.order = order[first:stop]  # each row's vertex (the caller's order)
        self.row_of = None  # unused: outputs are put in the caller's order by KindedFunction
        self.sample_of, self.offsets = batch.sample_of, batch.offsets
        self.is_forest = batch.is_forest
        levels, counts = np.unique(batch.level[self.order], return_counts=True)
        self.levels = levels.tolist()  # the batch level of each of the kind's levels
        self.num_levels = len(self.levels)
        self.level_offsets = np.zeros(self.num_levels + 1, dtype=np.int64)
        np.cumsum(counts, out=self.level_offsets[1:])
        parent_row, child_row, slot = edges
        e0, e1 = np.searchsorted(parent_row, [first, stop])
        self.edge_parent_row = parent_row[e0:e1] - first
        self.edge_child_row = child_row[e0:e1]
        self.edge_slot = slot[e0:e1]
        self.max_arity = int(self.edge_slot.max(initial=-1)) + 1  # (child slots 0..k-1)
        self.edge_level_offsets = np.searchsorted(self.edge_parent_row, self.level_offsets)
        level_index = np.repeat(np.arange(self.num_levels), counts)
        self.edge_parent_local = self.edge_parent_row - self.level_offsets[
            level_index[self.edge_parent_row]]
        self._child_rows = {}

    child_rows_of = GraphBatch.child_rows_of  # (the same edge arrays, counted in the block)


class _WholeBatch:
    """The block of a kind that owns every vertex: all the batch's rows and levels."""

    def __init__(self, batch):
        self.first, self.stop, self.num_vertices = 0, batch.num_vertices, batch.num_vertices
        self.levels = list(range(batch.num_levels))


class KindSchedule:
    """A batch's rows sorted by (kind, level): ``order`` (row -> vertex), ``row_of`` (its
    inverse), and per kind present its block (``parts``: kind position -> _KindBatch). With one
    kind present (``kind_of`` None or constant) the sort would give the batch's own level
    order, so nothing is sorted: the kind's rows are the batch's (``one``)."""

    def __init__(self, batch, kind_of=None):
        self._indices = {}
        self.one = kind_of is None or not (kind_of != kind_of[0]).any()
        if self.one:
            self.order, self.row_of = batch.order, batch.row_of
            self.parts = {0 if kind_of is None else int(kind_of[0]): _WholeBatch(batch)}
            return
        self.order = np.lexsort((batch.level, kind_of))
        self.row_of = np.empty_like(self.order)
        self.row_of[self.order] = np.arange(batch.num_vertices)
        edges = batch.edges_by_row(self.row_of)
        sizes = np.bincount(kind_of)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        self.parts = {k: _KindBatch(batch, self.order, int(starts[k]), int(starts[k + 1]), edges)
                      for k in np.flatnonzero(sizes).tolist()}

    def indices(self, batch, xp):
        """Per kind present, its BatchIndices on ``xp`` (made once; one kind: the batch's)."""
        if self.one:
            return {k: batch.indices(xp) for k in self.parts}
        found = self._indices.get(xp.__name__)
        if found is None:
            found = self._indices[xp.__name__] = {
                k: BatchIndices(part, xp) for k, part in self.parts.items()}
        return found


def kind_schedule(batch, kind_of=None):
    """The KindSchedule of ``batch`` for the kinds ``kind_of`` (None: one kind), memoised on
    the batch (a batch is usually called with one assignment of kinds: leaf, arity, or one tag
    array)."""
    memo = batch.__dict__.setdefault("_kind_schedules", {})
    key = None if kind_of is None else kind_of.tobytes()
    found = memo.get(key)
    if found is None:
        if len(memo) > 8:
            memo.clear()
        found = memo[key] = KindSchedule(batch, kind_of)
    return found


class KindsMemoryModel:
    """What a kinded call needs (memory.py's CallModel protocol): the sum of every kind's
    CallModel taken at the whole batch's sizes — an upper bound, since each kind's buffers
    hold only its own rows."""

    def __init__(self, cells):
        self.models = [c.memory_model for c in cells]
        self.kept = sum((m.kept for m in self.models), memory.Linear())

    def need(self, sizes, training):
        return sum(m.need(sizes, training) for m in self.models)


class KindPrograms:
    """The Programs of every kind, printable together (``dump``): what ``F.program`` of a
    KindedFunction is (``backward=True``: ∂F's)."""

    def __init__(self, function, backward=False):
        self.function, self.backward = function, backward

    @property
    def kinds(self):
        f = self.function
        return {key: (c.backward_program if self.backward else c.program)
                for key, c in f.cells.items()}

    def dump(self):
        f = self.function
        lines = [f"{len(f.cells)} vertex kinds, chosen {f.chosen_by}:"]
        for key, program in self.kinds.items():
            lines.append(f"kind {f.kind_names.get(key, repr(key))}:")
            lines.extend("  " + line for line in program.dump().splitlines())
        return "\n".join(lines)

    def __repr__(self):
        return f"KindPrograms({', '.join(repr(k) for k in self.kinds)})"


_CHOSEN_BY = {"leaf": "by whether the vertex has children (leaf / internal)",
              "arity": "by the number of children of the vertex",
              "tag": "by the tag given per vertex with the call (tag=)"}


class KindedFunction(BatchedFunction):
    """A vertex function with one cell per vertex kind (see the module docstring).

    ``cells``: {kind: cell(v)}; kinds are ``"leaf"``/``"internal"`` (``by="leaf"``), numbers of
    children (``by="arity"``) or integers (``by="tag"``). The other keywords are those of
    :class:`~minicavs.vertex.function.VertexFunction`, shared by every cell; ``arity``
    defaults to the key under ``by="arity"``. Every cell scatters the same state shape; if one
    pushes, all do.
    Calling: ``F(batch, pull=X)`` (``tag=T`` under ``by="tag"``), one row per vertex.
    """

    def __init__(self, cells, by, scatter_shape, pull_shape=None, push_shape=None, arity=None,
                 dtype=None, pull_dtype=None, name=None, options=None, _traced=None):
        if by not in SELECTORS:
            raise GraphError(f"VertexFunction.by_kind: by must be one of {SELECTORS}, got "
                             f"{by!r}")
        if not isinstance(cells, dict) or not cells:
            raise GraphError(f"VertexFunction.by_kind: cells must be a non-empty dict {{kind: "
                             f"cell}}, got {validate.shown(cells)}")
        for key in cells:
            ok = key in ("leaf", "internal") if by == "leaf" else (
                isinstance(key, (int, np.integer)) and not isinstance(key, bool)
                and (by == "tag" or key >= 0))
            if not ok:
                wanted = {"leaf": "'leaf' or 'internal'", "arity": "a number of children >= 0",
                          "tag": "an integer"}[by]
                raise GraphError(f"VertexFunction.by_kind(by={by!r}): kind {key!r} is not "
                                 f"{wanted}")
        self.by, self.chosen_by, self.arity = by, _CHOSEN_BY[by], arity
        self.kind_names = {}  # kind -> how dump() and explain() name it (default: the key)
        self.name = name or "kinds"
        common = dict(scatter_shape=scatter_shape, pull_shape=pull_shape, push_shape=push_shape,
                      pull_dtype=pull_dtype, options=options)

        def make(dt):
            made = {}
            for key, cell in cells.items():
                if _traced is not None and key in _traced and (
                        dt is None or _traced[key].dtype == dt):
                    made[key] = _traced[key]
                    continue
                a = key if by == "arity" and arity is None else arity
                made[key] = TracedCell(cell, arity=a, dtype=dt, name=f"{self.name}[{key}]",
                                       **common)
            return made

        self.cells = make(dtype)
        dtypes = {c.dtype for c in self.cells.values()}
        if len(dtypes) > 1:  # inferred per cell: all run in their common type
            self.cells = make(np.result_type(*dtypes))
        first = next(iter(self.cells.values()))
        self.dtype, self.pull_dtype = first.dtype, first.pull_dtype
        self.scatter_shape, self.pull_shape = first.scatter_shape, first.pull_shape
        pushes = {key: c.push_output is not None for key, c in self.cells.items()}
        if len(set(pushes.values())) > 1:
            some = [k for k, p in pushes.items() if p]
            others = [k for k, p in pushes.items() if not p]
            raise GraphError(f"vertex function {self.name!r}: kind {some[0]!r} pushes an output "
                             f"but kind {others[0]!r} does not; every kind pushes, or none")
        shapes = {c.push_shape for c in self.cells.values()}
        if first.push_output is not None and len(shapes) > 1:
            raise ShapeError(f"vertex function {self.name!r}: the kinds push different shapes "
                             f"{sorted(shapes)}")
        self.push_shape = first.push_shape if first.push_output is not None else None
        # one input of the op per parameter, however many cells use it (in order of first use)
        self.params = list({id(p): p for c in self.cells.values() for p in c.params}.values())
        self.program = KindPrograms(self)
        self.backward_program = KindPrograms(self, backward=True)
        self._memory_model = None
        self._make_op()

    def _make_op(self):
        """The op a call applies (once ``cells``, ``by``, ``params`` and the shapes are set),
        and where each cell's parameters are among the op's (``params``)."""
        position = {id(p): i for i, p in enumerate(self.params)}
        self._param_positions = {key: [position[id(p)] for p in c.params]
                                 for key, c in self.cells.items()}
        captured = {}  # each parameter's first capture: messages name it and its line
        for c in self.cells.values():
            for node, p in zip(c.graph.params, c.params):
                captured.setdefault(id(p), node)
        self._op = Op(f"vertex:{self.name}", self._forward, self._infer, self._vjp,
                      runs_whole=True, argument_names=self._argument_names(
                          [captured[id(p)] for p in self.params]))
        self._last_stats = None

    @property
    def memory_model(self):
        if self._memory_model is None:
            self._memory_model = KindsMemoryModel(self.cells.values())
        return self._memory_model

    # --- the call --------------------------------------------------------------------------
    def __call__(self, batch, pull=None, tag=None, rows=None):
        batch = self._check_call(batch, pull, who="a cell" if len(self.cells) > 1 else "the cell")
        if self.by == "tag":
            tag = check_tag(tag, batch, f"vertex function {self.name!r}")
        elif tag is not None:
            raise GraphError(f"vertex function {self.name!r}: tag= given, but kinds are chosen "
                             f"by={self.by!r}")
        rows = None if rows is None else _check_rows(rows, batch, f"vertex function "
                                                                  f"{self.name!r}")
        sub_batches = memory.plan(self, batch, training=is_grad_enabled())
        if sub_batches is None:
            return self._apply(batch, pull, tag, rows)
        # Over the memory budget: whole graphs at a time; their rows, in order, are the
        # batch's, and gradients flow back through each.
        outs = []
        for first, stop in sub_batches:
            v0, v1 = int(batch.offsets[first]), int(batch.offsets[stop])
            outs.append(self._apply(
                GraphBatch(batch.graphs[first:stop]),
                None if pull is None else shape_ops.slice_axis(pull, v0, v1, axis=0),
                None if tag is None else tag[v0:v1]))
        out = shape_ops.concat(outs, axis=0)
        return out if rows is None else take_rows(out, Tensor(rows))

    def _apply(self, batch, pull, tag, rows=None):
        """The op on ``batch``, its rows scheduled by kind (one kind: no sorting at all)."""
        started = time.perf_counter()
        if self.by is None:
            schedule, kinds = kind_schedule(batch), ((0, None),)
        else:
            keys, kind_of = kinds_of_vertices(batch, self.by, tag)
            self._check_kinds(batch, keys, kind_of)
            schedule = kind_schedule(batch, kind_of)
            kinds = tuple((k, keys[k]) for k in schedule.parts)
        record = call.CallRecord(scheduling_seconds=time.perf_counter() - started)
        args = ([pull] if pull is not None else []) + self.params
        return registry.apply(self._op, *args, batch=batch, schedule=schedule, kinds=kinds,
                              call=record, rows=rows)

    def _check_kinds(self, batch, keys, kind_of):
        missing = [i for i, key in enumerate(keys) if key not in self.cells]
        if missing:
            v = int(np.flatnonzero(kind_of == missing[0])[0])
            s = int(batch.sample_of[v])
            what = {"leaf": "", "arity": " (its number of children)", "tag": " (its tag)"}[
                self.by]
            raise IndexRangeError(f"vertex function {self.name!r}: sample {s}, vertex "
                                  f"{v - int(batch.offsets[s])} is of kind {keys[missing[0]]!r}"
                                  f"{what}, which has no cell; the kinds are "
                                  f"{list(self.cells)}")

    def _infer(self, *avals, batch, schedule, kinds, call, rows):  # noqa: ARG002
        out = self._infer_output(avals, batch)
        return out if rows is None else registry.Aval((len(rows),) + tuple(out.shape[1:]),
                                                      out.dtype)

    # --- F and ∂F as one op: bind each kind's Program to the call's values, run them --------
    def _forward(self, xp, *arrays, batch, schedule, kinds, call, rows):
        try:
            return self._run_forward(xp, arrays, batch, schedule, kinds, call, rows)
        except MemoryError as exc:
            raise memory.out_of_memory(self, batch, "forward", exc, is_grad_enabled()) from None

    def _run_forward(self, xp, arrays, batch, schedule, kinds, record, rows):
        started = time.perf_counter()
        pull, params = (arrays[0], arrays[1:]) if self.pull_shape is not None else (None, arrays)
        n = batch.num_vertices
        indices = schedule.indices(batch, xp)
        states = None  # one kind: its own pooled buffer holds the states
        if len(kinds) > 1:  # one state buffer for all kinds, each writing its block of rows
            states = xp.empty((n + 1,) + self.scatter_shape, dtype=self.dtype)
            states[n:] = 0  # the spare row an absent child reads
        parts = []
        for position, key in kinds:  # each kind on its block of rows, gathering from all
            f, block = self.cells[key], schedule.parts[position]
            shared = {} if states is None else dict(
                states=states, block=states[block.first:block.stop], levels=block.levels)
            parts.append(call.bind_forward(f.executable, xp, indices[position],
                                           [params[i] for i in self._param_positions[key]],
                                           pull, record=record, **shared))
        driver.run(parts, xp)
        record.saved = [part.saved(self.cells[key].backward_graph)  # only what ∂F reads
                        for part, (_, key) in zip(parts, kinds)]
        if rows is not None:
            record.selected = _selected(xp, schedule, rows, kinds, indices, n)
        result = _in_caller_order(xp, parts, [part.output for part in parts], n,
                                  record.selected)
        record.stats = self._stats(batch, schedule, kinds, parts, time.perf_counter() - started)
        record.stats["scheduling_seconds"] += record.scheduling_seconds
        self._last_stats = record.stats
        return result

    def _stats(self, batch, schedule, kinds, parts, seconds):
        stats = call.stats(batch, parts[0].counts if self.by is None else None, seconds)
        if self.by is not None:
            stats["kinds"] = {}
            for (position, key), part in zip(kinds, parts):
                block = schedule.parts[position]
                stats["kinds"][self.kind_names.get(key, key)] = {
                    "vertices": block.num_vertices, "levels": block.levels,
                    "forward_ops_per_level": part.counts, "backward_ops_per_level": None,
                    "forward_backend": part.backend, "backward_backend": None}
        stats["forward_backend"] = _one_backend(self._named(kinds, parts))
        stats["forward_launches_per_level"], stats["forward_launches_by_category"] = (
            call.launches_per_level(parts, batch.num_levels))
        stats["forward_host_us_per_level"] = call.host_us_per_level(parts, batch.num_levels)
        return stats

    def _named(self, kinds, parts):
        return [(self.kind_names.get(key, key), part) for (_, key), part in zip(kinds, parts)]

    def _vjp(self, g, out, *inputs, batch, schedule, kinds, call, rows):
        if is_grad_enabled():
            raise GraphError(f"vertex function {self.name!r}: backward(create_graph=True) "
                             f"through a vertex function is not supported (no second "
                             f"derivatives through the batched runtime)")
        try:
            return self._run_backward(g, batch, schedule, kinds, call, rows)
        except MemoryError as exc:
            raise memory.out_of_memory(self, batch, "backward", exc, True) from None

    def _run_backward(self, g, batch, schedule, kinds, record, rows):
        started = time.perf_counter()
        xp = backend.get_array_module(g._array)
        n = batch.num_vertices
        cotangent, at, by_kind = g._array, None, None
        indices = schedule.indices(batch, xp)
        if rows is not None and schedule.one:  # the rows' gradient, added at their level rows
            at = record.selected  # (on a GPU, copied there once for both)
        elif rows is not None and xp is np:  # several kinds: each kind its rows' gradient, at
            by_kind = record.selected.parts  # its level rows (a kind asked for none of its rows
            # skips its pushed output's ∂: the leaves' under a loss on the rest)
        elif rows is not None:  # (on a GPU) the whole gradient, in the caller's order
            cotangent = scatter_add_into(xp, xp.zeros((n,) + cotangent.shape[1:],
                                                      cotangent.dtype), xp.asarray(rows),
                                         cotangent)
        d_states = None  # one kind: ∂F's own buffer, cleared; several: one for all kinds
        if len(kinds) > 1:
            d_states = xp.zeros((n + 1,) + self.scatter_shape, dtype=self.dtype)
        parts = []
        try:
            for k, ((position, key), saved) in enumerate(zip(kinds, record.saved)):
                f, block = self.cells[key], schedule.parts[position]
                shared = {} if d_states is None else dict(
                    d_states=d_states, block=d_states[block.first:block.stop],
                    levels=block.levels)
                part_cotangent = cotangent
                if by_kind is not None:
                    which, at = by_kind[k]
                    part_cotangent = cotangent[which]
                parts.append(call.bind_backward(f.backward_executable, xp, indices[position],
                                                saved, part_cotangent, at=at, **shared))
            driver.run(parts, xp)
            grads = self._gradients(xp, n, kinds, parts)
        finally:
            for part in parts:
                part.release()
        stats = record.stats
        if self.by is None:
            stats["backward_ops_per_level"] = parts[0].counts[::-1]
        else:
            for (_, key), part in zip(kinds, parts):
                kind = stats["kinds"][self.kind_names.get(key, key)]
                kind["backward_ops_per_level"] = part.counts[::-1]
                kind["backward_backend"] = part.backend
        stats["backward_backend"] = _one_backend(self._named(kinds, parts))
        stats["backward_seconds"] = time.perf_counter() - started
        stats["backward_launches_per_level"], stats["backward_launches_by_category"] = (
            call.launches_per_level(parts, batch.num_levels))
        stats["backward_host_us_per_level"] = call.host_us_per_level(parts, batch.num_levels)
        return grads

    def _gradients(self, xp, n, kinds, parts):
        """The op's gradients, in its arguments' order: the pulled rows' (caller's vertex
        order; None for ids), then each parameter's, summed over the kinds that use it
        (shared shapes: never a pooled buffer, so one kind's is returned as it is)."""
        param_grads, pull_grads = {}, []
        for (_, key), part in zip(kinds, parts):
            f, grad_of = self.cells[key], part.gradients()
            for node, i in zip(f.graph.params, self._param_positions[key]):
                if node.key in grad_of:
                    param_grads.setdefault(i, []).append(grad_of[node.key])
            pull_grads.append(grad_of.get(f.pull_input.key) if f.pull_input is not None else None)
        grads = []
        if self.pull_shape is not None:
            pulled = self.pull_dtype.kind == "f" and any(g is not None for g in pull_grads)
            grads.append(Tensor(_in_caller_order(xp, parts, pull_grads, n)) if pulled else None)
        return grads + [Tensor(functools.reduce(operator.add, param_grads[i]))
                        if i in param_grads else None for i in range(len(self.params))]

    def __repr__(self):
        return (f"KindedFunction({self.name!r}: kinds {list(self.cells)} chosen by "
                f"{self.by}, {len(self.params)} params)")


def _check_rows(rows, batch, who):
    """``rows=`` of a call: the vertices (the batch's ids) whose outputs it returns."""
    array = np.asarray(backend.to_numpy(getattr(rows, "_array", rows)))
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise GraphError(f"{who}: rows= must be a 1-D array of vertex ids (integers), e.g. "
                         f"batch.roots; got {describe(array.shape)} {array.dtype}")
    n = batch.num_vertices
    bad = np.flatnonzero((array < 0) | (array >= n))
    if len(bad):
        raise IndexRangeError(f"{who}: rows[{bad[0]}] = {array[bad[0]]} is not a vertex of the "
                              f"batch (it has {n}: ids 0..{n - 1})")
    return array.astype(np.int64, copy=False)


def _selected(xp, schedule, rows, kinds, indices, n):
    """``rows`` (caller's vertex ids) as level rows of a one-kind call; of a call of several
    kinds on NumPy, split by kind (:class:`_ByKind`); else as they are. On a GPU as the row
    kernels' int32 (a batch's rows are below 2**31: BatchIndices)."""
    if not schedule.one and xp is np:
        return _ByKind(len(rows), _rows_by_kind(indices, kinds, rows, n))
    selected = schedule.row_of[rows] if schedule.one else rows
    return selected if xp is np else xp.asarray(selected.astype(np.int32))


# rows= of a call of several kinds: ``count`` rows asked; ``parts``, per kind of the call (in
# its order), the positions among them of that kind's vertices and their level rows in it.
_ByKind = namedtuple("_ByKind", "count parts")


def _rows_by_kind(indices, kinds, rows, n):
    """The ``parts`` of :class:`_ByKind` (``indices``: position -> the kind's BatchIndices)."""
    part_of, level_row = np.empty(n, np.int64), np.empty(n, np.int64)
    for position, part in indices.items():
        part_of[part.order] = position
        level_row[part.order] = np.arange(len(part.order))
    kind = part_of[rows]
    return [(which, level_row[rows[which]])
            for which in (np.flatnonzero(kind == position) for position, _ in kinds)]


def _in_caller_order(xp, parts, values, n, rows=None):
    """Each part's rows of ``values`` (level order within its kind) in the caller's vertex
    order: one part, one take; several, each put at its vertices (zeros where a part has no
    value: a kind that pulls nothing). ``rows``: only these (from :func:`_selected`)."""
    if len(parts) == 1:
        return call.take_rows(xp, values[0], parts[0].rows.row_of if rows is None else rows)
    like = next(v for v in values if v is not None)
    make = xp.empty if all(v is not None for v in values) else xp.zeros
    if isinstance(rows, _ByKind):  # each kind's rows asked for, straight to their places
        result = make((rows.count,) + like.shape[1:], dtype=like.dtype)
        for (which, level_rows), value in zip(rows.parts, values):
            if value is not None and len(which):
                result[which] = value[level_rows]
        return result
    result = make((n,) + like.shape[1:], dtype=like.dtype)
    for part, value in zip(parts, values):
        if value is not None:
            result[part.rows.order] = value
    return result if rows is None else result[rows]


def _one_backend(named_parts):
    """The backend of every kind with per-level work, or each kind's where they differ;
    ``named_parts``: (kind name, part)."""
    working = [p for _, p in named_parts if p.program.core] or [p for _, p in named_parts]
    backends = {p.backend for p in working}
    return backends.pop() if len(backends) == 1 else "; ".join(
        f"kind {name}: {p.backend}" for name, p in named_parts)
