"""The Stanford Sentiment Treebank: PTB-style trees with a sentiment label 0..4 on every node.

One tree a line, ``(3 (2 (2 The) (2 Rock)) (4 ...))``: a node is ``(label word)`` (a leaf) or
``(label child child ...)``. Brackets inside the text are escaped as ``-LRB-``/``-RRB-``; those
are ordinary words here. The parser is a tokenizer plus an explicit stack, so it is fast and
handles trees of any depth without recursion.

Unary chains such as ``(2 (3 word))`` do not occur in SST (it is binarised), but other treebanks
have them. By default they are collapsed into one vertex that keeps the *outer* label: both nodes
span the same words, and the outer one is the constituent its parent combines. Pass
``collapse_unary=False`` to keep every node (a vertex with one child).

Metrics: fine-grained accuracy compares 5-class labels; binary accuracy drops gold-neutral
sentences (label 2) and compares negative (0, 1) against positive (3, 4), as in the SST papers.

The papers' two protocols (:func:`sst_task`):

* ``fine`` — Socher et al. 2013 §5.1 and Tai et al. 2015 §5.1: 5 classes, trained on the labels
  of every phrase (all vertices, leaves included), scored on the sentences (roots). Socher et
  al.'s Table 1 also gives the accuracy over all phrases ("All"): :func:`phrase_accuracy`.
* ``binary`` — Socher et al. 2013 §5.1 ("the binary ... classification of sentences, where
  neutral sentences were removed") and Tai et al. 2015 §5.1 (6,920 / 872 / 1,821 sentences
  after removing the neutral ones): the neutral sentences are dropped from every split, the
  labels become 0 (negative: 0, 1) and 1 (positive: 3, 4), neutral *phrases* inside the kept
  sentences become unlabelled (-1), and a 2-class model is trained on the non-neutral phrases
  and scored on the roots. A 5-class model is scored on the same roots by comparing its
  negative and positive probability mass (:func:`polarity`).
* ``binary3`` — the binary task as Tai et al.'s code trains it (``sentiment/main.lua --binary``,
  ``util/read_data.lua``: ``remap_labels``; ``TreeLSTMSentiment:predict``): the same sentences
  as ``binary``, but every phrase keeps a label of 3 classes, 0 (negative: 0, 1), 1 (neutral)
  and 2 (positive: 3, 4), so the neutral phrases are trained on too; a root is scored by
  comparing the model's negative and positive outputs only (:func:`ternary_polarity`).
"""

import re
from pathlib import Path

import numpy as np

from ..errors import IndexRangeError, ShapeError
from .files import collector_paused, text_lines
from .tree import DataError, Tree, TreebankSplits
from .vocab import Vocabulary

# Tokens are split at ASCII whitespace only: SST has a few words with a no-break space inside
# (the film title "8\xa01\/2"), which Python's \s would split.
_TOKEN = re.compile(r"\(|\)|[^ \t\n\r\f\v()]+")
_LABEL = re.compile(r"-?[0-9]+")


def _error(text, token_index, source, line, message):
    """A DataError pointing at a token of ``text``: ``source:line:column: message``."""
    # Token positions are found again only here, so the parsing loop can use the faster findall.
    positions = [m.start() for m in _TOKEN.finditer(text)]
    column = positions[token_index] + 1 if token_index < len(positions) else len(text) + 1
    return DataError(f"{source}:{line}:{column}: {message}")


def _shown(token):
    return "the end of the line" if token is None else repr(token)


