"""The neutral tree representation every reader and generator in ``minicavs.data`` produces.

A :class:`Tree` is plain data: child lists, a word id and a label per vertex, and the leaf
tokens for display. Vertices are numbered so that every child comes before its parent and the
root is the last vertex, which is the order the vertex runtime needs (a vertex can be computed
once everything with a smaller id is done), so ``InputGraph(children=tree.children)`` takes a
tree as it is.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import MinicavsError


class DataError(MinicavsError, ValueError):
    """A data file or a data structure (tree, vocabulary, treebank) is malformed."""


@dataclass(eq=False, repr=False)
class Tree:
    """One tree: vertices ``0..n-1``, every child before its parent, the root last.

    ``children[v]`` lists v's children in order (left to right); ``[]`` for a leaf.
    ``words[v]`` is v's word id, -1 where v has none (internal vertices of a constituency tree,
    leaves not yet encoded with a vocabulary). ``labels[v]`` is v's label, -1 where it has none.
    ``tokens`` are the leaf tokens in sentence order (the order of :meth:`leaves`), or None.
    """

    children: list
    words: np.ndarray
    labels: np.ndarray
    tokens: list = None

    def __post_init__(self):
        self.children = [[int(c) for c in kids] for kids in self.children]
        self.words = np.asarray(self.words, dtype=np.int64)
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if self.tokens is not None:
            self.tokens = list(self.tokens)
        self.validate()

    @classmethod
    def _unchecked(cls, children, words, labels, tokens):
        """Build a tree that is valid by construction (readers, generators), skipping the
        copying and the checks of ``__init__``, which would double the time to read SST."""
        tree = cls.__new__(cls)
        tree.children, tree.words, tree.labels, tree.tokens = children, words, labels, tokens
        return tree

    def validate(self):
        """Raise :class:`DataError` unless this is a tree numbered children-first, root last."""
        n = len(self.children)
        if n == 0:
            raise DataError("a tree needs at least one vertex; children is empty")
        for name in ("words", "labels"):
            array = getattr(self, name)
            if array.shape != (n,):
                raise DataError(f"tree {name} must have shape ({n},), one entry per vertex; "
                                f"got shape {array.shape}")
        parent = [-1] * n
        for v, kids in enumerate(self.children):
            for c in kids:
                if not 0 <= c < v:
                    raise DataError(f"vertex {v} has child {c}; children must be numbered "
                                    f"before their parent (0 <= child < {v})")
                if parent[c] != -1:
                    raise DataError(f"vertex {c} has two parents ({parent[c]} and {v}); "
                                    f"a tree gives every vertex but the root exactly one")
                parent[c] = v
        orphans = [v for v in range(n - 1) if parent[v] == -1]
        if orphans:
            raise DataError(f"vertex {orphans[0]} has no parent but is not the root (the root "
                            f"is the last vertex, {n - 1}); {len(orphans)} such vertices")
        if self.tokens is not None and len(self.tokens) != self.num_leaves:
            raise DataError(f"tree has {self.num_leaves} leaves but {len(self.tokens)} tokens; "
                            f"tokens must list one token per leaf, in sentence order")

    # -- shape of the tree -------------------------------------------------------------------

    @property
    def num_vertices(self):
        return len(self.children)

    @property
    def root(self):
        return len(self.children) - 1

    @property
    def num_leaves(self):
        return sum(1 for kids in self.children if not kids)

    def leaves(self):
        """Leaf ids in sentence order (left to right), as an int64 array."""
        order, stack = [], [self.root]
        while stack:  # a depth-first walk with an explicit stack: trees can be very deep
            v = stack.pop()
            kids = self.children[v]
            if kids:
                stack.extend(reversed(kids))
            else:
                order.append(v)
        return np.asarray(order, dtype=np.int64)

    def parents(self):
        """``parents()[v]`` is v's parent, -1 for the root."""
        parent = np.full(self.num_vertices, -1, dtype=np.int64)
        for v, kids in enumerate(self.children):
            parent[kids] = v
        return parent

    def levels(self):
        """Height of every vertex: 0 for a leaf, else 1 + the largest of its children's.

        This is the Cavs scheduling level: all vertices of one level form one batching task.
        """
        level = np.zeros(self.num_vertices, dtype=np.int64)
        for v, kids in enumerate(self.children):  # children first, so their levels are known
            if kids:
                level[v] = 1 + max(level[c] for c in kids)
        return level

    def height(self):
        """The root's level: 0 for a one-vertex tree, ``num_leaves - 1`` for a binary chain."""
        return int(self.levels()[-1])

    # -- printing ----------------------------------------------------------------------------

    def to_string(self, vocab=None):
        """The tree in PTB bracket format, ``(3 (2 The) (2 Rock))``.

        Leaf text comes from ``tokens``, else from ``vocab`` (a Vocabulary) applied to the word
        ids, else from the word ids themselves. Unlabelled vertices print as label -1.
        """
        leaf_order = self.leaves()
        if self.tokens is not None:
            text = dict(zip(leaf_order.tolist(), self.tokens))
        elif vocab is not None:
            text = {v: vocab.token(self.words[v]) for v in leaf_order.tolist()}
        else:
            text = {v: str(self.words[v]) for v in leaf_order.tolist()}
        parts, stack = [], [self.root]
        while stack:
            v = stack.pop()
            if v is None:  # closes the vertex opened last: glue ")" to the previous part
                parts[-1] += ")"
            elif self.children[v]:
                parts.append(f"({self.labels[v]}")
                stack.append(None)
                stack.extend(reversed(self.children[v]))
            else:
                parts.append(f"({self.labels[v]} {text[v]})")
        return " ".join(parts)

    def __repr__(self):
        return (f"Tree({self.num_vertices} vertices, {self.num_leaves} leaves, "
                f"root label {self.labels[-1]})")

    def __eq__(self, other):
        if not isinstance(other, Tree):
            return NotImplemented
        return (self.children == other.children and np.array_equal(self.words, other.words)
                and np.array_equal(self.labels, other.labels) and self.tokens == other.tokens)

    __hash__ = None  # mutable, compared by value


class TreebankSplits(NamedTuple):
    """A treebank's standard splits and the vocabulary their word ids refer to."""

    train: list
    dev: list
    test: list
    vocab: "Vocabulary"  # noqa: F821  (minicavs.data.vocab; a string to avoid a cycle)
