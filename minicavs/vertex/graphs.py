"""Input graphs and batches of them, and the level schedule of a batch.

An :class:`InputGraph` is one sample's structure: for each vertex, the ordered list of its
children (child k is what the vertex function reads with ``gather(k)``). Trees, chains and
DAGs (a vertex may have several parents) are all allowed; cycles are not.

A :class:`GraphBatch` concatenates many input graphs into one set of CSR arrays and computes
the batching schedule the runtime follows (Cavs §3.2): level(v) = 0 for a vertex without
children, else 1 + the highest level of its children. All vertices of one level form one
batching task; rows of the batch's dynamic tensors are laid out level by level, so task t owns
the contiguous rows ``[level_offsets[t], level_offsets[t+1])``.
"""

import collections
import functools
import itertools
import threading
import time
import weakref

import numpy as np

from ..errors import GraphError
from ..validate import is_integer, shown
from . import native


# What InputGraph takes as a vertex's list of children; it checks them in bulk where every
# list is one of these exact types and every child an integer that int64 holds (anything else
# goes through the per-vertex checks, which name what is wrong where).
_CHILD_LISTS = (list, tuple, range, np.ndarray)
_INDEX_TYPES = {int} | {np.dtype(c).type for c in np.typecodes["AllInteger"]
                        if np.dtype(c).kind == "i" or np.dtype(c).itemsize < 8}


def _sample_prefix(sample):
    return f"sample {sample}: " if sample is not None else ""


class _ChildLists:
    """What an input graph and a batch of them share: children as CSR arrays ``child_ptr``
    (vertex v's children are ``child_ids[child_ptr[v]:child_ptr[v + 1]]``) and ``child_ids``."""

    @property
    def num_children(self):
        return np.diff(self.child_ptr)

    @property
    def max_arity(self):
        return int(self.num_children.max(initial=0))


