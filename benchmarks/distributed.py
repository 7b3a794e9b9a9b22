"""Data-parallel training on this machine: steps per second with 1 and 2 ranks, and what the
ranks communicate per step, the figures ``docs/distributed.md`` plans larger clusters from.

    python benchmarks/distributed.py                  # about 40 s
    python benchmarks/distributed.py --embed-dim 128 --hidden 128 --steps 60

The model is the main job's (``minicavs train tree-lstm``: binary Tree-LSTM on the synthetic
treebank). Each configuration runs in its own processes (``mpiexec -n N`` for N ranks, a plain
process for the single-process baseline), warms up, then times ``--steps`` training steps of
:func:`minicavs.training.train_epoch`; the fastest of ``--repeats`` runs is reported.
Reported per configuration: steps/s and trees/s, the time per step spent in collectives
(waiting for the slower rank included), and the payload bytes and calls per step and rank. A
last run times bare all-reduces between 2 ranks (latency and bandwidth of this machine's MPI).
Then it projects N ranks on cluster networks from one rank's step time, the bytes per step
and the imbalance of tree batches (the plan in ``docs/distributed.md``). Writes
``distributed.json`` under ``--out``.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULT = "RESULT "  # the line a worker's rank 0 prints its JSON on


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=32,
                        help="trees per rank and step in the weak-scaling runs (default 32)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs per configuration; the fastest is reported (default 5: "
                             "other work on a shared machine only ever slows a run down)")
    parser.add_argument("--out", default="bench-results", help="folder for distributed.json")
    parser.add_argument("--worker", choices=["train", "allreduce"], help=argparse.SUPPRESS)
    parser.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# --- inside the ranks -------------------------------------------------------------------------

def timed(comm):
    """Wrap the communicator's collectives so their wall time adds up in ``seconds[0]``."""
    seconds = [0.0]
    for name in ("allreduce_gradients", "allreduce_sum"):
        method = getattr(comm, name)

        def wrapper(*args, _method=method, **kwargs):
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                seconds[0] += time.perf_counter() - started

        setattr(comm, name, wrapper)
    return seconds


def train_worker(args):
    from minicavs import backend, data, training
    from minicavs.distributed import DistributedSampler, LocalCommunicator, create_communicator
    from minicavs.models import TreeLSTMClassifier
    from minicavs.nn import Adam

    comm = create_communicator() if args.distributed else LocalCommunicator()
    backend.seed(0)
    training.set_blas_threads(1)
    steps = args.warmup + args.steps
    splits = data.make_splits(seed=0, sizes=(args.batch_size * comm.size * steps, 1, 1))
    model = TreeLSTMClassifier(len(splits.vocab), args.embed_dim, args.hidden, 5)
    optimizer = Adam(model.parameters(), lr=0.005)
    comm.broadcast_parameters(model.parameters())
    batches = DistributedSampler(splits.train, args.batch_size, rank=comm.rank, size=comm.size,
                                 seed=0).global_batches(1)
    training.train_epoch(model, optimizer, batches[:args.warmup], comm=comm, progress=False)
    in_collectives = timed(comm)
    calls, payload = comm.traffic.calls, comm.traffic.bytes
    stats = training.train_epoch(model, optimizer, batches[args.warmup:], comm=comm,
                                 progress=False)
    # The slowest rank sets the pace; report it.
    seconds = max(comm.allgather_object(stats.seconds))
    comm_seconds = max(comm.allgather_object(in_collectives[0]))
    if comm.is_root:
        parameters = sum(p.size for p in model.parameters())
        print(RESULT + json.dumps({
            "ranks": comm.size, "batch_per_rank": args.batch_size,
            "global_batch": args.batch_size * comm.size, "steps": args.steps,
            "steps_per_second": args.steps / seconds, "trees_per_second": stats.samples / seconds,
            "collective_ms_per_step": 1000 * comm_seconds / args.steps,
            "calls_per_step": (comm.traffic.calls - calls) / args.steps,
            "payload_bytes_per_step": (comm.traffic.bytes - payload) / args.steps,
            "parameters": parameters,
            "parameter_bytes": sum(p.size * p.dtype.itemsize for p in model.parameters()),
        }), flush=True)


