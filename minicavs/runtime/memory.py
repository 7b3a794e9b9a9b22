"""Memory: what one call of a vertex function needs for a batch, the budget it must fit in, and
what happens when it does not.

A call's memory is linear in the batch's sizes, and the Programs say exactly how: every
per-row value of an eager or lazy instruction and every batch buffer has one row per vertex
(or edge) of the batch; every other per-row value of the core lives for one level, so its rows
are those of the largest level. :class:`CallModel` adds these up once per vertex function, as
bytes per vertex, per edge and per row of the largest level, for F, for ∂F and for what F keeps
for ∂F.

Before a call, :func:`plan` compares the batch's need with the **memory budget**: by default
90 % of the memory available when the first call is made (``backend.available_memory``: free
RAM, a cgroup or ``ulimit -v`` limit; a GPU's free memory), or what ``mc.set_memory_budget``
or the environment variable ``MINICAVS_MEMORY_BUDGET`` (``"8G"``, ``"512M"``, bytes) says. A
batch that does not fit is cut into sub-batches of whole graphs that do: their outputs are
the batch's rows, in order, and their gradients add up to the batch's. A batch that cannot be
cut small enough (one graph alone does not fit, or — when training — what all sub-batches keep
for backward does not) is refused before anything is allocated, with an
:class:`~minicavs.errors.OutOfMemoryError` naming the batch's sizes and what to reduce; so is
an allocation that fails anyway (:func:`out_of_memory`).
"""

import os
import re
import sys
import threading
from dataclasses import dataclass

import numpy as np

from .. import backend
from ..errors import ArgumentError, OutOfMemoryError
from ..ops.batching import instantiate, row_domain
from ..ops.registry import describe
from .program import Compute, Gather

_HEADROOM = 0.9  # of the available memory: NumPy's temporaries inside a step are not counted
_budget = None  # bytes, set by set_memory_budget; None: the environment, else the default
_default = {}  # device -> the default budget, measured at the first call


def parse_size(size, what="memory budget"):
    """Bytes from an int or a string such as ``"8G"``, ``"512MB"``, ``"1.5 GiB"``, ``"2000"``."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool) and size > 0:
        return int(size)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*", str(size).lower())
    scale = 1024 ** " kmgt".index(match.group(2) or " ") if match else 0
    if match is None or float(match.group(1)) * scale < 1:  # "0.5": not even one byte
        raise ArgumentError(f"{what}: expected a positive number of bytes (at least 1) or a "
                            f"size such as '8G' or '512M', got {size!r}")
    return int(float(match.group(1)) * scale)


def set_memory_budget(size):
    """The most memory one vertex-function call may use: bytes, or a string like ``"8G"``;
    ``None`` restores the default (``MINICAVS_MEMORY_BUDGET``, else 90 % of the memory
    available at the first call). Batches that need more are split into sub-batches."""
    global _budget
    _budget = None if size is None else parse_size(size)


def memory_budget(device=None):
    """The budget in bytes on ``device`` (default: the current one)."""
    if _budget is not None:
        return _budget
    if os.environ.get("MINICAVS_MEMORY_BUDGET"):
        return parse_size(os.environ["MINICAVS_MEMORY_BUDGET"],
                          "environment variable MINICAVS_MEMORY_BUDGET")
    device = device or backend.get_device()
    if device not in _default:
        available = backend.available_memory(device)
        _default[device] = int(available * _HEADROOM) if available else 1 << 62
    return _default[device]


def text(nbytes):
    """``nbytes`` as a person reads it: ``512.0 MB``, ``7.8 GB``."""
    for unit in ("bytes", "kB", "MB", "GB"):
        if abs(nbytes) < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TB"


# --- what a call needs -------------------------------------------------------------------------

@dataclass(frozen=True)
class Linear:
    """Bytes as ``per_vertex * V + per_edge * E + per_level_vertex * (the largest level's
    vertices) + per_level_edge * (its edges) + fixed``."""

    per_vertex: int = 0
    per_edge: int = 0
    per_level_vertex: int = 0
    per_level_edge: int = 0
    fixed: int = 0

    def __add__(self, other):
        return Linear(*(a + b for a, b in zip(self._fields(), other._fields())))

    def _fields(self):
        return (self.per_vertex, self.per_edge, self.per_level_vertex, self.per_level_edge,
                self.fixed)

    def at(self, sizes):
        v, e, level_v, level_e = sizes
        return (self.per_vertex * v + self.per_edge * e + self.per_level_vertex * level_v
                + self.per_level_edge * level_e + self.fixed)


def _whole(symbol, spare=0):
    """The bytes of ``symbol`` over all rows of a batch (plus ``spare`` rows)."""
    return _linear(symbol.shape, symbol.dtype, spare)


def _per_level(symbol):
    whole = _whole(symbol)
    return Linear(0, 0, whole.per_vertex, whole.per_edge, whole.fixed)


def _linear(shape, dtype, spare=0):
    itemsize = np.dtype(dtype).itemsize

    def size(v, e):
        return int(np.prod(instantiate(tuple(shape), v, e), dtype=np.int64)) * itemsize

    fixed = size(0, 0)
    per_vertex, per_edge = size(1, 0) - fixed, size(0, 1) - fixed
    row = per_vertex if row_domain(shape) == "vertex" else per_edge
    return Linear(per_vertex, per_edge, 0, 0, fixed + spare * row)


def _buffer_bytes(program):
    """The bytes of ``program``'s batch buffers (spare rows included)."""
    nodes = {n.key: n for n in program.graph.nodes}
    total = Linear()
    for b in program.buffers:
        total += _whole(nodes[b.key], b.spare)
    return total


