"""Plain per-sample models, batched automatically with mc.autobatch (docs/autobatch.md).

    python examples/autobatch.py --task tagger                  # POS tagger, shared tags data
    python examples/autobatch.py --task tagger-char --strategy depth+
    python examples/autobatch.py --task treelstm --data /path/to/sst
    python examples/autobatch.py --task tagger --data /path/to/tags --strategy none

The model code (minicavs.models.plain) is written one sentence or tree at a time, the way the
DyNet benchmark suite writes it: a Python loop over words, a recursive function over a tree.
Each mini-batch runs inside ``with mc.autobatch(strategy):``, which records the ops of all its
samples and runs them batched — forward and backward. The last line reports the held-out
accuracy (tagging accuracy per word; root accuracy for the Tree-LSTM) and the throughput;
``--explain`` prints what the autobatcher did with the last training batch.
"""

import argparse
import pathlib
import time

import numpy as np

import minicavs as mc
from minicavs import data, training, validate
from minicavs.autobatch import STRATEGIES
from minicavs.models.plain import BiLSTMTagger, PlainTreeLSTM, read_tagged

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=1, batch_size=64, lr=0.001,
                                  data_help="tags directory (dev.txt, test.txt) or SST "
                                            "directory; default: ../shared/data/...")
    parser.add_argument("--task", choices=["tagger", "tagger-char", "treelstm"],
                        default="tagger")
    parser.add_argument("--strategy", choices=STRATEGIES, default="agenda+")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=2000,
                        help="training sentences or trees")
    parser.add_argument("--test-size", type=validate.count(minimum=1), default=500)
    parser.add_argument("--hidden", type=validate.count(minimum=1), default=256)
    parser.add_argument("--embed-dim", type=validate.count(minimum=2), default=None,
                        help="default 128 (tagger), 256 (Tree-LSTM)")
    parser.add_argument("--explain", action="store_true")
    return parser.parse_args(argv)


def load(args):
    if args.task == "treelstm":
        splits = data.load_sst(args.data or SHARED / "sst")
        return splits.train[:args.train_size], splits.test[:args.test_size], splits.vocab
    folder = pathlib.Path(args.data or SHARED / "tags")
    # The shared data's training part is dev.txt; test.txt is held out (see its README).
    train = read_tagged(folder / "dev.txt", limit=args.train_size)
    test = read_tagged(folder / "test.txt", limit=args.test_size)
    return train, test, None


def make_model(args, train, vocab):
    dtype = np.dtype(args.dtype)
    if args.task == "treelstm":
        embed = args.embed_dim or 256
        return PlainTreeLSTM(len(vocab), embed=embed, hidden=args.hidden, seed=args.seed,
                             dtype=dtype)
    words = [w for s in train for w, _ in s]
    tags = [t for s in train for _, t in s]
    return BiLSTMTagger(words, tags, embed=args.embed_dim or 128, hidden=args.hidden,
                        char_lstm=args.task == "tagger-char", seed=args.seed, dtype=dtype)


def accuracy(model, task, samples, batch_size):
    """Per-word tagging accuracy, or root accuracy; predictions batched like training."""
    right = total = 0
    for lo in range(0, len(samples), batch_size):
        chunk = samples[lo:lo + batch_size]
        with mc.no_grad(), mc.autobatch("agenda"):
            if task == "treelstm":
                scores = [[model.scores(t)] for t in chunk]
                gold = [[int(t.labels[-1])] for t in chunk]
            else:
                scores = [model.scores([w for w, _ in s]) for s in chunk]
                gold = [[model.tag_ids.get(t, -1) for _, t in s] for s in chunk]
        for s, g in zip(scores, gold):
            predicted = np.array([int(np.argmax(x.numpy())) for x in s])
            right += int((predicted == np.array(g)).sum())
            total += len(g)
    return right / max(total, 1)


def main(argv=None):
    args = parse_args(argv)
    training.setup(args)
    train, test, vocab = load(args)
    model = make_model(args, train, vocab)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    unit = "trees" if args.task == "treelstm" else "sentences"
    seconds, seen, ab, loss_sum = 0.0, 0, None, 0.0
    for epoch in range(args.epochs):
        order = rng.permutation(len(train))
        for lo in range(0, len(train), args.batch_size):
            batch = [train[i] for i in order[lo:lo + args.batch_size]]
            began = time.perf_counter()
            optimizer.zero_grad()
            with mc.autobatch(args.strategy) as ab:
                loss = mc.add_n([model.loss(s) for s in batch])
                loss.backward()
            optimizer.step()
            seconds += time.perf_counter() - began
            seen += len(batch)
            loss_sum += float(loss)
            if args.progress:
                print(f"epoch {epoch} {seen} {unit}: loss {float(loss) / len(batch):.4f}",
                      flush=True)
    if args.explain and ab is not None:
        print(ab.explain(picture=False))
    acc = accuracy(model, args.task, test, args.batch_size)
    rate = seen / seconds if seconds else 0.0
    what = "root accuracy" if args.task == "treelstm" else "tagging accuracy"
    print(f"{args.task} ({args.strategy}): held-out {what} {acc:.4f} on {len(test)} {unit}, "
          f"{rate:.1f} {unit}/s training")
    return {"accuracy": acc, "per_second": rate, "train_loss": loss_sum / max(seen, 1)}


if __name__ == "__main__":
    training.command_line(main)
