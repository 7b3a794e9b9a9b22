"""The training loop the examples and ``minicavs train`` share: command-line options, the
per-epoch loop with a progress bar, evaluation, and the numbers every run reports.

It works with any model of :mod:`minicavs.models` (``prepare``, ``loss`` summed over the
batch, ``evaluate``); a step backpropagates the loss *per target* (per labelled vertex, per
word), so the learning rate does not depend on the batch size or the sentence lengths.

With ``--distributed`` (under ``mpiexec -n N``) the same loop runs data-parallel: each rank
trains on its share of every step's batch, divides its loss by the step's *global* count of
targets and the gradients are summed over the ranks, so N ranks with batch B take exactly the
steps of one process with batch N × B (:mod:`minicavs.distributed`).
"""

import argparse
import importlib.util
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from . import backend, validate
from .distributed import (DEFAULT_TIMEOUT, DistributedSampler, LocalCommunicator,
                          create_communicator, launched_by_mpi, shard)
from .data.batches import minibatches  # noqa: F401 (the training loop's, re-exported)
from .data.tree import DataError
from .autodiff import Tensor
from .errors import ArgumentError, MinicavsError
from .nn import SGD, Adagrad, Adam, CombinedOptimizer, clip_grad_norm

# The BLAS thread count is the backend's (set_blas_threads documents why one is the default).
set_blas_threads, get_blas_threads = backend.set_blas_threads, backend.get_blas_threads


# --- options --------------------------------------------------------------------------------

