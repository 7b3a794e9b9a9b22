"""minicavs on the CPU (NumPy): one vertex function per workload, run by the Cavs runtime.

Each workload is written as a minicavs user writes it (the math is the common one of
``benchmarks/common.py``):

* Tree-LSTM: the binary Tree-LSTM cell of Cavs Fig. 4 — the word id is pulled and embedded
  inside the cell (-1 at internal vertices embeds to zeros), it scatters [h, c] and pushes the
  class logits, so the classifier is lazy-batched into one GEMM; the loss reads the internal
  vertices' rows (``rows=``: their classifier's gradient is worked out on those rows only).
* Tree-FC: ``h = tanh(x W + [h_l, h_r] U + b)``; F pushes nothing, so it returns the scattered
  states and the root classifier runs outside F on the roots' rows.
* TreeRNN / RNTN: one cell for both kinds of vertex, as a user writes it without kinds: the
  word id and an "internal" flag are pulled, ``h = x + internal·tanh([h_l, h_r] U + b (+ xᵀVx))``
  (``minicavs_recursive.py`` runs the same models as recursive definitions, with kinds).
* Var-LSTM: a chain per sentence; the LSTM cell pushes h, and the softmax layer is one GEMM
  over all tokens of the batch, outside F.

Per step: a GraphBatch of the batch's (cached) InputGraphs, one call of F, the loss, one
backward, one Adam step. ``construction`` is building the GraphBatch (concatenation and the
level schedule) and the pulled ids; ``F forward``/``F backward`` come from ``F.explain()``.

``options``: ``{"vertex": {...}}`` is passed to ``VertexFunction(options=...)`` (the ablation:
``hoist_eager``, ``lazy_batching``, ``fuse``, ``streams``).
"""

import time

import numpy as np

from benchmarks import common, generation

DEVICE = "cpu"


def available(device=DEVICE):
    try:
        import minicavs as mc
    except Exception as exc:  # noqa: BLE001
        return f"minicavs not importable ({type(exc).__name__}: {exc})"
    if device == "cuda" and not mc.gpu_available():
        return "no CUDA device (minicavs.gpu_available() is False)"
    return None


