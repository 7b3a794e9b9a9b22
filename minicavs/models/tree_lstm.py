"""Tree-LSTM sentiment classifiers (Tai et al., 2015), the Tree-LSTM of Cavs §5 and DyNet's
``treenn`` benchmark: one vertex function per model, run over batches of parse trees.

Both models read :class:`minicavs.data.Tree` objects (SST or the synthetic treebank): word ids
at the leaves (-1 at internal vertices), a label 0..4 at every vertex (-1: unlabelled).

* :class:`TreeLSTMClassifier` — the binary Tree-LSTM: a vertex gathers its left and right
  child's state [h, c] and has one forget gate per side.
* :class:`ChildSumTreeLSTMClassifier` — the child-sum Tree-LSTM, for trees of any arity: it sums
  the children's h, and gives every child its own forget gate f_k = σ(W_f x + U_f h_k + b_f).

A vertex pushes its class logits, so one call of F gives a prediction at every vertex; the loss
sums the cross-entropy over the labelled vertices (internal ones, and leaves with
``leaf_loss=True``), as in DyNet's treenn and Tai et al.
"""

from dataclasses import dataclass

import numpy as np

from .. import data as datasets
from .. import ops
from ..autodiff import no_grad
from ..nn import Embedding, Module
from ..vertex import GraphBatch, VertexFunction
from .common import (GraphCache, as_ids, bias, cross_entropy_sum, indices, lstm_bias, runner,
                     weight)


@dataclass
class TreeBatch:
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

    @property
    def num_samples(self):  # what throughput counts
        return self.graphs.num_graphs

    @property
    def num_targets(self):  # what the loss is summed over
        return len(self.targets)


class TreeClassifier(Module):
    """What every tree classifier shares: batching trees, the loss, predictions, evaluation.

    A subclass builds ``self.F`` (and its parameters) and, if F does not push logits, overrides
    :meth:`logits_at`.
    """

    def __init__(self, num_classes, leaf_loss):
        self.num_classes = int(num_classes)
        self.leaf_loss = bool(leaf_loss)
        self._graphs = GraphCache()

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

    def logits_at(self, batch, vertices, run=None):
        """Class logits (len(vertices), C) of the given vertices of ``batch``."""
        logits = runner(run)(self.F, batch.graphs, batch.words)
        return ops.take_rows(logits, indices(vertices))

    def loss(self, batch, run=None):
        """Softmax cross-entropy summed over ``batch.targets`` (a scalar Tensor).

        ``run`` replaces the batched call of the vertex function (tests pass
        ``minicavs.vertex.evaluate_per_sample``).
        """
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
        """Loss per target and root accuracy over prepared batches: ``{"loss", "fine"}``, and
        ``"binary"`` (SST's positive/negative accuracy, neutral roots dropped) for 5 classes."""
        total, count, predicted, gold = 0.0, 0, [], []
        with no_grad():
            for batch in batches:
                logits = self.logits_at(batch, np.concatenate([batch.targets, batch.roots]))
                targets = len(batch.targets)
                total += cross_entropy_sum(logits[:targets], batch.labels[batch.targets]).item()
                count += targets
                predicted.append(logits[targets:].numpy().argmax(axis=-1))
                gold.append(batch.labels[batch.roots])
        predicted, gold = np.concatenate(predicted), np.concatenate(gold)
        result = {"loss": total / max(count, 1), "fine": float(np.mean(predicted == gold))}
        if self.num_classes == 5 and gold.min(initial=0) >= 0:
            result["binary"] = datasets.binary_accuracy(predicted, gold)
        return result


