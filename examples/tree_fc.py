"""Train Tree-FC, the benchmark model of Cavs §5 (Looks et al. 2017): one fully connected
layer as the vertex function, over complete binary trees with 256 leaves (511 vertices).

    python examples/tree_fc.py
    python examples/tree_fc.py --leaves 1024 --hidden 256 --batch-size 64

Every tree has the same shape, so a batch of trees has exactly log2(leaves) + 1 levels and
each level is one large batching task: the favourable case for batching, and the model the
Cavs paper uses to compare graph-construction costs. The data is synthetic
(minicavs.models.tree_fc_dataset): each tree's class tilts its leaves' word distribution, so
the root must pool evidence from all leaves. The weights of the epoch best on a dev set are
kept; the last line gives the root accuracy on a separate test set against chance (the most
frequent class) and the throughput in trees (and vertices) per second.
"""

import argparse

import minicavs as mc
from minicavs import training, validate
from minicavs.models import TreeFC, tree_fc_dataset


def _power_of_two(text):
    leaves = validate.count(minimum=1)(text)
    if leaves & (leaves - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two, got {leaves}")
    return leaves


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=2, batch_size=32, lr=0.002,
                                  data_help="unused: Tree-FC trains on generated trees")
    parser.add_argument("--leaves", type=_power_of_two, default=256,
                        help="leaves per tree, a power of two (default 256, as in Cavs)")
    parser.add_argument("--hidden", type=validate.count(minimum=1), default=64,
                        help="state and embedding size")
    parser.add_argument("--vocab-size", type=validate.count(minimum=1), default=100,
                        help="distinct leaf words")
    parser.add_argument("--num-classes", type=validate.count(minimum=2), default=2,
                        help="classes of trees")
    parser.add_argument("--activation", choices=["tanh", "relu"], default="tanh",
                        help="nonlinearity of the cell (default tanh)")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=2000,
                        help="training trees (dev and test: 1/10 of that each)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    if args.data:
        comm.log("tree_fc: --data is ignored, Tree-FC trains on generated trees")
    make = dict(num_leaves=args.leaves, vocab_size=args.vocab_size,
                num_classes=args.num_classes)
    train = tree_fc_dataset(args.train_size, rng=[args.seed, 0], **make)
    dev = tree_fc_dataset(max(args.train_size // 10, 1), rng=[args.seed, 1], **make)
    test = tree_fc_dataset(max(args.train_size // 10, 1), rng=[args.seed, 2], **make)

    model = TreeFC(args.vocab_size, args.hidden, args.hidden, args.num_classes,
                   dtype=args.dtype, activation=args.activation)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, train, dev, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, unit="tree",
                           progress=args.progress, comm=comm, keep_best="fine")

    result = model.evaluate(training.prepare_all(model, test, 256))
    rate = training.throughput(history)
    best = training.best_epoch(history, "fine")
    chance = training.chance_level(test, "fine", args.num_classes)
    comm.log(f"tree_fc: held-out loss {result['loss']:.4f}  root accuracy {result['fine']:.3f} "
             f"on {len(test)} test trees (chance {chance:.3f}; weights of epoch {best} of "
             f"{len(history)}, best on dev)  "
             f"{rate:.0f} trees/s ({rate * (2 * args.leaves - 1):.0f} vertices/s)")
    return {"held_out": result, "chance": chance, "best_epoch": best, "trees_per_second": rate}


if __name__ == "__main__":
    training.command_line(main)
