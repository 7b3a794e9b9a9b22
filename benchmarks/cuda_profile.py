"""Is a benchmark model's GPU step bound by the host or by the device, and by which kernels?

    python benchmarks/cuda_profile.py --workloads tree_fc,var_lstm --sst DATA/sst/train.txt
    python benchmarks/cuda_profile.py --workloads autobatch:tagger:agenda+ --data DATA

Each workload's model (``benchmarks/systems/minicavs_cpu.py``, device ``"cuda"``; or
``autobatch:TASK:STRATEGY``, the plain per-sample model of ``autobatch_table.py`` under
``mc.autobatch``) trains on mini-batches of 64 samples. After warm-up steps, for ``--steps``
steps: the host's time to issue a step (until the last launch returns) and the step's time
until the device has finished; then, over as many steps again, the device's busy time (the sum
of its kernels' and copies' durations, from PyTorch's profiler, which records every kernel of
the process through CUPTI, CuPy's and cuBLAS's too) against their time. Busy time near the
step's time: the device sets the pace, and the kernel table says where it goes; far below it:
the host does. Without PyTorch's CUDA build the kernel table is left out; on the emulated
device (``MINICAVS_CUDA_EMULATE=1``) only the host times are real.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks import autobatch_table, common  # noqa: E402
from benchmarks.systems import minicavs_cpu  # noqa: E402


def _synchronize():
    from minicavs import backend

    if backend.cuda_emulated():
        return
    backend._import_cupy().cuda.Device().synchronize()


def _profiler():
    """PyTorch's profiler over CUDA activity, or None (with the reason printed)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("  (no PyTorch: no kernel table)")
        return None
    if not torch.cuda.is_available():
        print("  (PyTorch sees no GPU: no kernel table)")
        return None
    torch.cuda.init()
    return profile(activities=[ProfilerActivity.CUDA])


def _vertex_step(name, size, sst):
    """(step(i), samples a step) of a benchmark workload's vertex-function model."""
    import minicavs as mc

    data = common.load_workload(name, size, sst_path=sst)
    F, parameters, prepare, loss_of = minicavs_cpu.build(data, common.init_params(data))
    optimizer = mc.nn.Adam(parameters, lr=1e-3)
    batches = data["batches"]
    for batch in batches:  # (each sample's InputGraph built once, as in a later epoch)
        prepare(batch)

    def step(i):
        optimizer.zero_grad()
        loss = loss_of(*prepare(batches[i % len(batches)]))
        loss.backward()
        optimizer.step()
    return step, len(batches[0])


def _autobatch_step(task, strategy, size):
    """(step(i), samples a step) of ``autobatch_table.py``'s plain model of ``task``."""
    samples, vocab = autobatch_table.load(task, size)
    train = autobatch_table.minicavs_plain(task, strategy, samples, vocab)
    batches = [samples[i:i + 64] for i in range(0, len(samples) - 63, 64)]
    return (lambda i: train(batches[i % len(batches)])), 64


def profile_workload(name, size, steps, warmup, top, sst):
    import minicavs as mc

    mc.set_device("cuda")
    if name.startswith("autobatch:"):
        _, task, strategy = name.split(":")
        step, samples = _autobatch_step(task, strategy, size)
    else:
        step, samples = _vertex_step(name, size, sst)

    for i in range(warmup):
        step(i)
    _synchronize()
    issue, wall = [], []
    for i in range(steps):
        began = time.perf_counter()
        step(warmup + i)
        issue.append(time.perf_counter() - began)
        _synchronize()
        wall.append(time.perf_counter() - began)
    print(f"{name}: {samples} samples a step, median of {steps} steps after {warmup}: "
          f"host issues a step in {_median(issue) * 1e3:.2f} ms, the device finishes it at "
          f"{_median(wall) * 1e3:.2f} ms")
    prof = _profiler()
    if prof is None:
        return
    with prof:
        began = time.perf_counter()
        for i in range(steps):
            step(warmup + steps + i)
        _synchronize()
        elapsed = time.perf_counter() - began
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    busy = sum(e.device_time_total for e in events) / 1e6
    print(f"  device busy {busy / steps * 1e3:.2f} ms a step of {elapsed / steps * 1e3:.2f} ms "
          f"({busy / elapsed:.0%}); its {top} largest parts:")
    events.sort(key=lambda e: -e.device_time_total)
    for e in events[:top]:
        print(f"  {e.device_time_total / steps / 1e3:9.3f} ms {e.count / steps:7.1f} calls "
              f"{e.device_time_total / max(e.count, 1):9.1f} us  {e.key[:90]}")


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="tree_fc,var_lstm,tree_lstm_256")
    parser.add_argument("--size", type=int, default=640, help="samples loaded per workload")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="kernels listed per workload")
    parser.add_argument("--sst", default=None, help="SST's train.txt (else synthetic trees)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="the autobatch tasks' data folder (autobatch_table.py --data)")
    args = parser.parse_args(argv)
    if args.data:
        os.environ[autobatch_table.DATA_ENV] = os.path.abspath(args.data)
    for name in args.workloads.split(","):
        profile_workload(name, args.size, args.steps, args.warmup, args.top, args.sst)


if __name__ == "__main__":
    main()
