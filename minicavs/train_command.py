"""``minicavs train tree-lstm``: the main job. Train a Tree-LSTM sentiment classifier on the
embedded synthetic treebank (or SST with ``--data``), evaluate it on held-out trees, save a
checkpoint.

The defaults: 8,544 / 1,101 / 2,210 synthetic trees (SST's split sizes), 4 epochs, batch 32,
embedding and hidden size 64, Adam; what they reach is stated in :data:`DESCRIPTION` (the
``--help`` text) and the README, measured. Under ``mpiexec -n N`` it trains data-parallel
(``--distributed``); rank 0 evaluates, prints and writes the checkpoint.
"""

import argparse
import hashlib
import os
import time

import numpy as np

from . import data as datasets, validate
from .errors import CheckpointError, MinicavsError
from .models import ChildSumTreeLSTMClassifier, TreeLSTMClassifier
from .nn import Adam, load_checkpoint, save_checkpoint
from .training import (add_common_arguments, add_model_arguments, chance_level,
                       check_something_to_train, command_line_hint, fit, format_metrics,
                       prepare_all, setup, throughput)

DEFAULT_LR = 0.005
MODELS = {"tree-lstm": TreeLSTMClassifier, "child-sum-tree-lstm": ChildSumTreeLSTMClassifier}

DESCRIPTION = """\
Train a tree-structured sentiment classifier and report its root accuracy on held-out trees.

Data: by default the embedded synthetic sentiment treebank (minicavs.data.make_splits: labels
0..4 at every vertex, an exact function of the tree, so a model must read the structure);
with --data DIR, the Stanford Sentiment Treebank's train.txt, dev.txt and test.txt.

Each epoch ends with the dev root accuracy (fine-grained: 5 classes; binary: positive vs
negative, neutral sentences dropped) and a checkpoint (--save, written atomically: an
interrupted run keeps the last complete epoch). The run ends with the test accuracy and
one summary line.

Under mpiexec -n N (--distributed, implied there) every rank trains on its share of each
step: --batch-size is per rank, and N ranks with batch B take the very steps of one process
with batch N*B (same seed, same order). Rank 0 evaluates, prints and writes the checkpoint.

With the defaults the Tree-LSTM reaches 99.7% fine-grained and 100% binary root accuracy on
the 2,210 synthetic test trees (seed 0; seeds 1 and 2: 100% and 100%). Measured on a 2-core
AMD EPYC (AVX2): 12 s at load average 0.6 (3,625 training trees/s), 16 s on the first run
(which compiles the native loops into the cache); 26 s and 39 s with the machine busy (load
4.8). The last line gives this run's time and training trees/s. On SST (--data) it
overfits after 2-4 epochs without pretrained embeddings: 43-47% fine-grained. The papers'
protocols and settings are options of examples/tree_lstm.py; docs/results.md has what they
reach.
"""


def configure(parser):
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the paragraphs
    parser.add_argument("model", choices=sorted(MODELS),
                        help="tree-lstm: the binary Tree-LSTM (Cavs §5, DyNet treenn); "
                             "child-sum-tree-lstm: the child-sum Tree-LSTM (any arity)")
    add_common_arguments(parser, epochs=4, batch_size=32, lr=DEFAULT_LR,
                         data_help="SST directory with train.txt, dev.txt and test.txt "
                                   "(default: the embedded synthetic treebank)")
    add_model_arguments(parser)
    parser.add_argument("--leaf-loss", action="store_true",
                        help="also train on the leaves' labels (default: internal vertices)")
    parser.add_argument("--sizes", type=_sizes, default=(8544, 1101, 2210),
                        metavar="TRAIN,DEV,TEST",
                        help="synthetic treebank split sizes (default 8544,1101,2210, SST's)")
    parser.add_argument("--save", metavar="PATH", default=None,
                        help="checkpoint written after every epoch (default runs/MODEL.npz; "
                             "'' to save nothing)")
    parser.add_argument("--resume", metavar="PATH", default=None,
                        help="continue from this checkpoint (weights, optimiser state and "
                             "epoch count) up to --epochs in total; the model options and "
                             "the data must match the checkpoint's. Its learning rate goes "
                             "on unless --lr is given")
    parser.set_defaults(lr=None)  # None: not given (a resumed run keeps the checkpoint's)