class InputGraph(_ChildLists):
    """The structure of one sample: ``children[v]`` lists v's children in gather order."""

    def __init__(self, children, sample=None):
        prefix = _sample_prefix(sample)
        if not isinstance(children, _CHILD_LISTS):
            raise GraphError(f"{prefix}children must be a list with one list of child indices "
                             f"per vertex, got {type(children).__name__} {shown(children)}")
        if len(children) == 0:
            raise GraphError(f"{prefix}an input graph needs at least one vertex, got none")
        made = native.ordered_child_lists(children)  # the common form, in one C pass
        if made is not None:
            self.child_ptr, self.child_ids, self._level, self.roots, self._num_children = made
            return
        num_vertices = len(children)
        if set(map(type, children)) <= set(_CHILD_LISTS):  # checked in bulk
            flat = list(itertools.chain.from_iterable(children))
            if set(map(type, flat)) <= _INDEX_TYPES:
                try:
                    child_ids = np.array(flat, dtype=np.int64)
                except OverflowError:  # (2**70: the loop below says which vertex)
                    pass
                else:
                    counts = np.fromiter(map(len, children), np.int64, num_vertices)
                    self._init_csr(counts, child_ids, prefix, _ordered_levels(children))
                    return
        flat = []
        for v, kids in enumerate(children):
            if not isinstance(kids, _CHILD_LISTS):
                raise GraphError(f"{prefix}vertex {v}: its children must be a list of vertex "
                                 f"indices ([] for a leaf), got {type(kids).__name__} "
                                 f"{shown(kids)}")
            for c in kids:
                if not is_integer(c):
                    raise GraphError(f"{prefix}vertex {v}: child {shown(c)} is not an integer "
                                     f"vertex index")
                if not 0 <= c < num_vertices:  # (before NumPy: 2**70 has no int64)
                    raise GraphError(f"{prefix}vertex {v}: child index {c} is out of range for "
                                     f"a graph of {num_vertices} vertices (valid: 0.."
                                     f"{num_vertices - 1})")
            flat.extend(kids)
        counts = np.fromiter((len(c) for c in children), dtype=np.int64, count=num_vertices)
        child_ids = np.asarray(flat, dtype=np.int64)
        self._init_csr(counts, child_ids, prefix)

    @classmethod
    def _from_csr(cls, counts, child_ids, sample=None, level=None):
        graph = cls.__new__(cls)
        graph._init_csr(np.asarray(counts, np.int64), np.asarray(child_ids, np.int64),
                        _sample_prefix(sample), level)
        return graph

    def _init_csr(self, counts, child_ids, prefix, level=None):
        """``level``: the vertices' levels where the caller found every child before its
        parent (so in range, and no cycle); else the ranges are checked here."""
        num_vertices = len(counts)
        self.child_ptr = np.zeros(num_vertices + 1, dtype=np.int64)
        np.cumsum(counts, out=self.child_ptr[1:])
        self.child_ids = child_ids
        self._level = None  # made once: here, by levels() or by the first batch holding it
        if level is None:
            owner = np.repeat(np.arange(num_vertices), counts)
            bad = (child_ids < 0) | (child_ids >= num_vertices)
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise GraphError(f"{prefix}vertex {int(owner[e])}: child index "
                                 f"{int(child_ids[e])} is out of range for a graph of "
                                 f"{num_vertices} vertices (valid: 0..{num_vertices - 1})")
            # Children numbered before parents cannot make a cycle; otherwise the levels
            # prove there is none (and are kept).
            if not (child_ids < owner).all():
                level = _levels(self.child_ptr, child_ids, prefix)
        if level is not None:
            self._set_levels(level)
        has_parent = np.zeros(num_vertices, dtype=bool)
        has_parent[child_ids] = True
        self.roots = np.flatnonzero(~has_parent)
        # An input graph is a value: its arrays are read-only, so what is derived from them
        # (its child counts, its levels) is computed once and reused by every batch.
        self._num_children = np.array(counts, dtype=np.int64)
        for array in (self.child_ptr, self.child_ids, self.roots, self._num_children):
            array.flags.writeable = False

    # --- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_parents(cls, parents, sample=None):
        """A tree from a parent array (-1 for a root); children are ordered by vertex id."""
        parents = np.asarray(parents)
        if parents.ndim != 1 or parents.size == 0:
            raise GraphError(f"{_sample_prefix(sample)}a parent array must be a non-empty 1-D "
                             f"array, got shape {parents.shape}")
        if parents.dtype.kind not in "iu":
            raise GraphError(f"{_sample_prefix(sample)}parents must be integers, got dtype "
                             f"{parents.dtype}")
        n = parents.size
        bad = (parents < -1) | (parents >= n)
        if bad.any():
            v = int(np.flatnonzero(bad)[0])
            raise GraphError(f"{_sample_prefix(sample)}vertex {v}: parent {int(parents[v])} is "
                             f"out of range (valid: -1 for a root, 0..{n - 1})")
        child = np.flatnonzero(parents >= 0)
        parent = parents[child].astype(np.int64)
        order = np.lexsort((child, parent))  # group by parent, children in id order
        counts = np.bincount(parent, minlength=n)
        return cls._from_csr(counts, child[order], sample)

    @classmethod
    def chain(cls, n):
        """A chain of ``n`` vertices: vertex i's only child is i - 1 (vertex 0 is the first)."""
        if not is_integer(n) or n < 1:
            raise GraphError(f"a chain needs at least one vertex: n must be an integer >= 1, "
                             f"got {shown(n)}")
        counts = np.ones(n, dtype=np.int64)
        counts[0] = 0
        return cls._from_csr(counts, np.arange(n - 1), level=np.arange(n))

    @classmethod
    def complete_binary(cls, leaves):
        """A complete binary tree over ``leaves`` leaves (a power of two): leaves first, root last."""
        if not is_integer(leaves) or leaves < 1 or leaves & (leaves - 1):
            raise GraphError(f"a complete binary tree needs a power-of-two number of leaves, "
                             f"got {leaves}")
        n = 2 * leaves - 1
        counts = np.zeros(n, dtype=np.int64)
        counts[leaves:] = 2
        # Vertex leaves + j joins the pair (2j, 2j+1) of the layer below, layer by layer.
        layers = leaves.bit_length()
        level = np.repeat(np.arange(layers), [leaves >> t for t in range(layers)])
        return cls._from_csr(counts, np.arange(n - 1), level=level)

    # --- views ----------------------------------------------------------------------------------
    @property
    def num_vertices(self):
        return len(self.child_ptr) - 1

    def children(self, v):
        return self.child_ids[self.child_ptr[v]:self.child_ptr[v + 1]].tolist()

    @property
    def num_children(self):
        return self._num_children

    def levels(self):
        if self._level is None:
            self._set_levels(_levels(self.child_ptr, self.child_ids, ""))
        return self._level

    def _set_levels(self, level):
        level.flags.writeable = False
        self._level = level

    def height(self):
        return int(self.levels().max())

    def __repr__(self):
        return (f"InputGraph({self.num_vertices} vertices, {len(self.roots)} root(s), "
                f"max arity {self.max_arity})")


