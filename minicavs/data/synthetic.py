"""A synthetic sentiment treebank whose labels are an exact function of the tree.

It is the embedded default dataset: generated in code in well under a second, deterministic for
a seed, labelled 0..4 at every vertex like SST, and built so that the tree structure is needed
to get the sentence label right.

**Words.** Adjectives carry a score: strong positive +2, positive +1, neutral 0, negative -1,
strong negative -2. Nouns, determiners, verbs and "and" score 0. Three kinds of function words
act on their right sibling: negators ("not", "never"), intensifiers ("very", ...) and contrast
words ("but", "yet").

**The rule.** Every vertex gets a score in -2..2 (label = score + 2) and a kind, bottom-up.
A leaf takes its word's score (0 for function words) and kind. A vertex with children L, R:

1. L is a negator:          score = -score(R)                 ("not good" = -1)
2. L is an intensifier:      score = clip(2 * score(R))        ("very good" = +2)
3. L is a contrast word:     score = score(R), kind "contrast phrase"     ("but dull" = -1)
4. R is a contrast phrase:   score = score(R)                  ("funny but dull" = -1)
5. otherwise:                score = clip(score(L) + score(R)) (function words count 0)

where clip limits to -2..2. A vertex with one child copies it; more children are not allowed.
The rule is total: it labels *any* binary tree over these words, which the tests use to show
that rearranging a sentence's tree changes its label.

**Why a bag of words fails.** Negation flips the sign of its scope only (an XOR of "not" and
the adjective, which no linear model of counts can represent), a contrast word erases all that
precedes it, and clipping makes sums saturate; which words fall inside which scope is visible
only in the tree. Measured in the tests: a logistic regression on word counts gets ~32% of the
roots right (the majority class alone ~29%), and no classifier of the bag of words at all can
pass ~79% (swapping adjectives between slots keeps the bag and the odds but not the label);
the rule gets 100%.

**Sentences** come from a small grammar, so they read like review snippets: clauses
"NP VP" ("the (very charming) plot", "is (not dull)", "never (delivers (a (good story)))")
joined right-branching by "and" or a contrast word.
"""

import numpy as np

from .files import collector_paused
from .tree import DataError, Tree, TreebankSplits
from .vocab import Vocabulary

STRONG_POSITIVE = ("excellent", "brilliant", "wonderful", "superb", "masterful", "delightful",
                   "gorgeous", "riveting")
POSITIVE = ("good", "nice", "funny", "charming", "clever", "pleasant", "solid", "likable",
            "warm", "smart")
NEUTRAL_ADJECTIVES = ("long", "french", "new", "old", "familiar", "quiet", "animated", "recent")
NEGATIVE = ("bad", "dull", "boring", "silly", "weak", "flat", "tedious", "messy", "bland",
            "clumsy")
STRONG_NEGATIVE = ("awful", "terrible", "dreadful", "horrible", "painful", "unwatchable",
                   "abysmal", "atrocious")
NOUNS = ("movie", "film", "plot", "story", "acting", "script", "cast", "director", "ending",
         "score", "dialogue", "soundtrack", "characters", "sequel", "premise", "photography")
DETERMINERS = ("the", "this", "its", "a", "that")
COPULAS = ("is", "was", "seems", "feels", "looks")
TRANSITIVE_VERBS = ("has", "offers", "delivers", "features")
CONJUNCTIONS = ("and",)
NEGATORS = ("not", "never")
INTENSIFIERS = ("very", "really", "truly", "extremely")
CONTRASTS = ("but", "yet")

# Kinds of vertices. A leaf's kind is its word's role; an internal vertex is PHRASE or, after
# a contrast word, CONTRAST_PHRASE.
PHRASE, NEGATOR, INTENSIFIER, CONTRAST, CONTRAST_PHRASE = range(5)

ADJECTIVES_BY_SCORE = {2: STRONG_POSITIVE, 1: POSITIVE, 0: NEUTRAL_ADJECTIVES, -1: NEGATIVE,
                       -2: STRONG_NEGATIVE}


def _lexicon():
    meaning = {}
    for score, words in ADJECTIVES_BY_SCORE.items():
        meaning.update((w, (score, PHRASE)) for w in words)
    for words in (NOUNS, DETERMINERS, COPULAS, TRANSITIVE_VERBS, CONJUNCTIONS):
        meaning.update((w, (0, PHRASE)) for w in words)
    for words, kind in ((NEGATORS, NEGATOR), (INTENSIFIERS, INTENSIFIER), (CONTRASTS, CONTRAST)):
        meaning.update((w, (0, kind)) for w in words)
    return meaning


