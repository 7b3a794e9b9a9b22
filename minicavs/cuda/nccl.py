"""NCCL through CuPy (``cupy.cuda.nccl``): the GPU collectives of :mod:`minicavs.distributed`.

One :class:`NcclGroup` per process, over the ranks of an MPI communicator: rank 0 makes NCCL's
unique id and the ranks receive it over MPI (``broadcast_object``), then every rank joins with
``ncclCommInitRank`` on its own GPU. Collectives run in place on CuPy arrays on the current
stream and are waited for through the caller's ``wait_until(is_done, what)`` (the polling and
the deadline of :mod:`minicavs.distributed`), so a rank that never arrives gives a
:class:`DistributedError` instead of a hang; the NCCL communicator is aborted first.
"""

import numpy as np

from .. import backend
from ..errors import DeviceError, DistributedError


def nccl_library():
    """``cupy.cuda.nccl``, or a :class:`DeviceError` that says how to install what is missing."""
    backend.cupy_or_error()
    try:
        from cupy.cuda import nccl
    except ImportError as exc:  # a CuPy built without NCCL support
        raise DeviceError(f"this CuPy has no NCCL module ({exc}); use the MPI communicator "
                          f"(--communicator mpi), which stages gradients through host "
                          f"memory") from None
    if not getattr(nccl, "available", False):
        raise DeviceError("CuPy cannot load the NCCL library; install it with "
                          "pip install nvidia-nccl-cu12, or use the MPI communicator "
                          "(--communicator mpi), which stages gradients through host memory")
    return nccl


def _nccl_dtype(nccl, dtype):
    codes = {np.dtype(name): getattr(nccl, f"NCCL_{name.upper()}")
             for name in ("float16", "float32", "float64", "int32", "int64", "uint8")}
    try:
        return codes[np.dtype(dtype)]
    except KeyError:
        raise DistributedError(f"NCCL collectives take {sorted(str(d) for d in codes)}, "
                               f"got dtype {np.dtype(dtype)}") from None


class NcclGroup:
    """An NCCL communicator of ``size`` ranks; this process is ``rank`` on the current GPU.
    ``broadcast_object(obj)`` gives rank 0's ``obj`` to every rank (over MPI);
    ``wait_until(is_done, what)`` polls with a deadline and raises DistributedError."""

    def __init__(self, rank, size, broadcast_object, wait_until):
        self.nccl = nccl_library()
        self.cupy = backend.cupy_or_error()
        self.rank, self.size, self.wait_until = rank, size, wait_until
        unique_id = broadcast_object(self.nccl.get_unique_id() if rank == 0 else None)
        try:
            self._comm = self.nccl.NcclCommunicator(size, unique_id, rank)
        except self.nccl.NcclError as exc:
            raise DistributedError(f"rank {rank} of {size}: NCCL could not set up its "
                                   f"communicator on GPU {self.cupy.cuda.Device().id}: "
                                   f"{exc}") from None

    def _checked(self, array, what):
        if not backend.is_cupy_array(array) or not array.flags.c_contiguous:
            raise DistributedError(f"NCCL {what}: needs a contiguous CuPy array, got "
                                   f"{type(array).__name__}")
        return array.data.ptr, array.size, _nccl_dtype(self.nccl, array.dtype)

    def allreduce_sum(self, array):
        """Sum ``array`` over the ranks, in place."""
        pointer, count, dtype = self._checked(array, "all-reduce")
        stream = self.cupy.cuda.get_current_stream()
        self._comm.allReduce(pointer, pointer, count, dtype, self.nccl.NCCL_SUM, stream.ptr)
        self.wait(stream, f"all-reduce of {array.nbytes} bytes")

    def broadcast(self, array, root):
        """Overwrite ``array`` with rank ``root``'s, in place."""
        pointer, count, dtype = self._checked(array, "broadcast")
        stream = self.cupy.cuda.get_current_stream()
        self._comm.bcast(pointer, count, dtype, root, stream.ptr)
        self.wait(stream, f"broadcast of {array.nbytes} bytes")

    def wait(self, stream, what):
        """Wait for ``stream`` (the collective just queued on it) within the deadline."""
        event = stream.record()
        try:
            self.wait_until(lambda: event.done, f"NCCL {what}")
        except DistributedError:
            self._comm.abort()  # frees the GPU from a collective that will never end
            raise
        try:
            self._comm.check_async_error()
        except self.nccl.NcclError as exc:
            raise DistributedError(f"rank {self.rank} of {self.size}: NCCL {what} failed: "
                                   f"{exc}") from None