def _ordered_levels(children):
    """The levels of child lists in which every child precedes its parent (parsed trees,
    chains): one pass in vertex order. None where a child does not (or is negative)."""
    level = [0] * len(children)
    for v, kids in enumerate(children):
        top = -1
        for c in kids:
            if not 0 <= c < v:
                return None
            if level[c] > top:
                top = level[c]
        level[v] = top + 1
    return np.array(level, dtype=np.int64)


def _levels(child_ptr, child_ids, prefix=""):
    """level[v] = 0 for a leaf, else 1 + max over children: a frontier loop over CSR arrays
    (Kahn's algorithm from the leaves up), one NumPy pass per level, no per-vertex Python."""
    n = len(child_ptr) - 1
    counts = np.diff(child_ptr)
    owner = np.repeat(np.arange(n), counts)
    # Parents of each vertex, as CSR over the child side.
    by_child = np.argsort(child_ids, kind="stable")
    parent_ids = owner[by_child]
    parent_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(child_ids, minlength=n), out=parent_ptr[1:])

    remaining = counts.copy()
    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(remaining == 0)
    t = 0
    while frontier.size:
        level[frontier] = t
        starts, stops = parent_ptr[frontier], parent_ptr[frontier + 1]
        sizes = stops - starts
        if not sizes.any():
            break
        # All parent slots of the frontier in one gather: ranges concatenated with repeat.
        slots = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
        parents = parent_ids[slots]
        np.subtract.at(remaining, parents, 1)
        candidates = np.unique(parents)
        frontier = candidates[remaining[candidates] == 0]
        t += 1
    if (level < 0).any():
        raise GraphError(f"{prefix}the graph has a cycle through vertex {_vertex_on_cycle(level, child_ptr, child_ids)}")
    return level


def _vertex_on_cycle(level, child_ptr, child_ids):
    """Walk unlevelled children from an unlevelled vertex until a vertex repeats."""
    v = int(np.flatnonzero(level < 0)[0])
    seen = set()
    while v not in seen:
        seen.add(v)
        kids = child_ids[child_ptr[v]:child_ptr[v + 1]]
        v = int(kids[level[kids] < 0][0])
    return v


