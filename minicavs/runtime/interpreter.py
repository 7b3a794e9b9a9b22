"""The interpreter: the reference backend, running a Program's instructions on NumPy or CuPy.

The driver (driver.py) runs a call's phases; this module runs instructions:

* :func:`run_whole`: an eager or lazy instruction over all rows of the batch (on a product the
  zero_rows pass marked, only over its nonzero rows);
* :class:`InterpreterLoop`: the level loop, one Python step per instruction per level::

      for each level (bottom-up for F, top-down for ∂F), as the driver asks:
          bind the level's rows of every per-row value
          for each core instruction: run it, or write its zeros, or skip it (the level plan)

Memory is touched only at F's entrance and exit (Cavs §3.3): a gather copies the children's
rows of the scattered state into a contiguous block, a scatter-add puts a gather's gradient
into the children's rows of the state gradient; the scattered state is itself a batch-wide
buffer, so scattering copies nothing. Rows move with the named kernels of
``minicavs/cuda/kernels.py`` on CuPy (int32 indices, built once per batch) and with
``np.take``/indexed adds on NumPy, their twins: an absent child reads the spare zero row.
``xp`` may be ``RECORD``: ops then run on Tensors, recorded for autodiff (static functions
differentiated twice).
"""

import functools

import numpy as np

from ..ops.index import scatter_add_into
from ..ops.batching import instantiate, row_domain
from .executor import RECORD, OpStep
from .plans import RUN, ZERO, record_written, widen
from .program import Compute, Gather, ScatterAdd
from .zero_rows import FULL, index_rows, intersect


class InterpreterLoop:
    """The level loop of one bound Program (a :class:`~.call.Part`) on array module ``xp``;
    ``check``: debug mode's per-instruction check, or None. :meth:`run` runs levels ``first``
    to ``stop`` of the loop's order, :meth:`finish` ends the loop and returns the instructions
    run per level."""

    def __init__(self, part, xp, check=None, backend="interpreter"):
        self.backend = backend
        self.counts = []
        self._steps = _level_steps(part, xp, check)

    def run(self, first, stop):
        for _ in range(stop - first):
            self.counts.append(next(self._steps))

    def finish(self):
        for ran in self._steps:  # (none left: the generator's bookkeeping after the last)
            self.counts.append(ran)
        return self.counts


def _level_steps(part, xp, check):
    """The level loop, one level per step: yields the instructions run on it."""
    program, env, ranges, rows = part.program, part.env, part.ranges, part.rows
    moves = RowMoves(xp, rows, part.states, part.d_states)
    windows = _windows(part, xp)
    row_keys = [(k, d) for k, d in program.row_keys if k in env]
    in_buffers = program.buffered | {p.key for p, *_ in program.aliases}
    written, summed = {}, {}
    for t, window, plan in part.exe.plans.levels(ranges, rows):
        local = dict(env)  # shared values as they are, per-row ones cut to the level's rows
        for key, domain in row_keys:
            lo, hi = window[domain]
            local[key] = env[key][lo:hi]
        if program.edge_parent is not None:  # per level, parent rows count from the first
            local[program.edge_parent.key] = rows.edge_parent_local[slice(*window["edge"])]
        ran = 0
        steps = windows.steps(plan) if windows else ()
        for k, (ins, action) in enumerate(zip(program.core, plan)):
            if action == RUN:
                ran += 1
                if not steps:
                    moves.run(ins, local, t, window)
                elif steps[k] is not None:  # (None: done by a launch of the level's row moves)
                    steps[k](ins, local, t, window)
                if check:
                    check(ins, local, t, window)
                for o, add in zip(ins.writes, getattr(ins, "accumulate", ())):
                    if add:
                        summed[o.key] = summed[o.key] + local[o.key] if o.key in summed \
                            else local[o.key]
                for o in ins.writes:
                    if o.key in env and row_domain(o.shape):
                        widen(written, o.key, window[row_domain(o.shape)])
            elif action == ZERO:
                for o in ins.writes:
                    moves.zero(o, local, window, o.key in in_buffers)
        yield ran
    env.update(summed)
    record_written(program, ranges, written)