LEXICON = _lexicon()  # word -> (score, kind) of a leaf holding it


def _clip(score):
    return -2 if score < -2 else 2 if score > 2 else score


def compose(left, right):
    """The (score, kind) of a vertex from its children's; rules 1-5 of the module docstring."""
    (left_score, left_kind), (right_score, right_kind) = left, right
    if left_kind == NEGATOR:
        return -right_score, PHRASE
    if left_kind == INTENSIFIER:
        return _clip(2 * right_score), PHRASE
    if left_kind == CONTRAST:
        return right_score, CONTRAST_PHRASE
    if right_kind == CONTRAST_PHRASE:
        return right_score, PHRASE
    return _clip(left_score + right_score), PHRASE


def synthetic_labels(tree):
    """The label (score + 2, in 0..4) the rule gives every vertex of ``tree``.

    ``tree.tokens`` must hold words of :data:`LEXICON`; the tree may have any binary shape.
    """
    if tree.tokens is None:
        raise DataError("synthetic_labels needs the tree's tokens (tree.tokens is None)")
    meaning = [None] * tree.num_vertices
    for v, token in zip(tree.leaves().tolist(), tree.tokens):
        if token not in LEXICON:
            raise DataError(f"token {token!r} at leaf {v} is not a word of the synthetic "
                            f"treebank's lexicon")
        meaning[v] = LEXICON[token]
    for v, kids in enumerate(tree.children):  # children first: their meanings are ready
        if len(kids) == 1:
            meaning[v] = meaning[kids[0]]
        elif len(kids) == 2:
            meaning[v] = compose(meaning[kids[0]], meaning[kids[1]])
        elif kids:
            raise DataError(f"vertex {v} has {len(kids)} children; the synthetic rule is "
                            f"defined for binary trees")
    return np.array([score + 2 for score, _ in meaning], dtype=np.int64)


# -- generation ------------------------------------------------------------------------------

class _Draws:
    """Uniform numbers from a numpy Generator, drawn in blocks: one numpy call per few
    thousand choices instead of one per choice keeps generation fast."""

    def __init__(self, rng):
        self.rng, self.block, self.next = rng, [], 0

    def uniform(self):
        if self.next == len(self.block):
            self.block, self.next = self.rng.random(4096).tolist(), 0
        self.next += 1
        return self.block[self.next - 1]

    def choice(self, options):
        return options[int(self.uniform() * len(options))]


class _Grammar:
    """Random sentences as nested pairs: a word is a str, a constituent a (left, right) tuple."""

    # How often an adjective has each score: equal odds for positive and negative, so that
    # the sign of the sentence is decided by the composition and not by a skewed lexicon.
    SCORE_ODDS = ((2, 0.15), (1, 0.22), (0, 0.26), (-1, 0.22), (-2, 0.15))

    def __init__(self, draws, *, words_per_category, p_negate, p_intensify, p_contrast,
                 p_more_clauses, max_clauses):
        self.draws = draws
        self.p_negate, self.p_intensify, self.p_contrast = p_negate, p_intensify, p_contrast
        self.p_more_clauses, self.max_clauses = p_more_clauses, max_clauses
        k = words_per_category
        self.adjectives = {s: words[:k] for s, words in ADJECTIVES_BY_SCORE.items()}
        self.nouns, self.determiners = NOUNS[:k], DETERMINERS[:k]
        self.copulas, self.verbs = COPULAS[:k], TRANSITIVE_VERBS[:k]
        self.negators, self.intensifiers = NEGATORS[:k], INTENSIFIERS[:k]
        self.contrasts = CONTRASTS[:k]

    def sentence(self):
        clauses = 1
        while clauses < self.max_clauses and self.draws.uniform() < self.p_more_clauses:
            clauses += 1
        tree = self.clause()
        for _ in range(clauses - 1):  # right-branching: "A and (B but C)" = (A (and (B (but C))))
            joiner = (self.draws.choice(self.contrasts) if self.draws.uniform() < self.p_contrast
                      else "and")
            tree = (self.clause(), (joiner, tree))
        return tree

    def clause(self):
        return (self.noun_phrase(), self.verb_phrase())

    def noun_phrase(self):
        d = self.draws
        noun = d.choice(self.nouns)
        if d.uniform() < 0.5:
            return (d.choice(self.determiners), noun)
        return (d.choice(self.determiners), (self.adjective_phrase(depth=1), noun))

    def verb_phrase(self, depth=0):
        d = self.draws
        u = d.uniform()
        if u < 0.15 and depth == 0:
            return (d.choice(self.negators), self.verb_phrase(depth + 1))
        if u < 0.6:
            return (d.choice(self.copulas), self.adjective_phrase())
        return (d.choice(self.verbs), self.noun_phrase())

    def adjective_phrase(self, depth=0):
        d = self.draws
        if depth < 3:
            u = d.uniform()
            if u < self.p_negate:
                return (d.choice(self.negators), self.adjective_phrase(depth + 1))
            if u < self.p_negate + self.p_intensify:
                return (d.choice(self.intensifiers), self.adjective_phrase(depth + 1))
            if u < self.p_negate + self.p_intensify + 0.1:  # "funny and (not clever)"
                return (self.adjective_phrase(depth + 1),
                        ("and", self.adjective_phrase(depth + 1)))
        u, total = d.uniform(), 0.0
        for score, odds in self.SCORE_ODDS:
            total += odds
            if u < total:
                break
        return d.choice(self.adjectives[score])


