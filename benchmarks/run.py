"""The benchmark of the Cavs evaluation: minicavs against PyTorch and DyNet.

    python benchmarks/run.py --quick            # smoke run (docs/benchmarks: minutes)
    python benchmarks/run.py                    # the full run (tens of minutes on 2 cores)
    python benchmarks/run.py --data ../shared/data   # on SST and PTB instead of synthetic data
    python benchmarks/run.py --workloads tree_lstm --systems minicavs,dynet --epochs 5
    python benchmarks/run.py --rounds 3         # each workload's systems run 3 times
    python benchmarks/run.py --cuda             # on a GPU: minicavs-cuda against PyTorch CUDA
    python benchmarks/run.py --lrcn             # conv2d and the LRCN example against PyTorch

Every (workload, system) pair trains in its own subprocess, so peak RSS and thread pools do not
mix. A workload's systems run side by side but never at once: an epoch each in turn (their
setup too), so a slow minute of a shared machine costs each system an epoch, not one system its
whole run, and each keeps its best epoch (``--one-at-a-time``: each system's run straight
through, one system after another). Prints a table per workload (throughput, minicavs ÷ each system, share
of the FLOP floor, construction time, peak memory, first-batch loss), the construction vs
computation breakdown (Cavs Fig. 9) and the minicavs ablation (Fig. 10); writes
``results.json`` and ``results.png`` (with matplotlib) under ``--out`` — only when something
was measured: a run where every system is missing is refused before it starts, and never
overwrites earlier results.

The data is embedded by default (the synthetic treebank's trees and sentences, so a bare clone
runs it); ``--data DIR`` reads SST's train.txt and PTB's ptb.valid.txt from a folder laid out
as docs/data.md describes (``DIR/sst/``, ``DIR/ptb/``), as the Cavs paper's workloads do.
"""

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from minicavs.vertex import Options  # noqa: E402

DEFAULT_SYSTEMS = ["minicavs", "minicavs-recursive", "minicavs-cuda", "torch-eager",
                   "torch-batched", "dynet", "c-reference"]
# --cuda: the GPU comparison. One epoch is the whole SST training set, and the goal is that
# minicavs-cuda trains the Tree-LSTM-256 on it in under a second on an H100-class GPU.
CUDA_SYSTEMS = ["minicavs-cuda", "torch-batched-cuda"]
CUDA_WORKLOAD = "tree_lstm_256"
SST_TRAIN_TREES = 8544
CUDA_GOAL_SECONDS = 1.0
# One optimisation off at a time: every switchable pass of the vertex runtime (Cavs Fig. 10).
# One row per switch, flipped from its default (inline_windows is off by default: its row is "on").
ABLATION = {f"{f.name} {'off' if f.default else 'on'}": {f.name: not f.default}
            for f in dataclasses.fields(Options)}
# DyNet's autobatcher needs its memory pool preallocated; start here and double on failure.
DYNET_POOL_MB = {"tree_lstm": 256, "tree_lstm_256": 512, "tree_fc": 512, "var_lstm": 512,
                 "tree_rnn": 256, "rntn": 256}
