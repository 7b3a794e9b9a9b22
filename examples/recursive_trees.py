"""Tree sentiment models written recursively with mc.recursive: TreeRNN, RNTN, Tree-LSTM.

    python examples/recursive_trees.py --model rntn                 # synthetic treebank
    python examples/recursive_trees.py --model treelstm --data /path/to/sst --train-trees 2000
    python examples/recursive_trees.py --model rntn --hidden 32 --lr 0.001 --clip 5 --data ...

The defaults depend on the model (:data:`DEFAULTS`): the TreeRNN and the Tree-LSTM train with
Adam at 0.005, the RNTN at 0.001 with the gradient clipped to norm 5 — at 0.005 its slices V
grow past the scale where tanh saturates and it stays near chance (35.5 % fine on the synthetic
test roots, chance 29.1 %; on SST it collapsed to the neutral class), and at 0.001 without
clipping it trained for five epochs and then diverged. Measured with the defaults (synthetic
treebank, seed 0, test root accuracy fine, chance 29.1 %): TreeRNN 85.0 % (8 epochs), RNTN
57.3 % (5 epochs; its dev accuracy still rising), Tree-LSTM 97.5 % (3 epochs).

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


# What each model trains with unless --epochs, --lr, --clip say otherwise (see above).
DEFAULTS = {"treernn": {"epochs": 8, "lr": 0.005, "clip": 0.0},
            "rntn": {"epochs": 5, "lr": 0.001, "clip": 5.0},
            "treelstm": {"epochs": 3, "lr": 0.005, "clip": 0.0}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=32, lr=0.005,
                                  data_help="SST directory (train.txt, dev.txt, test.txt); "
                                            "default: the synthetic treebank")
    training.add_model_arguments(parser, embed_dim=64, hidden=64, clip=0.0)
    by_model = {name: ", ".join(f"{m} {d[name]:g}" for m, d in DEFAULTS.items())
                for name in ("epochs", "lr", "clip")}
    by_model["clip"] += "; 0 when --lr is given"
    for action in parser._actions:  # the defaults depend on --model: None until it is known
        if action.dest in by_model:
            action.default = None
            action.help = action.help.split(" (default")[0] + f" (default by model: " \
                f"{by_model[action.dest]})"
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
    args = parser.parse_args(argv)
    recipe = DEFAULTS[args.model]
    if args.clip is None:  # the clipping goes with the default rate; a given --lr: none, as before
        args.clip = recipe["clip"] if args.lr is None else 0.0
    for name in ("epochs", "lr"):
        if getattr(args, name) is None:
            setattr(args, name, recipe[name])
    return args


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
