"""Communicators: the ranks of one data-parallel job and the few collectives training needs.

* :class:`LocalCommunicator` — one process, no MPI; every collective is the identity. The
  training loop always has a communicator, so it has one code path.
* :class:`MpiCommunicator` — mpi4py. NumPy arrays go to MPI as they are; CuPy arrays are
  staged through host memory (for GPUs without NCCL).
* :class:`NcclCommunicator` — CuPy arrays go through NCCL (``minicavs.cuda.nccl``), its unique
  id broadcast over MPI; host values (counts, objects) still go over MPI.

Every array collective is non-blocking underneath and waited for with a deadline
(``timeout``): a rank that never arrives makes the others raise :class:`DistributedError`
instead of waiting forever. A rank that *raises* ends the job at once: while a communicator of
more than one rank exists, an uncaught exception calls ``MPI_Abort`` after printing its
traceback (ChainerMN's ``global_except_hook``), and the launcher stops every rank.
"""

import atexit
import os
import pickle
import sys
import time
from dataclasses import dataclass

import numpy as np

from .. import backend
from ..errors import DistributedError
from .buckets import (pack_gradients, pack_values, plan_buckets, unpack_gradients,
                      unpack_values)

DEFAULT_TIMEOUT = 300.0  # seconds: longer than any step or evaluation of the examples
DEFAULT_BUCKET_BYTES = 16 * 2 ** 20  # large enough for a Tree-LSTM's gradients in one call
SPIN_SECONDS = 0.02  # how long a wait polls without sleeping (MPI_Wait spins all along)
_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))


@dataclass
class Traffic:
    """What this rank handed to array collectives: calls and payload bytes (a ring all-reduce
    sends and receives about 2 (N-1)/N times the payload per rank)."""

    calls: int = 0
    bytes: int = 0


def _named(params):
    """``(names, tensors)`` of ``params``: Tensors (named by ``.name``, else None) or
    ``(name, Tensor)`` pairs. Where every one has a name of its own they come sorted by name,
    so ranks that created their parameters in another order still pair each with its
    namesake (in creation order, equal shapes would swap values unnoticed)."""
    names, tensors = [], []
    for item in params:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            names.append(item[0])
            tensors.append(item[1])
        else:
            names.append(getattr(item, "name", None))
            tensors.append(item)
    if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
        order = sorted(range(len(names)), key=names.__getitem__)
        names, tensors = [names[i] for i in order], [tensors[i] for i in order]
    return names, tensors


def _described(entry):
    shape, dtype, name = entry
    return f"{shape} {dtype}" if name is None else f"{name!r} {shape} {dtype}"


