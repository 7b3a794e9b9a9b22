"""The Cavs runtime: F and ∂F over a GraphBatch, level by level (Cavs §3.2–3.4, Alg. 1–2).

Forward, for a batch with levels 0..T-1:
  1. eager phase — nodes of F that need no gathered state run once over *all* rows
     (the pulled input is one indexed copy of the caller's tensor into level order);
  2. level loop — for task t, each gather is one indexed copy from the scattered state's buffer
     into a contiguous block, then the core nodes run on the task's rows [r0, r1);
  3. lazy phase — nodes nothing on the gather→scatter path needs (push, heads) run once over
     all rows, and the pushed rows are copied back to the caller's vertex order.
Backward mirrors it with ∂F: eager ∂ nodes once, the core in reverse level order (a gather's
gradient is a scatter-*add* into the children's rows), then the lazy ∂ nodes once — above all
the parameter gradients, each one large product over all rows of the batch.

Every batched symbol of F has one buffer for the whole batch, rows in level order, so the rows
of a task are one contiguous block ("dynamic tensors", Cavs §3.3). Buffers come from a pool
owned by the vertex function and return to it when the call's autodiff record is released.
"""

import time
import weakref
from dataclasses import dataclass

import numpy as np

from .. import backend
from ..cuda import streams
from ..autodiff.analysis import NodeClasses, dependency_classes, fusion_groups
from ..autodiff.executor import OpStep, plan_steps
from ..autodiff.symbolic import grad_graph
from ..autodiff.tensor import Tensor, is_grad_enabled
from ..errors import GraphError
from ..ops.index import scatter_add_into
from .batching import has_symbolic_size, instantiate, row_domain
from .zero_rows import EMPTY, FULL, ZeroRowRule, hull, intersect, is_empty, take_rows_range


@dataclass
class Options:
    """The runtime's optimisations; each can be switched off for the ablation benchmark (Cavs
    Fig. 10). All on by default."""

    hoist_eager: bool = True  # run eager nodes once before the level loop (else per level)
    lazy_batching: bool = True  # run lazy nodes once after the loop (else per level)
    fuse: bool = True  # run elementwise groups as fused kernels
    streams: bool = True  # (CUDA) overlap independent work on a second stream


