"""Models written the plain way — one sample at a time, op by op, with Python loops — as the
DyNet benchmark suite writes them. Run eagerly they compute one small op at a time; run inside
``with mc.autobatch(strategy):`` the same code is batched across the samples of a mini-batch
(``minicavs/autobatch``, ``docs/autobatch.md``).

* :class:`BiLSTMTagger`: word embeddings (128), a forward and a backward LSTM (256 each), an
  MLP (32, tanh) per word, softmax over the tags (dynet-benchmark ``bilstm-tagger.py``).
  ``char_lstm=True``: a word seen fewer than ``rare`` (5) times in training is represented by
  the final states of a forward and a backward character LSTM (character embedding 64, 64 per
  direction) instead of its embedding (``bilstm-tagger-withchar.py``).
* :class:`PlainTreeLSTM`: a binary Tree-LSTM over one tree, written recursively (E = H = 256;
  ``treenn.py``); the root's label is classified.

Every parameter is an ``mc.Parameter`` attribute; ``parameters()`` lists them.
"""

from collections import Counter

import numpy as np

from .. import ops
from ..autodiff import Parameter, tensor
from ..data.files import text_lines
from ..data.tree import DataError


def _uniform(rng, shape, dtype, scale=None):
    scale = np.sqrt(6.0 / sum(shape[-2:])) if scale is None else scale
    return Parameter(rng.uniform(-scale, scale, size=shape).astype(dtype))


class _Plain:
    def parameters(self):
        return [v for v in vars(self).values() if isinstance(v, Parameter)]


class _LSTM(_Plain):
    """One LSTM direction, a step per input: ``mc.lstm_step`` (gates [i, f, o, u] = x·W + h·U
    + b, then the cell) on the state [h, c], one node a step, as DyNet's ``VanillaLSTMBuilder``
    runs a step (``vanilla_lstm_gates``). ``hoist``: the input's part, x·W + b, as its own op
    (``mc.linear``) before the step — it does not wait for the previous step, so under
    autobatch it is one product over every step's input; the step adds h·U."""

    def __init__(self, rng, inputs, hidden, dtype, hoist=False):
        self.W = _uniform(rng, (inputs, 4 * hidden), dtype)
        self.U = _uniform(rng, (hidden, 4 * hidden), dtype)
        self.b = Parameter(np.zeros(4 * hidden, dtype))
        self.hidden, self.dtype, self.hoist = hidden, dtype, hoist
        self.initial = tensor(np.zeros(2 * hidden, dtype))  # [h, c]: data, shared by every run

    def run(self, xs):
        """The hidden state h after each input, in the order of ``xs``."""
        return [ops.slice_axis(state, 0, self.hidden) for state in self.states(xs)]

    def final(self, xs):
        """The hidden state h after the last input (a character LSTM's word vector: the
        states before it are not read, so no h of theirs is taken); with no input, the
        initial h (an empty word)."""
        states = self.states(xs)
        return ops.slice_axis(states[-1] if states else self.initial, 0, self.hidden)

    def states(self, xs):
        """The state [h, c] after each input."""
        state, out = self.initial, []
        for x in xs:
            if self.hoist:
                state = ops.lstm_step(ops.linear(x, self.W, self.b), state, self.U)
            else:
                state = ops.lstm_step(x, state, self.W, self.U, self.b)
            out.append(state)
        return out

    def parameters(self):
        return [self.W, self.U, self.b]


