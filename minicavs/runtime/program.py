"""The Program: F (or ∂F) of a vertex function as explicit instructions, ready to run on a batch.

A front-end (a vertex function, its kinds, a recursive definition, a static function) traces a
static graph; the passes (passes.py) turn it into a :class:`Program` — immutable, printable with
:meth:`Program.dump` — and the driver (driver.py) runs it over a batch on a backend. Everything a
backend does is written here as data:

* three phases (Cavs Proposition 1): ``eager`` instructions run once over all rows of the batch
  before the level loop, ``core`` instructions run once per level on that level's rows, ``lazy``
  instructions run once over all rows after the loop;
* instructions: :class:`Compute` (one op or one fused group), :class:`Gather` (the rows of child
  k copied into a contiguous block: F's entrance) and :class:`ScatterAdd` (a gradient added into
  the children's rows: ∂F's exit), with their edge-list forms for ``gather_sum``;
* the values that get a batch-wide buffer (one row per vertex, rows in level order), the parts
  of a concat written straight into its columns, and which per-row values may be zero on a
  level's rows — the facts the interpreter checks to skip work that would produce zeros.

Row counts are symbolic: ``V`` is the number of vertices of a task (or batch), ``E`` its edges.
"""

import textwrap
from functools import cached_property
from dataclasses import dataclass, replace

from ..autodiff.visualize import node_text
from ..ops.batching import row_domain
from ..ops.registry import describe

RUN, ZERO, SKIP = "run", "zero", "skip"  # what a core instruction does on one level


def label(symbol, names):
    """``%i`` for a symbol of the program's graph (its position), as in ``Graph.summary()``."""
    return f"%{names[symbol.key]}" if symbol.key in names else symbol.label()


@dataclass(frozen=True, eq=False)
class Compute:
    """Run one executor step (an op or a fused group; ``runtime/executor.py``).

    ``symbolic``: attributes hold V or E and are instantiated per task. ``accumulate``: per
    output, a shared value computed per level and summed (a parameter gradient without lazy
    batching). Set by passes: ``zero_rule`` (how all-zero rows pass through; zero_rows),
    ``serves`` (the sinks this step alone feeds; leaf_sinks), ``restrict`` (a whole-batch step
    that runs on its nonzero rows only) and ``demand`` (an index: only its rows >= 0 are read
    later), ``aliased`` (a concat whose parts already wrote its columns), ``stream``."""

    step: object
    symbolic: bool = False
    accumulate: tuple = ()
    zero_rule: object = None
    serves: frozenset = None
    restrict: bool = False
    demand: object = None
    demand_reader: object = None  # the scatter_add_rows that alone reads it, directly
    aliased: bool = False
    stream: str = "main"
    inlined: bool = False

    @property
    def reads(self):
        return self.step.inputs

    @property
    def writes(self):
        return self.step.outputs

    def action(self, zero, unneeded):
        """What to do on a level where the per-row values ``zero`` (keys) are all zero and the
        sinks ``unneeded`` (keys) are read by no one: (RUN, ZERO — every output is zero — or
        SKIP — only unneeded sinks read it; and the ids of the outputs that are zero)."""
        if self.serves is not None and self.serves <= unneeded:
            return SKIP, [o.key for o in self.writes]
        if self.zero_rule is None or self.zero_rule.never_zero:
            return RUN, []
        zeros = [o.key for o, z in zip(self.writes, self.zero_rule.zero_outputs(zero)) if z]
        return (ZERO if len(zeros) == len(self.writes) else RUN), zeros

    def dump(self, names):
        members = getattr(self.step, "group", None)  # (a summed cell: its group and cell)
        members = getattr(self.step, "members", members)
        nodes = members.members if members is not None else [self.step.node]
        body = textwrap.fill("; ".join(
            f"{label(m, names)} = {node_text(m)}({', '.join(label(x, names) for x in m.inputs)})"
            for m in nodes), width=92, subsequent_indent=" " * 10, break_long_words=False)
        what = "fused" if members is not None else "op"
        notes = [n for n, on in (("in place", self.aliased), ("nonzero rows", self.restrict),
                                 ("native: computed where read", self.inlined),
                                 ("side stream", self.stream != "main"),
                                 ("summed over levels", any(self.accumulate))) if on]
        if self.serves is not None:
            notes.append("only for " + ", ".join(f"%{names[s]}" for s in sorted(
                self.serves, key=names.get)))
        return f"{what:5} {body}" + (f"   [{', '.join(notes)}]" if notes else "")