class Communicator:
    """What data-parallel training asks of the ranks. Subclasses provide the primitives (in
    place ``_allreduce_array`` and ``_broadcast_array``, pickled ``_broadcast_object`` and
    ``_allgather_object``); this class turns them into bucketed gradients, parameter
    broadcasts and checks that the ranks agree."""

    rank, size = 0, 1
    local_rank, local_size = 0, 1  # among the ranks on this machine

    def __init__(self, *, timeout=DEFAULT_TIMEOUT, bucket_bytes=DEFAULT_BUCKET_BYTES):
        if not timeout > 0:
            raise DistributedError(f"the collective timeout must be positive, got {timeout}")
        if bucket_bytes < 1:
            raise DistributedError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.timeout = float(timeout)
        self.bucket_bytes = int(bucket_bytes)
        self.traffic = Traffic()
        self._plans = {}  # parameters' shapes, dtypes, devices -> buckets, checked once

    @property
    def is_root(self):
        return self.rank == 0

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"

    # --- what training calls ------------------------------------------------------------------
    def allreduce_gradients(self, params, *, average=False):
        """Sum the ``.grad`` of ``params`` over the ranks, in place, one call per bucket.

        Sum when each rank's loss is already divided by the step's *global* count of targets
        (what :func:`minicavs.training.fit` does: ranks hold different numbers of tree
        vertices, so only the global count gives one process's gradient). ``average=True``
        divides by the number of ranks instead, for losses that are each rank's own mean over
        equal shares (PyTorch DDP's convention). Parameters without a gradient on every rank
        keep none.
        """
        if self.size == 1:
            return
        names, params = _named(params)
        scale = 1.0 / self.size if average else 1.0
        for bucket in self._buckets(params, names):
            buffer = pack_gradients(bucket, params)
            self._reduce(buffer)
            unpack_gradients(bucket, params, buffer, scale)

    def broadcast_parameters(self, params, root=0):
        """Give every rank ``root``'s parameter values (in place), after checking that every
        rank has the same parameters: names, shapes and dtypes. ``params`` are Tensors or
        ``(name, Tensor)`` pairs — pass ``model.named_parameters()``: a model built with its
        parts in another order on one rank has equal shapes in another order, which only the
        names tell apart (a Tensor alone is known by its ``.name``, if it has one)."""
        if self.size == 1:
            return
        names, params = _named(params)
        for bucket in self._buckets(params, names):
            buffer = pack_values(bucket, params)
            self._broadcast(buffer, root)
            unpack_values(bucket, params, buffer)

    def broadcast_optimizer_state(self, optimizer, root=0):
        """Give every rank ``root``'s optimiser state and hyperparameters (a resumed run loads
        its checkpoint on one rank)."""
        if self.size == 1:
            return
        state = self.broadcast_object(optimizer.state_dict() if self.rank == root else None,
                                      root)
        if self.rank != root:
            optimizer.load_state_dict(state)

    def allreduce_sum(self, values):
        """The sum over the ranks of a number or a small NumPy array of numbers (host values:
        sample and target counts, losses)."""
        array = np.array(values)
        if array.dtype.kind not in "biuf":
            raise DistributedError(f"allreduce_sum: expected numbers, got dtype {array.dtype}")
        if self.size == 1:
            return array if array.ndim else array[()]
        buffer = np.ascontiguousarray(array, dtype=np.float64 if array.dtype.kind == "f"
                                      else np.int64).reshape(-1)
        self._reduce(buffer)
        buffer = buffer.reshape(array.shape)
        return buffer if buffer.ndim else buffer[()]

    def broadcast_object(self, obj, root=0):
        """``root``'s ``obj`` (anything pickle takes) on every rank."""
        return obj if self.size == 1 else self._broadcast_object(obj, root)

    def allgather_object(self, obj):
        """The list of every rank's ``obj``, in rank order."""
        return [obj] if self.size == 1 else self._allgather_object(obj)

    def barrier(self):
        """Wait until every rank has arrived (a one-number all-reduce, under the timeout)."""
        if self.size > 1:
            self._allreduce_array(np.zeros(1, np.int64))

    def log(self, *args, **kwargs):
        """``print`` on rank 0 only: logs and results are written once."""
        if self.is_root:
            print(*args, **kwargs, flush=True)

    def fail(self, message):
        """Report an error that stops this run; return the exit status 1. With several ranks,
        end the whole job (the others would wait for this rank until their timeout)."""
        prefix = f"[rank {self.rank} of {self.size}] " if self.size > 1 else ""
        print(prefix + message, flush=True)
        if self.size > 1:
            self._abort_job()
        return 1

    # --- the bucket plan ---------------------------------------------------------------------
    def _buckets(self, params, names):
        key = tuple((n, tuple(p.shape), str(p.dtype), p.device) for n, p in zip(names, params))
        plan = self._plans.get(key)
        if plan is None:
            self._check_same_parameters(params, names)
            plan = self._plans[key] = plan_buckets(params, self.bucket_bytes)
        return plan

    def _check_same_parameters(self, params, names):
        """Every rank must hold the same parameters in the same order; otherwise the buckets
        would not line up and the sums would mix unrelated values (or MPI would fail)."""
        mine = [(tuple(p.shape), str(p.dtype), n) for n, p in zip(names, params)]
        everyone = self.allgather_object(mine)
        problems = []
        for rank, theirs in enumerate(everyone):
            if theirs == everyone[0]:
                continue
            if len(theirs) != len(everyone[0]):
                problems.append(f"rank {rank} has {len(theirs)} parameters, rank 0 has "
                                f"{len(everyone[0])}")
                continue
            i = next(i for i, (a, b) in enumerate(zip(theirs, everyone[0])) if a != b)
            problems.append(f"parameter {i} is {_described(theirs[i])} on rank {rank}, "
                            f"{_described(everyone[0][i])} on rank 0")
        if problems:
            raise DistributedError("the ranks do not hold the same parameters (build the same "
                                   "model on every rank):\n  " + "\n  ".join(problems))

    # --- primitives --------------------------------------------------------------------------
    def _reduce(self, buffer):
        self.traffic.calls += 1
        self.traffic.bytes += buffer.nbytes
        self._allreduce_array(buffer)

    def _broadcast(self, buffer, root):
        self.traffic.calls += 1
        self.traffic.bytes += buffer.nbytes
        self._broadcast_array(buffer, root)

    def _allreduce_array(self, buffer):
        raise NotImplementedError

    def _broadcast_array(self, buffer, root):
        raise NotImplementedError

    def _broadcast_object(self, obj, root):
        raise NotImplementedError

    def _allgather_object(self, obj):
        raise NotImplementedError

    def _abort_job(self):
        raise NotImplementedError