class _Step:
    """An executor step (one op, or a fused elementwise group) as the runtime runs it.

    Attributes recorded with the symbolic task size (a reshape to (VERTICES, ...), a row count)
    are instantiated for each task; every output is either per row (``domain`` "vertex" or
    "edge": written into the batch buffer's rows of the task) or shared by all vertices.
    Steps also know how zero rows pass through them (zero_rows.py), and which products can run
    on the nonzero rows only.
    """

    __slots__ = ("step", "outputs", "symbolic", "args", "accumulate", "zero_rule", "kind",
                 "sinks_only", "full_ranges", "demand_index", "aliased")

    def __init__(self, step, graph_outputs):
        self.step = step
        self.outputs = step.outputs
        node = step.node if isinstance(step, OpStep) else None
        self.symbolic = node is not None and any(has_symbolic_size(v) for v in node.attrs.values())
        self.args = [id(x) for x in step.inputs]
        # A shared-shaped graph output computed per level (a parameter gradient when lazy
        # batching is off) is summed over the levels.
        self.accumulate = [row_domain(o.shape) is None and id(o) in graph_outputs
                           for o in self.outputs]
        self.zero_rule = ZeroRowRule(step)
        self.full_ranges = [FULL if row_domain(o.shape) else None for o in self.outputs]
        self.kind = _kind(node)
        self.sinks_only = None  # set by the program: the sinks this step alone serves
        self.demand_index = None  # set by the program: rows outside index >= 0 are unused
        self.aliased = False  # set by the program: a concat its parts already wrote

    def run(self, xp, env, n, e, outs=None):
        step = self.step
        if self.symbolic:
            node = step.node
            step = OpStep(node, {k: instantiate(v, n, e) for k, v in node.attrs.items()})
        step.run(xp, env, outs)

    def run_whole(self, xp, env, ranges, n, e):
        """Run over all rows of the batch, restricted to the nonzero rows where that pays."""
        range_of = _range_lookup(ranges, None)
        out_ranges = self.zero_rule(range_of)
        if self.kind == "row_matmul":  # X·W: only rows where X is nonzero
            (lo, hi), node = out_ranges[0], self.step.node
            if self.demand_index is not None:  # and only rows a scatter keeps (index >= 0)
                lo, hi = intersect((lo, hi), take_rows_range(env[id(self.demand_index)]))
            rows = self.step.inputs[0]
            a, w = env[id(rows)], env[self.args[1]]
            if 0 < hi - lo < a.shape[0] or is_empty((lo, hi)):
                out = xp.zeros((a.shape[0], w.shape[-1]), node.dtype)
                if not is_empty((lo, hi)):
                    xp.matmul(a[lo:hi], w, out=out[lo:hi])
                env[id(node)] = out
                ranges[id(node)] = (lo, hi)
                return
        if self.kind == "gradient_matmul":  # Xᵀ·G: only rows where both are nonzero
            transposed, g = self.step.inputs
            lo, hi = intersect(range_of(transposed.inputs[0]), range_of(g))
            lo, hi = max(lo, 0), min(hi, env[id(g)].shape[0])
            if hi - lo < env[id(g)].shape[0]:
                node = self.step.node
                if hi <= lo:
                    env[id(node)] = xp.zeros(node.shape, node.dtype)
                else:
                    env[id(node)] = xp.matmul(env[id(transposed)][:, lo:hi], env[id(g)][lo:hi])
                return
        self.run(xp, env, n, e)
        if self.kind == "take_rows":  # embedding rows of index -1 are zero
            out_ranges = [intersect(out_ranges[0], take_rows_range(env[self.args[1]]))]
        for o, r in zip(self.outputs, out_ranges):
            if r is not None:
                ranges[id(o)] = r


def _kind(node):
    """Which zero-row shortcut an op step can take."""
    if node is None:
        return None
    a = node.inputs[0] if node.inputs else None
    b = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op.name == "matmul" and row_domain(a.shape) and b is not None and \
            row_domain(b.shape) is None and not has_symbolic_size(b.shape):
        return "row_matmul"
    if (node.op.name == "matmul" and a.kind == "op" and a.op.name == "transpose"
            and a.attrs["axes"] == (1, 0) and row_domain(a.inputs[0].shape)
            and row_domain(b.shape) == row_domain(a.inputs[0].shape)):
        return "gradient_matmul"
    if node.op.name == "take_rows" and row_domain(a.shape) is None and row_domain(b.shape):
        return "take_rows"
    return None


def _range_lookup(ranges, rows):
    """``symbol -> range`` for ZeroRowRule: per-row values get their known range (cut to the
    task's ``rows``), shared values None."""
    def range_of(x):
        if row_domain(x.shape) is None:
            return None
        r = ranges.get(id(x), FULL)
        return r if rows is None else intersect(r, rows)
    return range_of


