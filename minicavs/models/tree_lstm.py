"""Tree-LSTM sentiment classifiers (Tai et al., 2015), the Tree-LSTM of Cavs §5 and DyNet's
``treenn`` benchmark: one vertex function per model, run over batches of parse trees.

Both models read :class:`minicavs.data.Tree` objects (SST or the synthetic treebank): word ids
at the leaves (-1 at internal vertices), a label 0..4 at every vertex (-1: unlabelled).

* :class:`TreeLSTMClassifier` — the binary Tree-LSTM: a vertex gathers its left and right
  child's state [h, c] and has one forget gate per side.
* :class:`ChildSumTreeLSTMClassifier` — the child-sum Tree-LSTM, for trees of any arity: it sums
  the children's h, and gives every child its own forget gate f_k = σ(W_f x + U_f h_k + b_f).

A vertex pushes its state h, so one call of F gives a state at every vertex; the classifier
``h W_out + b_out`` runs outside F on the rows the loss or the metrics read, and the loss sums
the cross-entropy over the labelled vertices (internal ones, and leaves with
``leaf_loss=True``), as in DyNet's treenn and Tai et al.

Dropout (Tai et al. §5.2 regularise the sentiment classifier with dropout; Srivastava et al.
2014): ``dropout`` on the state h before the classifier, ``embed_dropout`` on the word vectors.
``word_dropout`` (Iyyer et al. 2015's word dropout) replaces each word by ``<unk>`` with
that probability, which also trains ``<unk>``, the vector of every word unseen in training.
All three act only in training mode (``model.train()``; :func:`minicavs.training.fit`
evaluates in ``eval()`` mode). A traced F cannot draw masks, so the dropouts happen outside
it: with ``embed_dropout`` the word vectors are looked up (and dropped) before F, which then pulls
vectors instead of word ids.
"""

from dataclasses import dataclass

import numpy as np

from .. import data as datasets
from .. import backend, ops, validate
from ..autodiff import no_grad
from ..nn import Embedding, Module, dropout
from ..vertex import GraphBatch, VertexFunction
from .common import (Counts, GraphCache, as_ids, bias, cross_entropy_sum, indices, lstm_bias,
                     runner, weight)


@dataclass
class TreeBatch(Counts):
    """A mini-batch of trees, ready for a tree classifier.

    ``graphs``: the GraphBatch (vertex ids of tree i start at ``graphs.offsets[i]``);
    ``words``: (n, 1) int64 Tensor of word ids, -1 where a vertex has no word;
    ``labels``: (n,) int64 labels, -1 where a vertex is unlabelled;
    ``targets``: the vertices the loss reads (labelled, and internal unless leaves count);
    ``roots``: the root vertex of each tree.
    """

    graphs: GraphBatch
    words: object
    labels: np.ndarray
    targets: np.ndarray
    roots: np.ndarray


