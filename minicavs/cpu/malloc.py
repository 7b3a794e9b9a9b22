"""Host memory: glibc's malloc told to keep freed blocks for reuse, as a caching allocator does.

A training step allocates and frees the same large temporaries every batch (gradients of an
embedding table, a product's output, a padded slice). glibc serves a block above its mmap
threshold (128 KiB at first, raised as such blocks are freed, up to 32 MiB) with a fresh
``mmap`` and returns it with ``munmap``: the next batch's block is new memory again, and
touching it costs a page fault per 4 KiB. Which blocks go that way depends on the order of
earlier frees, so two models doing the same arithmetic can differ by their allocation history
alone. Measured (Tree-LSTM, SST, 1,024 trees, 2 threads): the recursive form spent 0.83 s of an
epoch in one scatter-add whose arithmetic takes 0.1 s, and ran at 1,098 trees/s against
1,964 with the setting below; the one-cell form went from 2,210 to 2,190-2,309 (noise).

:func:`keep_freed_memory` (called when minicavs is imported) fixes the mmap threshold at
32 MiB, so blocks below it come from the heap and are reused, and raises the trim threshold to
256 MiB, so freed heap memory is not handed back to the system between batches. Peak memory
is unchanged (the same blocks are live at the peak); memory a process freed stays mapped
for reuse, as in PyTorch's and CuPy's caching allocators. Only on glibc; ``MINICAVS_MALLOC=
system`` keeps glibc's defaults.
"""

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 * 2**20
CHOICES = ("cached", "system")
state = "not set (minicavs was not imported)"  # what keep_freed_memory did, for the doctor


def keep_freed_memory():
    """Apply the setting of the module docstring; returns (and keeps in ``state``) what was
    done, for the doctor."""
    global state
    state = _apply()
    return state


def _apply():
    choice = os.environ.get("MINICAVS_MALLOC", "cached").strip().lower() or "cached"
    if choice not in CHOICES:
        from ..errors import ArgumentError

        raise ArgumentError(f"MINICAVS_MALLOC={choice!r}: expected one of {CHOICES}")
    if choice == "system":
        return "glibc defaults (MINICAVS_MALLOC=system)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the system allocator (not glibc)"
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and \
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):
        done = False
    return ("glibc, freed blocks below 32 MiB kept for reuse" if done else
            "glibc defaults (mallopt refused)")
