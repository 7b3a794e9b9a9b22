"""Where an autobatched training step goes, beside DyNet's, on the same mini-batches.

    python benchmarks/autobatch_phases.py tagger              # tagger-char, treelstm
    python benchmarks/autobatch_phases.py treelstm --strategy depth+ --threads 1
    python benchmarks/autobatch_phases.py tagger --device cuda --strategy agenda   # on a GPU

minicavs (``minicavs.models.plain``, ``mc.autobatch``): recording (the model's Python and the
nodes, from the block's start to the forcing), scheduling and memory layout, forward and
backward, from the segment's ``stats`` (``AutoBatch.explain``). DyNet (``dynet38``, the models of
``autobatch_table.py``, agenda autobatching): graph building (``renew_cg`` and the model's
expressions), ``value()`` (its forward, scheduling included), ``backward()``. Each is the median
over the mini-batches after the first; DyNet runs in a child process (it reads its autobatch
flag once per process) and is skipped when it is not installed.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import autobatch_table  # noqa: E402  (the models and data of the table)

PHASES = ["record", "schedule", "forward", "backward", "step", "wait"]


def chunks(task, batches):
    samples, vocab = autobatch_table.load(task, 64 * batches if task != "tagger-char" else 2000)
    return [samples[i * 64:(i + 1) * 64] for i in range(batches)], samples, vocab


def minicavs_phases(task, strategy, batches, threads, hoist=False, device="cpu"):
    """The phases' medians; on a GPU the step ends when the device has finished its work, and
    ``wait`` is how long the host then waited for it (about 0: the host sets the pace)."""
    import minicavs as mc
    from minicavs.models.plain import BiLSTMTagger, PlainTreeLSTM
    from minicavs.training import set_blas_threads

    set_blas_threads(threads)
    wait = autobatch_table._device_wait("minicavs", device)
    parts, samples, vocab = chunks(task, batches)
    if task == "treelstm":
        model = PlainTreeLSTM(len(vocab))
    else:
        model = BiLSTMTagger([w for s in samples for w, _ in s],
                             [t for s in samples for _, t in s], char_lstm=task == "tagger-char",
                             hoist=hoist)
    optimizer = mc.nn.SGD(model.parameters(), lr=autobatch_table.LR)
    rows = []
    for chunk in parts:
        began = time.perf_counter()
        optimizer.zero_grad()
        with mc.autobatch(strategy) as ab:
            loss = mc.add_n([model.loss(s) for s in chunk])
            loss.backward()
        mc.nn.clip_grad_norm(model.parameters(), autobatch_table.CLIP)
        optimizer.step()
        issued = time.perf_counter()
        wait()
        step = time.perf_counter() - began
        st = ab.segments[0].stats
        rows.append([st["record_s"], st["schedule_s"], st["forward_s"], st["backward_s"], step,
                     step - (issued - began), st["nodes"], st["batches"]])
    return np.median(np.array(rows[1:]), axis=0)


def dynet_phases(task, batches):
    import dynet_config
    dynet_config.set(autobatch=1, mem="2048", random_seed=1)
    import dynet as dy

    parts, samples, vocab = chunks(task, batches)
    step = autobatch_table.dynet_models(task, samples, vocab)
    cells = {getattr(c.cell_contents, "__name__", ""): c.cell_contents for c in step.__closure__}
    loss_of = cells["loss_of"]
    trainer = next(c.cell_contents for c in step.__closure__
                   if "Trainer" in type(c.cell_contents).__name__)
    rows = []
    for chunk in parts:
        t0 = time.perf_counter()
        dy.renew_cg()
        loss = dy.esum([loss_of(s) for s in chunk])
        t1 = time.perf_counter()
        loss.value()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        trainer.update()
        t4 = time.perf_counter()
        rows.append([t1 - t0, 0.0, t2 - t1, t3 - t2, t4 - t0, 0.0])
    return np.median(np.array(rows[1:]), axis=0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=autobatch_table.TASKS)
    parser.add_argument("--strategy", default="agenda+")
    parser.add_argument("--batches", type=int, default=12, help="mini-batches of 64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hoist", action="store_true",
                        help="the taggers' LSTMs with their input projections hoisted "
                             "(BiLSTMTagger(hoist=True))")
    parser.add_argument("--no-dynet", action="store_true", help="minicavs's phases only")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: minicavs on the GPU (DyNet, CPU-only here, is left out)")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="a data folder with tags/dev.txt and sst/train.txt (docs/data.md; "
                             "default: embedded synthetic sentences and trees)")
    parser.add_argument("--dynet-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.data is not None and not args.dynet_child:  # checked first; the child reads the env
        path = autobatch_table.data_files(args.data)[args.task]
        if not path.is_file():
            raise SystemExit(f"--data {args.data}: missing {path} (docs/data.md)")
        os.environ[autobatch_table.DATA_ENV] = str(pathlib.Path(args.data).resolve())
    if args.dynet_child:
        print(json.dumps(dynet_phases(args.task, args.batches).tolist()))
        return
    ours = minicavs_phases(args.task, args.strategy, args.batches, args.threads, args.hoist,
                           args.device)
    theirs = None
    if not args.no_dynet and args.device == "cpu":
        run = subprocess.run([sys.executable, __file__, args.task, "--batches",
                              str(args.batches), "--dynet-child"], capture_output=True,
                             text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        try:
            theirs = json.loads(run.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(f"(DyNet did not run: {run.stderr.strip().splitlines()[-1:] or 'no output'})")
    print(f"{args.task}, 64 samples a mini-batch, median of {args.batches - 1}; minicavs "
          f"{args.strategy} on {args.device} ({int(ours[6])} nodes, {int(ours[7])} batches), "
          f"{args.threads} thread(s)")
    print(f"{'phase (ms)':<12} {'minicavs':>9} {'DyNet':>9}")
    for i, phase in enumerate(PHASES):
        other = "-" if theirs is None or phase == "wait" else (
            f"{theirs[i] * 1e3:9.1f}" if theirs[i] else "(fwd)")
        print(f"{phase:<12} {ours[i] * 1e3:9.1f} {other:>9}")


if __name__ == "__main__":
    main()
