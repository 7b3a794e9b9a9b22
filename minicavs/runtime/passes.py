"""The passes that build a vertex function's Programs, in one pipeline (Cavs §3.4).

``compile_programs(cell, options)`` takes the traced graph F (a :class:`CellGraph`) and returns
the Programs of F and ∂F. Each pass is a function Program -> Program with a name; the optional
ones have a switch of the same name in :class:`Options`, so the ablation benchmark can turn each
one off and the tests can check that every combination computes the same thing. In pipeline order:

graph rewrites (on F; ∂F is derived from the rewritten F, then rewritten too)
  ``regroup_sums``   ((x W + h U) + b) -> ((x W + b) + h U): the addends that need no gathered
                     state are added once for all vertices, one addition is left per level
  ``unused_columns`` ``x W (+ b)`` read only through column slices that leave columns unread
                     (a leaf kind taking three of an LSTM's five gates) multiplies by the read
                     columns of ``W`` (and ``b``) alone: a narrower product and gradient
  ``bias_in_readers`` ``x W + b`` over all rows read only through column slices by elementwise
                     ops (a leaf kind's gates) adds ``b``'s columns in those readers: the
                     gates' fused group adds the bias as it reads, no full-size add
  ``fold_slices``    a slice of a slice is one slice, and a slice of a concat that falls within
                     one part is a slice of that part (the concat, read by nothing else,
                     drops out): what ``unused_columns`` leaves (a leaf kind's bias cut into
                     runs, joined, then cut into its gates) and the gradients of its slices
  ``cse``            equal computations become one node (∂F repeats itself)
  ``dce``            nodes no output needs are dropped
scheduling
  ``classify``       (required) eager: needs no gathered state; core: everything else
  ``hoist_eager``    per-row eager work runs once over all rows — without it, per level
  ``lazy_batching``  work no sink needs (push, heads, parameter gradients) runs once after the
                     loop, over all rows (Cavs Proposition 1) — without it, per level
  ``elementwise_per_level``  elementwise eager work only the core reads runs per level, fused
                     into the core's groups (over all rows it only costs a full-size write);
                     what only the lazy phase reads, in the lazy phase's groups
  ``fuse``           linked elementwise ops of one phase become one kernel
  ``lower``          (required) steps become instructions: gathers, computes, scatter-adds
  ``sum_into_cells`` (required) an LSTM cell and the group adding its pre-activations (an
                     autobatched LSTM step's products and bias) run as one step: one kernel
                     on CuPy
  ``buffers``        (required) per-row values read after their level get batch-wide buffers
  ``alias_concats``  a concat of parts its own phase makes is assembled in place: the parts
                     write into their columns of its buffer (per level; over all rows where a
                     leaf kind has no levels)
  ``zero_rows``      steps whose outputs are zero on a level's rows are skipped; whole-batch
                     products run on their nonzero rows (zero_rows.py)
  ``leaf_sinks``     steps that only feed the children's gradients are skipped on levels with
                     no children (the leaves)
  ``strided_gathers`` evenly spaced child rows are read and added through strided views
  ``unread_zeros``   a value that lives only during its level and that no running step of
                     the level reads is not written at all where it is zero (a leaf's
                     product with zero children, when every reader is zero there too)
native level loop (codegen.py; the interpreter computes the same values its own way)
  ``direct_gathers``  a gather whose readers are column windows copies the children's rows
                     straight into the rows the windows own (the GEMM's concatenated input,
                     the kept c of a child): no scratch block, no column copies
  ``inline_windows``  an elementwise group whose outputs are only read through column windows
                     by other elementwise groups is computed inside them, at the windows'
                     columns (the bias add joins the gates that read the GEMM's output).
                     Off by default: on the Tree-LSTM-128 it made the gate group slower
                     (1.93 -> 2.23 ms per batch with the bias add, min of 30): reading x W, b
                     and h U at five column offsets each costs more than one linear pass
  ``direct_scatters`` a scatter-add of a concat made only for it adds the concat's parts into
                     their columns: no concat copy (∂F's [dh, dc] of a child)
  ``streams``        (CUDA) work off the level loop's path goes to a second stream
"""

from dataclasses import dataclass, fields, replace

from ..autodiff.symbolic import Graph, Symbol, grad_graph
from ..errors import GraphError
from ..ops.batching import has_symbolic_size, row_domain
from .analysis import (NodeClasses, clone, dependency_classes, eliminate_dead, fusion_groups,
                       merge_common_subexpressions)
from ..ops.cells import LSTM_CELL
from ..ops.elementwise import ADD
from ..ops.index import SCATTER_ADD_ROWS
from ..ops.linalg import MATMUL
from ..ops.shape import CONCAT, SLICE_AXIS
from .executor import GroupStep, OpStep, SummedCellStep, plan_steps
from .program import Buffer, Compute, Gather, Program, ScatterAdd
from .zero_rows import ZeroRowRule

EAGER, CORE, LAZY = "eager", "core", "lazy"


