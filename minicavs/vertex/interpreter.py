"""The interpreter: runs the Programs of a vertex function over a GraphBatch, on NumPy or CuPy.

This is the reference backend (the others are checked against it). Every decision was made by
the passes; what is left is the Cavs loop (Alg. 1–2):

    eager instructions once, over all rows           (lazy/eager batching, Cavs §3.4)
    for each level (bottom-up for F, top-down for ∂F):
        bind the level's rows of every per-row value
        for each core instruction: run it, or write its zeros, or skip it (Program.level_plan)
    lazy instructions once, over all rows

F and ∂F share that loop. Memory is touched only at F's entrance and exit (Cavs §3.3): a gather
copies the children's rows of the scattered state into a contiguous block, a scatter-add puts a
gather's gradient into the children's rows of the state gradient; the scattered state is itself
a batch-wide buffer, so scattering copies nothing. Rows move with the named kernels of
``minicavs/cuda/kernels.py`` on CuPy (int32 indices, built once per GraphBatch) and with
``np.take``/indexed adds on NumPy, their twins: an absent child reads the spare zero row.

F as a differentiable op (``VertexFunction._forward``/``_vjp`` in function.py) binds the pulled
input, the parameters and pooled buffers (memory.py), runs the program here, and keeps in the
call's own :class:`Call` record what ∂F and ``explain()`` read. In debug mode every instruction's
outputs are checked for NaN and infinity (finite_check.py).
"""

import numpy as np

from ..autodiff import debug
from ..autodiff.executor import RECORD, OpStep
from ..cpu import native
from ..cuda import streams
from ..ops.index import scatter_add_into
from .batching import instantiate, row_domain
from .finite_check import FiniteCheck
from .program import RUN, ZERO, Compute, Gather
from .zero_rows import FULL, hull, index_rows, intersect, is_empty


class Call:
    """What one call of F keeps for its backward and for ``explain()``: the forward values,
    their zero-row ranges, the pooled buffers, and the call's figures."""

    def __init__(self):
        self.values = self.ranges = self.buffers = self.stats = None


def run(program, xp, env, ranges=None, rows=None, moves=None):
    """Run ``program``: eager, the level loop, lazy. ``env`` (id -> array) holds its inputs and
    buffers; ``ranges`` (id -> (lo, hi)) the rows outside which per-row values are zero;
    ``rows`` the batch's index arrays on ``xp`` (None: a static program, no levels); ``moves``
    the row movers of this call (the states gathers read, the state gradients scatter-adds
    write). ``xp`` may be ``RECORD``: ops then run on Tensors, recorded for autodiff. Returns
    the number of instructions run per level (a :class:`LevelCounts`, which also says which
    backend ran the level loop: on NumPy, the native one of minicavs/cpu where it can)."""
    ranges = {} if ranges is None else ranges
    check = FiniteCheck(program, rows, env) if debug.enabled and xp is not RECORD else None
    # (with the debug check on, everything runs on one stream, in order: the first bad value
    # is the first one made)
    with streams.scheduler(xp, program) if check is None else streams.NO_STREAMS as sched:
        for ins in program.eager:
            sched.run(ins, _run_whole, ins, xp, env, ranges, rows)
            if check:
                check(ins, env)
        counts = LevelCounts()
        if rows is not None:  # on NumPy, the compiled loop where there is one (minicavs/cpu)
            loop = native.level_loop(program) if xp is np and check is None else None
            counts = (loop or _level_loop)(program, xp, env, ranges, rows, moves, check)
            if loop is None:
                counts.backend = (native.backend_of(program) if check is None else
                                  "interpreter (debug mode checks each instruction)") \
                    if xp is np else getattr(xp, "__name__", "recorded")
        for ins in program.lazy:
            sched.run(ins, _run_whole, ins, xp, env, ranges, rows)
            if check:
                check(ins, env)
    return counts


class LevelCounts(list):
    """The number of instructions run on each level, and which backend ran the level loop."""

    backend = "interpreter"