def parse_tree(text, vocab=None, *, collapse_unary=True, source="<string>", line=1,
               num_labels=None):
    """Parse one PTB-style tree into a :class:`Tree` (vertices numbered in post-order).

    Leaves get word ids from ``vocab`` if one is given, else -1 (encode them later with
    ``vocab.encode_tree``). Labels are integers (-1: unlabelled), in ``0..num_labels - 1`` if
    ``num_labels`` is given (SST: 5). ``source`` and ``line`` only label error messages.
    """
    tokens = _TOKEN.findall(text)
    count = len(tokens)
    children, labels, leaf_tokens = [], [], []
    stack = []  # open internal nodes: [label, child ids, index of their "(" token]
    root = None
    i = 0

    def fail(at, message):
        return _error(text, at, source, line, message)

    while i < count:
        token = tokens[i]
        if token == "(":
            if root is not None:
                raise fail(i, "unexpected '(' after the end of the tree (one tree a line)")
            label_token = tokens[i + 1] if i + 1 < count else None
            # ASCII digits only: int() also takes '٣', '+3' and '3_0', which no treebank means
            if label_token is None or not _LABEL.fullmatch(label_token):
                raise fail(i + 1, f"expected an integer label after '(', found "
                                  f"{_shown(label_token)} (a label is written in ASCII digits)")
            label = int(label_token)
            if num_labels is not None and not 0 <= label < num_labels:
                raise fail(i + 1, f"label {label} is out of range (valid: 0..{num_labels - 1})")
            body = tokens[i + 2] if i + 2 < count else None
            if body is None:
                raise fail(i + 2, "expected a word or '(' after the label, found the end of "
                                  "the line")
            if body == "(" or body == ")":
                stack.append([label, [], i])
                i += 2
                continue
            closing = tokens[i + 3] if i + 3 < count else None
            if closing != ")":
                raise fail(i + 3, f"expected ')' after the word {body!r} (a leaf holds one "
                                  f"word), found {_shown(closing)}")
            vertex = len(labels)
            children.append([])
            labels.append(label)
            leaf_tokens.append(body)
            i += 4
        elif token == ")":
            if not stack:
                raise fail(i, "unmatched ')'")
            label, kids, _ = stack.pop()
            if not kids:
                raise fail(i, "empty node: expected a word or '(' before ')'")
            if len(kids) == 1 and collapse_unary:
                vertex = kids[0]  # the newest vertex, so the root still ends up last
                labels[vertex] = label
            else:
                vertex = len(labels)
                children.append(kids)
                labels.append(label)
            i += 1
        else:
            where = ("after the end of the tree" if root is not None else
                     "before the tree" if not stack else
                     "inside a node (a node holds one word or child nodes, not both)")
            raise fail(i, f"expected '(' or ')' but found the word {token!r} {where}")
        if stack:
            stack[-1][1].append(vertex)
        else:
            root = vertex
    if stack:
        raise _error(text, stack[-1][2], source, line,
                     f"the node opened here is never closed ({len(stack)} ')' missing)")
    if root is None:
        raise DataError(f"{source}:{line}: expected a tree, found an empty line")
    words = np.full(len(labels), -1, dtype=np.int64)
    tree = Tree._unchecked(children, words, np.array(labels, dtype=np.int64), leaf_tokens)
    return vocab.encode_tree(tree) if vocab is not None else tree


def read_sst(path, vocab=None, *, collapse_unary=True, num_labels=5):
    """Parse every non-blank line of an SST file into a Tree; errors name the file and line.
    Labels must lie in ``0..num_labels - 1`` (SST's five sentiment classes)."""
    path = Path(path)
    with collector_paused():
        return [parse_tree(text, vocab, collapse_unary=collapse_unary, source=str(path),
                           line=number, num_labels=num_labels)
                for number, text in text_lines(path) if text.strip()]


