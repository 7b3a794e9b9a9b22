"""A call: one Program bound to one call's values, ready for the driver (driver.py).

Every front-end — a vertex function, each kind of a kinded one (and so a recursive definition),
a frontier of a growing graph, a static function — runs its Programs the same way:

    part = bind_forward(exe, xp, rows, params, pull=...)   # or bind_backward / bind_static
    driver.run([part], xp)                                 # N parts: kinds, stepped together
    part.saved(bw), part.output, part.gradients()          # what the front-end keeps or returns

Binding is by the *role* each input of F's graph was traced with (``pull``, ``edge_parent``,
parameters, the gather inputs), so this module knows no front-end. A :class:`Part` is one
Program's share of a call: its environment (symbol key -> array), the zero-row ranges of its
per-row values, its rows (a ``BatchIndices`` or a stand-in with its interface) and the arrays
its gathers read and its scatter-adds write. :class:`CallRecord` is what a call keeps between
its forward and its backward, and for ``explain()``.
"""

from dataclasses import dataclass, field
import weakref

import numpy as np

from .. import backend
from ..ops.index import scatter_add_into
from .zero_rows import EMPTY, FULL


@dataclass(eq=False)
class Part:
    """One Program bound for one call (see the module docstring). ``levels``: the batch level
    of each of the part's levels when several parts step together (kinds; None: one part, all
    levels). ``states``: the array F's gathers read (its last row the spare zero row);
    ``d_states``: the one ∂F's scatter-adds add into. ``block``: this part's rows of the shared
    state (kinds), where a state made before the loop is copied for other parts' gathers. The
    driver fills in ``counts`` (instructions run per level) and ``backend``."""

    exe: object
    env: dict
    rows: object = None
    ranges: dict = field(default_factory=dict)
    states: object = None
    d_states: object = None
    levels: list = None
    block: object = None
    scattered: object = None  # F's state buffer with its spare zero row (gathers_from)
    counts: list = None
    backend: str = None
    store: dict = None  # pooled buffers held until release() (∂F: for the time of backward)
    level_launches: dict = None  # launches in the level loop by category (where counted)
    level_host_seconds: float = None  # the loop's time less the emulated device's work
    # F's concat of the children's states, read where the states are: (its key, its first
    # row), else None (bind_forward); the level plans skip its gathers and the concat
    children_in_place: tuple = None
    # ∂F on such a batch: the first row with children (its native loop adds the product of
    # the children's gradients straight into their rows: native.py), else None
    gradient_in_place: int = None
    # ∂F's first rows of d_states, the children's, not cleared where only their parents write
    # them: the native loop's products write them, or the loop clears them first
    stale_children: int = 0
    # key -> (lo, hi): a value written on those rows alone (its range: zero elsewhere) — an
    # eager product only the level loop reads, a concat a native loop did not clear where no
    # one reads it, or such a value ∂F reads. A reader that does not keep to the range clears
    # the rows first: the native loop those a level reads (none, where its steps read the value
    # as 0 there: codegen.VARIANTS), another loop all, a whole step that is not a product on
    # the nonzero rows all (interpreter.run_whole)
    stale_rows: dict = field(default_factory=dict)

    @property
    def program(self):
        return self.exe.program

    @property
    def output(self):
        """The pushed output (else the scattered state) of an F, rows in level order."""
        return self.env[self.program.graph.outputs[-1].key]

    def publish_state(self):
        """Kinds: a scattered state made before the level loop goes into the rows other kinds'
        gathers read (the driver calls this after every part's eager phase)."""
        if self.block is None:
            return
        sink = self.program.sinks[0].key
        if sink in self.env and self.env[sink] is not self.block:
            self.block[...] = self.env[sink]

    def clear_stale_children(self, written=False):
        """Before the level loop: the children's rows of d_states left uncleared are cleared,
        or (``written``) the loop writes them all."""
        if self.stale_children and not written:
            self.d_states[:self.stale_children] = 0
        self.stale_children = 0

    def clear_stale_rows(self):
        """Zeros into every row a value left unwritten (:attr:`stale_rows`)."""
        for key in list(self.stale_rows):
            clear_unwritten(self.env, self.stale_rows, key)

    def release(self):
        """Give the part's pooled buffers back (nothing returned may view them)."""
        if self.store is not None:
            self.exe.pool.release(self.store)
            self.store = None

    def saved(self, backward_graph):
        """What ∂F reads of this forward part: the values it refers to, and their ranges."""
        refs = backward_graph.forward_refs
        for v in refs:  # (a view's rows are its base's, which ∂F does not have: written now)
            if len(self.stale_rows.get(v.key, ())) > 2:
                clear_unwritten(self.env, self.stale_rows, v.key)
        return Saved({v.key: self.env[v.key] for v in refs}, self.ranges,
                     {v.key: self.stale_rows[v.key] for v in refs if v.key in self.stale_rows})

    def gradients(self):
        """``{x.key: gradient}`` for each parameter and the pulled input of F that ∂F (this
        part) differentiates (the gather inputs' gradients went to the children, per level)."""
        bw = self.program.graph
        return {x.key: self.env[g_x.key] for x, g_x in zip(bw.grad_of, bw.outputs)
                if x.kind == "param" or x.role == "pull"}


