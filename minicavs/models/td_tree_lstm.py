"""TD-TreeLSTM (Zhang, Lu and Lapata, 2016) on binary constituency trees: a tree generated
top-down, each vertex deciding from its own state whether it has two children or is a leaf
with a word — a structure decided at run time (the recursion paper §6.4), which a runtime that
needs every input graph before it runs cannot express.

Every vertex carries a label (0..4, as in SST) and the tree is generated from its root's.
One vertex function F: a vertex pulls a condition id — its own label, its place (the root, a
left or a right child) and its sibling's label — gathers its **parent's** [h, c]
(``v.gather(0)``: in a grown structure a vertex's one child slot is its parent), runs an LSTM
step and pushes the logits of its class: two children labelled ``a`` and ``b`` (class
``a * num_labels + b``, below ``num_expand``) or a leaf with word w (``num_expand + w``).
Children are drawn independently given their parent, so the labels are how a parent makes
them agree: with the sentence label at the root alone, "not" and the adjective it negates were
drawn blind to each other and the rule's label of a generated tree was at chance (issue 43).

* Training (teacher forcing): F on the known trees read top-down (``mc.top_down``), the
  cross-entropy of every vertex's class — one batched call, level by level from the roots.
* Generation: ``mc.grow`` from one root per requested label; each step runs F on every tree's
  frontier at once and samples (or takes the argmax of) each frontier vertex's class.
"""

from dataclasses import dataclass

import numpy as np

from .. import backend, ops
from ..autodiff import no_grad
from ..data.tree import DataError, Tree
from ..errors import IndexRangeError
from ..nn import Embedding, Module
from ..vertex import InputGraph, VertexFunction, grow, top_down
from .common import (Counts, as_ids, bias, cross_entropy_sum, lstm_bias, runner, teacher_forced,
                     weight)


@dataclass
class TopDownBatch(Counts):
    """Trees read top-down: ``structure`` (``mc.top_down``'s GraphBatch and per-vertex
    indices), the condition id each vertex pulls and the class each vertex must predict."""

    structure: object
    conditions: object  # (n, 1) int64 Tensor
    targets: np.ndarray  # (n,) int64

    @property
    def num_samples(self):
        return self.structure.batch.num_graphs