def build(data, params, vertex_options=None):
    """The model of one workload: ``(F, parameters, loss_of_batch)``."""
    import minicavs as mc

    H, kind = data["hidden"], data["kind"]
    P = {name: mc.Parameter(array.copy(), name=name) for name, array in params.items()}
    table, W, U, b, W_out, b_out = (P[k] for k in ("emb", "W", "U", "b", "W_out", "b_out"))
    graphs = {}

    def graph_of(sample):  # InputGraphs are built once per sample, as a model caches them
        g = graphs.get(id(sample))
        if g is None:
            g = graphs[id(sample)] = (
                mc.InputGraph.chain(len(sample)) if kind == "var_lstm"
                else mc.InputGraph(sample.children))
        return g

    if kind == "tree_lstm":
        def cell(v):
            x = mc.embedding(table, v.pull())  # word id; -1 (internal vertex) gives zeros
            h_l, c_l = mc.split(v.gather(0), 2)
            h_r, c_r = mc.split(v.gather(1), 2)
            i, f_l, f_r, o, u = mc.split(x @ W + mc.concat([h_l, h_r]) @ U + b, 5)
            c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
            h = mc.sigmoid(o) * mc.tanh(c)
            v.scatter(mc.concat([h, c]))
            v.push(h @ W_out + b_out)

        F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(2 * H,),
                              push_shape=(data["num_classes"],), arity=2,
                              dtype="float32", options=vertex_options, name="tree_lstm")

        def prepare(trees):
            batch = mc.GraphBatch([graph_of(t) for t in trees])
            words = mc.tensor(np.concatenate([t.words for t in trees]))
            labels = np.concatenate([t.labels for t in trees])
            targets = np.flatnonzero(batch.num_children > 0)
            return batch, words, (mc.tensor(targets), mc.tensor(labels[targets]))

        def loss_of(batch, words, extra):  # (the internal vertices' rows only: rows=)
            targets, labels = extra
            logits = F(batch, pull=words, rows=targets)
            return mc.softmax_cross_entropy(logits, labels, reduction="sum")

    elif kind == "tree_fc":
        def cell(v):
            x = mc.embedding(table, v.pull())
            h = mc.tanh(x @ W + mc.concat([v.gather(0), v.gather(1)]) @ U + b)
            v.scatter(h)

        F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(H,),
                              arity=2, dtype="float32", options=vertex_options, name="tree_fc")

        def prepare(trees):
            batch = mc.GraphBatch([graph_of(t) for t in trees])
            words = mc.tensor(np.concatenate([t.words for t in trees]))
            labels = np.array([t.labels[-1] for t in trees])
            return batch, words, mc.tensor(labels)

        def loss_of(batch, words, labels):
            h = F(batch, pull=words, rows=batch.roots)  # (the roots' states only)
            return mc.softmax_cross_entropy(h @ W_out + b_out, labels, reduction="sum")

    elif kind in ("tree_rnn", "rntn"):
        V = P.get("V")

        def cell(v):  # one cell for both kinds: the pulled flag masks the internal formula
            ids = v.pull()  # (word id, 1 if internal): -1 at an internal vertex embeds to 0
            children = mc.concat([v.gather(0), v.gather(1)])
            total = children @ U + b
            if V is not None:
                total = total + bilinear(mc, children, V, H)
            h = mc.embedding(table, ids[0]) + ids[1].astype("float32") * mc.tanh(total)
            v.scatter(h)
            v.push(h @ W_out + b_out)

        F = mc.VertexFunction(cell, pull_shape=(2,), pull_dtype="int64", scatter_shape=(H,),
                              push_shape=(data["num_classes"],), arity=2, dtype="float32",
                              options=vertex_options, name=kind)

        def prepare(trees):
            batch = mc.GraphBatch([graph_of(t) for t in trees])
            words = np.concatenate([t.words for t in trees])
            internal = (batch.num_children > 0).astype(np.int64)
            labels = np.concatenate([t.labels for t in trees])
            targets = np.flatnonzero(internal)
            return (batch, mc.tensor(np.stack([words, internal], axis=1)),
                    (mc.tensor(targets), mc.tensor(labels[targets])))

        def loss_of(batch, words, extra):  # (the internal vertices' rows only: rows=)
            targets, labels = extra
            logits = F(batch, pull=words, rows=targets)
            return mc.softmax_cross_entropy(logits, labels, reduction="sum")

    else:  # var_lstm
        eos = data["eos"]

        def cell(v):
            x = mc.embedding(table, v.pull())
            h_prev, c_prev = mc.split(v.gather(0), 2)
            i, f, g, o = mc.split(x @ W + h_prev @ U + b, 4)
            c = mc.sigmoid(f) * c_prev + mc.sigmoid(i) * mc.tanh(g)
            h = mc.sigmoid(o) * mc.tanh(c)
            v.scatter(mc.concat([h, c]))
            v.push(h)

        F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(2 * H,),
                              push_shape=(H,), arity=1, dtype="float32",
                              options=vertex_options, name="lstm")

        def prepare(sentences):
            batch = mc.GraphBatch([graph_of(s) for s in sentences])
            inputs = np.concatenate([np.concatenate([[eos], s[:-1]]) for s in sentences])
            targets = np.concatenate(sentences)
            return batch, mc.tensor(inputs.astype(np.int64)), mc.tensor(targets)

        def loss_of(batch, words, targets):
            logits = F(batch, pull=words) @ W_out + b_out
            return mc.softmax_cross_entropy(logits, targets, reduction="sum")

    return F, list(P.values()), prepare, loss_of


def bilinear(mc, x, V, H):
    """The RNTN's xᵀ V_i x for every slice i of V (H, 2H, 2H): (x V) as (H, 2H), times x."""
    v_flat = mc.reshape(mc.transpose(V, (1, 0, 2)), (2 * H, H * 2 * H))
    return mc.sum(mc.reshape(x @ v_flat, (H, 2 * H)) * x, axis=-1)


def run(data, params, epochs, warmup, options=None, device=DEVICE, build_model=None):
    """Train; ``build_model`` replaces :func:`build` (minicavs_recursive.py passes its own)."""
    import minicavs as mc

    if data["kind"] == "td_generate":
        return generation.run_minicavs(data, params, epochs, warmup, device,
                                       (options or {}).get("vertex"))
    mc.set_device(device)
    options = options or {}
    F, parameters, prepare, loss_of = (build_model or build)(data, params, options.get("vertex"))
    optimizer = mc.nn.Adam(parameters, lr=1e-3)

    def step(samples):
        started = time.perf_counter()
        batch, words, extra = prepare(samples)
        construction = time.perf_counter() - started
        optimizer.zero_grad()
        loss = loss_of(batch, words, extra)
        loss.backward()
        optimizer.step()
        stats = F.explain()
        return {"loss": loss.item(), "construction": construction,
                "scheduling": stats["scheduling_seconds"],
                "F forward": stats["forward_seconds"],
                "F backward": stats["backward_seconds"]}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return common.summarize(loop, data, versions={"minicavs": mc.__version__,
                                                  "device": device,
                                                  "vertex_options": options.get("vertex")})