def clear_unwritten(env, stale, key):
    """Zeros into the rows ``key``'s value left unwritten (``stale[key]``: ``(lo, hi)``, or
    ``(lo, hi, base)`` for a view of the value ``base``), and the mark gone."""
    lo, hi, *base = stale.pop(key)
    value = env[base[0] if base else key]
    value[:lo] = 0
    value[hi:] = 0


@dataclass(frozen=True)
class Saved:
    """What a forward part keeps for its backward: ∂F's forward references, their ranges."""

    values: dict
    ranges: dict
    stale: dict = field(default_factory=dict)  # (Part.stale_rows of those values)


@dataclass(eq=False)
class CallRecord:
    """One call's own record (held by the autodiff tape through the op's attributes, never on
    a shared object): ``saved`` per part (Saved) and ``stats`` for ``explain()``. The pooled
    buffers of its forward parts go back to their pools when the record is collected."""

    saved: list = field(default_factory=list)
    stats: dict = None
    scheduling_seconds: float = 0.0
    selected: object = None  # rows= as the call's rows, on its device (the backward's too)


# --- binding ------------------------------------------------------------------------------------

def bind_forward(exe, xp, rows, params, pull=None, *, record=None, states=None, block=None,
                 levels=None):
    """F of ``exe`` bound for a call over ``rows``: ``params`` are the arrays of the graph's
    parameters in order, ``pull`` the caller's pulled rows (caller's vertex order). Batch
    buffers come from ``exe.pool`` and go back when ``record`` is released (without a record:
    fresh ones, owned by the caller). ``states``: the array gathers read (default: F's own
    scattered state, whose spare row is cleared); ``block``: this part's rows of it (kinds)."""
    program = exe.program
    specs = buffer_specs(program, rows)
    sink = program.sinks[0].key
    in_place = None if block is not None or states is not None else \
        _children_in_place(program, rows)
    if in_place is not None:  # the state's buffer is the concat's, grown to hold it
        concat, first, arity = in_place
        n, shape, dtype, name = specs.pop(sink)
        c_rows, c_shape, _, c_name = specs[concat]
        specs[concat] = (max(c_rows, first + -(-n // arity)), c_shape, dtype, c_name)
    if record is not None:
        store, views = exe.pool.acquire(xp, specs)
        weakref.finalize(record, exe.pool.release, store)
    else:
        views = {key: xp.empty((n,) + shape, dtype) for key, (n, shape, dtype, _) in
                 specs.items()}
    if block is not None and sink in program.buffered:  # kinds: the shared state's rows
        views[sink] = block
    if in_place is not None:  # state row s at concat row first + s // arity: its parent's
        start = first * c_shape[0]
        views[sink] = views[concat].reshape(-1)[start:start + n * shape[0]].reshape(
            (n,) + shape)
    env = exe.constants(xp)
    graph = program.graph
    env.update((p.key, a) for p, a in zip(graph.params, params))
    for node in graph.inputs:
        if node.role == "pull":  # the caller's rows into level order
            env[node.key] = take_rows(xp, pull, rows.order)
            if xp is not np:  # (ids copied from the host: their bounds hold in level order)
                backend.share_range(env[node.key], pull)
        elif node.role == "edge_parent":
            env[node.key] = rows.edge_parent_row
    bind_buffers(program, env, views, rows)
    scattered = None
    if program.gathers_from is not None and block is None:
        scattered = views[program.gathers_from.key]
        scattered[rows.num_vertices:] = 0  # the spare row: what an absent child reads
    ranges = {s.key: rows.hull(slot) for slot, s in program.slots}
    return Part(exe, env, rows, ranges, states=scattered if states is None else states,
                levels=levels, block=block, scattered=scattered,
                children_in_place=in_place and in_place[:2])


def _children_in_place(program, rows):
    """``(concat, first row with children, arity)`` where F's concat of its children's states
    (``Program.children_concat``) can be read where the states are, the batch's children
    being its rows in order (``children_in_order``), else None."""
    found = program.children_concat
    in_order = getattr(rows, "children_in_order", None)
    if found is None or in_order is None:
        return None
    first = in_order(found[1])
    return None if first is None else (found[0], first, found[1])


def bind_backward(exe, xp, rows, saved, cotangent=None, *, at=None, d_states=None, block=None,
                  levels=None):
    """∂F of ``exe`` bound for the backward of a forward part that kept ``saved``, its buffers
    held until :meth:`Part.release`. ``cotangent``: the caller's gradient of F's output
    (caller's vertex order): of the pushed output, or — F pushing nothing — of the scattered
    states; with ``at`` (level rows), the gradient of those rows only (a call's ``rows=``).
    ``d_states``: the state gradient the scatter-adds write, with its spare row, and
    ``block`` this part's rows of it (kinds); default: ∂F's own buffer, cleared."""
    program = exe.program
    bw = program.graph
    store, views = exe.pool.acquire(xp, buffer_specs(program, rows))
    env = exe.constants(xp)
    forward_inputs = bw.inputs[len(bw.cotangents):]
    for ref, value in zip(forward_inputs, bw.forward_refs):
        env[ref.key] = saved.values[value.key]
    state_grad = program.sources[0].key
    taken = cotangent is not None and len(bw.cotangents) == 1 and at is None  # (the
    # caller's gradient, written below)
    found, in_order = program.children_gradient, getattr(rows, "children_in_order", None)
    first = in_order(found[2]) if found and in_order and block is None else None
    stale = 0
    if block is not None:
        views[state_grad] = block
    else:
        d_states = views[state_grad]
        if first is not None and xp is np and not taken:
            # the children's rows, one block before the roots: if the caller's gradient adds
            # into none of them, only their parents write them (Part.stale_children)
            stale = found[2] * (len(rows.order) - first)
            if at is not None and len(bw.cotangents) == 1 and len(at) and \
                    int(np.min(at)) < stale:
                stale = 0
        # cleared but for the rows the caller's gradient fills (one pass fewer over (V, H))
        (d_states[len(rows.order):] if taken else d_states[stale:])[...] = 0
    bind_buffers(program, env, views, rows)
    if at is not None:  # some rows' gradient: added at their level rows (a row may repeat)
        if len(bw.cotangents) > 1:
            env[bw.cotangents[1].key] = scatter_add_into(xp, xp.zeros(
                (len(rows.order),) + cotangent.shape[1:], cotangent.dtype), at, cotangent)
        else:
            scatter_add_into(xp, env[state_grad], at, cotangent)
    elif cotangent is not None:  # caller order -> level order
        if len(bw.cotangents) > 1:  # F pushes: the caller's gradient is the push's
            env[bw.cotangents[1].key] = take_rows(xp, cotangent, rows.order)
        else:  # F returns its scattered states: taken straight into their gradient
            take_rows(xp, cotangent, rows.order, out=env[state_grad])
    ranges = {ref.key: saved.ranges.get(value.key, FULL)
              for ref, value in zip(forward_inputs, bw.forward_refs)}
    if at is not None and len(bw.cotangents) > 1 and xp is np:
        # the push's gradient is zero but at the rows asked for (a loss on the internal
        # vertices: their rows one block in level order), so its products run on those rows;
        # none asked of this part (a kind with no vertex among them): none run
        ranges[bw.cotangents[1].key] = (int(at.min()), int(at.max()) + 1) if len(at) else EMPTY
    unwritten = {ref.key: saved.stale[value.key]
                 for ref, value in zip(forward_inputs, bw.forward_refs) if value.key in saved.stale}
    return Part(exe, env, rows, ranges, d_states=d_states, levels=levels, store=store,
                gradient_in_place=first, stale_children=stale, stale_rows=unwritten)


def bind_static(exe, xp, values, constants=None):
    """A static program (no levels) bound to ``values`` (symbol -> value); ``constants``: the
    graph's constants on ``xp`` (default: the Executable's)."""
    env = exe.constants(xp) if constants is None else constants
    env.update((s.key, v) for s, v in values)
    return Part(exe, env)


def buffer_specs(program, rows):
    """What the buffer pool hands out for one run of ``program``: each of its buffers, with
    the name of its value for messages."""
    nodes = {n.key: n for n in program.graph.nodes}
    return {b.key: (rows.size(b.rows) + b.spare, b.row_shape, b.dtype,
                    f"'{nodes[b.key].label()}' of {program.name}")
            for b in program.buffers}


def bind_buffers(program, env, views, rows):
    """Bind each buffer (without its spare rows) and each aliased part (its columns)."""
    for b in program.buffers:
        env[b.key] = views[b.key][:rows.size(b.rows)]
    for part, concat, axis, start, stop in program.aliases:
        index = [slice(None)] * len(concat.shape)
        index[axis] = slice(start, stop)
        env[part.key] = env[concat.key][tuple(index)]


# --- rows in and out ----------------------------------------------------------------------------

def take_rows(xp, array, index, out=None):
    """``array[index]`` along rows: pulled inputs into level order, pushed rows back out;
    into ``out`` (C-contiguous, of the result's shape and dtype) when given."""
    if xp is not np and array.dtype in _KERNEL_DTYPES and array.ndim > 0:
        from ..cuda import kernels

        return kernels.gather_rows(xp.ascontiguousarray(array), index, out,
                                   check_indices=False)
    if out is not None and (out.dtype != array.dtype or not out.flags.c_contiguous):
        out[...] = xp.take(array, index, axis=0)
        return out
    if out is None:
        return xp.take(array, index, axis=0)
    # (mode "clip": np.take buffers its out under the default "raise"; the index is a
    # permutation of the rows, in range)
    return xp.take(array, index, axis=0, out=out, mode="clip")


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def stats(batch, counts, seconds):
    """The figures of one forward call, as ``explain()`` returns them."""
    return {"graphs": batch.num_graphs, "vertices": batch.num_vertices,
            "levels": batch.num_levels,
            "vertices_per_level": np.diff(batch.level_offsets).tolist(),
            "forward_ops_per_level": counts, "backward_ops_per_level": None,
            "scheduling_seconds": batch.build_seconds, "forward_seconds": seconds,
            "backward_seconds": None, "forward_backend": None, "backward_backend": None,
            "forward_launches_per_level": None, "backward_launches_per_level": None,
            "forward_host_us_per_level": None, "backward_host_us_per_level": None}


def launches_per_level(parts, num_levels):
    """GPU launches (kernels + library calls + copies) in the level loop of ``parts`` per level
    step, and the same by category; ``(None, None)`` where launches are not counted (NumPy, or
    a real GPU: only the emulated device counts them so far)."""
    counted = [p.level_launches for p in parts if p.level_launches is not None]
    if not counted or len(counted) < len(parts):
        return None, None
    steps = max(num_levels, 1)
    by_category = {}
    for launches in counted:
        for what, n in launches.items():
            by_category[what] = by_category.get(what, 0) + n
    return (sum(by_category.values()) / steps,
            {what: n / steps for what, n in sorted(by_category.items())})


def host_us_per_level(parts, num_levels):
    """Microseconds the host took to issue one level step of ``parts`` (the emulated device's
    work left out); None where that is not measured (NumPy, a real GPU)."""
    seconds = [p.level_host_seconds for p in parts]
    if None in seconds or not seconds:
        return None
    return sum(seconds) / max(num_levels, 1) * 1e6