def load_sst(directory, *, lowercase=False, min_count=1, collapse_unary=True, num_labels=5):
    """Read ``train.txt``, ``dev.txt`` and ``test.txt`` from ``directory``.

    The vocabulary is built from the training trees only (tokens seen at least ``min_count``
    times); dev and test words it lacks become ``<unk>``. Returns ``TreebankSplits(train, dev,
    test, vocab)``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: " + ("is a file, not a directory with train.txt, dev.txt "
                                            "and test.txt" if directory.exists()
                                            else "does not exist"))
    missing = [n for n in ("train.txt", "dev.txt", "test.txt") if not (directory / n).is_file()]
    if missing:
        raise DataError(f"{directory}: missing SST file(s) {', '.join(missing)}")
    raw = {name: read_sst(directory / f"{name}.txt", collapse_unary=collapse_unary,
                          num_labels=num_labels)
           for name in ("train", "dev", "test")}
    return rebuild_vocabulary(TreebankSplits(raw["train"], raw["dev"], raw["test"], None),
                              min_count=min_count, lowercase=lowercase)


def rebuild_vocabulary(splits, min_count=1, *, lowercase=False):
    """``splits`` with a new vocabulary, built from the training trees' tokens seen at least
    ``min_count`` times, and every tree's word ids re-encoded with it. The words dropped
    become ``<unk>`` in training too, so ``<unk>`` — the vector of every dev and test word the
    training set lacks — is trained on the rare words, not left at its random start."""
    if not isinstance(min_count, (int, np.integer)) or isinstance(min_count, bool) \
            or min_count < 1:
        raise DataError(f"rebuild_vocabulary: min_count must be an integer >= 1, got "
                        f"{min_count!r}")
    vocab = Vocabulary.build((t.tokens for t in splits.train), min_count=min_count,
                             lowercase=lowercase)
    encoded = [[vocab.encode_tree(t) for t in trees]
               for trees in (splits.train, splits.dev, splits.test)]
    return TreebankSplits(*encoded, vocab)


# -- metrics ---------------------------------------------------------------------------------

def root_labels(trees):
    """The root label of every tree, as an int64 array."""
    return np.fromiter((t.labels[-1] for t in trees), dtype=np.int64, count=len(trees))


def _labels(name, values, low, high):
    values = np.asarray(values)
    if values.ndim != 1:
        raise ShapeError(f"{name} must be a 1-D array of labels, got shape {values.shape}")
    if values.size and (values.min() < low or values.max() > high):
        bad = values[(values < low) | (values > high)][0]
        raise IndexRangeError(f"{name} holds label {bad}; labels here lie in {low}..{high}")
    return values.astype(np.int64)


def _same_length(predicted, gold):
    if predicted.shape != gold.shape:
        raise ShapeError(f"predicted has {predicted.shape[0]} labels but gold has "
                         f"{gold.shape[0]}; they must match one to one")


def to_binary(labels):
    """Map 5-class sentiment to binary: 0, 1 -> 0 (negative); 3, 4 -> 1 (positive); 2 -> -1."""
    labels = _labels("labels", labels, 0, 4)
    return np.array([0, 0, -1, 1, 1], dtype=np.int64)[labels]


def binary_labels(labels):
    """Labels of the binary task: 0, 1 -> 0; 3, 4 -> 1; neutral 2 and unlabelled -1 -> -1."""
    labels = _labels("labels", labels, -1, 4)
    return np.array([0, 0, -1, 1, 1, -1], dtype=np.int64)[labels]


def ternary_labels(labels):
    """Labels of Tai et al.'s binary training: 0, 1 -> 0; 2 -> 1; 3, 4 -> 2; unlabelled -1 stays."""
    labels = _labels("labels", labels, -1, 4)
    return np.array([0, 0, 1, 2, 2, -1], dtype=np.int64)[labels]


SST_TASKS = {"fine": 5, "binary": 2, "binary3": 3}  # task -> classes the model predicts


