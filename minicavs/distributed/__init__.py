"""Data-parallel training over MPI (NumPy arrays) and NCCL (CuPy arrays), the way ChainerMN
runs Chainer: every rank holds the whole model, trains on its own share of each step's batch,
and the gradients are summed over the ranks before every update::

    comm = distributed.create_communicator()          # under mpiexec -n N; mpi4py inside
    comm.broadcast_parameters(model.named_parameters())  # rank 0's weights, names checked
    for batch in distributed.DistributedSampler(train, B, rank=comm.rank, size=comm.size,
                                                seed=0).batches(epoch):
        ...loss.backward()...
        comm.allreduce_gradients(optimizer.params)    # one call per bucket
        optimizer.step()

:func:`minicavs.training.fit` does all of that given ``comm=``, and ``python -m minicavs train
... --distributed`` (and every example) under ``mpiexec -n N``. ``docs/distributed.md`` has
the design, the measurements and the plan for larger clusters. mpi4py is imported only when a
communicator is made (``pip install 'minicavs[distributed]'``).
"""

from .communicator import (DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT, Communicator,
                           LocalCommunicator, MpiCommunicator, NcclCommunicator, Traffic,
                           create_communicator, import_mpi)
from .buckets import Bucket, plan_buckets
from .launch import find_mpiexec, launched_by_mpi, mpiexec_command
from .sampler import DistributedSampler, shard

__all__ = ["Communicator", "LocalCommunicator", "MpiCommunicator", "NcclCommunicator",
           "Traffic", "create_communicator", "import_mpi", "DEFAULT_TIMEOUT",
           "DEFAULT_BUCKET_BYTES", "Bucket", "plan_buckets", "DistributedSampler", "shard",
           "launched_by_mpi", "find_mpiexec", "mpiexec_command"]
