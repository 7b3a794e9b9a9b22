"""What every benchmarked system shares: the workloads and their data, the initial weights, FLOP
counting, the GEMM rate, the timed training loop, the subprocess per system, and the report
(tables, JSON, PNG).

Workloads (the issue's; every one trains with Adam on mini-batches of B = 64 samples, the
losses of a batch summed, one backward and one update per batch):

* ``tree_lstm`` / ``tree_lstm_256`` — binary Tree-LSTM sentiment classifier on the first 1024
  SST training trees, embedding = hidden = 128 (256). The math, identical in every system:
  a leaf with word embedding x has gates ``x W + b``; an internal vertex with children states
  (h_l, c_l), (h_r, c_r) has gates ``[h_l, h_r] U + b``; then ``i, f_l, f_r, o, u = split(gates)``,
  ``c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r``, ``h = σ(o)⊙tanh(c)`` (a leaf's c_l, c_r are 0).
  This is the one-formula cell ``x W + [h_l, h_r] U + b`` with x = 0 at internal vertices and
  zero children states at leaves, written the way a user of each system writes it (the peers
  skip the terms that are zero; minicavs evaluates the one formula). A linear classifier
  ``h W_out + b_out`` (5 classes) at every internal vertex; cross-entropy summed. Unit: trees/s.
* ``tree_rnn`` / ``rntn`` — the recursive networks of the recursion paper (Figs. 7–8) on the
  same SST trees, embedding = hidden = 128 (RNTN: 32): a leaf's h is its word vector, an internal
  vertex has ``h = tanh([h_l, h_r] U + b)`` (TreeRNN) or ``h = tanh(xᵀ V x + x U + b)`` with
  x = [h_l, h_r] and V of H slices 2H × 2H (RNTN); classifier and loss as for tree_lstm.
  The ``minicavs`` system writes each as one cell (leaf and internal formulas masked by a pulled
  flag), ``minicavs-recursive`` with ``mc.recursive`` (each kind on its own rows; for tree_lstm,
  the Tree-LSTM with a leaf cell that has no U products).
* ``tree_fc`` — complete binary trees of 256 leaves (511 vertices), hidden = embedding = 256:
  leaf ``h = tanh(x W + b)`` with x the embedding of a random word id (vocabulary 1000),
  internal ``h = tanh([h_l, h_r] U + b)`` (the same b); a classifier on the root only.
* ``var_lstm`` — LSTM language model on PTB sentences (the first 1024 of ptb.valid.txt),
  embedding = hidden = 256, softmax over the vocabulary of the file (6022 words with <unk> and
  <eos>). A sentence w_1..w_n <eos> is read from <eos> w_1..w_n and predicts w_1..w_n <eos>:
  every token of the sentence (its <eos> included) is one predicted token. Gates in the order
  i, f, g, o: ``i, f, g, o = split(x W + h U + b)``, ``c = σ(f)⊙c + σ(i)⊙tanh(g)``,
  ``h = σ(o)⊙tanh(c)``. Unit: tokens/s (predicted tokens).

Every system starts from the same weights (:func:`init_params`, NumPy, seeded), so the loss of
the first batch is the same everywhere; the report shows it as a check that the math agrees.
"""

import importlib
import json
import os
import platform
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BATCH_SIZE = 64

# system name -> module; each module has available() -> None | reason, and run(...)
SYSTEMS = {
    "minicavs": "benchmarks.systems.minicavs_cpu",
    "minicavs-cuda": "benchmarks.systems.minicavs_cuda",
    "minicavs-recursive": "benchmarks.systems.minicavs_recursive",
    "torch-eager": "benchmarks.peers.torch_eager",
    "torch-batched": "benchmarks.peers.torch_batched",
    "torch-batched-cuda": "benchmarks.peers.torch_batched_cuda",
    "dynet": "benchmarks.peers.dynet_autobatch",
    "c-reference": "benchmarks.peers.c_reference",  # the hand-written C ceiling (tree_lstm)
}
REFERENCE_SYSTEM = "minicavs"


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "tree_lstm", "tree_fc" or "var_lstm": which model
    title: str
    embed: int
    hidden: int
    unit: str
    num_classes: int = 5
    batch_size: int = BATCH_SIZE


WORKLOADS = {
    "tree_lstm": Workload("tree_lstm", "tree_lstm", "Tree-LSTM (SST)", 128, 128, "trees/s"),
    "tree_lstm_256": Workload("tree_lstm_256", "tree_lstm", "Tree-LSTM (SST)", 256, 256,
                              "trees/s"),
    "tree_fc": Workload("tree_fc", "tree_fc", "Tree-FC (256 leaves)", 256, 256, "trees/s"),
    "tree_rnn": Workload("tree_rnn", "tree_rnn", "TreeRNN (SST)", 128, 128, "trees/s"),
    "rntn": Workload("rntn", "rntn", "RNTN (SST)", 32, 32, "trees/s"),
    "var_lstm": Workload("var_lstm", "var_lstm", "Var-LSTM LM (PTB)", 256, 256, "tokens/s"),
    # generation: no training, trees grown top-down (benchmarks/generation.py)
    "td_generate": Workload("td_generate", "td_generate", "TD-TreeLSTM generation", 128, 128,
                            "trees/s"),
    "td_generate_1": Workload("td_generate_1", "td_generate", "TD-TreeLSTM generation", 128,
                              128, "trees/s", batch_size=1),
}

