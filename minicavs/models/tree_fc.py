"""Tree-FC: the benchmark model of Looks et al. (2017) used in Cavs §5 — one fully connected
layer as the vertex function, over complete binary trees with 256 leaves (511 vertices).

Its point is speed on large input graphs; to make the accuracy mean something too, the
synthetic trees here carry a learnable label (see :func:`tree_fc_dataset`).
"""

import numpy as np

from .. import data as datasets
from .. import ops
from ..errors import ArgumentError
from ..vertex import VertexFunction
from .common import bias, runner, weight
from .tree_lstm import TreeClassifier

_ACTIVATIONS = {"relu": ops.relu, "tanh": ops.tanh}


class TreeFC(TreeClassifier):
    """h = act(x W_x + [h_l, h_r] W + b) at every vertex; the root's h is classified.

    A leaf has x = the embedding of its word and no children (the gathers are zero); an
    internal vertex has no word (x = 0) and two children. The cell pushes nothing: F returns
    the states, and only the roots' rows go through the classifier, outside F.
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=2, dtype="float32",
                 activation="tanh"):
        super().__init__(num_classes, leaf_loss=False)
        if activation not in _ACTIVATIONS:
            raise ArgumentError(f"TreeFC: activation must be one of {sorted(_ACTIVATIONS)}, "
                                f"got {activation!r}")
        E, H = self._embedding(vocab_size, embed_dim, hidden, dtype)
        self.W_x = weight((E, H), dtype, "W_x")
        self.W = weight((2 * H, H), dtype, "W")
        self.b = bias(H, dtype, "b")
        self._classifier(H, dtype)
        table, W_x, W, b, act = self.embedding.weight, self.W_x, self.W, self.b, \
            _ACTIVATIONS[activation]

        def tree_fc(v):
            x = ops.reshape(ops.embedding(table, v.pull()), (E,))
            v.scatter(act(x @ W_x + ops.concat([v.gather(0), v.gather(1)]) @ W + b))

        self.F = VertexFunction(tree_fc, pull_shape=(1,), pull_dtype="int64",
                                scatter_shape=(H,), arity=2, dtype=dtype)

    sentiment = False  # a root label of its own task: root accuracy is "fine", as for any

    def states(self, batch, run=None):
        return runner(run)(self.F, batch.graphs, batch.words)  # F scatters what is classified


def tree_fc_dataset(num_trees, num_leaves=256, vocab_size=1000, num_classes=2, signal=0.15,
                    rng=None):
    """Complete binary trees with random leaf words and a label at the root only.

    The words are split into ``num_classes`` groups (id mod num_classes). Each tree draws a
    class; each leaf is, with probability ``signal``, a word of that class's group, otherwise
    any word. The label is the drawn class: a model must pool evidence over all 256 leaves,
    through every level of the tree, to find it.
    """
    rng = np.random.default_rng(rng)
    trees = []
    for _ in range(num_trees):
        tree = datasets.complete_binary_tree(num_leaves, rng, vocab_size=vocab_size)
        label = int(rng.integers(num_classes))
        leaves = tree.leaves()
        biased = rng.random(len(leaves)) < signal
        group = rng.integers(0, vocab_size // num_classes, size=len(leaves)) * num_classes + label
        tree.words[leaves] = np.where(biased, group, tree.words[leaves])
        tree.labels[:] = -1
        tree.labels[-1] = label
        trees.append(tree)
    return trees
