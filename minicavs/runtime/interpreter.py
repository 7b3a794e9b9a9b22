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

On CuPy a launch is the cost (25-40 µs from Python on an H100), so a level takes few
(:class:`Windows`): all its gathers in one launch at its start, written where their readers
want them, all its scatter-adds in one at its end, read where their sources are, and an
elementwise group read only through column windows computed inside its reader
(:class:`_Inlined`). The README's Tree-LSTM: 3 launches a forward level (gather, product,
gates; 2 on the leaves'), 3 a backward one (gates' gradient, product, scatter-add); it was 8.9
and 5.8. And few Python objects a level, as the host issues them: each fused group is one
kernel over the call's whole arrays (:class:`_LevelKernel`), so no row view, column window or
zero stand-in is made for it (the Tree-LSTM's host time a level step: 58 -> 22 µs emulated).
Where a level plan is only such launches, its steps are translated once into a table that C
issues, a level per call (``level_launches.py``, ``cuda/issuer.py``): no Python per launch.
"""


import itertools

import numpy as np

from ..cpu import kernels as native_kernels
from ..ops.index import (SCATTER_ADD_ROWS, TAKE_ROWS, _scatter_add_rows_forward,
                         scatter_add_into)
from ..ops.batching import instantiate, row_domain
from ..autodiff import debug
from ..autodiff.symbolic import Symbol
from ..csource import compute_dtype, elementwise_source
from ..errors import GraphError, KernelCompileError
from ..ops.linalg import _product
from ..ops.shape import SLICE_AXIS, TRANSPOSE
from ..cuda import blas
from .analysis import FusedGroup
from .call import clear_unwritten
from .executor import RECORD, GroupStep, OpStep
from .plans import RUN, SKIP, ZERO, record_written, written_by_plan
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
        self.from_c = []  # per level, whether C issued it (else why not, or None: no issuer)
        self._tables = []  # the call's LevelTables, if any: levels queued for C, flushed here
        self._steps = _level_steps(part, xp, check, RowMoves(xp, part), self.from_c,
                                   self._tables)  # (moves: made before the loop, so the zeros
        # made once for a Program are not a level's work)

    def run(self, first, stop):
        """Run levels ``first`` to ``stop``: those C issues go in one call at the end."""
        for _ in range(stop - first):
            self.counts.append(next(self._steps))
        for tables in self._tables:
            tables.flush()

    def finish(self):
        for ran in self._steps:  # (none left: the generator's bookkeeping after the last)
            self.counts.append(ran)
        for tables in self._tables:
            tables.flush()
        issued = sum(how is True for how in self.from_c)
        why = next((how for how in self.from_c if how not in (True, None)), None)
        if issued == len(self.from_c) and issued:
            self.backend += " (levels issued from C)"
        elif issued:
            self.backend += (f" ({issued} of {len(self.from_c)} levels issued from C; the "
                             f"others from Python: {why})")
        elif why:
            self.backend += f" (levels issued from Python: {why})"
        return self.counts


def _level_steps(part, xp, check, moves, from_c, issuer):
    """The level loop, one level per step: yields the instructions run on it (and appends to
    ``from_c`` whether C issued it, or why not). A level C issues is queued, and the queue
    issued in one C call before a level run from here and when the caller asks (``issuer``
    gets the queue's :class:`~.level_launches.LevelTables`)."""
    program, env, ranges, rows = part.program, part.env, part.ranges, part.rows
    windows = None if check else _windows(part, xp)  # (debug mode: one instruction at a time)
    in_buffers = program.buffered | {p.key for p, *_ in program.aliases}
    summed = {}
    bound = windows.kernel_args if windows else {}  # each level kernel's arrays of the call
    tables = windows.tables() if windows else None  # levels issued from C, where they can be
    if windows is None and xp is not np and xp is not RECORD:  # (CuPy: say why not from C)
        tables = "debug mode checks each instruction" if check else \
            "its row moves are not one launch a level (edges, or a state of another dtype)"
    if tables is not None and not isinstance(tables, str):
        issuer.append(tables)
    steps, call = part.exe.level_steps, (xp.__name__, windows is not None, frozenset(env))
    plans, which, zeros = part.exe.plans.per_level(ranges, rows,
                                                   part.children_in_place is not None)
    levels = []  # per plan, what the loop does on its levels
    for plan in plans:
        level = steps.get((plan, call))
        if level is None:
            level = steps[(plan, call)] = _LevelSteps(program, plan, env, windows, xp)
        levels.append(level)
    from_tables = [False] * len(plans)  # per plan, its C table (None: run from here)
    vertices, edges = rows.level_windows("vertex"), rows.level_windows("edge")
    for t in reversed(range(rows.num_levels)) if program.reverse else range(rows.num_levels):
        p = which[t]
        level = levels[p]
        if isinstance(tables, str):  # (the issuer cannot run here: the reason, per level)
            from_c.append(tables)
        elif tables is not None:
            table = from_tables[p]
            if table is False:
                table = from_tables[p] = tables.prepared(level, plans[p])
            if table is not None:  # (a few us a level: all the host does for it here)
                lo, hi = vertices[t]
                tables.queued.append((table, lo, hi - lo))
                from_c.append(True)
                yield level.ran
                continue
            tables.flush()
            from_c.append(level.issuer_why)
        window = {"vertex": vertices[t], "edge": edges[t]}
        local = dict(env)  # shared values as they are, per-row ones cut to the level's rows
        for key, domain in level.row_keys:
            lo, hi = window[domain]
            local[key] = env[key][lo:hi]
        if program.edge_parent is not None:  # per level, parent rows count from the first
            local[program.edge_parent.key] = rows.edge_parent_local[slice(*window["edge"])]
        if windows:
            windows.start_level(plans[p], local, window)
        for ins, action, sums, quick, kernel in level.steps:
            if action == RUN:
                if kernel is not None:
                    kernel(local, env, window["vertex"], bound)
                elif quick is not None:
                    quick(local)
                else:
                    moves.run(ins, local, t, window)
                if check:
                    check(ins, local, t, window)
                for key in sums:  # a shared value computed per level and summed
                    summed[key] = summed[key] + local[key] if key in summed else local[key]
            else:
                for o in ins.writes:
                    moves.zero(o, local, window, o.key in in_buffers)
        if windows:
            windows.end_level(plans[p], local, window)
        yield level.ran
    env.update(summed)
    record_written(program, ranges, written_by_plan([level.written.items() for level in levels],
                                                    zeros, which, rows))


class _LevelSteps:
    """What the loop does on a level with one plan, worked out once (the Executable keeps it for
    later calls): the instructions to run or zero (less those the row moves' launches do:
    :class:`Windows`), the per-row values they touch (only those are cut to the level's rows)
    and the buffers they write."""

    def __init__(self, program, plan, env, windows, xp):
        done, *_, inlined = windows.windows.level(plan) if windows else ((), {})
        in_buffers = program.buffered | {p.key for p, *_ in program.aliases}
        self.ran = sum(action == RUN for action in plan)
        # (level_launches.py) its tables for the C issuer by layout, the batch values whose
        # layout they assume, and why the plan stays on this loop where it does
        self.issuer_tables, self.issuer_env_keys, self.issuer_why = {}, None, None
        kernels = _level_kernels(program, plan, env, done, inlined, in_buffers, xp) \
            if windows else {}
        steps = [(k, ins, action, tuple(o.key for o, add in zip(
                     ins.writes, getattr(ins, "accumulate", ())) if add))
                 for k, (ins, action) in enumerate(zip(program.core, plan))
                 if action in (RUN, ZERO) and k not in done
                 and not (action == RUN and getattr(ins, "aliased", False))]
        # What the level's steps read where it is made; a column window or a zero stand-in
        # that only level kernels read (they read its source or write 0) is not made at all.
        read = set(windows.windows.reads(plan)) if windows else set()
        self.steps = []
        for k, ins, action, sums in reversed(steps):
            kernel = kernels.get(k)
            if windows and kernel is None and k not in inlined and isinstance(ins, Compute) \
                    and (action == ZERO or _is_column_window(ins)) \
                    and not any(o.key in read or o.key in in_buffers for o in ins.writes):
                continue
            read.update(kernel.level_reads if kernel else inlined[k].reads if k in inlined
                        else (x.key for x in ins.reads))
            self.steps.append((ins, action, sums, None if kernel else inlined[k].quick(xp)
                               if k in inlined else _quick(ins, xp, in_buffers), kernel))
        self.steps.reverse()
        touched = read | {o.key for ins, *_, kernel in self.steps if kernel is None
                          for o in ins.writes}
        self.row_keys = [(k, d) for k, d in program.row_keys if k in env and k in touched]
        self.written = {o.key: row_domain(o.shape)
                        for ins, action in zip(program.core, plan) if action == RUN
                        for o in ins.writes if o.key in env and row_domain(o.shape)}


def _level_kernels(program, plan, env, done, inlined, in_buffers, xp):
    """(CuPy) The fused groups of a level plan that run as :class:`_LevelKernel`, by core
    index: those whose every operand is a vertex-row value (a batch buffer, a value made on the
    level, a column window of either, a zero), a shared row or a scalar, of their width or 1."""
    core = program.core
    homes = {p.key: (c, start) for p, c, axis, start, _ in program.aliases
             if axis in (1, -1) and len(c.shape) == 2}  # part -> (its concat, column)
    windows, zeros = {}, set()  # the level's column windows (key -> (source, column)), zeros
    for k, (ins, action) in enumerate(zip(core, plan)):
        if k not in done and action == RUN and _is_column_window(ins) and \
                ins.writes[0].key not in in_buffers:
            windows[ins.writes[0].key] = (ins.reads[0], ins.step.node.attrs["start"])
        elif k not in done and action == ZERO:
            zeros.update(o.key for o in ins.writes if o.key not in in_buffers)

    def operand(x, per_column, column=0):  # (kind, key, row width, column, per column)
        while x.key in windows:
            x, start = windows[x.key]
            column += start
        if row_domain(x.shape) is None:
            return ("shared", x.key, 0, column, per_column) if x.key in env else None
        if row_domain(x.shape) != "vertex" or len(x.shape) != 2:
            return None
        if x.key in homes:
            x, start = homes[x.key]
            column += start
        kind = "batch" if x.key in env else "zero" if x.key in zeros else "level"
        return kind, x.key, x.shape[1], column, per_column

    written = {o.key: o for ins in core for o in ins.writes}
    found = {}
    for k, (ins, action) in enumerate(zip(core, plan)):
        group = getattr(ins.step, "group", None) if isinstance(ins, Compute) else None
        if action != RUN or k in done or group is None or ins.symbolic or any(ins.accumulate):
            continue
        outputs, views = [o.key for o in group.outputs], [None] * len(group.inputs)
        if k in inlined:  # (read through column views; its outputs written as the target's)
            group, outputs = inlined[k].step.group, inlined[k].outputs
            views = [index for _, index in inlined[k].views]
        width = group.outputs[0].shape[-1]
        operands = []
        for x, index in zip(group.inputs, views):
            w = x.shape[-1] if x.shape else 1
            source, column = (x, 0) if index is None else (x.inputs[0], index[-1].start)
            operands.append(operand(source, w > 1, column) if w in (1, width) else None)
        for key in outputs:
            o = written[key]
            operands.append(operand(o, width > 1) if o.shape[1:] == (width,) else None)
        if None in operands or any(o[0] not in ("batch", "level")
                                   for o in operands[len(group.inputs):]):
            continue
        try:
            found[k] = _LevelKernel(group, operands, width, xp, in_buffers)
        except KernelCompileError:  # (a body without a C kernel: the plain step)
            continue
    return found


class _LevelKernel:
    """(CuPy) A fused group run on a level as one generated kernel over the whole call's
    arrays (``cuda/windows.level_source``), the level's first row and row count its arguments:
    no row view, column window or zero stand-in is made for it, and it launches as a RawKernel,
    which does no shape and stride work per call as CuPy's ElementwiseKernel does. Operands
    (:func:`_level_kernels`): ``batch`` (the call's array, at the level's rows), ``level`` (a
    value made on the level), ``shared``, ``zero`` (not passed)."""

    def __init__(self, group, operands, width, xp, in_buffers):
        from ..cuda import windows as kernels  # (CuPy's side: imported when it is used)

        self.xp, self.width = xp, width
        source = elementwise_source(group, compute_dtype(group))
        self.launch = kernels.Launcher(kernels.level_source(
            source, tuple((kind, ld, col, per) for kind, _, ld, col, per in operands), width))
        # per parameter p: the call's arrays (fixed), the level's values read and made
        self.fixed, self.reads, self.writes, p = [], [], [], 0
        for k, ((kind, key, *_), (dtype, _, _)) in enumerate(zip(
                operands, source.inputs + source.outputs)):
            if kind in ("batch", "shared"):
                self.fixed.append((p, key, np.dtype(dtype), key in in_buffers))
            elif kind == "level":
                (self.reads if k < len(source.inputs) else self.writes).append(
                    (p, key, np.dtype(dtype)))
            p += kind != "zero"  # (a zero is no parameter)
        self.size = p
        self.level_reads = {key for _, key, _ in self.reads}

    def bind(self, env):
        """The call's arrays, in parameter order (None where a level's value goes)."""
        args = [None] * self.size
        for p, key, dtype, buffer in self.fixed:
            value = env[key]
            if value.dtype != dtype or not value.flags.c_contiguous:
                if buffer:  # (never: the pool's buffers are whole rows of one allocation)
                    raise GraphError(f"level kernel: buffer {key} is not a C-contiguous {dtype} "
                                     "array")
                value = self.xp.ascontiguousarray(value, dtype=dtype)  # (read only: once a call)
            args[p] = value
        return args

    def __call__(self, local, env, rows, bound):
        args = bound.get(self)
        if args is None:
            args = bound[self] = self.bind(env)
        args = list(args)
        lo, hi = rows
        for p, key, dtype in self.reads:
            value = local[key]
            if value.dtype != dtype or not value.flags.c_contiguous:
                value = self.xp.ascontiguousarray(value, dtype=dtype)
            args[p] = value
        for p, key, dtype in self.writes:
            args[p] = local[key] = self.xp.empty((hi - lo, self.width), dtype)
        self.launch(args, hi - lo, lo)


def _quick(ins, xp, in_buffers):
    """A shorter way to run ``ins`` on a level's values (``local``), where there is one: a
    window read in place (a view; one kept in a buffer is copied there by its step), a product
    of matrices on CuPy, a fused group straight into its kernel, any other op its step."""
    if not isinstance(ins, Compute) or ins.symbolic or xp is RECORD:
        return None
    node = getattr(ins.step, "node", None)
    if node is not None and node.op.native == "window" and node.key not in in_buffers:
        source, key = node.inputs[0].key, node.key
        index = (slice(None),) * (node.attrs["axis"] % len(node.shape)) + (
            slice(node.attrs["start"], node.attrs["stop"]),)

        def window(local):
            local[key] = local[source][index]
        return window
    if node is not None and node.op.native == "product" and xp is not np and all(
            len(x.shape) == 2 for x in (node, *node.inputs)):
        (a, b), key = [x.key for x in node.inputs], node.key

        def product(local):  # (CuPy: one cuBLAS call, into the value's buffer if it has one)
            local[key] = blas.matmul(xp, local[a], local[b], local.get(key))
        return product
    group = getattr(ins.step, "group", None)
    if group is None:  # any other op: its step, without the loop's dispatch
        run = ins.step.run
        return lambda local: run(xp, local, local)
    step, inputs = ins.step, [x.key for x in group.inputs]
    outputs = [o.key for o in group.outputs]

    def fused(local):
        try:
            args = [local[k] for k in inputs]
        except KeyError:  # (a constant not bound yet: the step binds it)
            return step.run(xp, local, local)
        kernel = step.kernel(xp, compute_dtype(group, args))
        for key, value in zip(outputs, kernel(*args, outs=[local.get(k) for k in outputs])):
            local[key] = value
    return fused


_ROW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # (the row kernels' types)


def _windows(part, xp):
    """The Program's :class:`Windows` on CuPy (made once, kept by the Executable), else None."""
    moved = part.states if part.states is not None else part.d_states
    if xp is np or xp is RECORD or moved is None or moved.dtype not in _ROW_DTYPES:
        return None
    exe = part.exe
    if exe.windows is None:
        exe.windows = Windows(part.program)
    if not (exe.windows.gathers or exe.windows.scatters or exe.windows.inlined):
        return None
    return _BoundWindows(exe.windows, part, xp)


def run_whole(ins, xp, env, ranges, rows, stale=None, leave=False, loop_only=False):
    """An eager or lazy step over all rows of the batch; where the zero_rows pass allows, a
    product runs on its nonzero rows only. Records the zero-row range of each output.
    ``stale``: the values left unwritten outside their range (``Part.stale_rows``), cleared
    here before a step other than such a product reads them; ``leave``: this step's zero rows
    may be left unwritten too, and marked there (the caller does not get its output; not in
    debug mode); ``loop_only``: only the level loop reads the output (a product: its rows
    outside its range left)."""
    step = ins.step
    node = getattr(step, "node", None)

    def range_of(x):
        return ranges.get(x.key, FULL) if row_domain(x.shape) else None

    # outputs with a batch buffer (or columns of one) are written there
    buffers = [env.get(o.key) for o in ins.writes]
    done = None
    # (On a GPU the launches, not the rows, are the cost: a product over all rows is one, over
    # its nonzero rows it is one more for the zeros and a wait for the index's range.)
    if ins.restrict and xp is np:
        # (rows no reader looks at may be left unwritten: not in debug mode, which checks them)
        within = index_rows(env[ins.demand.key]) if ins.demand is not None and \
            not debug.enabled else None
        if loop_only and row_domain(node.inputs[0].shape):
            within = range_of(node.inputs[0])  # (read there only; the loop clears the rest)
        done = _scatter_first(ins, node, env, range_of, within)
        if done is None:
            done = node.op.on_nonzero_rows(xp, node, [env[x.key] for x in node.inputs],
                                           range_of, within)
        if done is not None and loop_only and done[1] is not None:
            stale[node.key] = done[1]
    elif node is not None and node.op is TAKE_ROWS and leave and xp is np and \
            buffers[0] is None:
        done = _take_rows_in_hull(node, env, stale)
    elif node is not None and node.op is SCATTER_ADD_ROWS and \
            isinstance(env.get(node.inputs[0].key), _ScatterFirst):
        done = env[node.inputs[0].key].scatter(env[node.inputs[1].key], node.attrs["num_rows"])
    if done is None and stale:  # (a step over all rows: what it reads written; a view of it
        # reads nothing yet, its readers will)
        view = leave and node is not None and (node.op.native == "view" or
                                               node.op is TRANSPOSE)
        for x in ins.reads:
            if x.key in stale:
                if view:
                    stale[node.key] = stale[x.key][:2] + (stale[x.key][2:] or (x.key,))
                else:
                    clear_unwritten(env, stale, x.key)
    if done is not None:
        env[node.key], out_range = done
    elif not ins.aliased:  # (an aliased concat's parts wrote its columns)
        outs = {o.key: b for o, b in zip(ins.writes, buffers) if b is not None}
        _compute(ins, xp, env, *((rows.num_vertices, rows.num_edges) if rows else (0, 0)),
                 outs or None)
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
    if index is not None and out_ranges[0] is not None and xp is np and \
            node.inputs[index].shape[:1] == node.shape[:1]:  # row i is zero where idx[i] is -1
        out_ranges[0] = intersect(out_ranges[0], index_rows(env[node.inputs[index].key]))
    for o, r in zip(ins.writes, out_ranges):
        if r is not None:
            ranges[o.key] = r


class _ScatterFirst:
    """``X·W`` whose one reader adds its rows into fewer rows of a table (the gradient of an
    embedding of a small vocabulary): not computed; its reader adds X's rows ``lo..`` first and
    multiplies the sums by W — the same sum, over the table's rows rather than the batch's
    (Tree-FC: 1,000 words against 16,384 leaves a batch, 2.1 GFLOP a batch fewer)."""

    def __init__(self, x, w, lo):
        self.x, self.w, self.lo = x, w, lo

    def scatter(self, idx, num_rows):
        """``(scatter_add_rows(X·W, idx, num_rows), None)``."""
        sums = _scatter_add_rows_forward(np, self.x, idx[self.lo:self.lo + len(self.x)],
                                         num_rows)
        return _product(np, sums, self.w), None


def _scatter_first(ins, node, env, range_of, within):
    """``(_ScatterFirst, rows)`` for the product ``X·W`` of ``ins`` where its reader (a
    scatter-add of its rows into a table: ``ins.demand_reader``) may add first and multiply
    after, on fewer rows (fewer than half the rows read); else None."""
    reader = ins.demand_reader
    if reader is None or within is None or row_domain(node.inputs[1].shape) or \
            len(node.shape) != 2 or len(node.inputs[1].shape) != 2 or \
            env.get(node.key) is not None:  # (a buffer of its own: written as it is)
        return None
    x, w = env[node.inputs[0].key], env[node.inputs[1].key]
    if (env[ins.demand.key] < -1).any():  # (a bad index: the scatter's own form names it)
        return None
    lo, hi = intersect(range_of(node.inputs[0]), within)
    lo, hi = max(lo, 0), min(hi, x.shape[0])
    if hi - lo < 2 * int(reader.attrs["num_rows"]):
        return None
    return _ScatterFirst(x[lo:hi], w, lo), (lo, hi)


def _take_rows_in_hull(node, env, stale):
    """``take_rows(table, idx)`` on the rows from the first to the last whose index is not -1
    (an embedding at the leaves, the internal vertices' rows after them zero), the others left
    unwritten and marked in ``stale`` (``Part.stale_rows``): ``(value, (lo, hi))``, or None
    where they are all the rows."""
    table, idx = (env[x.key] for x in node.inputs)
    if idx.ndim != 1 or (idx < -1).any():  # (a bad index: the op's own form names it)
        return None
    (lo, hi), n = index_rows(idx), len(idx)
    if hi - lo >= n:
        return None
    out = np.empty((n,) + table.shape[1:], table.dtype)
    if hi > lo and native_kernels.take_rows(table, idx[lo:hi], out[lo:hi]) is None:
        out[lo:hi] = TAKE_ROWS.forward(np, table, idx[lo:hi])  # (the NumPy form, its checks)
    stale[node.key] = (lo, hi)
    return out, (lo, hi)


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

    def __init__(self, xp, part):
        self.xp, self.rows, self.states, self.d_states = xp, part.rows, part.states, part.d_states
        self._zeros = part.exe.zeros.get(xp.__name__)
        if self._zeros is None:  # a 0-d zero per dtype the core writes, made once per Program
            dtypes = {o.dtype for ins in part.program.core for o in ins.writes}  # (on a GPU,
            self._zeros = part.exe.zeros[xp.__name__] = {  # making one is a launch)
                d: xp.zeros((), d) for d in dtypes} if xp is not RECORD else {}

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
        local[symbol.key] = self.xp.broadcast_to(self._zeros[symbol.dtype], shape)




class Windows:
    """(CuPy) A level's row moves in one launch each (``cuda/windows.py``): at its start every
    gather, at its end every scatter-add, whatever the slots.

    A gather writes where its value is read: a direct gather (read only through column
    windows) straight into the windows' homes (their buffers, or their columns of a concat's
    buffer), gathers read only by a concat of columns into the concat's columns, any other
    into its own rows (its buffer, or a block of the level). A scatter-add reads its source
    where it is: the parts of a direct scatter-add's concat, a column window's value at the
    window's columns. So no gathered block, window copy or concatenation is made for them.
    Made once per Program; each level plan gets its launches once (:meth:`level`)."""

    def __init__(self, program):
        core = program.core
        self.made_by = {o.key: k for k, ins in enumerate(core) for o in ins.writes}
        readers = {}
        for k, ins in enumerate(core):
            for x in ins.reads:
                readers.setdefault(x.key, []).append(k)
        homes = {b.key: (b.key, 0) for b in program.buffers}  # key -> (buffer key, column)
        homes.update({p.key: (c.key, start) for p, c, axis, start, _ in program.aliases
                      if axis in (1, -1) and len(c.shape) == 2})
        outside = program.read_outside_core
        # per gather: (core index, what it writes: "windows", "concat" or "own" rows,
        # [(slot, source column, width, home key, column, core indices it makes)])
        self.gathers, self.scatters = [], []
        gathered = {ins.target.key: k for k, ins in enumerate(core)
                    if isinstance(ins, Gather) and ins.slot != "edges"
                    and len(ins.target.shape) == 2}
        for key, k in gathered.items():
            ins, users = core[k], [core[r] for r in readers.get(key, ())]
            width = ins.target.shape[1]
            if ins.direct and users and key not in outside and all(
                    _is_column_window(w) and w.writes[0].key in homes for w in users):
                self.gathers.append((k, "windows", [(ins.slot, w.step.node.attrs["start"],
                                          w.writes[0].shape[1], *homes[w.writes[0].key], (r,))
                                         for r, w in zip(readers[key], users)]))
                continue
            concat = _column_concat(users, gathered, readers, outside)
            if concat is not None:
                keys = [x.key for x in concat.reads]
                column = sum(x.shape[1] for x in concat.reads[:keys.index(key)])
                home, start = homes.get(concat.writes[0].key, (concat.writes[0].key, 0))
                self.gathers.append((k, "concat", [(ins.slot, 0, width, home, start + column,
                                          (self.made_by[concat.writes[0].key],))]))
                continue
            self.gathers.append((k, "own", [(ins.slot, 0, width, *homes.get(key, (key, 0)), ())]))
        for k, ins in enumerate(core):
            if not isinstance(ins, ScatterAdd) or ins.slot == "edges" or \
                    len(ins.source.shape) != 2:
                continue
            source = core[self.made_by[ins.source.key]] if ins.source.key in self.made_by \
                else None
            if ins.direct and source is not None:
                self.scatters.append((k, self.made_by[ins.source.key],
                                      self._parts(ins.slot, source.reads, core)))
            else:
                self.scatters.append((k, None, self._parts(ins.slot, [ins.source], core)))
        # in-place concats: on a level whose launches write all their parts, zeros included,
        # their own zeros are written already (the Tree-LSTM leaves' [h_l, h_r])
        self.concats = [(k, {self.made_by.get(x.key) for x in ins.reads})
                        for k, ins in enumerate(core) if getattr(ins, "aliased", False)]
        in_buffers = set(homes)
        self.inlined = [found for k, ins in enumerate(core)
                        if (found := _inline(k, core, readers, outside | in_buffers))]
        self._levels = {}
        self.launches = {}  # (plan or layout, dtype) -> a launch's launcher and index slots
        self.issuer_slots = {}  # what the C issuer's tables point at -> its slot in the table
        self.issuer_numbers = itertools.count()  # (the next slot)
        from ..cuda import windows as kernels  # (CuPy's side: imported when it is used)

        self.kernels = kernels

    def _parts(self, slot, parts, core):
        """Scatter pieces: (slot, value key, its column, width, column in the gradient); a
        column window of a level value is read from that value at the window's columns."""
        pieces, column = [], 0
        for x in parts:
            width = x.shape[1]
            w = core[self.made_by[x.key]] if x.key in self.made_by else None
            if w is not None and _is_column_window(w) and len(w.reads[0].shape) == 2:
                pieces.append((slot, w.reads[0].key, w.step.node.attrs["start"], width, column))
            else:
                pieces.append((slot, x.key, 0, width, column))
            column += width
        return pieces

    def reads(self, plan):
        """Keys of the per-row values the level's scatter-adds read."""
        return {key for _, key, *_ in self.level(plan)[2]}

    def level(self, plan):
        """For a level with ``plan``: (the core indices the launches do, the gather pieces,
        the scatter pieces)."""
        found = self._levels.get(plan)
        if found is not None:
            return found
        done, gathers, scatters = set(), [], []
        for k, kind, pieces in self.gathers:
            made = {r for *_, makes in pieces for r in makes}
            if kind == "own":
                launch = plan[k] == RUN
            elif kind == "concat":  # (a part with no children on the level: zeros)
                launch = any(plan[r] == RUN for r in made)
            else:  # where it runs, or where zeros would be written into its windows' buffers
                launch = any(plan[r] == (RUN if plan[k] == RUN else ZERO) for r in made)
            if launch:
                done.add(k)
                done.update(r for r in made if plan[r] != SKIP)
                gathers.extend(p[:5] for p in pieces)
        done.update(k for k, parts in self.concats if plan[k] == ZERO and parts <= done)
        for k, concat, pieces in self.scatters:
            if plan[k] == RUN:
                done.add(k)
                if concat is not None:
                    done.add(concat)  # never made
                scatters.extend(pieces)
        quick = {}
        for inline in self.inlined:
            if all(plan[r] == RUN for r in inline.replaces + (inline.at,)):
                done.update(inline.replaces)
                quick[inline.at] = inline
        found = self._levels[plan] = (frozenset(done), gathers, scatters, quick)
        return found


class _Inlined:
    """(CuPy) An elementwise group read only through column windows, by one other group,
    computed inside it at the windows' columns: its inputs are read there (views), so neither
    its output nor the windows are made, and the two groups are one launch (the Tree-LSTM's
    bias add ``x W + b + h U`` inside the gates that read its five windows). ``at``: the
    reading group's core index; ``replaces``: the indices of the group and the windows."""

    def __init__(self, at, replaces, group, outputs, views):
        self.at, self.replaces, self.outputs = at, tuple(replaces), outputs
        self.step = GroupStep(group)
        # per input of the merged group: (key of the value it is read from, index or None)
        self.views = [views.get(x.key, (x.key, None)) for x in group.inputs]
        self.reads = {key for key, _ in self.views}
        # the views of shared values (the bias's five) are the same on every level
        self.shared = [index is not None and not row_domain(x.inputs[0].shape)
                       for x, (_, index) in zip(group.inputs, self.views)]

    def quick(self, xp):
        step, views, outputs, shared = self.step, self.views, self.outputs, self.shared
        made = {}  # position -> (the shared value, its view), kept while the value is

        def view(k, value, index):
            if not shared[k]:
                return value[index]
            kept = made.get(k)
            if kept is None or kept[0] is not value:
                kept = made[k] = (value, value[index])
            return kept[1]

        def merged(local):
            args = [local[key] if index is None else view(k, local[key], index)
                    for k, (key, index) in enumerate(views)]
            kernel = step.kernel(xp, compute_dtype(step.group, args))
            for key, value in zip(outputs, kernel(*args, outs=[local.get(k) for k in outputs])):
                local[key] = value
        return merged


def _inline(k, core, readers, kept):
    """The :class:`_Inlined` of core group ``k``, or None where it does not qualify: a fused
    group of 2-D outputs that live only during their level (``kept``: keys read later or
    buffered), read only through column windows that only one other fused group reads."""
    ins = core[k]
    group = getattr(ins.step, "group", None) if isinstance(ins, Compute) else None
    if group is None or ins.symbolic or any(ins.accumulate) or any(
            o.key in kept or len(o.shape) != 2 or not readers.get(o.key) for o in group.outputs):
        return None
    windows = [r for o in group.outputs for r in readers[o.key]]
    if not all(_is_column_window(core[r]) and core[r].writes[0].key not in kept
               and readers.get(core[r].writes[0].key) for r in windows):
        return None
    users = {u for r in windows for u in readers[core[r].writes[0].key]}
    if len(users) != 1:
        return None
    at = users.pop()
    target = getattr(core[at].step, "group", None)
    if target is None or core[at].symbolic or any(core[at].accumulate):
        return None
    made = {m.key for m in group.members}
    merged, views, clones = [], {}, {}  # clones: (key, start) -> the member, or input, there
    for r in windows:
        node = core[r].step.node
        start, stop = node.attrs["start"], node.attrs["stop"]
        width, wanted = node.inputs[0].shape[1], {node.inputs[0].key}
        for m in reversed(group.members):  # the members this window's value needs
            if m.key in wanted:
                wanted.update(x.key for x in m.inputs)
        for m in group.members:
            if m.key not in wanted:
                continue
            if m.shape[-1:] != (width,):
                return None
            inputs = []
            for x in m.inputs:
                if x.key in made:
                    inputs.append(clones[(x.key, start)])
                elif x.shape[-1:] == (width,):  # read at the window's columns
                    view = clones.get((x.key, start))
                    if view is None:
                        view = clones[(x.key, start)] = Symbol(
                            "op", x.shape[:-1] + (stop - start,), x.dtype, op=SLICE_AXIS,
                            inputs=(x,), attrs=dict(start=start, stop=stop, axis=len(x.shape) - 1))
                        views[view.key] = (x.key, (slice(None),) * (len(x.shape) - 1)
                                           + (slice(start, stop),))
                    inputs.append(view)
                elif x.shape[-1:] in ((), (1,)):  # a scalar or a column: broadcast as it is
                    inputs.append(x)
                else:
                    return None
            clone = Symbol("op", m.shape[:-1] + (stop - start,), m.dtype, op=m.op,
                           inputs=inputs, attrs=m.attrs)
            clones[(m.key, start)] = clone
            merged.append(clone)
        clones[node.key] = clones[(node.inputs[0].key, start)]
    for m in target.members:
        clone = Symbol("op", m.shape, m.dtype, op=m.op, attrs=m.attrs,
                       inputs=[clones.get(x.key, x) for x in m.inputs])
        clones[m.key] = clone
        merged.append(clone)
    inputs, seen = [], {m.key for m in merged}
    for m in merged:
        for x in m.inputs:
            if x.key not in seen:
                seen.add(x.key)
                inputs.append(x)
    fused = FusedGroup(merged, inputs, [clones[o.key] for o in target.outputs])
    return _Inlined(at, [k] + windows, fused, [o.key for o in target.outputs], views)


def _is_column_window(ins):
    node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
    return (node is not None and node.op.native == "window" and len(node.shape) == 2
            and node.attrs["axis"] in (1, -1))


def _column_concat(users, gathered, readers, outside):
    """The concat of columns that is a gather's only reader, if each of its parts is a
    gather read by it alone, once (the TreeRNN's [h_l, h_r]), else None."""
    if len(users) != 1:
        return None
    node = getattr(users[0].step, "node", None) if isinstance(users[0], Compute) else None
    if node is None or not node.op.assembles_in_place or users[0].aliased or \
            len(node.shape) != 2 or node.attrs.get("axis") not in (1, -1):
        return None
    keys = [x.key for x in node.inputs]
    if len(set(keys)) != len(keys) or any(
            k not in gathered or k in outside or len(readers[k]) != 1 for k in keys):
        return None
    return users[0]


class _BoundWindows:
    """:class:`Windows` for one call: the batch's index arrays, buffers and launches."""

    def __init__(self, windows, part, xp):
        self.windows, self.part, self.xp = windows, part, xp
        self.env, self.rows = part.env, part.rows
        self.idx = _SlotRows(part.rows)
        self.kernels = windows.kernels
        self._gathers, self._scatters = {}, {}  # plan / layout -> its launch (_gather_spec)
        self.kernel_args = {}  # level kernel -> its arrays of the call (_LevelKernel.bind)

    def tables(self):
        """The call's :class:`~.level_launches.LevelTables`; None where levels are issued from
        Python by choice (``MINICAVS_CUDA_ISSUER=python``), or why they must be (a string)."""
        from ..cuda import issuer

        if not issuer.enabled():
            return None
        driver = issuer.driver(self.xp)
        if isinstance(driver, str):
            return driver
        from .level_launches import LevelTables

        return LevelTables(self, driver)

    def start_level(self, plan, local, window):
        """Launch the level's gathers; the core indices the level's launches do."""
        done, gathers, *_ = self.windows.level(plan)
        if gathers:
            self._gather(plan, gathers, local, window)
        return done

    def _gather(self, plan, pieces, local, window):
        lo, hi = window["vertex"]
        spec = self._gathers.get(plan)
        if spec is None:
            spec = self._gathers[plan] = self._gather_spec(plan, pieces)
        launch, fixed, homes = spec
        dsts = []
        for home, width in homes:
            if width:  # a block of the level's own
                local[home] = self.xp.empty((hi - lo, width), self.part.states.dtype)
            dsts.append(local[home] if width else self.env[home])
        launch((*fixed, *dsts), hi - lo, lo)

    def _gather_spec(self, plan, pieces):
        """A plan's gather launch: the launcher, its leading arrays (the state, the slots'
        rows), and per destination its key and the width of a level block (0: a buffer).
        (All but the arrays are the Program's, made once: :attr:`Windows.launches`.)"""
        states = self.part.states
        made = self.windows.launches.get((plan, states.dtype))
        if made is None:
            homes = list(dict.fromkeys(p[3] for p in pieces))
            layout = tuple((slot, start, width, homes.index(home), column, self._width(home),
                            int(home in self.env)) for slot, start, width, home, column in pieces)
            source = self.kernels.gather_source(layout, states.shape[1], states.dtype)
            made = self.windows.launches[(plan, states.dtype)] = (
                self.kernels.Launcher(source), sorted({p[0] for p in layout}),
                [(h, 0 if h in self.env else self._width(h)) for h in homes])
        launch, slots, homes = made
        return launch, (states, *[self.idx[s] for s in slots]), homes

    def _width(self, key):
        value = self.env.get(key)
        if value is not None:
            return value.shape[1]
        return next(n.shape[1] for n in self.part.program.graph.nodes if n.key == key)

    def end_level(self, plan, local, window):
        """Launch the level's scatter-adds."""
        _, _, pieces, _ = self.windows.level(plan)
        if not pieces:
            return
        values, keys, layout = [], {}, []
        for slot, key, start, width, column in pieces:
            value = local[key]
            if not any(value.strides):  # a zero stand-in (a zero level): adds nothing
                continue
            if key not in keys:
                if not value.flags.c_contiguous:
                    value = self.xp.ascontiguousarray(value)
                keys[key] = len(values)
                values.append(value)
            layout.append((slot, keys[key], start, values[keys[key]].shape[1], width, column))
        if layout:
            layout = tuple(layout)
            spec = self._scatters.get(layout)
            if spec is None:
                out = self.part.d_states
                made = self.windows.launches.get((layout, out.dtype))
                if made is None:
                    source = self.kernels.scatter_source(layout, out.shape[1], out.dtype)
                    made = self.windows.launches[(layout, out.dtype)] = (
                        self.kernels.Launcher(source), sorted({p[0] for p in layout}))
                spec = self._scatters[layout] = (made[0],
                                                 (*[self.idx[s] for s in made[1]], out))
            launch, fixed = spec
            lo, hi = window["vertex"]
            launch((*values, *fixed), hi - lo, lo)


class _SlotRows(dict):
    """slot -> each row's child in that slot, the whole batch's (int32 on CuPy), on demand."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def __missing__(self, slot):
        rows = self[slot] = self.rows.slot_rows(slot)
        return rows
