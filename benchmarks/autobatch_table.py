"""Tables 2 and 3 of the backward-batching paper: plain per-sample models batched
automatically, in sentences (trees) per second of training, mini-batch 64, on this CPU or
(``--cuda``) on its GPU.

    python benchmarks/run.py --autobatch --threads 2          # the table (via run.py)
    python benchmarks/autobatch_table.py --batches 8 --rounds 3 --threads 2
    python benchmarks/run.py --autobatch --cuda               # Table 3: the GPU, beside this CPU

Tasks: the BiLSTM tagger, the BiLSTM tagger with character LSTMs for rare words (the paper's
sizes: word embedding 128, character embedding 64, LSTM 256 per direction, MLP 32, characters
for words seen fewer than 5 times), and the per-tree Tree-LSTM (E = H = 256). The data is
embedded by default — the synthetic tagged sentences (``minicavs.models.plain.synthetic_tagged``)
and the synthetic treebank — and with ``--data DIR`` the UD English tags (``DIR/tags/dev.txt``)
and SST (``DIR/sst/train.txt``; docs/data.md), as the paper's figures were measured. Systems: minicavs ``mc.autobatch`` with depth, depth+, agenda, agenda+
(``minicavs.models.plain``); DyNet 2.x (dynet38) with its own autobatching, agenda (flag 1)
and depth (flag 2), the models written as dynet-benchmark writes them; PyTorch eager, one
sample at a time; and for the Tree-LSTM minicavs's vertex-function form. Every (system, task)
runs in its own subprocess (DyNet reads its autobatch flag once per process). Every system
trains as DyNet's SimpleSGDTrainer does: SGD at 0.01 on the summed loss, the gradients clipped
to norm 5. A system named ``name:cuda`` runs on the GPU (minicavs's tensors through CuPy,
PyTorch's on its CUDA device); each step then waits for the device, so its time is the GPU's.
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
DATA_ENV = "MINICAVS_BENCH_DATA"  # --data, as the worker subprocesses see it
TASKS = ["tagger", "tagger-char", "treelstm"]
SYSTEMS = ["minicavs-depth", "minicavs-depth+", "minicavs-agenda", "minicavs-agenda+",
           "dynet-depth", "dynet-agenda", "torch-eager", "minicavs-vertex"]
CUDA_SYSTEMS = ["minicavs-depth:cuda", "minicavs-depth+:cuda", "minicavs-agenda:cuda",
                "minicavs-agenda+:cuda", "minicavs-agenda+", "torch-eager:cuda",
                "minicavs-vertex:cuda"]
# Table 3 of the paper (one Tesla P100), agenda+; the target is twice each.
PAPER_P100_AGENDA_PLUS = {"tagger": 801, "tagger-char": 133, "treelstm": 1365}
BATCH = 64
# DyNet's autobatcher needs its memory pool preallocated: start here, double on failure
# (as benchmarks/run.py does for the tree peers).
DYNET_POOL_MB = 512
DYNET_POOL_MAX_MB = 8192
# Every system trains as DyNet's SimpleSGDTrainer(lr 0.01) does, which rescales the gradients to
# an L2 norm of at most 5 (its default clip_threshold). Without the clip the other systems'
# models diverged on the summed loss of 64 samples (the tagger's loss from 4.3e3 to 1.1e5 in
# four steps); their saturated values went subnormal, and each step took 2.5-4x as long on an
# Intel Xeon.
LR, CLIP = 0.01, 5.0


def data_files(folder):
    """The files ``--data folder`` gives the tasks (the layout of docs/data.md)."""
    folder = pathlib.Path(folder)
    return {"treelstm": folder / "sst" / "train.txt", "tagger": folder / "tags" / "dev.txt",
            "tagger-char": folder / "tags" / "dev.txt"}


def load(task, count, folder=None):
    """``count`` samples of ``task`` and the vocabulary (None for the taggers): from ``folder``
    (default: the environment's MINICAVS_BENCH_DATA, which --data sets), else synthetic."""
    sys.path.insert(0, str(ROOT))
    from minicavs import data
    from minicavs.models.plain import read_tagged, synthetic_tagged
    folder = folder or os.environ.get(DATA_ENV) or None
    if task == "treelstm":
        if folder:
            trees = data.read_sst(data_files(folder)[task])
        else:
            trees, _ = data.synthetic_treebank(count, seed=0)
        vocab = data.Vocabulary.build((t.tokens for t in trees))
        return [vocab.encode_tree(t) for t in trees[:count]], vocab
    if folder:
        return read_tagged(data_files(folder)[task], limit=count), None
    return synthetic_tagged(count, seed=0), None


# --- the systems, each: (setup(samples, vocab) -> step(batch)) ---------------------------------

def minicavs_plain(task, strategy, samples, vocab):
    import minicavs as mc  # (tensors on the device the worker set)
    from minicavs.models.plain import BiLSTMTagger, PlainTreeLSTM
    if task == "treelstm":
        model = PlainTreeLSTM(len(vocab))
    else:
        model = BiLSTMTagger([w for s in samples for w, _ in s], [t for s in samples for _, t in s],
                             char_lstm=task == "tagger-char")
    optimizer = mc.nn.SGD(model.parameters(), lr=LR)

    def step(batch):
        optimizer.zero_grad()
        with mc.autobatch(strategy):
            loss = mc.add_n([model.loss(s) for s in batch])
            loss.backward()
        mc.nn.clip_grad_norm(model.parameters(), CLIP)
        optimizer.step()
    return step


def minicavs_vertex(task, samples, vocab):
    import minicavs as mc
    from minicavs.models import TreeLSTMClassifier
    model = TreeLSTMClassifier(len(vocab), embed_dim=256, hidden=256)
    optimizer = mc.nn.SGD(model.parameters(), lr=LR)

    def step(batch):
        optimizer.zero_grad()
        model.loss(model.prepare(batch)).backward()
        mc.nn.clip_grad_norm(model.parameters(), CLIP)
        optimizer.step()
    return step


def dynet_models(task, samples, vocab):
    import dynet as dy
    pc = dy.ParameterCollection()
    if task == "treelstm":
        H = 256
        E = pc.add_lookup_parameters((len(vocab), H))
        W, bW = pc.add_parameters((3 * H, H)), pc.add_parameters(3 * H)
        U, bU = pc.add_parameters((5 * H, 2 * H)), pc.add_parameters(5 * H)
        O, bO = pc.add_parameters((5, H)), pc.add_parameters(5)

        def encode(tree, v):
            kids = tree.children[v]
            if not kids:
                g = dy.affine_transform([bW, W, E[max(int(tree.words[v]), 0)]])
                i, o, u = (dy.pick_range(g, k * H, (k + 1) * H) for k in range(3))
                c = dy.cmult(dy.logistic(i), dy.tanh(u))
            else:
                (hl, cl), (hr, cr) = encode(tree, kids[0]), encode(tree, kids[-1])
                g = dy.affine_transform([bU, U, dy.concatenate([hl, hr])])
                i, fl, fr, o, u = (dy.pick_range(g, k * H, (k + 1) * H) for k in range(5))
                c = (dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(dy.logistic(fl), cl)
                     + dy.cmult(dy.logistic(fr), cr))
            return dy.cmult(dy.logistic(o), dy.tanh(c)), c

        def loss_of(tree):
            h = encode(tree, len(tree.children) - 1)[0]
            return dy.pickneglogsoftmax(dy.affine_transform([bO, O, h]), int(tree.labels[-1]))
    else:
        from collections import Counter
        counts = Counter(w for s in samples for w, _ in s)
        vocab_ids = {w: i + 1 for i, w in enumerate(sorted(counts))}
        tags = {t: i for i, t in enumerate(sorted({t for s in samples for _, t in s}))}
        chars = {c: i + 1 for i, c in enumerate(sorted({c for w in counts for c in w}))}
        rare = {w for w, n in counts.items() if n < 5} if task == "tagger-char" else set()
        WE = pc.add_lookup_parameters((len(vocab_ids) + 1, 128))
        CE = pc.add_lookup_parameters((len(chars) + 1, 64))
        fwd, bwd = dy.VanillaLSTMBuilder(1, 128, 256, pc), dy.VanillaLSTMBuilder(1, 128, 256, pc)
        cfwd, cbwd = dy.VanillaLSTMBuilder(1, 64, 64, pc), dy.VanillaLSTMBuilder(1, 64, 64, pc)
        H1, b1 = pc.add_parameters((32, 512)), pc.add_parameters(32)
        O, bO = pc.add_parameters((len(tags), 32)), pc.add_parameters(len(tags))

        def word(w):
            if w in rare:
                cs = [CE[chars[c]] for c in w]
                return dy.concatenate([cfwd.initial_state().transduce(cs)[-1],
                                       cbwd.initial_state().transduce(cs[::-1])[-1]])
            return WE[vocab_ids.get(w, 0)]

        def loss_of(sentence):
            xs = [word(w) for w, _ in sentence]
            f = fwd.initial_state().transduce(xs)
            b = bwd.initial_state().transduce(xs[::-1])[::-1]
            return dy.esum([dy.pickneglogsoftmax(dy.affine_transform(
                [bO, O, dy.tanh(dy.affine_transform([b1, H1, dy.concatenate([fi, bi])]))]),
                tags[t]) for fi, bi, (_, t) in zip(f, b, sentence)])

    trainer = dy.SimpleSGDTrainer(pc, LR)
    trainer.set_clip_threshold(CLIP)  # (its default, said here: the other systems use CLIP)

    def step(batch):
        dy.renew_cg()
        loss = dy.esum([loss_of(s) for s in batch])
        loss.value()
        loss.backward()
        trainer.update()
    # The trainer keeps a bare C++ pointer to the collection's storage: the Python object must
    # outlive it, or the first update() reads freed memory (the segfault, with or without
    # autobatching, once this function had returned and ``pc`` was collected).
    step.model = pc
    return step


def torch_eager(task, samples, vocab, device="cpu"):
    import torch
    torch.manual_seed(0)
    torch.set_default_device(device)
    F = torch.nn.functional
    if task == "treelstm":
        H = 256
        emb = torch.nn.Embedding(len(vocab), H)
        leaf, node, out = torch.nn.Linear(H, 3 * H), torch.nn.Linear(2 * H, 5 * H), \
            torch.nn.Linear(H, 5)
        params = [*emb.parameters(), *leaf.parameters(), *node.parameters(), *out.parameters()]

        def encode(tree, v):
            kids = tree.children[v]
            if not kids:
                i, o, u = leaf(emb.weight[max(int(tree.words[v]), 0)]).chunk(3)
                c = torch.sigmoid(i) * torch.tanh(u)
            else:
                (hl, cl), (hr, cr) = encode(tree, kids[0]), encode(tree, kids[-1])
                i, fl, fr, o, u = node(torch.cat([hl, hr])).chunk(5)
                c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl
                     + torch.sigmoid(fr) * cr)
            return torch.sigmoid(o) * torch.tanh(c), c

        def loss_of(tree):
            h = encode(tree, len(tree.children) - 1)[0]
            return F.cross_entropy(out(h)[None], torch.tensor([int(tree.labels[-1])]))
    else:
        from collections import Counter
        counts = Counter(w for s in samples for w, _ in s)
        vocab_ids = {w: i + 1 for i, w in enumerate(sorted(counts))}
        tags = {t: i for i, t in enumerate(sorted({t for s in samples for _, t in s}))}
        chars = {c: i + 1 for i, c in enumerate(sorted({c for w in counts for c in w}))}
        rare = {w for w, n in counts.items() if n < 5} if task == "tagger-char" else set()
        WE, CE = torch.nn.Embedding(len(vocab_ids) + 1, 128), torch.nn.Embedding(len(chars) + 1, 64)
        fwd, bwd = torch.nn.LSTMCell(128, 256), torch.nn.LSTMCell(128, 256)
        cfwd, cbwd = torch.nn.LSTMCell(64, 64), torch.nn.LSTMCell(64, 64)
        mlp, out = torch.nn.Linear(512, 32), torch.nn.Linear(32, len(tags))
        mods = [WE, CE, fwd, bwd, cfwd, cbwd, mlp, out]
        params = [p for m in mods for p in m.parameters()]

        def run(cell, xs, size):
            h = c = torch.zeros(1, size)
            hs = []
            for x in xs:
                h, c = cell(x[None], (h, c))
                hs.append(h[0])
            return hs

        def word(w):
            if w in rare:
                cs = [CE.weight[chars[c]] for c in w]
                return torch.cat([run(cfwd, cs, 64)[-1], run(cbwd, cs[::-1], 64)[-1]])
            return WE.weight[vocab_ids.get(w, 0)]

        def loss_of(sentence):
            xs = [word(w) for w, _ in sentence]
            f, b = run(fwd, xs, 256), run(bwd, xs[::-1], 256)[::-1]
            return sum(F.cross_entropy(out(torch.tanh(mlp(torch.cat([fi, bi]))))[None],
                                       torch.tensor([tags[t]]))
                       for fi, bi, (_, t) in zip(f, b, sentence))
    optimizer = torch.optim.SGD(params, lr=LR)

    def step(batch):
        optimizer.zero_grad()
        sum(loss_of(s) for s in batch).backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
    return step


