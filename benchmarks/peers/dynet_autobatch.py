"""DyNet with automatic batching (the agenda-based autobatcher), one computation graph per
mini-batch, written the way DyNet's own benchmarks (dynet-benchmark's treenn and rnnlm) write
these models: per vertex/token expressions for every sample of the batch in one graph, one
``pickneglogsoftmax`` per classified vertex/token, ``esum`` of the batch's losses, then
``value()`` (where the autobatcher groups the pending operations), ``backward()`` and one
``AdamTrainer.update()``.

Configured before the first import of dynet: ``autobatch=1`` and a memory pool of
``BENCH_DYNET_MEM`` MB (the harness sets it). With autobatching DyNet cannot grow its pool, so
the harness starts from a size per workload and doubles it until the run fits; DyNet touches
the whole pool at start-up, so the pool is reported as memory DyNet holds (added to the RSS
growth during training). The Var-LSTM uses ``VanillaLSTMBuilder`` (gates i, f, o, g; it adds a
forget bias of 1, so the common bias is loaded with 1 subtracted from its forget part).
Lookup parameters get DyNet's default sparse updates (only the rows a batch used).

``construction_seconds``: declaring the batch's graph in Python (``renew_cg`` up to the summed
loss); DyNet evaluates lazily, so the autobatcher's own scheduling falls in the computation
(``value()``).
"""

import importlib
import os
import time

import numpy as np

from benchmarks import common, generation

_CONFIGURED = False
POOL_MB = int(os.environ.get("BENCH_DYNET_MEM", "512"))  # see the module docstring


def available():
    global _CONFIGURED
    try:
        import dynet_config
        if not _CONFIGURED:
            dynet_config.set(autobatch=1, mem=POOL_MB, random_seed=1)
            _CONFIGURED = True
        importlib.import_module("dynet")  # the import is the check
    except Exception as exc:  # noqa: BLE001 (any failure to import means "missing")
        return f"dynet not importable ({type(exc).__name__}: {exc}); pip install dynet38"
    return None


def run(data, params, epochs, warmup, options=None):
    if data["kind"] == "td_generate":
        return generation.run_dynet(data, params, epochs, warmup)
    import dynet as dy

    H, kind = data["hidden"], data["kind"]
    model = dy.ParameterCollection()
    emb = model.lookup_parameters_from_numpy(params["emb"])
    W_out = model.parameters_from_numpy(params["W_out"].T.copy())
    b_out = model.parameters_from_numpy(params["b_out"])
    if kind == "var_lstm":
        builder = dy.VanillaLSTMBuilder(1, data["embed"], H, model)
        Wx, Wh, bias = builder.get_parameters()[0]
        Wx.set_value(_ifog(params["W"].T))
        Wh.set_value(_ifog(params["U"].T))
        bias.set_value(_ifog(params["b"] - np.repeat([0.0, 1.0, 0.0, 0.0], H)))
    else:
        W = model.parameters_from_numpy(params["W"].T.copy())
        U = model.parameters_from_numpy(params["U"].T.copy())
        b = model.parameters_from_numpy(params["b"])
    if "V" in params:  # RNTN: row i·2H + j of V_rows is V[i, j, :]
        H2 = 2 * H
        V_rows = model.parameters_from_numpy(params["V"].reshape(H * H2, H2).copy())
    trainer = dy.AdamTrainer(model, alpha=1e-3)

    if kind == "tree_lstm":
        def declare(trees):
            losses = []
            for tree in trees:
                h, c = [None] * tree.num_vertices, [None] * tree.num_vertices
                for v, kids in enumerate(tree.children):
                    if kids:
                        left, right = kids
                        gates = dy.affine_transform([b, U, dy.concatenate([h[left], h[right]])])
                    else:
                        gates = dy.affine_transform([b, W, dy.lookup(emb, int(tree.words[v]))])
                    i = dy.logistic(dy.pick_range(gates, 0, H))
                    o = dy.logistic(dy.pick_range(gates, 3 * H, 4 * H))
                    u = dy.tanh(dy.pick_range(gates, 4 * H, 5 * H))
                    c[v] = dy.cmult(i, u)
                    if kids:
                        f_l = dy.logistic(dy.pick_range(gates, H, 2 * H))
                        f_r = dy.logistic(dy.pick_range(gates, 2 * H, 3 * H))
                        c[v] = c[v] + dy.cmult(f_l, c[left]) + dy.cmult(f_r, c[right])
                    h[v] = dy.cmult(o, dy.tanh(c[v]))
                    if kids:
                        losses.append(dy.pickneglogsoftmax(
                            dy.affine_transform([b_out, W_out, h[v]]), int(tree.labels[v])))
            return dy.esum(losses)

    elif kind in ("tree_rnn", "rntn"):
        def declare(trees):
            losses = []
            for tree in trees:
                h = [None] * tree.num_vertices
                for v, kids in enumerate(tree.children):
                    if kids:
                        x = dy.concatenate([h[kids[0]], h[kids[1]]])
                        total = dy.affine_transform([b, U, x])
                        if kind == "rntn":  # reshape is column-major: column i is V_i x
                            total = total + dy.transpose(dy.reshape(V_rows * x, (H2, H))) * x
                        h[v] = dy.tanh(total)
                        losses.append(dy.pickneglogsoftmax(
                            dy.affine_transform([b_out, W_out, h[v]]), int(tree.labels[v])))
                    else:
                        h[v] = dy.lookup(emb, int(tree.words[v]))
            return dy.esum(losses)

    elif kind == "tree_fc":
        def declare(trees):
            losses = []
            for tree in trees:
                h = [None] * tree.num_vertices
                for v, kids in enumerate(tree.children):
                    if kids:
                        h[v] = dy.tanh(dy.affine_transform(
                            [b, U, dy.concatenate([h[kids[0]], h[kids[1]]])]))
                    else:
                        h[v] = dy.tanh(dy.affine_transform(
                            [b, W, dy.lookup(emb, int(tree.words[v]))]))
                losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_out, W_out, h[-1]]),
                                                   int(tree.labels[-1])))
            return dy.esum(losses)

    else:  # var_lstm
        eos = data["eos"]

        def declare(sentences):
            losses = []
            for s in sentences:
                inputs = [dy.lookup(emb, int(w)) for w in np.concatenate([[eos], s[:-1]])]
                outputs = builder.initial_state().transduce(inputs)
                for h, target in zip(outputs, s):
                    losses.append(dy.pickneglogsoftmax(dy.affine_transform([b_out, W_out, h]),
                                                       int(target)))
            return dy.esum(losses)

    def step(batch):
        started = time.perf_counter()
        dy.renew_cg()
        loss = declare(batch)
        construction = time.perf_counter() - started
        value = loss.value()
        loss.backward()
        trainer.update()
        return {"loss": value, "construction": construction}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return common.summarize(loop, data, reserved_memory_mb=POOL_MB,
                            versions={"dynet": _version(), "autobatch": 1, "pool_mb": POOL_MB})


def _ifog(rows):
    """Stacked gate rows in the common order i, f, g, o, reordered to DyNet's i, f, o, g."""
    i, f, g, o = np.split(np.asarray(rows, dtype=np.float32), 4)
    return np.concatenate([i, f, o, g])


def _version():
    try:
        from importlib.metadata import version
        return version("dynet38")
    except Exception:  # noqa: BLE001
        return os.environ.get("DYNET_VERSION", "unknown")