class LocalCommunicator(Communicator):
    """One process and no MPI: rank 0 of 1."""


class MpiCommunicator(Communicator):
    """The ranks of an mpi4py communicator (``create_communicator`` passes a duplicate of
    ``COMM_WORLD``, so these collectives never interleave with the caller's own)."""

    def __init__(self, mpi_comm, **options):
        super().__init__(**options)
        from mpi4py import MPI

        self.MPI = MPI
        self.mpi_comm = mpi_comm
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this machine
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        if backend.get_device() == "cuda":  # before anything touches a GPU
            self.gpu = backend.select_gpu(self.local_rank)

    def _wait(self, request, what):
        self.wait_until(request.Test, f"MPI {what}")

    def wait_until(self, is_done, what):
        """Poll ``is_done()`` until it is true, at most ``timeout`` seconds, then raise.

        Flat out at first, yielding the core between polls to whatever else is runnable
        (ranks may outnumber cores): MPI moves a non-blocking collective along only inside
        Test, so the first milliseconds decide its latency. Then with growing pauses (up to
        1 ms), so a rank that waits long (rank 0 evaluating) leaves its core alone.
        """
        started = time.monotonic()
        pause = 0.0
        while not is_done():
            waited = time.monotonic() - started
            if waited > self.timeout:
                _collective_timed_out.append(what)
                raise DistributedError(
                    f"rank {self.rank} of {self.size}: {what} did not complete within "
                    f"{self.timeout:g} s; another rank is stuck or has died (a step or an "
                    f"evaluation that legitimately takes longer needs a larger --timeout)")
            if waited < SPIN_SECONDS:
                _yield_core()
            else:
                time.sleep(pause)
                pause = min(2 * pause or 20e-6, 1e-3)

    def _allreduce_array(self, buffer):
        if backend.is_cupy_array(buffer):  # no CUDA-aware MPI assumed: through the host
            host = backend.to_numpy(buffer)
            self._allreduce_array(host)
            buffer.set(host)
            return
        request = self.mpi_comm.Iallreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)
        self._wait(request, f"all-reduce of {buffer.nbytes} bytes")

    def _broadcast_array(self, buffer, root):
        if backend.is_cupy_array(buffer):
            host = backend.to_numpy(buffer)
            self._broadcast_array(host, root)
            buffer.set(host)
            return
        self._wait(self.mpi_comm.Ibcast(buffer, root=root), f"broadcast of {buffer.nbytes} bytes")

    def _broadcast_object(self, obj, root):
        payload = pickle.dumps(obj) if self.rank == root else b""
        length = np.array([len(payload)], np.int64)
        self._wait(self.mpi_comm.Ibcast(length, root=root), "broadcast of an object's size")
        data = (np.frombuffer(payload, np.uint8).copy() if self.rank == root
                else np.empty(int(length[0]), np.uint8))
        self._wait(self.mpi_comm.Ibcast(data, root=root), "broadcast of an object")
        return obj if self.rank == root else pickle.loads(data.tobytes())

    def _allgather_object(self, obj):
        payload = np.frombuffer(pickle.dumps(obj), np.uint8).copy()
        lengths = np.empty(self.size, np.int64)
        self._wait(self.mpi_comm.Iallgather(np.array([payload.size], np.int64), lengths),
                   "all-gather of object sizes")
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        data = np.empty(int(lengths.sum()), np.uint8)
        self._wait(self.mpi_comm.Iallgatherv([payload, self.MPI.BYTE],
                                             [data, lengths, offsets, self.MPI.BYTE]),
                   "all-gather of objects")
        return [pickle.loads(data[o:o + n].tobytes()) for o, n in zip(offsets, lengths)]

    def _abort_job(self):
        _abort_world(self.MPI)


