"""LSTM language models, the two sequence models of Cavs §5:

* :class:`VarLSTMLanguageModel` — sentences of any length, each a chain graph read by an LSTM
  vertex function (Var-LSTM): a batch costs as many levels as its longest sentence, and a level
  holds only the sentences still running, so no padding is ever computed.
* :class:`FixedLSTMLanguageModel` — a 64-step LSTM written as a *static* graph: the unrolled
  steps are traced once with ``mc.symbolic`` (Fixed-LSTM, static declaration, Cavs Fig. 2a).

Both predict each next token; sentences are int64 id arrays ending in ``<eos>``, which also
serves as the start symbol fed before the first word (the usual PTB convention).
"""

import math
from dataclasses import dataclass

import numpy as np

from .. import backend, ops
from ..data import DataError
from ..errors import ShapeError
from ..autodiff import no_grad, spec, tensor
from ..vertex import symbolic
from ..nn import Embedding, Module, dropout
from ..vertex import GraphBatch, VertexFunction
from .common import Counts, as_ids, bias, chain, cross_entropy_sum, lstm_bias, runner, weight


@dataclass
class SentenceBatch(Counts):
    """Sentences as chain graphs: vertex t of a sentence reads ``inputs[t]`` (the previous
    token) and predicts ``targets[t]``."""

    graphs: GraphBatch
    inputs: object  # (n, 1) int64 Tensor
    targets: np.ndarray  # (n,) int64


class _LanguageModel(Module):
    """What both language models share: the range of ``dropout``, the parameters (embedding,
    LSTM gates, softmax layer) and evaluation.

    With ``tie_weights`` the softmax layer's weights are the embedding table, transposed
    (Press & Wolf 2017; Inan et al. 2017): a word's output vector is its input vector, which
    needs E = H and halves the parameters that grow with the vocabulary."""

    def _parameters(self, V, E, H, dtype, dropout, tie_weights):
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        if tie_weights and E != H:
            raise ValueError(f"{type(self).__name__}: tie_weights needs embed_dim == hidden "
                             f"(the softmax weights are the embedding table), got {E} and {H}")
        self.dropout, self.tie_weights = float(dropout), bool(tie_weights)
        self.embedding = Embedding(V, E, dtype=dtype)
        self.W = weight((E, 4 * H), dtype, "W")
        self.U = weight((H, 4 * H), dtype, "U")
        self.b = lstm_bias(H, ["i", "f", "o", "u"], dtype, "b")
        if not tie_weights:
            self.W_out = weight((H, V), dtype, "W_out")
        self.b_out = bias(V, dtype, "b_out")

    def _output_weights(self):
        """The (H, V) weights of the softmax layer: ``W_out``, or the tied embedding table."""
        return self.embedding.weight.T if self.tie_weights else self.W_out

    def evaluate(self, batches):
        """``{"loss": per token, "perplexity"}`` over prepared batches, in eval mode (no
        dropout); the mode it found is restored."""
        total, count = 0.0, 0
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for batch in batches:
                    total += self.loss(batch).item()
                    count += batch.num_targets
        finally:
            self.train(was_training)
        loss = total / max(count, 1)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


