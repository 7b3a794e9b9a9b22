"""Generated tree shapes: complete binary trees and the random trees tests draw from."""

import numpy as np
import pytest

from minicavs.data import (DataError, Tree, chain_tree, complete_binary_tree, random_binary_tree,
                           random_nary_tree, random_tree)


def revalidate(tree):
    """Generators skip the constructor's checks; run them here."""
    return Tree(tree.children, tree.words, tree.labels, tree.tokens)


def test_complete_binary_tree_with_256_leaves():
    tree = revalidate(complete_binary_tree(256, rng=0, vocab_size=50))
    assert tree.num_vertices == 511 and tree.num_leaves == 256 and tree.height() == 8
    assert tree.leaves().tolist() == list(range(256))
    assert tree.children[256] == [0, 1] and tree.children[-1] == [508, 509]
    levels = tree.levels()
    assert np.all(np.diff(levels) >= 0)  # level by level from the leaves: each level one range
    assert tree.words[:256].min() >= 0 and tree.words[:256].max() < 50
    assert np.all(tree.words[256:] == -1) and np.all(tree.labels == -1)
    assert complete_binary_tree(1).num_vertices == 1
    with pytest.raises(DataError, match="power of two leaves, got 6"):
        complete_binary_tree(6)


def test_same_seed_same_tree_and_labels_on_request():
    assert complete_binary_tree(8, rng=3) == complete_binary_tree(8, rng=3)
    assert random_binary_tree(20, 3) == random_binary_tree(20, 3)
    assert random_binary_tree(20, 3) != random_binary_tree(20, 4)
    tree = random_nary_tree(30, 4, 5, num_classes=5, internal_words=True)
    assert tree.labels.min() >= 0 and tree.labels.max() < 5 and tree.words.min() >= 0
    generator = np.random.default_rng(7)
    assert random_tree(generator) != random_tree(generator)  # a Generator advances


def test_random_binary_trees_are_binary_with_leaves_in_order():
    for seed in range(50):
        tree = revalidate(random_binary_tree(1 + seed % 17, seed))
        assert tree.num_vertices == 2 * tree.num_leaves - 1
        assert all(len(kids) in (0, 2) for kids in tree.children)
        assert tree.leaves().tolist() == list(range(tree.num_leaves))


def test_random_nary_trees_respect_max_arity():
    arities = set()
    for seed in range(50):
        tree = revalidate(random_nary_tree(1 + seed, 3, seed))
        assert tree.num_vertices == 1 + seed
        arities.update(len(kids) for kids in tree.children)
    assert arities == {0, 1, 2, 3}
    assert random_nary_tree(10, 1, 0).height() == 9  # arity 1: a chain


def test_chain_is_a_sequence_with_a_word_everywhere():
    tree = revalidate(chain_tree(10_000, 0))  # deep: nothing may recurse
    assert tree.height() == 9_999 and tree.children[5] == [4] and tree.words.min() >= 0
    assert tree.leaves().tolist() == [0] and tree.parents()[-1] == -1


def test_random_tree_stays_within_its_size():
    kinds = set()
    for seed in range(60):
        tree = revalidate(random_tree(seed, max_vertices=12, num_classes=3))
        assert 1 <= tree.num_vertices <= 12
        kinds.add(max(len(k) for k in tree.children))
    assert kinds >= {1, 2, 3}
    with pytest.raises(DataError, match="unknown tree kind 'dag'"):
        random_tree(0, kinds=("dag",))


def test_printed_trees_parse_back_to_the_same_text():
    from minicavs.data import parse_tree

    for seed in range(40):
        tree = random_tree(seed, max_vertices=30, num_classes=5)
        tree.tokens = [f"w{i}" for i in range(tree.num_leaves)]
        text = tree.to_string()
        again = parse_tree(text, collapse_unary=False)
        assert again.to_string() == text and again.num_vertices == tree.num_vertices


def test_tokens_follow_sentence_order_not_vertex_ids():
    tree = Tree([[], [], [1, 0]], [5, 6, -1], [0, 1, 2], ["first", "second"])
    assert tree.leaves().tolist() == [1, 0]
    assert tree.to_string() == "(2 (1 first) (0 second))"
