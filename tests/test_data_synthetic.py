"""The synthetic sentiment treebank: deterministic, exactly labelled by its compositional rule,
and impossible to learn from bags of words.

Measured with the defaults (seeds below): the rule labels 100% of roots right; a multinomial
logistic regression on word counts gets ~32% of test roots (majority class ~29%); no function
of the bag of words at all can exceed ~79% (the adjective-swap argument below); rebuilding a
sentence as a random tree changes its root label ~46% of the time (~54% with its words shuffled
too). The asserts keep a margin of 10 points or more from each measurement.
"""


import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.sparse import csr_matrix

from minicavs.data import (DataError, Tree, make_splits, parse_tree, random_binary_tree,
                           root_labels, synthetic_labels, synthetic_treebank)
from minicavs.data import synthetic as syn

# -- an independent statement of the rule: recursive, by word lists, no shared code ----------

SCORE = {w: s for s, words in syn.ADJECTIVES_BY_SCORE.items() for w in words}
ROLE = {**{w: "not" for w in syn.NEGATORS}, **{w: "very" for w in syn.INTENSIFIERS},
        **{w: "but" for w in syn.CONTRASTS}}
NEUTRAL = set(syn.NOUNS + syn.DETERMINERS + syn.COPULAS + syn.TRANSITIVE_VERBS + ("and",))


def rule(tree, v, tokens_of_leaf):
    """(score, tag) of vertex v: tag is a function word's role, "but-phrase" or ""."""
    kids = tree.children[v]
    if not kids:
        word = tokens_of_leaf[v]
        assert word in SCORE or word in ROLE or word in NEUTRAL, word
        return SCORE.get(word, 0), ROLE.get(word, "")
    (a, a_tag), (b, b_tag) = (rule(tree, c, tokens_of_leaf) for c in kids)
    if a_tag == "not":
        return -b, ""
    if a_tag == "very":
        return max(-2, min(2, b + b)), ""
    if a_tag == "but":
        return b, "but-phrase"
    if b_tag == "but-phrase":
        return b, ""
    return max(-2, min(2, a + b)), ""


def rule_labels(tree):
    tokens_of_leaf = dict(zip(tree.leaves().tolist(), tree.tokens))
    return [rule(tree, v, tokens_of_leaf)[0] + 2 for v in range(tree.num_vertices)]


def with_tokens(tree, tokens):
    """The same shape with other leaf tokens, labelled by the module's rule."""
    relabelled = Tree(tree.children, tree.words, tree.labels, tokens)
    return synthetic_labels(relabelled)


# -- determinism and shape -------------------------------------------------------------------

def test_same_seed_same_treebank():
    first, vocab = synthetic_treebank(300, seed=5)
    second, _ = synthetic_treebank(300, seed=5)
    assert first == second
    assert synthetic_treebank(300, seed=6)[0] != first
    splits = make_splits(seed=1, sizes=(50, 20, 20))
    bigger = make_splits(seed=1, sizes=(80, 20, 20))
    assert splits.dev == bigger.dev and splits.test == bigger.test  # one stream per split
    assert splits.train == bigger.train[:50]


def test_trees_are_valid_encoded_and_labelled_everywhere():
    trees, vocab = synthetic_treebank(300, seed=0)
    for tree in trees:
        Tree(tree.children, tree.words, tree.labels, tree.tokens)  # validates
        assert all(len(kids) in (0, 2) for kids in tree.children)
        leaves = tree.leaves()
        assert vocab.decode(tree.words[leaves]) == tree.tokens  # no <unk>: ids match tokens
        assert np.all(np.delete(tree.words, leaves) == -1)
        assert tree.labels.min() >= 0 and tree.labels.max() <= 4
    roots = np.bincount(root_labels(trees), minlength=5) / len(trees)
    assert roots.min() > 0.08, f"every root class should be common, got {roots}"


# -- the labels are exactly the rule ---------------------------------------------------------

def test_every_label_equals_the_rule_recomputed_independently():
    trees, _ = synthetic_treebank(500, seed=2)
    trees += synthetic_treebank(200, seed=3, words_per_category=1, max_clauses=6)[0]
    for tree in trees:
        assert tree.labels.tolist() == rule_labels(tree), tree.to_string()


@pytest.mark.parametrize("text, root_label", [
    ("(- good)", 3),
    ("(- (- not) (- good))", 1),                       # negation flips its sibling
    ("(- (- very) (- good))", 4),                      # intensifier doubles, clipped
    ("(- (- very) (- excellent))", 4),
    ("(- (- not) (- (- very) (- good)))", 0),
    ("(- (- funny) (- (- but) (- dull)))", 1),         # the part after "but" wins
    ("(- (- awful) (- (- and) (- good)))", 1),         # otherwise scores add up
    ("(- (- (- not) (- good)) (- (- and) (- bad)))", 0),
    ("(- (- good) (- not))", 3),                       # a function word with no scope counts 0
])
def test_documented_examples(text, root_label):
    tree = parse_tree(text.replace("-", "-1"))
    assert synthetic_labels(tree)[-1] == root_label