def allreduce_worker(args):
    from minicavs.distributed import create_communicator

    comm = create_communicator()
    rows = []
    for nbytes in [8, 4096, 65536, 2 ** 20, 4 * 2 ** 20, 16 * 2 ** 20]:
        buffer = np.ones(nbytes // 4, np.float32)
        repeats = max(5, min(200, 2 ** 26 // nbytes))
        for _ in range(3):
            comm._allreduce_array(buffer)
        comm.barrier()
        started = time.perf_counter()
        for _ in range(repeats):
            comm._allreduce_array(buffer)
        rows.append({"bytes": nbytes, "seconds": (time.perf_counter() - started) / repeats})
    if comm.is_root:
        print(RESULT + json.dumps({"ranks": comm.size, "allreduce": rows}), flush=True)


# --- the plan for larger clusters -------------------------------------------------------------

# Typical figures of cluster networks (latency per message, bandwidth per direction), not
# measured here: the projection shows what each would give.
NETWORKS = [("10 Gb/s Ethernet", 20e-6, 1.1e9), ("25 Gb/s Ethernet", 10e-6, 2.8e9),
            ("100 Gb/s InfiniBand", 2e-6, 11e9)]
PROJECTED_RANKS = [1, 2, 4, 8, 16, 64]


def imbalance_factors(batch_size, ranks, draws=2000):
    """E[slowest of N ranks] / E[one rank] for batches of ``batch_size`` synthetic trees: every
    step waits for the slowest rank. A rank's work is counted as its vertices or as its levels
    (the batching tasks, each with a fixed cost), whichever varies more."""
    from minicavs import data
    from minicavs.vertex import GraphBatch, InputGraph

    trees = data.make_splits(seed=0, sizes=(2000, 1, 1)).train
    vertices = np.array([len(t.children) for t in trees])
    levels = np.array([GraphBatch([InputGraph(t.children)]).num_levels for t in trees])
    rng = np.random.default_rng(0)
    factors = {}
    for n in ranks:
        picks = rng.integers(0, len(trees), size=(draws, n, batch_size))
        work_v = vertices[picks].sum(axis=2)
        work_l = levels[picks].max(axis=2)
        factors[n] = max(work_v.max(axis=1).mean() / work_v.mean(),
                         work_l.max(axis=1).mean() / work_l.mean())
    return factors


def projected_step_seconds(step_seconds, imbalance, payload_bytes, ranks, latency, bandwidth):
    """One step of N ranks: the slowest rank's compute, a ring all-reduce of the gradients
    (2 (N-1) messages, 2 (N-1)/N of the payload through each link) and the all-reduce of the
    step's target count (2 log2 N messages)."""
    if ranks == 1:
        return step_seconds
    ring = 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * payload_bytes / bandwidth
    count = 2 * int(np.ceil(np.log2(ranks))) * latency
    return step_seconds * imbalance + ring + count


def print_projection(single, payload_bytes, batch_size):
    step = 1 / single["steps_per_second"]
    factors = imbalance_factors(batch_size, PROJECTED_RANKS)
    print(f"projection (weak scaling, B={batch_size} per rank; one rank's step "
          f"{1000 * step:.1f} ms measured, gradients {payload_bytes:,.0f} bytes): trees/s and "
          f"efficiency against N independent ranks")
    print(f"  {'ranks':>5} {'imbalance':>9}" + "".join(f" {name:>26}" for name, *_ in NETWORKS))
    rows = []
    for n in PROJECTED_RANKS:
        cells, row = [], {"ranks": n, "imbalance": factors[n]}
        for name, latency, bandwidth in NETWORKS:
            seconds = projected_step_seconds(step, factors[n], payload_bytes, n, latency,
                                             bandwidth)
            rate, efficiency = n * batch_size / seconds, step / seconds
            cells.append(f"{rate:>12,.0f} trees/s {100 * efficiency:>5.1f}%")
            row[name] = {"trees_per_second": rate, "efficiency": efficiency}
        rows.append(row)
        print(f"  {n:>5} {factors[n]:>9.2f}" + "".join(f" {c:>26}" for c in cells))
    return rows


# --- the driver -------------------------------------------------------------------------------

def run(ranks, args, worker, extra=()):
    """One configuration in fresh processes; rank 0's JSON."""
    from minicavs.distributed import mpiexec_command

    command = [sys.executable, str(Path(__file__).resolve()), "--worker", worker,
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--embed-dim", str(args.embed_dim), "--hidden", str(args.hidden), *extra]
    if ranks:
        command = mpiexec_command(ranks) + command + ["--distributed"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in done.stdout.splitlines() if l.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][len(RESULT):])


def main(argv=None):
    args = parse_args(argv)
    if args.worker == "train":
        return train_worker(args)
    if args.worker == "allreduce":
        return allreduce_worker(args)

    b = args.batch_size
    configurations = [  # (label, ranks under mpiexec or 0 for a plain process, batch per rank)
        (f"1 process, B={b}", 0, b),
        (f"1 rank under mpiexec, B={b}", 1, b),
        (f"1 process, B={2 * b}", 0, 2 * b),
        (f"2 ranks, B={b} each (global {2 * b})", 2, b),
    ]
    print(f"Tree-LSTM E={args.embed_dim} H={args.hidden}, synthetic treebank, "
          f"{args.steps} timed steps after {args.warmup}; {os.cpu_count()} cores")
    header = (f"{'configuration':<40} {'steps/s':>8} {'trees/s':>8} {'comm ms/step':>13} "
              f"{'calls/step':>10} {'bytes/step/rank':>16}")
    print(header)
    print("-" * len(header))
    best = {}
    for _ in range(args.repeats):  # round-robin, so each configuration meets the same noise
        for label, ranks, batch in configurations:
            row = run(ranks, args, "train", ["--batch-size", str(batch)])
            if label not in best or row["steps_per_second"] > best[label]["steps_per_second"]:
                best[label] = dict(row, configuration=label)
    results = [best[label] for label, *_ in configurations]
    for row in results:
        print(f"{row['configuration']:<40} {row['steps_per_second']:>8.1f} "
              f"{row['trees_per_second']:>8.0f} {row['collective_ms_per_step']:>13.2f} "
              f"{row['calls_per_step']:>10.1f} {row['payload_bytes_per_step']:>16,.0f}")
    one, same_steps, two = results[0], results[2], results[3]
    print(f"2 ranks: {two['trees_per_second'] / one['trees_per_second']:.2f}x the trees/s of "
          f"one process with the same B per rank (weak scaling); "
          f"{two['steps_per_second'] / same_steps['steps_per_second']:.2f}x the steps/s of one "
          f"process with the same global batch (the same steps, as the tests check)")
    print(f"parameters: {one['parameters']:,} ({one['parameter_bytes']:,} bytes)")
    runs = [run(2, args, "allreduce")["allreduce"] for _ in range(args.repeats)]
    latency = {"allreduce": [min(rows, key=lambda r: r["seconds"]) for rows in zip(*runs)]}
    print("bare all-reduce between 2 ranks (MPI, shared memory):")
    for row in latency["allreduce"]:
        print(f"  {row['bytes']:>10,} bytes  {1e6 * row['seconds']:>9.1f} µs  "
              f"{row['bytes'] / row['seconds'] / 1e9:>6.2f} GB/s")
    projection = print_projection(one, two["payload_bytes_per_step"], b)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "distributed.json").write_text(json.dumps(
        {"training": results, "allreduce": latency["allreduce"], "projection": projection,
         "cores": os.cpu_count(), "arguments": vars(args)}, indent=2))
    print(f"wrote {out / 'distributed.json'}")


if __name__ == "__main__":
    main()
