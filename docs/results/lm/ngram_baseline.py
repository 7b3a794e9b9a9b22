"""Count-based reference figures for the language-model rows of docs/results.md.

Trains and scores on what the examples do (``minicavs.training.language_model_corpus``): given
PTB's directory as shipped here, trained on ptb.valid.txt and scored on ptb.test.txt; given one
file, trained on its first nine tenths and scored on the last tenth (the split the epochs and
dropout of docs/results.md were chosen on). Per word, each sentence's <eos> a word. Two models:

* unigram, add-one smoothed over the vocabulary of both files (the examples' vocabulary);
* bigram, interpolated Kneser-Ney (Chen & Goodman 1998, one discount D = n1 / (n1 + 2 n2)),
  its unigram level the continuation counts interpolated with a uniform distribution, so
  words absent from training keep some probability. A sentence's first word is conditioned on
  <eos>, the end of the one before (the corpus read as one stream).

    python docs/results/lm/ngram_baseline.py /work/shared/data/ptb
    python docs/results/lm/ngram_baseline.py /work/shared/data/ptb/ptb.valid.txt
"""

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path


def sentences(path):
    return [line.split() + ["<eos>"] for line in Path(path).read_text().splitlines()]


def splits(path):
    """(training sentences, held-out sentences, what they are) as the examples split them."""
    path = Path(path)
    if path.is_dir():
        return (sentences(path / "ptb.valid.txt"), sentences(path / "ptb.test.txt"),
                "ptb.valid.txt, scored on ptb.test.txt")
    lines = sentences(path)
    cut = len(lines) * 9 // 10
    return lines[:cut], lines[cut:], f"the first nine tenths of {path.name}, scored on the rest"


def kneser_ney_bigram(train, vocab):
    """``(probability(u, w), discount)``: the interpolated Kneser-Ney bigram model of the
    ``train`` sentences over ``vocab``, the corpus read as one stream that starts after an
    <eos>."""
    stream = ["<eos>"] + [w for s in train for w in s]
    bigrams = Counter(zip(stream, stream[1:]))
    followers = defaultdict(set)  # context -> the distinct words seen after it
    preceded_by = defaultdict(set)  # word -> the distinct contexts it followed
    context_count = Counter()
    for (u, w), n in bigrams.items():
        followers[u].add(w)
        preceded_by[w].add(u)
        context_count[u] += n
    n1 = sum(1 for n in bigrams.values() if n == 1)
    n2 = sum(1 for n in bigrams.values() if n == 2)
    discount = n1 / (n1 + 2 * n2)
    distinct = len(bigrams)
    uniform_share = discount * len(preceded_by) / distinct  # what the discounts set aside

    def continuation(w):  # unseen words get their share of the discounts, uniformly
        return max(len(preceded_by[w]) - discount, 0) / distinct + uniform_share / len(vocab)

    def probability(u, w):
        c = context_count[u]
        if c == 0:
            return continuation(w)
        backoff = discount * len(followers[u]) / c
        return max(bigrams[(u, w)] - discount, 0) / c + backoff * continuation(w)

    return probability, discount


def main(path):
    train, test, described = splits(path)
    vocab = {w for s in train + test for w in s}
    unigrams = Counter(w for s in train for w in s)
    total = sum(unigrams.values())
    bigram, discount = kneser_ney_bigram(train, vocab)
    previous, uni_nll, bi_nll, words = "<eos>", 0.0, 0.0, 0
    for sentence in test:
        for w in sentence:
            uni_nll -= math.log((unigrams[w] + 1) / (total + len(vocab)))
            bi_nll -= math.log(bigram(previous, w))
            previous, words = w, words + 1
    print(f"trained on {total} words of {described}: {words} words (<eos> counted), "
          f"vocabulary {len(vocab)}")
    print(f"unigram (add-one) perplexity {math.exp(uni_nll / words):.1f}")
    print(f"bigram (interpolated Kneser-Ney, D = {discount:.3f}) perplexity "
          f"{math.exp(bi_nll / words):.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/ptb")