class _Program:
    """A graph split into eager, core and lazy steps for the runtime (fused where allowed)."""

    def __init__(self, graph, sources, sinks, options, keep=(), sinks_within_level=False):
        self.graph = graph
        self.classes = dependency_classes(graph, sources, sinks)
        ops = [n for n in graph.nodes if n.kind == "op"]
        cls = dict(self.classes)
        if not options.lazy_batching:  # ablation: lazy work per level too
            cls.update({id(n): "core" for n in ops if cls[id(n)] == "lazy"})
        if not options.hoist_eager:  # ablation: per-vertex eager work per level too
            users = graph.consumers()
            outputs = {id(o) for o in graph.outputs}
            for n in reversed(ops):
                if (cls[id(n)] == "eager" and _batched(n) and id(n) not in outputs
                        and all(cls[id(u)] == "core" for u in users[id(n)])):
                    cls[id(n)] = "core"
        # An elementwise step gains nothing from running over all rows at once (the same
        # elements either way), while materialising its result costs a full-size write and
        # read: when only the core reads it, it runs per level, fused into the core's groups.
        users = graph.consumers()
        for n in reversed(ops):
            if (cls[id(n)] == "eager" and n.op.is_elementwise and _batched(n)
                    and id(n) not in {id(o) for o in graph.outputs} and users[id(n)]
                    and all(cls[id(u)] == "core" for u in users[id(n)])):
                cls[id(n)] = "core"
        if not (options.lazy_batching and options.hoist_eager):
            # A whole-batch value whose rows are mixed (a transpose of X for Xᵀ·G) cannot be
            # sliced per level: when its consumer runs per level, it must too.
            users = graph.consumers()
            for n in reversed(ops):
                if (cls[id(n)] == "eager" and not _batched(n) and has_symbolic_size(n.shape)
                        and any(cls[id(u)] == "core" for u in users[id(n)])):
                    cls[id(n)] = "core"
        classes = NodeClasses(graph, cls, sources, sinks)
        groups = fusion_groups(graph, classes=classes, keep=keep) if options.fuse else []
        graph_outputs = {id(o) for o in graph.outputs}
        phases = {"eager": [], "core": [], "lazy": []}
        for step in plan_steps(graph, options.fuse, groups):
            phases[cls[id(step.outputs[0])]].append(_Step(step, graph_outputs))
        self.eager, self.core, self.lazy = phases["eager"], phases["core"], phases["lazy"]
        # Per-row values produced per level and read after their level (by ∂F, the lazy steps,
        # the caller) get a batch-wide buffer, rows in level order; the rest live only while
        # their level runs. ∂F's sinks are scattered into the children's rows within their
        # level; F's sink (the scattered state) is read by the levels above.
        sink_ids = {id(x) for x in sinks} if sinks_within_level else set()
        read_later = {id(k) for k in keep} | (graph_outputs - sink_ids) | {
            a for st in self.eager + self.lazy for a in st.args}
        self.per_level = [o for st in self.core for o in st.outputs
                          if _batched(o) and id(o) in read_later]
        self.aliases = self._find_concat_aliases()
        self.per_level = [o for o in self.per_level if id(o) not in self.aliases]
        self.buffered = {id(o) for o in self.per_level} | set(self.aliases)
        # The batched values the core reads or writes: sliced to the task's rows each level.
        touched = {a for st in self.core for a in st.args} | {id(o) for o in self.per_level}
        self.row_keys = [(id(n), row_domain(n.shape)) for n in graph.nodes
                         if _batched(n) and id(n) in touched]
        self._find_sink_only_steps(graph, sinks, graph_outputs)
        self._find_scattered_products(graph)
        produced = {id(o) for st in self.core for o in st.outputs}
        self.zero_candidates = [(k, d) for k, d in self.row_keys if k not in produced]
        self._skip_plans = {}
        self.edge_parent_key = None  # set by the Plan: where per-task parent rows go

    def _find_concat_aliases(self):
        """Concats whose parts are all computed per level can be assembled in place: each part
        is written straight into its columns of the concat's batch buffer (the scattered
        [h, c], the gate-gradient block of ∂F), and the concat itself copies nothing.
        Returns {id(part): (concat, start, stop)}."""
        produced = {id(o) for st in self.core for o in st.outputs}
        buffered = {id(o) for o in self.per_level}
        aliases = {}
        for st in self.core:
            node = getattr(st.step, "node", None)
            if node is None or node.op.name != "concat" or id(node) not in buffered:
                continue
            parts = node.inputs
            if (len({id(x) for x in parts}) < len(parts) or any(
                    id(x) not in produced or id(x) in aliases
                    or row_domain(x.shape) != row_domain(node.shape) for x in parts)):
                continue
            axis, start = node.attrs["axis"], 0
            for x in parts:
                aliases[id(x)] = (node, axis, start, start + x.shape[axis])
                start += x.shape[axis]
            st.aliased = True
        return aliases

    def bind_aliases(self, env):
        """Point each aliased part at its columns of the concat's batch buffer."""
        for key, (concat, axis, start, stop) in self.aliases.items():
            index = [slice(None)] * len(concat.shape)
            index[axis] = slice(start, stop)
            env[key] = env[id(concat)][tuple(index)]

    def skip_plan(self, zero_inputs, unneeded):
        """For each core step, whether a task can skip it: its outputs are zero when the
        per-row core inputs ``zero_inputs`` are zero on the task's rows, or it only serves the
        ``unneeded`` sinks. Cached per pattern."""
        key = (zero_inputs, unneeded)
        plan = self._skip_plans.get(key)
        if plan is None:
            empty = {}

            def range_of(x):
                if row_domain(x.shape) is None:
                    return None
                return empty.get(id(x), EMPTY if id(x) in zero_inputs else FULL)

            plan = []
            for step in self.core:
                out_ranges = step.full_ranges if step.zero_rule.never_zero else \
                    step.zero_rule(range_of)
                skip = all(r is not None and is_empty(r) for r in out_ranges) or (
                    step.sinks_only is not None and step.sinks_only <= unneeded)
                for o, r in zip(step.outputs, out_ranges):
                    if r is not None:
                        empty[id(o)] = EMPTY if skip or is_empty(r) else FULL
                plan.append(skip)
            self._skip_plans[key] = plan
        return plan

    def _find_scattered_products(self, graph):
        """A product X·W read only by ``scatter_add_rows(., ids)`` (the gradient of an
        embedding table) is needed only on the rows whose id is not -1."""
        users = graph.consumers()
        outputs = {id(o) for o in graph.outputs}
        for st in self.eager + self.lazy:
            if st.kind != "row_matmul":
                continue
            value = st.step.node
            while len(users[id(value)]) == 1 and id(value) not in outputs:
                reader = users[id(value)][0]
                if reader.op.name == "reshape" and row_domain(reader.shape) == \
                        row_domain(value.shape):  # same rows, another row shape
                    value = reader
                    continue
                if reader.op.name == "scatter_add_rows" and reader.inputs[0] is value:
                    st.demand_index = reader.inputs[1]
                break

    def _find_sink_only_steps(self, graph, sinks, graph_outputs):
        """Mark core steps whose results only feed sinks (in ∂F: the children's gradients).
        At a level where no vertex has children those steps have nothing to do."""
        sink_ids = {id(s) for s in sinks}
        buffered = {id(o) for o in self.per_level}
        owner = {id(m): st for st in self.core for m in st.zero_rule.members}
        users = graph.consumers()
        for st in reversed(self.core):
            members = {id(m) for m in st.zero_rule.members}
            serves, always = set(), False
            for o in st.outputs:
                always |= id(o) in buffered or (id(o) in graph_outputs and id(o) not in sink_ids)
                if id(o) in sink_ids:
                    serves.add(id(o))
                for u in users[id(o)]:
                    if id(u) in members:
                        continue
                    user_step = owner.get(id(u))
                    if user_step is None or user_step.sinks_only is None:
                        always = True
                    else:
                        serves |= user_step.sinks_only
            st.sinks_only = None if always else frozenset(serves)

    def consts(self, xp):
        return {id(n): (n.value if xp is np else xp.asarray(n.value))
                for n in self.graph.nodes if n.kind == "const"}