def _sizes(text):
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected three positive sizes TRAIN,DEV,TEST, "
                                         f"got {text!r}")
    return sizes


def data_fingerprint(splits):
    """SHA-256 digests of the vocabulary (its tokens in id order) and of the training trees
    (structure, words, labels): recorded in the checkpoint, so a resumed run on other data —
    even of the same vocabulary size — is refused instead of training on silently."""
    vocabulary = hashlib.sha256("\n".join(splits.vocab.tokens).encode("utf-8"))
    train = hashlib.sha256()
    for tree in splits.train:
        train.update(repr(tree.children).encode())
        train.update(np.ascontiguousarray(tree.words, dtype=np.int64).tobytes())
        train.update(np.ascontiguousarray(tree.labels, dtype=np.int64).tobytes())
    return {"vocabulary": vocabulary.hexdigest(), "train": train.hexdigest(),
            "train_trees": len(splits.train)}


def check_same_data(saved, current):
    """A :class:`CheckpointError` unless the checkpoint's data fingerprint is ``current``'s
    (a checkpoint written before fingerprints were recorded is not checked)."""
    theirs, mine = saved.get("data_fingerprint"), current["data_fingerprint"]
    if theirs is None:
        return
    if theirs["vocabulary"] != mine["vocabulary"]:
        raise CheckpointError(f"the checkpoint was trained with another vocabulary (of "
                              f"{saved.get('vocab_size')} words, data {saved.get('data')!r}; "
                              f"this run has {current['vocab_size']}, data "
                              f"{current['data']!r}): its embeddings would mean other words. "
                              f"Resume with the checkpoint's data, or start a new run")
    if theirs["train"] != mine["train"]:
        raise CheckpointError(f"the checkpoint was trained on other training data "
                              f"({theirs['train_trees']} trees, data {saved.get('data')!r}, "
                              f"seed {saved.get('seed')}; this run has {mine['train_trees']}, "
                              f"data {current['data']!r}, seed {current['seed']}) with the same "
                              f"vocabulary. Resume with the checkpoint's data (--data, --sizes, "
                              f"--seed), or start a new run")


def interrupted_note(save, epoch):
    """What an interrupted run leaves: the last complete epoch's checkpoint, or nothing."""
    if not save:
        return "nothing was saved (--save '')"
    if epoch is None:
        return f"no epoch had finished, so nothing was saved to {save}"
    return (f"the checkpoint of epoch {epoch} is safe at {save} (written atomically); "
            f"continue with --resume {save}")


def load_treebank(args):
    """TreebankSplits from ``--data`` (SST) or the synthetic treebank, and a description."""
    if args.data:
        return datasets.load_sst(args.data), f"SST from {args.data}"
    return datasets.make_splits(seed=args.seed, sizes=args.sizes), "the synthetic treebank"