def _program_needs(program, exclude=()):
    """The bytes one run of ``program`` allocates: its batch buffers, the per-row values of
    its eager and lazy phases, and one level's worth of the other core values."""
    counted = {x.key for x in exclude} | {b.key for b in program.buffers} | {
        part.key for part, *_ in program.aliases}
    total = _buffer_bytes(program)
    for ins in program.eager + program.lazy:
        for o in ins.writes:
            if o.key not in counted and row_domain(o.shape):
                total += _whole(o)
                counted.add(o.key)
    return total + _level_values(program, counted)


def _level_values(program, counted=None):
    """One level's worth of the core values without a buffer."""
    counted = {b.key for b in program.buffers} | {part.key for part, *_ in program.aliases} \
        if counted is None else counted
    total = Linear()
    for ins in program.core:
        outs = (ins.target,) if isinstance(ins, Gather) else ins.writes if isinstance(
            ins, Compute) else ()
        for o in outs:
            if o.key not in counted and row_domain(o.shape):
                total += _per_level(o)
                counted.add(o.key)
    return total


class CallModel:
    """Bytes a call of the Programs ``fwd`` (F) and ``bwd`` (∂F) needs, as :class:`Linear`
    sizes: ``forward`` (F's run, its index arrays, the pulled rows in level order and the
    result), ``kept`` (what a call holds until its backward: F's buffers, the other values ∂F
    reads, the result) and ``backward`` (∂F's run and the gradient rows)."""

    def __init__(self, fwd, bwd):
        out = fwd.graph.outputs[-1]
        slots = sum(1 for ins in fwd.core if isinstance(ins, Gather) and ins.slot != "edges")
        index_bytes = Linear(8 * slots, 0, 0, 0, 0)
        pulled = [x for x in fwd.graph.inputs if x.role == "pull"]  # (bound by role: call.py)
        pull = _whole(pulled[0]) if pulled else Linear()
        self.forward = _program_needs(fwd) + index_bytes + pull + _whole(out)
        in_buffers = fwd.buffered | {part.key for part, *_ in fwd.aliases}
        refs = {r.key: r for r in bwd.graph.forward_refs
                if r.kind != "param" and row_domain(r.shape) and r.key not in in_buffers}
        self.kept = _buffer_bytes(fwd) + _whole(out)
        for r in refs.values():
            self.kept += _whole(r)
        refs_in_bw = bwd.graph.inputs[len(bwd.graph.cotangents):]
        # (+ F's level scratch: the native loop keeps it for the next call, minicavs/cpu)
        self.backward = (_program_needs(bwd, exclude=refs_in_bw) + _whole(out)
                         + (pull if pulled and pulled[0].dtype.kind == "f" else Linear())
                         + _level_values(fwd))

    def need(self, sizes, training):
        """Peak bytes of one call on a batch of ``sizes``: F's run, and when training, what the
        call keeps plus ∂F's run."""
        forward = self.forward.at(sizes)
        if not training:
            return forward
        return max(forward, self.kept.at(sizes) + self.backward.at(sizes))


