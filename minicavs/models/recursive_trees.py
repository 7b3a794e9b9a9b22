"""Tree sentiment models written recursively (``mc.recursive``), as the recursion paper
evaluates them (Figs. 7–9): a leaf embeds its word, an internal vertex combines its children's
states, and the runtime runs each kind of vertex on its own rows (a leaf pays for no child).

* :class:`TreeRNNClassifier` — ``h = tanh(W [h_l; h_r] + b)``; a leaf's h is its word vector.
* :class:`RNTNClassifier` — Socher et al.'s recursive neural tensor network:
  ``h = tanh([h_l; h_r]ᵀ V [h_l; h_r] + W [h_l; h_r] + b)``, V a tensor of H slices of 2H × 2H.
* :class:`RecursiveTreeLSTMClassifier` — the binary Tree-LSTM of tree_lstm.py with a leaf cell
  that has no U products (a leaf has no children) and an internal cell with no W product (an
  internal vertex of a parse tree has no word).

``init="corenlp"`` starts the TreeRNN and the RNTN as Socher et al.'s code does (Stanford
CoreNLP's ``SentimentModel``, the Java port of their RNTN): each half of W is the identity
plus U(±1/(2√H)) noise, so a parent starts as tanh(h_l + h_r); word vectors N(0, 0.1²); the
classifier U(±1/√H) with its bias U(0, 1). The default, ``"xavier"``, is Xavier-uniform
weights, zero biases and U(±0.05) word vectors.

Every vertex pushes its state h; the classifier ``h W_out + b_out``, dropout, batching, loss
and evaluation are TreeClassifier's. ``loss(batch, run=evaluate_per_sample)`` runs the same
definition eagerly, tree by tree (the reference the tests compare with).
"""

import numpy as np

from .. import backend, ops
from ..errors import ArgumentError
from ..nn import init as initializers
from ..autodiff import Parameter
from ..vertex.recursive import recursive
from .common import bias, lstm_bias, weight
from .tree_lstm import TreeClassifier


INITS = ("xavier", "corenlp")


def _corenlp_init(model, H, C, dtype):
    """Socher et al.'s starting weights (module docstring) for ``model``'s embedding, W, b,
    W_out and b_out, drawn from minicavs' generator (``mc.seed``)."""
    rng, dtype = backend.rng(), np.dtype(dtype)
    noise = 1.0 / (2.0 * np.sqrt(H))
    halves = [np.eye(H) + rng.uniform(-noise, noise, (H, H)) for _ in range(2)]
    # x @ W with x = [h_l; h_r]: rows 0..H-1 act on h_l, rows H..2H-1 on h_r
    values = {"W": np.concatenate(halves, axis=0), "b": np.zeros(H),
              "W_out": rng.uniform(-1.0 / np.sqrt(H), 1.0 / np.sqrt(H), (H, C)),
              "b_out": rng.uniform(0.0, 1.0, C)}
    for name, value in values.items():
        getattr(model, name).data = backend.to_device(value.astype(dtype))
    table = model.embedding.weight
    table.data = backend.to_device(rng.normal(0.0, 0.1, table.shape).astype(dtype))


class _SocherTree(TreeClassifier):
    """What the TreeRNN and the RNTN share: parameters (``_tensor`` adds the RNTN's V between
    the embedding and W, so each draws what it always drew), ``init``, and F — a leaf's state is
    its word vector, or with ``leaf_tanh`` its tanh, as Stanford CoreNLP's
    ``SentimentCostAndGradient`` computes a preterminal's vector
    (``elementwiseApplyTanh(wordVector)``), so leaves lie in (-1, 1) like every parent; an
    internal vertex's is ``combine([h_l; h_r])``."""

    def __init__(self, vocab_size, hidden, num_classes, dtype, leaf_loss, dropout,
                 embed_dropout, word_dropout, init, leaf_tanh, name):
        if init not in INITS:
            raise ArgumentError(f"{type(self).__name__}: init must be one of {list(INITS)}, got "
                                f"{init!r}")
        super().__init__(num_classes, leaf_loss, dropout, embed_dropout, word_dropout)
        self.leaf_tanh = bool(leaf_tanh)
        _, H = self._embedding(vocab_size, hidden, hidden, dtype)
        self._tensor(H, dtype)
        self.W = weight((2 * H, H), dtype, "W")
        self.b = bias(H, dtype, "b")
        self._classifier(H, dtype)
        if init == "corenlp":  # (the RNTN's V is drawn the same way in both)
            _corenlp_init(self, H, self.num_classes, dtype)
        table, combine = self.embedding.weight, self.combine

        @recursive(scatter_shape=(H,), **self.pull_spec(H), push_shape=(H,), arity=2,
                   dtype=dtype, name=name)
        def cell(node):
            if node.is_leaf:
                h = self.word_vector(node, table, H)
                h = ops.tanh(h) if self.leaf_tanh else h
            else:
                h = combine(ops.concat([cell(child) for child in node.children]))
            node.push(h)
            return h

        self.F = cell

    def _tensor(self, H, dtype):
        pass


