"""Penn Treebank language-modelling text (Mikolov's preprocessing): one sentence a line.

The files already map rare words to ``<unk>`` (which becomes id 0, the Vocabulary's own
``<unk>``) and numbers to ``N``. Each sentence gets ``<eos>`` (id 1) appended, as in the
standard language-model setup, where the model also predicts the end of the sentence.
"""

from pathlib import Path
from typing import NamedTuple

import numpy as np

from .files import text_lines
from .tree import DataError
from .vocab import Vocabulary

EOS = "<eos>"
SPLITS = ("train", "valid", "test")


class PTBCorpus(NamedTuple):
    """Sentences (int64 id arrays ending in ``<eos>``) per split; None for a missing file."""

    train: list
    valid: list
    test: list
    vocab: Vocabulary


def read_ptb(path):
    """The sentences of a PTB file as token lists, each ending in ``<eos>``.

    Every line is one sentence; a blank line gives ``["<eos>"]``, as the usual reader (which
    replaces each newline by ``<eos>``) would. A file without a word (empty, or only blank
    lines) is refused: a model trained or scored on it would report a perplexity of nothing.
    """
    sentences = [line.split() + [EOS] for _, line in text_lines(path)]
    if not any(len(s) > 1 for s in sentences):
        raise DataError(f"{path}: no words in it ({len(sentences)} blank line(s)): nothing to "
                        f"train on or evaluate")
    return sentences


def load_ptb(directory, vocab=None):
    """Read ``ptb.{train,valid,test}.txt`` from ``directory`` (those that exist).

    Without a ``vocab`` one is built from every split found: PTB's vocabulary is closed (every
    file already uses the same 10k words plus ``<unk>``), so this leaks nothing from test.
    """
    directory = Path(directory)
    paths = {name: directory / f"ptb.{name}.txt" for name in SPLITS}
    found = {name: read_ptb(path) for name, path in paths.items() if path.is_file()}
    if not found:
        raise DataError(f"{directory}: no PTB file found (looked for "
                        f"{', '.join(p.name for p in paths.values())})")
    if vocab is None:
        vocab = Vocabulary.build((s for split in found.values() for s in split),
                                 specials=[EOS])
    encoded = {name: [vocab.encode(s) for s in found[name]] if name in found else None
               for name in SPLITS}
    return PTBCorpus(encoded["train"], encoded["valid"], encoded["test"], vocab)


def batch_sentences(sentences, batch_size, *, rng=None, by_length=False, drop_last=False):
    """Split ``sentences`` into lists of at most ``batch_size`` sentences.

    ``rng`` (a numpy Generator or a seed) shuffles; without it the order is kept. With
    ``by_length=True`` sentences of similar length share a batch (sorted by length, then cut),
    which wastes little padding; the batches themselves are then shuffled by ``rng``.
    ``drop_last`` drops a final batch smaller than ``batch_size``.
    """
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    rng = None if rng is None else np.random.default_rng(rng)
    order = np.arange(len(sentences))
    if rng is not None:
        order = rng.permutation(order)
    if by_length:  # stable: equal lengths keep the (shuffled) order
        order = order[np.argsort([len(sentences[i]) for i in order], kind="stable")]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    if by_length and rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return [[sentences[i] for i in batch] for batch in batches]


def pad_batch(sentences, pad_id=0):
    """Stack id sequences into ``(ids, lengths)``: ids (B, T) int64 padded with ``pad_id``
    after each sentence's end, T the longest length; lengths (B,) int64."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    ids = np.full((len(sentences), lengths.max(initial=0)), pad_id, dtype=np.int64)
    for row, sentence in enumerate(sentences):
        ids[row, :len(sentence)] = sentence
    return ids, lengths
