"""One MPI rank of ``python -m minicavs ...`` with test instrumentation, launched under mpiexec
by tests/test_distributed.py:

    python tests/distributed_worker.py [--record-writes DIR] [--fail-rank R | --stall-rank R]
                                       [--at-step K] -- train tree-lstm ...

``--record-writes``: every checkpoint write is logged to DIR/writes.<rank>;
``--fail-rank``: that rank raises in its K-th training loss; ``--stall-rank``: it sleeps there
instead, as a rank stuck in a deadlock would.
"""

import argparse
import os
import sys
import time

from mpi4py import MPI

from minicavs.__main__ import main as minicavs_main
from minicavs.models import TreeClassifier
from minicavs.nn import checkpoint


def instrument(options, rank):
    if options.record_writes:
        write = checkpoint._write_atomically

        def recorded(path, arrays):
            with open(os.path.join(options.record_writes, f"writes.{rank}"), "a") as log:
                log.write(f"{path}\n")
            write(path, arrays)

        checkpoint._write_atomically = recorded
    if rank in (options.fail_rank, options.stall_rank):
        loss = TreeClassifier.loss
        calls = []

        def faulty(self, batch, run=None):
            calls.append(1)
            if len(calls) == options.at_step:
                if rank == options.fail_rank:
                    raise ValueError(f"injected failure on rank {rank} at step {len(calls)}")
                time.sleep(600)
            return loss(self, batch, run)

        TreeClassifier.loss = faulty


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--record-writes", metavar="DIR")
    parser.add_argument("--fail-rank", type=int)
    parser.add_argument("--stall-rank", type=int)
    parser.add_argument("--at-step", type=int, default=2)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    instrument(options, MPI.COMM_WORLD.Get_rank())
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    sys.exit(minicavs_main(command))