class GraphBatch(_ChildLists):
    """Many input graphs as one: global vertex ids are the graphs' ids shifted by ``offsets``.

    Schedule (computed once per batch, vectorised):
      ``level[v]``, ``num_levels``, ``order`` (the vertices in level order: row r of every
      dynamic tensor belongs to vertex ``order[r]``), ``row_of[v]`` (the inverse),
      ``level_offsets`` (task t owns rows level_offsets[t]:level_offsets[t+1]), and the edge
      list sorted by parent row (``edge_parent_row``, ``edge_child_row``, ``edge_slot``,
      ``edge_level_offsets``). Every array is sized by the vertices or by the edges, never by
      vertices × arity: ``child_rows_of(k)`` (for each row, the row of its child k, or -1) is
      made on demand, for the slots a vertex function gathers.

    A batch of the same graph structures, in the same order, as one of the last 16 (of up to
    2**20 vertices together: :class:`_RecentSchedules`) shares its schedule (read-only arrays)
    and its device index arrays: the same trees in a later epoch, a fixed evaluation set,
    identical generated trees.
    """

    def __init__(self, graphs):
        started = time.perf_counter()
        if isinstance(graphs, InputGraph) or not hasattr(graphs, "__iter__"):
            raise GraphError(f"a GraphBatch is made from a list of InputGraphs, got "
                             f"{type(graphs).__name__}")
        graphs = list(graphs)
        if not graphs:
            raise GraphError("a GraphBatch needs at least one input graph")
        for i, g in enumerate(graphs):
            if not isinstance(g, InputGraph):
                raise GraphError(f"sample {i}: expected an InputGraph, got {type(g).__name__}")
        self.graphs = graphs
        # A batch of the same structures as a recent one (the same trees again, a fixed
        # evaluation set, identical generated trees) shares its schedule and device indices.
        key = tuple(map(_structure_of, graphs))
        shared = _SCHEDULES.get(key)
        if shared is None:
            self._build()
            shared = {name: getattr(self, name) for name in _SCHEDULE_FIELDS}
            _SCHEDULES.put(key, shared, self.num_vertices)
        else:
            self.__dict__.update(shared)
        self.build_seconds = time.perf_counter() - started  # concatenation + scheduling

    def _build(self):
        graphs = self.graphs
        made = native.batch_schedule(graphs)  # (where every graph has its levels: in one C pass)
        if made is not None:
            self.__dict__.update(made)
            self._child_rows, self._indices = {}, {}
            return
        sizes = np.array([g.num_vertices for g in graphs], dtype=np.int64)
        self.offsets = np.zeros(len(graphs) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        n = int(self.offsets[-1])
        counts = np.concatenate([g.num_children for g in graphs])
        edge_sizes = np.array([len(g.child_ids) for g in graphs], dtype=np.int64)
        shift = np.repeat(self.offsets[:-1], edge_sizes)
        self.child_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=self.child_ptr[1:])
        self.child_ids = np.concatenate([g.child_ids for g in graphs]) + shift
        self.roots = np.concatenate([g.roots + o for g, o in zip(graphs, self.offsets[:-1])])
        self.sample_of = np.repeat(np.arange(len(graphs)), sizes)
        self._schedule()
        self._indices = {}  # array module name -> BatchIndices (see indices())
        for name in _SCHEDULE_FIELDS:  # (shared by the batches of these structures)
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False

    @property
    def num_vertices(self):
        return int(self.offsets[-1])

    @property
    def num_graphs(self):
        return len(self.graphs)

    def _schedule(self):
        n = self.num_vertices
        # Levels are a property of each graph: the graphs' own when they all have them (a
        # dataset's graphs meet again every epoch), else computed for the batch at once and
        # kept by each graph.
        known = [getattr(g, "_level", None) for g in self.graphs]
        if all(level is not None for level in known):
            self.level = np.concatenate(known)
        else:
            self.level = _levels(self.child_ptr, self.child_ids)
            for g, lo, hi in zip(self.graphs, self.offsets[:-1], self.offsets[1:]):
                if getattr(g, "_level", None) is None:
                    g._set_levels(self.level[lo:hi].copy())
        self.num_levels = int(self.level.max()) + 1
        self.order = np.argsort(self.level, kind="stable")
        self.row_of = np.empty(n, dtype=np.int64)
        self.row_of[self.order] = np.arange(n)
        self.level_offsets = np.zeros(self.num_levels + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.level, minlength=self.num_levels), out=self.level_offsets[1:])

        # Edges in row order of their parents: each task's edges are one contiguous block.
        self.edge_parent_row, self.edge_child_row, self.edge_slot = self.edges_by_row(self.row_of)
        self.edge_level_offsets = np.searchsorted(self.edge_parent_row, self.level_offsets)
        # Parent row relative to its task's first row (what a per-level edge sum needs).
        self.edge_parent_local = self.edge_parent_row - self.level_offsets[
            self.level[self.order[self.edge_parent_row]]]

        # In a forest every vertex has at most one parent, so within a task no two gathers
        # write the same child's gradient row and a plain indexed add is safe.
        self.is_forest = bool(np.bincount(self.child_ids, minlength=n).max(initial=0) <= 1)
        self._child_rows = {}

    def edges_by_row(self, row_of):
        """``(parent row, child row, slot)`` of every edge, sorted by parent row (stably), for
        the rows ``row_of`` gives the vertices."""
        counts = self.num_children
        parent = row_of[np.repeat(np.arange(len(counts)), counts)]
        slot = np.arange(len(self.child_ids)) - np.repeat(self.child_ptr[:-1], counts)
        by_row = np.argsort(parent, kind="stable")
        return parent[by_row], row_of[self.child_ids][by_row], slot[by_row]

    def child_rows_of(self, k):
        """For each row, the row of its child ``k``, or -1 where it has none (made once)."""
        rows = self._child_rows.get(k)
        if rows is None:
            rows = np.full(self.num_vertices, -1, dtype=np.int64)
            has_k = self.edge_slot == k
            rows[self.edge_parent_row[has_k]] = self.edge_child_row[has_k]
            rows.flags.writeable = False  # (shared by the batches of these structures)
            self._child_rows[k] = rows
        return rows

    def indices(self, xp=np):
        """The schedule as the runtime reads it on array module ``xp`` (:class:`BatchIndices`),
        built once per batch and device: on CuPy the index arrays are int32, what the row
        kernels take."""
        bundle = self._indices.get(xp.__name__)
        if bundle is None:
            bundle = self._indices[xp.__name__] = BatchIndices(self, xp)
        return bundle

    def rows_of_level(self, t):
        return int(self.level_offsets[t]), int(self.level_offsets[t + 1])

    def check_arity(self, arity, function_name="the vertex function"):
        """Every vertex has at most ``arity`` children, else an error naming sample and vertex."""
        too_many = np.flatnonzero(self.num_children > arity)
        if too_many.size:
            v = int(too_many[0])
            s = int(self.sample_of[v])
            raise GraphError(f"sample {s}, vertex {v - int(self.offsets[s])}: has "
                             f"{int(self.num_children[v])} children, but {function_name} "
                             f"declares arity {arity}")

    def to_dot(self):
        """The level schedule as Graphviz DOT text: each graph a cluster, each vertex labelled
        ``sample:vertex`` and with its row in the dynamic tensors, edges from child to parent
        (the way states flow), the vertices of one batching task on one rank, coloured by
        level, with a legend giving each task's rows. Render with ``dot -Tsvg``."""
        palette = ["#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9"]
        lines = ["digraph batch {", "  rankdir=BT; newrank=true;",
                 '  node [shape=circle, style=filled, fontname="Helvetica", fontsize=9,'
                 " width=0.45, fixedsize=true];", '  edge [color="#555555", arrowsize=0.5];']
        for s in range(self.num_graphs):
            lines.append(f'  subgraph cluster_{s} {{ label="sample {s}"; fontsize=10; '
                         'color="#999999";')
            for v in range(int(self.offsets[s]), int(self.offsets[s + 1])):
                colour = palette[int(self.level[v]) % len(palette)]
                lines.append(f'    v{v} [label="{s}:{v - int(self.offsets[s])}\\nrow '
                             f'{int(self.row_of[v])}", fillcolor="{colour}"];')
            lines.append("  }")
        for v in range(self.num_vertices):
            for child in self.child_ids[self.child_ptr[v]:self.child_ptr[v + 1]]:
                lines.append(f"  v{int(child)} -> v{v};")
        lines.append('  node [shape=box, fixedsize=false, fontsize=9];')
        for t in range(self.num_levels):
            r0, r1 = self.rows_of_level(t)
            colour = palette[t % len(palette)]
            lines.append(f'  task{t} [label="task {t}: level {t}\\nrows {r0}..{r1 - 1}", '
                         f'fillcolor="{colour}"];')
            members = " ".join(f"v{int(v)};" for v in self.order[r0:r1])
            lines.append(f"  {{ rank=same; task{t}; {members} }}")
        for t in range(self.num_levels - 1):
            lines.append(f"  task{t} -> task{t + 1} [style=invis];")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"GraphBatch({self.num_graphs} graphs, {self.num_vertices} vertices, "
                f"{self.num_levels} levels)")


