"""Generated tree shapes: complete binary trees (the Tree-FC benchmark of the Cavs paper) and
random binary trees, n-ary trees and chains for tests.

Every generator takes ``rng``, a numpy Generator or an int seed (None: minicavs' own generator,
reseeded by ``mc.seed``), so the same seed gives the same tree. Leaves get random word ids in
``0..vocab_size-1``; internal vertices get -1 unless ``internal_words=True`` (child-sum models
over dependency trees and sequence models read a word at every vertex). Labels are random in
``0..num_classes-1``, or -1 everywhere when ``num_classes`` is None.
"""

import numpy as np

from ..backend import rng as _default_rng
from .tree import DataError, Tree


def _generator(rng):
    return _default_rng() if rng is None else np.random.default_rng(rng)


def _fill(children, rng, vocab_size, num_classes, internal_words):
    """Random words and labels for a tree of the given shape."""
    n = len(children)
    words = rng.integers(0, vocab_size, size=n, dtype=np.int64)
    if not internal_words:
        words[[v for v, kids in enumerate(children) if kids]] = -1
    labels = (np.full(n, -1, dtype=np.int64) if num_classes is None
              else rng.integers(0, num_classes, size=n, dtype=np.int64))
    return Tree._unchecked(children, words, labels, None)


def complete_binary_tree(num_leaves, rng=None, *, vocab_size=1000, num_classes=None,
                         internal_words=False):
    """A complete binary tree over ``num_leaves`` (a power of two) leaves: 2*num_leaves - 1
    vertices, numbered level by level from the leaves up, so each level is one id range."""
    if num_leaves < 1 or num_leaves & (num_leaves - 1):
        raise DataError(f"a complete binary tree needs a power of two leaves, got {num_leaves}")
    children = [[] for _ in range(num_leaves)]
    below, width = 0, num_leaves  # first id and size of the level below the one being built
    while width > 1:
        children.extend([below + 2 * i, below + 2 * i + 1] for i in range(width // 2))
        below, width = below + width, width // 2
    return _fill(children, _generator(rng), vocab_size, num_classes, internal_words)


def random_binary_tree(num_leaves, rng=None, *, vocab_size=1000, num_classes=None,
                       internal_words=False):
    """A random binary tree over ``num_leaves`` leaves in sentence order (ids 0..num_leaves-1).

    Built by merging a randomly chosen pair of neighbouring subtrees until one is left, so
    every bracketing is possible, from balanced trees to chains.
    """
    if num_leaves < 1:
        raise DataError(f"a tree needs at least one leaf, got num_leaves={num_leaves}")
    rng = _generator(rng)
    children = [[] for _ in range(num_leaves)]
    frontier = list(range(num_leaves))  # roots of the subtrees built so far, left to right
    while len(frontier) > 1:
        i = int(rng.integers(len(frontier) - 1))
        children.append([frontier[i], frontier[i + 1]])
        frontier[i:i + 2] = [len(children) - 1]
    return _fill(children, rng, vocab_size, num_classes, internal_words)


def random_nary_tree(num_vertices, max_arity, rng=None, *, vocab_size=1000, num_classes=None,
                     internal_words=False):
    """A random tree of ``num_vertices`` vertices, none with more than ``max_arity`` children.

    Each new vertex hangs under a random earlier vertex that still has room; the ids are then
    reversed so that children come before parents and the root is last.
    """
    if num_vertices < 1 or max_arity < 1:
        raise DataError(f"need num_vertices >= 1 and max_arity >= 1, got {num_vertices} "
                        f"and {max_arity}")
    rng = _generator(rng)
    top_down = [[] for _ in range(num_vertices)]  # vertex 0 is the root here
    open_slots = [0]  # vertices that can take another child
    for v in range(1, num_vertices):
        k = int(rng.integers(len(open_slots)))
        parent = open_slots[k]
        top_down[parent].append(v)
        if len(top_down[parent]) == max_arity:  # full: swap-remove it from the candidates
            open_slots[k] = open_slots[-1]
            open_slots.pop()
        open_slots.append(v)
    last = num_vertices - 1
    children = [[last - c for c in reversed(top_down[last - v])] for v in range(num_vertices)]
    return _fill(children, rng, vocab_size, num_classes, internal_words)


def chain_tree(length, rng=None, *, vocab_size=1000, num_classes=None, internal_words=True):
    """A chain: vertex v has the single child v-1 (a sequence, read by a recursive cell).

    Every vertex carries a word by default, as every position of a sentence does.
    """
    if length < 1:
        raise DataError(f"a chain needs at least one vertex, got length={length}")
    children = [[]] + [[v - 1] for v in range(1, length)]
    return _fill(children, _generator(rng), vocab_size, num_classes, internal_words)


def random_tree(rng=None, max_vertices=64, *, kinds=("binary", "nary", "chain"), max_arity=3,
                vocab_size=1000, num_classes=None):
    """A tree of a random kind from ``kinds`` with at most ``max_vertices`` vertices."""
    if max_vertices < 1:
        raise DataError(f"max_vertices must be at least 1, got {max_vertices}")
    rng = _generator(rng)
    kind = kinds[int(rng.integers(len(kinds)))]
    common = dict(vocab_size=vocab_size, num_classes=num_classes)
    if kind == "binary":
        return random_binary_tree(int(rng.integers(1, (max_vertices + 1) // 2 + 1)), rng,
                                  **common)
    if kind == "nary":
        return random_nary_tree(int(rng.integers(1, max_vertices + 1)), max_arity, rng, **common)
    if kind == "chain":
        return chain_tree(int(rng.integers(1, max_vertices + 1)), rng, **common)
    raise DataError(f"unknown tree kind {kind!r}; choose from 'binary', 'nary', 'chain'")
