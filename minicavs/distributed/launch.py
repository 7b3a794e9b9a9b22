"""Where MPI meets the outside: whether this process was started by an MPI launcher, and the
``mpiexec`` command line that starts N ranks on this machine (tests and benchmarks use it).

Both look only at the environment and the launcher's ``--version``; neither imports mpi4py.
"""

import functools
import os
import shutil
import subprocess
import sys

from ..errors import DistributedError

# The world size each launcher family exports to its ranks (MPICH/Hydra and Intel MPI through
# PMI, Open MPI, MVAPICH). PMIx-only launchers (srun --mpi=pmix) export a rank but no size.
_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
_RANK_ONLY_VARIABLES = ("PMIX_RANK",)


def launched_by_mpi(environ=None):
    """True when an MPI launcher started this process as one of several ranks.

    ``mpiexec -n 1`` counts as not launched: one rank is an ordinary run.
    """
    environ = os.environ if environ is None else environ
    for name in _SIZE_VARIABLES:
        if name in environ:
            try:
                return int(environ[name]) > 1
            except ValueError:
                return True  # a launcher set it, whatever it holds
    return any(name in environ for name in _RANK_ONLY_VARIABLES)


def find_mpiexec():
    """The ``mpiexec`` to use: the one beside this Python first (the ``mpich`` wheel installs
    it into the virtual environment), else the first on PATH."""
    beside_python = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise DistributedError("no mpiexec found beside this Python or on PATH; install MPI: "
                               "pip install 'minicavs[distributed]' (mpi4py and MPICH), or "
                               "apt-get install openmpi-bin libopenmpi-dev")
    return found


@functools.lru_cache(maxsize=None)
def _is_open_mpi(mpiexec):
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    text = done.stdout + done.stderr
    return "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text


def mpiexec_command(num_ranks, mpiexec=None):
    """``[mpiexec, -n, N, ...]`` for N ranks on this machine, with what the launcher needs.

    Open MPI refuses more ranks than cores without ``--oversubscribe`` and refuses to run as
    root without ``--allow-run-as-root`` (containers and CI run as root); MPICH needs neither.
    This is the one place that knows.
    """
    if num_ranks < 1:
        raise DistributedError(f"mpiexec_command: need at least one rank, got {num_ranks}")
    mpiexec = mpiexec or find_mpiexec()
    command = [mpiexec, "-n", str(num_ranks)]
    if _is_open_mpi(mpiexec):
        command.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-run-as-root")
    return command