DYNET_POOL_MAX_MB = 8192


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=None,
                        help="comma list of " + ", ".join(common.WORKLOADS) + " (default: all; "
                             "--quick: tree_lstm, tree_fc, var_lstm)")
    parser.add_argument("--systems", default=None,
                        help="comma list of " + ", ".join(common.SYSTEMS) + " (default: "
                             + ", ".join(DEFAULT_SYSTEMS) + "; --cuda: "
                             + ", ".join(CUDA_SYSTEMS) + ")")
    parser.add_argument("--epochs", type=int, default=None,
                        help="measured epochs; throughput is the best (default 3, --quick 1)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up epochs, not measured")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each workload's systems run; each keeps its fastest "
                             "round (default 1)")
    parser.add_argument("--one-at-a-time", dest="in_turns", action="store_false",
                        help="run each system's epochs straight through, one system after "
                             "another; by default a workload's systems run side by side, an "
                             "epoch each in turn, so a slow minute of a shared machine costs "
                             "every system an epoch rather than one system its run")
    parser.add_argument("--size", type=int, default=None,
                        help="samples per epoch for every workload (default: 1024 trees or "
                             "sentences, 256 Tree-FC trees; --quick: 128 / 64)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="a data folder with sst/train.txt and ptb/ptb.valid.txt "
                             "(docs/data.md; default: the embedded synthetic treebank and its "
                             "sentences)")
    parser.add_argument("--sst", default=None,
                        help="SST tree file (default: DIR/sst/train.txt with --data, else "
                             "synthetic trees)")
    parser.add_argument("--ptb", default=None,
                        help="PTB text file (default: DIR/ptb/ptb.valid.txt with --data, else "
                             "synthetic sentences)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per system (torch.set_num_threads, BLAS/OpenMP; default "
                             "all cores, --quick: 1, which keeps a smoke run steady on a busy "
                             "machine)")
    parser.add_argument("--ablation", default=None,
                        help="workloads for the minicavs ablation (default tree_lstm,var_lstm; "
                             "--quick: tree_lstm; 'none' to skip)")
    parser.add_argument("--torch-lstm", choices=["packed", "padded"], default="packed",
                        help="torch-batched Var-LSTM: nn.LSTM over a PackedSequence (PyTorch's "
                             "native CPU loop) or over the padded block (oneDNN's fused LSTM, "
                             "loss on the real tokens only)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument("--autobatch", action="store_true",
                        help="instead: the autobatching table (backward-batching paper, "
                             "Table 2) of benchmarks/autobatch_table.py")
    parser.add_argument("--lrcn", action="store_true",
                        help="instead: conv2d on a LeNet batch and the LRCN of "
                             "examples/lrcn.py against PyTorch (benchmarks/lrcn.py)")
    parser.add_argument("--cuda", action="store_true",
                        help=f"the GPU comparison: {' and '.join(CUDA_SYSTEMS)} on "
                             f"{CUDA_WORKLOAD} over the whole SST training set "
                             f"({SST_TRAIN_TREES:,} trees) per epoch, its ablation, and the "
                             f"floor from the GPU's GEMM rate (goal: an epoch in under "
                             f"{CUDA_GOAL_SECONDS:g} s on an H100-class GPU)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per subprocess")
    parser.add_argument("--out", default=str(common.REPO / "bench-results"),
                        help="folder for results.json and results.png")
    args = parser.parse_args(argv)
    if args.cuda:
        args.systems = args.systems or ",".join(CUDA_SYSTEMS)
        args.workloads = args.workloads or CUDA_WORKLOAD
        args.ablation = args.ablation or CUDA_WORKLOAD
        if args.size is None and not args.quick:
            args.size = SST_TRAIN_TREES
    args.systems = args.systems or ",".join(DEFAULT_SYSTEMS)
    if args.workloads is None:
        args.workloads = "tree_lstm,tree_fc,var_lstm" if args.quick else ",".join(common.WORKLOADS)
    if args.epochs is None:
        args.epochs = 1 if args.quick else 3
    if args.ablation is None:
        args.ablation = "tree_lstm" if args.quick else "tree_lstm,var_lstm"
    if args.threads is None:
        args.threads = 1 if args.quick else (os.cpu_count() or 1)
    if args.quick:
        args.timeout = min(args.timeout, 300)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: give 1 or more")
    args.workloads = _names(args.workloads, common.WORKLOADS, "workload")
    args.systems = _names(args.systems, common.SYSTEMS, "system")
    args.ablation = [] if args.ablation == "none" else _names(args.ablation, common.WORKLOADS,
                                                               "workload")
    if args.data is not None:
        if not Path(args.data).is_dir():
            raise SystemExit(f"--data {args.data}: not a folder (expected one holding "
                             f"sst/train.txt and ptb/ptb.valid.txt; docs/data.md)")
        files = common.data_files(args.data)
        args.sst, args.ptb = args.sst or str(files["sst"]), args.ptb or str(files["ptb"])
    if not (args.autobatch or args.lrcn):
        problems = common.missing_data(args.workloads + args.ablation, args.sst, args.ptb)
        if problems:
            raise SystemExit("benchmarks/run.py: nothing run, the data is missing:\n  "
                             + "\n  ".join(problems))
    return args


def _names(text, known, what):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
    return names


def run_one(system, workload, data_path, args, options=None):
    """One system on one workload in its own process; DyNet's pool grows until it fits."""
    extra = {}
    if system == "dynet":
        pool = DYNET_POOL_MB.get(workload, 512)
        while True:
            os.environ["BENCH_DYNET_MEM"] = str(pool)
            result = common.run_system(system, data_path, args.epochs, args.warmup, args.threads,
                                       options, args.timeout)
            if "pre-allocate enough memory" not in str(result.get("error")) \
                    or pool >= DYNET_POOL_MAX_MB:
                break
            pool *= 2
        extra["dynet_pool_mb"] = pool
    else:
        if system in ("torch-batched", "torch-batched-cuda"):
            options = dict(options or {}, lstm=args.torch_lstm)
        result = common.run_system(system, data_path, args.epochs, args.warmup, args.threads,
                                   options, args.timeout)
    result.update(extra)
    return result


