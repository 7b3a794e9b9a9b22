"""Analyses and rewrites of a static :class:`~minicavs.autodiff.symbolic.Graph` (Cavs §3.4).

A vertex function F, and its backward ∂F, is one small static graph that runs thousands of
times, so it pays to study it once before it runs:

* :func:`fusion_groups` finds the groups of directly linked elementwise nodes that can run as
  one kernel ("automatic kernel fusion"), and :func:`schedule` orders groups and the remaining
  op nodes into steps an executor can run one after another.
* :func:`dependency_classes` splits the nodes into *eager* (run once for all vertices before the
  level loop), *core* (the gather→scatter path, run once per level) and *lazy* (run once for all
  vertices after the loop): "lazy batching", Cavs Proposition 1 (Proposition 2 of the arXiv
  version). :func:`backward_sources_and_sinks` finds the corresponding ends of ∂F.
* :func:`eliminate_dead` and :func:`merge_common_subexpressions` are the two classic clean-ups;
  ∂F in particular repeats itself (the same reshape of a gradient for two matmul VJPs, the
  constant 1 of every ``1 - σ``).

Nodes are :class:`Symbol` objects; like the rest of minicavs we key tables by ``symbol.key``.
"""

import copy
import heapq

import numpy as np

from .. import backend
from ..autodiff.symbolic import Symbol
from ..errors import GraphError

EAGER, CORE, LAZY = "eager", "core", "lazy"


def _is_fusible(node):
    return node.kind == "op" and node.op.is_elementwise


# --- kernel fusion ----------------------------------------------------------------------------

class FusedGroup:
    """Elementwise nodes of a graph that run as one unit (one kernel).

    ``members``: the op nodes, in topological order. ``inputs``: the symbols from outside the
    group that members read, each once, in order of first use (member order, then argument
    order). ``outputs``: the members whose values are needed outside the group (by a node outside
    it, as a graph output, or because the caller asked to keep them), in member order. Members
    that are not outputs are never materialised by a fused kernel.
    """

    def __init__(self, members, inputs, outputs):
        self.members = list(members)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._signature = None

    def signature(self):
        """A hashable description of the computation, independent of symbol identity: two
        groups with equal signatures compute the same function of their inputs, so they can
        share one compiled kernel (an unrolled LSTM has T copies of the same cell group).

        It holds, per member, the op name, its attributes and where each argument comes from
        (``("in", k)``: group input k; ``("m", j)``: member j), then the output member positions
        and the inputs' dtypes and ranks (a kernel that broadcasts needs to know them)."""
        if self._signature is None:
            where = {x.key: ("in", k) for k, x in enumerate(self.inputs)}
            body = []
            for j, m in enumerate(self.members):
                body.append((m.op.name, freeze(m.attrs), tuple(where[x.key] for x in m.inputs)))
                where[m.key] = ("m", j)
            position = {m.key: j for j, m in enumerate(self.members)}
            self._signature = (tuple(body), tuple(position[o.key] for o in self.outputs),
                               tuple((x.dtype.str, len(x.shape)) for x in self.inputs))
        return self._signature

    def __len__(self):
        return len(self.members)

    def __repr__(self):
        ops = " ".join(m.op.name for m in self.members)
        return (f"FusedGroup({len(self.members)} ops: {ops}; {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs)")


