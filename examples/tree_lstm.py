"""Train the binary Tree-LSTM sentiment classifier (Cavs §5; DyNet's treenn benchmark).

    python examples/tree_lstm.py                       # synthetic treebank, ~15 s
    python examples/tree_lstm.py --data /path/to/sst   # SST: train.txt, dev.txt, test.txt

The model (minicavs.models.TreeLSTMClassifier) is one vertex function F: a vertex pulls its
word id, gathers its two children's [h, c], scatters its own [h, c] and pushes class logits.
Every batch of trees runs F level by level; the loss is the cross-entropy at every labelled
internal vertex (and leaf, with --leaf-loss: the papers train on every phrase).

--task picks the papers' protocol (fine: 5 classes; binary: neutral sentences dropped, a
2-class model; binary3: the same sentences, a 3-class model trained on every phrase as in
Tai et al.'s code), and the options of the last group give their settings (Tai et al. 2015:
AdaGrad, lr 0.05, embeddings lr 0.1, L2 1e-4, batch 25, dropout 0.5). Each run keeps its best
epoch on dev; the last line gives the test root accuracy, mean ± std over --seeds. The README's
results table has the exact commands and what they reach on SST.
"""

import argparse

from minicavs import training, validate
from minicavs.models import TreeLSTMClassifier


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=32, lr=0.005,
                                  data_help="SST directory (train.txt, dev.txt, test.txt); "
                                            "default: the synthetic treebank")
    training.add_model_arguments(parser, embed_dim=64, hidden=64, clip=0.0)
    parser.add_argument("--leaf-loss", action="store_true", help="train on leaf labels too")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=4000,
                        help="synthetic training trees (dev and test: 1/4 of that each)")
    training.add_sst_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    training.setup(args)
    splits = training.sentiment_splits(args)

    def make_model(num_classes):
        return TreeLSTMClassifier(len(splits.vocab), args.embed_dim, args.hidden, num_classes,
                                  dtype=args.dtype, leaf_loss=args.leaf_loss,
                                  dropout=args.dropout, embed_dropout=args.embed_dropout,
                                  word_dropout=args.word_dropout)

    return training.sentiment_experiment("tree_lstm", args, splits, make_model)


if __name__ == "__main__":
    training.command_line(main)