def add_common_arguments(parser, *, epochs, batch_size, lr, data_help):
    """The options every example (and ``minicavs train``) takes."""
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default=os.environ.get("MINICAVS_DEVICE", "cpu") or "cpu",
                        help="where to compute: NumPy on the CPU or CuPy on a GPU "
                             "(default: $MINICAVS_DEVICE or cpu)")
    parser.add_argument("--data", metavar="PATH", default=None, help=data_help)
    parser.add_argument("--epochs", type=validate.count(minimum=0), default=epochs,
                        help=f"passes over the training data (default {epochs})")
    parser.add_argument("--batch-size", type=validate.count(minimum=1), default=batch_size,
                        help=f"samples per training step (default {batch_size}); per rank "
                             f"with --distributed: a step of N ranks trains on N times this")
    parser.add_argument("--lr", type=validate.real(minimum=0, open_minimum=True), default=lr,
                        help=f"Adam learning rate (default {lr})")
    parser.add_argument("--seed", type=validate.count(minimum=0, maximum=2**32 - 1), default=0,
                        help="seed of the weights, the data order and synthetic data "
                             "(default 0)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="float type of weights and states (default float32)")
    parser.add_argument("--threads", type=validate.count(minimum=1), default=1,
                        help="BLAS threads (default 1: the GEMMs are small, and extra BLAS "
                             "threads slow them down on a busy machine)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bars (the per-epoch and final lines remain)")
    group = parser.add_argument_group("data-parallel training (under mpiexec -n N)")
    group.add_argument("--distributed", action=argparse.BooleanOptionalAction, default=None,
                       help="train data-parallel over the MPI ranks (needs mpi4py: pip "
                            "install 'minicavs[distributed]'); implied when mpiexec started "
                            "more than one rank. Rank 0 logs, evaluates and writes files")
    group.add_argument("--communicator", choices=["auto", "mpi", "nccl"], default="auto",
                       help="how gradients travel: mpi (host memory), nccl (CuPy arrays on "
                            "GPUs) or auto: nccl with --device cuda, else mpi (default auto)")
    group.add_argument("--timeout", type=validate.real(minimum=0, open_minimum=True),
                       default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help=f"a rank waiting longer than this for the others stops the job "
                            f"(default {DEFAULT_TIMEOUT:g})")


def add_model_arguments(parser, *, embed_dim=64, hidden=64, clip=None):
    """Model-size options shared by the examples (and, with ``clip``, gradient clipping)."""
    if embed_dim is not None:
        parser.add_argument("--embed-dim", type=validate.count(minimum=1), default=embed_dim,
                            help=f"embedding size (default {embed_dim})")
    parser.add_argument("--hidden", type=validate.count(minimum=1), default=hidden,
                        help=f"state size (default {hidden})")
    if clip is not None:
        parser.add_argument("--clip", type=validate.real(minimum=0), default=clip,
                            help=f"clip the gradient norm to this (default {clip:g}; 0: off)")


_PROBABILITY = validate.real(minimum=0, maximum=1, open_maximum=True)  # a dropout rate, [0, 1)


def plot_file(text):
    """``--plot PNG``, checked when the options are read rather than when the run ends: the
    file's folder exists and takes a new file, and matplotlib, which draws it, is installed."""
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(f"the folder {directory!r} of {text!r} does not exist")
    try:
        validate.writable_file(text, "the plot")
    except ArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(f"drawing {text!r} needs matplotlib, which is not "
                                         f"installed (pip install 'minicavs[plot]')")
    return text


def add_plot_argument(parser, curves):
    parser.add_argument("--plot", metavar="PNG", type=plot_file, default=None,
                        help=f"write the training curves ({curves}) to this PNG (needs "
                             f"matplotlib: pip install 'minicavs[plot]')")


def add_language_model_arguments(parser):
    """The options the two language-model examples share: regularisation and curves."""
    parser.add_argument("--dropout", type=_PROBABILITY, default=0.0,
                        help="dropout on the word vectors entering the LSTM and the states "
                             "entering the softmax, in training only (Zaremba et al. 2014; "
                             "default 0)")
    parser.add_argument("--tie-weights", action="store_true",
                        help="the softmax layer's weights are the embedding table, transposed "
                             "(Press & Wolf 2017; needs --embed-dim equal to --hidden)")
    add_plot_argument(parser, "train and held-out loss, held-out perplexity per epoch")


def check_language_model_arguments(parser, args):
    """Refuse, as a usage error, what :func:`add_language_model_arguments`' options cannot
    do together; returns ``args``."""
    if args.tie_weights and args.embed_dim != args.hidden:
        parser.error(f"--tie-weights needs --embed-dim equal to --hidden (the softmax weights "
                     f"are the embedding table), got {args.embed_dim} and {args.hidden}")
    return args


def command_line(main, argv=None):
    """Run an example's ``main(argv)`` as a command: a minicavs error (bad data, a device that
    is missing) ends it with the message and exit status 1, not a traceback."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "minicavs"
    try:
        main(argv)
    except MinicavsError as exc:
        print(f"{prog}: error: {command_line_hint(exc)}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # one line, not a traceback: nothing is lost but this run
        print(f"\n{prog}: interrupted (the examples save no checkpoint; the main job, "
              f"python -m minicavs train, does)", file=sys.stderr)
        raise SystemExit(130) from None


def command_line_hint(exc):
    """An error's message as a command line should give it: the flag, not the Python call."""
    return str(exc).replace("use set_device('cpu')", "pass --device cpu")


def setup(args):
    """Apply the common options: device, ranks, seeds, BLAS threads. Returns the communicator
    of this run's ranks: a LocalCommunicator unless the run is distributed."""
    backend.set_device(args.device)
    distributed = getattr(args, "distributed", False)
    implied = distributed is None and launched_by_mpi()
    if distributed or implied:
        comm = create_communicator(args.communicator, timeout=args.timeout)
        comm.log(f"data-parallel over {comm.size} rank(s) ({type(comm).__name__}"
                 f"{', implied by mpiexec' if implied else ''}), {args.batch_size} samples "
                 f"per rank and step")
    else:
        comm = LocalCommunicator()
    backend.seed(args.seed)
    set_blas_threads(args.threads)
    return comm


# --- the loop ------------------------------------------------------------------------------

def prepare_all(model, samples, batch_size):
    """Prepared batches of ``samples`` in order: evaluation data is batched once per run."""
    return [model.prepare(chunk) for chunk in minibatches(samples, batch_size)]


@dataclass
class EpochStats:
    loss: float  # mean per target (labelled vertex, word, ...)
    samples: int
    seconds: float  # batching, forward, backward and update; no evaluation

    @property
    def samples_per_second(self):
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


LOSS_DISPLAY_SECONDS = 1.0  # how often the progress bar reads the running loss
LOSS_SCALES = ("target", "sample")  # what a step's summed loss is divided by


def train_epoch(model, optimizer, batches, *, comm=None, clip=None, progress=True,
                desc="train", unit="sample", loss_per="target", before_step=None):
    """One pass over ``batches`` (lists of raw samples, prepared here: building the batch's
    graphs is part of the cost of a step, as it is in Cavs' measurements).

    A step backpropagates the batch's summed loss divided by its number of targets
    (``loss_per="target"``, the default) or of samples (``"sample"``: the loss summed over a
    tree's labelled vertices, averaged over the trees, as Socher et al.'s and Tai et al.'s code
    do). Adam and AdaGrad with a tiny eps take the same steps either way; the scale matters to
    an L2 coefficient, to AdaGrad's eps and to plain SGD. The loss reported stays per target.

    With ``comm`` of N ranks, every rank is given the same ``batches`` and trains on its shard
    of each (:func:`minicavs.distributed.shard`); the loss is divided by the step's targets
    over all ranks and the gradients are summed, so the update is the one a single process
    makes on the whole batch. The figures returned are the global ones.

    ``before_step(optimizer)``, if given, runs after the gradients are ready (reduced and
    clipped) and before each ``optimizer.step()`` (:class:`ActiveRowsL2`).

    The summed loss stays where the model computes it: on a GPU, reading it every step would
    make the host wait for the device once per batch. It is read at the end of the epoch, and
    for the progress bar at most once every ``LOSS_DISPLAY_SECONDS``.
    """
    if loss_per not in LOSS_SCALES:
        raise ArgumentError(f"train_epoch: loss_per must be one of {list(LOSS_SCALES)}, got "
                            f"{loss_per!r}")
    comm = comm or LocalCommunicator()
    total, targets, samples = 0.0, 0, 0
    own_targets = 0  # the progress bar shows this rank's running loss: no collective for it
    started = shown = time.perf_counter()
    bar = tqdm(total=sum(len(b) for b in batches), desc=desc, unit=unit,
               disable=not (progress and comm.is_root), leave=False, dynamic_ncols=True)
    with bar:
        for step_samples in batches:
            chunk = shard(step_samples, comm.rank, comm.size)
            optimizer.zero_grad()
            batch = model.prepare(chunk) if chunk else None  # a short last step may leave none
            loss = model.loss(batch) if batch is not None else None
            mine = batch.num_targets if batch is not None else 0
            my_samples = batch.num_samples if batch is not None else 0
            step_targets, step_samples_total = (
                int(n) for n in comm.allreduce_sum([mine, my_samples]))
            divisor = step_targets if loss_per == "target" else step_samples_total
            if loss is not None:
                (loss * (1.0 / max(divisor, 1))).backward()
            comm.allreduce_gradients(optimizer.params)
            if clip:
                clip_grad_norm(optimizer.params, clip)
            if before_step is not None:
                before_step(optimizer)
            optimizer.step()
            if batch is not None:
                # summed in float64, on its device; read, not handed out (``.data`` would
                # checksum the saved loss: on a GPU two reductions and a wait a step)
                total = total + loss._array.astype(np.float64)
                samples += my_samples
                own_targets += mine
            targets += step_targets
            bar.update(len(step_samples))
            if progress and time.perf_counter() - shown >= LOSS_DISPLAY_SECONDS:
                bar.set_postfix(loss=f"{float(total) / max(own_targets, 1):.4f}", refresh=False)
                shown = time.perf_counter()
    total, samples = comm.allreduce_sum([float(total), samples])
    return EpochStats(float(total) / max(targets, 1), int(samples),
                      time.perf_counter() - started)


def format_metrics(metrics, prefix=""):
    """``{"loss": 0.5, "fine": 0.9}`` -> ``"loss 0.5000  fine 0.900"``."""
    digits = {"loss": 4, "perplexity": 2}
    return "  ".join(f"{prefix}{name} {value:.{digits.get(name, 3)}f}"
                     for name, value in metrics.items())


def best_epoch(history, metric):
    """The epoch (from 1) of ``history`` (:func:`fit`'s) whose dev ``metric`` is highest; the
    earliest of equals. None when no epoch has the metric."""
    scores = [metrics.get(metric, float("nan")) for _, metrics in history]
    finite = [(-score, epoch) for epoch, score in enumerate(scores, start=1)
              if np.isfinite(score)]
    return min(finite)[1] if finite else None


def check_something_to_train(model, train, batch_size=256):
    """A :class:`DataError` unless some sample of ``train`` gives ``model`` a target: one-word
    trees of a model trained on internal vertices, or a set of only unlabelled phrases, would
    otherwise "train" for every epoch, change nothing and report success. Stops at the first
    batch with a target, so real data costs one ``prepare``."""
    if not any(model.prepare(chunk).num_targets for chunk in minibatches(train, batch_size)):
        raise DataError(f"nothing to train on: the {len(train)} training samples give "
                        f"{type(model).__name__} no target (no labelled vertex or word it "
                        f"trains on; one-word trees, for instance, have no internal vertex: "
                        f"train on the leaves too, --leaf-loss)")


def fit(model, optimizer, train, dev=None, *, epochs, batch_size, seed=0, clip=None,
        progress=True, unit="sample", start_epoch=0, eval_batch_size=256, on_epoch_end=None,
        log=None, comm=None, keep_best=None, loss_per="target", on_epoch_start=None,
        before_step=None):
    """Train for epochs ``start_epoch + 1 .. epochs``, evaluating on ``dev`` after each.

    With ``keep_best`` (a dev metric, e.g. ``"fine"``) the model ends with the weights of the
    epoch of highest dev ``keep_best`` (:func:`best_epoch`), not the last: the papers report
    the test accuracy of the model selected on dev (Socher et al. 2013; Tai et al. 2015).

    The data order of epoch k depends only on (seed, k), so a resumed run sees the same
    batches as one that never stopped. ``on_epoch_start(epoch)`` runs before each epoch (an
    optimiser reset), ``on_epoch_end(epoch, stats, dev_metrics)`` after it (checkpoints);
    ``loss_per`` and ``before_step`` are :func:`train_epoch`'s. Returns the list of
    (EpochStats, dev metrics) per epoch.

    With ``comm`` (:mod:`minicavs.distributed`), ``batch_size`` is per rank: rank 0's
    parameters and optimiser state are broadcast first, each step trains on the samples one
    process with ``comm.size * batch_size`` would (:class:`DistributedSampler`), and only rank
    0 evaluates ``dev`` and logs (the other ranks' dev metrics are ``{}``).
    ``on_epoch_end`` runs on every rank: write files there only ``if comm.is_root``.
    """
    for name, value, low in (("epochs", epochs, 0), ("batch_size", batch_size, 1),
                             ("start_epoch", start_epoch, 0), ("eval_batch_size",
                                                               eval_batch_size, 1)):
        validate.integer(value, name, "fit", minimum=low)
    if clip is not None:
        validate.number(clip, "clip", "fit", minimum=0)
    if epochs > start_epoch:
        check_something_to_train(model, train, eval_batch_size)
    comm = comm or LocalCommunicator()
    log = log or comm.log
    comm.broadcast_parameters(model.named_parameters())  # names: same shapes, other order
    comm.broadcast_optimizer_state(optimizer)
    sampler = DistributedSampler(train, batch_size, rank=comm.rank, size=comm.size, seed=seed)
    dev_batches = prepare_all(model, dev, eval_batch_size) if dev and comm.is_root else None
    history, best = [], None  # best: (dev score, epoch, weights)
    for epoch in range(start_epoch + 1, epochs + 1):
        if on_epoch_start is not None:
            on_epoch_start(epoch)
        if hasattr(model, "train"):
            model.train()  # dropout on; evaluate() switches it off for its own pass
        stats = train_epoch(model, optimizer, sampler.global_batches(epoch), comm=comm,
                            clip=clip, progress=progress, desc=f"epoch {epoch}/{epochs}",
                            unit=unit, loss_per=loss_per, before_step=before_step)
        metrics = model.evaluate(dev_batches) if dev_batches else {}
        history.append((stats, metrics))
        log(f"epoch {epoch}/{epochs}  train loss {stats.loss:.4f}  "
            f"{format_metrics(metrics, 'dev ')}  "
            f"{stats.samples_per_second:.0f} {unit}s/s  ({stats.seconds:.1f} s)")
        if keep_best and best_epoch(history, keep_best) == len(history):
            best = (metrics[keep_best], epoch, model.state_dict())
        if on_epoch_end is not None:
            on_epoch_end(epoch, stats, metrics)
    if best is not None and best[1] != epochs:
        model.load_state_dict(best[2])
        log(f"kept the weights of epoch {best[1]} (dev {keep_best} {best[0]:.3f}, the best)")
    return history


def throughput(history):
    """Training samples per second over all epochs of ``history``."""
    samples = sum(stats.samples for stats, _ in history)
    seconds = sum(stats.seconds for stats, _ in history)
    return samples / seconds if seconds > 0 else float("nan")


# --- data for the sequence examples -----------------------------------------------------------

def language_model_corpus(path=None, *, seed=0, num_sentences=3000):
    """``(train, held_out, vocab, description)``: sentences as int64 id arrays ending in
    ``<eos>`` (id 1), for the language-model examples.

    ``path`` may be a PTB directory (``ptb.{train,valid,test}.txt``; without a training file,
    as in this repository's copy, it trains on valid and evaluates on test) or one text file
    (one sentence a line; the last tenth is held out). Without ``path``: the sentences of the
    synthetic treebank, a small corpus with real grammar, ``num_sentences`` of them.
    """
    from . import data as datasets

    def last_tenth_held_out(sentences, description):
        vocab = datasets.Vocabulary.build(sentences, specials=[datasets.EOS])
        encoded = [vocab.encode(s) for s in sentences]
        cut = len(encoded) * 9 // 10
        return encoded[:cut], encoded[cut:], vocab, description

    if path is None:
        trees, _ = datasets.synthetic_treebank(num_sentences, seed=seed)
        return last_tenth_held_out([t.tokens + [datasets.EOS] for t in trees],
                                   "synthetic treebank sentences")
    if os.path.isdir(path):
        corpus = datasets.load_ptb(path)
        if corpus.train is not None:
            held_out = corpus.valid if corpus.valid is not None else corpus.test
            return corpus.train, held_out, corpus.vocab, f"PTB train/valid from {path}"
        if corpus.valid is None or corpus.test is None:
            raise datasets.DataError(f"{path}: needs ptb.train.txt, or both ptb.valid.txt "
                                     f"and ptb.test.txt")
        return corpus.valid, corpus.test, corpus.vocab, \
            f"PTB from {path} (no training file: trained on valid, evaluated on test)"
    return last_tenth_held_out(datasets.read_ptb(path), f"{path} (last tenth held out)")


def unigram_perplexity(train, held_out, vocab_size):
    """The held-out perplexity of word frequencies alone (add-one smoothed counts of ``train``,
    sentences of ids): the baseline a language model has to beat, printed beside its own."""
    counts = np.bincount(np.concatenate([np.asarray(s) for s in train]),
                         minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    words = np.concatenate([np.asarray(s) for s in held_out])
    return float(np.exp(-log_p[words].mean()))


def _fraction(value):
    return "n/a" if value is None else f"{value:.3f}"


def report_root_accuracy(name, model, splits, history, comm=None):
    """Evaluate a tree classifier on dev and test, print the final line (on rank 0 of
    ``comm``), return the figures."""
    dev = model.evaluate(prepare_all(model, splits.dev, 256))
    test = model.evaluate(prepare_all(model, splits.test, 256))
    speed = throughput(history)
    (comm or LocalCommunicator()).log(
        f"{name}: test loss {test['loss']:.4f}  root accuracy dev fine {dev['fine']:.3f} "
        f"binary {dev['binary']:.3f}, test fine {test['fine']:.3f} binary "
        f"{test['binary']:.3f} (chance {_fraction(chance_level(splits.test, 'fine'))} fine, "
        f"{_fraction(chance_level(splits.test, 'binary'))} binary)  {speed:.0f} trees/s")
    return {"dev": dev, "test": test, "trees_per_second": speed}


# --- the SST papers' protocols and settings (the tree examples) ------------------------------

def add_sst_arguments(parser):
    """The options of the papers' SST experiments (Socher et al. 2013; Tai et al. 2015)."""
    group = parser.add_argument_group("the SST papers' protocols and training settings")
    group.add_argument("--task", choices=["fine", "binary", "binary3"], default="fine",
                       help="fine: 5 classes, root accuracy; binary: neutral sentences "
                            "dropped, a 2-class model trained on the non-neutral phrases and "
                            "scored on the roots; binary3: the same sentences, a 3-class model "
                            "trained on every phrase (neutral ones too) and scored negative "
                            "against positive, as Tai et al.'s code does "
                            "(minicavs.data.sst_task; default fine)")
    group.add_argument("--optimizer", choices=["adam", "adagrad"], default="adam",
                       help="adam, or adagrad as in both papers (default adam)")
    group.add_argument("--embed-lr", type=validate.real(minimum=0, open_minimum=True),
                       default=None, help="learning rate of the word embeddings (Tai et al.: "
                                          "0.1; default --lr)")
    group.add_argument("--l2", type=validate.real(minimum=0), default=0.0,
                       help="L2 penalty on the weights other than the embeddings, added to "
                            "the gradient per target (Tai et al.: 1e-4; default 0)")
    group.add_argument("--embed-l2", type=validate.real(minimum=0), default=0.0,
                       help="L2 penalty on the word embeddings (default 0)")
    group.add_argument("--embed-l2-rows", choices=["all", "batch"], default="all",
                       help="which word vectors --embed-l2 penalises at a step: all of them, "
                            "or only those of the step's trees (batch: Stanford CoreNLP's "
                            "sentiment trainer; default all)")
    group.add_argument("--classifier-l2", type=validate.real(minimum=0), default=None,
                       help="L2 penalty on the classifier's weights W_out, its bias b_out "
                            "unpenalised (CoreNLP: 1e-4); default: --l2 on both")
    group.add_argument("--tensor-l2", type=validate.real(minimum=0), default=None,
                       help="RNTN: L2 penalty on the tensor V (CoreNLP: 1e-3, as on W); "
                            "default --l2")
    group.add_argument("--tensor-lr", type=validate.real(minimum=0, open_minimum=True),
                       default=None, help="RNTN: learning rate of the tensor V (default --lr)")
    group.add_argument("--dropout", type=_PROBABILITY, default=0.0,
                       help="dropout on the state fed to the classifier, in training only "
                            "(Tai et al.: 0.5; default 0)")
    group.add_argument("--embed-dropout", type=_PROBABILITY, default=0.0,
                       help="dropout on the word vectors, in training only (default 0)")
    group.add_argument("--adagrad-eps", type=validate.real(minimum=0), default=1e-10,
                       help="AdaGrad's eps in lr * g / (sqrt(sum g²) + eps) (Stanford "
                            "CoreNLP's sentiment trainer: 1e-3, with --loss-per sentence; "
                            "default 1e-10)")
    group.add_argument("--adagrad-reset", action="store_true",
                       help="forget AdaGrad's sums of squared gradients at the start of every "
                            "epoch (CoreNLP's sentiment trainer does)")
    group.add_argument("--lr-decay", type=validate.real(minimum=0, maximum=1,
                                                        open_minimum=True), default=1.0,
                       help="multiply every learning rate by this at the start of each epoch "
                            "after the first (a decaying schedule; default 1: constant)")
    group.add_argument("--embed-optimizer", choices=["same", "sgd"], default="same",
                       help="sgd: update the word embeddings with plain SGD at --embed-lr "
                            "(Tai et al.'s code), the rest with --optimizer; same: one "
                            "optimiser for all (default same)")
    group.add_argument("--loss-per", choices=["target", "sentence"], default="target",
                       help="what a step's summed loss is divided by: its labelled vertices "
                            "(target) or its trees (sentence: the papers' code, a tree's loss "
                            "summed over its phrases); it scales L2, AdaGrad's eps and plain "
                            "SGD (default target)")
    group.add_argument("--min-count", type=validate.count(minimum=1), default=1,
                       help="words seen fewer times in the training trees become <unk>, so "
                            "<unk> (every unseen dev and test word) is trained (default 1: "
                            "every training word is kept and <unk> is never trained)")
    group.add_argument("--word-dropout", type=_PROBABILITY, default=0.0,
                       help="in training, replace each word by <unk> with this probability "
                            "(default 0)")
    group.add_argument("--keep-best", choices=["fine", "binary", "phrase"], default=None,
                       help="the dev metric that picks each run's epoch, and the test figure "
                            "reported: fine (5-class root accuracy), binary (root accuracy on "
                            "the non-neutral roots; for --task fine, a 5-class model's "
                            "positive against negative probability mass) or phrase (every "
                            "labelled vertex); default: fine for --task fine, else binary")
    group.add_argument("--seeds", type=validate.count(minimum=1), default=1,
                       help="train with seeds --seed .. --seed + N - 1 and report the mean "
                            "and standard deviation of the test accuracy (default 1)")
    group.add_argument("--word-vectors", metavar="PATH", default=None,
                       help="pretrained vectors in GloVe's text format for the embedding "
                            "(its dimension must be the embedding size; words the file "
                            "lacks keep their random vectors)")
    add_plot_argument(group, "train and dev loss, dev accuracy per epoch, one line per seed")


def make_optimizer(args, model):
    """The optimiser of ``args`` (:func:`add_sst_arguments`) for ``model``: the embedding
    table in its own parameter group (``--embed-lr``, ``--embed-l2``), the rest with
    ``--lr`` and ``--l2``; with ``--embed-optimizer sgd`` the embedding has its own plain
    SGD (a :class:`minicavs.nn.CombinedOptimizer` of the two)."""
    named = list(model.named_parameters())
    embedding = [p for name, p in named if name.startswith("embedding.")]
    classifier_l2 = getattr(args, "classifier_l2", None)
    classifier = {} if classifier_l2 is None else {
        name: p for name, p in named if name.split(".")[-1] in ("W_out", "b_out")}
    tensor_l2, tensor_lr = getattr(args, "tensor_l2", None), getattr(args, "tensor_lr", None)
    tensor = {} if tensor_l2 is None and tensor_lr is None else {
        name: p for name, p in named if name.split(".")[-1] == "V"}
    others = [p for name, p in named if not name.startswith("embedding.")
              and name not in classifier and name not in tensor]
    embed_lr = args.embed_lr if args.embed_lr is not None else args.lr
    embed_l2 = 0.0 if getattr(args, "embed_l2_rows", "all") == "batch" else args.embed_l2
    embed_group = {"params": embedding, "weight_decay": embed_l2, "lr": embed_lr}
    separate = getattr(args, "embed_optimizer", "same") == "sgd" and embedding
    classifier_groups = [
        {"params": [p for name, p in classifier.items() if name.endswith("W_out")],
         "weight_decay": classifier_l2},
        {"params": [p for name, p in classifier.items() if name.endswith("b_out")],
         "weight_decay": 0.0}]
    tensor_group = {"params": list(tensor.values()),
                    "weight_decay": args.l2 if tensor_l2 is None else tensor_l2,
                    "lr": args.lr if tensor_lr is None else tensor_lr}
    groups = [g for g in [{"params": others, "weight_decay": args.l2}] + classifier_groups
              + [tensor_group]
              + ([] if separate else [embed_group]) if g["params"]]
    if args.optimizer == "adagrad":
        main = Adagrad(groups, lr=args.lr, eps=getattr(args, "adagrad_eps", 1e-10))
    elif args.optimizer == "adam":
        main = Adam(groups, lr=args.lr)
    else:
        raise ArgumentError(f"unknown optimizer {args.optimizer!r}; use adam or adagrad")
    if not separate:
        return main
    return CombinedOptimizer([main, SGD([embed_group], lr=embed_lr)])


class ActiveRowsL2:
    """An L2 penalty ``coefficient`` on the rows of ``param`` (an embedding table) that the
    step used, none on the others: called before ``optimizer.step()`` (:func:`train_epoch`'s
    ``before_step``), it adds ``coefficient * row`` to the gradient of every row whose
    gradient is not all zero. Stanford CoreNLP's sentiment trainer penalises only the word
    vectors of the batch's trees (``scaleAndRegularize(..., activeMatricesOnly=true)``); a
    penalty on the whole table would, under AdaGrad with eps 1e-3 and its sums reset every
    epoch, shrink every word absent from a step by lr * coefficient / eps of itself."""

    def __init__(self, param, coefficient):
        validate.number(coefficient, "coefficient", "ActiveRowsL2", minimum=0.0)
        self.param, self.coefficient = param, float(coefficient)

    def __call__(self, optimizer=None):
        grad = self.param.grad
        if grad is None or not self.coefficient:
            return
        g = grad.data
        xp = backend.get_array_module(g)
        active = xp.any(g.reshape(g.shape[0], -1) != 0, axis=1)
        penalised = g.copy()  # a gradient is never changed in place
        penalised[active] += self.coefficient * self.param.data[active]
        self.param.grad = Tensor(penalised)


def load_vectors_into(model, vocab, path, log=print):
    """``--word-vectors``: the file's vectors into ``model.embedding``; logs how many of the
    vocabulary's words it had. Returns that count."""
    from .data import load_word_vectors

    state = model.state_dict()
    matched = load_word_vectors(path, vocab, state["embedding.weight"])
    model.load_state_dict(state)
    log(f"word vectors: {matched} of {len(vocab)} vocabulary words found in {path} "
        f"({100.0 * matched / max(len(vocab), 1):.1f}%); the others keep their random vectors")
    return matched


def mean_and_std(values):
    """``(mean, standard deviation)`` of ``values`` (the sample std, n - 1; 0 for one)."""
    values = np.asarray(values, dtype=np.float64)
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return float(values.mean()), std


def plot_history(histories, path, metric, title="", log=print, held_out="dev"):
    """Training curves to the PNG ``path``: train and dev loss, and dev ``metric`` (an
    accuracy, or ``"perplexity"``), per epoch, one line per run (``histories``: ``{label:
    fit()'s history}``); ``held_out`` names the evaluation set in the labels. Without
    matplotlib (the ``plot`` extra) it logs why and writes nothing; returns whether it wrote
    the file."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"--plot: matplotlib is not installed, so {path} was not written "
            f"(pip install 'minicavs[plot]')")
        return False
    figure, (losses, scores) = plt.subplots(1, 2, figsize=(10, 4))
    for label, history in histories.items():
        epochs = np.arange(1, len(history) + 1)
        line, = losses.plot(epochs, [stats.loss for stats, _ in history],
                            label=f"train {label}")
        losses.plot(epochs, [m.get("loss", np.nan) for _, m in history], linestyle="--",
                    color=line.get_color(), label=f"{held_out} {label}")
        scores.plot(epochs, [m.get(metric, np.nan) for _, m in history], label=label)
    losses.set(xlabel="epoch", ylabel="loss per target", title="loss")
    what = metric if metric == "perplexity" else f"{metric} accuracy"
    scores.set(xlabel="epoch", ylabel=f"{held_out} {what}", title=f"{held_out} {metric}")
    from matplotlib.ticker import MaxNLocator
    for axes in (losses, scores):  # epochs are whole numbers: no 1.5 on the axis
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    log(f"--plot: training curves written to {path}")
    return True


LOSS_PER = {"target": "target", "sentence": "sample"}  # --loss-per -> fit's loss_per


def sentiment_splits(args):
    """The tree examples' data: SST from ``args.data``, else the synthetic treebank
    (``args.train_size`` training trees, a quarter of that each for dev and test), with the
    vocabulary of ``--min-count``."""
    from . import data as datasets

    if args.data:
        return datasets.load_sst(args.data, min_count=args.min_count)
    held_out = max(args.train_size // 4, 1)
    splits = datasets.make_splits(seed=args.seed, sizes=(args.train_size, held_out, held_out))
    if args.min_count > 1:
        splits = datasets.rebuild_vocabulary(splits, args.min_count)
    return splits


def _epoch_start(args, optimizer):
    """What a sentiment run does at the start of each epoch, or None: AdaGrad's reset
    (``--adagrad-reset``), the learning rates' decay after the first epoch (``--lr-decay``)."""
    reset = getattr(args, "adagrad_reset", False)
    decay = getattr(args, "lr_decay", 1.0)
    if not reset and decay == 1.0:
        return None
    optimizers = getattr(optimizer, "optimizers", [optimizer])  # (a CombinedOptimizer's parts)

    def start(epoch):
        if reset:
            optimizer.reset_state()
        if decay != 1.0 and epoch > 1:
            for part in optimizers:
                for group in part.param_groups:
                    group["lr"] *= decay
    return start


def task_metric(task, keep_best=None):
    """The dev metric that selects a run's epoch under SST ``task`` (``--keep-best``, by
    default the task's own: ``"fine"`` for fine, ``"binary"`` for the binary tasks), and so the
    test figure a run reports. A binary task's model has no 5-class output to score "fine"."""
    if keep_best is None:
        return "fine" if task == "fine" else "binary"
    reported = ("fine", "binary", "phrase") if task == "fine" else ("binary", "phrase")
    if keep_best not in reported:
        raise ArgumentError(f"--keep-best {keep_best}: a --task {task} model reports "
                            f"{', '.join(reported)}; fine needs the 5 classes of --task fine")
    return keep_best


def chance_level(trees, metric, classes=5):
    """The accuracy of always answering the most frequent class of ``trees`` under ``metric``
    ("fine": root labels; "phrase": every labelled vertex; "binary": the roots' polarity, neutral
    dropped) for labels of ``classes`` classes (5, 3 or 2), or None where it is not defined."""
    if not trees:
        return None
    if metric == "phrase":
        labels = np.concatenate([np.asarray(t.labels) for t in trees])
        labels = labels[labels >= 0]
    else:
        labels = np.array([int(t.labels[-1]) for t in trees])
        if metric == "binary":
            polarity = {5: [0, 0, -1, 1, 1], 3: [0, -1, 1], 2: [0, 1]}.get(classes)
            if polarity is None or labels.min(initial=0) < 0 or labels.max(initial=0) >= classes:
                return None
            labels = np.array(polarity)[labels]
            labels = labels[labels >= 0]
        elif metric != "fine":
            return None
    if labels.size == 0:
        return None
    return float(np.bincount(labels).max() / labels.size)


def sentiment_experiment(name, args, splits, make_model, log=print):
    """Train ``make_model(num_classes)`` on ``splits`` under ``args.task`` for each of
    ``args.seeds`` seeds, keep each run's best dev epoch, evaluate it on test, and log one line
    per seed and the mean ± std. Returns ``{"runs": [...], "test": {metric: (mean, std)},
    "metric": ...}``; each run holds its seed, best epoch, dev and test metrics, seconds."""
    from . import data as datasets

    splits = datasets.sst_task(splits, args.task)
    metric = task_metric(args.task, getattr(args, "keep_best", None))
    log(f"{name}: task {args.task} ({datasets.SST_TASKS[args.task]} classes), "
        f"{len(splits.train)} / {len(splits.dev)} / {len(splits.test)} train / dev / test "
        f"trees, vocabulary {len(splits.vocab)}")
    runs, histories = [], {}
    train = splits.train[:args.train_trees] if getattr(args, "train_trees", None) \
        else splits.train
    for seed in range(args.seed, args.seed + args.seeds):
        started = time.perf_counter()
        backend.seed(seed)
        model = make_model(datasets.SST_TASKS[args.task])
        if args.word_vectors:
            load_vectors_into(model, splits.vocab, args.word_vectors, log)
        optimizer = make_optimizer(args, model)
        on_epoch_start = _epoch_start(args, optimizer)
        before_step = None
        if getattr(args, "embed_l2_rows", "all") == "batch" and args.embed_l2:
            before_step = ActiveRowsL2(model.embedding.weight, args.embed_l2)
        history = fit(model, optimizer, train, splits.dev, epochs=args.epochs,
                      batch_size=args.batch_size, seed=seed, clip=args.clip or None,
                      unit="tree", progress=args.progress, log=log, keep_best=metric,
                      loss_per=LOSS_PER[getattr(args, "loss_per", "target")],
                      on_epoch_start=on_epoch_start,
                      before_step=before_step)
        epoch = best_epoch(history, metric)
        dev = history[epoch - 1][1] if epoch else model.evaluate(
            prepare_all(model, splits.dev, 256))
        test = model.evaluate(prepare_all(model, splits.test, 256))
        seconds = time.perf_counter() - started
        runs.append({"seed": seed, "best_epoch": epoch, "dev": dev, "test": test,
                     "seconds": seconds, "trees_per_second": throughput(history)})
        histories[f"seed {seed}"] = history
        if args.seeds > 1:  # one seed: the summary below is its line
            log(f"{name} seed {seed}: best dev {metric} epoch {epoch} of {len(history)}: dev "
                f"{format_metrics(dev)}; test {format_metrics(test)}  ({seconds:.0f} s, "
                f"{throughput(history):.0f} trees/s)")
    summary = {key: mean_and_std([run["test"][key] for run in runs]) for key in runs[0]["test"]}
    scope = "accuracy over every phrase" if metric == "phrase" else "root accuracy"
    chance = chance_level(splits.test, metric, datasets.SST_TASKS.get(args.task, 5))
    log(f"{name}: {args.task} task, test {scope} {metric} "
        f"{100 * summary[metric][0]:.1f} ± {100 * summary[metric][1]:.1f} % over "
        f"{len(runs)} seed(s) (phrases {100 * summary['phrase'][0]:.1f} ± "
        f"{100 * summary['phrase'][1]:.1f} %), best dev {metric} epoch of each: "
        f"{[run['best_epoch'] for run in runs]}, "
        f"{sum(run['seconds'] for run in runs):.0f} s in all, "
        f"{np.mean([run['trees_per_second'] for run in runs]):.0f} trees/s"
        + (f"; chance {100 * chance:.1f} %" if chance is not None else ""))
    if args.plot:
        plot_history(histories, args.plot, metric, title=f"{name}, SST {args.task}", log=log)
    return {"runs": runs, "test": summary, "metric": metric}
