"""minicavs with recursive definitions (``mc.recursive``): each kind of vertex on its own rows.

The SST workloads written as the recursion paper writes them (Figs. 2–3): a leaf embeds its word,
an internal vertex calls the function on its two children. The runtime traces one cell per kind
(leaf, two children), so a leaf pays for no child product and an internal vertex for no word:

* Tree-LSTM: leaf ``i, o, u`` from ``x W + b`` (no U product), internal gates from
  ``[h_l, h_r] U + b`` (no W product) — the peers' math, which ``minicavs`` evaluates as one
  formula for every vertex;
* TreeRNN / RNTN: leaf ``h = x``, internal ``h = tanh([h_l, h_r] U + b (+ xᵀ V x))``.

Training, timing and the result are ``minicavs_cpu.run``'s.
"""

import numpy as np

from benchmarks.systems import minicavs_cpu

DEVICE = "cpu"


def available():
    return minicavs_cpu.available(DEVICE)


def build(data, params, vertex_options=None):
    import minicavs as mc

    H, C, kind = data["hidden"], data["num_classes"], data["kind"]
    if kind not in ("tree_lstm", "tree_rnn", "rntn"):
        raise ValueError(f"minicavs-recursive runs the SST tree workloads, not {kind}")
    P = {name: mc.Parameter(array.copy(), name=name) for name, array in params.items()}
    table, W, U, b, W_out, b_out = (P[k] for k in ("emb", "W", "U", "b", "W_out", "b_out"))
    V = P.get("V")
    graphs = {}

    if kind == "tree_lstm":
        @mc.recursive(scatter_shape=(2 * H,), pull_shape=(), pull_dtype="int64",
                      push_shape=(C,), arity=2, dtype="float32", options=vertex_options)
        def model(node):
            if node.is_leaf:
                i, _, _, o, u = mc.split(mc.embedding(table, node.pull()) @ W + b, 5)
                c = mc.sigmoid(i) * mc.tanh(u)
            else:
                (h_l, c_l), (h_r, c_r) = [mc.split(model(child), 2) for child in node.children]
                i, f_l, f_r, o, u = mc.split(mc.concat([h_l, h_r]) @ U + b, 5)
                c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
            h = mc.sigmoid(o) * mc.tanh(c)
            node.push(h @ W_out + b_out)
            return mc.concat([h, c])
    else:
        @mc.recursive(scatter_shape=(H,), pull_shape=(), pull_dtype="int64", push_shape=(C,),
                      arity=2, dtype="float32", options=vertex_options)
        def model(node):
            if node.is_leaf:
                h = mc.embedding(table, node.pull())
            else:
                x = mc.concat([model(child) for child in node.children])
                total = x @ U + b
                if V is not None:
                    total = total + minicavs_cpu.bilinear(mc, x, V, H)
                h = mc.tanh(total)
            node.push(h @ W_out + b_out)
            return h

    def graph_of(tree):  # built once per tree, as a model caches them
        g = graphs.get(id(tree))
        if g is None:
            g = graphs[id(tree)] = mc.InputGraph(tree.children)
        return g

    def prepare(trees):
        batch = mc.GraphBatch([graph_of(t) for t in trees])
        words = mc.tensor(np.concatenate([t.words for t in trees]))
        labels = np.concatenate([t.labels for t in trees])
        targets = np.flatnonzero(batch.num_children > 0)
        return batch, words, (mc.tensor(targets), mc.tensor(labels[targets]))

    def loss_of(batch, words, extra):
        targets, labels = extra
        logits = model(batch, pull=words, rows=targets)  # (the internal vertices only: rows=)
        return mc.softmax_cross_entropy(logits, labels, reduction="sum")

    return model, list(P.values()), prepare, loss_of


def run(data, params, epochs, warmup, options=None):
    return minicavs_cpu.run(data, params, epochs, warmup, options, device=DEVICE,
                            build_model=build)