def _batched(node):
    return row_domain(node.shape) is not None


class CallState:
    """What one call of F keeps for its backward: the forward values and pooled buffers."""

    def __init__(self):
        self.values = None
        self.ranges = None  # per-row value -> rows outside which it is zero
        self.buffers = None
        self.stats = None


class BufferPool:
    """Grow-only buffers per symbol, reused across calls; a set in use is never handed out."""

    def __init__(self):
        self._free = []

    def acquire(self, xp, specs):
        """``specs``: {key: (rows, row_shape, dtype)}; returns {key: array view of rows}."""
        store = self._free.pop() if self._free else {}
        views = {}
        for key, (rows, row_shape, dtype) in specs.items():
            array = store.get(key)
            if (array is None or array.shape[0] < rows or array.shape[1:] != row_shape
                    or array.dtype != dtype or backend.get_array_module(array) is not xp):
                array = xp.empty((max(rows, 2 * array.shape[0] if array is not None
                                      and array.shape[1:] == row_shape else rows),) + row_shape,
                                 dtype=dtype)
                store[key] = array
            views[key] = array[:rows]
        return store, views

    def release(self, store):
        self._free.append(store)


class Plan:
    """F and ∂F of a vertex function, analysed once and ready to run on any batch."""

    def __init__(self, f):
        self.f = f
        graph = f.graph
        options = f.options

        candidates = [s for s in [f.pull_input, *f.gather_inputs, f.edge_child_input]
                      if s is not None and s.dtype.kind == "f"] + [
                          p for p in graph.params if p.dtype.kind == "f"]
        self.backward = grad_graph(graph, candidates, unreached="drop")
        bw = self.backward
        grad_by_input = {id(fwd): out for fwd, out in zip(bw.grad_of, bw.outputs)}
        self.gather_grads = [(k, grad_by_input[id(g)])
                             for k, g in zip(f.gather_slots, f.gather_inputs)
                             if id(g) in grad_by_input]
        self.edge_child_grad = grad_by_input.get(id(f.edge_child_input))
        self.pull_grad = grad_by_input.get(id(f.pull_input))
        self.param_grads = [(i, grad_by_input[id(p)]) for i, p in enumerate(graph.params)
                            if id(p) in grad_by_input]
        sinks = [g for _, g in self.gather_grads] + (
            [self.edge_child_grad] if self.edge_child_grad is not None else [])
        self.d_scatter = bw.cotangents[0]
        self.d_push = bw.cotangents[1] if len(bw.cotangents) > 1 else None
        self.backward_program = _Program(bw, [self.d_scatter], sinks, options,
                                         sinks_within_level=True)
        # Values ∂F reads must exist after the forward, even inside fused groups.
        self.forward_program = _Program(graph, f.sources, [f.scatter_output], options,
                                        keep=bw.forward_refs)
        self.forward_program.edge_parent_key = (
            id(f.edge_parent_input) if f.edge_parent_input is not None else None)
        self.backward_program.edge_parent_key = next(
            (id(ref) for ref, fwd in zip(bw.inputs[len(bw.cotangents):], bw.forward_refs)
             if fwd is f.edge_parent_input), None)
        self.pool = BufferPool()

    # --- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _rows(domain, n, e):
        return n if domain == "vertex" else e

    def _buffer_specs(self, n, e):
        f = self.f
        specs = {}
        for s in f.gather_inputs + [f.edge_child_input]:
            if s is not None:
                specs[id(s)] = (self._rows(row_domain(s.shape), n, e), s.shape[1:], s.dtype)
        for node in self.forward_program.per_level:
            extra = 1 if node is f.scatter_output else 0  # a zero row for absent children
            specs[id(node)] = (self._rows(row_domain(node.shape), n, e) + extra, node.shape[1:],
                               node.dtype)
        specs["d_scatter"] = (n + 1, f.scatter_output.shape[1:], f.dtype)
        for node in self.backward_program.per_level:
            specs[("d", id(node))] = (self._rows(row_domain(node.shape), n, e), node.shape[1:],
                                      node.dtype)
        return specs

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, xp, *arrays, batch, saved):
        started = time.perf_counter()
        f, prog = self.f, self.forward_program
        n, e = batch.num_vertices, len(batch.edge_child_row)
        store, bufs = self.pool.acquire(xp, self._buffer_specs(n, e))
        weakref.finalize(saved, self.pool.release, store)
        saved.buffers = bufs
        idx = _device_indices(xp, batch, f.gather_slots[-1] + 1 if f.gather_slots else 0)

        env = prog.consts(xp)
        pull = arrays[0] if f.pull_input is not None else None
        params = arrays[1:] if pull is not None else arrays
        for p, a in zip(f.graph.params, params):
            env[id(p)] = a
        if pull is not None:
            env[id(f.pull_input)] = xp.take(pull, idx["order"], axis=0)
        if f.edge_parent_input is not None:
            env[id(f.edge_parent_input)] = idx["edge_parent_row"]
        for s in f.gather_inputs + [f.edge_child_input]:
            if s is not None:
                env[id(s)] = bufs[id(s)]
        scatter = f.scatter_output
        for node in prog.per_level:
            env[id(node)] = bufs[id(node)][:self._rows(row_domain(node.shape), n, e)]
        prog.bind_aliases(env)

        ranges = dict(_gather_ranges(batch, f))  # rows outside are exactly zero
        sched = streams.scheduler(xp, f.options.streams, prog, critical=[f.scatter_output])
        for step in prog.eager:
            sched.run(step, step.run_whole, xp, env, ranges, n, e)

        if id(scatter) in bufs:
            states = bufs[id(scatter)]  # n + 1 rows; the last stays zero for absent children
        else:  # the scattered state needs no gather: it was computed whole
            states = xp.concatenate([env[id(scatter)], xp.zeros((1,) + scatter.shape[1:],
                                                                 scatter.dtype)])
        states[n] = 0
        level_stats = self._level_loop(xp, prog, env, ranges, batch, idx, states, forward=True)

        for step in prog.lazy:
            sched.run(step, step.run_whole, xp, env, ranges, n, e)
        sched.join()
        saved.values, saved.ranges = env, ranges
        out_symbol = f.push_output if f.push_output is not None else scatter
        result = xp.take(env[id(out_symbol)], idx["row_of"], axis=0)
        saved.stats = _stats(batch, level_stats, time.perf_counter() - started)
        f.last_stats = saved.stats
        return result

    def _level_loop(self, xp, prog, env, ranges, batch, idx, states, forward, d_states=None):
        """Run the core steps task by task (reverse order for backward)."""
        f = self.f
        levels = range(batch.num_levels) if forward else reversed(range(batch.num_levels))
        offsets, edge_offsets = batch.level_offsets, batch.edge_level_offsets
        gather_ranges = _gather_ranges(batch, f)
        counts = []
        accumulators = {}
        written = {}  # buffered value -> hull of the rows written nonzero
        for t in levels:
            r0, r1 = int(offsets[t]), int(offsets[t + 1])
            e0, e1 = int(edge_offsets[t]), int(edge_offsets[t + 1])
            n_t, e_t = r1 - r0, e1 - e0
            local = dict(env)  # shared values as they are; batched ones sliced to the task
            for key, domain in prog.row_keys:
                if key in env:
                    local[key] = env[key][r0:r1] if domain == "vertex" else env[key][e0:e1]
            if forward:
                for k, g in zip(f.gather_slots, f.gather_inputs):
                    strided = batch.child_row_slices(k)[t]
                    if is_empty(intersect(gather_ranges[id(g)], (r0, r1))):
                        local[id(g)][...] = 0  # no vertex of the task has child k
                    elif strided is not None:  # evenly spaced children: a strided copy
                        local[id(g)][...] = states[strided]
                    else:
                        xp.take(states, idx["child_rows"][k][r0:r1], axis=0, out=local[id(g)])
                if f.edge_child_input is not None:
                    xp.take(states, idx["edge_child_row"][e0:e1], axis=0,
                            out=local[id(f.edge_child_input)])
                unneeded = frozenset()
            else:
                local[id(self.d_scatter)] = d_states[r0:r1]
                # Sinks of a level without children (the leaves) are needed by no one.
                unneeded = frozenset(
                    [id(grad) for k, grad in self.gather_grads
                     if is_empty(intersect(gather_ranges[id(f.gather_inputs[
                         f.gather_slots.index(k)])], (r0, r1)))]
                    + ([id(self.edge_child_grad)] if self.edge_child_grad is not None
                       and e_t == 0 else []))
            if prog.edge_parent_key is not None:  # per task, parent rows count from r0
                local[prog.edge_parent_key] = idx["edge_parent_local"][e0:e1]
            window = {"vertex": (r0, r1), "edge": (e0, e1)}
            # Which inputs of the core are all zero on this task's rows decides which steps
            # have nothing to do; levels share few patterns, so the decision is cached.
            zero_inputs = frozenset(
                key for key, domain in prog.zero_candidates
                if key in ranges and is_empty(intersect(ranges[key], window[domain])))
            skips = prog.skip_plan(zero_inputs, unneeded)
            ran = 0
            for step, skip in zip(prog.core, skips):
                if step.aliased and not skip:  # its parts were written into its columns
                    for o in step.outputs:
                        written[id(o)] = hull(written.get(id(o), (0, 0)),
                                              window[row_domain(o.shape)])
                    continue
                if skip:
                    for o in step.outputs:
                        self._zero_output(xp, local, prog, o, n_t, e_t)
                    continue
                ran += 1
                step.run(xp, local, n_t, e_t, outs=local)  # per-row outputs: into the buffers
                for o, accumulate in zip(step.outputs, step.accumulate):
                    if id(o) in prog.buffered:
                        rows = window[row_domain(o.shape)]
                        written[id(o)] = hull(written.get(id(o), (0, 0)), rows)
                    if accumulate:
                        key = id(o)
                        value = local[key]
                        accumulators[key] = accumulators[key] + value if key in accumulators \
                            else value
            if not forward:
                self._scatter_gradients(xp, local, batch, idx, d_states, t, unneeded)
            counts.append(ran)
        env.update(accumulators)
        for key in prog.buffered:
            ranges[key] = written.get(key, (0, 0))
        return counts

    @staticmethod
    def _zero_output(xp, local, prog, o, n_t, e_t):
        """A skipped step's output is zero: clear its buffer rows, or stand in a zero view."""
        if id(o) in prog.buffered:
            local[id(o)][...] = 0
        else:
            zero = xp.zeros((), o.dtype)
            local[id(o)] = xp.broadcast_to(zero, instantiate(o.shape, n_t, e_t))

    def _scatter_gradients(self, xp, local, batch, idx, d_states, t, unneeded):
        """A gather's gradient is a scatter-add into the children's state-gradient rows."""
        (r0, r1), (e0, e1) = batch.rows_of_level(t), batch.edges_of_level(t)
        add = _indexed_add(xp, batch.is_forest)
        for k, grad in self.gather_grads:
            if id(grad) in unneeded:
                continue
            strided = batch.child_row_slices(k)[t]
            if strided is not None:  # distinct, evenly spaced rows: add into a strided view
                d_states[strided] += local[id(grad)]
            else:
                add(d_states, idx["child_rows"][k][r0:r1], local[id(grad)])
        if self.edge_child_grad is not None and id(self.edge_child_grad) not in unneeded:
            add(d_states, idx["edge_child_row"][e0:e1], local[id(self.edge_child_grad)])

    # --- backward --------------------------------------------------------------------------------
    def vjp(self, g, out, *inputs, batch, saved):
        if is_grad_enabled():
            raise GraphError(f"vertex function {self.f.name!r}: backward(create_graph=True) "
                             f"through a vertex function is not supported (no second "
                             f"derivatives through the batched runtime)")
        started = time.perf_counter()
        f, prog, bw = self.f, self.backward_program, self.backward
        xp = backend.get_array_module(g.data)
        n, e = batch.num_vertices, len(batch.edge_child_row)
        bufs, fwd = saved.buffers, saved.values
        idx = _device_indices(xp, batch, f.gather_slots[-1] + 1 if f.gather_slots else 0)

        env = prog.consts(xp)
        for ref_input, fwd_symbol in zip(bw.inputs[len(bw.cotangents):], bw.forward_refs):
            env[id(ref_input)] = fwd[id(fwd_symbol)]
        g_rows = xp.take(g.data, idx["order"], axis=0)  # caller order -> level order
        d_states = bufs["d_scatter"]
        d_states[...] = 0
        if self.d_push is not None:
            env[id(self.d_push)] = g_rows
        else:
            d_states[:n] = g_rows
        env[id(self.d_scatter)] = d_states[:n]
        for node in prog.per_level:
            env[id(node)] = bufs[("d", id(node))]
        prog.bind_aliases(env)

        ranges = {id(ref): saved.ranges.get(id(fwd), FULL)
                  for ref, fwd in zip(bw.inputs[len(bw.cotangents):], bw.forward_refs)}
        # On a GPU, parameter-gradient products overlap the level loop on a second stream.
        sched = streams.scheduler(
            xp, f.options.streams, prog,
            critical=[g for _, g in self.gather_grads] + [self.edge_child_grad] * (
                self.edge_child_grad is not None),
            side_outputs=[g for _, g in self.param_grads])
        for step in prog.eager:
            sched.run(step, step.run_whole, xp, env, ranges, n, e)
        level_stats = self._level_loop(xp, prog, env, ranges, batch, idx, None, forward=False,
                                       d_states=d_states)
        for step in prog.lazy:
            sched.run(step, step.run_whole, xp, env, ranges, n, e)
        sched.join()

        grads = []
        if f.pull_input is not None:
            if self.pull_grad is None or f.pull_dtype.kind != "f":
                grads.append(None)
            else:
                grads.append(Tensor(xp.take(env[id(self.pull_grad)], idx["row_of"], axis=0)))
        param_grads = {i: Tensor(env[id(out_)]) for i, out_ in self.param_grads}
        grads += [param_grads.get(i) for i in range(len(f.graph.params))]
        saved.stats.update(backward_seconds=time.perf_counter() - started,
                           backward_ops_per_level=level_stats[::-1])
        f.last_stats = saved.stats
        return grads