def fusion_groups(graph, classes=None, keep=(), min_size=2):
    """Group directly linked elementwise nodes of ``graph`` into :class:`FusedGroup` objects.

    Union-find over the edges between elementwise nodes (``op.is_elementwise``, i.e. ops with a
    C expression), visited in topological order. Two groups joined by an edge are merged unless
    that would make a cycle: if some path leaves one group through a node outside both and comes
    back into the other (group → matmul → group), the merged group would have to run both before
    and after that node, so the edge is left between two groups. Passes repeat until nothing
    merges, so no two linked groups left can be merged; the grouping is maximal in that sense
    (finding the partition with the fewest groups is a harder problem we do not need).

    ``classes``: a :class:`NodeClasses` result; when given, only nodes of the same class are
    fused, so a group never mixes eager and core work (the runtime runs classes at different
    times). ``keep``: symbols that must be materialised even if only the group uses them, e.g.
    the forward values ∂F reads (``BackwardGraph.forward_refs``); they become group outputs.
    ``min_size``: groups with fewer members are not returned. The default 2 leaves a lone
    elementwise node alone: it runs as an ordinary op (NumPy's ufunc is already one "kernel").
    Pass 1 to get every elementwise node in some group (a GPU code generator may still want one
    kernel for a lone sigmoid, which CuPy otherwise runs as four).

    Group members may broadcast, e.g. ``(N, H) + (H,)``; the kernels handle that.

    Returns the groups in an order in which they can run (see :func:`schedule`).
    """
    nodes = graph.nodes
    index = {n.key: i for i, n in enumerate(nodes)}
    users = graph.consumers()
    parent = list(range(len(nodes)))  # union-find over node positions
    members = {i: [i] for i, n in enumerate(nodes) if _is_fusible(n)}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def unit(i):
        """The group a node belongs to, or the node itself if it is not fusible."""
        return find(i) if i in members or parent[i] != i else i

    def reaches_around(a, b):
        """Is there a path from group ``a`` to group ``b`` through some unit outside both?"""
        last_b = max(members[b])  # nothing after b's last member can lead back into b
        start = [index[u.key] for m in members[a] for u in users[nodes[m].key]]
        seen, stack = set(), [unit(i) for i in start if unit(i) not in (a, b)]
        while stack:
            u = stack.pop()
            if u in seen or u > last_b and u not in members:
                continue
            seen.add(u)
            for m in members.get(u, [u]):
                if m > last_b:
                    continue
                for user in users[nodes[m].key]:
                    v = unit(index[user.key])
                    if v == b:
                        return True
                    if v != a and v not in seen:
                        stack.append(v)
        return False

    def same_class(x, y):
        return classes is None or classes[x] == classes[y]

    merged = True
    while merged:
        merged = False
        for i, v in enumerate(nodes):
            if not _is_fusible(v):
                continue
            for u in v.inputs:
                if not _is_fusible(u) or not same_class(u, v):
                    continue
                a, b = find(index[u.key]), find(i)
                if a == b or reaches_around(a, b) or reaches_around(b, a):
                    continue
                # Keep the smaller position as the root, so roots stay group minima.
                a, b = min(a, b), max(a, b)
                parent[b] = a
                members[a] = sorted(members[a] + members.pop(b))
                merged = True

    kept = {k.key for k in keep} | {o.key for o in graph.outputs}
    groups = []
    for root, positions in members.items():
        if len(positions) < min_size:
            continue
        group_nodes = [nodes[p] for p in positions]
        inside = {n.key for n in group_nodes}
        inputs, seen = [], set()
        for m in group_nodes:
            for x in m.inputs:
                if x.key not in inside and x.key not in seen:
                    seen.add(x.key)
                    inputs.append(x)
        outputs = [m for m in group_nodes if m.key in kept or any(
            user.key not in inside for user in users[m.key])]
        groups.append(FusedGroup(group_nodes, inputs, outputs))
    order = schedule(graph, groups)
    return [step for step in order if isinstance(step, FusedGroup)]


