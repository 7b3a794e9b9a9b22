"""Train the child-sum Tree-LSTM sentiment classifier (Tai et al. 2015, §3.1).

    python examples/child_sum_tree_lstm.py                      # synthetic treebank
    python examples/child_sum_tree_lstm.py --data /path/to/sst  # SST
    python examples/child_sum_tree_lstm.py --nary               # random n-ary trees

Unlike the binary Tree-LSTM, the child-sum cell takes any number of children: it sums their
h with ``v.gather_sum`` and gives each child its own forget gate, f_k = σ(W_f x + U_f h_k + b_f),
computed per edge and summed into the parent (minicavs.models.ChildSumTreeLSTMClassifier).
With ``--nary`` the synthetic sentences' words are regrouped under random trees of up to 4
children per vertex, labelled at the root only (the label is the sentence's), to exercise
arities above two — accuracy there is bounded, since the structure no longer means anything.

With the defaults (synthetic treebank, 5 epochs, seed 0) it reaches 93.5 % fine-grained root
accuracy on the held-out test trees against 29.1 % for the most frequent label (78.9 % after
the 3 epochs it used to default to, still climbing).
"""

import argparse

import numpy as np

import minicavs as mc
from minicavs import data, training, validate
from minicavs.models import ChildSumTreeLSTMClassifier


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=5, batch_size=32, lr=0.005,
                                  data_help="SST directory (train.txt, dev.txt, test.txt); "
                                            "default: the synthetic treebank")
    training.add_model_arguments(parser, embed_dim=64, hidden=64)
    parser.add_argument("--leaf-loss", action="store_true", help="train on leaf labels too")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=4000,
                        help="synthetic training trees (dev and test: 1/4 of that each)")
    parser.add_argument("--nary", action="store_true",
                        help="regroup the synthetic sentences under random trees of arity "
                             "up to 4")
    return parser.parse_args(argv)


def regroup_nary(tree, rng, max_arity=4):
    """The tree's words, in order, as the leaves of a random tree of arity <= max_arity."""
    words = tree.words[tree.leaves()]
    children = [[] for _ in words]
    frontier = list(range(len(words)))
    while len(frontier) > 1:  # merge a random run of 2..max_arity neighbouring subtrees
        k = int(rng.integers(2, min(max_arity, len(frontier)) + 1))
        i = int(rng.integers(len(frontier) - k + 1))
        children.append(frontier[i:i + k])
        frontier[i:i + k] = [len(children) - 1]
    ids = np.concatenate([words, np.full(len(children) - len(words), -1)])
    labels = np.full(len(children), -1)
    labels[-1] = tree.labels[-1]
    return data.Tree(children, ids, labels)


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    if args.data:
        splits = data.load_sst(args.data)
    else:
        held_out = max(args.train_size // 4, 1)
        splits = data.make_splits(seed=args.seed, sizes=(args.train_size, held_out, held_out))
        if args.nary:
            rng = np.random.default_rng(args.seed)
            splits = splits._replace(**{name: [regroup_nary(t, rng) for t in getattr(splits, name)]
                                        for name in ("train", "dev", "test")})

    model = ChildSumTreeLSTMClassifier(len(splits.vocab), args.embed_dim, args.hidden,
                                       num_classes=5, dtype=args.dtype,
                                       leaf_loss=args.leaf_loss)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, splits.train, splits.dev, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, unit="tree",
                           progress=args.progress, comm=comm)

    return training.report_root_accuracy("child_sum_tree_lstm", model, splits, history, comm)


if __name__ == "__main__":
    training.command_line(main)