@dataclass
class Options:
    """One switch per optional pass (see the module docstring); all on by default."""

    regroup_sums: bool = True
    unused_columns: bool = True
    bias_in_readers: bool = True
    fold_slices: bool = True
    cse: bool = True
    dce: bool = True
    hoist_eager: bool = True
    lazy_batching: bool = True
    elementwise_per_level: bool = True
    fuse: bool = True
    alias_concats: bool = True
    zero_rows: bool = True
    leaf_sinks: bool = True
    strided_gathers: bool = True
    unread_zeros: bool = True
    direct_gathers: bool = True
    inline_windows: bool = False  # measured slower here (passes.inline_windows); off by default
    direct_scatters: bool = True
    streams: bool = True

    @classmethod
    def of(cls, options):
        """``None``, an Options, or a dict of switches; an unknown name is an error."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, dict):
            raise GraphError(f"options: expected a dict of switches or an Options, got "
                             f"{type(options).__name__}")
        known = [f.name for f in fields(cls)]
        for name, value in options.items():
            if name not in known:
                raise GraphError(f"options: unknown switch {name!r}; the switches are "
                                 f"{', '.join(known)}")
            if not isinstance(value, bool):
                raise GraphError(f"options: switch {name!r} must be True or False, got "
                                 f"{value!r}")
        return cls(**options)


# --- graph rewrites -------------------------------------------------------------------------

def regroup_sums(program):
    """Rewrite ``(a + s) + e`` — ``s`` needs gathered state, ``a`` and ``e`` do not — as
    ``(a + e) + s``, so ``a + e`` is eager (``x W + b`` once for all vertices) and one addition
    runs per level. Exact up to floating-point rounding (associativity)."""
    graph = program.graph
    depends = _depends_on(graph, program.sources)
    users = graph.consumers()
    protected = {o.key for o in graph.outputs}
    new_of, nodes = {}, []

    def new(x):
        return new_of.get(x.key, x)

    for n in graph.nodes:
        inner = n.inputs[0] if n.kind == "op" and n.op.associative else None
        if (inner is not None and n.inputs[1].key not in depends and inner.kind == "op"
                and inner.op is n.op and inner.key in depends and len(users[inner.key]) == 1
                and inner.key not in protected):
            eager = [x for x in inner.inputs if x.key not in depends]
            core = [x for x in inner.inputs if x.key in depends]
            if len(eager) == 1 and len(core) == 1:
                aval = n.op.infer(eager[0], n.inputs[1])
                hoisted = Symbol("op", aval.shape, aval.dtype, op=n.op,
                                 inputs=(new(eager[0]), new(n.inputs[1])), where=n.where,
                                 tracer=n.tracer)
                nodes.append(hoisted)
                new_of[n.key] = clone(n, (hoisted, new(core[0])))
                nodes.append(new_of[n.key])
                continue
        if n.kind == "op" and any(x.key in new_of for x in n.inputs):
            new_of[n.key] = clone(n, tuple(new(x) for x in n.inputs))
            n = new_of[n.key]
        nodes.append(n)
    return _with_graph(program, nodes, [new(o) for o in graph.outputs])


def unused_columns(program):
    """``x W`` — ``W`` a parameter or input, then perhaps ``+ b`` of one value a column — read
    only through column slices that leave some of its columns unread, becomes ``x W'`` (+
    ``b'``), ``W'`` the read columns of ``W`` (one slice, or a concat of the runs of them; made
    once a call, as any value without rows), each slice re-aimed at its columns of the narrower
    result. Exact: the read columns are the same sums."""
    graph = program.graph
    users = graph.consumers()
    protected = {o.key for o in graph.outputs}
    rewrites = {}  # product key -> (bias add or None, runs [(start, stop)])
    for n in graph.nodes:
        if n.kind != "op" or n.op is not MATMUL or len(n.shape) != 2 or n.key in protected:
            continue
        w = n.inputs[1]
        if w.kind == "op" or len(w.shape) != 2 or row_domain(w.shape) or \
                has_symbolic_size(w.shape):
            continue
        head, add = n, None
        if len(users[n.key]) == 1 and users[n.key][0].op is ADD:
            add = users[n.key][0]
            b = add.inputs[1] if add.inputs[0] is n else add.inputs[0]
            if b.kind == "op" or b.shape != n.shape[1:] or add.shape != n.shape:
                add = None
            else:
                head = add
        readers = users[head.key]
        if head.key in protected or not readers or any(
                r.op is not SLICE_AXIS or r.attrs["axis"] != 1 for r in readers):
            continue
        runs = []
        for start, stop in sorted((r.attrs["start"], r.attrs["stop"]) for r in readers):
            if runs and start <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], stop)
            else:
                runs.append([start, stop])
        if sum(stop - start for start, stop in runs) < n.shape[1]:
            rewrites[n.key] = (add, runs)
    if not rewrites:
        return program

    def op(kind, inputs, shape, like, **attrs):
        return Symbol("op", shape, like.dtype, op=kind, inputs=inputs, attrs=attrs,
                      where=like.where, tracer=like.tracer)

    def read_columns(x, runs, axis):
        parts = [op(SLICE_AXIS, (x,), x.shape[:axis] + (stop - start,), x, start=start,
                    stop=stop, axis=axis) for start, stop in runs]
        nodes.extend(parts)
        if len(parts) > 1:
            parts = [op(CONCAT, tuple(parts), x.shape[:axis] + (sum(
                stop - start for start, stop in runs),), x, axis=axis)]
            nodes.append(parts[0])
        return parts[0]

    adds = {add.key: runs for add, runs in rewrites.values() if add is not None}
    heads = {}  # the old head's key (the product, or its bias add) -> the runs it keeps
    new_of, nodes = {}, []
    for n in graph.nodes:  # (each new node where its old one was: its inputs come before it)
        if n.key in rewrites:
            add, runs = rewrites[n.key]
            x, w = n.inputs
            width = sum(stop - start for start, stop in runs)
            new_of[n.key] = op(MATMUL, (new_of.get(x.key, x), read_columns(w, runs, 1)),
                               n.shape[:1] + (width,), n)
            heads[(n if add is None else add).key] = runs
        elif n.key in adds:
            product, b = n.inputs if n.inputs[0].key in new_of else n.inputs[::-1]
            b_read = read_columns(b, adds[n.key], 0)
            new_of[n.key] = op(ADD, (new_of[product.key], b_read) if n.inputs[0] is product
                               else (b_read, new_of[product.key]), new_of[product.key].shape, n)
        elif n.kind == "op" and n.op is SLICE_AXIS and n.inputs[0].key in heads:
            start, at = n.attrs["start"], 0  # its columns in the narrower head
            for run_start, run_stop in heads[n.inputs[0].key]:
                if run_start <= start < run_stop:
                    at += start - run_start
                    break
                at += run_stop - run_start
            new_of[n.key] = op(SLICE_AXIS, (new_of[n.inputs[0].key],), n.shape, n, start=at,
                               stop=at + n.attrs["stop"] - start, axis=1)
        elif n.kind == "op" and any(x.key in new_of for x in n.inputs):
            new_of[n.key] = clone(n, tuple(new_of.get(x.key, x) for x in n.inputs))
        nodes.append(new_of.get(n.key, n))
    return _with_graph(program, nodes, [new_of.get(o.key, o) for o in graph.outputs])


def bias_in_readers(program):
    """``x W + b`` made over all rows and read only through column slices that elementwise
    ops read (a leaf kind's gates): each slice becomes the slice of ``x W`` plus the slice of
    ``b``, which the gates' fused group adds as it reads its columns — no full-size add and
    write. (Per level the bias joins the level's fused group already: not rewritten.)"""
    graph = program.graph
    users = graph.consumers()
    protected = {o.key for o in graph.outputs}
    per_level = _depends_on(graph, program.sources)

    def elementwise_readers(x):
        return users[x.key] and all(u.kind == "op" and u.op.is_elementwise
                                    for u in users[x.key])

    rewrites = {}  # the add's key -> (x W, b)
    for n in graph.nodes:
        if n.kind != "op" or n.op is not ADD or len(n.shape) != 2 or not row_domain(n.shape) \
                or n.key in protected or n.key in per_level:
            continue
        product, b = n.inputs if n.inputs[1].shape == n.shape[1:] else n.inputs[::-1]
        if product.shape != n.shape or b.shape != n.shape[1:] or not users[n.key] or any(
                r.op is not SLICE_AXIS or r.attrs["axis"] not in (1, -1)
                or r.key in protected or not elementwise_readers(r) for r in users[n.key]):
            continue
        rewrites[n.key] = (product, b)
    if not rewrites:
        return program

    new_of, nodes = {}, []
    for n in graph.nodes:
        if n.key in rewrites:
            continue  # (only its slices read it: each is rewritten below)
        if n.kind == "op" and n.op is SLICE_AXIS and n.inputs[0].key in rewrites:
            product, b = (new_of.get(x.key, x) for x in rewrites[n.inputs[0].key])
            start, stop = n.attrs["start"], n.attrs["stop"]
            columns = Symbol("op", n.shape, product.dtype, op=SLICE_AXIS, inputs=(product,),
                             attrs=dict(start=start, stop=stop, axis=1), where=n.where,
                             tracer=n.tracer)
            row = Symbol("op", n.shape[1:], b.dtype, op=SLICE_AXIS, inputs=(b,),
                         attrs=dict(start=start, stop=stop, axis=0), where=n.where,
                         tracer=n.tracer)
            nodes += [columns, row]
            new_of[n.key] = Symbol("op", n.shape, n.dtype, op=ADD, inputs=(columns, row),
                                   attrs={}, where=n.where, tracer=n.tracer)
        elif n.kind == "op" and any(x.key in new_of for x in n.inputs):
            new_of[n.key] = clone(n, tuple(new_of.get(x.key, x) for x in n.inputs))
        nodes.append(new_of.get(n.key, n))
    return _with_graph(program, nodes, [new_of.get(o.key, o) for o in graph.outputs])


def fold_slices(program):
    """A slice of a slice becomes one slice of the first one's input; a slice of a concat
    along the same axis that falls within one of its parts becomes that part, or a slice of
    it. Nothing is computed differently (the same elements); a concat only such slices read
    is then dead (``dce``). Not along a symbolic axis (V or E: a level's rows), nor for a
    node that is an output of the graph."""
    graph = program.graph
    protected = {o.key for o in graph.outputs}
    new_of, nodes = {}, []

    def folded(m):
        """``m`` (a slice) with its input's slice or concat folded in, or None."""
        src, axis = m.inputs[0], m.attrs["axis"]
        start, stop = m.attrs["start"], m.attrs["stop"]
        if src.kind != "op" or src.attrs.get("axis") != axis or axis < 0 or \
                has_symbolic_size(src.shape[axis]):
            return None
        if src.op is SLICE_AXIS:
            at = src.attrs["start"]
            return _slice(src.inputs[0], at + start, at + stop, axis, m)
        if src.op is CONCAT:
            at = 0
            for part in src.inputs:
                size = part.shape[axis]
                if at <= start and stop <= at + size:
                    return part if (start, stop) == (at, at + size) else \
                        _slice(part, start - at, stop - at, axis, m)
                at += size
        return None

    placed = set()  # the keys in ``nodes``
    for n in graph.nodes:
        m = n
        if n.kind == "op" and any(x.key in new_of for x in n.inputs):
            m = clone(n, tuple(new_of.get(x.key, x) for x in n.inputs))
        while m.kind == "op" and m.op is SLICE_AXIS and n.key not in protected:
            f = folded(m)  # (a new slice reads a placed node; a part is one)
            if f is None:
                break
            m = f
        if m.key not in placed:
            nodes.append(m)
            placed.add(m.key)
        if m is not n:
            new_of[n.key] = m
    return _with_graph(program, nodes, [new_of.get(o.key, o) for o in graph.outputs])


def _slice(x, start, stop, axis, like):
    """``x[..., start:stop, ...]`` along ``axis``, a node where ``like`` (a slice) was."""
    shape = x.shape[:axis] + (stop - start,) + x.shape[axis + 1:]
    return Symbol("op", shape, x.dtype, op=SLICE_AXIS, inputs=(x,),
                  attrs=dict(start=start, stop=stop, axis=axis), where=like.where,
                  tracer=like.tracer)


def cse(program):
    return program.with_(graph=merge_common_subexpressions(program.graph))


def dce(program):
    return program.with_(graph=eliminate_dead(program.graph))


def _with_graph(program, nodes, outputs):
    old = program.graph
    graph = Graph(nodes, old.inputs, outputs, name=old.name)
    for attr in ("cotangents", "forward", "grad_of", "forward_refs"):  # a BackwardGraph's ends
        if hasattr(old, attr):
            setattr(graph, attr, getattr(old, attr))
    return program.with_(graph=graph)


def _depends_on(graph, sources):
    depends = {s.key for s in sources}
    for n in graph.nodes:
        if any(x.key in depends for x in n.inputs):
            depends.add(n.key)
    return depends


# --- classes: eager, core, lazy ---------------------------------------------------------------

def classify(program):
    """Proposition 1 without the batching passes: what needs no gathered state is eager (once,
    before the loop); everything else runs per level. ``hoist_eager`` and ``lazy_batching``
    then move work out of the level loop."""
    graph = program.graph
    base = dependency_classes(graph, program.sources, program.sinks)
    of = {}
    for n in graph.nodes:
        per_row_eager = base[n] == EAGER and row_domain(n.shape) and n.kind == "op"
        of[n.key] = CORE if base[n] != EAGER or per_row_eager else EAGER
    return program.with_(classes=NodeClasses(graph, of, program.sources, program.sinks))


def hoist_eager(program):
    """Per-row work that needs no gathered state runs once over all rows, before the loop."""
    base = dependency_classes(program.graph, program.sources, program.sinks)
    return _reclassify(program, {k: EAGER for k, c in base.items() if c == EAGER})


def lazy_batching(program):
    """Work that no sink needs runs once over all rows, after the loop."""
    base = dependency_classes(program.graph, program.sources, program.sinks)
    return _reclassify(program, {k: LAZY for k, c in base.items() if c == LAZY})


def elementwise_per_level(program):
    """Elementwise eager work that only the core reads runs per level instead, fused into the
    core's groups: the same elements either way, and no full-size write and read. Likewise
    what only the lazy phase reads runs there, fused into its groups (a leaf kind's ∂F: the
    gates' derivatives beside the cotangents' products)."""
    graph, cls = program.graph, dict(program.classes)
    users = graph.consumers()
    outputs = {o.key for o in graph.outputs}
    for n in reversed(graph.nodes):
        if (cls[n.key] == EAGER and n.kind == "op" and n.op.is_elementwise
                and row_domain(n.shape) and n.key not in outputs and users[n.key]):
            later = {cls[u.key] for u in users[n.key]}
            if later in ({CORE}, {LAZY}):
                cls[n.key] = later.pop()
    return _reclassify(program, cls)


def keep_mixed_rows_per_level(program):
    """A whole-batch value whose rows are mixed (Xᵀ, for Xᵀ·G) cannot be sliced per level: when
    a per-level step reads it, it runs per level too."""
    graph, cls = program.graph, dict(program.classes)
    users = graph.consumers()
    for n in reversed(graph.nodes):
        if (cls[n.key] == EAGER and n.kind == "op" and not row_domain(n.shape)
                and has_symbolic_size(n.shape)
                and any(cls[u.key] == CORE for u in users[n.key])):
            cls[n.key] = CORE
    return _reclassify(program, cls)


def _reclassify(program, changes):
    of = dict(program.classes)
    of.update(changes)
    return program.with_(classes=NodeClasses(program.graph, of, program.sources, program.sinks))


# --- steps and instructions --------------------------------------------------------------------

def fuse(program):
    """Linked elementwise ops of one phase become one kernel; values another program reads stay
    materialised."""
    groups = fusion_groups(program.graph, classes=program.classes, keep=program.keep)
    return program.with_(groups=tuple(groups))


def lower(program):
    """Steps (ops and fused groups) in a runnable order, split by phase; gathers first in the
    core of F, scatter-adds last in the core of ∂F."""
    graph, cls = program.graph, program.classes
    outputs = {o.key for o in graph.outputs}
    phases = {EAGER: [], CORE: [], LAZY: []}
    for step in plan_steps(graph, fuse=bool(program.groups), groups=list(program.groups)):
        node = step.node if isinstance(step, OpStep) else None
        phase = cls[step.outputs[0]]
        symbolic = node is not None and any(has_symbolic_size(v) for v in node.attrs.values())
        # A shared-shaped graph output computed per level (a parameter gradient without lazy
        # batching) is summed over the levels.
        accumulate = tuple(phase == CORE and not row_domain(o.shape) and o.key in outputs
                           for o in step.outputs)
        phases[phase].append(Compute(step, symbolic=symbolic, accumulate=accumulate))
    core = phases[CORE]
    sources = {s.key for s in program.sources}
    gathers = [Gather(slot, s) for slot, s in program.slots if s.key in sources]
    scatters = [ScatterAdd(slot, s) for slot, s in program.slots if s.key not in sources]
    return program.with_(eager=tuple(phases[EAGER]), core=tuple(gathers + core + scatters),
                         lazy=tuple(phases[LAZY]))


def sum_into_cells(program):
    """An LSTM cell of a whole-batch phase whose gate pre-activations are a fused group of two
    or three terms added in a chain (``(x·W + h·U) + b``: an autobatched LSTM step), read by
    nothing else, runs with that group as one step (:class:`~.executor.SummedCellStep`: one
    kernel on CuPy instead of the sum's and the cell's)."""
    readers = {}
    for node in program.graph.nodes:
        for x in node.inputs:
            readers[x.key] = readers.get(x.key, 0) + 1

    def merged(phase):
        sums = {ins.step.outputs[0].key: ins for ins in phase if _chain_of_adds(ins.step)}
        out, taken = [], set()
        for ins in phase:
            node = getattr(ins.step, "node", None)
            pre = node.inputs[0] if node is not None and node.op is LSTM_CELL else None
            group = sums.get(pre.key) if pre is not None else None
            if group is None or readers.get(pre.key) != 1 or ins.symbolic or group.symbolic:
                out.append(ins)
                continue
            taken.add(id(group))
            out.append(replace(ins, step=SummedCellStep(group.step, ins.step,
                                                        _chain_of_adds(group.step))))
        return tuple(i for i in out if id(i) not in taken)

    return program.with_(eager=merged(program.eager), lazy=merged(program.lazy))


def _chain_of_adds(step):
    """The terms of a fused group ``((t0 + t1) + t2)`` with one output, in adding order; None
    for any other step."""
    if not isinstance(step, GroupStep) or len(step.outputs) != 1:
        return None
    members = step.group.members
    if not 1 <= len(members) <= 2 or any(m.op is not ADD for m in members):
        return None
    terms = list(members[0].inputs)
    if len(members) == 2:
        if members[1].inputs[0].key != members[0].key:
            return None
        terms.append(members[1].inputs[1])
    inner = {m.key for m in members}
    return terms if not any(t.key in inner for t in terms) and \
        members[-1].key == step.outputs[0].key else None


def buffers(program):
    """Per-row values made per level and read after their level (by the other program, the
    eager/lazy phases, the caller, or — F's scattered state — the levels above) get a
    batch-wide buffer, rows in level order. ∂F's sinks are added into the children's rows
    within their level and need none. The scattered state has a spare zero row: what a missing
    child reads."""
    whole = program.eager + program.lazy
    read_later = {k.key for k in program.keep} | {x.key for ins in whole for x in ins.reads} | {
        o.key for o in program.read_after_loop}
    specs = {}
    for o in [o for ins in program.core for o in ins.writes]:
        if row_domain(o.shape) and o.key in read_later:
            specs[o.key] = _buffer(o)
    # The state gathers read (F) and the state gradient scatter-adds write into (∂F), each
    # with a spare row for an absent child.
    if any(isinstance(ins, Gather) for ins in program.core) and not program.reverse:
        specs[program.sinks[0].key] = _buffer(program.sinks[0], spare=1)
    if program.reverse:
        specs[program.sources[0].key] = _buffer(program.sources[0], spare=1)
    return program.with_(buffers=tuple(specs.values()))


def _buffer(symbol, spare=0):
    rows = "V" if row_domain(symbol.shape) == "vertex" else "E"
    return Buffer(symbol.key, rows, symbol.shape[1:], symbol.dtype, spare)


def alias_concats(program):
    """A concat whose parts are all computed by its own phase, each once, is assembled in
    place: each part is a view of its columns of the concat's buffer (which it then needs no
    buffer of its own for), and the concat copies nothing. Per level: a buffered concat (the
    scattered [h, c], the gate-gradient block of ∂F). Over all rows (a leaf kind, which has
    no levels: its [h, c], its gates' gradient): the concat gets a buffer if it has none —
    not a value returned to the caller (a pooled buffer goes back to its pool), but F's
    scattered state, which the caller reads by rows — and its parts are none of those."""
    given = program.buffered
    returned = {o.key for o in program.graph.outputs} - (
        set() if program.reverse else {program.sinks[0].key})
    aliases, taken, added, phases = [], set(), [], {}
    for phase in (CORE, EAGER, LAZY):
        made = {o.key for ins in program.core if isinstance(ins, Compute)
                for o in ins.writes} if phase == CORE else set()
        instructions = []
        for ins in getattr(program, phase):
            node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
            parts = node.inputs if node is not None else ()
            if (node is not None and node.op.assembles_in_place and row_domain(node.shape)
                    and (node.key in given if phase == CORE else node.key not in returned)
                    and len({x.key for x in parts}) == len(parts)
                    and all(x.key in made and x.key not in taken
                            and (phase == CORE or x.key not in given | returned)
                            and row_domain(x.shape) == row_domain(node.shape) for x in parts)):
                axis, start = node.attrs["axis"], 0
                for x in parts:
                    aliases.append((x, node, axis, start, start + x.shape[axis]))
                    taken.add(x.key)
                    start += x.shape[axis]
                if node.key not in given:
                    added.append(_buffer(node))
                ins = _replace(ins, aliased=True)
            if phase != CORE and isinstance(ins, Compute):
                made.update(o.key for o in ins.writes)
            instructions.append(ins)
        phases[phase] = tuple(instructions)
    return program.with_(aliases=tuple(aliases), **phases, buffers=tuple(
        b for b in program.buffers if b.key not in taken) + tuple(added))


def zero_rows(program):
    """Attach to each step how all-zero rows pass through it (``zero_rows.py``); mark the
    whole-batch steps that can run on their nonzero rows only, and which per-row values the
    core reads may be zero on a level (the gathers, and eager values with zero rows)."""
    graph = program.graph
    users = graph.consumers()
    outputs = {o.key for o in graph.outputs}
    core = tuple(_replace(ins, zero_rule=ZeroRowRule(ins.step)) if isinstance(ins, Compute)
                 else ins for ins in program.core)

    def whole(ins):
        rule = ZeroRowRule(ins.step)
        node = getattr(ins.step, "node", None)
        restrict = node is not None and node.op.on_nonzero_rows is not None
        demand = reader = None
        if restrict and node.op.native == "product":  # only rows a later scatter keeps are
            # needed (an embedding gradient)
            value = node
            while len(users[value.key]) == 1 and value.key not in outputs:
                reader = users[value.key][0]
                if reader.op.keeps_rows and row_domain(reader.shape) == row_domain(value.shape):
                    value = reader
                    continue
                index = reader.op.row_index_arg
                scatters = index is not None and reader.shape[:1] != reader.inputs[index].shape[:1]
                if scatters and reader.inputs[0] is value:  # value's row i goes to row idx[i]
                    demand = reader.inputs[index]
                break
        direct = demand is not None and value is node and reader.op is SCATTER_ADD_ROWS
        return _replace(ins, zero_rule=rule, restrict=restrict, demand=demand,
                        demand_reader=reader if direct else None)

    made = {o.key for ins in core for o in ins.writes if not isinstance(ins, Gather)}
    read = [x for ins in core for x in ins.reads] + [ins.target for ins in core
                                                     if isinstance(ins, Gather)]
    candidates, seen = [], set()
    for x in read:
        if row_domain(x.shape) and x.key not in made and x.key not in seen:
            seen.add(x.key)
            candidates.append((x.key, row_domain(x.shape)))
    return program.with_(core=core, eager=tuple(whole(i) for i in program.eager),
                         lazy=tuple(whole(i) for i in program.lazy),
                         zero_candidates=tuple(candidates))


def leaf_sinks(program):
    """Mark the core steps whose results only feed sinks (in ∂F: the children's gradients). On a
    level where no vertex has that child those steps have nothing to do."""
    graph = program.graph
    sinks = {s.key for s in program.sinks}
    read_after = {o.key for o in program.read_after_loop}
    buffered = program.buffered
    owner = {}
    for ins in program.core:
        if isinstance(ins, Compute):
            for m in _members(ins.step):
                owner[m.key] = ins
    users = graph.consumers()
    serves_of = {}
    for ins in reversed(program.core):
        if not isinstance(ins, Compute):
            continue
        members = {m.key for m in _members(ins.step)}
        serves, always = set(), False
        for o in ins.writes:
            always |= o.key in buffered or o.key in read_after
            if o.key in sinks:
                serves.add(o.key)
            for u in users[o.key]:
                if u.key in members:
                    continue
                reader = owner.get(u.key)
                if reader is None or serves_of.get(reader) is None:
                    always = True
                else:
                    serves |= serves_of[reader]
        serves_of[ins] = None if always else frozenset(serves)
    core = tuple(_replace(ins, serves=serves_of[ins]) if isinstance(ins, Compute) else ins
                 for ins in program.core)
    return program.with_(core=core, skips_unread_sinks=True)


def unread_zeros(program):
    """Give each core step whose outputs live only during their level the steps that read
    them: on a level where it would write zeros (ZERO) and none of those runs, it is skipped
    (plans.py). Measured on the RNTN (rows of 2,048 products at the leaves): the zeros were
    written and then read by nothing."""
    outside = program.read_outside_core
    readers = {}
    for k, ins in enumerate(program.core):
        for x in ins.reads:
            readers.setdefault(x.key, []).append(k)
    local = tuple(
        tuple(sorted({r for o in ins.writes for r in readers.get(o.key, ())}))
        if isinstance(ins, (Compute, Gather)) and ins.writes
        and not any(o.key in outside for o in ins.writes) else None
        for ins in program.core)
    return program.with_(level_local_readers=local)


def strided_gathers(program):
    """Gathers and scatter-adds read and add through evenly spaced slices where a batch has
    them (complete trees and chains), instead of index arrays."""
    core = tuple(_replace(ins, strided=True) if isinstance(ins, (Gather, ScatterAdd))
                 and ins.slot != "edges" else ins for ins in program.core)
    return program.with_(core=core)


def _core_readers(program):
    """key -> the core instructions that read it."""
    readers = {}
    for ins in program.core:
        for x in ins.reads:
            readers.setdefault(x.key, []).append(ins)
    return readers


def _is_window(ins):
    node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
    return node is not None and node.op.native == "window"


def direct_gathers(program):
    """(native) Gathers read only by column windows write the windows' rows directly; a
    gather read only by a concat of columns (a TreeRNN's [h_l, h_r]) writes its columns."""
    readers = _core_readers(program)
    outside = program.read_outside_core

    def direct(ins):
        if not isinstance(ins, Gather) or ins.slot == "edges" or ins.target.key in outside:
            return False
        users = readers.get(ins.target.key)
        return bool(users) and (all(_is_window(r) for r in users) or (
            len(users) == 1 and _is_column_concat(users[0])
            and sum(x.key == ins.target.key for x in users[0].reads) == 1))

    return program.with_(core=tuple(_replace(ins, direct=True) if direct(ins) else ins
                                    for ins in program.core))


def _is_column_concat(ins):
    node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
    return (node is not None and node.op.assembles_in_place and not ins.aliased
            and not ins.inlined and len(node.shape) == 2 and node.attrs.get("axis") in (1, -1)
            and all(len(x.shape) == 2 for x in node.inputs))


def inline_windows(program):
    """(native) An elementwise core group whose outputs live only during their level and are
    read only through column windows, themselves read only by elementwise core groups, is
    computed inside those groups (marked ``inlined``; the native loop writes nothing for it)."""
    readers = _core_readers(program)
    outside = program.read_outside_core

    def elementwise(ins):
        if not isinstance(ins, Compute) or any(ins.accumulate):
            return False
        return (getattr(ins.step, "group", None) is not None
                or getattr(ins.step, "node", None) is not None and ins.step.node.op.is_elementwise)

    core = []
    for ins in program.core:
        ok = elementwise(ins) and all(
            o.key not in outside and readers.get(o.key)
            and all(_is_window(w) and w.writes[0].key not in outside
                    and readers.get(w.writes[0].key)
                    and all(elementwise(r) for r in readers[w.writes[0].key])
                    for w in readers[o.key])
            for o in ins.writes)
        core.append(_replace(ins, inlined=True) if ok else ins)
    return program.with_(core=tuple(core))


def direct_scatters(program):
    """(native) A scatter-add whose source is a concat computed per level only for it adds the
    concat's parts into their columns instead (the concat is marked ``inlined``)."""
    readers = _core_readers(program)
    outside = program.read_outside_core
    concats = {}
    for ins in program.core:
        node = getattr(ins.step, "node", None) if isinstance(ins, Compute) else None
        if node is not None and node.op.assembles_in_place and not ins.aliased \
                and len(node.shape) == 2 and node.attrs.get("axis") in (1, -1):
            concats[node.key] = ins
    direct = set()
    for ins in program.core:
        if isinstance(ins, ScatterAdd) and ins.slot != "edges" and ins.source.key in concats \
                and ins.source.key not in outside and readers[ins.source.key] == [ins]:
            direct.add(ins.source.key)
    core = tuple(_replace(ins, direct=True) if isinstance(ins, ScatterAdd)
                 and ins.source.key in direct else
                 _replace(ins, inlined=True) if isinstance(ins, Compute)
                 and ins.writes[0].key in direct else ins for ins in program.core)
    return program.with_(core=core)


def streams(program):
    """(CUDA) Which eager and lazy steps run on the side stream, beside the level loop.

    An eager step goes to the side stream when neither the core nor a sink needs its outputs,
    directly or through other eager steps (∂F: ``hᵀ·δ_push`` of a pushed head); a lazy step
    when its outputs lead only to parameter gradients (``Xᵀ·δ``), which leave the runtime last.
    The level loop itself stays on the main stream. See ``minicavs/cuda/streams.py``."""
    graph = program.graph
    need = {x.key for ins in program.core for x in ins.reads} | {s.key for s in program.sinks}
    eager = []
    for ins in reversed(program.eager):
        if any(o.key in need for o in ins.writes):
            need.update(x.key for x in ins.reads)
            eager.append(ins)
        else:
            eager.append(_replace(ins, stream="side"))
    side_need = {o.key for o, of in zip(graph.outputs, getattr(graph, "grad_of", ()))
                 if of.kind == "param"}
    main_need = {s.key for s in program.sinks} | {o.key for o in graph.outputs
                                                  if o.key not in side_need}
    lazy = []
    for ins in reversed(program.lazy):
        outs = {o.key for o in ins.writes}
        if outs & side_need and not outs & main_need:
            side_need.update(x.key for x in ins.reads)
            lazy.append(_replace(ins, stream="side"))
        else:
            main_need.update(x.key for x in ins.reads)
            lazy.append(ins)
    return program.with_(eager=tuple(reversed(eager)), lazy=tuple(reversed(lazy)))


def _members(step):
    group = getattr(step, "group", None)
    return group.members if group is not None else [step.node]


def _replace(ins, **changes):
    return replace(ins, **changes)


# --- the pipeline --------------------------------------------------------------------------------

GRAPH_PASSES = (regroup_sums, unused_columns, bias_in_readers, fold_slices, cse, dce)
PIPELINE = (classify, hoist_eager, lazy_batching, elementwise_per_level,
            keep_mixed_rows_per_level, fuse, lower, sum_into_cells, buffers, alias_concats, zero_rows,
            leaf_sinks, strided_gathers, unread_zeros, direct_gathers, inline_windows,
            direct_scatters, streams)
_SWITCHES = {f.name for f in fields(Options)}


def run_passes(program, passes, options):
    """Apply ``passes`` in order, skipping the optional ones ``options`` switches off."""
    for p in passes:
        if p.__name__ in _SWITCHES and not getattr(options, p.__name__):
            continue
        program = p(program).with_(passes=program.passes + (p.__name__,))
    return program


@dataclass(frozen=True)
class CellGraph:
    """A traced vertex function as :func:`compile_programs` reads it, and all it reads of one.

    ``graph``: F, its outputs the scattered state, then the pushed output if any. ``slots``:
    each input of F that carries children's states, with its child slot — ``(k, gather(k))``,
    and ``("edges", child state per edge)`` for ``gather_sum``; these are the sources of the
    core path. ``edge_parent``: the input naming each edge's parent row (``gather_sum``), or
    None. The other inputs are found by their role (``pull``) or kind (parameters)."""

    name: str
    graph: Graph
    slots: tuple
    edge_parent: Symbol = None


def compile_programs(cell, options):
    """The Programs of F and ∂F of a traced vertex function (a :class:`CellGraph`).

    F's graph is rewritten first, ∂F is derived from the result and rewritten too; the ends of
    each program are named after the rewrites (they may replace output nodes). F then keeps
    the values ∂F reads."""
    slots, edge_parent = cell.slots, cell.edge_parent
    forward = run_passes(Program(cell.name, cell.graph, tuple(s for _, s in slots), (), slots,
                                 edge_parent=edge_parent), GRAPH_PASSES, options)
    graph = forward.graph
    forward = forward.with_(sinks=(graph.outputs[0],))  # the scattered state
    wrt = [s for s in graph.inputs if s.dtype.kind == "f"] + [
        p for p in graph.params if p.dtype.kind == "f"]
    bw = grad_graph(graph, wrt, unreached="drop")
    backward = run_passes(Program(f"d({cell.name})", bw, (bw.cotangents[0],), (), (), reverse=True),
                          GRAPH_PASSES, options)
    bw = backward.graph
    grad_of = {x.key: g for x, g in zip(bw.grad_of, bw.outputs)}
    sinks = tuple((slot, grad_of[s.key]) for slot, s in slots if s.key in grad_of)
    refs = {fwd.key: ref for fwd, ref in zip(bw.forward_refs, bw.inputs[len(bw.cotangents):])}
    backward = backward.with_(sinks=tuple(g for _, g in sinks), slots=sinks,
                              edge_parent=None if edge_parent is None else
                              refs.get(edge_parent.key))
    backward = run_passes(backward, PIPELINE, options)
    forward = run_passes(forward.with_(keep=_read_by(bw)), PIPELINE, options)
    return forward, backward


def _read_by(bw):
    """The forward values ∂ still reads after its rewrites: what F must keep."""
    used = {x.key for n in bw.nodes for x in n.inputs} | {o.key for o in bw.outputs}
    return tuple(fwd for fwd, ref in zip(bw.forward_refs, bw.inputs[len(bw.cotangents):])
                 if ref.key in used)


# What a static graph (``mc.symbolic``) runs through: the rewrites and fusion; it has no levels
# and no vertex axis, so the passes about rows and streams have nothing to do.
STATIC_OPTIONS = Options(regroup_sums=False, alias_concats=False, zero_rows=False,
                         leaf_sinks=False, strided_gathers=False, direct_gathers=False,
                         inline_windows=False, direct_scatters=False, streams=False)


def compile_graph(graph, keep=(), options=STATIC_OPTIONS):
    """One static graph as a Program of one eager phase, its graph as traced (no rewrites, so
    its symbols stay those another graph refers to): automatic batching's batched kernels and
    their ∂ (``minicavs/autobatch/signature.py``). ``keep``: values read after it runs."""
    return run_passes(Program(graph.name, graph, (), (), (), keep=tuple(keep)), PIPELINE,
                      options)


def compile_static(graph, options=STATIC_OPTIONS):
    """The Programs of a static graph and of its derivative: one eager phase each."""
    forward = run_passes(Program(graph.name, graph, (), (), ()), GRAPH_PASSES, options)
    bw = grad_graph(forward.graph)
    backward = run_passes(Program(bw.name, bw, (), (), ()), GRAPH_PASSES, options)
    backward = run_passes(backward, PIPELINE, options)
    forward = run_passes(forward.with_(keep=_read_by(backward.graph)), PIPELINE, options)
    return forward, backward