class TreeClassifier(Module):
    """What every tree classifier shares: batching trees, the classifier layer, the loss,
    predictions, evaluation.

    A subclass builds ``self.F`` (pulling :meth:`pull_spec`, reading its word vector with
    :meth:`word_vector`, pushing the state to classify), ``self.embedding`` and the classifier
    ``self.W_out``, ``self.b_out``; if F does not push the states, it overrides :meth:`states`.
    """

    sentiment = True  # labels are SST's: 5 classes, or the 2 or 3 of its binary tasks

    def __init__(self, num_classes, leaf_loss, dropout=0.0, embed_dropout=0.0,
                 word_dropout=0.0):
        self.num_classes = int(num_classes)
        self.leaf_loss = bool(leaf_loss)
        for name, p in (("dropout", dropout), ("embed_dropout", embed_dropout),
                        ("word_dropout", word_dropout)):
            validate.number(p, name, type(self).__name__, minimum=0.0, maximum=1.0,
                            open_maximum=True)
        self.dropout, self.embed_dropout = float(dropout), float(embed_dropout)
        self.word_dropout = float(word_dropout)
        self._graphs = GraphCache()

    def _embedding(self, vocab_size, embed_dim, hidden, dtype):
        """The sizes, and the word embedding: a subclass's first parameter."""
        E, H = int(embed_dim), int(hidden)
        self.vocab_size, self.embed_dim, self.hidden = int(vocab_size), E, H
        self.embedding = Embedding(vocab_size, E, dtype=dtype)
        return E, H

    def _classifier(self, H, dtype):
        """``W_out`` and ``b_out``, the classifier of the states: a subclass's last parameters."""
        self.W_out = weight((H, self.num_classes), dtype, "W_out")
        self.b_out = bias(self.num_classes, dtype, "b_out")

    @property
    def pulls_vectors(self):
        """True if F pulls word vectors looked up before it (embedding dropout), else ids."""
        return self.embed_dropout > 0

    def pull_spec(self, size):
        """``pull_shape`` and ``pull_dtype`` of F, whose word vectors have ``size`` values."""
        if self.pulls_vectors:
            return {"pull_shape": (size,)}
        return {"pull_shape": (1,), "pull_dtype": "int64"}

    def word_vector(self, v, table, size):
        """Inside F: the word vector of vertex ``v`` (zeros where it has no word)."""
        if self.pulls_vectors:
            return v.pull()
        return ops.reshape(ops.embedding(table, v.pull()), (size,))

    def words(self, batch):
        """The word ids of ``batch``, (n, 1): in training with ``word_dropout``, each word
        (id >= 0) replaced by ``<unk>`` with that probability, a new draw every call."""
        if not (self.training and self.word_dropout > 0):
            return batch.words
        ids = np.array(batch.words.numpy())  # a host copy: the batch keeps its own ids
        dropped = (ids >= 0) & (backend.rng().random(ids.shape) < self.word_dropout)
        ids[dropped] = datasets.Vocabulary.UNK_ID
        return as_ids(ids)

    def pull(self, batch):
        """What F pulls for ``batch``: word ids, or the word vectors with dropout applied."""
        words = self.words(batch)
        if not self.pulls_vectors:
            return words
        table = self.embedding.weight
        vectors = ops.reshape(ops.embedding(table, words),
                              (batch.graphs.num_vertices, table.shape[1]))
        return dropout(vectors, self.embed_dropout, self.training)

    @property
    def root_metric(self):
        """The name :meth:`evaluate` gives root accuracy: "binary" for SST's binary tasks."""
        return "binary" if self.num_classes in (2, 3) and self.sentiment else "fine"

    def prepare(self, trees):
        """One :class:`TreeBatch` from a list of :class:`minicavs.data.Tree` (graphs cached)."""
        trees = list(trees)
        graphs = GraphBatch([self._graphs(t) for t in trees])
        words = np.concatenate([t.words for t in trees])
        labels = np.concatenate([t.labels for t in trees])
        supervised = labels >= 0
        if not self.leaf_loss:
            supervised &= graphs.num_children > 0
        return TreeBatch(graphs, as_ids(words), labels, np.flatnonzero(supervised),
                         graphs.roots)

    def states(self, batch, run=None):
        """The state every vertex is classified from, (n, H): what F pushes."""
        return runner(run)(self.F, batch.graphs, self.pull(batch))

    def logits_at(self, batch, vertices, run=None):
        """Class logits (len(vertices), C) of the given vertices of ``batch``."""
        h = ops.take_rows(self.states(batch, run), indices(vertices))
        return dropout(h, self.dropout, self.training) @ self.W_out + self.b_out

    def loss(self, batch, run=None):
        """Softmax cross-entropy summed over ``batch.targets`` (a scalar Tensor); ``run`` as in
        :func:`~minicavs.models.common.runner`."""
        logits = self.logits_at(batch, batch.targets, run)
        return cross_entropy_sum(logits, batch.labels[batch.targets])

    def predict(self, batch, vertices=None):
        """The predicted class of every vertex of the batch (or of ``vertices``), as NumPy."""
        vertices = np.arange(batch.graphs.num_vertices) if vertices is None else vertices
        with no_grad():
            logits = self.logits_at(batch, vertices).numpy()
        return logits.argmax(axis=-1)

    def root_accuracy(self, batch):
        """Fine-grained (all classes) accuracy of the roots of ``batch``."""
        predicted = self.predict(batch, batch.roots)
        return float(np.mean(predicted == batch.labels[batch.roots]))

    def evaluate(self, batches):
        """The loss per target and the accuracies over prepared batches, in eval mode.

        ``"phrase"``: accuracy over every labelled vertex. Root accuracy is ``"fine"`` for a
        5-class model (SST's fine-grained task), which also gets ``"binary"``: positive
        against negative probability mass (:func:`minicavs.data.polarity`) on the
        non-neutral roots; for a 2-class model (SST's binary task, :func:`minicavs.data.sst_task`)
        root accuracy is ``"binary"``, over the labelled roots, and so it is for a 3-class
        model (``binary3``), whose roots are scored negative against positive output
        (:func:`minicavs.data.ternary_polarity`); models of other labels
        (``sentiment = False``) call it ``"fine"``.
        """
        total, count = 0.0, 0
        root_logits, root_gold, phrase_predicted, phrase_gold = [], [], [], []
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for batch in batches:
                    logits = self.logits_at(batch, np.arange(batch.graphs.num_vertices))
                    total += cross_entropy_sum(ops.take_rows(logits, indices(batch.targets)),
                                               batch.labels[batch.targets]).item()
                    count += len(batch.targets)
                    logits = logits.numpy().astype(np.float64)
                    root_logits.append(logits[batch.roots])
                    root_gold.append(batch.labels[batch.roots])
                    phrase_predicted.append(logits.argmax(axis=-1))
                    phrase_gold.append(batch.labels)
        finally:
            self.train(was_training)
        logits, gold = np.concatenate(root_logits), np.concatenate(root_gold)
        labelled = gold >= 0
        predicted = logits.argmax(axis=-1)
        if self.num_classes == 3 and self.sentiment:  # roots are 0 or 2 (binary3)
            predicted = 2 * datasets.ternary_polarity(logits)
        root = float(np.mean(predicted[labelled] == gold[labelled])) \
            if labelled.any() else float("nan")
        result = {"loss": total / max(count, 1), self.root_metric: root}
        if self.num_classes == 5 and self.sentiment and labelled.all():
            probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
            result["binary"] = datasets.binary_accuracy(datasets.polarity(probabilities), gold,
                                                        predicted_classes=2)
        result["phrase"] = datasets.phrase_accuracy(np.concatenate(phrase_predicted),
                                                    np.concatenate(phrase_gold))
        return result