def batch_sizes(batch, first=0, stop=None):
    """``(V, E, vertices of the largest level, edges of the largest level)`` of graphs
    ``first..stop-1`` of ``batch``."""
    if first == 0 and stop is None:  # the whole batch: its schedule has the level sizes
        return (batch.num_vertices, len(batch.child_ids),
                int(np.diff(batch.level_offsets).max()),
                int(np.diff(batch.edge_level_offsets).max(initial=0)))
    stop = batch.num_graphs if stop is None else stop
    v0, v1 = int(batch.offsets[first]), int(batch.offsets[stop])
    e0, e1 = int(batch.child_ptr[v0]), int(batch.child_ptr[v1])
    levels = batch.level[v0:v1]
    edge_levels = np.repeat(levels, batch.num_children[v0:v1])
    return (v1 - v0, e1 - e0, int(np.bincount(levels).max(initial=0)),
            int(np.bincount(edge_levels).max(initial=0)) if e1 > e0 else 0)


# --- the plan ------------------------------------------------------------------------------------

def plan(f, batch, training):
    """None if a call of ``f`` on ``batch`` fits the budget; else the sub-batches to run
    instead, as ranges ``(first graph, stop)``. Raises :class:`OutOfMemoryError` when no cut
    fits. Of ``f`` (a front-end) only ``name`` and ``memory_model`` (a CallModel, or anything
    with its ``need`` and ``kept``) are read, here and in :func:`out_of_memory`."""
    model = f.memory_model
    budget = memory_budget()
    whole = batch_sizes(batch)
    need = model.need(whole, training)
    if need <= budget:
        return None
    kept = model.kept.at(whole) if training else 0  # every sub-batch's stays until backward
    room = budget - kept
    ranges, first = [], 0
    while first < batch.num_graphs:
        stop = _largest_fitting(model, batch, first, room, training)
        if stop == first:
            alone = model.need(batch_sizes(batch, first, first + 1), training)
            raise OutOfMemoryError(_refusal(f, batch, need, budget, kept, first, alone,
                                            training))
        ranges.append((first, stop))
        first = stop
    return ranges


def _largest_fitting(model, batch, first, room, training):
    """The largest ``stop`` such that graphs ``first..stop-1`` need at most ``room`` bytes
    (``first`` if not even one graph does): doubling, then bisection."""
    def fits(stop):
        return model.need(batch_sizes(batch, first, stop), training) <= room

    if room <= 0 or not fits(first + 1):
        return first
    low, step = first + 1, 1
    while low + step <= batch.num_graphs and fits(low + step):
        low += step
        step *= 2
    high = min(low + step, batch.num_graphs + 1)  # fits(low); not fits(high) unless the end
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def _describe_batch(batch):
    v, e, level_v, _ = batch_sizes(batch)
    return (f"a batch of {v:,} vertices and {e:,} edges in {batch.num_graphs:,} graph(s) "
            f"({batch.num_levels:,} levels, the largest of {level_v:,} vertices)")


_ADVICE = ("Reduce the batch size (graphs per batch), the sizes of the graphs or the state "
           "size (scatter_shape)")


def _refusal(f, batch, need, budget, kept, sample, alone, training):
    if training and kept >= budget:
        why = (f"the values its forward pass keeps for backward alone take "
               f"{text(kept)}, so no split into sub-batches fits")
    else:
        why = (f"sample {sample} alone needs {text(alone)}"
               + (f" besides the {text(kept)} the other samples keep for backward"
                  if training and kept else ""))
    return (f"vertex function {f.name!r}: {_describe_batch(batch)} needs about {text(need)}, "
            f"more than the memory budget of {text(budget)}, and {why}. {_ADVICE}; or raise "
            f"the budget (mc.set_memory_budget, MINICAVS_MEMORY_BUDGET) if more memory is "
            f"free.")


