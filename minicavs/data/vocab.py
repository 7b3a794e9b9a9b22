"""A vocabulary: tokens <-> integer ids, with ``<unk>`` as id 0 for every token it lacks."""

import json
from collections import Counter
from pathlib import Path

import numpy as np

from .files import read_text
from .tree import DataError, Tree


class Vocabulary:
    """Maps tokens to ids ``0..len-1``; id 0 is always ``<unk>``, the id of unknown tokens.

    With ``lowercase=True`` every token is lowercased before it is added or looked up, so the
    choice travels with the vocabulary (and its saved file) instead of with each caller.
    """

    UNK = "<unk>"
    UNK_ID = 0

    def __init__(self, tokens=(), *, lowercase=False):
        self.lowercase = lowercase
        self._tokens = [self.UNK]
        self._ids = {self.UNK: self.UNK_ID}
        for token in tokens:
            self.add(token)

    @classmethod
    def build(cls, sentences, *, min_count=1, lowercase=False, specials=()):
        """A vocabulary of the tokens seen at least ``min_count`` times in ``sentences``.

        ``sentences`` is an iterable of token lists. ``specials`` (such as ``<eos>``) come
        right after ``<unk>``; then tokens by decreasing count, ties in alphabetical order, so
        the ids depend only on the counts and not on the order the sentences came in.
        """
        vocab = cls(specials, lowercase=lowercase)
        counts = Counter()
        for sentence in sentences:
            counts.update(vocab._normalise(t) for t in sentence)
        kept = [t for t, c in counts.items() if c >= min_count and t not in vocab._ids]
        for token in sorted(kept, key=lambda t: (-counts[t], t)):
            vocab.add(token)
        return vocab

    def _normalise(self, token):
        return token.lower() if self.lowercase else token

    def add(self, token):
        """Add ``token`` if it is new; return its id."""
        token = self._normalise(token)
        if token not in self._ids:
            self._ids[token] = len(self._tokens)
            self._tokens.append(token)
        return self._ids[token]

    def lookup(self, token):
        """The id of ``token``, or 0 (``<unk>``) if the vocabulary lacks it."""
        return self._ids.get(self._normalise(token), self.UNK_ID)

    def encode(self, tokens):
        """The ids of a sequence of tokens, as an int64 array."""
        ids = self._ids
        tokens = [t.lower() for t in tokens] if self.lowercase else list(tokens)
        return np.fromiter((ids.get(t, 0) for t in tokens), dtype=np.int64, count=len(tokens))

    def token(self, token_id):
        token_id = int(token_id)
        if not 0 <= token_id < len(self._tokens):
            raise DataError(f"word id {token_id} is outside this vocabulary's range "
                            f"0..{len(self._tokens) - 1}")
        return self._tokens[token_id]

    def decode(self, ids):
        return [self.token(i) for i in ids]

    def encode_tree(self, tree):
        """A tree like ``tree`` whose leaves carry the ids of its tokens (internal vertices: -1).

        It shares ``children``, ``labels`` and ``tokens`` with ``tree``; only ``words`` is new.
        """
        if tree.tokens is None:
            raise DataError("cannot encode a tree without tokens (tree.tokens is None)")
        words = np.full(tree.num_vertices, -1, dtype=np.int64)
        words[tree.leaves()] = self.encode(tree.tokens)
        return Tree._unchecked(tree.children, words, tree.labels, tree.tokens)

    @property
    def tokens(self):
        """All tokens in id order (a copy)."""
        return list(self._tokens)

    def __len__(self):
        return len(self._tokens)

    def __contains__(self, token):
        return self._normalise(token) in self._ids

    def __eq__(self, other):
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._tokens == other._tokens and self.lowercase == other.lowercase

    __hash__ = None

    def __repr__(self):
        return f"Vocabulary({len(self)} tokens, lowercase={self.lowercase})"

    # -- files -------------------------------------------------------------------------------

    def save(self, path):
        """Write JSON ``{"lowercase": ..., "tokens": [...]}``, tokens in id order."""
        data = {"lowercase": self.lowercase, "tokens": self._tokens}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=0), encoding="utf-8")

    @classmethod
    def load(cls, path):
        """Read a file written by :meth:`save`, or a plain list: one token a line, in id order.

        Either way the first token must be ``<unk>`` (id 0), and no token may appear twice.
        """
        text = read_text(path)
        if text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
                tokens, lowercase = data["tokens"], bool(data.get("lowercase", False))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise DataError(f"{path}: not a vocabulary file ({e}); expected JSON "
                                f'{{"lowercase": false, "tokens": ["<unk>", ...]}}') from None
        else:
            tokens, lowercase = text.splitlines(), False
        if not tokens or tokens[0] != cls.UNK:
            first = repr(tokens[0]) if tokens else "nothing"
            raise DataError(f"{path}: the first token must be {cls.UNK!r} (id 0), found {first}")
        vocab = cls(tokens[1:], lowercase=lowercase)
        if len(vocab) != len(tokens):
            seen = set()
            names = [vocab._normalise(t) for t in tokens]
            line = next(i for i, t in enumerate(names) if t in seen or seen.add(t))
            raise DataError(f"{path}: token {tokens[line]!r} (entry {line}) appears twice"
                            + (" after lowercasing" if lowercase else ""))
        return vocab