def _indexed_add(xp, unique_rows):
    if unique_rows:  # each real row at most once per call; -1 only hits the spare last row
        def add(target, rows, values):
            target[rows] += values
    else:  # a DAG: a child may have several parents in one task
        def add(target, rows, values):
            scatter_add_into(xp, target, rows, values)
    return add


def _gather_ranges(batch, f):
    """For each gather input of ``f``: the rows of the batch that have that child (the hull);
    the other rows of the gathered block are zero (per batch, cached)."""
    cache = batch.__dict__.setdefault("_gather_ranges", {})
    key = id(f)
    if key not in cache:
        ranges = {}
        for k, g in zip(f.gather_slots, f.gather_inputs):
            has = np.flatnonzero(batch.child_rows[k] >= 0) if k < len(batch.child_rows) else []
            ranges[id(g)] = (int(has[0]), int(has[-1]) + 1) if len(has) else (0, 0)
        cache[key] = ranges
    return cache[key]


def _device_indices(xp, batch, arity):
    """The batch's schedule arrays on the device of the computation (cached per batch)."""
    cache = batch.__dict__.setdefault("_device_indices", {})
    key = (xp.__name__, arity)
    if key not in cache:
        put = (lambda a: a) if xp is np else xp.asarray
        no_child = np.full(batch.num_vertices, -1, dtype=np.int64)
        cache[key] = {
            "order": put(batch.order), "row_of": put(batch.row_of),
            "child_rows": [put(batch.child_rows[k] if k < len(batch.child_rows) else no_child)
                           for k in range(arity)],
            "edge_child_row": put(batch.edge_child_row),
            "edge_parent_row": put(batch.edge_parent_row),
            "edge_parent_local": put(batch.edge_parent_local),
        }
    return cache[key]


def _stats(batch, forward_counts, forward_seconds):
    return {
        "graphs": batch.num_graphs,
        "vertices": batch.num_vertices,
        "levels": batch.num_levels,
        "vertices_per_level": np.diff(batch.level_offsets).tolist(),
        "forward_ops_per_level": forward_counts,
        "backward_ops_per_level": None,
        "scheduling_seconds": batch.build_seconds,
        "forward_seconds": forward_seconds,
        "backward_seconds": None,
    }