class TreeRNNClassifier(_SocherTree):
    """The plain recursive network over binary parse trees (word vectors of size ``hidden``).
    With ``leaf_tanh`` a leaf's state is tanh of its word vector (CoreNLP's), else the vector."""

    def __init__(self, vocab_size, hidden=64, num_classes=5, dtype="float32", leaf_loss=False,
                 dropout=0.0, embed_dropout=0.0, word_dropout=0.0, init="xavier",
                 leaf_tanh=False):
        super().__init__(vocab_size, hidden, num_classes, dtype, leaf_loss, dropout,
                         embed_dropout, word_dropout, init, leaf_tanh, "tree_rnn")

    def combine(self, x):  # x = [h_l; h_r]
        return ops.tanh(x @ self.W + self.b)


class RNTNClassifier(_SocherTree):
    """The recursive neural tensor network (Socher et al., 2013) over binary parse trees.
    ``leaf_tanh`` as in :class:`TreeRNNClassifier`."""

    def __init__(self, vocab_size, hidden=32, num_classes=5, dtype="float32", leaf_loss=False,
                 dropout=0.0, embed_dropout=0.0, word_dropout=0.0, init="xavier",
                 leaf_tanh=False):
        super().__init__(vocab_size, hidden, num_classes, dtype, leaf_loss, dropout,
                         embed_dropout, word_dropout, init, leaf_tanh, "rntn")

    def _tensor(self, H, dtype):
        # slice i of V is the 2H × 2H form of output unit i; small, as Socher et al. start it
        scale = 1.0 / (4 * H)
        self.V = Parameter(initializers.uniform((H, 2 * H, 2 * H), -scale, scale, dtype=dtype),
                           name="V")

    def combine(self, x):  # x = [h_l; h_r]
        H = self.hidden
        # xᵀ V_i x for every slice i: (x V as (H, 2H)) · x, one GEMM for all vertices
        v_flat = ops.reshape(ops.transpose(self.V, (1, 0, 2)), (2 * H, H * 2 * H))
        xv = ops.reshape(x @ v_flat, (H, 2 * H))
        return ops.tanh(ops.sum(xv * x, axis=-1) + x @ self.W + self.b)


class RecursiveTreeLSTMClassifier(TreeClassifier):
    """The binary Tree-LSTM, one cell per kind: leaves ``i, o, u = split(x W + b_leaf, 3)``,
    ``c = σ(i)⊙tanh(u)``; internal vertices ``i, f_l, f_r, o, u = split([h_l, h_r] U + b, 5)``,
    ``c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r``; both ``h = σ(o)⊙tanh(c)``."""

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=5, dtype="float32",
                 leaf_loss=False, dropout=0.0, embed_dropout=0.0, word_dropout=0.0):
        super().__init__(num_classes, leaf_loss, dropout, embed_dropout, word_dropout)
        E, H = self._embedding(vocab_size, embed_dim, hidden, dtype)
        self.W = weight((E, 3 * H), dtype, "W")
        self.b_leaf = bias(3 * H, dtype, "b_leaf")
        self.U = weight((2 * H, 5 * H), dtype, "U")
        self.b = lstm_bias(H, ["i", "f_l", "f_r", "o", "u"], dtype, "b")
        self._classifier(H, dtype)
        table, W, b_leaf, U, b = self.embedding.weight, self.W, self.b_leaf, self.U, self.b

        @recursive(scatter_shape=(2 * H,), **self.pull_spec(E), push_shape=(H,), arity=2,
                   dtype=dtype)
        def tree_lstm(node):
            if node.is_leaf:
                x = self.word_vector(node, table, E)
                i, o, u = ops.split(x @ W + b_leaf, 3)
                c = ops.sigmoid(i) * ops.tanh(u)
            else:
                (h_l, c_l), (h_r, c_r) = [ops.split(tree_lstm(child), 2)
                                          for child in node.children]
                i, f_l, f_r, o, u = ops.split(ops.concat([h_l, h_r]) @ U + b, 5)
                c = (ops.sigmoid(i) * ops.tanh(u) + ops.sigmoid(f_l) * c_l
                     + ops.sigmoid(f_r) * c_r)
            h = ops.sigmoid(o) * ops.tanh(c)
            node.push(h)
            return ops.concat([h, c])

        self.F = tree_lstm


MODELS = {"treernn": TreeRNNClassifier, "rntn": RNTNClassifier,
          "treelstm": RecursiveTreeLSTMClassifier}


def make(name, vocab_size, hidden, embed_dim=None, init="xavier", leaf_tanh=False,
         **keywords):
    """One of MODELS by name (``embed_dim`` is the Tree-LSTM's; the others embed in ``hidden``;
    ``init`` and ``leaf_tanh`` are the TreeRNN's and the RNTN's)."""
    if name not in MODELS:
        raise ArgumentError(f"unknown model {name!r}; the models are {sorted(MODELS)}")
    if name == "treelstm":
        if init != "xavier":
            raise ArgumentError(f"init={init!r} is the TreeRNN's and the RNTN's; the "
                                f"Tree-LSTM has only 'xavier'")
        if leaf_tanh:
            raise ArgumentError("leaf_tanh is the TreeRNN's and the RNTN's; the Tree-LSTM's "
                                "leaf cell has its own activations")
        return RecursiveTreeLSTMClassifier(vocab_size, embed_dim or hidden, hidden, **keywords)
    return MODELS[name](vocab_size, hidden, init=init, leaf_tanh=leaf_tanh, **keywords)


__all__ = ["TreeRNNClassifier", "RNTNClassifier", "RecursiveTreeLSTMClassifier", "make",
           "MODELS"]