def test_synthetic_labels_reject_what_the_rule_does_not_cover():
    with pytest.raises(DataError, match="token 'zebra' at leaf 0 is not a word"):
        synthetic_labels(parse_tree("(-1 zebra)"))
    with pytest.raises(DataError, match="vertex 3 has 3 children"):
        synthetic_labels(parse_tree("(-1 (-1 a) (-1 good) (-1 movie))"))


# -- structure is needed ---------------------------------------------------------------------

def word_counts(trees, vocab_size):
    counts = np.zeros((len(trees), vocab_size))
    for row, tree in enumerate(trees):
        np.add.at(counts[row], tree.words[tree.words >= 0], 1)
    # A constant column for the bias. Sparse, so the products below avoid multithreaded BLAS,
    # whose start-up costs seconds on small matrices when the cores are busy.
    return csr_matrix(np.hstack([counts, np.ones((len(trees), 1))]))


def fit_logistic_regression(x, y, num_classes=5, l2=1e-3):
    """Multinomial logistic regression by L-BFGS; returns the weight matrix."""
    n, d = x.shape
    onehot = np.eye(num_classes)[y]

    def loss_and_grad(flat):
        w = flat.reshape(d, num_classes)
        z = x @ w
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(n), y])) + l2 * np.sum(w[:-1] ** 2)
        grad = x.T @ (p - onehot) / n
        grad[:-1] += 2 * l2 * w[:-1]
        return loss, grad.ravel()

    result = minimize(loss_and_grad, np.zeros(d * num_classes), jac=True, method="L-BFGS-B",
                      options={"maxiter": 300})
    return result.x.reshape(d, num_classes)


def test_bag_of_words_logistic_regression_is_far_below_the_rule():
    """Measured: train ~39%, test ~32% root accuracy (majority class ~29%); the rule: 100%."""
    train, _, test, vocab = make_splits(seed=0, sizes=(3000, 0, 1000))
    w = fit_logistic_regression(word_counts(train, len(vocab)), root_labels(train))
    train_accuracy = np.mean(word_counts(train, len(vocab)).dot(w).argmax(1) == root_labels(train))
    test_accuracy = np.mean(word_counts(test, len(vocab)).dot(w).argmax(1) == root_labels(test))
    rule_accuracy = np.mean([rule_labels(t)[-1] == t.labels[-1] for t in test])
    assert rule_accuracy == 1.0
    assert test_accuracy < 0.45, f"bag of words reached {test_accuracy:.3f} on test roots"
    assert train_accuracy < 0.45, f"bag of words fits {train_accuracy:.3f} of train roots"


def test_no_bag_of_words_classifier_can_come_close():
    """An upper bound for *every* classifier that sees only the bag of words.

    Every adjective is drawn from the same distribution wherever it stands, so reversing the
    order of a sentence's adjectives (same tree, same other words) gives a sentence exactly as
    likely, with the same bag of words. Where the two root labels differ, a bag classifier
    gets at most one of the pair right, so its accuracy is at most 1 - P(label changes) / 2.
    Measured: P(change) ~0.42, so no bag classifier exceeds ~79%; the rule gets 100%.
    """
    trees, _ = synthetic_treebank(2000, seed=3)
    adjectives = set(SCORE)
    changed = 0
    for tree in trees:
        slots = [i for i, word in enumerate(tree.tokens) if word in adjectives]
        swapped = list(tree.tokens)
        for i, j in zip(slots, reversed(slots)):
            swapped[i] = tree.tokens[j]
        assert sorted(swapped) == sorted(tree.tokens)
        changed += with_tokens(tree, swapped)[-1] != tree.labels[-1]
    bound = 1 - changed / len(trees) / 2
    assert bound < 0.85, f"the bag-of-words bound is {bound:.3f}"


def test_random_trees_over_the_same_words_change_the_root_label():
    """Measured on 1000 sentences: a random tree over the same word sequence changes the root
    label of ~46%; with the words also shuffled, ~54%."""
    trees, _ = synthetic_treebank(1000, seed=4)
    rng = np.random.default_rng(0)
    same_order = shuffled = 0
    for tree in trees:
        shape = random_binary_tree(tree.num_leaves, rng)
        same_order += with_tokens(shape, tree.tokens)[-1] != tree.labels[-1]
        words = [tree.tokens[i] for i in rng.permutation(tree.num_leaves)]
        shuffled += with_tokens(shape, words)[-1] != tree.labels[-1]
    assert same_order / len(trees) > 0.35 and shuffled / len(trees) > 0.4, \
        (same_order / len(trees), shuffled / len(trees))
