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

import numpy as np

from ..ops.index import scatter_add_into
from ..ops.batching import instantiate, row_domain
from .executor import OpStep
from .plans import RUN, ZERO, record_written, widen
from .program import Compute, Gather
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
        for ins, action in zip(program.core, plan):
            if action == RUN:
                ran += 1
                moves.run(ins, local, t, window)
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


