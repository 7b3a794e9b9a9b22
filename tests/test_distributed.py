"""Data-parallel training (minicavs.distributed).

The collectives' logic (buckets, flags for missing gradients, sums and averages, parameter
checks) is tested in this process, with N ranks played by threads that exchange arrays in
shared memory. The real thing is tested by launching ranks with mpiexec on localhost (the
``test`` extra installs mpi4py and the MPICH wheel): 2 ranks with batch B must end where one
process with batch 2B ends, a failing or stalled rank must end the job with a clear error
within seconds, and the checkpoint is written once.
"""

import os
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minicavs as mc
from minicavs.__main__ import main as minicavs_main
from minicavs.distributed import (Communicator, DistributedSampler, LocalCommunicator,
                                  create_communicator, launched_by_mpi, mpiexec_command,
                                  plan_buckets, shard)
from minicavs.errors import DistributedError
from minicavs.training import get_blas_threads, set_blas_threads

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "distributed_worker.py"


# --- the sampler ---------------------------------------------------------------------------

@given(length=st.integers(0, 40), size=st.integers(1, 6))
def test_shards_cover_a_batch_in_order_with_sizes_differing_by_at_most_one(length, size):
    batch = list(range(length))
    parts = [shard(batch, rank, size) for rank in range(size)]
    assert sum(parts, []) == batch
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@given(samples=st.integers(1, 50), batch_size=st.integers(1, 7), size=st.integers(1, 4),
       seed=st.integers(0, 3), epoch=st.integers(1, 3))
def test_ranks_together_see_the_steps_of_one_process_with_n_times_the_batch(
        samples, batch_size, size, seed, epoch):
    data = [f"s{i}" for i in range(samples)]
    per_rank = [DistributedSampler(data, batch_size, rank=r, size=size, seed=seed)
                .batches(epoch) for r in range(size)]
    # One process with batch N*B: the epoch's permutation from (seed, epoch), cut in order.
    order = np.random.default_rng([seed, epoch]).permutation(samples)
    step = batch_size * size
    expected = [[data[i] for i in order[k:k + step]] for k in range(0, samples, step)]
    assert all(len(batches) == len(expected) for batches in per_rank)  # same step count
    for k, whole in enumerate(expected):
        assert sum((batches[k] for batches in per_rank), []) == whole
        assert all(len(batches[k]) <= batch_size for batches in per_rank)


def test_sampler_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch size"):
        DistributedSampler([1, 2], 0)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        DistributedSampler([1, 2], 1, rank=2, size=2)


# --- buckets --------------------------------------------------------------------------------

def _params(*shapes, dtype=np.float32):
    rng = np.random.default_rng(len(shapes))
    return [mc.Parameter(rng.standard_normal(s).astype(dtype)) for s in shapes]


def test_buckets_hold_consecutive_parameters_of_one_dtype_within_the_budget():
    params = (_params((10, 10), (5,), (30, 30)) + _params((4,), dtype=np.float64)
              + _params((3,)))
    buckets = plan_buckets(params, bucket_bytes=1000)
    assert [b.indices for b in buckets] == [(0, 1), (2,), (3,), (4,)]  # 900 floats alone
    assert [b.offsets for b in buckets][0] == (0, 100)
    assert buckets[3].dtype == np.float32 and buckets[2].dtype == np.float64
    assert len(plan_buckets(params[:3], bucket_bytes=10 ** 6)) == 1


# --- collectives, with threads as ranks -----------------------------------------------------

class ThreadRanks(Communicator):
    """Rank ``rank`` of ``size`` threads of this process; arrays and objects are exchanged
    through a shared list between two barriers, summed in rank order."""

    def __init__(self, group, rank, **options):
        super().__init__(**options)
        self.group, self.rank, self.size = group, rank, group["size"]
        self.calls = []  # (collective, elements) per array call: what MPI would be asked

    def _exchange(self, value):
        group = self.group
        group["slots"][self.rank] = value
        group["barrier"].wait(timeout=10)
        values = list(group["slots"])
        group["barrier"].wait(timeout=10)
        return values

    def _allreduce_array(self, buffer):
        self.calls.append(("allreduce", buffer.size))
        total = np.zeros_like(buffer)
        for value in self._exchange(buffer.copy()):
            total += value
        buffer[...] = total

    def _broadcast_array(self, buffer, root):
        self.calls.append(("broadcast", buffer.size))
        buffer[...] = self._exchange(buffer.copy())[root]

    def _broadcast_object(self, obj, root):
        return self._exchange(obj)[root]

    def _allgather_object(self, obj):
        return self._exchange(obj)