def _windows(part, xp):
    """The Program's :class:`Windows` on CuPy (made once, kept by the Executable), else None."""
    if xp is np or xp is RECORD or part.states is None and part.d_states is None:
        return None
    exe = part.exe
    if getattr(exe, "windows", None) is None:
        exe.windows = Windows(part.program)
    if not exe.windows.gathers and not exe.windows.scatters:
        return None
    return exe.windows.bound(part, xp)


def run_whole(ins, xp, env, ranges, rows):
    """An eager or lazy step over all rows of the batch; where the zero_rows pass allows, a
    product runs on its nonzero rows only. Records the zero-row range of each output."""
    step = ins.step
    node = getattr(step, "node", None)

    def range_of(x):
        return ranges.get(x.key, FULL) if row_domain(x.shape) else None

    buffers = [env.get(o.key) for o in ins.writes]  # outputs with a batch buffer: keep it
    done = None
    if ins.restrict:
        within = index_rows(env[ins.demand.key]) if ins.demand is not None else None
        done = node.op.on_nonzero_rows(xp, node, [env[x.key] for x in node.inputs], range_of,
                                       within)
    if done is not None:
        env[node.key], out_range = done
    else:
        _compute(ins, xp, env, *((rows.num_vertices, rows.num_edges) if rows else (0, 0)))
    for o, buffer in zip(ins.writes, buffers):
        if buffer is not None and env[o.key] is not buffer:
            buffer[...] = env[o.key]
            env[o.key] = buffer
    if done is not None:
        if out_range is not None:
            ranges[node.key] = out_range
        return
    if ins.zero_rule is None:
        return
    out_ranges = ins.zero_rule(range_of)
    index = node.op.row_index_arg if node is not None else None
    if index is not None and out_ranges[0] is not None and \
            node.inputs[index].shape[:1] == node.shape[:1]:  # row i is zero where idx[i] is -1
        out_ranges[0] = intersect(out_ranges[0], index_rows(env[node.inputs[index].key]))
    for o, r in zip(ins.writes, out_ranges):
        if r is not None:
            ranges[o.key] = r


def run_static_step(ins, xp, env, rows, outs):
    """An instruction of a static Program over ``rows`` rows (V), its outputs into ``outs``
    where given."""
    _compute(ins, xp, env, rows, 0, outs)


def _compute(ins, xp, env, n, e, outs=None):
    step = ins.step
    if ins.symbolic:  # attributes recorded with V or E get the task's sizes
        node = step.node
        step = OpStep(node, {k: instantiate(v, n, e) for k, v in node.attrs.items()})
    step.run(xp, env, outs)


