"""Train the binary Tree-LSTM sentiment classifier (Cavs §5; DyNet's treenn benchmark).

    python examples/tree_lstm.py                       # synthetic treebank, ~15 s
    python examples/tree_lstm.py --data /path/to/sst   # SST: train.txt, dev.txt, test.txt

The model (minicavs.models.TreeLSTMClassifier) is one vertex function F: a vertex pulls its
word id, gathers its two children's [h, c], scatters its own [h, c] and pushes class logits.
Every batch of trees runs F level by level; the loss is the cross-entropy at every labelled
internal vertex. The last line gives the root accuracy on held-out trees (fine-grained: 5
classes; binary: positive vs negative, neutral roots dropped) and the training throughput.
"""

import argparse

import minicavs as mc
from minicavs import data, training, validate
from minicavs.models import TreeLSTMClassifier


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=32, lr=0.005,
                                  data_help="SST directory (train.txt, dev.txt, test.txt); "
                                            "default: the synthetic treebank")
    training.add_model_arguments(parser, embed_dim=64, hidden=64)
    parser.add_argument("--leaf-loss", action="store_true", help="train on leaf labels too")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=4000,
                        help="synthetic training trees (dev and test: 1/4 of that each)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    if args.data:
        splits = data.load_sst(args.data)
    else:
        held_out = max(args.train_size // 4, 1)
        splits = data.make_splits(seed=args.seed, sizes=(args.train_size, held_out, held_out))

    model = TreeLSTMClassifier(len(splits.vocab), args.embed_dim, args.hidden, num_classes=5,
                               dtype=args.dtype, leaf_loss=args.leaf_loss)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, splits.train, splits.dev, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, unit="tree",
                           progress=args.progress, comm=comm)

    return training.report_root_accuracy("tree_lstm", model, splits, history, comm)


if __name__ == "__main__":
    training.command_line(main)
