"""The native team of this process: how many threads run a large product or a level loop
(``cpu/products.py``'s team products, ``runtime/native.py``'s loops), and this thread's state
inside ``products.team_products``. Below both the kernels and ``cpu/calibrate.py``, which
sizes teams to the cores that other work leaves free."""

import contextlib
import ctypes
import functools
import os
import threading

from . import blas, build

state = threading.local()  # inside products.team_products: .on, .threads (its team), .kernels


def in_team_products():
    """Whether this thread is inside ``products.team_products`` (a call of native loops)."""
    return getattr(state, "on", False)


def team_size():
    """Threads of a native team, chosen here and never by the user (the level loops' teams in
    ``runtime/native.py`` too): the cores this process may use (``OMP_NUM_THREADS`` caps it,
    as it caps OpenBLAS); 1 where the BLAS cannot be set to one thread per call (two pools of
    threads would contend), and 1 in a child forked after OpenMP started (its parent's pool
    threads are gone: a team there would wait for them forever; ``build.forked_child``).
    Inside ``products.team_products``, only the cores no other work ran on when the block began
    (``calibrate.free_cores``): a team waits at every barrier for a member that another
    process holds off its core."""
    threads = getattr(state, "threads", None)
    if threads:
        return threads
    if build.forked_child() or blas.threads_local() is None:
        return 1
    return _cores()


@functools.lru_cache(maxsize=None)
def _cores():
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cap = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return max(1, min(cores, int(cap))) if cap.isdigit() and int(cap) > 0 else cores


def set_blas_threads(count):
    """Set the BLAS's threads (process-wide in NumPy's OpenBLAS); the previous count, or None
    where the BLAS has no such call."""
    address = blas.threads_local()
    if address is None:
        return None
    return _SET_THREADS(address)(count)


_SET_THREADS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)


@contextlib.contextmanager
def one_blas_thread():
    """NumPy's BLAS on one thread for the block, where the BLAS can be set so (as inside a
    team's call: what a measurement against the BLAS there must compare with)."""
    before = set_blas_threads(1)
    try:
        yield
    finally:
        if before is not None:
            set_blas_threads(before)