_SCHEDULE_FIELDS = ("offsets", "child_ptr", "child_ids", "roots", "sample_of", "level",
                    "num_levels", "order", "row_of", "level_offsets", "edge_parent_row",
                    "edge_child_row", "edge_slot", "edge_level_offsets", "edge_parent_local",
                    "is_forest", "_child_rows", "_indices")


class _Structure:
    """One graph structure (its CSR arrays' bytes), shared by the InputGraphs that have it."""


_STRUCTURES = weakref.WeakValueDictionary()  # the CSR arrays' bytes -> their _Structure
_STRUCTURES_LOCK = threading.Lock()


def _structure_of(graph):
    """The :class:`_Structure` of ``graph``, found once per graph (its arrays are read-only)."""
    found = graph.__dict__.get("_structure")
    if found is None:
        key = (graph.child_ptr.tobytes(), graph.child_ids.tobytes())
        with _STRUCTURES_LOCK:
            found = _STRUCTURES.get(key)
            if found is None:
                found = _STRUCTURES[key] = _Structure()
        graph._structure = found
    return found


class _RecentSchedules:
    """The schedules of the last :attr:`size` batch structures (a sequence of graph
    structures) of at most :attr:`vertices` vertices together (a schedule holds about 150
    bytes a vertex on the host, a device's indices about 30 more), least recently used
    dropped first; thread-safe."""

    size = 16
    vertices = 1 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._schedules = collections.OrderedDict()  # key -> (schedule, its vertices)
        self._held = 0

    def get(self, key):
        with self._lock:
            found = self._schedules.get(key)
            if found is None:
                return None
            self._schedules.move_to_end(key)
            return found[0]

    def put(self, key, schedule, vertices):
        if vertices > self.vertices:
            return
        with self._lock:
            if key in self._schedules:
                return
            self._schedules[key] = (schedule, vertices)
            self._held += vertices
            while len(self._schedules) > self.size or self._held > self.vertices:
                self._held -= self._schedules.popitem(last=False)[1][1]

    def clear(self):
        with self._lock:
            self._schedules.clear()
            self._held = 0