def worker(system, task, batches, threads):
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    system, _, device = system.partition(":")
    device = device or "cpu"
    samples, vocab = load(task, BATCH * (batches + 1) if task != "tagger-char" else 2000)
    wait = _device_wait(system, device)
    if system.startswith("dynet"):
        import dynet_config
        # --dynet-autobatch 1 (agenda) or 2 (depth) and the pool, before dynet is imported
        dynet_config.set(autobatch=1 if system == "dynet-agenda" else 2,
                         mem=os.environ.get("BENCH_DYNET_MEM", str(DYNET_POOL_MB)), random_seed=1)
        step = dynet_models(task, samples, vocab)
    elif system == "torch-eager":
        import torch
        torch.set_num_threads(threads)
        step = torch_eager(task, samples, vocab, device)
    elif system == "minicavs-vertex":
        if task != "treelstm":
            return None
        from minicavs.training import set_blas_threads
        set_blas_threads(threads)
        step = minicavs_vertex(task, samples, vocab)
    else:
        from minicavs.training import set_blas_threads
        set_blas_threads(threads)
        step = minicavs_plain(task, system.split("-", 1)[1], samples, vocab)
    chunks = [samples[i * BATCH:(i + 1) * BATCH] for i in range(batches + 1)]
    step(chunks[0])  # warm-up: caches, kernels, pools
    wait()
    times = []  # seconds per measured mini-batch
    for chunk in chunks[1:]:
        began = time.perf_counter()
        step(chunk)
        wait()
        times.append(time.perf_counter() - began)
    return times