class RowMoves:
    """The core instructions of one call, on one array module: gathers read ``states`` (F's
    scattered state, with its spare zero row), scatter-adds write ``d_states`` (∂F's state
    gradient, with a spare row that absorbs the adds of absent children)."""

    def __init__(self, xp, rows, states, d_states):
        self.xp, self.rows, self.states, self.d_states = xp, rows, states, d_states

    def run(self, ins, local, t, window):
        if isinstance(ins, Compute):
            if ins.aliased:  # its parts already wrote its columns
                return
            lo, hi = window["vertex"]
            e0, e1 = window["edge"]
            _compute(ins, self.xp, local, hi - lo, e1 - e0, outs=local)
        elif isinstance(ins, Gather):
            self.gather(ins, local, t, window)
        else:
            self.scatter_add(ins, local, t, window)

    def gather(self, ins, local, t, window):
        block = local.get(ins.target.key)
        strided = self.rows.strided(ins.slot, t) if ins.strided else None
        if strided is not None:  # evenly spaced children: a strided copy, no index array
            if block is None:
                local[ins.target.key] = self.states[strided].copy()
            else:
                block[...] = self.states[strided]
            return
        index = self.rows.child_rows(ins.slot, window)
        if self.xp is np:  # -1 reads the last row, the spare zero row
            local[ins.target.key] = np.take(self.states, index, axis=0, out=block)
        else:
            from ..cuda import kernels

            local[ins.target.key] = kernels.gather_rows(self.states, index, out=block,
                                                        check_indices=False)

    def scatter_add(self, ins, local, t, window):
        values = local[ins.source.key]
        strided = self.rows.strided(ins.slot, t) if ins.strided else None
        if strided is not None:  # distinct, evenly spaced rows: add into a strided view
            self.d_states[strided] += values
            return
        index = self.rows.child_rows(ins.slot, window)
        if self.xp is not np:
            from ..cuda import kernels

            kernels.scatter_add_rows(self.xp.ascontiguousarray(values), index, self.d_states,
                                     check_indices=False)
        elif self.rows.is_forest:  # each real row at most once per level: a plain indexed add
            self.d_states[index] += values
        else:  # a DAG: a child may have several parents on one level
            scatter_add_into(np, self.d_states, index, values)

    def zero(self, symbol, local, window, in_buffer):
        """A value that is zero on the level: clear its buffer rows, or stand in a zero view."""
        if in_buffer:
            local[symbol.key][...] = 0
            return
        lo, hi = window["vertex"]
        e0, e1 = window["edge"]
        shape = instantiate(symbol.shape, hi - lo, e1 - e0)
        local[symbol.key] = self.xp.broadcast_to(self.xp.zeros((), symbol.dtype), shape)




class Windows:
    """(CuPy) A level's row moves in one launch each (``cuda/windows.py``), where the passes
    allow: every direct gather (read only through column windows kept in buffers) copies the
    children's columns straight into the windows' rows, and every direct scatter-add adds the
    parts of its concat into their columns of the children's gradient rows — so the gathered
    blocks, the window copies and the concats are never made. Made once per Program; each
    level plan gets its steps once (:meth:`steps`)."""

    def __init__(self, program):
        core = program.core
        made_by = {o.key: k for k, ins in enumerate(core) for o in ins.writes}
        readers = {}
        for k, ins in enumerate(core):
            for x in ins.reads:
                readers.setdefault(x.key, []).append(k)
        homes = {b.key: (b.key, 0) for b in program.buffers}  # key -> (buffer key, column)
        homes.update({p.key: (c.key, start) for p, c, axis, start, _ in program.aliases
                      if axis in (1, -1) and len(c.shape) == 2})
        self.gathers, self.scatters = {}, {}  # core index -> pieces (see gather_pieces)
        for k, ins in enumerate(core):
            if isinstance(ins, Gather) and ins.direct and ins.slot != "edges":
                pieces = _gather_pieces(ins, [core[r] for r in readers.get(ins.target.key, ())],
                                        homes)
                if pieces:  # (each piece led by the core index of its window)
                    self.gathers[k] = [(r,) + p for r, p in zip(readers[ins.target.key], pieces)]
            elif isinstance(ins, ScatterAdd) and ins.direct and ins.source.key in made_by:
                concat = core[made_by[ins.source.key]]
                self.scatters[k] = (made_by[ins.source.key],
                                    _scatter_pieces(ins, concat, core, made_by))
        self._steps = {}

    def bound(self, part, xp):
        return _BoundWindows(self, part, xp)

    def level(self, plan):
        """For a level with ``plan``: ``(done, gather_at, gather_pieces, scatter_at,
        scatter_pieces)`` — the core indices whose work the two launches do, and where each
        launch goes (None: no launch)."""
        found = self._steps.get(plan)
        if found is None:
            done, gather_at, scatter_at, gathered, scattered = set(), None, None, [], []
            gathers = [k for k in self.gathers if plan[k] == RUN]
            if gathers:
                gathered = [p for k in gathers for p in self.gathers[k]]
                done.update(gathers)
                done.update(p[0] for p in gathered)  # the windows it writes
                gather_at, gathered = gathers[0], [p[1:] for p in gathered]
            scatters = [k for k in self.scatters if plan[k] == RUN]
            if scatters:  # after the last concat part is made
                done.update(scatters)
                done.update(self.scatters[k][0] for k in scatters)  # no concat is made
                scatter_at = scatters[-1]
                scattered = [p for k in scatters for p in self.scatters[k][1]]
            found = self._steps[plan] = (done, gather_at, gathered, scatter_at, scattered)
        return found