_SCHEDULES = _RecentSchedules()


def _as_slice(rows):
    """``rows`` (non-negative, increasing by one constant step) as a slice, else None."""
    if rows is None or rows.size == 0 or rows[0] < 0:
        return None
    if rows.size == 1:
        return slice(int(rows[0]), int(rows[0]) + 1)
    step = int(rows[1] - rows[0])
    if step <= 0 or not (np.diff(rows) == step).all():
        return None
    return slice(int(rows[0]), int(rows[-1]) + 1, step)


class BatchIndices:
    """A batch's schedule on one array module, in the form the interpreter reads per level.

    Host side: the rows of each level (``vertices(t)``, ``edges(t)``), whether a level has
    child k at all (``has_child``), the hull of the rows that have child k (``hull``), and per
    level an evenly spaced run of child rows as a slice (``strided``; complete trees, chains).
    Device side (int64 on NumPy, int32 on CuPy): ``order`` (level order -> the caller's vertex
    order), ``row_of`` (its inverse), each slot's child rows (-1: absent; a take reads the spare
    zero row; on NumPy made when a program first reads the slot), the edge lists; on CuPy all
    of them in one copy. ``vertex_name`` and ``edge_name`` say which sample and vertex a row
    is, for messages."""

    def __init__(self, batch, xp):
        if xp is not np and max(batch.num_vertices + 1, len(batch.edge_child_row)) >= 2**31:
            raise GraphError(f"a batch of {batch.num_vertices} vertices and "
                             f"{len(batch.edge_child_row)} edges has rows past the int32 indices "
                             f"of the GPU row kernels (2**31 - 1); split it into smaller batches")
        put = self._put = (lambda a: a) if xp is np else (
            lambda a: xp.asarray(a.astype(np.int32)))
        children = []
        if xp is not np:  # one host->device copy for the batch's index arrays, not one each
            children = [batch.child_rows_of(k) for k in range(batch.max_arity)]
            put = _Uploaded(xp, [batch.order, batch.row_of, batch.edge_child_row,
                                 batch.edge_parent_row, batch.edge_parent_local, *children])
        self._batch = batch
        self.num_levels = batch.num_levels
        self.num_vertices = batch.num_vertices
        self.num_edges = len(batch.edge_child_row)
        self.is_forest = batch.is_forest
        offsets, edge_offsets = batch.level_offsets.tolist(), batch.edge_level_offsets.tolist()
        self._vertices = list(zip(offsets[:-1], offsets[1:]))
        self.widest = max((hi - lo for lo, hi in self._vertices), default=0)  # (rows of a level)
        self.level_offsets = batch.level_offsets  # host side: the native loop reads it
        self.edge_level_offsets = batch.edge_level_offsets
        self._edges = list(zip(edge_offsets[:-1], edge_offsets[1:]))
        self.order = put(batch.order)
        self.row_of = None if batch.row_of is None else put(batch.row_of)  # (a kind's: None)
        self.edge_child_row = put(batch.edge_child_row)
        self.edge_parent_row = put(batch.edge_parent_row)
        self.edge_parent_local = put(batch.edge_parent_local)
        self._slots = {}  # child slot k -> _Slot, made when a program first reads slot k
        self._in_order = {}  # arity -> children_in_order
        for k, rows in enumerate(children):
            self._slots[k] = _Slot(rows, self._vertices, put)

    def _slot(self, k):
        slot = self._slots.get(k)
        if slot is None:
            slot = self._slots[k] = _Slot(self._batch.child_rows_of(k), self._vertices,
                                          self._put)
        return slot

    def vertex_name(self, row):
        """``"sample s, vertex v"`` for the vertex of batch row ``row`` (level order)."""
        batch = self._batch
        v = int(batch.order[row])
        s = int(batch.sample_of[v])
        return f"sample {s}, vertex {v - int(batch.offsets[s])}"

    def edge_name(self, edge):
        """The vertex names of edge ``edge`` (rows sorted by parent): parent, then child."""
        batch = self._batch
        parent = self.vertex_name(int(batch.edge_parent_row[edge]))
        child = self.vertex_name(int(batch.edge_child_row[edge])).split(", ")[1]
        return f"{parent}'s edge to its child {child}"

    def size(self, rows):
        """The number of rows of a buffer: ``"V"`` vertices or ``"E"`` edges."""
        return self.num_vertices if rows == "V" else self.num_edges

    def vertices(self, t):
        return self._vertices[t]

    def edges(self, t):
        return self._edges[t]

    def level_windows(self, domain):
        """Every level's ``(lo, hi)`` rows in ``domain`` (``"vertex"`` or ``"edge"``), in order: a
        list the caller only reads."""
        return self._vertices if domain == "vertex" else self._edges

    def has_child(self, slot, t):
        if slot == "edges":
            e0, e1 = self._edges[t]
            return e1 > e0
        return self._slot(slot).has[t]

    def has_child_levels(self, slot):
        """Per level, whether any vertex of it has child ``slot`` (any edge, for ``"edges"``):
        a list of bools."""
        if slot == "edges":
            return [e1 > e0 for e0, e1 in self._edges]
        return self._slot(slot).has

    def hull(self, slot):
        """Rows outside which no vertex has child ``slot`` (all edges for ``"edges"``)."""
        if slot == "edges":
            return (0, self.num_edges)
        return self._slot(slot).hull

    def strided(self, slot, t):
        return self._slot(slot).strided[t]

    def slot_rows(self, slot):
        """Each row's child ``slot`` row, all levels (-1: absent)."""
        return self._slot(slot).rows

    def children_in_order(self, arity):
        """The first row with children where every vertex from it on has ``arity`` children and
        they are the rows from 0 in order — row r's child k is row ``arity (r - first) + k`` —
        and no vertex before it has any (complete trees by levels): the children of a level are
        one block of rows, ``arity`` to a parent. Else None."""
        found = self._in_order.get(arity, False)
        if found is False:
            found = self._in_order[arity] = self._children_in_order(arity)
        return found

    def _children_in_order(self, arity):
        n = self.num_vertices
        first = int((self._batch.child_rows_of(0) < 0).sum()) if n else 0
        if not 1 <= arity <= self._batch.max_arity or first >= n or arity * (n - first) > n:
            return None  # (a slot no vertex has: not every vertex from first has arity children)
        expect = np.arange(n - first, dtype=np.int64) * arity
        for k in range(self._batch.max_arity):
            rows = self._batch.child_rows_of(k)
            if k >= arity:
                if (rows >= 0).any():
                    return None
            elif (rows[:first] >= 0).any() or not np.array_equal(rows[first:], expect + k):
                return None
        return first

    def child_rows(self, slot, window):
        """The rows of each vertex's child ``slot`` on a level (or of each edge's child)."""
        if slot == "edges":
            return self.edge_child_row[window["edge"][0]:window["edge"][1]]
        return self._slot(slot).rows[window["vertex"][0]:window["vertex"][1]]


