"""An encoder-decoder: two vertex functions joined by push and pull (Cavs §3.1, the
"connecting two recursive structures" case).

The encoder reads each source sentence as a chain and pushes its states; the state of every
sentence's last vertex is its summary. The decoder is a chain over the target: at each step it
pulls [embedding of the previous target token, the source summary] — so the encoder's pushed
rows become the decoder's pulled rows through ordinary ops in between, and the gradient of the
decoder's loss flows back through pull, the take of rows, and push into the encoder.

:func:`reversal_task` makes the toy data: reverse a random sequence of tokens.
"""

from dataclasses import dataclass

import numpy as np

from .. import backend, ops, validate
from ..autodiff import no_grad
from ..nn import Embedding, Module
from ..vertex import GraphBatch, VertexFunction, grow
from .common import (Counts, as_ids, bias, chain, cross_entropy_sum, indices, lstm_bias, runner,
                     teacher_forced, weight)

PAD, BOS, EOS = 0, 1, 2  # special token ids; ordinary tokens are 3..vocab_size-1


@dataclass
class PairBatch(Counts):
    """Source and target chains. Decoder step t of pair i reads ``previous[t]`` and the
    summary of source ``pair_of_step[t]`` and predicts ``targets[t]``."""

    sources: GraphBatch
    source_ids: object  # (n_src, 1) int64 Tensor
    last_source_vertex: np.ndarray  # (pairs,) vertex of each source's last token
    targets_graphs: GraphBatch
    previous: np.ndarray  # (n_tgt,) int64: BOS, then the target shifted by one
    targets: np.ndarray  # (n_tgt,) int64
    pair_of_step: np.ndarray  # (n_tgt,) int64

    @property
    def num_samples(self):
        return self.sources.num_graphs