def out_of_memory(f, batch, phase, exc, training):
    """The :class:`OutOfMemoryError` for an allocation that failed during ``phase`` ("forward"
    or "backward") of a call of ``f``: what failed, the batch, what it was estimated to need,
    and what to reduce."""
    what = str(exc) or type(exc).__name__
    need = f.memory_model.need(batch_sizes(batch), training)
    return OutOfMemoryError(
        f"vertex function {f.name!r}: out of memory in the {phase} pass over "
        f"{_describe_batch(batch)}: {what}. The call needs about {text(need)} (estimated); the "
        f"memory budget is {text(memory_budget())}. {_ADVICE}; or lower the budget "
        f"(mc.set_memory_budget, MINICAVS_MEMORY_BUDGET) so that such batches are split into "
        f"sub-batches before they run.")


# --- the slabs of automatic batching --------------------------------------------------------

class SlabPool:
    """Memory for the slabs of automatic batching (``minicavs/autobatch/segment.py``), kept from
    one forced segment to the next (DyNet's preallocated pools), under the memory budget.

    A training loop opens a scope per mini-batch, and every step's segment needs tens of MB of
    slabs and as much again of gradient slabs. Memory the process has not touched before costs
    a page fault per page on first write — on these virtual machines 2.5 µs per 4 kB page, and
    5–95 ms a step for the BiLSTM tagger's 66 MB (measured) — while memory reused from the
    previous step costs nothing. So a segment's slabs are carved from one *block*, and the
    blocks of earlier steps are handed out again.

    A block is handed out again only once nothing references it: every slab is a view of its
    block, and a NumPy view (of a view, of a row, …) holds a reference to the array that owns
    the memory, so a block whose only reference is the pool's own list is free. A value a user
    keeps from an earlier step keeps its block out of the pool for as long as it lives: it is
    never overwritten. CuPy arrays come from CuPy's own pool."""

    ALIGN = 64  # bytes: every slab starts on a cache line (and a SIMD-aligned address)
    MAX_BLOCKS = 6  # blocks held at most: a step needs two (values, gradients)
    # A new block is a quarter larger than asked: mini-batches of 64 sentences or trees need
    # up to 1.23x the first one's slabs (the three tasks of the autobatch table), and a block
    # too small for the next step costs fresh pages (5-12 us each: a 9 MB block 20-26 ms on an
    # EPYC VM, where the step takes 80; with an eighth, the first measured step made two).
    GROWTH = 0.25

    def __init__(self):
        self.blocks = []  # 1-D uint8 arrays, owned by the pool
        self._lock = threading.Lock()  # (a block is free until its first view exists)

    def arrays(self, xp, specs, zero=False):
        """Arrays of ``specs`` ((shape, dtype) each) carved from one pooled block (NumPy; CuPy:
        ``xp.empty``/``xp.zeros`` each), refused beyond the memory budget. ``zero``: filled
        with zeros."""
        sizes = [-(-int(np.prod(shape)) * np.dtype(dtype).itemsize // self.ALIGN) * self.ALIGN
                 for shape, dtype in specs]
        end = sum(sizes)
        budget = memory_budget()
        if end > budget:
            raise self._refusal(end, f"more than the memory budget of {text(budget)}")
        if xp is not np:
            make = xp.zeros if zero else xp.empty
            return [make(shape, dtype) for shape, dtype in specs]
        offsets = np.cumsum([0] + sizes[:-1]).tolist()
        with self._lock:
            block = self._block(end + self.ALIGN)
            skew = -block.ctypes.data % self.ALIGN
            views = [block[skew + o:skew + o + int(np.prod(shape)) * np.dtype(dtype).itemsize]
                     .view(dtype).reshape(shape) for o, (shape, dtype) in zip(offsets, specs)]
        if zero:
            block[skew:skew + end].fill(0)
        return views

    def release(self):
        """Give the free blocks back (to the allocator); blocks still in use stay until their
        values are gone."""
        with self._lock:
            for i in reversed(range(len(self.blocks))):
                if self._unused(i):
                    del self.blocks[i]

    def _unused(self, i):
        # References: the list's own and getrefcount's argument; any slab or row view adds one.
        return sys.getrefcount(self.blocks[i]) == 2

    def _block(self, nbytes):
        """A block of at least ``nbytes`` that nothing references: the smallest free one that
        fits, else a new one (replacing a free block too small, while the pool is full)."""
        blocks, best = self.blocks, None
        for i in range(len(blocks)):
            size = blocks[i].nbytes
            if size >= nbytes and self._unused(i) and (best is None or size < blocks[best].nbytes):
                best = i
        if best is not None:
            return blocks[best]
        block = self._allocate(nbytes)
        if len(blocks) >= self.MAX_BLOCKS:
            small = [i for i in range(len(blocks)) if self._unused(i)]
            if not small:
                return block  # every block in use (values kept alive): not pooled
            del blocks[min(small, key=lambda i: blocks[i].nbytes)]
        blocks.append(block)
        return block

    def _allocate(self, nbytes):
        """A new block with room to grow (:data:`GROWTH`); where that fails, the free blocks go
        back first and exactly ``nbytes`` is tried, then :class:`OutOfMemoryError` says how
        much."""
        for size in (nbytes + int(nbytes * self.GROWTH), nbytes):
            try:
                return np.empty(size, dtype=np.uint8)
            except MemoryError:
                for i in reversed(range(len(self.blocks))):
                    if self._unused(i):
                        del self.blocks[i]
        raise self._refusal(nbytes, "which could not be allocated")

    @staticmethod
    def _refusal(nbytes, why):
        return OutOfMemoryError(
            f"mc.autobatch: a forced segment needs {text(nbytes)} for its values (its slabs, "
            f"or their gradients), {why}. Record fewer samples per block, or force values "
            f"earlier; or raise the budget (mc.set_memory_budget, MINICAVS_MEMORY_BUDGET) if "
            f"more memory is free.")


SLABS = SlabPool()  # the process's one pool of slabs


# --- the buffers of a call ----------------------------------------------------------------

class BufferPool:
    """Grow-only batch buffers, reused across calls; a set in use is never handed out twice."""

    def __init__(self):
        self._free = []

    def acquire(self, xp, specs):
        """``specs``: {key: (rows, row_shape, dtype, name)}; returns (store, {key: view of
        rows}). An allocation that fails is retried once without the free sets (their memory
        goes back first), then raises :class:`OutOfMemoryError` naming the buffer."""
        try:  # (one atomic pop: a check first, another thread could take the last set)
            store = self._free.pop()
        except IndexError:
            store = {}
        views = {}
        for key, (rows, row_shape, dtype, name) in specs.items():
            array = store.get(key)
            if (array is None or array.shape[0] < rows or array.shape[1:] != row_shape
                    or array.dtype != dtype or backend.get_array_module(array) is not xp):
                grown = 2 * array.shape[0] if array is not None and \
                    array.shape[1:] == row_shape else rows
                store[key] = None  # the old array goes before the new one is made
                array = store[key] = self._allocate(xp, (max(rows, grown),) + row_shape,
                                                    (rows,) + row_shape, dtype, name)
            views[key] = array[:rows]
        return store, views

    def _allocate(self, xp, shape, needed, dtype, name):
        for attempt in range(2):
            try:
                return xp.empty(shape if attempt == 0 else needed, dtype=dtype)
            except MemoryError:
                self._free.clear()
        nbytes = int(np.prod(needed)) * np.dtype(dtype).itemsize
        raise OutOfMemoryError(f"cannot allocate buffer {name}: {needed[0]:,} rows of "
                               f"{describe(needed[1:])} {np.dtype(dtype)}, "
                               f"{nbytes / 2**20:.1f} MB")

    def release(self, store):
        self._free.append(store)