def run_ranks(size, work, **options):
    """``work(comm)`` on ``size`` thread ranks; their results, in rank order (errors raised)."""
    group = {"size": size, "slots": [None] * size, "barrier": threading.Barrier(size)}
    comms = [ThreadRanks(group, r, **options) for r in range(size)]
    results, errors = [None] * size, [None] * size

    def run(r):
        try:
            results[r] = work(comms[r])
        except BaseException as exc:  # reported below, in the test's thread
            errors[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for error in errors:
        if error is not None:
            raise error
    return results, comms


def _rank_gradients(rank, params):
    """Rank-dependent gradients; rank 1 has none for parameter 1, nobody has one for 2."""
    for i, p in enumerate(params):
        if i == 2 or (i == 1 and rank == 1):
            p.grad = None
        else:
            p.grad = mc.tensor(np.full(p.shape, (rank + 1) * (i + 1), p.dtype))


@pytest.mark.parametrize("average", [False, True])
def test_gradients_are_summed_or_averaged_in_one_call_per_bucket(average):
    def work(comm):
        params = _params((3, 4), (5,), (2,), (6,))
        _rank_gradients(comm.rank, params)
        comm.allreduce_gradients(params, average=average)
        return [None if p.grad is None else p.grad.numpy() for p in params]

    (grads, *others), comms = run_ranks(3, work)
    scale = 1 / 3 if average else 1
    np.testing.assert_allclose(grads[0], np.full((3, 4), (1 + 2 + 3) * scale))
    np.testing.assert_allclose(grads[1], np.full(5, (1 + 3) * 2 * scale))  # rank 1 had none
    assert grads[2] is None  # no rank had one: the optimiser skips it, as in one process
    np.testing.assert_allclose(grads[3], np.full(6, 6 * 4 * scale))
    for other in others:  # every rank ends with the same gradients
        assert [g is None for g in other] == [g is None for g in grads]
        for a, b in zip(other, grads):
            if a is not None:
                np.testing.assert_array_equal(a, b)
    # One bucket of 12 + 5 + 2 + 6 values and 4 flags, after one check of the parameters.
    assert comms[0].calls == [("allreduce", 29)]


def test_small_buckets_make_one_call_each():
    def work(comm):
        params = _params((100,), (100,), (100,))
        for p in params:
            p.grad = mc.tensor(np.ones(p.shape, np.float32))
        comm.allreduce_gradients(params)
        comm.allreduce_gradients(params)  # the plan is kept: no new check
        return [p.grad.numpy() for p in params]

    results, comms = run_ranks(2, work, bucket_bytes=500)
    assert comms[1].calls == [("allreduce", 101)] * 6
    np.testing.assert_array_equal(results[0][2], np.full(100, 4.0))  # 1 + 1, then 2 + 2


def test_parameters_are_broadcast_in_place_from_rank_0():
    def work(comm):
        params = _params((4, 3), (3,))
        arrays = [p.data for p in params]
        for p in params:
            p.data += comm.rank  # every rank starts from different weights
        comm.broadcast_parameters(params)
        assert all(p.data is a for p, a in zip(params, arrays))  # same arrays, new values
        return [p.numpy() for p in params]

    results, _ = run_ranks(2, work)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_ranks_with_different_parameters_all_get_a_clear_error():
    def work(comm):
        params = _params((4, 3), (3 + comm.rank,))
        comm.broadcast_parameters(params)

    with pytest.raises(DistributedError, match=r"parameter 1 is \(4,\) float32 on rank 1, "
                                               r"\(3,\) float32 on rank 0"):
        run_ranks(2, work)


def test_parameters_are_matched_by_name_not_by_the_order_they_were_made_in():
    def work(comm):
        made = dict(zip("ab", _params((3,), (3,))))
        for name, p in made.items():
            p.data[:] = {"a": 1.0, "b": 2.0}[name] + 10 * comm.rank
        pairs = sorted(made.items(), reverse=comm.rank == 1)  # rank 1 made b first
        comm.broadcast_parameters(pairs)
        return {name: p.numpy() for name, p in made.items()}

    results, _ = run_ranks(2, work)
    for values in results:
        np.testing.assert_array_equal(values["a"], np.full(3, 1.0))
        np.testing.assert_array_equal(values["b"], np.full(3, 2.0))

    def renamed(comm):
        params = _params((3,), (3,))
        comm.broadcast_parameters(zip(["a", "b" if comm.rank == 0 else "c"], params))

    with pytest.raises(DistributedError, match=r"parameter 1 is 'c' \(3,\) float32 on rank 1, "
                                               r"'b' \(3,\) float32 on rank 0"):
        run_ranks(2, renamed)


def test_optimizer_state_and_counts_reach_every_rank():
    def work(comm):
        params = _params((3,))
        optimizer = mc.nn.Adam(params, lr=0.1 * (comm.rank + 1))
        if comm.is_root:
            params[0].grad = mc.tensor(np.ones(3, np.float32))
            optimizer.step()
        comm.broadcast_optimizer_state(optimizer)
        totals = comm.allreduce_sum([comm.rank + 1, 0.5])
        return optimizer.lr, optimizer.state[0]["step"], totals

    results, _ = run_ranks(2, work)
    for lr, step, totals in results:
        assert lr == 0.1 and step == 1
        np.testing.assert_array_equal(totals, [3.0, 1.0])


def test_a_single_process_communicator_changes_nothing():
    comm = LocalCommunicator()
    params = _params((3,))
    params[0].grad = grad = mc.tensor(np.ones(3, np.float32))
    comm.allreduce_gradients(params, average=True)
    comm.broadcast_parameters(params)
    assert params[0].grad is grad and comm.allreduce_sum(4) == 4
    assert comm.traffic.calls == 0 and (comm.rank, comm.size, comm.is_root) == (0, 1, True)


def test_missing_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(DistributedError, match=r"pip install 'minicavs\[distributed\]'"):
        create_communicator()
    with pytest.raises(DistributedError, match="select the cuda device"):
        create_communicator("nccl")


# --- launching ------------------------------------------------------------------------------

def test_launch_is_detected_from_the_launchers_environment():
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "4"})
    assert launched_by_mpi({"PMI_SIZE": "2", "PMI_RANK": "1"})
    assert launched_by_mpi({"PMIX_RANK": "0"})
    assert not launched_by_mpi({"PMI_SIZE": "1"})  # mpiexec -n 1: an ordinary run
    assert not launched_by_mpi({})