def run_in_turns(runs, workload, data_path, args):
    """``{key: result}`` of ``runs``, ``[(key, system, options)]``: side by side, an epoch each
    in turn (``common.run_in_turns``); a DyNet whose memory pool was too small runs again
    alone, its pool grown as :func:`run_one` grows it."""
    jobs = []
    for key, system, options in runs:
        if system in ("torch-batched", "torch-batched-cuda"):
            options = dict(options or {}, lstm=args.torch_lstm)
        env = {"BENCH_DYNET_MEM": str(DYNET_POOL_MB.get(workload, 512))} \
            if system == "dynet" else {}
        jobs.append((key, ["-m", "benchmarks.worker", *common.system_args(
            system, data_path, args.epochs, args.warmup, options)], env))
    results = common.run_in_turns(jobs, args.threads, args.timeout)
    for key, system, options in runs:
        if system == "dynet":
            if "pre-allocate enough memory" in str(results[key].get("error")):
                results[key] = run_one(system, workload, data_path, args, options)
            else:
                results[key]["dynet_pool_mb"] = DYNET_POOL_MB.get(workload, 512)
    return results


def log(message):
    print(message, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.autobatch:  # its own table: every system writes the same plain models
        from benchmarks import autobatch_table
        return autobatch_table.main(["--threads", str(args.threads or 2)]
                                    + (["--data", args.data] if args.data else [])
                                    + (["--cuda"] if args.cuda else []))
    if args.lrcn:  # its own table too: one process per system and part
        from benchmarks import lrcn
        return lrcn.main(["--threads", str(1 if args.quick else args.threads)]
                         + (["--part", "conv"] if args.quick else []))
    started = time.time()
    out = Path(args.out)
    if args.cuda:  # before any work: without a GPU every row would read "missing"
        reasons = {system: common.check_system(system, args.threads)
                   for system in args.systems}
        if all(reasons.values()):
            raise SystemExit("benchmarks/run.py --cuda: no GPU system can run here, so "
                             "nothing was measured and no results were written:\n  "
                             + "\n  ".join(f"{s}: {r}" for s, r in reasons.items())
                             + "\n(run it on a machine with a CUDA GPU and CuPy: pip install "
                               "-e '.[cuda,bench]'; python -m minicavs doctor checks it)")
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick,
              "epochs": args.epochs, "warmup": args.warmup, "rounds": args.rounds,
              "threads": args.threads,
              "batch_size": common.BATCH_SIZE, "machine": _machine(), "workloads": [],
              "ablation": {}, "missing": {}}

    report["gemm_device"] = "cpu"
    rate = None
    if args.cuda:
        log("measuring the GEMM rate (float32 CuPy matmul on the GPU) ...")
        try:
            rate, by_size = common.gemm_rate_with_threads(args.threads, device="cuda")
            report["gemm_device"] = "cuda"
        except RuntimeError as exc:
            log(f"  no GPU rate ({exc}); the floor uses the CPU's")
    if rate is None:
        log(f"measuring the GEMM rate (float32 NumPy matmul, {args.threads} thread(s)) ...")
        rate, by_size = common.gemm_rate_with_threads(args.threads)
    report["gemm_flops"], report["gemm_flops_by_size"] = rate, by_size
    log(f"  best {rate / 1e9:.1f} GFLOP/s " + ", ".join(f"n={n}: {r / 1e9:.1f}"
                                                       for n, r in by_size.items()))

    missing = {}
    for system in args.systems:
        reason = common.check_system(system, args.threads)
        if reason:
            missing[system] = reason
            log(f"  {system}: missing — {reason}")
    report["missing"] = missing

    sizes = common.QUICK_SIZES if args.quick else common.FULL_SIZES
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        paths = {}
        for workload in dict.fromkeys(args.workloads + args.ablation):
            data = common.load_workload(workload, args.size or sizes[workload], args.sst, args.ptb)
            paths[workload] = common.save_data(data, tmp)
            if workload in args.workloads:
                entry = {key: data[key] for key in ("workload", "title", "unit", "embed",
                                                    "hidden", "units", "num_samples", "source",
                                                    "vocab_size", "batch_size")}
                if "check" in data:  # what the last column shows instead of loss@1
                    entry["check"] = data["check"]
                entry.update(flops=common.count_flops(data), results={})
                report["workloads"].append(entry)

        for entry in report["workloads"]:
            runs = []
            for system in args.systems:
                if system in missing:
                    entry["results"][system] = {"missing": missing[system]}
                elif system == "minicavs-recursive" and \
                        common.WORKLOADS[entry["workload"]].kind not in common.SST_KINDS:
                    continue  # a recursive definition of the tree models only
                elif system == "c-reference" and \
                        common.WORKLOADS[entry["workload"]].kind != "tree_lstm":
                    continue  # hand-written for the Tree-LSTM only
                else:
                    runs.append(system)
            for r in range(args.rounds):
                of_round = f" (round {r + 1} of {args.rounds})" if args.rounds > 1 else ""
                if args.in_turns and len(runs) > 1:
                    log(f"{entry['workload']}: {', '.join(runs)}, an epoch each in turn ..."
                        + of_round)
                    t = time.perf_counter()
                    results = run_in_turns([(s, s, None) for s in runs], entry["workload"],
                                           paths[entry["workload"]], args)
                    log(f"  ({time.perf_counter() - t:.0f} s)")
                else:
                    results = {}
                    for system in runs:
                        log(f"{entry['workload']}: {system} ..." + of_round)
                        t = time.perf_counter()
                        results[system] = run_one(system, entry["workload"],
                                                  paths[entry["workload"]], args)
                        log(f"  {_short(results[system])}  ({time.perf_counter() - t:.0f} s)")
                for system, result in results.items():
                    if args.in_turns and len(runs) > 1:
                        log(f"  {system}: {_short(result)}")
                    entry["results"][system] = _faster(entry["results"].get(system), result)
            entry["results"] = {s: entry["results"][s] for s in args.systems  # (the order
                                if s in entry["results"]}  # asked for, missing ones in place)

        # The ablation runs on the GPU when minicavs-cuda ran (with --cuda: only there), else
        # on the CPU.
        ablated = ("minicavs-cuda" if args.cuda or ("minicavs-cuda" in args.systems
                                                   and "minicavs-cuda" not in missing)
                   else "minicavs")
        report["ablation_system"] = ablated
        if args.ablation and ablated not in missing and ablated not in args.systems:
            reason = common.check_system(ablated, args.threads)
            if reason:
                missing[ablated] = reason
        if args.ablation and ablated in missing:
            log(f"ablation skipped: {ablated} is missing ({missing[ablated]})")
        elif ablated not in missing:
            for workload in args.ablation:
                # The reference is measured here, not taken from the table above: the load of a
                # shared machine drifts, and a reference from minutes earlier made variants look
                # faster than the defaults. All-on runs first and last; the faster is the
                # reference, and how far the two differ is the noise the ratios are read with.
                # In turns (the default) every variant runs in the same minutes as both.
                variants = report["ablation"][workload] = {}
                runs = [("first", ablated, None)] + [
                    (name, ablated, {"vertex": vertex_options})
                    for name, vertex_options in ABLATION.items()
                    if not (name == "streams off" and ablated == "minicavs")] + [
                    ("last", ablated, None)]
                if args.in_turns:
                    log(f"ablation {workload}: all on and {len(runs) - 2} variants, an epoch "
                        f"each in turn ...")
                    results = run_in_turns(runs, workload, paths[workload], args)
                else:
                    results = {}
                    for key, system, options in runs:
                        log(f"ablation {workload}: {key if options else 'all on (' + key + ')'}"
                            f" ...")
                        results[key] = run_one(system, workload, paths[workload], args, options)
                for name in ABLATION:
                    variants[name] = results.get(name) or {
                        "missing": "streams exist only on CUDA"}
                    log(f"  {name}: {_short(variants[name])}")
                variants["all on"] = common.ablation_reference(results["first"], results["last"])
                if args.in_turns:  # (round by round: the same minutes)
                    drift = common.pair_rounds(results["first"], results["last"], {
                        name: r for name, r in variants.items() if name != "all on"})
                    if drift is not None:
                        variants["all on"]["paired_drift"] = drift
                report["ablation"][workload] = {"all on": variants.pop("all on"), **variants}

    report["machine"]["load_after"] = os.getloadavg()
    report["seconds"] = time.time() - started
    print(_header(report))
    reference = "minicavs-cuda" if args.cuda else common.REFERENCE_SYSTEM
    for entry in report["workloads"]:
        print()
        print(common.throughput_table(entry, report["gemm_flops"], reference))
    print()
    print(common.breakdown_table(report["workloads"]))
    if report["ablation"]:
        print()
        print(common.ablation_table(report["ablation"], report["machine"].get("cpu", "")))
    if args.cuda:
        print()
        print(_cuda_goal(report))
    if not _measured_anything(report):
        print()
        print(f"nothing was measured (every system missing or failed): {out} left as it was")
        print(f"total {report['seconds']:.0f} s")
        raise SystemExit(1)
    out.mkdir(parents=True, exist_ok=True)
    json_path = common.write_json(report, out)
    png_path, why_not = common.draw_chart(report, out)
    print()
    print(f"results: {json_path}" + (f", {png_path}" if png_path else f" (no chart: {why_not})"))
    print(f"total {report['seconds']:.0f} s")
    return report