def synthetic_vocabulary():
    """The treebank's vocabulary: ``<unk>``, then every word of :data:`LEXICON` (fixed ids)."""
    return Vocabulary(LEXICON)


def _to_tree(nested, vocab):
    """Number a nested sentence in post-order (children first, leaves in sentence order), and
    label it in the same pass: :func:`synthetic_labels` of the tree, without reading it again
    (a third of the treebank's time went to that second pass)."""
    children, tokens, leaves, meaning = [], [], [], []

    def add(node):  # recursion depth is bounded by the grammar (a few dozen at most)
        if type(node) is str:
            tokens.append(node)
            leaves.append(len(children))
            children.append([])
            meaning.append(LEXICON[node])
        else:
            left = add(node[0])
            right = add(node[1])
            children.append([left, right])
            meaning.append(compose(meaning[left], meaning[right]))
        return len(children) - 1

    add(nested)
    words = np.full(len(children), -1, dtype=np.int64)
    words[leaves] = vocab.encode(tokens)
    labels = np.fromiter((score + 2 for score, _ in meaning), np.int64, len(meaning))
    return Tree._unchecked(children, words, labels, tokens)


def synthetic_treebank(num_trees, seed=0, *, words_per_category=None, p_negate=0.3,
                       p_intensify=0.2, p_contrast=0.5, p_more_clauses=0.55, max_clauses=4):
    """``num_trees`` labelled sentences and the vocabulary: ``(trees, vocab)``.

    ``seed`` (an int or a numpy Generator) fixes every tree. ``words_per_category`` keeps only
    the first k words of each word list (k=1: a tiny vocabulary, whose sentences repeat).
    ``p_negate``/``p_intensify`` are the odds of an adjective phrase being negated/intensified,
    ``p_contrast`` that two clauses are joined by "but"/"yet" rather than "and",
    ``p_more_clauses`` that a sentence gets another clause, up to ``max_clauses``.
    """
    if words_per_category is not None and words_per_category < 1:
        raise DataError(f"words_per_category must be at least 1, got {words_per_category}")
    grammar = _Grammar(_Draws(np.random.default_rng(seed)), words_per_category=words_per_category,
                       p_negate=p_negate, p_intensify=p_intensify, p_contrast=p_contrast,
                       p_more_clauses=p_more_clauses, max_clauses=max_clauses)
    vocab = synthetic_vocabulary()
    with collector_paused():
        return [_to_tree(grammar.sentence(), vocab) for _ in range(num_trees)], vocab


def make_splits(seed=0, sizes=(8544, 1101, 2210), **options):
    """Train/dev/test treebanks, SST-sized by default: ``TreebankSplits(train, dev, test, vocab)``.

    Each split has its own random stream derived from ``seed``, so changing the size of one
    split leaves the others as they were. ``options`` go to :func:`synthetic_treebank`.
    """
    streams = np.random.SeedSequence(seed).spawn(3)
    splits = [synthetic_treebank(size, np.random.default_rng(stream), **options)[0]
              for size, stream in zip(sizes, streams)]
    return TreebankSplits(*splits, synthetic_vocabulary())