class VarLSTMLanguageModel(_LanguageModel):
    """An LSTM over variable-length sentences, one chain graph per sentence.

    The vertex function pulls the embedding of its input token, gathers the previous step's
    [h, c] (zero at the first word), scatters the new [h, c] and pushes h. The softmax layer
    is applied *outside* F, as one (n, H) x (H, V) product over every word of the batch: inside
    F it would be the same product (lazy batching hoists it out of the level loop anyway), but
    F would then copy the (n, V) logits into the caller's order, and ∂F their (n, V) gradient
    back, where pushing h copies (n, H). Measured on 640 PTB sentences (V = 7,596, E = H = 128,
    batch 64, one core): 2.5-2.9 s per forward+backward pass with h pushed, 3.0 s with logits.

    ``dropout`` (Zaremba et al. 2014: dropout on the connections that are not recurrent) drops
    the word vectors entering the LSTM and the states entering the softmax layer, in training
    only. A traced F cannot draw masks, so with dropout the vectors are looked up and dropped
    before F, which pulls them instead of word ids; the recurrent [h, c] is never dropped.
    ``tie_weights`` makes the softmax weights the embedding table (:class:`_LanguageModel`).
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, dtype="float32", bos_id=1,
                 dropout=0.0, tie_weights=False):
        E, H, V = int(embed_dim), int(hidden), int(vocab_size)
        self.vocab_size, self.embed_dim, self.hidden, self.bos_id = V, E, H, int(bos_id)
        self._parameters(V, E, H, dtype, dropout, tie_weights)
        table, W, U, b = self.embedding.weight, self.W, self.U, self.b
        pulls_vectors = self.dropout > 0

        def lstm_step(v):
            x = v.pull() if pulls_vectors else ops.reshape(ops.embedding(table, v.pull()), (E,))
            h_prev, c_prev = ops.split(v.gather(0), 2)
            h, c = ops.lstm_gates(x @ W + h_prev @ U + b, c_prev)
            v.scatter(ops.concat([h, c]))
            v.push(h)

        pull = {"pull_shape": (E,)} if pulls_vectors else {"pull_shape": (1,),
                                                             "pull_dtype": "int64"}
        self.F = VertexFunction(lstm_step, **pull, scatter_shape=(2 * H,), push_shape=(H,),
                                arity=1, dtype=dtype)

    def prepare(self, sentences):
        """A :class:`SentenceBatch` from id arrays; each sentence predicts all its tokens."""
        sentences = [np.asarray(s, dtype=np.int64) for s in sentences if len(s)]
        graphs = GraphBatch([chain(len(s)) for s in sentences])
        targets = np.concatenate(sentences)
        inputs = np.concatenate([np.concatenate([[self.bos_id], s[:-1]]) for s in sentences])
        return SentenceBatch(graphs, as_ids(inputs), targets)

    def logits(self, batch, run=None):
        inputs = batch.inputs
        if self.dropout > 0:  # F pulls the word vectors, dropped here in training
            vectors = ops.embedding(self.embedding.weight, inputs)
            inputs = dropout(ops.reshape(vectors, (len(batch.targets), self.embed_dim)),
                             self.dropout, self.training)
        h = runner(run)(self.F, batch.graphs, inputs)
        return dropout(h, self.dropout, self.training) @ self._output_weights() + self.b_out

    def loss(self, batch, run=None):
        """Next-token cross-entropy summed over every word of the batch."""
        return cross_entropy_sum(self.logits(batch, run), batch.targets)


@dataclass
class StreamBatch:
    """Rows of a token stream: ``inputs[r]`` are ``steps`` tokens, ``targets[r]`` the same
    positions shifted by one."""

    inputs: object  # (B, T) int64 Tensor
    targets: object  # (B, T) int64 Tensor

    @property
    def num_samples(self):
        return self.inputs.shape[0]

    @property
    def num_targets(self):
        return int(np.prod(self.inputs.shape))


class FixedLSTMLanguageModel(_LanguageModel):
    """A ``steps``-step LSTM language model declared statically: the whole unrolled network —
    embedding, ``steps`` LSTM cells, softmax layer and loss — is traced once per batch size
    into one Graph, whose backward graph is derived once. Each row starts from a zero state.

    ``dropout`` and ``tie_weights`` as in :class:`VarLSTMLanguageModel`. A traced graph draws
    no random numbers — a mask drawn while tracing would be the same every step — so the
    dropout masks are two more *inputs* of the graph, drawn anew for every batch.
    """

    def __init__(self, vocab_size, embed_dim=64, hidden=64, steps=64, dtype="float32",
                 dropout=0.0, tie_weights=False):
        E, H, V = int(embed_dim), int(hidden), int(vocab_size)
        self.vocab_size, self.embed_dim, self.hidden, self.steps = V, E, H, int(steps)
        self.dtype = np.dtype(dtype)
        self._parameters(V, E, H, dtype, dropout, tie_weights)
        self._traced = {}  # (batch size, with masks) -> StaticFunction

    def unrolled_loss(self, ids, targets, keep_x=None, keep_h=None):
        """The network as a plain function of (B, T) ids and targets: traced by
        :meth:`static_function`, or run eagerly op by op on Tensors. ``keep_x`` (B·T, E) and
        ``keep_h`` (B·T, H), when given, scale the word vectors and the states (dropout)."""
        B, T = ids.shape
        E, H = self.embed_dim, self.hidden
        # The input projection does not depend on the recurrence: one GEMM for all steps.
        x = ops.reshape(ops.embedding(self.embedding.weight, ids), (B * T, E))
        if keep_x is not None:
            x = x * keep_x
        xw = ops.reshape(x @ self.W + self.b, (B, T, 4 * H))
        h, c, states = None, 0.0, []
        for t in range(T):
            gates = ops.reshape(ops.slice_axis(xw, t, t + 1, axis=1), (B, 4 * H))
            if h is not None:
                gates = gates + h @ self.U
            h, c = ops.lstm_gates(gates, c)
            states.append(ops.reshape(h, (B, 1, H)))
        hs = ops.reshape(ops.concat(states, axis=1), (B * T, H))
        if keep_h is not None:
            hs = hs * keep_h
        logits = hs @ self._output_weights() + self.b_out
        return ops.softmax_cross_entropy(logits, ops.reshape(targets, (B * T,)),
                                         reduction="sum")

    def static_function(self, batch_size, masks=False):
        """The unrolled network traced for ``batch_size`` rows (traced on first use); with
        ``masks``, the graph that takes the two dropout masks as inputs too."""
        key = (batch_size, bool(masks))
        if key not in self._traced:
            shape = (batch_size, self.steps)
            specs = [spec(shape, "int64"), spec(shape, "int64")]
            if masks:
                rows = batch_size * self.steps
                specs += [spec((rows, self.embed_dim), self.dtype),
                          spec((rows, self.hidden), self.dtype)]
            self._traced[key] = symbolic(self.unrolled_loss, *specs, name="fixed_lstm")
        return self._traced[key]

    def dropout_masks(self, batch):
        """Fresh masks for ``batch``: each entry 0 with probability ``dropout``, else
        1 / (1 - dropout) (minicavs' generator, ``mc.seed``); on the parameters' device."""
        rows, scale = batch.num_targets, 1.0 / (1.0 - self.dropout)
        masks = []
        for width in (self.embed_dim, self.hidden):
            keep = (backend.rng().random((rows, width)) >= self.dropout) * scale
            masks.append(tensor(backend.to_device(keep.astype(self.dtype),
                                                  getattr(self.W, "device", "cpu"))))
        return masks

    def prepare(self, rows):
        """A :class:`StreamBatch` from (B, steps + 1) token rows."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 2 or rows.shape[1] != self.steps + 1:
            raise ShapeError(f"FixedLSTMLanguageModel.prepare: rows must have shape (B, "
                             f"{self.steps + 1}) (steps + 1 tokens), got {rows.shape}")
        return StreamBatch(tensor(rows[:, :-1].copy()), tensor(rows[:, 1:].copy()))

    def loss(self, batch, static=True, masks=None):
        """Next-token cross-entropy summed over the batch; ``static=False`` runs the same
        network eagerly (the reference the tests compare the static graph with). In training
        with dropout, ``masks`` (default: :meth:`dropout_masks`) are applied."""
        if self.training and self.dropout > 0 and masks is None:
            masks = self.dropout_masks(batch)
        masks = list(masks or [])
        if static:
            function = self.static_function(batch.num_samples, masks=bool(masks))
            return function(batch.inputs, batch.targets, *masks)
        return self.unrolled_loss(batch.inputs, batch.targets, *masks)


def stream_rows(sentences, steps):
    """Cut the concatenated sentences into rows of ``steps + 1`` tokens (consecutive rows
    overlap by one token, so every token but the first is a target exactly once)."""
    stream = np.concatenate([np.asarray(s, dtype=np.int64) for s in sentences])
    count = (len(stream) - 1) // steps
    if count == 0:
        raise DataError(f"stream_rows: {len(stream)} tokens are too few for one row of "
                        f"{steps + 1} (steps + 1); use fewer steps or more text")
    starts = np.arange(count) * steps
    return stream[starts[:, None] + np.arange(steps + 1)]