class Seq2Seq(Module):
    """LSTM encoder → summary [h, c] of the last source token → LSTM decoder fed the summary
    at every step (Cho et al., 2014), teacher-forced during training."""

    def __init__(self, vocab_size, embed_dim=32, hidden=64, dtype="float32"):
        E, H, V = int(embed_dim), int(hidden), int(vocab_size)
        self.vocab_size, self.embed_dim, self.hidden = V, E, H
        self.embedding = Embedding(V, E, dtype=dtype)  # shared by source and target tokens
        self.W_enc = weight((E, 4 * H), dtype, "W_enc")
        self.U_enc = weight((H, 4 * H), dtype, "U_enc")
        self.b_enc = lstm_bias(H, ["i", "f", "o", "u"], dtype, "b_enc")
        self.W_dec = weight((E + 2 * H, 4 * H), dtype, "W_dec")
        self.U_dec = weight((H, 4 * H), dtype, "U_dec")
        self.b_dec = lstm_bias(H, ["i", "f", "o", "u"], dtype, "b_dec")
        self.W_out = weight((H, V), dtype, "W_out")
        self.b_out = bias(V, dtype, "b_out")
        table, W_enc, U_enc, b_enc = self.embedding.weight, self.W_enc, self.U_enc, self.b_enc
        W_dec, U_dec, b_dec = self.W_dec, self.U_dec, self.b_dec

        def encoder(v):
            x = ops.reshape(ops.embedding(table, v.pull()), (E,))
            h_prev, c_prev = ops.split(v.gather(0), 2)
            h, c = ops.lstm_gates(x @ W_enc + h_prev @ U_enc + b_enc, c_prev)
            state = ops.concat([h, c])
            v.scatter(state)
            v.push(state)  # the caller keeps the last vertex's row: the sentence's summary

        def decoder(v):
            x = v.pull()  # [embedding of the previous token, source summary]
            h_prev, c_prev = ops.split(v.gather(0), 2)
            h, c = ops.lstm_gates(x @ W_dec + h_prev @ U_dec + b_dec, c_prev)
            v.scatter(ops.concat([h, c]))
            v.push(h)

        self.encoder = VertexFunction(encoder, pull_shape=(1,), pull_dtype="int64",
                                      scatter_shape=(2 * H,), push_shape=(2 * H,), arity=1,
                                      dtype=dtype)
        self.decoder = VertexFunction(decoder, pull_shape=(E + 2 * H,), scatter_shape=(2 * H,),
                                      push_shape=(H,), arity=1, dtype=dtype)

    def prepare(self, pairs):
        """A :class:`PairBatch` from (source ids, target ids) pairs; targets end in EOS."""
        sources = [np.asarray(s, np.int64) for s, _ in pairs]
        targets = [np.asarray(t, np.int64) for _, t in pairs]
        src = GraphBatch([chain(len(s)) for s in sources])
        tgt = GraphBatch([chain(len(t)) for t in targets])
        previous = np.concatenate([np.concatenate([[BOS], t[:-1]]) for t in targets])
        pair_of_step = np.repeat(np.arange(len(pairs)), [len(t) for t in targets])
        return PairBatch(src, as_ids(np.concatenate(sources)), src.offsets[1:] - 1, tgt,
                         previous, np.concatenate(targets), pair_of_step)

    def _summaries(self, batch, run):
        states = runner(run)(self.encoder, batch.sources, batch.source_ids)
        return ops.take_rows(states, indices(batch.last_source_vertex))  # (pairs, 2H)

    def _decode(self, summaries, graphs, previous, pair_of_step, run):
        words = ops.embedding(self.embedding.weight, indices(previous))
        pulled = ops.concat([words, ops.take_rows(summaries, indices(pair_of_step))], axis=-1)
        h = runner(run)(self.decoder, graphs, pulled)
        return h @ self.W_out + self.b_out

    def logits(self, batch, run=None):
        """Teacher-forced logits (n_tgt, V) of every target step."""
        return self._decode(self._summaries(batch, run), batch.targets_graphs, batch.previous,
                            batch.pair_of_step, run)

    def loss(self, batch, run=None):
        return cross_entropy_sum(self.logits(batch, run), batch.targets)

    def generate(self, batch, max_length):
        """Greedy decoding in linear time: the decoder chains are grown (``mc.grow``) one
        vertex per step, the decoder run once per step on the newest vertex of every
        unfinished pair, which reads its predecessor's state kept from the step before. A
        pair stops at EOS or after ``max_length`` tokens. Returns one id array per pair, EOS
        and what follows cut off."""
        validate.integer(max_length, "max_length", "Seq2Seq.generate", minimum=1)
        table, W_out, b_out = (p.numpy() for p in (self.embedding.weight, self.W_out,
                                                   self.b_out))
        with no_grad():
            summaries = self._summaries(batch, None).numpy()
        emitted = []  # per step: (pair, position, token) of every frontier vertex

        def next_token(frontier):
            xp = backend.get_array_module(frontier.push)
            token = xp.argmax(frontier.push @ xp.asarray(W_out) + xp.asarray(b_out), axis=-1)
            emitted.append((frontier.sample_of, frontier.vertex, backend.to_numpy(token)))
            go_on = backend.to_numpy((token != EOS)) & (frontier.vertex + 1 < max_length)
            keep = xp.asarray(np.flatnonzero(go_on))
            child_pull = xp.concatenate([xp.asarray(table)[token[keep]], xp.asarray(
                summaries)[xp.asarray(frontier.sample_of)[keep]]], axis=1)
            return go_on.astype(np.int64), child_pull

        pairs = batch.num_samples
        start = np.concatenate([np.repeat(table[BOS][None], pairs, axis=0), summaries], axis=1)
        with no_grad():
            grow(self.decoder, backend.to_device(start), next_token, max_vertices=max_length)
        tokens = np.full((pairs, max_length), EOS, np.int64)
        for pair, position, token in emitted:
            tokens[pair, position] = token
        result = []
        for row in tokens:
            end = np.flatnonzero(row == EOS)
            result.append(row[:end[0]] if end.size else row)
        return result

    def beam_search(self, batch, beam_size, max_length):
        """Beam search with ``mc.grow``: the hypotheses of all pairs form one growing forest
        (a vertex is a prefix, its children the extensions kept), so each step runs the
        decoder once on every live hypothesis of every pair. Per pair, the ``beam_size`` best
        extensions (summed log-probabilities) of its live hypotheses are kept; one ending in
        EOS, or reaching ``max_length`` tokens, is finished; a pair stops once it has
        ``beam_size`` finished hypotheses or none of its live ones can beat its best finished
        one (log-probabilities only fall). Returns per pair ``(tokens, log-probability)`` of
        its best finished hypothesis (EOS cut off; its log-probability counted)."""
        validate.integer(beam_size, "beam_size", "Seq2Seq.beam_search", minimum=1)
        validate.integer(max_length, "max_length", "Seq2Seq.beam_search", minimum=1)
        table, W_out, b_out = (p.numpy().astype(np.float64) for p in (
            self.embedding.weight, self.W_out, self.b_out))
        with no_grad():
            summaries = self._summaries(batch, None).numpy()
        pairs = batch.num_samples
        finished = [[] for _ in range(pairs)]  # (log-probability, vertex, last token or None)
        token_of = {}  # (pair, vertex) -> the token the hypothesis ends with
        live = {"score": np.zeros(pairs), "token": np.full(pairs, BOS)}  # rows of the frontier

        def extend(frontier):
            for (s, v), token in zip(zip(frontier.sample_of.tolist(), frontier.vertex.tolist()),
                                     live["token"].tolist()):
                token_of[s, v] = token
            logits = backend.to_numpy(frontier.push).astype(np.float64) @ W_out + b_out
            logits -= logits.max(axis=1, keepdims=True)
            log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            total = live["score"][:, None] + log_p
            kept_rows, kept_tokens = [], []
            starts = np.flatnonzero(np.r_[True, frontier.sample_of[1:] != frontier.sample_of[:-1]])
            for lo, hi in zip(starts, list(starts[1:]) + [len(frontier)]):
                s = int(frontier.sample_of[lo])
                done = finished[s]
                best = np.argsort(-total[lo:hi], axis=None, kind="stable")[:beam_size]
                rows, tokens = np.unravel_index(best, total[lo:hi].shape)
                for r, t in zip((rows + lo).tolist(), tokens.tolist()):
                    if len(done) >= beam_size or (done and max(d[0] for d in done) >= total[r, t]):
                        break  # sorted: no later candidate of this pair can do better
                    if t == EOS:
                        done.append((total[r, t], int(frontier.vertex[r]), None))
                    elif frontier.depth[r] + 1 >= max_length:
                        done.append((total[r, t], int(frontier.vertex[r]), t))
                    else:
                        kept_rows.append(r)
                        kept_tokens.append(t)
            order = np.argsort(kept_rows, kind="stable")  # children grouped by parent row
            kept_rows = np.asarray(kept_rows, np.int64)[order]
            kept_tokens = np.asarray(kept_tokens, np.int64)[order]
            live["score"] = total[kept_rows, kept_tokens]
            live["token"] = kept_tokens
            counts = np.bincount(kept_rows, minlength=len(frontier))
            child_pull = np.concatenate([table[kept_tokens],
                                         summaries[frontier.sample_of[kept_rows]]], axis=1)
            return counts, backend.to_device(child_pull.astype(summaries.dtype))

        start = np.concatenate([np.repeat(table[BOS][None], pairs, axis=0), summaries], axis=1)
        with no_grad():
            grown = grow(self.decoder, backend.to_device(start.astype(summaries.dtype)), extend,
                         max_vertices=beam_size * max_length + 1)
        result = []
        for s in range(pairs):
            score, vertex, last = max(finished[s], key=lambda d: d[0])
            tokens = [] if last is None else [last]
            while vertex > 0:  # up to the root (BOS)
                tokens.append(token_of[s, vertex])
                vertex = int(grown.parents[s][vertex])
            result.append((np.array(tokens[::-1], np.int64), float(score)))
        return result

    def evaluate(self, batches, pairs=None):
        """Teacher-forced ``loss`` and ``token_accuracy``; with the raw ``pairs`` (the list
        the batches were made from, in order) also greedy ``sequence_accuracy``."""
        loss, accuracy = teacher_forced(self, batches)
        result = {"loss": loss, "token_accuracy": accuracy}
        if pairs is not None:
            start, exact = 0, []
            for batch in batches:
                chunk = pairs[start:start + batch.num_samples]
                start += batch.num_samples
                longest = max(len(t) for _, t in chunk)
                for (_, target), decoded in zip(chunk, self.generate(batch, longest)):
                    exact.append(np.array_equal(decoded, target[:-1]))
            result["sequence_accuracy"] = float(np.mean(exact))
        return result


def reversal_task(num_pairs, vocab_size=12, min_length=1, max_length=8, rng=None):
    """Pairs (source, target): a random sequence of ordinary tokens and its reverse + EOS."""
    rng = np.random.default_rng(rng)
    pairs = []
    for _ in range(num_pairs):
        length = int(rng.integers(min_length, max_length + 1))
        source = rng.integers(EOS + 1, vocab_size, size=length)
        pairs.append((source, np.concatenate([source[::-1], [EOS]])))
    return pairs
