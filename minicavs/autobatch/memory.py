"""Memory for the slabs, kept from one forced segment to the next (DyNet's preallocated pools).

A training loop opens a scope per mini-batch, and every step's segment needs tens of MB of
slabs and as much again of gradient slabs. Memory the process has not touched before costs a
page fault per page on first write — on these virtual machines 2.5 µs per 4 kB page, and 5–95
ms a step for the BiLSTM tagger's 66 MB (measured) — while memory reused from the previous
step costs nothing. So a segment's slabs are carved from one *block*, and the blocks of
earlier steps are handed out again.

A block is handed out again only once nothing references it: every slab is a view of its
block, and a NumPy view (of a view, of a row, …) holds a reference to the array that owns the
memory, so a block whose only reference is the pool's own list is free. A value a user keeps
from an earlier step (``loss.numpy()`` returns a row of a slab) keeps its block out of the pool
for as long as it lives: it is never overwritten. CuPy arrays come from CuPy's own pool.
"""

import sys
import threading

import numpy as np

from ..errors import OutOfMemoryError

_ALIGN = 64  # bytes: every slab starts on a cache line (and a SIMD-aligned address)
_MAX_BLOCKS = 6  # blocks held at most: a step needs two (values, gradients)

_blocks = []  # 1-D uint8 arrays, owned by this module
_lock = threading.Lock()  # (a block is free until its first view exists: one taker at a time)


def _unused(i):
    # References: the list's own and getrefcount's argument; any slab or row view adds one.
    return sys.getrefcount(_blocks[i]) == 2


def _block(nbytes):
    """A block of at least ``nbytes`` that nothing references: the smallest free one that
    fits, else a new one (replacing a free block too small, while the pool is full)."""
    best = None
    for i in range(len(_blocks)):
        size = _blocks[i].nbytes
        if size >= nbytes and _unused(i) and (best is None or size < _blocks[best].nbytes):
            best = i
    if best is not None:
        return _blocks[best]
    block = _allocate(nbytes)
    if len(_blocks) >= _MAX_BLOCKS:
        small = [i for i in range(len(_blocks)) if _unused(i)]
        if not small:
            return block  # every block in use (values kept alive): not pooled
        del _blocks[min(small, key=lambda i: _blocks[i].nbytes)]
    _blocks.append(block)
    return block


def _allocate(nbytes):
    """A new block with room to grow a little; where that fails, the free blocks go back first
    and exactly ``nbytes`` is tried, then :class:`OutOfMemoryError` says how much."""
    for size in (nbytes + nbytes // 8, nbytes):
        try:
            return np.empty(size, dtype=np.uint8)
        except MemoryError:
            for i in reversed(range(len(_blocks))):
                if _unused(i):
                    del _blocks[i]
    raise OutOfMemoryError(f"mc.autobatch: cannot allocate {nbytes / 2**20:.1f} MB for the "
                           f"values of a forced segment (its slabs, or their gradients); "
                           f"record fewer samples per block, or force values earlier")


def arrays(xp, specs, zero=False):
    """Arrays of ``specs`` ((shape, dtype) each) carved from one pooled block (NumPy; CuPy:
    ``xp.empty``/``xp.zeros`` each). ``zero``: filled with zeros."""
    if xp is not np:
        make = xp.zeros if zero else xp.empty
        return [make(shape, dtype) for shape, dtype in specs]
    offsets, end = [], 0
    for shape, dtype in specs:
        offsets.append(end)
        end += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    with _lock:
        block = _block(end + _ALIGN)
        skew = -block.ctypes.data % _ALIGN
        views = [block[skew + o:skew + o + int(np.prod(shape)) * np.dtype(dtype).itemsize]
                 .view(dtype).reshape(shape) for o, (shape, dtype) in zip(offsets, specs)]
    if zero:
        block[skew:skew + end].fill(0)
    return views


def release():
    """Give the free blocks back (to the allocator); blocks still in use stay until their
    values are gone."""
    with _lock:
        for i in reversed(range(len(_blocks))):
            if _unused(i):
                del _blocks[i]