class TreeLSTMClassifier(TreeClassifier):
    """Binary Tree-LSTM over parse trees; the vertex function of Cavs Fig. 4 (binary form).

    At a vertex with word embedding x (zero at internal vertices) and children states
    [h_l, c_l], [h_r, c_r] (zero where absent):
        i, f_l, f_r, o, u = split(x W + [h_l, h_r] U + b, 5)
        c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r,   h = σ(o)⊙tanh(c)
    it scatters [h, c] to its parent and pushes h (classified outside F: h W_out + b_out).
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=5, dtype="float32",
                 leaf_loss=False, dropout=0.0, embed_dropout=0.0, word_dropout=0.0):
        super().__init__(num_classes, leaf_loss, dropout, embed_dropout, word_dropout)
        E, H = self._embedding(vocab_size, embed_dim, hidden, dtype)
        self.W = weight((E, 5 * H), dtype, "W")
        self.U = weight((2 * H, 5 * H), dtype, "U")
        self.b = lstm_bias(H, ["i", "f_l", "f_r", "o", "u"], dtype, "b")
        self._classifier(H, dtype)
        table, W, U, b = self.embedding.weight, self.W, self.U, self.b

        def tree_lstm(v):
            x = self.word_vector(v, table, E)  # word id -1: zeros
            h_l, c_l = ops.split(v.gather(0), 2)
            h_r, c_r = ops.split(v.gather(1), 2)
            i, f_l, f_r, o, u = ops.split(x @ W + ops.concat([h_l, h_r]) @ U + b, 5)
            c = (ops.sigmoid(i) * ops.tanh(u) + ops.sigmoid(f_l) * c_l
                 + ops.sigmoid(f_r) * c_r)
            h = ops.sigmoid(o) * ops.tanh(c)
            v.scatter(ops.concat([h, c]))
            v.push(h)

        self.F = VertexFunction(tree_lstm, **self.pull_spec(E), scatter_shape=(2 * H,),
                                push_shape=(H,), arity=2, dtype=dtype)


class ChildSumTreeLSTMClassifier(TreeClassifier):
    """Child-sum Tree-LSTM (Tai et al. §3.1) over trees of any arity.

    With h̃ = Σ_k h_k over the children:
        i, o, u = split(x W + h̃ U + b, 3)
        f_k = σ(x W_f + h_k U_f + b_f)                         (one forget gate per child)
        c = σ(i)⊙tanh(u) + Σ_k f_k⊙c_k,   h = σ(o)⊙tanh(c)
    Both sums are ``v.gather_sum``: the runtime adds per-edge values into their parents.
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=5, dtype="float32",
                 leaf_loss=False, dropout=0.0, embed_dropout=0.0, word_dropout=0.0):
        super().__init__(num_classes, leaf_loss, dropout, embed_dropout, word_dropout)
        E, H = self._embedding(vocab_size, embed_dim, hidden, dtype)
        self.W = weight((E, 3 * H), dtype, "W")
        self.U = weight((H, 3 * H), dtype, "U")
        self.b = bias(3 * H, dtype, "b")
        self.W_f = weight((E, H), dtype, "W_f")
        self.U_f = weight((H, H), dtype, "U_f")
        self.b_f = bias(H, dtype, "b_f", value=1.0)  # start by keeping the children's memory
        self._classifier(H, dtype)
        table, W, U, b, W_f, U_f, b_f = (self.embedding.weight, self.W, self.U, self.b,
                                         self.W_f, self.U_f, self.b_f)

        def child_sum_tree_lstm(v):
            x = self.word_vector(v, table, E)
            h_sum = v.gather_sum(lambda child: ops.split(child, 2)[0])
            i, o, u = ops.split(x @ W + h_sum @ U + b, 3)
            forget_x = x @ W_f + b_f  # once per vertex, shared by all its children

            def forget_times_memory(child):  # per edge: f_k ⊙ c_k
                h_k, c_k = ops.split(child, 2)
                return ops.sigmoid(forget_x + h_k @ U_f) * c_k

            c = ops.sigmoid(i) * ops.tanh(u) + v.gather_sum(forget_times_memory)
            h = ops.sigmoid(o) * ops.tanh(c)
            v.scatter(ops.concat([h, c]))
            v.push(h)

        self.F = VertexFunction(child_sum_tree_lstm, **self.pull_spec(E),
                                scatter_shape=(2 * H,), push_shape=(H,), dtype=dtype)