def test_open_mpi_gets_its_flags_and_mpich_none(tmp_path):
    for name, banner in [("ompi", "mpiexec (Open MPI) 4.1.4"), ("mpich", "HYDRA build details")]:
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\necho '{banner}'\n")
        fake.chmod(0o755)
        command = mpiexec_command(3, mpiexec=str(fake))
        assert command[:3] == [str(fake), "-n", "3"]
        if name == "ompi":
            assert "--oversubscribe" in command
            assert ("--allow-run-as-root" in command) == (os.geteuid() == 0)
        else:
            assert command == [str(fake), "-n", "3"]


# --- real ranks under mpiexec ---------------------------------------------------------------

TINY = ["--sizes", "65,16,16", "--hidden", "8", "--embed-dim", "8", "--epochs", "1",
        "--no-progress", "--seed", "3"]


def launch(num_ranks, args, cwd, timeout=120):
    """``num_ranks`` ranks of ``python args...`` under mpiexec; (process, seconds taken)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    started = time.monotonic()
    done = subprocess.run(mpiexec_command(num_ranks) + [sys.executable, *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


@pytest.fixture
def restore_blas_threads():
    before = get_blas_threads()
    yield
    if before is not None:
        set_blas_threads(before)


def _saved(path):
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files if k != "__metadata__"}


# The runs differ only in the order of sums (each rank sums its share, one process all rows in
# one GEMM), a rounding error per step. Measured after these 5 Adam steps: 1e-16 in float64,
# 6e-8 in float32 (a few float32 ulps of the weights); the float32 bound leaves 16x headroom.
@pytest.mark.parametrize("dtype,tolerance", [("float64", 1e-10), ("float32", 1e-6)])
def test_two_ranks_end_where_one_process_with_twice_the_batch_ends(dtype, tolerance, tmp_path,
                                                                   restore_blas_threads):
    # 65 trees, 2 ranks x 8 = 16 a step: 5 steps, and in the last one rank 1 has no tree.
    writes = tmp_path / "writes"
    writes.mkdir()
    done, _ = launch(2, [WORKER, "--record-writes", writes, "--", "train", "tree-lstm",
                         "--dtype", dtype, "--batch-size", 8, "--save", "two.npz", *TINY],
                     cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert minicavs_main(["train", "tree-lstm", "--dtype", dtype, "--batch-size", "16",
                          "--save", str(tmp_path / "one.npz"), *TINY]) == 0
    one, two = _saved(tmp_path / "one.npz"), _saved(tmp_path / "two.npz")
    assert sorted(one) == sorted(two) and any(k.startswith("optimizer/") for k in one)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=tolerance, err_msg=name)
    assert one["optimizer/0/step"] == 5  # five steps were compared
    # Rank 0 alone logged and wrote the checkpoint, once per epoch.
    assert (writes / "writes.0").read_text() == "two.npz\n"
    assert not (writes / "writes.1").exists()
    out = done.stdout
    assert out.count("epoch 1/1") == 1 and out.count("test root accuracy") == 1
    assert "data-parallel over 2 rank(s)" in out and "on 2 ranks" in out


def test_two_ranks_resume_a_checkpoint_as_one_process_goes_on(tmp_path, restore_blas_threads):
    # Rank 0 alone reads the checkpoint; rank 1 gets weights and Adam state from it.
    run = ["train", "tree-lstm", "--dtype", "float64", *TINY]
    assert minicavs_main(run + ["--batch-size", "16", "--save", str(tmp_path / "one.npz")]) == 0
    assert minicavs_main(run + ["--batch-size", "16", "--epochs", "2",
                                "--save", str(tmp_path / "one_then_two.npz")]) == 0
    done, _ = launch(2, ["-m", "minicavs", *run, "--batch-size", 8, "--epochs", 2,
                         "--resume", "one.npz", "--save", "resumed.npz"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from one.npz after epoch 1" in done.stdout
    straight, resumed = _saved(tmp_path / "one_then_two.npz"), _saved(tmp_path / "resumed.npz")
    assert resumed["optimizer/0/step"] == 10
    for name in straight:
        np.testing.assert_allclose(resumed[name], straight[name], rtol=0, atol=1e-10,
                                   err_msg=name)


def test_a_rank_that_raises_ends_every_rank_with_its_error(tmp_path):
    done, seconds = launch(2, [WORKER, "--fail-rank", 1, "--at-step", 2, "--", "train",
                               "tree-lstm", "--batch-size", 8, "--save", "", *TINY],
                           cwd=tmp_path, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "ValueError: injected failure on rank 1 at step 2" in output
    assert "rank 1 of 2 stopped on ValueError; aborting all 2 ranks" in output
    assert "test root accuracy" not in output  # rank 0 did not go on alone
    assert seconds < 30, output


def test_a_stalled_rank_times_the_others_out_with_a_clear_error(tmp_path):
    done, seconds = launch(2, [WORKER, "--stall-rank", 1, "--at-step", 2, "--", "train",
                               "tree-lstm", "--batch-size", 8, "--save", "", "--timeout", 2,
                               *TINY], cwd=tmp_path, timeout=60)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "rank 0 of 2: MPI all-reduce" in output and "did not complete within 2 s" in output
    assert "DistributedError" in output and "aborting all 2 ranks" in output
    assert seconds < 30, output  # not the 600 s the stalled rank sleeps


def test_examples_train_data_parallel_when_launched_by_mpiexec(tmp_path):
    done, _ = launch(2, [ROOT / "examples" / "tree_fc.py", "--epochs", 1, "--train-size", 20,
                         "--leaves", 8, "--hidden", 8, "--batch-size", 4, "--no-progress"],
                     cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("data-parallel over 2 rank(s) (MpiCommunicator, implied by "
                             "mpiexec)") == 1
    assert done.stdout.count("tree_fc: held-out loss") == 1


@pytest.mark.gpu
def test_nccl_ranks_match_one_process(tmp_path, restore_blas_threads):
    from minicavs.cuda.nccl import nccl_library

    nccl_library()  # fails with what to install when CuPy has no NCCL
    ranks = min(2, mc.backend.gpu_count())
    done, _ = launch(ranks, ["-m", "minicavs", "train", "tree-lstm", "--device", "cuda",
                             "--distributed", "--communicator", "nccl", "--dtype", "float64",
                             "--batch-size", 16 // ranks, "--save", "nccl.npz", *TINY],
                     cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NcclCommunicator" in done.stdout
    assert minicavs_main(["train", "tree-lstm", "--dtype", "float64", "--batch-size", "16",
                          "--save", str(tmp_path / "one.npz"), *TINY]) == 0
    one, nccl = _saved(tmp_path / "one.npz"), _saved(tmp_path / "nccl.npz")
    for name in one:
        np.testing.assert_allclose(nccl[name], one[name], rtol=0, atol=1e-10, err_msg=name)
