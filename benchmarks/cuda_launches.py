"""GPU launches per level of the benchmark models, on the emulated CUDA device (issue 41).

    MINICAVS_CUDA_EMULATE=1 python benchmarks/cuda_launches.py [--workloads tree_lstm,var_lstm]
    MINICAVS_CUDA_EMULATE=1 python benchmarks/cuda_launches.py --hidden 8 --steps 30  # host time

Each workload's model (``benchmarks/systems/minicavs_cpu.py``, device ``"cuda"``) trains for
``--steps`` mini-batches of 64 samples; the table gives, from ``F.explain()`` of the last step,
the launches (kernels + library calls + copies + NumPy-forwarded elementwise calls) per level
step of F and of ∂F, by category, the seconds per level step (the emulation's: the shim and
NumPy on this CPU, not a GPU's time) and the host's share of them: the microseconds Python took
to issue one level step, the emulated device's work left out (what a GPU waits on when the
launches are short). The loss of the first step is compared with the NumPy backend's. Launches, not FLOPs, are the GPU's cost at these sizes (DESIGN.md), so these
counts are what GPU speed work is measured by. On a real GPU (no emulation) the counts are not
available yet and the table says so.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks import common  # noqa: E402
from benchmarks.systems import minicavs_cpu  # noqa: E402

DEFAULT = "tree_lstm,tree_fc,var_lstm,tree_rnn,rntn"


def first_loss(data, params, device):
    import minicavs as mc

    mc.set_device(device)
    F, parameters, prepare, loss_of = minicavs_cpu.build(data, params)
    loss = loss_of(*prepare(data["batches"][0]))
    return float(loss.item())


def measure(data, params, steps):
    import minicavs as mc

    mc.set_device("cuda")
    F, parameters, prepare, loss_of = minicavs_cpu.build(data, params)
    optimizer = mc.nn.Adam(parameters, lr=1e-3)
    stats, host = None, []
    for step in range(steps):
        samples = data["batches"][step % len(data["batches"])]
        optimizer.zero_grad()
        loss = loss_of(*prepare(samples))
        loss.backward()
        optimizer.step()
        loss.item()
        stats = dict(F.explain())
        host.append((stats["forward_host_us_per_level"], stats["backward_host_us_per_level"]))
    if None not in host[-1]:  # the host's time: the fastest step after the first (compiles;
        later = host[1:] or host  # the slower ones waited on other processes)
        stats["forward_host_us_per_level"] = min(f for f, _ in later)
        stats["backward_host_us_per_level"] = min(b for _, b in later)
    return stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=DEFAULT)
    parser.add_argument("--size", type=int, default=128, help="samples loaded per workload")
    parser.add_argument("--steps", type=int, default=4, help="mini-batches trained")
    parser.add_argument("--hidden", type=int, default=None,
                        help="hidden (and embedding) size instead of the workload's: a small one "
                             "times the host with little emulated work beside it")
    args = parser.parse_args(argv)
    from minicavs import backend

    if not backend.cuda_emulated():
        if not backend.gpu_available():
            raise SystemExit("cuda_launches.py: no GPU here; run it on the emulated device: "
                             "MINICAVS_CUDA_EMULATE=1 python benchmarks/cuda_launches.py")
        print("note: MINICAVS_CUDA_EMULATE is not 1: counts need the emulated device")
    rows, issued = [], []
    for name in args.workloads.split(","):
        data = common.load_workload(name, args.size)
        if args.hidden:
            data["hidden"] = data["embed"] = args.hidden
        params = common.init_params(data)
        cpu, cuda = first_loss(data, params, "cpu"), first_loss(data, params, "cuda")
        stats = measure(data, params, args.steps)
        issued.append((name, (stats["forward_backend"], stats["backward_backend"])))
        levels = stats["levels"]
        rows.append((name, data["hidden"], levels, stats["forward_launches_per_level"],
                     stats["backward_launches_per_level"],
                     stats.get("forward_launches_by_category"),
                     stats.get("backward_launches_by_category"),
                     stats["forward_seconds"] / levels, stats["backward_seconds"] / levels,
                     stats.get("forward_host_us_per_level"),
                     stats.get("backward_host_us_per_level"),
                     abs(cpu - cuda) / max(abs(cpu), 1.0)))
    print(f"{'workload':<14}{'H':>5}{'levels':>8}{'fwd/level':>11}{'bwd/level':>11}"
          f"{'fwd ms/level':>14}{'bwd ms/level':>14}{'fwd host µs':>13}{'bwd host µs':>13}"
          f"{'loss rel. diff':>16}")
    for name, h, levels, fwd, bwd, _, _, fs, bs, fh, bh, diff in rows:
        show = (lambda x, f="{:.2f}": "n/a" if x is None else f.format(x))  # noqa: E731
        print(f"{name:<14}{h:>5}{levels:>8}{show(fwd):>11}{show(bwd):>11}"
              f"{fs * 1e3:>14.2f}{bs * 1e3:>14.2f}{show(fh, '{:.0f}'):>13}"
              f"{show(bh, '{:.0f}'):>13}{diff:>16.1e}")
    print("\nby category (per level step):")
    for name, *_, fcat, bcat, _, _, _, _, _ in rows:
        print(f"  {name}: forward {_fmt(fcat)}; backward {_fmt(bcat)}")
    print("\nwho issued the levels (explain()'s backends, F / ∂F):")
    for name, backends in issued:
        print(f"  {name}: {backends[0]} / {backends[1]}")


def _fmt(categories):
    if not categories:
        return "n/a"
    return ", ".join(f"{k} {v:.2f}" for k, v in categories.items())


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - started:.0f} s)")
    np.seterr(all="warn")