def sst_task(splits, task):
    """``splits`` (5-class SST, :func:`load_sst`) under one of the papers' protocols (module
    docstring): ``"fine"`` returns them unchanged; ``"binary"`` drops the trees whose root is
    neutral (or unlabelled) and relabels the rest with :func:`binary_labels`; ``"binary3"``
    drops the same trees and relabels the rest with :func:`ternary_labels`. The vocabulary
    stays the one built from all training trees."""
    if task not in SST_TASKS:
        raise DataError(f"unknown SST task {task!r}; the tasks are {sorted(SST_TASKS)}")
    if task == "fine":
        return splits

    relabel = binary_labels if task == "binary" else ternary_labels

    def binary(trees, name):
        kept = []
        for tree in trees:
            root = tree.labels[-1]  # the root is the last vertex
            if root >= 0 and root != 2:
                kept.append(Tree._unchecked(tree.children, tree.words, relabel(tree.labels),
                                            tree.tokens))
        if trees and not kept:  # refused now, not after training: nothing would be scored
            raise DataError(f"--task {task}: all {len(trees)} {name} trees have a neutral (or "
                            f"unlabelled) root, and the {task} task drops those: no {name} "
                            f"tree is left")
        return kept

    return TreebankSplits(binary(splits.train, "train"), binary(splits.dev, "dev"),
                          binary(splits.test, "test"), splits.vocab)


def polarity(probabilities):
    """The binary decision of a 5-class model: 1 (positive) where the mass of classes 3 and 4
    exceeds that of 0 and 1, else 0 — the neutral class takes no part."""
    probabilities = np.asarray(probabilities)
    if probabilities.ndim != 2 or probabilities.shape[1] != 5:
        raise ShapeError(f"polarity: expected (n, 5) class probabilities, got shape "
                         f"{probabilities.shape}")
    positive = probabilities[:, 3] + probabilities[:, 4]
    negative = probabilities[:, 0] + probabilities[:, 1]
    return (positive > negative).astype(np.int64)


def ternary_polarity(scores):
    """The binary decision of a model of :func:`ternary_labels`' 3 classes, as Tai et al.'s
    code makes it: 0 (negative) where the negative output exceeds the positive one, else 1;
    the neutral output takes no part. ``scores``: (n, 3) probabilities or log-probabilities."""
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[1] != 3:
        raise ShapeError(f"ternary_polarity: expected (n, 3) class scores, got shape "
                         f"{scores.shape}")
    return (scores[:, 0] <= scores[:, 2]).astype(np.int64)


def phrase_accuracy(predicted, gold):
    """Accuracy over every labelled phrase (vertex): gold label -1 is skipped. ``predicted``
    and ``gold`` are the labels of all vertices of a set of trees, in any one order."""
    predicted, gold = np.asarray(predicted, dtype=np.int64), np.asarray(gold, dtype=np.int64)
    _same_length(predicted, gold)
    keep = gold >= 0
    return float(np.mean(predicted[keep] == gold[keep])) if keep.any() else float("nan")


def fine_grained_accuracy(predicted, gold):
    """Fraction of 5-class predictions equal to the gold labels (0..4)."""
    predicted, gold = _labels("predicted", predicted, 0, 4), _labels("gold", gold, 0, 4)
    _same_length(predicted, gold)
    return float(np.mean(predicted == gold)) if gold.size else float("nan")


def binary_accuracy(predicted, gold, *, predicted_classes=5):
    """Binary accuracy on the gold-non-neutral items (SST's binary task).

    ``gold`` holds 5-class labels; items with gold label 2 are dropped. ``predicted`` holds
    5-class labels (``predicted_classes=5``; a neutral prediction counts as wrong — stricter
    than the papers, which compare positive against negative: pass the 0/1 output of
    :func:`polarity` with ``predicted_classes=2`` for theirs) or the 0/1 output of a binary
    classifier (``predicted_classes=2``).
    """
    gold = _labels("gold", gold, 0, 4)
    if predicted_classes == 5:
        predicted = to_binary(predicted)
    elif predicted_classes == 2:
        predicted = _labels("predicted", predicted, 0, 1)
    else:
        raise DataError(f"predicted_classes must be 5 or 2, got {predicted_classes}")
    _same_length(predicted, gold)
    keep = gold != 2
    if not keep.any():
        return float("nan")
    return float(np.mean(predicted[keep] == to_binary(gold[keep])))
