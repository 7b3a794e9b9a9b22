"""CUDA kernels compiled side by side, ahead of their first launch.

CuPy compiles a ``RawKernel`` when it is first launched, so a model's first step compiled its
kernels one after another while the job waited: ten to twenty a model (the row moves, each
level plan's fused kernels, the loss, the optimiser), 60 ms each on an H200's host with NVRTC
(0.7 s of the main job's first epoch, profiled), 0.4-0.7 s each through the emulated device's
g++ shim. Here a kernel starts compiling on a worker thread when it is made
(``kernels.make_kernel``), beside the kernels made with it and whatever the job does meanwhile;
its first launch, or the C issuer's reading of its function, waits for it (:func:`ready`). NVRTC
and the shim's compiler run outside the GIL, so the workers compile in parallel.

A kernel not started yet when it is needed is taken back: the caller compiles it at once
rather than wait behind others. A compile that fails is left to the launch, which compiles
again and raises the error with its log. The workers are daemon threads with the native
build's compile-ahead flag (``cpu/build.py``): at exit a shim compiler still running for a
kernel nothing launched is stopped.
"""

import atexit
import collections
import os
import threading

_QUEUED, _RUNNING, _TAKEN = range(3)
_lock = threading.Lock()
_jobs = {}  # id(kernel) -> its _Job while queued or compiling
_queue = collections.deque()
_workers = [0]
_stopping = [False]
_failed = collections.deque(maxlen=8)  # (kernel name, error) of the last compiles that failed
MOST_WORKERS = 8


class _Job:
    __slots__ = ("kernel", "device", "state", "done")

    def __init__(self, kernel, device):
        self.kernel, self.device, self.state = kernel, device, _QUEUED
        self.done = threading.Event()


def start(kernel, device=None):
    """Start compiling ``kernel`` (a ``cupy.RawKernel`` or the emulated device's: anything
    with ``compile()``) on a worker; ``device`` (a ``cupy.cuda.Device``): made current there,
    as the kernel's module is loaded on it."""
    if not hasattr(kernel, "compile"):
        return
    with _lock:
        if id(kernel) in _jobs:
            return
        job = _jobs[id(kernel)] = _Job(kernel, device)
        _queue.append(job)
        if _workers[0] < min(MOST_WORKERS, os.cpu_count() or 1):
            _workers[0] += 1
            threading.Thread(target=_work, daemon=True, name="minicavs-cuda-compile").start()


def ready(kernel):
    """``kernel``, with its compile ahead ended, or taken back where it had not started (the
    caller's launch compiles it): what every launch and the C issuer's function lookup call
    first."""
    if not _jobs:  # (the common case: one truth test)
        return kernel
    job = _jobs.get(id(kernel))  # (a pending job holds its kernel: the id is not reused)
    if job is None:
        return kernel
    with _lock:
        if job.state == _QUEUED:
            job.state = _TAKEN
            _jobs.pop(id(kernel), None)
            return kernel
    job.done.wait()
    return kernel


def pending():
    """How many kernels are queued or compiling ahead now."""
    return len(_jobs)


def failures():
    """``(kernel name, error)`` of the last compiles ahead that failed (their launches
    compiled them again): a kernel's own error, or this thread's device not usable there."""
    return list(_failed)


def _work():
    from ..cpu import build

    with build.compiling_ahead():  # (this thread's compilers are stopped at exit)
        _compile_queued()


def _compile_queued():
    while True:
        with _lock:
            if _stopping[0]:  # (the process is ending: nothing more is started)
                _queue.clear()
            while _queue and _queue[0].state == _TAKEN:
                _queue.popleft()
            if not _queue:
                _workers[0] -= 1
                return
            job = _queue.popleft()
            job.state = _RUNNING
        try:
            if job.device is not None:
                job.device.use()
            job.kernel.compile()
        except Exception as error:  # noqa: BLE001 (the launch compiles it again, raises it)
            _failed.append((getattr(job.kernel, "name", "?"), repr(error)[:500]))
        finally:
            with _lock:
                _jobs.pop(id(job.kernel), None)
            job.done.set()


def _forget():
    """(A forked child.) The parent's workers are not here: the child compiles what it
    launches itself, and waits for none of the parent's compiles (nor for a lock one held)."""
    global _lock
    _lock = threading.Lock()
    _jobs.clear()
    _queue.clear()
    _workers[0] = 0


os.register_at_fork(after_in_child=_forget)


@atexit.register
def _stop():
    """At exit no more kernels are started (those compiling are stopped by the native build's
    exit hook, which runs after this one)."""
    with _lock:
        _stopping[0] = True