class NcclCommunicator(MpiCommunicator):
    """MPI for host values, NCCL for CuPy arrays (gradients, parameters)."""

    def __init__(self, mpi_comm, **options):
        super().__init__(mpi_comm, **options)
        from ..cuda.nccl import NcclGroup

        gpus = backend.gpu_count()
        if self.local_size > gpus:
            raise DistributedError(f"NCCL needs a GPU per rank: {self.local_size} ranks on "
                                   f"this machine, {gpus} GPU(s); start at most {gpus} ranks "
                                   f"per machine, or use the MPI communicator")
        self.nccl = NcclGroup(self.rank, self.size, self.broadcast_object, self.wait_until)

    def _allreduce_array(self, buffer):
        if backend.is_cupy_array(buffer):
            self.nccl.allreduce_sum(buffer)
        else:
            super()._allreduce_array(buffer)

    def _broadcast_array(self, buffer, root):
        if backend.is_cupy_array(buffer):
            self.nccl.broadcast(buffer, root)
        else:
            super()._broadcast_array(buffer, root)


# --- making one ---------------------------------------------------------------------------------

def import_mpi():
    """mpi4py's ``MPI`` module (initialising MPI), or a :class:`DistributedError` saying what
    to install."""
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError, or mpi4py that finds no MPI library
        raise DistributedError(
            f"distributed training needs mpi4py and an MPI library ({type(exc).__name__}: "
            f"{exc}); install both with pip install 'minicavs[distributed]' (mpi4py and the "
            f"MPICH wheel), or see the README for Debian/Ubuntu packages") from None
    return MPI


def create_communicator(kind="auto", *, timeout=DEFAULT_TIMEOUT,
                        bucket_bytes=DEFAULT_BUCKET_BYTES, abort_on_error=True):
    """The communicator of this job's ranks (all of ``MPI.COMM_WORLD``).

    ``kind``: ``"mpi"``, ``"nccl"`` (CuPy arrays through NCCL; needs the cuda device) or
    ``"auto"`` (NCCL on the cuda device, else MPI). On the cuda device each rank first takes
    GPU (local rank mod GPUs). ``abort_on_error``: with more than one rank, an uncaught
    exception on any rank, or a collective that timed out, ends every rank (MPI_Abort).
    """
    if kind not in ("auto", "mpi", "nccl"):
        raise DistributedError(f"unknown communicator {kind!r}; expected 'auto', 'mpi' or "
                               f"'nccl'")
    on_gpu = backend.get_device() == "cuda"
    if kind == "auto":
        kind = "nccl" if on_gpu else "mpi"
    if kind == "nccl" and not on_gpu:
        raise DistributedError("the NCCL communicator works on CuPy arrays: select the cuda "
                               "device first (--device cuda), or use the MPI communicator")
    MPI = import_mpi()
    world = MPI.COMM_WORLD.Dup()
    options = dict(timeout=timeout, bucket_bytes=bucket_bytes)
    if abort_on_error and world.Get_size() > 1:
        _install_abort_hooks(MPI)
    if kind == "nccl":
        return NcclCommunicator(world, **options)
    return MpiCommunicator(world, **options)


_hooks_installed = []
_collective_timed_out = []  # what timed out in this process: MPI cannot finalise normally


def _install_abort_hooks(MPI):
    """Once per process: an uncaught exception prints its traceback and aborts every rank; at
    exit, a communicator left with a collective that timed out aborts too (MPI_Finalize would
    wait for that collective forever)."""
    if _hooks_installed:
        return
    _hooks_installed.append(MPI)
    previous = sys.excepthook
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

    def abort_every_rank(kind, value, traceback):
        previous(kind, value, traceback)
        print(f"minicavs.distributed: rank {rank} of {size} stopped on {kind.__name__}; "
              f"aborting all {size} ranks", file=sys.stderr, flush=True)
        _abort_world(MPI)

    sys.excepthook = abort_every_rank
    atexit.register(_abort_if_broken, MPI)


def _abort_if_broken(MPI):
    if _collective_timed_out:
        _abort_world(MPI)


def _abort_world(MPI):
    """MPI_Abort on every rank, once this rank's output has reached the launcher: Hydra
    drops what it has not yet read from a rank's pipes when the abort tears the job down."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(1)
