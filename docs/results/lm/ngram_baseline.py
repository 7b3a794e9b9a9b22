"""Count-based reference figures for the language-model rows of docs/results.md.

Trains on what the examples train on (PTB's valid file, as shipped here) and scores PTB's test
file the same way they do: per word, each sentence's <eos> a word. Two models:

* unigram, add-one smoothed over the vocabulary of both files (the examples' vocabulary);
* bigram, interpolated Kneser-Ney (Chen & Goodman 1998, one discount D = n1 / (n1 + 2 n2)),
  its unigram level the continuation counts interpolated with a uniform distribution, so
  words absent from training keep some probability. A sentence's first word is conditioned on
  <eos>, the end of the one before (the corpus read as one stream).

    python docs/results/lm/ngram_baseline.py /work/shared/data/ptb
"""

import math
import sys
from collections import Counter, defaultdict
from pathlib import Path


def sentences(path):
    return [line.split() + ["<eos>"] for line in Path(path).read_text().splitlines()]


def main(directory):
    train = sentences(Path(directory) / "ptb.valid.txt")
    test = sentences(Path(directory) / "ptb.test.txt")
    vocab = {w for s in train + test for w in s}
    stream = ["<eos>"] + [w for s in train for w in s]
    unigrams = Counter(stream[1:])
    bigrams = Counter(zip(stream, stream[1:]))
    total = sum(unigrams.values())

    followers = defaultdict(set)  # context -> the distinct words seen after it
    preceded_by = defaultdict(set)  # word -> the distinct contexts it followed
    for (u, w) in bigrams:
        followers[u].add(w)
        preceded_by[w].add(u)
    context_count = Counter()
    for (u, w), n in bigrams.items():
        context_count[u] += n
    n1 = sum(1 for n in bigrams.values() if n == 1)
    n2 = sum(1 for n in bigrams.values() if n == 2)
    discount = n1 / (n1 + 2 * n2)
    distinct_bigrams = len(bigrams)

    def continuation(w):  # interpolated with uniform: unseen words get a share of D
        seen = len(preceded_by[w])
        share = discount * len(unigrams) / distinct_bigrams
        return max(seen - discount, 0) / distinct_bigrams + share / len(vocab)

    def bigram(u, w):
        c = context_count[u]
        if c == 0:
            return continuation(w)
        backoff = discount * len(followers[u]) / c
        return max(bigrams[(u, w)] - discount, 0) / c + backoff * continuation(w)

    previous, uni_nll, bi_nll, words = "<eos>", 0.0, 0.0, 0
    for sentence in test:
        for w in sentence:
            uni_nll -= math.log((unigrams[w] + 1) / (total + len(vocab)))
            bi_nll -= math.log(bigram(previous, w))
            previous, words = w, words + 1
    print(f"trained on {total} words of ptb.valid.txt, scored {words} words of ptb.test.txt "
          f"(<eos> counted), vocabulary {len(vocab)}")
    print(f"unigram (add-one) perplexity {math.exp(uni_nll / words):.1f}")
    print(f"bigram (interpolated Kneser-Ney, D = {discount:.3f}) perplexity "
          f"{math.exp(bi_nll / words):.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data/ptb")