def _faster(kept, new):
    """Of a system's rounds, the result of the fastest (a failed round loses to a measured one);
    ``round_throughputs`` lists every round's (None: failed)."""
    rounds = (kept or {}).get("round_throughputs", []) + [new.get("throughput")]
    best = new if kept is None or new.get("throughput", -1) > kept.get("throughput", -1) \
        else kept
    return dict(best, round_throughputs=rounds)


def _measured_anything(report):
    """Whether any system or ablation variant produced a throughput."""
    results = [r for e in report["workloads"] for r in e["results"].values()]
    results += [r for variants in report["ablation"].values() for r in variants.values()]
    return any(isinstance(r, dict) and "throughput" in r for r in results)


def _short(result):
    if "throughput" in result:
        return (f"{result['throughput']:,.1f} {result['unit']}, epochs "
                + ", ".join(f"{s:.2f}" for s in result["epoch_seconds"]) + " s")
    return "missing: " + result["missing"] if result.get("missing") else \
        "ERROR " + str(result.get("error"))[:300]


def _cuda_goal(report):
    """One line per GPU system: its best epoch of the Tree-LSTM-256, against the goal."""
    lines = []
    for entry in report["workloads"]:
        if entry["workload"] != CUDA_WORKLOAD:
            continue
        full = entry["units"] == SST_TRAIN_TREES and "synthetic" not in entry["source"]
        lines.append(f"Goal: an SST epoch ({SST_TRAIN_TREES:,} trees) of the Tree-LSTM-256 in "
                     f"under {CUDA_GOAL_SECONDS:g} s on an H100-class GPU"
                     + ("" if full else f" (this run: {entry['units']:,} trees per epoch, "
                                        f"{entry['source']}; the goal is judged with --data, "
                                        f"on SST)"))
        for system, r in entry["results"].items():
            if "best_epoch_seconds" not in r:
                lines.append(f"  {system}: {_short(r)}")
                continue
            seconds = r["best_epoch_seconds"]
            verdict = ("met" if seconds < CUDA_GOAL_SECONDS else "not met") if full else \
                f"{seconds * SST_TRAIN_TREES / entry['units']:.2f} s scaled to a full epoch"
            first = r.get("warmup_seconds") or []
            lines.append(f"  {system}: {seconds:.2f} s ({verdict})" + (
                f"; first epoch {first[0]:.2f} s = {first[0] / seconds:.2f}x the best "
                f"(kernels compiled, caches filled)" if first else ""))
    return "\n".join(lines) or f"(no {CUDA_WORKLOAD} in this run)"