def schedule(graph, groups=()):
    """The op nodes of ``graph`` as a list of steps, each a single op node (a Symbol) or a
    :class:`FusedGroup` standing for all its members, in an order in which every step comes
    after the steps that produce its inputs.

    A group cannot simply take the place of its first or last member (another group may have to
    run in between), so this is a topological sort of the graph with each group contracted to
    one vertex; among the ready steps the one whose first node comes earliest in ``graph.nodes``
    goes first, which keeps the order close to the traced one.
    """
    step_of = {}  # node.key -> position in steps
    steps = []
    for group in groups:
        for m in group.members:
            if m.key in step_of:
                raise GraphError(f"schedule: node {m!r} is in two fused groups")
            step_of[m.key] = len(steps)
        steps.append(group)
    for n in graph.nodes:
        if n.kind == "op" and n.key not in step_of:
            step_of[n.key] = len(steps)
            steps.append(n)
    position = {n.key: i for i, n in enumerate(graph.nodes)}
    first = [min(position[m.key] for m in s.members) if isinstance(s, FusedGroup)
             else position[s.key] for s in steps]
    needs = [set() for _ in steps]
    users = [set() for _ in steps]
    for k, s in enumerate(steps):
        for n in (s.members if isinstance(s, FusedGroup) else [s]):
            for x in n.inputs:
                j = step_of.get(x.key)
                if j is not None and j != k:
                    needs[k].add(j)
                    users[j].add(k)
    ready = [(first[k], k) for k in range(len(steps)) if not needs[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(steps[k])
        for j in users[k]:
            needs[j].discard(k)
            if not needs[j]:
                heapq.heappush(ready, (first[j], j))
    if len(order) != len(steps):
        raise GraphError("schedule: the fused groups form a cycle with the rest of the graph "
                         "(a group both feeds and needs some node outside it)")
    return order


# --- eager / core / lazy --------------------------------------------------------------------

class NodeClasses(dict):
    """The result of :func:`dependency_classes`: a dict ``node.key -> "eager" | "core" | "lazy"``
    that can also be indexed by the node itself (``classes[node]``); ``classes.nodes("core")``
    lists the nodes of one class in topological order."""

    def __init__(self, graph, of, sources, sinks):
        super().__init__(of)
        self.graph = graph
        self.sources = list(sources)
        self.sinks = list(sinks)

    def __getitem__(self, node):
        key = node if isinstance(node, int) else node.key
        try:
            return dict.__getitem__(self, key)
        except KeyError:
            raise GraphError(f"{node!r} is not a node of graph {self.graph.name!r}") from None

    def __contains__(self, node):
        return dict.__contains__(self, node if isinstance(node, int) else node.key)

    def nodes(self, kind):
        if kind not in (EAGER, CORE, LAZY):
            raise ValueError(f"unknown class {kind!r}; expected 'eager', 'core' or 'lazy'")
        return [n for n in self.graph.nodes if self[n] == kind]

    def counts(self):
        """How many *op* nodes each class has."""
        ops = self.graph.op_nodes()
        return {k: sum(self[n] == k for n in ops) for k in (EAGER, CORE, LAZY)}

    def __repr__(self):
        c = self.counts()
        return f"NodeClasses(op nodes: {c[EAGER]} eager, {c[CORE]} core, {c[LAZY]} lazy)"


def dependency_classes(graph, sources, sinks):
    """Classify every node of ``graph`` as eager, core or lazy (Cavs Proposition 1).

    ``sources`` are the nodes whose values arrive from other vertices during the level loop: in
    F the ``gather`` inputs; in ∂F the cotangent of the ``scatter`` output, which arrives from the
    parents. ``sinks`` are the nodes other vertices wait for: in F the scattered symbol; in ∂F the
    gradients of the gather inputs (see :func:`backward_sources_and_sinks`). Then, for a node n:

    * **core**: n depends on a source (is one, or has one as an ancestor) *and* is needed by a
      sink (is one, or is an ancestor of one), i.e. n lies on a source→sink path. A node that
      depends on a source and that anything on such a path needs is itself on one, so "needed by
      the core and depending on a source" is core: it must run per level, on each level's rows.
    * **eager**: n depends on no source. It can run for all vertices before the loop: pulled
      inputs and what is computed from them (``W·x``), and every non-source input, parameter and
      constant. In ∂F the forward values (``forward_refs``) and the cotangent of ``push`` are known
      before the backward loop starts, so they and what only they feed are eager too. A sink that
      depends on no source (a vertex function without recursion) is eager.
    * **lazy**: n depends on a source but no sink needs it: it can wait until every level is
      done and run once over all vertices (``push``, heads, and in ∂F the parameter-gradient
      products ``xᵀ·δ`` and the gradient of the pulled input).

    Every node gets exactly one class. A source itself is core when some sink needs it and lazy
    otherwise (a gather nobody on the path uses).
    """
    known = {n.key for n in graph.nodes}
    for role, ends in (("source", sources), ("sink", sinks)):
        for n in ends:
            if n.key not in known:
                raise GraphError(f"dependency_classes: {role} {n!r} is not a node of graph "
                                 f"{graph.name!r}")
    depends = {s.key for s in sources}
    for n in graph.nodes:  # topological: inputs first
        if any(x.key in depends for x in n.inputs):
            depends.add(n.key)
    needed = {s.key for s in sinks}
    for n in reversed(graph.nodes):  # users first
        if n.key in needed:
            needed.update(x.key for x in n.inputs)
    of = {}
    for n in graph.nodes:
        if n.key not in depends:
            of[n.key] = EAGER
        elif n.key in needed:
            of[n.key] = CORE
        else:
            of[n.key] = LAZY
    return NodeClasses(graph, of, sources, sinks)


def backward_sources_and_sinks(bw, forward_sources, forward_sinks):
    """The ends of ∂F that correspond to F's ends, for :func:`dependency_classes` on ∂F.

    ``bw`` is ``grad_graph(F)``. ``forward_sources``: F's gather inputs. ``forward_sinks``: F's
    scatter output(s), each given as a position in ``F.outputs`` or as the symbol (a symbol that
    is several outputs, as in ``scatter(h); push(h)``, must be given by position, since only
    the scattered copy's cotangent comes from the parents).

    Returns ``(sources, sinks)`` of ∂F: the cotangent inputs of the scatter outputs, and the
    gradient outputs of the gather inputs (those that ∂F computes; a gather input that carries
    no gradient has none).
    """
    forward = bw.forward
    sources = []
    for s in forward_sinks:
        if isinstance(s, (int, np.integer)):
            positions = [int(s)]
        else:
            positions = [i for i, o in enumerate(forward.outputs) if o is s]
            if len(positions) != 1:
                raise GraphError(
                    f"backward_sources_and_sinks: {s!r} is output {positions} of "
                    f"{forward.name!r}; give the scatter output by its position instead"
                    if positions else f"backward_sources_and_sinks: {s!r} is not an output of "
                                      f"graph {forward.name!r}")
        sources.extend(bw.cotangents[p] for p in positions)
    wanted = {s.key for s in forward_sources}
    sinks = [out for out, of in zip(bw.outputs, bw.grad_of) if of.key in wanted]
    return sources, sinks


# --- rewrites -----------------------------------------------------------------------------------
#
# Both rewrites return a *new* graph and leave the old one untouched. The new graph shares the
# old one's input and parameter symbols (so ``inputs`` and ``params`` keep their order and
# identity: whatever binds values to them, e.g. BackwardGraph.forward_refs, still works) and has
# fresh copies of the op nodes it keeps. It is a shallow copy of the original object, so a
# BackwardGraph stays a BackwardGraph with its cotangents, forward_refs and grad_of.

def _rebuilt(graph, nodes, outputs):
    new = copy.copy(graph)
    new.nodes = list(nodes)
    new.outputs = list(outputs)
    new.params = [n for n in new.nodes if n.kind == "param"]
    return new


def clone(node, inputs):
    """A copy of op or constant ``node`` reading ``inputs`` (a rewrite's new node)."""
    return Symbol(node.kind, node.shape, node.dtype, op=node.op, inputs=inputs,
                  attrs=node.attrs, value=node.value, name=node.name, where=node.where,
                  tracer=node.tracer, role=node.role)


def eliminate_dead(graph):
    """A copy of ``graph`` without the nodes no output depends on. Inputs and parameters are
    kept even when unused: they are the graph's signature (callers pass values by position)."""
    needed = {o.key for o in graph.outputs}
    for n in reversed(graph.nodes):
        if n.key in needed:
            needed.update(x.key for x in n.inputs)
    new_of = {}
    nodes = []
    for n in graph.nodes:
        if n.kind in ("input", "param"):
            new_of[n.key] = n
            nodes.append(n)
        elif n.key in needed:
            new_of[n.key] = clone(n, [new_of[x.key] for x in n.inputs])
            nodes.append(new_of[n.key])
    return _rebuilt(graph, nodes, [new_of[o.key] for o in graph.outputs])


def merge_common_subexpressions(graph):
    """A copy of ``graph`` in which equal computations are one node: equal constants (same
    dtype, shape and bytes) and op nodes with the same op, the same (merged) inputs and equal
    attributes; a commutative op's nodes (``op.commutative``: add, mul) match with their
    arguments in either order. Inputs and parameters are never merged (two inputs may receive
    different values). Graph outputs that become the same node stay separate entries of
    ``outputs``."""
    canonical = {}  # key -> the new node
    new_of = {}  # old node's key -> new node
    nodes = []
    for n in graph.nodes:
        if n.kind in ("input", "param"):
            new_of[n.key] = n
            nodes.append(n)
            continue
        inputs = [new_of[x.key] for x in n.inputs]
        if n.kind == "const":
            value = backend.to_numpy(n.value)
            key = ("const", value.dtype.str, value.shape, value.tobytes())
        else:
            ids = tuple(x.key for x in inputs)
            if n.op.commutative:
                ids = tuple(sorted(ids))
            key = ("op", id(n.op), ids, freeze(n.attrs))
        if key not in canonical:
            canonical[key] = clone(n, inputs)
            nodes.append(canonical[key])
        new_of[n.key] = canonical[key]
    return _rebuilt(graph, nodes, [new_of[o.key] for o in graph.outputs])


class _Unique:
    """Stands for a value that cannot be compared safely: equal only to itself."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Unique) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def freeze(value):
    """A hashable key for an attribute value, equal exactly when the values are interchangeable.

    Arrays compare by dtype, shape and bytes (``==`` on arrays is elementwise, and NaN != NaN);
    dtypes by their string; floats by type and ``repr`` (so 0.0 and -0.0 differ); containers item
    by item. Anything else unhashable is equal only to itself, so it never merges wrongly."""
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, type) and issubclass(value, np.generic):
        return ("dtype", np.dtype(value).str)
    if isinstance(value, np.ndarray) or backend.is_cupy_array(value):
        a = backend.to_numpy(value)
        return ("array", a.dtype.str, a.shape, a.tobytes())
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (bool, int, str, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), freeze(v)) for k, v in value.items())))
    return ("object", _Unique(value))