class _Uploaded:
    """Host index arrays sent to the device in one copy (int32, side by side); called with one
    of them, its view there (None for None)."""

    def __init__(self, xp, arrays):
        present = [a for a in arrays if a is not None]
        sizes = np.cumsum([0] + [a.size for a in present])
        block = xp.asarray(np.concatenate(present).astype(np.int32)) if present else None
        self._views = {id(a): block[lo:hi] for a, lo, hi in zip(present, sizes[:-1], sizes[1:])}

    def __call__(self, array):
        return None if array is None else self._views[id(array)]


class _Slot:
    """Child slot k of a batch on one array module: each row's child-k row on the device
    (-1: absent), and per level whether any vertex has child k and an evenly spaced run of
    child rows as a slice; ``hull``: the rows outside which no vertex has child k."""

    def __init__(self, rows, levels, put):
        present = rows >= 0
        where = np.flatnonzero(present)
        self.hull = (int(where[0]), int(where[-1]) + 1) if where.size else (0, 0)
        starts = np.fromiter((r0 for r0, _ in levels), dtype=np.int64, count=len(levels))
        # (every level has a row: reduceat sums each level's rows in one pass)
        self.has = (np.add.reduceat(present, starts) > 0).tolist() if len(levels) else []
        self._levels, self._host = levels, rows
        self.rows = put(rows)

    @functools.cached_property
    def strided(self):  # (the interpreter's: made when it first asks)
        return [_as_slice(self._host[r0:r1]) for r0, r1 in self._levels]