def _is_column_window(ins):
    node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
    return (node is not None and node.op.native == "window" and len(node.shape) == 2
            and node.attrs["axis"] in (1, -1))


def _gather_pieces(gather, readers, homes):
    """Per reader of a direct gather: (slot, source column, width, home key, home column), or
    None where one reader is not a column window with a home (a buffer, or a concat's
    columns)."""
    if len(gather.target.shape) != 2 or not readers:
        return None
    pieces = []
    for w in readers:
        out = w.writes[0]
        if not _is_column_window(w) or out.key not in homes:
            return None
        home, column = homes[out.key]
        start = w.step.node.attrs["start"]
        pieces.append((gather.slot, start, out.shape[1], home, column))
    return pieces


def _scatter_pieces(scatter, concat, core, made_by):
    """Per part of a direct scatter-add's concat: (slot, value key, its column, its width,
    width, column in the state gradient); a part that is a column window of a level value is
    read from that value (the window itself is a strided view)."""
    pieces, column = [], 0
    for x in concat.reads:
        width = x.shape[1]
        w = core[made_by[x.key]] if x.key in made_by else None
        if w is not None and _is_column_window(w) and len(w.reads[0].shape) == 2:
            source = w.reads[0]
            pieces.append((scatter.slot, source.key, w.step.node.attrs["start"],
                           source.shape[1], width, column))
        else:
            pieces.append((scatter.slot, x.key, 0, width, width, column))
        column += width
    return pieces


class _BoundWindows:
    """:class:`Windows` for one call: the whole batch's index arrays and buffers."""

    def __init__(self, windows, part, xp):
        self.windows, self.part, self.xp = windows, part, xp
        self.moves = RowMoves(xp, part.rows, part.states, part.d_states)
        self._steps = {}

    def steps(self, plan):
        """Per core instruction, what runs it on a level with ``plan``: a function, or None
        where a launch of the level's row moves does its work."""
        steps = self._steps.get(plan)
        if steps is None:
            done, gather_at, gathered, scatter_at, scattered = self.windows.level(plan)
            steps = [None if k in done else self.moves.run for k in range(len(plan))]
            if gather_at is not None:
                steps[gather_at] = functools.partial(self._gather, gathered)
            if scatter_at is not None:
                steps[scatter_at] = functools.partial(self._scatter, scattered)
            self._steps[plan] = steps
        return steps

    def _gather(self, pieces, ins, local, t, window):
        from ..cuda import windows

        env, rows = self.part.env, self.part.rows
        homes = sorted({p[3] for p in pieces})
        layout = tuple((slot, start, width, homes.index(home), column, env[home].shape[1])
                       for slot, start, width, home, column in pieces)
        idx = {slot: rows.slot_rows(slot) for slot in {p[0] for p in pieces}}
        lo, hi = window["vertex"]
        windows.gather_windows(self.moves.states, idx, [env[h] for h in homes], layout,
                               hi - lo, lo)

    def _scatter(self, pieces, ins, local, t, window):
        from ..cuda import windows

        rows, xp = self.part.rows, self.xp
        values, layout = [], []
        for slot, key, start, source_width, width, column in pieces:
            value = local[key]
            if not any(value.strides):  # a zero stand-in (a zero level): adds nothing
                continue
            if not value.flags.c_contiguous:
                value = xp.ascontiguousarray(value)
            values.append(value)
            layout.append((slot, len(values) - 1, start, source_width, width, column))
        if layout:
            lo, hi = window["vertex"]
            idx = {slot: rows.slot_rows(slot) for slot in {p[0] for p in layout}}
            windows.scatter_add_windows(values, idx, self.moves.d_states, tuple(layout),
                                        hi - lo, lo)
