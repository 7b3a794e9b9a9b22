"""Pretrained word vectors in GloVe's text format, loaded into an embedding table.

One word a line, then its values, separated by spaces: ``the 0.418 0.24968 -0.41242 ...``
(word2vec's text format has a first line ``count dim``; it is recognised and skipped). Both SST
papers report their best figures with such vectors (Socher et al. 2013 do not; Tai et al. 2015
use 300-d GloVe); none ship with minicavs, so ``--word-vectors PATH`` reads a user's file.
"""

import numpy as np

from .files import text_lines
from .tree import DataError


def load_word_vectors(path, vocab, table):
    """Copy the vector of every word of ``vocab`` found in the file ``path`` into its row of
    ``table`` (a (len(vocab), dim) NumPy array, changed in place); rows of words the file lacks
    keep their values. A vocabulary that lowercases looks its words up lowercased; the first
    vector of a word wins. Returns the number of vocabulary words matched.

    A line whose vector is not ``dim`` values long, or holds a value that is not a finite
    number (of a word the vocabulary has), raises :class:`DataError` naming the file and line
    (a file of another dimension stops at its first line, before anything is copied); so does
    a file without a single vector.
    """
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[0] != len(vocab):
        raise DataError(f"load_word_vectors: the table must have shape (len(vocab), dim) = "
                        f"({len(vocab)}, dim), got {table.shape}")
    dim = table.shape[1]
    found = {}  # vocabulary row -> its vector: the file's first for that word
    vector_lines = 0
    for number, line in text_lines(path):
        fields = line.rstrip("\n\r").split(" ")
        if number == 1 and len(fields) == 2 and all(f.isdigit() for f in fields):
            continue  # word2vec's header "count dim"
        if not line.strip():
            continue
        vector_lines += 1
        word, values = fields[0], [f for f in fields[1:] if f]
        if len(values) != dim:
            raise DataError(f"{path}:{number}: the vector of {word!r} has {len(values)} values; "
                            f"the embedding has dimension {dim} (set the embedding size to the "
                            f"file's, e.g. --embed-dim {len(values)})")
        row = vocab.lookup(word)
        if word not in vocab or row in found:
            continue
        try:
            vector = np.array(values, dtype=np.float64)
        except ValueError:
            raise DataError(f"{path}:{number}: the vector of {word!r} holds a value that is "
                            f"not a number") from None
        if not np.isfinite(vector).all():
            bad = values[int(np.flatnonzero(~np.isfinite(vector))[0])]
            raise DataError(f"{path}:{number}: the vector of {word!r} holds {bad!r}; word "
                            f"vectors must be finite numbers")
        found[row] = vector
    if not vector_lines:
        raise DataError(f"{path}: holds no word vectors (an empty file); expected lines "
                        f"'word value value ...'")
    if found:
        table[list(found)] = np.stack(list(found.values())).astype(table.dtype)
    return len(found)