def run_kinds(runs, xp, between=None):
    """Several programs over one batch, one per vertex kind (kinds.py): ``runs`` holds, per
    kind, ``(program, env, ranges, rows, moves, levels)``, where ``rows`` counts the kind's own
    rows and ``levels`` names the batch level of each of its levels. Every kind's eager phase
    runs first (then ``between()``), then the levels of all kinds in step (bottom-up for F,
    top-down for ∂F: a level's children are done, whatever their kind), then every lazy phase.
    Returns the instructions run per level, per kind."""
    checks = [FiniteCheck(p, rows, env) if debug.enabled else None
              for p, env, _, rows, _, _ in runs]
    for (program, env, ranges, rows, _, _), check in zip(runs, checks):
        for ins in program.eager:
            _run_whole(ins, xp, env, ranges, rows)
            if check:
                check(ins, env)
    if between is not None:
        between()
    steps = [level_steps(p, xp, env, ranges, rows, moves, check)
             for (p, env, ranges, rows, moves, _), check in zip(runs, checks)]
    reverse = runs[0][0].reverse
    events = sorted(((t, k) for k, run in enumerate(runs) for t in run[5]), reverse=reverse)
    counts = [[] for _ in runs]
    for _, k in events:
        counts[k].append(next(steps[k]))
    for k, step in enumerate(steps):
        counts[k].extend(step)  # the rest: after the last level, the loop's bookkeeping
    for (program, env, ranges, rows, _, _), check in zip(runs, checks):
        for ins in program.lazy:
            _run_whole(ins, xp, env, ranges, rows)
            if check:
                check(ins, env)
    return counts


def _level_loop(program, xp, env, ranges, rows, moves, check=None):
    return LevelCounts(level_steps(program, xp, env, ranges, rows, moves, check))


def level_steps(program, xp, env, ranges, rows, moves, check=None):
    """The level loop of ``run``, one level per step: yields the instructions run on it (kinds
    step several programs' loops together: ``run_kinds``)."""
    row_keys = [(k, d) for k, d in program.row_keys if k in env]
    in_buffers = program.buffered | {id(part) for part, *_ in program.aliases}
    written, summed = {}, {}
    for t, window, plan in level_plans(program, ranges, rows):
        local = dict(env)  # shared values as they are, per-row ones cut to the level's rows
        for key, domain in row_keys:
            lo, hi = window[domain]
            local[key] = env[key][lo:hi]
        if program.edge_parent is not None:  # per level, parent rows count from the first
            local[id(program.edge_parent)] = rows.edge_parent_local[slice(*window["edge"])]
        ran = 0
        for ins, action in zip(program.core, plan):
            if action == RUN:
                ran += 1
                moves.run(ins, local, t, window)
                if check:
                    check(ins, local, t, window)
                for o, add in zip(ins.writes, getattr(ins, "accumulate", ())):
                    if add:
                        summed[id(o)] = summed[id(o)] + local[id(o)] if id(o) in summed \
                            else local[id(o)]
                for o in ins.writes:
                    if id(o) in env and row_domain(o.shape):
                        written[id(o)] = hull(written.get(id(o), (0, 0)),
                                              window[row_domain(o.shape)])
            elif action == ZERO:
                for o in ins.writes:
                    moves.zero(o, local, window, id(o) in in_buffers)
        yield ran
    env.update(summed)
    record_written(program, ranges, written)


def level_plans(program, ranges, rows):
    """Per level, in the order the loop runs them: ``(t, window, plan)`` — the level, its rows
    (``{"vertex": (lo, hi), "edge": (lo, hi)}``) and what each core instruction does on it
    (``Program.level_plan``: from which per-row values are zero there, by ``ranges``, and which
    sinks no vertex of the level reads). Every backend runs these plans."""
    candidates = program.zero_candidates
    sinks = {id(s) for s in program.sinks}
    sink_slots = [(slot, id(s)) for slot, s in program.slots if id(s) in sinks] \
        if "leaf_sinks" in program.passes else []
    levels = reversed(range(rows.num_levels)) if program.reverse else range(rows.num_levels)
    for t in levels:
        window = {"vertex": rows.vertices(t), "edge": rows.edges(t)}
        zero = frozenset(k for k, d in candidates
                         if k in ranges and is_empty(intersect(ranges[k], window[d])))
        # A sink no vertex of the level reads (one value may be the sink of several slots).
        needed = {sink for slot, sink in sink_slots if rows.has_child(slot, t)}
        unneeded = frozenset(sink for _, sink in sink_slots if sink not in needed)
        yield t, window, program.level_plan(zero, unneeded)