def _device_wait(system, device):
    """Put the system on ``device`` and return what waits for its queued work (a GPU runs
    behind the host: a step's time is the device's only once it has finished)."""
    if device == "cpu":
        return lambda: None
    if system.startswith("dynet"):
        raise SystemExit(f"{system}:{device}: this DyNet build runs on the CPU only")
    if system == "torch-eager":
        import torch
        return torch.cuda.synchronize
    from minicavs import backend
    backend.set_device(device)
    return backend.cupy_or_error().cuda.Device().synchronize


def run_worker(system, task, args, env):
    """One (system, task) in a fresh process; DyNet's pool doubles (a fresh process per try,
    as ``run.py`` does) while it runs out of memory or crashes, up to DYNET_POOL_MAX_MB."""
    pool = DYNET_POOL_MB
    while True:
        if system.startswith("dynet"):
            env = dict(env, BENCH_DYNET_MEM=str(pool))
        run = subprocess.run([sys.executable, __file__, "--worker", system, task,
                              "--batches", str(args.batches), "--threads", str(args.threads)],
                             capture_output=True, text=True, env=env, timeout=1800)
        try:
            return json.loads(run.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            pass
        out_of_memory = "pre-allocate enough memory" in run.stderr or run.returncode < 0
        if not system.startswith("dynet") or not out_of_memory or pool >= DYNET_POOL_MAX_MB:
            print(f"{system} on {task} failed (rc {run.returncode}"
                  f"{f', pool {pool} MB' if system.startswith('dynet') else ''}):\n"
                  f"{run.stderr[-1500:]}", file=sys.stderr)
            return None
        pool *= 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8, help="measured mini-batches of 64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--systems", default=None,
                        help=f"default {','.join(SYSTEMS)}; --cuda: {','.join(CUDA_SYSTEMS)}")
    parser.add_argument("--cuda", action="store_true",
                        help="Table 3: the minicavs strategies, PyTorch eager and the vertex "
                             "form on the GPU, beside minicavs agenda+ on this CPU")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times the whole table runs, its systems taking turns (the "
                             "machine is shared: a slow second hits one system, not all); "
                             "each mini-batch's time is the median of the rounds'")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="a data folder with tags/dev.txt and sst/train.txt (docs/data.md; "
                             "default: embedded synthetic sentences and trees)")
    parser.add_argument("--worker", nargs=2, metavar=("SYSTEM", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    systems = (args.systems or ",".join(CUDA_SYSTEMS if args.cuda else SYSTEMS)).split(",")
    if args.worker:
        print(json.dumps(worker(*args.worker, args.batches, args.threads)))
        return None
    if args.data is not None:  # checked before any work; the workers read it from the env
        missing = sorted({str(data_files(args.data)[t]) for t in args.tasks.split(",")
                          if t in TASKS and not data_files(args.data)[t].is_file()})
        if missing:
            raise SystemExit(f"--data {args.data}: missing {', '.join(missing)} (docs/data.md "
                             f"says where each set comes from)")
        os.environ[DATA_ENV] = str(pathlib.Path(args.data).resolve())
    else:
        os.environ.pop(DATA_ENV, None)
    print(f"data: {args.data or 'embedded synthetic sentences and trees'}", flush=True)
    if os.environ.get("MINICAVS_CUDA_EMULATE") and any(s.endswith(":cuda") for s in systems):
        print("minicavs's :cuda systems run on the emulated device (MINICAVS_CUDA_EMULATE): "
              "their times are this CPU's, not a GPU's", flush=True)
    times = {}  # (task, system) -> [per round: seconds per mini-batch, or None]
    for r in range(args.rounds):
        for task in args.tasks.split(","):
            for system in systems:
                if system.startswith("minicavs-vertex") and task != "treelstm":
                    continue
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
                           OPENBLAS_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
                steps = run_worker(system, task, args, env)
                times.setdefault((task, system), []).append(steps)
                print(f"round {r + 1}  {task:<12} {system:<18} " +
                      ("failed" if steps is None else
                       f"{BATCH * len(steps) / sum(steps):8.1f} samples/s"), flush=True)
    table = throughputs(times)
    print(render(table, args.tasks.split(","), systems, args.rounds))
    return table


def throughputs(times):
    """Samples per second per (task, system): every mini-batch timed in each round, its time
    taken as the median of the rounds' (a slow second on the shared machine hits one round of
    one batch, and drops out), summed over the batches. None where no round ran."""
    table = {}
    for cell, runs in times.items():
        runs = [r for r in runs if r]
        if runs:
            per_batch = np.median(np.array(runs), axis=0)
            table[cell] = BATCH * len(per_batch) / per_batch.sum()
    return table


# The ratios a table shows, where it has both systems.
RATIOS = [("minicavs-agenda+", "dynet-agenda"), ("minicavs-agenda+", "minicavs-agenda"),
          ("minicavs-depth+", "dynet-depth"), ("minicavs-agenda+:cuda", "minicavs-agenda:cuda"),
          ("minicavs-agenda+:cuda", "minicavs-agenda+")]


def render(table, tasks, systems, rounds=1):
    ratios = [(a, b) for a, b in RATIOS if a in systems and b in systems]
    paper = "minicavs-agenda+:cuda" in systems  # against Table 3's P100
    heads = [f"{a} ÷ {b}" for a, b in ratios] + (["agenda+:cuda ÷ paper's P100"] if paper else [])
    lines = ["", f"samples/s; each mini-batch's time the median of {rounds} round(s)", "",
             "| task | " + " | ".join(systems + heads) + " |",
             "|---" * (len(systems) + len(heads) + 1) + "|"]
    for task in tasks:
        cells = ["-" if table.get((task, s)) is None else f"{table[task, s]:.1f}"
                 for s in systems]
        for a, b in ratios:
            x, y = table.get((task, a)), table.get((task, b))
            cells.append(f"{x / y:.2f}×" if x and y else "-")
        if paper:
            x = table.get((task, "minicavs-agenda+:cuda"))
            cells.append(f"{x / PAPER_P100_AGENDA_PLUS[task]:.2f}×" if x else "-")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