@dataclass(frozen=True, eq=False)
class Gather:
    """F's entrance: ``target``'s rows of a task are the states of each vertex's child ``slot``
    (an int k for ``gather(k)``, or ``"edges"``: one row per edge, for ``gather_sum``); a
    missing child reads the spare zero row. ``strided``: read through an evenly spaced slice
    where the batch has one (complete trees, chains) instead of an index array."""

    slot: object
    target: object
    strided: bool = False
    direct: bool = False  # (native) rows copied straight into the columns its windows own

    reads = ()

    @property
    def writes(self):
        return (self.target,)

    def action(self, zero, unneeded):
        return (ZERO, [self.target.key]) if self.target.key in zero else (RUN, [])

    def dump(self, names):
        which = "the children (per edge)" if self.slot == "edges" else f"child {self.slot}"
        how = " (strided where the batch allows)" if self.strided else ""
        how += " [native: into its readers' rows]" if self.direct else ""
        return f"gather {label(self.target, names)} = states of {which}{how}"


@dataclass(frozen=True, eq=False)
class ScatterAdd:
    """∂F's exit: ``source`` (the gradient of a gather input) is added into the state-gradient
    rows of each vertex's child ``slot`` (or of each edge's child, ``"edges"``)."""

    slot: object
    source: object
    strided: bool = False
    direct: bool = False  # (native) the parts of its concat source are added, not the concat

    writes = ()

    @property
    def reads(self):
        return (self.source,)

    def action(self, zero, unneeded):
        skip = self.source.key in unneeded or self.source.key in zero
        return (SKIP if skip else RUN), []

    def dump(self, names):
        which = "the children (per edge)" if self.slot == "edges" else f"child {self.slot}"
        how = " (strided where the batch allows)" if self.strided else ""
        how += " [native: from its concat's parts]" if self.direct else ""
        return f"add   {label(self.source, names)} into the state gradients of {which}{how}"


@dataclass(frozen=True)
class Buffer:
    """A batch-wide array for one per-row value: ``rows`` is "V" or "E", ``spare`` extra rows
    stay zero (what a gather of a missing child reads)."""

    key: object
    rows: str
    row_shape: tuple
    dtype: object
    spare: int = 0