class BiLSTMTagger(_Plain):
    """Part-of-speech tagger, plain per-sentence code (see the module docstring).

    ``words``: the training words (to build the vocabulary and find the rare ones);
    ``tags``: the tag set; sentences are lists of ``(word, tag)``. ``hoist``: compute each
    LSTM's input projection before its steps (``_LSTM``); off by default, as DyNet's builder
    and the backward-batching paper's benchmark run it."""

    def __init__(self, words, tags, *, embed=128, hidden=256, mlp=32, char_lstm=False,
                 char_embed=64, rare=5, seed=0, dtype=np.float32, hoist=False):
        rng = np.random.default_rng(seed)
        counts = Counter(words)
        self.vocab = {w: i + 1 for i, w in enumerate(sorted(counts))}  # 0: unknown
        self.tag_ids = {t: i for i, t in enumerate(sorted(set(tags)))}
        self.rare = {w for w, n in counts.items() if n < rare} if char_lstm else set()
        self.char_lstm = char_lstm
        self.E = _uniform(rng, (len(self.vocab) + 1, embed), dtype, scale=0.1)
        self.fwd = _LSTM(rng, embed, hidden, dtype, hoist)
        self.bwd = _LSTM(rng, embed, hidden, dtype, hoist)
        self.W1 = _uniform(rng, (2 * hidden, mlp), dtype)
        self.b1 = Parameter(np.zeros(mlp, dtype))
        self.W2 = _uniform(rng, (mlp, len(self.tag_ids)), dtype)
        self.b2 = Parameter(np.zeros(len(self.tag_ids), dtype))
        if char_lstm:
            chars = sorted({ch for w in counts for ch in w})
            self.char_ids = {ch: i + 1 for i, ch in enumerate(chars)}
            self.C = _uniform(rng, (len(chars) + 1, char_embed), dtype, scale=0.1)
            self.cfwd = _LSTM(rng, char_embed, embed // 2, dtype, hoist)
            self.cbwd = _LSTM(rng, char_embed, embed // 2, dtype, hoist)
        self.dtype = dtype

    def parameters(self):
        own = [self.E, self.W1, self.b1, self.W2, self.b2] + self.fwd.parameters() + \
            self.bwd.parameters()
        if self.char_lstm:
            own += [self.C] + self.cfwd.parameters() + self.cbwd.parameters()
        return own

    def word_vector(self, word):
        if word in self.rare or (self.char_lstm and word not in self.vocab):
            chars = [ops.embedding(self.C, np.array(self.char_ids.get(ch, 0))) for ch in word]
            return ops.concat([self.cfwd.final(chars), self.cbwd.final(chars[::-1])])
        return ops.embedding(self.E, np.array(self.vocab.get(word, 0)))

    def scores(self, words):
        """Tag scores of each word of one sentence (a list of Tensors)."""
        xs = [self.word_vector(w) for w in words]
        forward = self.fwd.run(xs)
        backward = self.bwd.run(xs[::-1])[::-1]
        return [ops.linear(ops.tanh(ops.linear(ops.concat([f, b]), self.W1, self.b1)), self.W2,
                           self.b2) for f, b in zip(forward, backward)]

    def loss(self, sentence):
        """The summed tagging loss of one sentence (a list of (word, tag))."""
        words, tags = zip(*sentence)
        losses = [ops.softmax_cross_entropy(s, np.array(self.tag_ids[t]))
                  for s, t in zip(self.scores(words), tags)]
        return ops.add_n(losses)  # (dy.esum: batches across sentence lengths, see add_n)

    def tag(self, words):
        """The predicted tag of each word (forces the scores)."""
        names = sorted(self.tag_ids, key=self.tag_ids.get)
        return [names[int(np.argmax(s.numpy()))] for s in self.scores(words)]


class PlainTreeLSTM(_Plain):
    """Binary Tree-LSTM over one tree, written recursively (dynet-benchmark ``treenn.py``):
    a leaf's word embedding x gives [i, o, u] = x·W + b, c = σ(i)⊙tanh(u); an internal vertex
    with children (h_l, c_l), (h_r, c_r) gives [i, f_l, f_r, o, u] = [h_l, h_r]·U + b_U,
    c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r; h = σ(o)⊙tanh(c) (one ``mc.lstm_cell``). The
    root's h is classified.
    ``trees``: ``minicavs.data`` Trees (binary, children first, root last)."""

    def __init__(self, vocab_size, *, embed=256, hidden=256, labels=5, seed=0,
                 dtype=np.float32):
        rng = np.random.default_rng(seed)
        self.E = _uniform(rng, (vocab_size, embed), dtype, scale=0.1)
        self.W = _uniform(rng, (embed, 3 * hidden), dtype)
        self.bW = Parameter(np.zeros(3 * hidden, dtype))
        self.U = _uniform(rng, (2 * hidden, 5 * hidden), dtype)
        self.bU = Parameter(np.zeros(5 * hidden, dtype))
        self.O = _uniform(rng, (hidden, labels), dtype)
        self.bO = Parameter(np.zeros(labels, dtype))

    def encode(self, tree, v=None):
        """(h, c) of vertex ``v`` (default: the root), recursively."""
        v = len(tree.children) - 1 if v is None else v
        kids = tree.children[v]
        if not kids:
            x = ops.embedding(self.E, np.array(max(int(tree.words[v]), 0)))
            hc = ops.lstm_cell(ops.linear(x, self.W, self.bW))  # gates i, o, u
        else:
            (hl, cl), (hr, cr) = self.encode(tree, kids[0]), self.encode(tree, kids[-1])
            gates = ops.linear(ops.concat([hl, hr]), self.U, self.bU)  # i, fl, fr, o, u
            hc = ops.lstm_cell(gates, cl, cr)
        h, c = ops.split(hc, 2)
        return h, c

    def scores(self, tree):
        return ops.linear(self.encode(tree)[0], self.O, self.bO)

    def loss(self, tree):
        return ops.softmax_cross_entropy(self.scores(tree), np.array(int(tree.labels[-1])))


def read_tagged(path, limit=None):
    """Sentences of ``word|TAG word|TAG ...`` lines (the DyNet benchmark's tagging format),
    as lists of (word, tag); a token without a word or a tag is refused with its file:line."""
    sentences = []
    for number, line in text_lines(path):
        pairs = [token.rpartition("|") for token in line.split()]
        for word, bar, tag in pairs:
            if not (word and bar and tag):
                raise DataError(f"{path}:{number}: the token {word + bar + tag!r} is not "
                                f"word|TAG (a word, '|', a tag, neither empty)")
        if pairs:
            sentences.append([(word, tag) for word, _, tag in pairs])
        if limit and len(sentences) >= limit:
            break
    return sentences


def synthetic_tagged(num_sentences, seed=0, *, p_name=0.15):
    """``num_sentences`` part-of-speech tagged sentences of the synthetic treebank, in
    :func:`read_tagged`'s form (lists of ``(word, tag)``): the embedded default of the tagging
    examples and benchmarks, so they run without any data on disk.

    The sentences are :func:`minicavs.data.synthetic_treebank`'s (``seed``, an int or a numpy
    Generator, fixes them), read left to right; each word's universal POS tag comes from its
    word list (determiners DET, adjectives ADJ, nouns NOUN, copulas AUX, transitive verbs VERB,
    "and"/"but"/"yet" CCONJ, "not"/"never" PART, intensifiers ADV). With odds ``p_name`` a
    determiner and its noun become a name (PROPN, "Tamiro") made of random syllables: most
    names occur once or twice, so the character model of the tagger (rare words) and unknown
    words at test time have something to do. A tagger can reach 100 %; the most frequent tag
    alone (:func:`majority_tag_rate`) is the chance level to beat.
    """
    from ..data import synthetic as syn

    tag_of = {}
    for tag, lists in (("DET", [syn.DETERMINERS]), ("NOUN", [syn.NOUNS]),
                       ("ADJ", list(syn.ADJECTIVES_BY_SCORE.values())), ("AUX", [syn.COPULAS]),
                       ("VERB", [syn.TRANSITIVE_VERBS]), ("PART", [syn.NEGATORS]),
                       ("ADV", [syn.INTENSIFIERS]), ("CCONJ", [syn.CONJUNCTIONS, syn.CONTRASTS])):
        tag_of.update((word, tag) for words in lists for word in words)
    rng = np.random.default_rng(seed)
    trees, _ = syn.synthetic_treebank(num_sentences, rng)
    syllables = ("ka", "mi", "ro", "ta", "ne", "lo", "vi", "sa", "du", "re", "po", "li")
    sentences = []
    for tree in trees:
        tagged, tokens, i = [], tree.tokens, 0
        while i < len(tokens):
            if (tag_of[tokens[i]] == "DET" and i + 1 < len(tokens)
                    and tag_of[tokens[i + 1]] == "NOUN" and rng.uniform() < p_name):
                name = "".join(rng.choice(syllables, size=int(rng.integers(2, 4))))
                tagged.append((name.capitalize(), "PROPN"))
                i += 2
            else:
                tagged.append((tokens[i], tag_of[tokens[i]]))
                i += 1
        sentences.append(tagged)
    return sentences


def majority_tag_rate(sentences):
    """The share of words that carry the most frequent tag: the accuracy of always guessing it."""
    counts = Counter(tag for sentence in sentences for _, tag in sentence)
    return max(counts.values()) / max(sum(counts.values()), 1)