class TDTreeLSTM(Module):
    """Generates labelled binary trees with words at the leaves from a root label."""

    def __init__(self, vocab_size, num_labels=5, embed_dim=32, hidden=64, dtype="float32"):
        E, H = int(embed_dim), int(hidden)
        self.vocab_size, self.num_labels = int(vocab_size), int(num_labels)
        self.num_expand = self.num_labels ** 2  # classes with two children: their labels
        self.num_classes = self.num_expand + self.vocab_size
        self.conditions = Embedding(self.condition(self.num_labels, self.num_labels, 2) + 1, E,
                                    dtype=dtype)
        self.W = weight((E, 4 * H), dtype, "W")
        self.U = weight((H, 4 * H), dtype, "U")
        self.b = lstm_bias(H, ["i", "f", "o", "u"], dtype, "b")
        self.W_out = weight((H, self.num_classes), dtype, "W_out")
        self.b_out = bias(self.num_classes, dtype, "b_out")
        table, W, U, b, W_out, b_out = (self.conditions.weight, self.W, self.U, self.b,
                                        self.W_out, self.b_out)

        def td_tree_lstm(v):
            x = ops.reshape(ops.embedding(table, v.pull()), (E,))
            h_parent, c_parent = ops.split(v.gather(0), 2)  # zeros at the root
            h, c = ops.lstm_gates(x @ W + h_parent @ U + b, c_parent)
            v.scatter(ops.concat([h, c]))
            v.push(h @ W_out + b_out)

        self.F = VertexFunction(td_tree_lstm, pull_shape=(1,), pull_dtype="int64",
                                scatter_shape=(2 * H,), push_shape=(self.num_classes,),
                                arity=1, dtype=dtype)

    def condition(self, label, sibling, place):
        """The condition id of a vertex: its label, its sibling's (num_labels at a root) and
        its place (0 root, 1 left child, 2 right child)."""
        return (place * (self.num_labels + 1) + sibling) * self.num_labels + label

    def prepare(self, trees):
        """A :class:`TopDownBatch` of labelled trees (``minicavs.data.Tree``, binary, a label
        at every vertex)."""
        for s, tree in enumerate(trees):
            for v, kids in enumerate(tree.children):
                what = (f"{len(kids)} children" if len(kids) not in (0, 2) else
                        "no word" if not kids and tree.words[v] < 0 else
                        f"label {tree.labels[v]}" if not 0 <= tree.labels[v] < self.num_labels
                        else None)
                if what:
                    raise DataError(f"TDTreeLSTM: sample {s}, vertex {v}: has {what}; the "
                                    f"model generates binary trees with a word at each leaf "
                                    f"and a label 0..{self.num_labels - 1} at each vertex")
        structure = top_down([InputGraph(t.children) for t in trees])
        sample = structure.batch.sample_of
        starts = np.concatenate([[0], np.cumsum([len(t.children) for t in trees])[:-1]])
        original = structure.vertex + starts[sample]
        words = np.concatenate([t.words for t in trees])
        labels = np.concatenate([t.labels for t in trees])
        kids = [starts[s] + np.array(k) for s, t in enumerate(trees) for k in t.children]
        left = np.array([k[0] if len(k) else -1 for k in kids])[original]
        right = np.array([k[1] if len(k) else -1 for k in kids])[original]
        targets = np.where(left < 0, self.num_expand + words[original],
                           labels[left] * self.num_labels + labels[right])
        # a vertex's sibling: its parent's other child (the batch's child 0 is the parent)
        parent = np.full(len(original), -1)
        has = structure.batch.num_children > 0
        parent[has] = structure.batch.child_ids[structure.batch.child_ptr[:-1][has]]
        p = np.maximum(parent, 0)
        sibling = np.where(parent < 0, self.num_labels,
                           labels[np.where(structure.slot == 0, right[p], left[p])])
        place = np.where(parent < 0, 0, 1 + structure.slot)
        conditions = self.condition(labels[original], sibling, place)
        return TopDownBatch(structure, as_ids(conditions), targets.astype(np.int64))

    def logits(self, batch, run=None):
        return runner(run)(self.F, batch.structure.batch, batch.conditions)

    def loss(self, batch, run=None):
        return cross_entropy_sum(self.logits(batch, run), batch.targets)

    def evaluate(self, batches):
        """Teacher-forced ``loss`` and ``accuracy`` of the vertex classes (the children's
        labels, or which word)."""
        loss, accuracy = teacher_forced(self, batches)
        return {"loss": loss, "accuracy": accuracy}

    def decide(self, greedy=False, record=None):
        """The decision rule of generation: each frontier vertex's class, drawn from its
        logits (seeded per tree) or their argmax (``greedy``); a class below ``num_expand``
        gives two children, pulling their labels. ``record(frontier, classes)``: called with
        each step's classes."""
        def expand_or_stop(frontier):
            classes = backend.to_numpy(frontier.argmax() if greedy else frontier.sample())
            if record is not None:
                record(frontier, classes)
            a, b = np.divmod(classes[classes < self.num_expand], self.num_labels)
            pulls = np.stack([self.condition(a, b, 1), self.condition(b, a, 2)], axis=1)
            return np.where(classes < self.num_expand, 2, 0), pulls.reshape(-1, 1)
        return expand_or_stop

    def generate(self, labels, vocab=None, greedy=False, max_vertices=127, seed=0):
        """Trees for the requested sentence ``labels``, grown top-down in one batch (each step
        samples every frontier vertex's class — or takes its argmax, ``greedy`` — with a
        generator seeded per tree). Returns ``(trees, growth)``: each a ``minicavs.data.Tree``
        numbered children first, root last, with the ``labels`` its vertices were generated
        with (the data's rule may disagree), its leaves' ``words`` (and ``tokens``, with
        ``vocab``) in sentence order — a leaf the ``max_vertices`` budget cut off has word -1
        and token "…" — and the :class:`~minicavs.vertex.growth.Growth`."""
        labels = np.asarray(labels, np.int64).reshape(-1, 1)
        if ((labels < 0) | (labels >= self.num_labels)).any():
            raise IndexRangeError(f"TDTreeLSTM.generate: labels must lie in 0.."
                                  f"{self.num_labels - 1}, got {labels.ravel().tolist()}")
        chosen = []

        def record(frontier, classes):
            chosen.append((frontier.sample_of, frontier.vertex, classes))

        with no_grad():
            growth = grow(self.F, self.condition(labels, self.num_labels, 0),
                          self.decide(greedy, record), max_vertices=max_vertices,
                          on_budget="truncate", seed=seed)
        choice = np.zeros(growth.num_vertices, np.int64)
        for sample, vertex, c in chosen:
            choice[growth.offsets[sample] + vertex] = c
        words, pulled = choice - self.num_expand, backend.to_numpy(growth.pull)[:, 0]
        trees = []
        for s, parent in enumerate(growth.parents):
            rows = slice(growth.offsets[s], growth.offsets[s + 1])
            trees.append(_bottom_up(parent, words[rows], pulled[rows] % self.num_labels, vocab))
        return trees, growth


def _bottom_up(parent, words, labels, vocab):
    """A grown tree (parent array in growth order, each vertex's word — negative where it
    expanded — and label) as a ``Tree`` numbered in post-order: children first, leaves in
    sentence order, the root last."""
    n = len(parent)
    children = [[] for _ in range(n)]
    for v in range(1, n):  # growth order: siblings in slot order
        children[parent[v]].append(v)
    post, stack = [], [(0, False)]
    while stack:
        v, done = stack.pop()
        if done or not children[v]:
            post.append(v)
            continue
        stack.append((v, True))
        stack.extend((c, False) for c in reversed(children[v]))
    new = np.empty(n, np.int64)
    new[post] = np.arange(n)
    kids = [[int(new[c]) for c in children[v]] for v in post]
    # a leaf's word; -1 at an internal vertex and at one the budget left without its children
    words = np.array([-1 if children[v] else max(int(words[v]), -1) for v in post], np.int64)
    leaves = [i for i, k in enumerate(kids) if not k]
    tokens = None
    if vocab is not None:
        tokens = [vocab.decode([int(words[i])])[0] if words[i] >= 0 else "…" for i in leaves]
    return Tree._unchecked(kids, words, np.asarray(labels, np.int64)[post], tokens)
