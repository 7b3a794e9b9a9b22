"""TD-TreeLSTM (Zhang, Lu and Lapata, 2016) on binary constituency trees: a tree generated
top-down, each vertex deciding from its own state whether it has two children or is a leaf
with a word — a structure decided at run time (the recursion paper §6.4), which a runtime that
needs every input graph before it runs cannot express.

One vertex function F: a vertex pulls a condition id — at the root, the sentence label it is
asked for (0..4); below, whether it is its parent's left or right child — gathers its
**parent's** [h, c] (``v.gather(0)``: in a grown structure a vertex's one child slot is its
parent), runs an LSTM step and pushes the logits of its class: ``EXPAND`` (two children) or
``1 + w`` (a leaf with word w).

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
from .common import as_ids, bias, cross_entropy_sum, lstm_bias, runner, weight

EXPAND = 0  # class of a vertex with two children; a leaf with word w is class 1 + w


@dataclass
class TopDownBatch:
    """Trees read top-down: ``structure`` (``mc.top_down``'s GraphBatch and per-vertex
    indices), the condition id each vertex pulls and the class each vertex must predict."""

    structure: object
    conditions: object  # (n, 1) int64 Tensor
    targets: np.ndarray  # (n,) int64

    @property
    def num_samples(self):
        return self.structure.batch.num_graphs

    @property
    def num_targets(self):
        return len(self.targets)


class TDTreeLSTM(Module):
    """Generates binary trees with words at the leaves, conditioned on a sentence label."""

    def __init__(self, vocab_size, num_labels=5, embed_dim=32, hidden=64, dtype="float32"):
        E, H = int(embed_dim), int(hidden)
        self.vocab_size, self.num_labels = int(vocab_size), int(num_labels)
        self.num_classes = 1 + self.vocab_size
        # condition ids: the root's label 0..num_labels-1, then "left child", "right child"
        self.conditions = Embedding(self.num_labels + 2, E, dtype=dtype)
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

    def prepare(self, trees):
        """A :class:`TopDownBatch` of labelled trees (``minicavs.data.Tree``, binary)."""
        for s, tree in enumerate(trees):
            for v, kids in enumerate(tree.children):
                if len(kids) not in (0, 2) or (not kids and tree.words[v] < 0):
                    what = f"{len(kids)} children" if kids else "no word"
                    raise DataError(f"TDTreeLSTM: sample {s}, vertex {v}: has {what}; the "
                                    f"model generates binary trees with a word at each leaf")
        structure = top_down([InputGraph(t.children) for t in trees])
        firsts = structure.batch.offsets[:-1]
        sample = structure.batch.sample_of
        original = structure.vertex + np.concatenate([[0], np.cumsum(
            [len(t.children) for t in trees])[:-1]])[sample]
        words = np.concatenate([t.words for t in trees])[original]
        leaf = np.concatenate([[not kids for kids in t.children] for t in trees])[original]
        targets = np.where(leaf, 1 + words, EXPAND).astype(np.int64)
        conditions = self.num_labels + structure.slot  # left / right child
        conditions[firsts] = [t.labels[-1] for t in trees]  # a root: the sentence's label
        return TopDownBatch(structure, as_ids(conditions), targets)

    def logits(self, batch, run=None):
        return runner(run)(self.F, batch.structure.batch, batch.conditions)

    def loss(self, batch, run=None):
        return cross_entropy_sum(self.logits(batch, run), batch.targets)

    def evaluate(self, batches):
        """Teacher-forced ``loss`` and ``accuracy`` of the vertex classes (expand, or which
        word)."""
        total, correct, count = 0.0, 0, 0
        with no_grad():
            for batch in batches:
                logits = self.logits(batch)
                total += cross_entropy_sum(logits, batch.targets).item()
                correct += int((logits.numpy().argmax(-1) == batch.targets).sum())
                count += batch.num_targets
        return {"loss": total / max(count, 1), "accuracy": correct / max(count, 1)}

    def decide(self, greedy=False, record=None):
        """The decision rule of generation: each frontier vertex's class, drawn from its
        logits (seeded per tree) or their argmax (``greedy``); EXPAND gives two children,
        pulling "left" and "right". ``record(frontier, classes)``: called with each step's
        classes."""
        def expand_or_stop(frontier):
            classes = backend.to_numpy(frontier.argmax() if greedy else frontier.sample())
            if record is not None:
                record(frontier, classes)
            counts = np.where(classes == EXPAND, 2, 0)
            side = np.tile([0, 1], int(counts.sum()) // 2)
            return counts, (self.num_labels + side)[:, None]
        return expand_or_stop

    def generate(self, labels, vocab=None, greedy=False, max_vertices=127, seed=0):
        """Trees for the requested sentence ``labels``, grown top-down in one batch (each step
        samples every frontier vertex's class — or takes its argmax, ``greedy`` — with a
        generator seeded per tree). Returns ``(trees, growth)``: each a
        ``minicavs.data.Tree`` numbered children first, root last, its leaves' ``words`` (and
        ``tokens``, with ``vocab``) in sentence order — a leaf the ``max_vertices`` budget cut
        off has word -1 and token "…" — and the :class:`~minicavs.vertex.growth.Growth`."""
        labels = np.asarray(labels, np.int64).reshape(-1, 1)
        if ((labels < 0) | (labels >= self.num_labels)).any():
            raise IndexRangeError(f"TDTreeLSTM.generate: labels must lie in 0.."
                                  f"{self.num_labels - 1}, got {labels.ravel().tolist()}")
        chosen = []

        def record(frontier, classes):
            chosen.append((frontier.sample_of, frontier.vertex, classes))

        with no_grad():
            growth = grow(self.F, labels, self.decide(greedy, record), max_vertices=max_vertices,
                          on_budget="truncate", seed=seed)
        choice = np.zeros(growth.num_vertices, np.int64)
        for sample, vertex, c in chosen:
            choice[growth.offsets[sample] + vertex] = c
        trees = []
        for s, parent in enumerate(growth.parents):
            classes = choice[growth.offsets[s]:growth.offsets[s + 1]]
            trees.append(_bottom_up(parent, classes, vocab))
        return trees, growth


def _bottom_up(parent, classes, vocab):
    """A grown tree (parent array in growth order, each vertex's class) as a ``Tree``
    numbered in post-order: children first, leaves in sentence order, the root last."""
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
    words = np.array([-1 if children[v] or classes[v] == EXPAND else int(classes[v]) - 1
                      for v in post], np.int64)
    leaves = [i for i, k in enumerate(kids) if not k]
    tokens = None
    if vocab is not None:
        tokens = [vocab.decode([int(words[i])])[0] if words[i] >= 0 else "…" for i in leaves]
    return Tree._unchecked(kids, words, np.full(n, -1, np.int64), tokens)