def record_written(program, ranges, written):
    """After the loop: each buffer's zero-row range is the hull of the levels that wrote it
    (``written``: id -> (lo, hi))."""
    sources = {id(s) for s in program.sources}
    for b in program.buffers:  # rows no level wrote are stale (the pool's), i.e. unused
        if b.key not in sources:  # (∂F's state gradient is filled by the caller and the adds)
            ranges[b.key] = written.get(b.key, (0, 0))
    for part, concat, *_ in program.aliases:
        ranges[id(part)] = ranges.get(id(concat), FULL)


def _run_whole(ins, xp, env, ranges, rows):
    """An eager or lazy step over all rows of the batch; where the zero_rows pass allows, a
    product runs on its nonzero rows only. Records the zero-row range of each output."""
    step = ins.step
    node = getattr(step, "node", None)

    def range_of(x):
        return ranges.get(id(x), FULL) if row_domain(x.shape) else None

    buffers = [env.get(id(o)) for o in ins.writes]  # outputs with a batch buffer: keep it
    done = None
    if ins.restrict:
        within = index_rows(env[id(ins.demand)]) if ins.demand is not None else None
        done = node.op.on_nonzero_rows(xp, node, [env[id(x)] for x in node.inputs], range_of,
                                       within)
    if done is not None:
        env[id(node)], out_range = done
    else:
        _compute(ins, xp, env, *((rows.num_vertices, rows.num_edges) if rows else (0, 0)))
    for o, buffer in zip(ins.writes, buffers):
        if buffer is not None and env[id(o)] is not buffer:
            buffer[...] = env[id(o)]
            env[id(o)] = buffer
    if done is not None:
        if out_range is not None:
            ranges[id(node)] = out_range
        return
    if ins.zero_rule is None:
        return
    out_ranges = ins.zero_rule(range_of)
    index = node.op.row_index_arg if node is not None else None
    if index is not None and out_ranges[0] is not None and \
            node.inputs[index].shape[:1] == node.shape[:1]:  # row i is zero where idx[i] is -1
        out_ranges[0] = intersect(out_ranges[0], index_rows(env[id(node.inputs[index])]))
    for o, r in zip(ins.writes, out_ranges):
        if r is not None:
            ranges[id(o)] = r


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

    def __init__(self, xp, rows, states=None, d_states=None):
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
        block = local.get(id(ins.target))
        strided = self.rows.strided(ins.slot, t) if ins.strided else None
        if strided is not None:  # evenly spaced children: a strided copy, no index array
            if block is None:
                local[id(ins.target)] = self.states[strided].copy()
            else:
                block[...] = self.states[strided]
            return
        index = self.rows.child_rows(ins.slot, window)
        if self.xp is np:  # -1 reads the last row, the spare zero row
            local[id(ins.target)] = np.take(self.states, index, axis=0, out=block)
        else:
            from ..cuda import kernels

            local[id(ins.target)] = kernels.gather_rows(self.states, index, out=block,
                                                        check_indices=False)

    def scatter_add(self, ins, local, t, window):
        values = local[id(ins.source)]
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
            local[id(symbol)][...] = 0
            return
        lo, hi = window["vertex"]
        e0, e1 = window["edge"]
        shape = instantiate(symbol.shape, hi - lo, e1 - e0)
        local[id(symbol)] = self.xp.broadcast_to(self.xp.zeros((), symbol.dtype), shape)


# --- F as an op --------------------------------------------------------------------------------

def take_rows(xp, array, index):
    """``array[index]`` along rows: pulled inputs into level order, pushed rows back out."""
    if xp is not np and array.dtype in _KERNEL_DTYPES and array.ndim > 0:
        from ..cuda import kernels

        return kernels.gather_rows(xp.ascontiguousarray(array), index, check_indices=False)
    return xp.take(array, index, axis=0)


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def constants(program, xp):
    """A fresh environment holding the program's constants on ``xp`` (copied to a device once
    per program)."""
    return dict(program.constants(xp))


def stats(batch, counts, seconds):
    return {"graphs": batch.num_graphs, "vertices": batch.num_vertices,
            "levels": batch.num_levels,
            "vertices_per_level": np.diff(batch.level_offsets).tolist(),
            "forward_ops_per_level": counts, "backward_ops_per_level": None,
            "scheduling_seconds": batch.build_seconds, "forward_seconds": seconds,
            "backward_seconds": None, "forward_backend": None, "backward_backend": None}