# How many samples one epoch has: the sizes, and a small one for --quick.
FULL_SIZES = {"tree_lstm": 1024, "tree_lstm_256": 1024, "tree_fc": 256, "var_lstm": 1024,
              "td_generate": 256, "td_generate_1": 256, "tree_rnn": 1024, "rntn": 1024}
QUICK_SIZES = {"tree_lstm": 128, "tree_lstm_256": 128, "tree_fc": 64, "var_lstm": 128,
               "td_generate": 64, "td_generate_1": 64, "tree_rnn": 128, "rntn": 128}
SST_KINDS = ("tree_lstm", "tree_rnn", "rntn")  # workloads on SST trees
TREE_FC_LEAVES = 256
TREE_FC_VOCAB = 1000


def cpu_description():
    """``AMD EPYC, AVX2, 2 cores``: the CPU model, its widest vector ISA and the core count, so
    that a figure names the machine it came from."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine(), None):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else
           "AVX" if "avx" in flags else "no AVX" if flags else "ISA unknown")
    return f"{model}, {isa}, {os.cpu_count()} cores"


def data_files(data_dir):
    """The files a ``--data`` folder (laid out as the project's shared data: ``sst/``,
    ``ptb/``, ``tags/``; docs/data.md) gives each kind of workload."""
    data_dir = Path(data_dir)
    return {"sst": data_dir / "sst" / "train.txt", "ptb": data_dir / "ptb" / "ptb.valid.txt",
            "tags": data_dir / "tags" / "dev.txt"}


def missing_data(workloads, sst_path=None, ptb_path=None):
    """What the given workloads would read and is not there: a list of messages (empty when
    all is present). Checked before any work, so a wrong path costs nothing."""
    problems = []
    for workload in workloads:
        kind = WORKLOADS[workload].kind
        path, what = ((sst_path, "--sst/--data: an SST tree file") if kind in SST_KINDS else
                      (ptb_path, "--ptb/--data: a PTB text file") if kind == "var_lstm" else
                      (None, None))
        if path is not None and not Path(path).is_file():
            problems.append(f"{workload} reads {path}, which is not a file (expected {what}; "
                            f"docs/data.md says where to get it)")
    return list(dict.fromkeys(problems))


# -- data ------------------------------------------------------------------------------------

def load_workload(workload, size, sst_path=None, ptb_path=None, seed=0):
    """The data of one workload as a plain, picklable dict (what every system's run() gets).

    ``batches``: lists of samples (a :class:`minicavs.data.Tree`, or an int64 id array ending
    in <eos> for var_lstm), in a fixed order shared by all systems; ``units``: trees or
    predicted tokens per epoch. Without ``sst_path``/``ptb_path`` the tree workloads train on
    the synthetic treebank and var_lstm on its sentences (embedded: nothing is read from disk);
    with them, on the first ``size`` trees or sentences of those files.
    """
    from minicavs import data as datasets  # the project's readers

    spec = WORKLOADS[workload]
    title = spec.title
    if spec.kind == "td_generate":
        from benchmarks import generation

        return generation.load(spec, size)
    if spec.kind in SST_KINDS:
        if sst_path:
            path = Path(sst_path)
            trees = _first_trees(path, size)
            source = f"first {len(trees)} trees of {path.name}"
        else:
            trees, _ = datasets.synthetic_treebank(size, seed)
            source = f"{len(trees)} synthetic treebank trees"
            title = spec.title.replace("(SST)", "(synthetic trees)")
        vocab = datasets.Vocabulary.build(t.tokens for t in trees)
        samples = [vocab.encode_tree(t) for t in trees]
        vocab_size, units = len(vocab), len(samples)
    elif spec.kind == "tree_fc":
        rng = np.random.default_rng(seed)
        samples = [datasets.complete_binary_tree(TREE_FC_LEAVES, rng, vocab_size=TREE_FC_VOCAB,
                                                 num_classes=spec.num_classes)
                   for _ in range(size)]
        vocab_size, units = TREE_FC_VOCAB, len(samples)
        source = f"{len(samples)} generated trees"
    else:
        if ptb_path:
            path = Path(ptb_path)
            sentences = datasets.read_ptb(path)
            source = f"first {min(size, len(sentences))} sentences of {path.name}"
        else:
            trees, _ = datasets.synthetic_treebank(size, seed)
            sentences = [t.tokens + [datasets.EOS] for t in trees]
            source = f"{len(sentences)} synthetic treebank sentences"
            title = spec.title.replace("(PTB)", "(synthetic sentences)")
        vocab = datasets.Vocabulary.build(sentences, specials=[datasets.EOS])
        samples = [vocab.encode(s) for s in sentences[:size]]
        vocab_size, units = len(vocab), int(sum(len(s) for s in samples))
    batches = [samples[i:i + BATCH_SIZE] for i in range(0, len(samples), BATCH_SIZE)]
    return {
        "workload": spec.name, "kind": spec.kind, "title": title, "unit": spec.unit,
        "embed": spec.embed, "hidden": spec.hidden, "num_classes": spec.num_classes,
        "vocab_size": vocab_size, "batch_size": BATCH_SIZE, "batches": batches,
        "num_samples": len(samples), "units": units, "source": source,
        "eos": 1,  # Vocabulary: <unk> = 0, then the specials (<eos>)
    }


def _first_trees(path, count):
    """The first ``count`` trees of an SST file (parsed line by line, not the whole file)."""
    from minicavs.data import parse_tree

    trees = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                trees.append(parse_tree(line, source=str(path), line=number))
                if len(trees) == count:
                    break
    return trees


def tree_arrays(tree):
    """A binary tree's children as two int64 arrays (-1: no child), cached on the Tree.

    Every system that batches trees itself starts from these; building them once per tree
    is the preprocessing any user does, not part of the per-batch work.
    """
    cached = getattr(tree, "_bench_arrays", None)
    if cached is None:
        n = tree.num_vertices
        left = np.full(n, -1, dtype=np.int64)
        right = np.full(n, -1, dtype=np.int64)
        for v, kids in enumerate(tree.children):
            if kids:
                left[v], right[v] = kids
        cached = (left, right)
        tree._bench_arrays = cached
    return cached


def init_params(data, seed=0):
    """The initial weights every system starts from, float32, ``x @ W`` layout (in, out).

    tree_lstm: emb (V,E), W (E,5H), U (2H,5H), b (5H,) with gates [i, f_l, f_r, o, u];
    tree_fc:   emb (V,E), W (E,H),  U (2H,H),  b (H,);
    var_lstm:  emb (V,E), W (E,4H), U (H,4H),  b (4H,) with gates [i, f, g, o];
    and the output layer W_out (H, C or V), b_out.
    """
    rng = np.random.default_rng(seed)
    E, H, V = data["embed"], data["hidden"], data["vocab_size"]

    def uniform(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    if data["kind"] == "td_generate":
        from benchmarks import generation

        return generation.init_params(data, rng, uniform)
    gates = {"tree_lstm": 5, "tree_fc": 1, "var_lstm": 4, "tree_rnn": 1, "rntn": 1}[data["kind"]]
    fan_in_u = H if data["kind"] == "var_lstm" else 2 * H
    out = V if data["kind"] == "var_lstm" else data["num_classes"]
    b = np.zeros(gates * H, np.float32)
    if data["kind"] == "tree_lstm":
        b[H:3 * H] = 1.0  # forget gates start open
    elif data["kind"] == "var_lstm":
        b[H:2 * H] = 1.0
    extra = {}
    if data["kind"] == "rntn":  # V: H slices of 2H × 2H, small (Socher et al.)
        extra["V"] = uniform((H, 2 * H, 2 * H), 16 * H * H)
    return {
        **extra,
        "emb": (rng.standard_normal((V, E)) * 0.1).astype(np.float32),
        "W": uniform((E, gates * H), E),
        "U": uniform((fan_in_u, gates * H), fan_in_u),
        "b": b,
        "W_out": uniform((H, out), H),
        "b_out": np.zeros(out, np.float32),
    }


# -- FLOPs and the GEMM rate -------------------------------------------------------------------

def count_flops(data):
    """The FLOPs of one epoch's forward + backward, counted from the data.

    Forward GEMM FLOPs are 2·in·out per row; the backward of a GEMM costs two GEMMs of the same
    size (input and weight gradients), so GEMMs count 3× forward. Elementwise work is counted
    per vertex/token as the number of elementwise ops of the cell on H-vectors, also 3× forward
    (a rough figure; it is small next to the GEMMs at H >= 128). The optimizer update and
    embedding lookups are not counted. The counts include only the work the math needs (no
    GEMM on the zero input of internal vertices), so they are a floor for every system:

    tree_lstm: leaf 2·E·5H; internal 2·2H·5H + classifier 2·H·C; elementwise 17·H per vertex
               (bias 5H, 4 sigmoids + 2 tanh, 4 products, 2 sums) + 3·C per classified vertex.
    tree_rnn:  internal 2·2H·H + classifier 2·H·C; elementwise 2·H (bias, tanh) + 3·C;
    rntn:      tree_rnn's + internal 2·2H·(H·2H) (x V) + 2·H·2H (the products with x, summed);
    tree_fc:   leaf 2·E·H; internal 2·2H·H; elementwise 2·H per vertex (bias, tanh);
               root classifier 2·H·C + 3·C.
    var_lstm:  per token 2·E·4H + 2·H·4H + softmax layer 2·H·V; elementwise 13·H + 3·V.
    """
    E, H, C, V = data["embed"], data["hidden"], data["num_classes"], data["vocab_size"]
    kind = data["kind"]
    if kind == "td_generate":
        from benchmarks import generation

        return generation.count_flops(data)
    samples = [s for batch in data["batches"] for s in batch]
    if kind == "var_lstm":
        tokens = sum(len(s) for s in samples)
        gemm = tokens * (2 * E * 4 * H + 2 * H * 4 * H + 2 * H * V)
        elementwise = tokens * (13 * H + 3 * V)
        formula = "tokens·(2E·4H + 2H·4H + 2H·V) GEMM + tokens·(13H + 3V) elementwise, ×3"
    else:
        leaves = sum(t.num_leaves for t in samples)
        internal = sum(t.num_vertices for t in samples) - leaves
        if kind == "tree_lstm":
            gemm = leaves * 2 * E * 5 * H + internal * (2 * 2 * H * 5 * H + 2 * H * C)
            elementwise = (leaves + internal) * 17 * H + internal * 3 * C
            formula = ("leaves·2E·5H + internal·(2·2H·5H + 2H·C) GEMM + vertices·17H + "
                       "internal·3C elementwise, ×3")
        elif kind in ("tree_rnn", "rntn"):
            bilinear = 2 * 2 * H * 2 * H * H + 2 * 2 * H * H if kind == "rntn" else 0
            gemm = internal * (2 * 2 * H * H + bilinear + 2 * H * C)
            elementwise = internal * (2 * H + 3 * C)
            formula = ("internal·(2·2H·H + 2H·C"
                       + (" + 2·2H·2H·H + 2·2H·H" if bilinear else "")
                       + ") GEMM + internal·(2H + 3C) elementwise, ×3")
        else:
            gemm = leaves * 2 * E * H + internal * 2 * 2 * H * H + len(samples) * 2 * H * C
            elementwise = (leaves + internal) * 2 * H + len(samples) * 3 * C
            formula = ("leaves·2E·H + internal·2·2H·H + trees·2H·C GEMM + vertices·2H "
                       "elementwise, ×3")
    return {"gemm": 3 * gemm, "elementwise": 3 * elementwise,
            "total": 3 * (gemm + elementwise), "formula": formula}


def gemm_rate(sizes=(256, 512, 1024, 2048), repeats=3, device="cpu"):
    """The best float32 matmul rate in FLOP/s over square sizes: NumPy's (minicavs' own BLAS),
    or on ``device="cuda"`` CuPy's (cuBLAS, what minicavs-cuda multiplies with)."""
    if device == "cuda":
        import cupy as xp

        sizes, work, sync = sizes + (4096, 8192), 2e11, xp.cuda.Device().synchronize
    else:
        xp, work, sync = np, 2e9, lambda: None
    rng = np.random.default_rng(0)
    best = {}
    for n in sizes:
        a = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        b = xp.asarray(rng.standard_normal((n, n)).astype(np.float32))
        a @ b  # warm the BLAS threads and caches
        sync()
        reps = max(1, int(work // (2 * n ** 3)))  # about 2 GFLOP (GPU: 200) a timing
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(reps):
                a @ b
            sync()
            rate = 2 * n ** 3 * reps / (time.perf_counter() - started)
            best[n] = max(best.get(n, 0.0), rate)
    return max(best.values()), best


# -- the timed training loop -------------------------------------------------------------------

def train_loop(step, batches, epochs, warmup):
    """Run ``warmup + epochs`` epochs of ``step(batch)`` over the fixed batches.

    ``step`` returns a dict with ``loss`` (a float, read each step so that lazy systems really
    compute) and optional timings in seconds (``construction`` and system-specific parts),
    which are summed per epoch. Returns the per-epoch wall times and sums of the measured
    epochs, the warm-up epochs' times apart (the first epoch compiles: its cost is reported),
    and the first batch's loss (taken before any update).
    """
    epoch_seconds, warmup_seconds, parts, first_loss, last_loss = [], [], [], None, None
    for epoch in range(warmup + epochs):
        take_turn()
        totals = {}
        started = time.perf_counter()
        for batch in batches:
            out = step(batch)
            if first_loss is None:
                first_loss = float(out["loss"])
            last_loss = out["loss"]
            for key, value in out.items():
                if key != "loss" and value is not None:
                    totals[key] = totals.get(key, 0.0) + value
        elapsed = time.perf_counter() - started
        if epoch >= warmup:
            epoch_seconds.append(elapsed)
            parts.append(totals)
        else:
            warmup_seconds.append(elapsed)
    return {"epoch_seconds": epoch_seconds, "warmup_seconds": warmup_seconds, "parts": parts,
            "first_loss": first_loss,
            "last_loss": float(last_loss) if last_loss is not None else None}


def summarize(loop, data, **extra):
    """A system's result from its loop: throughput of the best measured epoch and the
    breakdown of that epoch."""
    seconds = loop["epoch_seconds"]
    best = int(np.argmin(seconds))
    parts = loop["parts"][best]
    result = {
        "throughput": data["units"] / seconds[best], "unit": data["unit"],
        "epoch_seconds": seconds, "best_epoch_seconds": seconds[best],
        "warmup_seconds": loop.get("warmup_seconds", []),
        "construction_seconds": parts.get("construction"),
        "breakdown": parts, "first_loss": loop["first_loss"], "last_loss": loop["last_loss"],
    }
    result.update(extra)
    return result


def peak_rss_mb():
    """This process's peak resident memory in MB: Linux's VmHWM, which starts afresh at exec
    (``ru_maxrss`` does not: a worker started by a parent holding every workload's data kept
    the parent's 164 MB as its own peak, and systems smaller than that showed 0 MB); elsewhere
    ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# -- one system in its own process -------------------------------------------------------------

def subprocess_env(threads):
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    env["BENCH_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def gemm_rate_with_threads(threads, timeout=300, device="cpu"):
    """:func:`gemm_rate` in a subprocess with the systems' thread settings (BLAS reads them at
    start-up), so the floor is for the threads the systems get."""
    result = _worker(["--system", "minicavs", "--gemm", "--gemm-device", device], threads,
                     timeout)
    if "gemm_flops" not in result:
        raise RuntimeError(f"GEMM rate measurement failed: {result}")
    return result["gemm_flops"], {int(n): r for n, r in result["by_size"].items()}


def check_system(system, threads, timeout=120):
    """None if the system can run here, else why not (checked in a subprocess: the import)."""
    result = _worker(["--system", system, "--check"], threads, timeout)
    return result.get("missing") or result.get("error")


def run_system(system, data_path, epochs, warmup, threads, options=None, timeout=1800):
    """Run one system on one workload's pickled data in a fresh process; its result dict."""
    return _worker(system_args(system, data_path, epochs, warmup, options), threads, timeout)


def system_args(system, data_path, epochs, warmup, options=None):
    """The worker's arguments for one system on one workload."""
    return ["--system", system, "--data", str(data_path), "--epochs", str(epochs),
            "--warmup", str(warmup), "--options", json.dumps(options or {})]


def _worker(args, threads, timeout):
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.worker", *args, "--out", str(out)]
        try:
            proc = subprocess.run(command, cwd=REPO, env=subprocess_env(threads),
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        return _result(out, proc.returncode, proc.stderr or proc.stdout)


def _result(out, returncode, output):
    if out.is_file():
        return json.loads(out.read_text())
    tail = output.strip().splitlines()[-8:]
    return {"error": f"worker exited with {returncode}: " + " | ".join(tail)}


# -- systems taking turns, epoch by epoch --------------------------------------------------------
# A shared machine has slow minutes (this project's 2-core VMs: 1.5x for minutes at a time).
# Run one system after another and a slow minute lands on one system's whole run, and the
# ratio between two systems moves by as much from one run to the next. So ``run.py`` starts a
# workload's systems side by side, each in its own process, and lets them run one at a time,
# an epoch each in turn (its setup counts as a turn too): a slow minute then costs every system
# an epoch or two, and each keeps its best. A worker holds the machine from the byte that
# starts its turn to the byte it sends back (``BENCH_TURNS``: the read end of one pipe, the
# write end of the other); without that variable a worker runs straight through.

class _Turns:
    def __init__(self):
        spec = os.environ.get("BENCH_TURNS")
        self.pipes = tuple(int(fd) for fd in spec.split(",")) if spec else None
        self.holding = False

    def take(self):
        if self.pipes is None:
            return
        self.release()
        if not os.read(self.pipes[0], 1):  # (the run that started us is gone)
            raise SystemExit("benchmark worker: the run handing out turns ended")
        self.holding = True

    def release(self):
        if self.pipes is not None and self.holding:
            os.write(self.pipes[1], b".")
            self.holding = False


_turns = _Turns()


def take_turn():
    """Hand the machine back, if this worker holds it, and wait for its next turn (at once
    where the worker runs alone)."""
    _turns.take()


def run_in_turns(jobs, threads, timeout=1800, settle_seconds=0.5):
    """Run workers side by side, one at a time, a turn each in turn (see above). ``jobs``:
    ``[(key, Python's arguments, extra environment)]`` (``["-m", "benchmarks.worker",
    *system_args(...)]``: ``--out`` and the result file's path are added); returns ``{key:
    result}``, a worker's result file or its error. ``timeout``:
    seconds a single turn may take. Before a turn starts, the worker of the last one is given up
    to ``settle_seconds`` to go idle (its pools' threads spin a while after their work:
    OpenMP's, minicavs's 10-20 ms, OpenBLAS's longer)."""
    import select

    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        workers = []
        try:
            for k, (key, args, extra_env) in enumerate(jobs):
                out, log = Path(tmp) / f"result-{k}.json", Path(tmp) / f"log-{k}.txt"
                go_read, go_write = os.pipe()
                done_read, done_write = os.pipe()
                env = dict(subprocess_env(threads), **(extra_env or {}))
                env["BENCH_TURNS"] = f"{go_read},{done_write}"
                with open(log, "w") as sink:
                    proc = subprocess.Popen(
                        [sys.executable, *args, "--out", str(out)],
                        cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                        pass_fds=(go_read, done_write))
                os.close(go_read)
                os.close(done_write)
                workers.append({"key": key, "proc": proc, "go": go_write, "done": done_read,
                                "out": out, "log": log, "error": None})
            live, last = list(workers), None
            while live:
                for w in list(live):
                    if last is not None:
                        _settle(last["proc"].pid, settle_seconds)
                    last = w
                    try:
                        os.write(w["go"], b"g")
                    except BrokenPipeError:  # (it ended after its last turn)
                        live.remove(w)
                        continue
                    ready, _, _ = select.select([w["done"]], [], [], timeout)
                    if not ready:
                        w["proc"].kill()
                        w["error"] = f"a turn took more than {timeout} s"
                        live.remove(w)
                    elif not os.read(w["done"], 1):  # (it ended: finished, or failed)
                        live.remove(w)
            results = {}
            for w in workers:
                w["proc"].wait()
                results[w["key"]] = {"error": w["error"]} if w["error"] else _result(
                    w["out"], w["proc"].returncode, w["log"].read_text(errors="replace"))
            return results
        finally:
            for w in workers:
                if w["proc"].poll() is None:
                    w["proc"].kill()
                    w["proc"].wait()
                for fd in (w["go"], w["done"]):
                    os.close(fd)


def _settle(pid, most):
    """Wait (at most ``most`` seconds) until process ``pid`` has used under a millisecond
    of CPU in the last 20 ms: its threads have stopped spinning."""
    began = time.monotonic()
    before = _cpu_seconds(pid)
    while before is not None and time.monotonic() - began < most:
        time.sleep(0.02)
        now = _cpu_seconds(pid)
        if now is None or now - before < 1e-3:
            return
        before = now


def _cpu_seconds(pid):
    """The CPU time of all threads of ``pid`` (Linux's schedstat, in ns), or None."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # (it has ended, or this is not Linux)
        return None
    total = 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # (a thread that ended since)
            continue
        except (OSError, ValueError, IndexError):
            return None
    return total * 1e-9


def worker_main(argv=None):
    """The subprocess side: import the system (its framework first), load the data, take the
    RSS baseline, run, and write the result JSON."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True)
    parser.add_argument("--data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--gemm", action="store_true", help="measure the GEMM rate only")
    parser.add_argument("--gemm-device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    def write(result):
        Path(args.out).write_text(json.dumps(result, default=_jsonable))

    if args.gemm:
        try:
            rate, by_size = gemm_rate(device=args.gemm_device)
        except Exception as exc:  # noqa: BLE001 (no CuPy or no GPU: the caller falls back)
            write({"error": f"{type(exc).__name__}: {exc}"})
            return
        write({"gemm_flops": rate, "by_size": by_size})
        return

    take_turn()  # (the system's setup: imports, data, first compiles)
    try:
        module = importlib.import_module(SYSTEMS[args.system])
        missing = module.available()
    except Exception as exc:  # noqa: BLE001 (any import failure means "missing")
        missing = f"{type(exc).__name__}: {exc}"
    if missing or args.check:
        write({"missing": missing} if missing else {"ok": True})
        return
    with open(args.data, "rb") as f:
        data = pickle.load(f)
    params = init_params(data)
    baseline = peak_rss_mb()
    try:
        result = module.run(data, params, epochs=args.epochs, warmup=args.warmup,
                            options=json.loads(args.options))
    except Exception as exc:  # noqa: BLE001 (reported in the table, the run goes on)
        import traceback
        write({"error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()[-3000:]})
        return
    peak = peak_rss_mb()
    # Memory a system reserves and touches before the baseline (DyNet's pool) is its own too.
    reserved = result.get("reserved_memory_mb", 0.0)
    result.update(peak_memory_mb=max(0.0, peak - baseline) + reserved, peak_rss_mb=peak,
                  baseline_rss_mb=baseline, threads=int(os.environ.get("BENCH_THREADS", 0)))
    write(result)
    _turns.release()


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def save_data(data, directory):
    path = Path(directory) / f"{data['workload']}.pkl"
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


# -- the report --------------------------------------------------------------------------------

def _fmt(value, spec="{:,.0f}"):
    return "—" if value is None else spec.format(value)


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def throughput_table(entry, gemm_flops, reference_system=REFERENCE_SYSTEM):
    """Throughput, minicavs ÷ system, share of the FLOP floor, construction, memory, loss."""
    flops = entry["flops"]["total"]
    floor_seconds = flops / gemm_flops
    floor_throughput = entry["units"] / floor_seconds
    reference = entry["results"].get(reference_system, {}).get("throughput")
    rows, notes = [], []
    for system, r in entry["results"].items():
        if "throughput" not in r:
            status = "missing" if r.get("missing") else "error"
            notes.append(f"  {system} {status}: {r.get('missing') or r.get('error')}")
            rows.append([system, status, "", "", "", "", "", ""])
            continue
        ratio = reference / r["throughput"] if reference else None
        construction = r.get("construction_seconds")
        share = (f"{construction:.2f} ({100 * construction / r['best_epoch_seconds']:.0f}%)"
                 if construction is not None else "—")
        rows.append([system, f"{r['throughput']:,.0f}", f"{r['best_epoch_seconds']:.2f}",
                     _fmt(ratio, "{:.2f}×"), f"{100 * r['throughput'] / floor_throughput:.1f}%",
                     share, _fmt(r.get("peak_memory_mb"), "{:,.0f}"),
                     _fmt(r.get("first_loss"), "{:,.0f}" if "check" in entry else "{:.4f}")])
    title = (f"{entry['title']}  E=H={entry['hidden']}, B={entry.get('batch_size', BATCH_SIZE)}, "
             f"{entry['source']}, "
             f"{entry['units']:,} {entry['unit'].split('/')[0]} per epoch\n"
             f"FLOPs/epoch {flops / 1e9:,.1f} G; floor {floor_seconds:.3f} s/epoch = "
             f"{floor_throughput:,.0f} {entry['unit']} at {gemm_flops / 1e9:.1f} GFLOP/s")
    header = ["system", entry["unit"], "epoch s", f"{reference_system} ÷ this", "of floor",
              "construction s", "peak MB", entry.get("check", "loss@1")]
    spread = [f"  {system}: " + " / ".join("failed" if t is None else f"{t:,.0f}"
                                          for t in r["round_throughputs"])
              for system, r in entry["results"].items() if len(r.get("round_throughputs", ())) > 1]
    if spread:
        notes.append(f"{entry['unit']} of each round (the best is in the table):")
        notes.extend(spread)
    return title + "\n" + _table(header, rows) + "".join("\n" + n for n in notes)


def breakdown_table(entries):
    """Fig. 9: per system, graph construction / scheduling versus everything else, per epoch."""
    rows = []
    for entry in entries:
        for system, r in entry["results"].items():
            if "throughput" not in r:
                continue
            total = r["best_epoch_seconds"]
            construction = r.get("construction_seconds")
            parts = dict(r.get("breakdown", {}))
            parts.pop("construction", None)
            parts.pop("scheduling", None)  # part of construction (GraphBatch.build_seconds)
            if parts and construction is not None:
                parts["other"] = total - construction - sum(parts.values())
            detail = ", ".join(f"{k} {v:.2f}" for k, v in parts.items())
            rows.append([entry["workload"], system, f"{total:.2f}",
                         _fmt(construction, "{:.3f}"),
                         _fmt(None if construction is None else total - construction, "{:.2f}"),
                         _fmt(None if construction is None else 100 * construction / total,
                              "{:.1f}%"), detail or r.get("construction_note", "")])
    header = ["workload", "system", "epoch s", "construction s", "computation s",
              "construction %", "computation parts (s)"]
    return ("Graph construction / scheduling vs computation (Cavs Fig. 9), best epoch\n"
            + _table(header, rows))


NOISE = 0.05  # an ablation ratio within 1 ± this reads as "no measurable effect"


def ablation_reference(first, last):
    """The all-on result the ablation compares with: the faster of the runs before and after
    the variants, with ``drift`` (how much slower the other was, a fraction) recorded."""
    runs = [r for r in (first, last) if "best_epoch_seconds" in r]
    if not runs:
        return first
    best = dict(min(runs, key=lambda r: r["best_epoch_seconds"]))
    if len(runs) == 2:
        times = sorted(r["best_epoch_seconds"] for r in runs)
        best["drift"] = times[1] / times[0] - 1.0
        best["all_on_epoch_seconds"] = [first["best_epoch_seconds"], last["best_epoch_seconds"]]
    return best


def pair_rounds(first, last, variants):
    """In turns, round i of every run is the same minutes: each variant's epoch i ÷ the mean
    of the two all-on epochs of round i (not the faster: the faster of two draws is faster than
    one), the median over the rounds (``paired_ratio``, set on each variant
    whose epochs line up), and how far the two all-on epochs of a round differ, the median
    (``paired_drift``, returned). One fast epoch of a variant in a noisy hour read as an effect
    by the best epochs (seen: `dce off` 1.33x "faster" where, alternating places, it measured
    the same)."""
    a, b = first.get("epoch_seconds") or [], last.get("epoch_seconds") or []
    if not a or len(a) != len(b):
        return None
    reference = [(x + y) / 2 for x, y in zip(a, b)]
    for r in variants.values():
        own = r.get("epoch_seconds") or []
        if len(own) == len(reference):
            r["paired_ratio"] = float(np.median([v / t for v, t in zip(own, reference)]))
    return float(np.median([max(x, y) / min(x, y) - 1.0 for x, y in zip(a, b)]))


def ablation_effect(variant_seconds, base_seconds, name="x off", noise=NOISE):
    """What one optimisation does on this machine, from the epoch time of the variant ``name``
    ("<option> off": a default-on optimisation switched off; "<option> on": a default-off one
    switched on) ÷ the all-on time: the ratio, and a few words saying whether the optimisation
    buys or costs here (within ``noise`` of 1: neither). Returns ``(ratio, words, costs)``."""
    ratio = variant_seconds / base_seconds
    if abs(ratio - 1.0) <= noise:
        return ratio, f"no measurable effect (within ±{noise:.0%})", False
    if name.endswith(" on"):  # off by default: the variant is the optimisation
        if ratio > 1.0:
            return ratio, f"switched on it costs {ratio:.2f}× (off by default)", False
        return ratio, f"switched on it buys {1 / ratio:.2f}×, yet is off by default", True
    if ratio > 1.0:
        return ratio, f"buys {ratio:.2f}×", False
    return ratio, f"COSTS here: without it {1 / ratio:.2f}× faster", True


def ablation_table(ablation, machine=""):
    """Fig. 10: minicavs with one optimisation switched from its default at a time, against
    all on — what each optimisation buys on this machine, and where one costs."""
    rows, costs, drifts = [], [], []
    paired = False
    for workload, variants in ablation.items():
        base = variants.get("all on", {}).get("best_epoch_seconds")
        drift = variants.get("all on", {}).get("paired_drift",
                                               variants.get("all on", {}).get("drift"))
        noise = max(NOISE, drift or 0.0)
        if drift is not None:
            drifts.append(f"{workload} {drift:.0%}")
        for name, r in variants.items():
            if "throughput" not in r:
                rows.append([workload, name, str(r.get("error") or r.get("missing"))[:60],
                             "", "", ""])
                continue
            if name == "all on" or not base:
                ratio, words, cost = 1.0, "the reference", False
            elif "paired_ratio" in r:
                paired = True
                ratio, words, cost = ablation_effect(r["paired_ratio"], 1.0, name, noise)
            else:
                ratio, words, cost = ablation_effect(r["best_epoch_seconds"], base, name, noise)
            if cost:
                costs.append(f"{workload}: {name.rsplit(' ', 1)[0]} ({words})")
            rows.append([workload, name, f"{r['throughput']:,.0f}",
                         f"{r['best_epoch_seconds']:.3f}", f"{ratio:.2f}×", words])
    header = ["workload", "variant", "throughput", "epoch s", "variant ÷ all-on time",
              "what the optimisation does here"]
    where = f" on {machine}" if machine else ""
    text = (f"Ablation (Cavs Fig. 10): one optimisation switched from its default at a time"
            f"{where}.\nFor an option on by default, a ratio above 1 is what it buys; below 1 "
            f"it costs on this machine and workload (the variant without it was faster).\n"
            + _table(header, rows))
    if drifts and paired:
        text += ("\nThe runs took turns an epoch at a time: each ratio is the variant's epoch ÷ "
                 "the mean of the two all-on epochs (the first and last turns) of the same "
                 "round, the median over the rounds; the two all-on epochs of a round differed "
                 "by " + ", ".join(drifts) + " (the median): a ratio within that of 1 reads as "
                 "no measurable effect.")
    elif drifts:
        text += ("\nThe reference is the faster of two all-on runs, before and after the "
                 "variants; the slower was behind by " + ", ".join(drifts) + ": a ratio within "
                 "that of 1 reads as no measurable effect.")
    short = [v for variants in ablation.values() for v in variants.values()
             if v.get("best_epoch_seconds", 1.0) < 0.2]
    if short:
        text += ("\nEpochs under 0.2 s (a --quick run): ratios within about ±10 % are noise; "
                 "the full run's are steadier.")
    if costs:
        text += "\nWhere the defaults cost here: " + "; ".join(costs) + "."
    return text


def write_json(report, directory):
    path = Path(directory) / "results.json"
    path.write_text(json.dumps(report, indent=1, default=_jsonable))
    return path


def draw_chart(report, directory):
    """A PNG: throughput per workload and system (log scale), and the ablation. None (and the
    reason) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return None, f"matplotlib not installed ({exc})"
    entries = report["workloads"]
    columns = min(max(len(entries), 1), 3)  # a grid, three panels a row, not one long strip
    rows = -(-max(len(entries), 1) // columns)
    ablation_rows = sum(max(len(v) - 1, 0) for v in report.get("ablation", {}).values())
    ablation_height = 0.22 * ablation_rows + 1.4 if report.get("ablation") else 0.0
    width = max(4.4 * columns, 10.0 if report.get("ablation") else 0.0)  # the ablation's labels
    fig = plt.figure(figsize=(width, 4.0 * rows + ablation_height), layout="constrained")
    # Two sub-figures, each laid out on its own: the throughput grid, then the ablation.
    top, bottom = (fig.subfigures(2, 1, height_ratios=[4.0 * rows, ablation_height])
                   if report.get("ablation") else (fig, None))
    panel_axes = top.subplots(rows, columns, squeeze=False).ravel()
    for ax in panel_axes[len(entries):]:
        ax.set_visible(False)
    colours = {"minicavs": "#d62728", "minicavs-cuda": "#ff9896", "torch-eager": "#1f77b4",
               "torch-batched": "#2ca02c", "torch-batched-cuda": "#98df8a",
               "dynet": "#9467bd"}
    for ax, entry in zip(panel_axes, entries):
        names = [s for s, r in entry["results"].items() if "throughput" in r]
        values = [entry["results"][s]["throughput"] for s in names]
        bars = ax.bar(range(len(names)), values, color=[colours.get(s, "grey") for s in names])
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
        floor = entry["units"] / (entry["flops"]["total"] / report["gemm_flops"])
        ax.axhline(floor, color="black", linestyle="--", linewidth=1, label="FLOP floor")
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{entry['title']}\nH={entry['hidden']}", fontsize=9)
        ax.set_ylabel(entry["unit"])
        ax.legend(fontsize=7)
    if report.get("ablation"):
        # One horizontal bar per variant, its name on the y axis: labels never overprint.
        ax = bottom.subplots()
        labels, values = [], []
        for workload, variants in report["ablation"].items():
            base = variants.get("all on", {}).get("best_epoch_seconds")
            for name, r in variants.items():
                if name != "all on" and "best_epoch_seconds" in r and base:
                    labels.append(f"{workload}: {name}")
                    values.append(r["best_epoch_seconds"] / base)
        colour = ["#2ca02c" if v > 1 + NOISE else "#d62728" if v < 1 - NOISE else "grey"
                  for v in values]
        bars = ax.barh(range(len(values)), values, color=colour)
        ax.bar_label(bars, labels=[f"{v:.2f}×" for v in values], fontsize=7, padding=2)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("time with one option switched from its default ÷ time with the defaults\n"
                      "green: the default is faster by that; red: the default costs here; "
                      "grey: within ±5 %", fontsize=8)
        machine = report.get("machine", {}).get("cpu", "")
        ax.set_title(f"minicavs ablation: what each optimisation buys on this machine"
                     f"{f', {machine}' if machine else ''}", fontsize=9, wrap=True)
    path = Path(directory) / "results.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, None
