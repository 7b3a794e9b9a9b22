"""Tree sentiment models written recursively with mc.recursive: TreeRNN, RNTN, Tree-LSTM.

    python examples/recursive_trees.py --model rntn                 # synthetic treebank
    python examples/recursive_trees.py --model treelstm --data /path/to/sst --train-trees 2000
    python examples/recursive_trees.py --model rntn --hidden 32 --lr 0.001 --clip 5 --data ...

(The RNTN wants the smaller learning rate and clipping: with Adam at 0.005 its slices V grew
past the scale where tanh saturates and its SST root accuracy collapsed to the neutral class;
at 0.001 without clipping it trained for five epochs and then diverged.)

Each model (minicavs.models.recursive_trees) is one function of a node: a leaf embeds its word,
an internal vertex calls the function on its two children and combines their states. The
runtime traces it once per kind of vertex (leaf, two children) and runs each kind on its own
rows.

--task picks the papers' protocol (fine: 5 classes; binary: neutral sentences dropped, a
2-class model; binary3: the same sentences, a 3-class model trained on every phrase as in
Tai et al.'s code), and the options of the last group give their settings (Socher et al. 2013:
AdaGrad, lr 0.01, word vectors of 25-35 dimensions, L2). Each run keeps its best epoch on dev;
the last line gives the test root accuracy, mean ± std over --seeds. The README's results
table has the exact commands and what they reach on SST.
"""

import argparse

from minicavs import training, validate
from minicavs.models import recursive_trees


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=32, lr=0.005,
                                  data_help="SST directory (train.txt, dev.txt, test.txt); "
                                            "default: the synthetic treebank")
    training.add_model_arguments(parser, embed_dim=64, hidden=64, clip=0.0)
    parser.add_argument("--model", choices=sorted(recursive_trees.MODELS), default="treernn",
                        help="treernn, rntn or treelstm (default treernn)")
    parser.add_argument("--init", choices=recursive_trees.INITS, default="xavier",
                        help="starting weights of the TreeRNN and the RNTN: xavier, or corenlp "
                             "(Socher et al.'s: W = [I; I] + noise, word vectors N(0, 0.1²); "
                             "default xavier)")
    parser.add_argument("--leaf-tanh", action="store_true",
                        help="TreeRNN and RNTN: a leaf's state is tanh of its word vector, as "
                             "in Stanford CoreNLP's SentimentModel (default: the vector itself)")
    parser.add_argument("--leaf-loss", action="store_true", help="train on leaf labels too")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=4000,
                        help="synthetic training trees (dev and test: 1/4 of that each)")
    parser.add_argument("--train-trees", type=validate.count(minimum=1), default=None,
                        help="train on the first N training trees only (default: all)")
    training.add_sst_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    training.setup(args)
    splits = training.sentiment_splits(args)

    def make_model(num_classes):
        return recursive_trees.make(args.model, len(splits.vocab), args.hidden, args.embed_dim,
                                    num_classes=num_classes, dtype=args.dtype,
                                    leaf_loss=args.leaf_loss, dropout=args.dropout,
                                    embed_dropout=args.embed_dropout,
                                    word_dropout=args.word_dropout, init=args.init,
                                    leaf_tanh=args.leaf_tanh)

    return training.sentiment_experiment(args.model, args, splits, make_model)


if __name__ == "__main__":
    training.command_line(main)