class TreeLSTMClassifier(TreeClassifier):
    """Binary Tree-LSTM over parse trees; the vertex function of Cavs Fig. 4 (binary form).

    At a vertex with word embedding x (zero at internal vertices) and children states
    [h_l, c_l], [h_r, c_r] (zero where absent):
        i, f_l, f_r, o, u = split(x W + [h_l, h_r] U + b, 5)
        c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r,   h = σ(o)⊙tanh(c)
    it scatters [h, c] to its parent and pushes the logits h W_o + b_o.
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=5, dtype="float32",
                 leaf_loss=False):
        super().__init__(num_classes, leaf_loss)
        E, H, C = int(embed_dim), int(hidden), int(num_classes)
        self.vocab_size, self.embed_dim, self.hidden = int(vocab_size), E, H
        self.embedding = Embedding(vocab_size, E, dtype=dtype)
        self.W = weight((E, 5 * H), dtype, "W")
        self.U = weight((2 * H, 5 * H), dtype, "U")
        self.b = lstm_bias(H, ["i", "f_l", "f_r", "o", "u"], dtype, "b")
        self.W_out = weight((H, C), dtype, "W_out")
        self.b_out = bias(C, dtype, "b_out")
        table, W, U, b, W_out, b_out = (self.embedding.weight, self.W, self.U, self.b,
                                        self.W_out, self.b_out)

        def tree_lstm(v):
            x = ops.reshape(ops.embedding(table, v.pull()), (E,))  # word id -1: zeros
            h_l, c_l = ops.split(v.gather(0), 2)
            h_r, c_r = ops.split(v.gather(1), 2)
            i, f_l, f_r, o, u = ops.split(x @ W + ops.concat([h_l, h_r]) @ U + b, 5)
            c = (ops.sigmoid(i) * ops.tanh(u) + ops.sigmoid(f_l) * c_l
                 + ops.sigmoid(f_r) * c_r)
            h = ops.sigmoid(o) * ops.tanh(c)
            v.scatter(ops.concat([h, c]))
            v.push(h @ W_out + b_out)

        self.F = VertexFunction(tree_lstm, pull_shape=(1,), pull_dtype="int64",
                                scatter_shape=(2 * H,), push_shape=(C,), arity=2, dtype=dtype)


class ChildSumTreeLSTMClassifier(TreeClassifier):
    """Child-sum Tree-LSTM (Tai et al. §3.1) over trees of any arity.

    With h̃ = Σ_k h_k over the children:
        i, o, u = split(x W + h̃ U + b, 3)
        f_k = σ(x W_f + h_k U_f + b_f)                         (one forget gate per child)
        c = σ(i)⊙tanh(u) + Σ_k f_k⊙c_k,   h = σ(o)⊙tanh(c)
    Both sums are ``v.gather_sum``: the runtime adds per-edge values into their parents.
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, num_classes=5, dtype="float32",
                 leaf_loss=False):
        super().__init__(num_classes, leaf_loss)
        E, H, C = int(embed_dim), int(hidden), int(num_classes)
        self.vocab_size, self.embed_dim, self.hidden = int(vocab_size), E, H
        self.embedding = Embedding(vocab_size, E, dtype=dtype)
        self.W = weight((E, 3 * H), dtype, "W")
        self.U = weight((H, 3 * H), dtype, "U")
        self.b = bias(3 * H, dtype, "b")
        self.W_f = weight((E, H), dtype, "W_f")
        self.U_f = weight((H, H), dtype, "U_f")
        self.b_f = bias(H, dtype, "b_f", value=1.0)  # start by keeping the children's memory
        self.W_out = weight((H, C), dtype, "W_out")
        self.b_out = bias(C, dtype, "b_out")
        table, W, U, b, W_f, U_f, b_f, W_out, b_out = (
            self.embedding.weight, self.W, self.U, self.b, self.W_f, self.U_f, self.b_f,
            self.W_out, self.b_out)

        def child_sum_tree_lstm(v):
            x = ops.reshape(ops.embedding(table, v.pull()), (E,))
            h_sum = v.gather_sum(lambda child: ops.split(child, 2)[0])
            i, o, u = ops.split(x @ W + h_sum @ U + b, 3)
            forget_x = x @ W_f + b_f  # once per vertex, shared by all its children

            def forget_times_memory(child):  # per edge: f_k ⊙ c_k
                h_k, c_k = ops.split(child, 2)
                return ops.sigmoid(forget_x + h_k @ U_f) * c_k

            c = ops.sigmoid(i) * ops.tanh(u) + v.gather_sum(forget_times_memory)
            h = ops.sigmoid(o) * ops.tanh(c)
            v.scatter(ops.concat([h, c]))
            v.push(h @ W_out + b_out)

        self.F = VertexFunction(child_sum_tree_lstm, pull_shape=(1,), pull_dtype="int64",
                                scatter_shape=(2 * H,), push_shape=(C,), dtype=dtype)