def run(args):
    started = time.perf_counter()
    save = f"runs/{args.model}.npz" if args.save is None else args.save
    try:
        if save:  # before any data is read: a run must not train, then fail to save
            validate.writable_file(save, "--save")
        if args.resume and not os.path.isfile(args.resume):
            raise CheckpointError(f"--resume: no checkpoint at {args.resume!r}")
        comm = setup(args)
    except (MinicavsError, OSError) as exc:
        print(f"minicavs train: {command_line_hint(exc)}")
        return 1
    try:
        splits, source = load_treebank(args)
    except (MinicavsError, OSError) as exc:
        return comm.fail(f"minicavs train: {exc}")
    model = MODELS[args.model](len(splits.vocab), args.embed_dim, args.hidden, 5,
                               dtype=args.dtype, leaf_loss=args.leaf_loss)
    try:
        check_something_to_train(model, splits.train)
    except MinicavsError as exc:
        return comm.fail(f"minicavs train: {args.data}: {exc}")
    optimizer = Adam(model.parameters(), lr=DEFAULT_LR if args.lr is None else args.lr)
    hyperparameters = {"model": args.model, "vocab_size": len(splits.vocab),
                       "embed_dim": args.embed_dim, "hidden": args.hidden,
                       "dtype": args.dtype, "leaf_loss": args.leaf_loss, "lr": optimizer.lr,
                       "batch_size": args.batch_size, "ranks": comm.size, "seed": args.seed,
                       "data": args.data or "synthetic",
                       "data_fingerprint": data_fingerprint(splits)}
    start_epoch = 0
    if args.resume:
        # Rank 0 reads the checkpoint; fit() gives its weights and optimiser state to the rest.
        saved = None
        if comm.is_root:
            try:
                saved = load_checkpoint(args.resume, model, optimizer)
                check_same_data(saved["hyperparameters"] or {}, hyperparameters)
            except MinicavsError as exc:
                return comm.fail(f"minicavs train: --resume: {exc}")
            if args.lr is not None and args.lr != optimizer.lr:
                comm.log(f"learning rate {args.lr:g} (--lr), where the checkpoint trained "
                         f"with {optimizer.lr:g}")
                optimizer.lr = args.lr  # after the load, which restored the checkpoint's
            hyperparameters["lr"] = optimizer.lr  # what this run trains with, recorded
        start_epoch = int((comm.broadcast_object(saved)["extra"] or {}).get("epoch", 0))
        comm.log(f"resumed from {args.resume} after epoch {start_epoch}")

    saved_epoch = [start_epoch if args.resume else None]  # the epoch the checkpoint holds

    def checkpoint(epoch, stats, metrics):
        if save and comm.is_root:  # the ranks hold the same weights: one file, one writer
            os.makedirs(os.path.dirname(os.path.abspath(save)), exist_ok=True)
            save_checkpoint(save, model, optimizer, hyperparameters,
                            extra={"epoch": epoch, "train_loss": stats.loss, "dev": metrics})
            saved_epoch[0] = epoch

    comm.log(f"{args.model}: {len(splits.train)} / {len(splits.dev)} / {len(splits.test)} "
             f"train / dev / test trees from {source}, vocabulary {len(splits.vocab)}, "
             f"{sum(p.size for p in model.parameters())} parameters, device {args.device}")
    try:
        history = fit(model, optimizer, splits.train, splits.dev, epochs=args.epochs,
                      batch_size=args.batch_size, seed=args.seed, progress=args.progress,
                      unit="tree", start_epoch=start_epoch, on_epoch_end=checkpoint, comm=comm)
    except KeyboardInterrupt:  # one line, not a traceback: say what is safe on disk
        if comm.is_root:
            print(f"\nminicavs train: interrupted; {interrupted_note(save, saved_epoch[0])}",
                  flush=True)
        return 130
    if comm.is_root:
        test = model.evaluate(prepare_all(model, splits.test, 256))
        comm.log(f"test  {format_metrics(test)}")
        rate = f"{throughput(history):.0f} trees/s" if history else "no training"
        ranks = f" on {comm.size} ranks" if comm.size > 1 else ""
        saved_to = f", checkpoint {save}" if save and history else ""
        chance = (chance_level(splits.test, "fine"), chance_level(splits.test, "binary"))
        against = (f" (chance {chance[0]:.3f}, {chance[1]:.3f})" if None not in chance else "")
        comm.log(f"{args.model}: test root accuracy fine {test['fine']:.3f} binary "
                 f"{test['binary']:.3f}{against} after {max(args.epochs, start_epoch)} epochs, "
                 f"{rate}{ranks}, {time.perf_counter() - started:.1f} s{saved_to}")
    return 0