def _machine():
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "cpu": common.cpu_description(), "numpy": np.__version__,
            "gemm": _minicavs_gemm(), "load_before": os.getloadavg()}


def _minicavs_gemm():
    """Which gemm minicavs' own products call here (NumPy's BLAS, or MKL where installed and
    measured faster: minicavs/cpu/calibrate.py)."""
    try:
        from minicavs.cpu import build, calibrate

        return calibrate.gemm("float32")[2] if build.unavailable() is None else "none (no native code)"
    except Exception as exc:  # noqa: BLE001 (a report line, not a failure)
        return f"unknown ({type(exc).__name__})"


def _header(report):
    m = report["machine"]
    load = lambda values: "/".join(f"{v:.1f}" for v in values)  # noqa: E731
    return (f"\nminicavs benchmark — {report['started']}, {'quick' if report['quick'] else 'full'}"
            f" run, B={report['batch_size']}, best of {report['epochs']} epoch(s) after "
            f"{report['warmup']} warm-up"
            + (f", best of {report['rounds']} rounds (the systems taking turns)"
               if report.get("rounds", 1) > 1 else "")
            + f", {report['threads']} thread(s) per system\n"
            f"{m.get('cpu', str(m['cpus']) + ' CPUs')}, load average {load(m['load_before'])} before, "
            f"{load(m['load_after'])} after (other work on the machine slows every system); "
            f"GEMM rate {report['gemm_flops'] / 1e9:.1f} GFLOP/s "
            f"({'GPU, CuPy' if report['gemm_device'] == 'cuda' else 'CPU, NumPy'})"
            + (f"; minicavs' own products call {m['gemm']}'s gemm" if m.get("gemm") else ""))


if __name__ == "__main__":
    main()