@dataclass(frozen=True, eq=False)
class Program:
    """F or ∂F of one vertex function, for any batch (see the module docstring).

    The graph and its ends: ``sources`` arrive from other vertices during the level loop (F:
    the gather inputs; ∂F: the cotangent of the scattered state), ``sinks`` are what other
    vertices wait for (F: the scattered state; ∂F: the gradients of the gather inputs);
    ``slots`` pairs each F source / ∂F sink with its child slot. ``keep``: values another
    program reads (F keeps what ∂F needs). ``reverse``: levels run top-down (∂F).
    The rest is filled in by the passes, whose names ``passes`` lists in order (for people:
    what a backend needs to know of a pass is a field, e.g. ``skips_unread_sinks``)."""

    name: str
    graph: object
    sources: tuple
    sinks: tuple
    slots: tuple
    keep: tuple = ()
    reverse: bool = False
    edge_parent: object = None  # the input with each edge's parent row (gather_sum)
    classes: dict = None
    groups: tuple = ()
    eager: tuple = ()
    core: tuple = ()
    lazy: tuple = ()
    buffers: tuple = ()
    aliases: tuple = ()  # (part, concat, axis, start, stop): part written into concat's columns
    zero_candidates: tuple = ()  # per-row values the core reads that may be zero on a level
    skips_unread_sinks: bool = False  # a level's sinks no vertex reads are skipped (leaf_sinks)
    # per core step, the core steps reading its outputs if they live only during their level,
    # else None: a ZERO none of them runs after is skipped (unread_zeros)
    level_local_readers: tuple = None
    passes: tuple = ()

    def with_(self, **changes):
        return replace(self, **changes)

    @property
    def gathers_from(self):
        """The value gathers read (F's scattered state), or None if the program gathers
        nothing."""
        return self.sinks[0] if any(isinstance(i, Gather) for i in self.core) else None

    @cached_property
    def children_concat(self):
        """F's concat of each child's whole state in slot order, ``[h_0, ..., h_k-1]`` (Tree-FC,
        TreeRNN), with a buffer of its own and nothing else reading the gathers: ``(its key,
        k)``, else None. On a batch whose children are its first rows in order (complete trees
        by levels: ``BatchIndices.children_in_order``), that concat's rows are the state's rows
        side by side, and the state is kept there (call.py): nothing is gathered."""
        gathers = [ins for ins in self.core if isinstance(ins, Gather)]
        state = self.gathers_from
        if self.reverse or not gathers or self.edge_parent is not None or state is None \
                or state.key not in self.buffered or len(state.shape) != 2:
            return None
        by_slot = {ins.slot: ins.target for ins in gathers}
        if sorted(by_slot, key=str) != list(range(len(gathers))):  # ("edges": gather_sum)
            return None
        parts = [by_slot[k] for k in range(len(gathers))]
        if any(p.shape != state.shape or p.dtype != state.dtype for p in parts):
            return None
        readers = [ins for ins in self.core if any(x.key in {p.key for p in parts}
                                                   for x in ins.reads)]
        if len(readers) != 1 or not isinstance(readers[0], Compute) or \
                any(p.key in self.read_outside_core for p in parts):
            return None
        node = getattr(readers[0].step, "node", None)
        if node is None or node.op.name != "concat" or node.attrs.get("axis") not in (1, -1) \
                or [x.key for x in node.inputs] != [p.key for p in parts] \
                or node.key not in self.buffered or node.dtype != state.dtype:
            return None
        return node.key, len(parts)

    @cached_property
    def children_gradient(self):
        """∂F's mirror of :attr:`children_concat`: one product (``δ·Uᵀ``) whose columns, a
        child's state width each in slot order, are read only as the gradients added into each
        child's rows: ``(its key, the keys of its column windows, k)``, else None. On a batch
        whose children are its rows in order those rows are one block, so the native loop adds
        the product into them in its gemm (β = 1) and no add runs (native.py)."""
        adds = [ins for ins in self.core if isinstance(ins, ScatterAdd)]
        if not self.reverse or not adds or self.edge_parent is not None or \
                sorted((ins.slot for ins in adds), key=str) != list(range(len(adds))):
            return None
        windows = {ins.slot: ins.source for ins in adds}
        nodes = {n.key: n for n in self.graph.nodes}
        width = windows[0].shape[-1] if len(windows[0].shape) == 2 else None
        products = {w.inputs[0].key for w in windows.values() if w.kind == "op"
                    and w.op.name == "slice_axis" and w.inputs}
        if width is None or len(products) != 1:
            return None
        product = nodes[products.pop()]
        if product.kind != "op" or product.op.name != "matmul" or \
                product.shape[1:] != (len(adds) * width,):
            return None
        for k, w in windows.items():
            if w.shape[1:] != (width,) or w.attrs.get("axis") not in (1, -1) or \
                    (w.attrs.get("start"), w.attrs.get("stop")) != (k * width, (k + 1) * width):
                return None
        keys = {product.key} | {w.key for w in windows.values()}
        readers = {ins for ins in self.core for x in ins.reads if x.key in keys}
        if readers != {*adds} | {ins for ins in self.core if isinstance(ins, Compute)
                                  and ins.writes[0].key in keys - {product.key}} or \
                keys & self.read_outside_core:
            return None
        return product.key, tuple(windows[k].key for k in range(len(adds))), len(adds)

    @cached_property
    def buffered(self):
        return {b.key for b in self.buffers}

    @cached_property
    def made_whole(self):
        """Keys of the values the eager and lazy phases make (over all rows, not by levels)."""
        return {o.key for ins in self.eager + self.lazy for o in ins.writes}

    @cached_property
    def read_after_loop(self):
        """The graph outputs the caller reads after the loop: all of F's; ∂F's except the
        sinks, which are added into the children's rows within their level — unless the same
        value is also another output (the pulled input's gradient when it equals a gather's)."""
        outputs = list(self.graph.outputs)
        if self.reverse:
            for s in self.sinks:  # one entry per sink, by identity (== is elementwise)
                del outputs[next(i for i, o in enumerate(outputs) if o is s)]
        return outputs

    @cached_property
    def handed_out(self):
        """Keys of the values the caller gets: the graph's outputs and the sinks (an F's
        scattered state, ∂F's gradients)."""
        return {o.key for o in self.graph.outputs} | {s.key for s in self.sinks}

    @cached_property
    def read_outside_core(self):
        """Keys of the values read after their level or by someone else than the core."""
        return ({k.key for k in self.keep} | {x.key for ins in self.eager + self.lazy
                                              for x in ins.reads}
                | {o.key for o in self.read_after_loop} | set(self.buffered)
                | {part.key for part, *_ in self.aliases})

    @cached_property
    def row_keys(self):
        """The per-row values the core reads or writes: sliced to a level's rows each level."""
        touched = {x.key for ins in self.core for x in ins.reads} | {
            x.key for ins in self.core for x in ins.writes}
        return tuple((n.key, row_domain(n.shape)) for n in self.graph.nodes
                     if row_domain(n.shape) and n.key in touched)

    def dump(self):
        """The program as text: buffers, then each phase's instructions."""
        names = {n.key: i for i, n in enumerate(self.graph.nodes)}
        lines = [f"program {self.name}: {len(self.eager)} eager, {len(self.core)} core per "
                 f"level{' (top-down)' if self.reverse else ''}, {len(self.lazy)} lazy "
                 f"instructions", f"  passes: {', '.join(self.passes)}"]
        graph = self.graph
        lines.append("  inputs:")
        for n in graph.inputs + graph.params:
            lines.append(f"    {label(n, names):<6} {node_text(n):<28} "
                         f"{describe(n.shape)} {n.dtype}")
        outputs = ", ".join(f"{label(o, names)}" for o in graph.outputs)
        lines.append(f"  outputs: {outputs}")
        lines.append("  buffers (rows in level order):")
        for b in self.buffers:
            rows = b.rows + (f"+{b.spare}" if b.spare else "")
            node = next(n for n in self.graph.nodes if n.key == b.key)
            shape = ", ".join([rows] + [str(d) for d in b.row_shape])
            lines.append(f"    {label(node, names):<6} ({shape}) {b.dtype}")
        for part, concat, axis, start, stop in self.aliases:
            lines.append(f"    {label(part, names):<6} = columns {start}:{stop} of "
                         f"{label(concat, names)}")
        if self.children_concat is not None:
            concat = next(n for n in self.graph.nodes if n.key == self.children_concat[0])
            lines.append(f"    {label(concat, names):<6} holds the state's rows, on a batch whose "
                         f"children are its rows in order (nothing gathered)")
        for phase in ("eager", "core", "lazy"):
            title = {"eager": "eager (once, all rows):", "core": "core (per level):",
                     "lazy": "lazy (once, all rows):"}[phase]
            lines.append("  " + title)
            lines.extend("    " + ins.dump(names) for ins in getattr(self, phase))
        return "\n".join(lines)

    def __repr__(self):
        return (f"Program({self.name!r}: {len(self.eager)} eager, {len(self.core)} core, "
                f"{len(self.lazy)} lazy)")
