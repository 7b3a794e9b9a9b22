"""The emulated CUDA device (issue 41; minicavs/cuda/emulated.py): the CUDA path on the CPU.

The end-to-end checks run in a subprocess with ``MINICAVS_CUDA_EMULATE=1`` (the backend reads
it when CuPy is first asked for, and keeps the module it chose for the process): one worker
runs every scenario and prints JSON, which the tests below read. The emulated module's own
pieces (kernels through the shim, counting, host/device mixing) are tested in-process: using
``emulated.cupy`` directly changes no global state.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minicavs import errors as mc_errors
from minicavs.cuda import emulated

ROOT = Path(__file__).resolve().parents[1]
cp = emulated.cupy

WORKER = textwrap.dedent(r'''
    import json
    import numpy as np
    import minicavs as mc
    from minicavs import backend
    from minicavs.data import synthetic_treebank

    def readme_tree_lstm(device, trees, vocab):
        """The README's Tree-LSTM ("A vertex function"), forward and backward on device."""
        mc.set_device("cpu"); mc.seed(0)
        E = H = 16
        def weight(*shape):
            return mc.Parameter(mc.nn.init.xavier_uniform(shape))
        table = mc.Parameter(mc.nn.init.uniform((len(vocab), E)))
        W, U, W_out = weight(E, 5 * H), weight(2 * H, 5 * H), weight(H, 5)
        b, b_out = mc.Parameter(np.zeros(5 * H, np.float32)), mc.Parameter(np.zeros(5, np.float32))
        params = [table, W, U, W_out, b, b_out]
        mc.set_device(device)
        for p in params:
            p.data = backend.to_device(p.data)
        def tree_lstm(v):
            x = mc.reshape(mc.embedding(table, v.pull()), (E,))
            h_l, c_l = mc.split(v.gather(0), 2)
            h_r, c_r = mc.split(v.gather(1), 2)
            i, f_l, f_r, o, u = mc.split(x @ W + mc.concat([h_l, h_r]) @ U + b, 5)
            c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
            h = mc.sigmoid(o) * mc.tanh(c)
            v.scatter(mc.concat([h, c]))
            v.push(h @ W_out + b_out)
        F = mc.VertexFunction(tree_lstm, pull_shape=(1,), pull_dtype="int64",
                              scatter_shape=(2 * H,), push_shape=(5,), arity=2)
        batch = mc.GraphBatch([mc.InputGraph(t.children) for t in trees])
        word_ids = mc.tensor(np.concatenate([t.words for t in trees])[:, None])
        labels = mc.tensor(np.concatenate([t.labels for t in trees]))
        explained, c_calls = [], []
        driver = None
        if device == "cuda":  # (C calls of the issuer: one per run of levels, not per level)
            from minicavs.cuda import issuer
            driver = issuer.driver(backend.cupy_or_error())
        if driver is not None and not isinstance(driver, str):
            for name in ("issue_level", "issue_many"):
                def counted(*args, _call=getattr(driver, name)):
                    c_calls.append(1)
                    return _call(*args)
                setattr(driver, name, counted)
        for _ in range(2):  # a second call must report the same counts
            for p in params:
                p.grad = None
            logits = F(batch, pull=word_ids)
            mc.softmax_cross_entropy(logits, labels, reduction="sum").backward()
            explained.append({k: v for k, v in F.explain().items()
                              if "launches" in k or "backend" in k})
            explained[-1].update(forward=explained[-1]["forward_launches_per_level"],
                                 backward=explained[-1]["backward_launches_per_level"])
        exes = (F.executable, F.backward_executable)  # level steps: one per plan and call kind
        result = {"level_steps": [[len(e.level_steps), len(set(e.plans._plans.values()))]
                                  for e in exes],
                  "level_kernels": [[sum(k is not None for *_, k in s.steps)
                                     for s in e.level_steps.values()] for e in exes],
                  "logits": backend.to_numpy(logits.data).tolist(),
                  "on_device": backend.is_cupy_array(logits.data),
                  "grads": [backend.to_numpy(p.grad.data).tolist() for p in params],
                  "explain": explained, "c_calls": len(c_calls), "levels": batch.num_levels}
        if driver is not None and not isinstance(driver, str):
            driver.issue_level, driver.issue_many = issuer._library()  # (not the wrappers)
        counter = getattr(backend.get_array_module(logits.data), "launch_counter", None)
        if counter is not None:  # batches of other shapes (levels, rows): nothing new compiled
            result["compiles"] = [counter.compiles]
            for part in (trees[:1], trees[2:], trees[::-1]):
                F(mc.GraphBatch([mc.InputGraph(t.children) for t in part]),
                  pull=mc.tensor(np.concatenate([t.words for t in part])[:, None])).sum().backward()
                result["compiles"].append(counter.compiles)
        return result

    def ops(device):
        mc.set_device(device); mc.seed(1)
        rng = np.random.default_rng(1)
        x = mc.tensor(rng.normal(size=(4, 6)).astype(np.float32), requires_grad=True)
        w = mc.tensor(rng.normal(size=(6, 3)).astype(np.float32), requires_grad=True)
        y = mc.softmax_cross_entropy(mc.tanh(x @ w) * mc.sigmoid(x[:, :3]) + mc.exp(-w[:4]),
                                     mc.tensor(np.array([0, 2, 1, 0])))
        z = mc.sum(mc.concat(mc.split(x, 2), axis=0) ** 2) + mc.mean(mc.relu(x))
        (y + z).backward()
        return [backend.to_numpy(a).tolist() for a in (y.data, z.data, x.grad.data, w.grad.data)]

    def autobatched(device):
        mc.set_device(device); mc.seed(2)
        rng = np.random.default_rng(2)
        W = mc.Parameter(rng.normal(size=(5, 5)).astype(np.float32) * 0.5)
        b = mc.Parameter(np.zeros(5, np.float32))
        with mc.autobatch("agenda+") as ab:
            losses = []
            for n in (2, 3, 4):
                h = mc.tensor(rng.normal(size=5).astype(np.float32))
                for _ in range(n):
                    h = mc.tanh(h @ W + b)
                losses.append(mc.sum(h * h))
            total = mc.sum(mc.stack(losses))
            total.backward()
        return [backend.to_numpy(a).tolist() for a in (total.data, W.grad.data, b.grad.data)]

    def lstm_steps(device):
        """Chains of lstm_step under autobatch: values, gradients, launches per batch."""
        mc.set_device(device); mc.seed(3)
        rng = np.random.default_rng(3)
        H = 6
        W, U = (mc.Parameter(rng.normal(size=(H, 4 * H)).astype(np.float32) * 0.5)
                for _ in range(2))
        b = mc.Parameter(np.zeros(4 * H, np.float32))
        with mc.autobatch("agenda+") as ab:
            losses = []
            for n in range(8):
                state = mc.tensor(np.zeros(2 * H, np.float32))
                for t in range(4):
                    state = mc.lstm_step(mc.tensor(rng.normal(size=H).astype(np.float32)),
                                         state, W, U, b)
                losses.append(mc.sum(state * state))
            total = mc.add_n(losses)
            total.backward()
        stats = ab.segments[0].stats
        with mc.autobatch("agenda+") as xab:  # a softmax loss per sample, one batch
            logits = [mc.tensor(rng.normal(size=5).astype(np.float32)) * W[0, :5]
                      for _ in range(6)]
            xent = mc.add_n([mc.softmax_cross_entropy(z, np.array(k % 5))
                             for k, z in enumerate(logits)])
            xent.backward()
        xstats = xab.segments[0].stats
        label = "lstm_step (6,),(12,),W,W,W"
        launches = stats.get("forward_launches_by_signature")
        return {"values": [backend.to_numpy(a).tolist() for a in
                           (total.data, W.grad.data, U.grad.data, b.grad.data)],
                "per_step_batch": launches and launches[label] / stats["by_signature"][label][0],
                "xent": backend.to_numpy(xent.data).tolist(),
                "xent_launches": (xstats.get("forward_launches_by_signature") or {}).get(
                    "softmax_cross_entropy (5,),()"),
                "uploads": stats.get("uploads"),
                "explain": ab.explain(picture=False)}

    def repeated_rows(device):
        """One value read by several nodes of a batch (its row repeats in the gather), also
        through a view of its columns: values, gradients, host->device copies per segment."""
        mc.set_device(device); mc.seed(4)
        rng = np.random.default_rng(4)
        W = mc.Parameter(rng.normal(size=(4, 4)).astype(np.float32) * 0.5)
        b = mc.Parameter(np.zeros(4, np.float32))
        def step():
            W.grad = b.grad = None
            with mc.autobatch("agenda+") as ab:
                losses = []
                for i in range(5):
                    v = mc.tanh(mc.tensor(rng.normal(size=4).astype(np.float32)) @ W + b)
                    reads = [mc.tanh(v) for _ in range(3)] + [mc.sigmoid(v[1:3])
                                                              for _ in range(i % 3 + 1)]
                    losses.append(mc.sum(mc.concat(reads) ** 2))
                total = mc.add_n(losses)
                total.backward()
            return total, ab.segments[0].stats

        for _ in range(2):  # (the second step: its kernels' constants went over in the first)
            total, stats = step()
        out = {"values": [backend.to_numpy(a).tolist() for a in
                          (total.data, W.grad.data, b.grad.data)],
               "scatters": stats["scatter_made"], "uploads": stats.get("uploads"),
               "host_us_per_node": stats["host_us_per_node"]}
        if device == "cuda":  # the stand-in library made slow: minicavs' host time stays
            import time
            from minicavs.cuda import emulated

            wrap, slept = emulated._wrap, []

            def slow_wrap(result):
                if emulated.counter._depth:  # (inside the library: its own bookkeeping)
                    time.sleep(1e-3)
                    slept.append(1e-3)
                return wrap(result)

            emulated._wrap = slow_wrap
            try:
                _, slowed = step()
            finally:
                emulated._wrap = wrap
            out["slowed"] = {"host_s": slowed["host_us_per_node"] * slowed["nodes"] * 1e-6,
                             "unslowed_host_s": stats["host_us_per_node"] * stats["nodes"] *
                             1e-6, "slept_s": sum(slept)}
        return out

    def benchmark_models(device):
        """Each benchmark model (benchmarks/systems/minicavs_cpu.py; the tree models also as
        recursive definitions, minicavs_recursive.py, whose leaf kind runs over all its rows
        at once), two training steps: the losses, the gradients of the second, and F's
        launches per level."""
        from benchmarks import common
        from benchmarks.systems import minicavs_cpu, minicavs_recursive

        out = {}
        for name in ("tree_lstm", "tree_fc", "tree_rnn", "rntn", "var_lstm", "recursive tree_lstm",
                     "recursive rntn"):
            system = minicavs_recursive if name.startswith("recursive") else minicavs_cpu
            data = common.load_workload(name.split()[-1], 16)
            data["hidden"] = data["embed"] = 8 if not name.endswith("rntn") else 4
            params = common.init_params(data)
            mc.set_device(device)
            F, parameters, prepare, loss_of = system.build(data, params)
            optimizer = mc.nn.Adam(parameters, lr=1e-2)
            losses = []
            for step in range(2):
                optimizer.zero_grad()
                loss = loss_of(*prepare(data["batches"][0][:8]))
                loss.backward()
                losses.append(float(loss.item()))
                if step == 0:
                    optimizer.step()
            stats = F.explain()
            out[name] = {"losses": losses,
                         "grads": [backend.to_numpy(p.grad.data).tolist() for p in parameters
                                   if p.grad is not None],
                         "forward": stats["forward_launches_per_level"],
                         "backward": stats["backward_launches_per_level"]}
        return out

    def issuers():
        """The benchmark models with each level's launches issued from C and from Python
        (cuda/issuer.py, MINICAVS_CUDA_ISSUER): per issuer the losses, the gradients, F's
        launches per level and the backends explain() names."""
        import os
        from benchmarks import common
        from benchmarks.systems import minicavs_cpu

        out = {}
        for name in ("tree_lstm", "tree_fc", "tree_rnn", "rntn", "var_lstm"):
            data = common.load_workload(name, 24)
            data["hidden"] = data["embed"] = 8 if name != "rntn" else 4
            params = common.init_params(data)
            for issuer in ("python", "c", "c, own products"):
                os.environ["MINICAVS_CUDA_ISSUER"] = issuer[:1] if issuer != "python" else issuer
                if issuer == "c, own products":  # (cuda/products.py's kernel at any row count)
                    os.environ["MINICAVS_KERNELS"] = "own"
                mc.set_device("cuda")
                F, parameters, prepare, loss_of = minicavs_cpu.build(data, params)
                optimizer = mc.nn.Adam(parameters, lr=1e-2)
                losses = []
                for step in range(3):  # (batches of other sizes: the tables are per layout)
                    optimizer.zero_grad()
                    loss = loss_of(*prepare(data["batches"][0][:8 + 4 * step]))
                    loss.backward()
                    losses.append(float(loss.item()))
                    optimizer.step()
                stats = F.explain()
                out.setdefault(name, {})[issuer] = {
                    "losses": losses,
                    "grads": [backend.to_numpy(p.grad.data).tolist() for p in parameters
                              if p.grad is not None],
                    "launches": [stats["forward_launches_per_level"],
                                 stats["backward_launches_per_level"]],
                    "library": [(stats[f"{d}_launches_by_category"] or {}).get("library", 0)
                                for d in ("forward", "backward")],
                    "backends": [stats["forward_backend"], stats["backward_backend"]]}
                os.environ.pop("MINICAVS_KERNELS", None)
        del os.environ["MINICAVS_CUDA_ISSUER"]
        return out

    def td_generate(device):
        """benchmarks/generation.py's TD-TreeLSTM grown on device, then ∂F on what it grew."""
        from benchmarks import common, generation

        data = common.load_workload("td_generate", 8)
        data["hidden"] = data["embed"] = 8
        params = common.init_params(data)
        mc.set_device(device)
        F, P = generation.td_tree_lstm(params, 8)

        def decide(frontier):
            expand = backend.to_numpy(frontier.push[:, 0] > 0) & (frontier.depth < 4)
            return 2 * expand, np.tile([generation.LEFT, generation.RIGHT], int(expand.sum()))

        growth = mc.grow(F, np.arange(6, dtype=np.int64), decide, max_vertices=64)
        mc.sum(growth.output * growth.output).backward()
        return {"vertices": int(growth.batch.num_vertices),
                "push": backend.to_numpy(growth.output.data).tolist(),
                "grads": [backend.to_numpy(p.grad.data).tolist() for p in P.values()
                          if p.grad is not None]}

    def test_cells(device):
        """The runtime tests' cells on DAGs, chains and trees (tests/vertex_cells.py): edges
        (child-sum), three slots, a gather read by two children's adds (the DAG), float32 and
        float64; pushed rows and the gradients of parameters and pulled rows."""
        import sys
        sys.path.insert(0, "tests")
        import vertex_cells as vc

        graphs = [mc.InputGraph([[], [], [0, 1], [], [2, 3]]), mc.InputGraph.chain(4),
                  mc.InputGraph([[], [0], [0, 1], [1, 2]]), mc.InputGraph([[], [], [], [0, 1, 2]])]
        out = {}
        for name, make, dtype, arity in (
                ("binary", vc.binary_tree_lstm, "float64", 2),
                ("child_sum", vc.child_sum_tree_lstm, "float32", 3),
                ("k_ary", lambda E, H, rng, d: vc.k_ary_cell(E, H, 3, rng, d), "float64", 3)):
            mc.set_device("cpu")
            F, params = make(5, 4, np.random.default_rng(0), dtype)
            batch = mc.GraphBatch(graphs if arity == 3 else graphs[:3])
            x = np.random.default_rng(1).standard_normal((batch.num_vertices, 5)).astype(dtype)
            mc.set_device(device)
            for p in params:
                p.data = backend.to_device(p.data)
            X = mc.tensor(backend.to_device(x), requires_grad=True)
            pushed = F(batch, pull=X)
            mc.sum(pushed * pushed).backward()
            out[name] = [backend.to_numpy(a.data).tolist() for a in [pushed, X.grad] + [
                p.grad for p in params]]
            stats = F.explain()
            out.setdefault("backends", {})[name] = [stats["forward_backend"],
                                                    stats["backward_backend"]]
        return out

    def row_tensors(device):
        """A cell over per-row tensors (issued from C on the GPU: level_launches.py): each
        row's x·V seen as an (H, 2H) tensor, times a shared (H, 2H) parameter P and times a
        broadcast of x itself, summed over either axis (keepdims or not), plus an op of a
        shared scalar; pushed rows and every gradient, and who issued the levels."""
        rng = np.random.default_rng(7)
        H = 3
        mc.set_device("cpu")
        V = mc.Parameter(rng.standard_normal((2 * H, 2 * H * H)).astype(np.float32) * 0.3)
        P = mc.Parameter(rng.standard_normal((H, 2 * H)).astype(np.float32))
        s = mc.Parameter(np.array(0.5, np.float32))
        params = [V, P, s]
        mc.set_device(device)
        for p in params:
            p.data = backend.to_device(p.data)

        def cell(v):
            x = mc.concat([v.gather(0), v.gather(1)]) + v.pull()
            t = mc.reshape(x @ V, (H, 2 * H))
            by_p = mc.sum(t * P, axis=-1)  # (H,): a shared operand broadcast along the rows
            by_x = mc.sum(t * mc.reshape(x, (1, 2 * H)), axis=0, keepdims=True)  # (1, 2H)
            h = mc.tanh(by_p * s + mc.reshape(mc.sum(by_x, axis=-1), (1,)))
            v.scatter(h)
            v.push(h)

        F = mc.VertexFunction(cell, pull_shape=(2 * H,), scatter_shape=(H,), push_shape=(H,),
                              arity=2, dtype="float32")
        batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]]),
                               mc.InputGraph([[], [], [0, 1]])])
        X = mc.tensor(backend.to_device(
            rng.standard_normal((batch.num_vertices, 2 * H)).astype(np.float32)),
            requires_grad=True)
        pushed = F(batch, pull=X)
        mc.sum(pushed * pushed).backward()
        stats = F.explain()
        return {"values": [backend.to_numpy(a.data).tolist()
                           for a in [pushed, X.grad] + [p.grad for p in params]],
                "backends": [stats["forward_backend"], stats["backward_backend"]]}

    def autobatch_from_c(device):
        """A program whose batches read every form autobatch/launches.py translates — products
        with a shared weight, fused groups with a bias row and a constant, windows, an operand
        read through a view of some columns, concat, lstm_cell with 0-2 cells, lstm_step (the
        summed cell) in chains of several lengths, gathered rows — and some it leaves to the
        interpreter (sums): under each issuer (on the CPU the one there is), the values,
        gradients and what was issued from C."""
        import os
        out = {}
        for choice in (("python", "c") if device == "cuda" else ("python",)):
            os.environ["MINICAVS_CUDA_ISSUER"] = choice
            mc.set_device(device); mc.seed(5)
            rng = np.random.default_rng(5)
            H = 4
            P = {name: mc.Parameter(rng.normal(size=shape).astype(np.float64) * 0.5)
                 for name, shape in (("W", (H, 4 * H)), ("U", (H, 4 * H)), ("b", (4 * H,)),
                                     ("V", (2 * H, 3 * H)), ("K", (2 * H, 5 * H)),
                                     ("c", (3 * H,)))}
            with mc.autobatch("agenda+") as ab:
                losses = []
                for n in (1, 3, 2, 4):
                    state = mc.tensor(np.zeros(2 * H))
                    for t in range(n):
                        state = mc.lstm_step(mc.tensor(rng.normal(size=H)), state, P["W"],
                                             P["U"], P["b"])
                    h = state[:H]  # (a view of some columns of the state)
                    y = mc.tanh(mc.concat([h, state[H:]]) @ P["V"] + P["c"]) * 0.5
                    cells = mc.lstm_cell(y[:3 * H])  # (k = 0: 3H pre-activations)
                    pre = cells @ P["K"]
                    two = mc.lstm_cell(pre, cells[H:], state[H:])  # (k = 2)
                    one = mc.lstm_cell(pre[:4 * H], two[H:])  # (k = 1)
                    losses.append(mc.sum(one * one) + mc.sum(y))
                total = mc.add_n(losses)
                total.backward()
            stats = ab.segments[0].stats
            out[choice] = {
                "values": [backend.to_numpy(a).tolist() for a in
                           [total.data] + [P[k].grad.data for k in sorted(P)]],
                "from_c": stats.get("batches_from_c"), "batches": stats["batches"],
                "why": stats.get("why_not_from_c"),
                "launches": [stats.get("forward_launches"), stats.get("backward_launches")],
                "backward_from_c": stats.get("backward_batches_from_c"),
                "shared_from_c": [stats.get("shared_gradients_from_c"),
                                  stats["plus_products"]],
                "explain": ab.explain(picture=False)}
        if device == "cuda":  # float16 (no kernels of ours): every batch on the interpreter
            half = [mc.tensor(rng.normal(size=H).astype(np.float16)) for _ in range(3)]
            Wh = mc.Parameter(rng.normal(size=(H, H)).astype(np.float16))
            with mc.autobatch("agenda+") as ab:
                y = mc.add_n([mc.sum(mc.tanh(h @ Wh)) for h in half])
                y.backward()
            out["half"] = [ab.segments[0].stats.get("batches_from_c"),
                           float(backend.to_numpy(y.data)),
                           float(sum(np.tanh(backend.to_numpy(h.data).astype(np.float32) @
                                             backend.to_numpy(Wh.data).astype(np.float32)).sum()
                                     for h in half))]
        if device == "cuda":  # a launch the driver refuses: the error names the batch
            import ctypes
            from minicavs.cuda import emulated, issuer
            driver = issuer.driver(backend._import_cupy())
            saved, driver._constant = driver.launch, None
            failing = emulated._LAUNCH_T(lambda *args: 700)
            driver.launch = ctypes.cast(failing, ctypes.c_void_p).value
            try:
                with mc.autobatch("agenda") as ab:
                    y = mc.add_n([mc.tanh(mc.tensor(rng.normal(size=2 * H)) @ P["V"])
                                  for _ in range(3)])
                    y.data  # (the forward runs)
            except mc.errors.DeviceError as error:
                out["failure"] = str(error)
            finally:
                driver.launch, driver._constant = saved, None
        del os.environ["MINICAVS_CUDA_ISSUER"]
        return out

    def step_overheads():
        """Launches a training step needs besides F's levels: a batch's index arrays, reading
        the loss, the mean loss's gradient through the cross-entropy kernel."""
        from minicavs.cuda import emulated
        from minicavs.ops import loss as losses

        mc.set_device("cuda"); mc.seed(5)
        rng = np.random.default_rng(5)
        batch = mc.GraphBatch([mc.InputGraph(t.children) for t in trees])
        with emulated.counter.measure() as indices:
            rows = batch.indices(backend._import_cupy())
            rows._slot(0), rows._slot(1)
        cp = backend._import_cupy()
        z = backend.to_device(rng.standard_normal((9, 5)).astype(np.float32))
        y = backend.to_device(rng.integers(0, 5, 9))
        mean = cp.broadcast_to(backend.to_device(np.float32(1 / 9)), (9,))  # (a mean's gradient)
        with emulated.counter.measure() as grad:
            losses.SOFTMAX_CROSS_ENTROPY_GRAD.forward(cp, z, y, mean)
        loss = losses.softmax_cross_entropy(mc.tensor(z, requires_grad=True), mc.tensor(y))
        with emulated.counter.measure() as read:
            loss.item()
        params = [mc.Parameter(backend.to_device(rng.standard_normal(s).astype(np.float32)))
                  for s in ((4, 3), (3,), (1,))]
        optimizer = mc.nn.Adam(params, lr=1e-2)
        for _ in range(2):  # (the first step makes the moments)
            for p in params:
                p.grad = mc.tensor(backend.to_device(np.ones(p.shape, np.float32)))
            with emulated.counter.measure() as adam:
                optimizer.step()
        with emulated.counter.measure() as again:  # (the same gradients' blocks: no copy)
            optimizer.step()
        return {"indices": indices, "xent_grad": grad, "item": read, "adam": adam,
                "adam_again": again, "host_ids": host_ids(), "rows_copied": rows_copied()}

    def rows_copied():
        """Where F(batch, rows=...) copies its rows to the device, forward and backward."""
        from minicavs.cuda import emulated

        F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() + v.gather(0))),
                              pull_shape=(2,), scatter_shape=(2,), arity=1, dtype="float32")
        batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.chain(2)])
        x = mc.tensor(np.ones((5, 2), np.float32), requires_grad=True)
        mc.sum(F(batch, pull=x, rows=np.array([1, 3]))).backward()  # (its programs made)
        emulated.counter.log = []
        mc.sum(F(batch, pull=x, rows=np.array([1, 3]))).backward()
        log, emulated.counter.log = emulated.counter.log, None
        return [what.split()[-1] for category, what in log if category == "copy"]

    def host_ids():
        """Ids and labels copied from the host: checked by the bounds taken there (launches
        of a take of rows, a cross-entropy); a bad one, or one written through .data, caught."""
        from minicavs.cuda import emulated

        out = {}
        table = mc.tensor(backend.to_device(np.arange(12, dtype=np.float32).reshape(4, 3)))
        ids = mc.tensor(np.array([0, 3, -1]))
        with emulated.counter.measure() as out["take"]:
            rows = mc.take_rows(table, ids)
        out["rows"] = rows.numpy().tolist()
        column = mc.tensor(np.array([[2], [1]]))  # (a view of them: a reshape, as F's (n, 1) ids)
        with emulated.counter.measure() as out["take_view"]:
            mc.take_rows(table, mc.reshape(column, (2,)))
        logits = mc.tensor(backend.to_device(np.zeros((2, 3), np.float32)))
        labels = mc.tensor(np.array([2, 0]))
        with emulated.counter.measure() as out["xent"]:
            mc.softmax_cross_entropy(logits, labels, reduction="none")
        def error(make):
            try:
                make()
            except mc.errors.IndexRangeError as e:
                return str(e)
        out["bad"] = error(lambda: mc.take_rows(table, mc.tensor(np.array([0, 5]))))
        ids.data[1] = 4  # (a write the kept bounds cannot see: .data forgets them)
        out["written"] = error(lambda: mc.take_rows(table, ids))
        labels.data[0] = 3
        out["bad_label"] = error(lambda: mc.softmax_cross_entropy(logits, labels))
        return out

    trees, vocab = synthetic_treebank(6)
    out = {"overheads": step_overheads(), "issuers": issuers()}
    for device in ("cpu", "cuda"):
        out[device] = {"readme": readme_tree_lstm(device, trees, vocab), "ops": ops(device),
                       "autobatch": autobatched(device), "lstm": lstm_steps(device),
                       "repeated": repeated_rows(device), "models": benchmark_models(device),
                       "td_generate": td_generate(device), "cells": test_cells(device),
                       "from_c": autobatch_from_c(device), "row_tensors": row_tensors(device)}
    from minicavs.cuda import emulated
    out["launches"] = emulated.launches()
    out["emulated"] = backend.cuda_emulated() and backend._import_cupy() is emulated.cupy
    print("RESULT" + json.dumps(out))
''')


@pytest.fixture(scope="module")
def emulated_run(tmp_path_factory):
    script = tmp_path_factory.mktemp("emulated") / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", MINICAVS_DEVICE="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    line = [s for s in done.stdout.splitlines() if s.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def _close(a, b, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(1.0, float(np.abs(b).max(initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6 * scale, err_msg=what)


def test_the_readme_tree_lstm_on_the_emulated_device_equals_numpy(emulated_run):
    assert emulated_run["emulated"]
    cpu, cuda = emulated_run["cpu"]["readme"], emulated_run["cuda"]["readme"]
    assert cuda["on_device"] and not cpu["on_device"]
    assert cuda["explain"][0]["forward_backend"] == "cupy (levels issued from C)"
    assert cuda["explain"][0]["backward_backend"] == "cupy (levels issued from C)"
    _close(cuda["logits"], cpu["logits"], "logits")
    for k, (g, r) in enumerate(zip(cuda["grads"], cpu["grads"])):
        _close(g, r, f"gradient of parameter {k}")


def test_a_calls_levels_go_to_c_in_one_call_per_phase(emulated_run):
    """In each of the worker's two calls F and ∂F (all their levels) are one C call each of the
    issuer, not one a level: the levels are queued and issued together."""
    readme = emulated_run["cuda"]["readme"]
    assert readme["levels"] > 2
    assert readme["c_calls"] == 2 * 2, readme["c_calls"]  # 2 calls of F and of ∂F


def test_levels_issued_from_c_equal_levels_issued_from_python(emulated_run):
    """The same kernels and products in the same order, so the same bits; every level of
    every model goes through C. Tree-FC's complete trees have their children in order: C adds
    ∂F's children's gradients in the product's cuBLAS gemm (β = 1), one launch fewer a level
    with children than Python's product and adds (the same sums, so the same bits still).
    The RNTN's bilinear term ``sum(reshape(x V) * x)`` is one kernel from C, its product
    ``x V`` made in the rows of the reshape ∂F reads (Python: a copy, a mul and a sum): fewer
    launches each way, and a sum in another order (float32 rounding apart)."""
    for name, runs in emulated_run["issuers"].items():
        c, python = runs["c"], runs["python"]
        if name == "rntn":
            _close(c["losses"], python["losses"], "rntn: losses")
            for k, (g, r) in enumerate(zip(c["grads"], python["grads"])):
                _close(g, r, f"rntn: gradient {k}")
            assert c["launches"][0] <= python["launches"][0] - 1.5 and \
                c["launches"][1] <= python["launches"][1] - 0.8, (c["launches"],
                                                                  python["launches"])
        else:
            assert c["losses"] == python["losses"], name
            assert c["grads"] == python["grads"], name
        added = name == "tree_fc"
        if added:
            assert c["launches"][0] == python["launches"][0], name
            assert python["launches"][1] - 1 < c["launches"][1] < python["launches"][1], (
                name, c["launches"], python["launches"])
        elif name != "rntn":
            assert c["launches"] == python["launches"], name
        assert python["backends"] == ["cupy", "cupy"], name
        assert all(b == "cupy (levels issued from C)" for b in c["backends"]), (name,
                                                                                c["backends"])
        # our product kernel in place of cuBLAS's: float32 rounding apart, the same launches
        own = runs["c, own products"]
        _close(own["losses"], python["losses"], f"{name}: losses, own products")
        for k, (g, r) in enumerate(zip(own["grads"], python["grads"])):
            _close(g, r, f"{name}: gradient {k}, own products")
        assert own["launches"] == c["launches"], name
        # (the gemm adding into the children is cuBLAS's: our kernel writes its product, it
        # does not add it)
        assert own["library"][0] == 0 and c["library"][0] > 0, (name, own, c)
        assert (own["library"][1] > 0) == added, (name, own, c)


def test_explain_reports_launches_per_level_and_they_repeat(emulated_run):
    first, second = emulated_run["cuda"]["readme"]["explain"]
    for phase in ("forward", "backward"):
        per_level = first[f"{phase}_launches_per_level"]
        assert isinstance(per_level, float) and per_level > 0
        assert per_level == second[f"{phase}_launches_per_level"]
        by_category = first[f"{phase}_launches_by_category"]
        assert set(by_category) <= set(emulated.CATEGORIES)
        assert abs(sum(by_category.values()) - per_level) < 1e-9
        assert by_category["kernel"] > 0 and by_category["library"] > 0  # shim and GEMMs ran
    cpu = emulated_run["cpu"]["readme"]["explain"][0]
    assert cpu["forward_launches_per_level"] is None  # NumPy: nothing is launched


def test_a_level_plans_steps_are_worked_out_once(emulated_run):
    for made, plans in emulated_run["cuda"]["readme"]["level_steps"]:
        assert made == plans, (made, plans)
    # on every level of F and of dF the Tree-LSTM's fused group runs over whole arrays
    # (interpreter._LevelKernel): no row view or window is made for it
    forward, backward = emulated_run["cuda"]["readme"]["level_kernels"]
    assert forward and backward and set(forward) == set(backward) == {1}, (forward, backward)


def test_kernels_are_compiled_once_not_per_batch_shape(emulated_run):
    """A new batch shape (other levels, other row counts) compiles no kernel: sizes are the
    kernels' arguments, so a GPU's first epoch compiles and the later ones do not."""
    compiles = emulated_run["cuda"]["readme"]["compiles"]
    assert compiles[0] > 0 and compiles == [compiles[0]] * len(compiles), compiles


def test_the_benchmark_models_train_on_the_emulated_device_as_on_numpy(emulated_run):
    """Losses and gradients of every benchmark model equal NumPy's: the level's row moves in
    one launch each (runtime/interpreter.py Windows) move the same rows as the reference."""
    cpu, cuda = emulated_run["cpu"]["models"], emulated_run["cuda"]["models"]
    for name in cpu:
        _close(cuda[name]["losses"], cpu[name]["losses"], f"{name} losses")
        for k, (g, r) in enumerate(zip(cuda[name]["grads"], cpu[name]["grads"])):
            _close(g, r, f"{name}: gradient of parameter {k}")


def test_the_runtime_tests_cells_on_the_emulated_device_equal_numpy(emulated_run):
    """Level kernels over whole arrays (interpreter._LevelKernel) on edges, three slots, a DAG
    and float64 compute what the NumPy backend does."""
    cpu, cuda = emulated_run["cpu"]["cells"], emulated_run["cuda"]["cells"]
    backends = cuda.pop("backends")
    assert set(cuda) == {"binary", "child_sum", "k_ary"}
    for name in cuda:
        for k, (a, b) in enumerate(zip(cuda[name], cpu[name])):
            _close(a, b, f"{name}: value {k}")
    # a plan the C issuer's tables do not cover stays on the Python loop, and says why
    assert backends["binary"] == backends["k_ary"] == ["cupy (levels issued from C)"] * 2
    assert backends["child_sum"] == ["cupy (levels issued from Python: its row moves are not "
                                     "one launch a level (edges, or a state of another "
                                     "dtype))"] * 2, backends


def test_per_row_tensors_issued_from_c_equal_numpy(emulated_run):
    """Per-row tensors on C-issued levels (views of each row, a shared operand and a row
    broadcast into an elementwise kernel, sums over either axis of a row) give what NumPy does,
    values and gradients, every level issued from C."""
    cpu, cuda = emulated_run["cpu"]["row_tensors"], emulated_run["cuda"]["row_tensors"]
    assert cuda["backends"] == ["cupy (levels issued from C)"] * 2, cuda["backends"]
    for k, (a, b) in enumerate(zip(cuda["values"], cpu["values"])):
        _close(a, b, f"value {k}")


def test_td_generate_grows_and_differentiates_on_the_emulated_device_as_on_numpy(emulated_run):
    cpu, cuda = emulated_run["cpu"]["td_generate"], emulated_run["cuda"]["td_generate"]
    assert cuda["vertices"] == cpu["vertices"] > 6  # (the same trees, grown past the roots)
    _close(cuda["push"], cpu["push"], "pushed rows")
    for k, (g, r) in enumerate(zip(cuda["grads"], cpu["grads"])):
        _close(g, r, f"gradient of parameter {k}")


def test_the_tree_lstm_takes_three_launches_per_level(emulated_run):
    """The README's Tree-LSTM: forward, one gather of both children into the product's input
    and the kept c's, the product, the gates with the bias add inside; backward, the cell's
    gradient, the product, one scatter-add of both children's [dh, dc]. The leaves' level
    skips the product and writes no zeros: the gather's launch writes the zero children into
    the product's input, and a zero level's stand-in is made once, not once a call."""
    for explained in (emulated_run["cuda"]["readme"]["explain"][0],
                      emulated_run["cuda"]["models"]["tree_lstm"]):
        forward, backward = explained["forward"], explained["backward"]  # were 8.9 and 5.8
        assert forward <= 3 and backward <= 3, (forward, backward)
    later = emulated_run["cuda"]["readme"]["explain"][1]  # (the first call makes the stand-in)
    assert "fill" not in later["forward_launches_by_category"], later


def test_ops_and_an_autobatched_program_on_the_emulated_device_equal_numpy(emulated_run):
    for what in ("ops", "autobatch"):
        for k, (a, b) in enumerate(zip(emulated_run["cuda"][what], emulated_run["cpu"][what])):
            _close(a, b, f"{what} value {k}")
    assert emulated_run["launches"]["kernel"] > 0 and emulated_run["launches"]["copy"] > 0


# --- the emulated module's pieces, in-process ----------------------------------------------------

def test_device_arrays_are_typed_as_device_arrays_and_refuse_host_arrays():
    a = cp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(a, cp.ndarray) and type(a) is not np.ndarray
    assert isinstance(cp.tanh(a), cp.ndarray) and isinstance(a.sum(), cp.ndarray)
    np.testing.assert_array_equal(a.get(), np.arange(6).reshape(2, 3))
    assert type(a.get()) is np.ndarray
    with pytest.raises(TypeError, match="host-device"):
        a + np.ones(3, np.float32)
    with pytest.raises(TypeError, match="host-device"):
        cp.tanh(np.ones(3))


def test_launches_are_counted_by_category_and_views_launch_nothing():
    a = cp.asarray(np.ones((4, 3), np.float32))
    with emulated.counter.measure() as got:
        a.T.reshape(3, 4)[1:]  # views
        cp.empty((5, 5))
    assert got == {}
    with emulated.counter.measure() as got:
        b = a @ a.T  # a library product
        c = cp.tanh(b) + 1  # two elementwise launches
        c[cp.asarray(np.array([0, 2]))]  # an upload, then a gather
        cp.zeros((3,))
        c.get()
    assert got == {"library": 1, "elementwise": 2, "copy": 3, "fill": 1}


def test_raw_and_elementwise_kernels_run_their_cuda_source_through_the_shim():
    from minicavs.cuda import kernels

    src = cp.asarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    idx = cp.asarray(np.array([3, -1, 0], dtype=np.int32))
    source = kernels.kernel_source("gather_rows", np.float32)
    gather = cp.RawKernel(source.code, source.name)
    out = cp.empty((3, 3), np.float32)
    with emulated.counter.measure() as got:
        gather((1,), (256,), (src, idx, out, np.int64(3), np.int64(3)))
    assert got == {"kernel": 1}
    np.testing.assert_array_equal(out.get(), kernels.gather_rows_numpy(src.get(), idx.get()))

    kernel = cp.ElementwiseKernel("T x, T y", "T z", "z = x * y + (T)1;", "emulated_fma_free")
    x = cp.asarray(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    y = cp.asarray(np.float32([1, 2, 3]))  # broadcast along rows
    z = cp.empty((2, 3), np.float32)
    with emulated.counter.measure() as got:
        kernel(x, y, z)
    assert got == {"kernel": 1}
    np.testing.assert_array_equal(z.get(), x.get() * y.get() + np.float32(1))


def _fill_kernel(name, body="out[i] = (float)i * 2.0f;"):
    return cp.RawKernel(
        f'extern "C" __global__ void {name}(float* out, long long n) {{\n'
        f'    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n'
        f'         i += (long long)blockDim.x * gridDim.x) {{ {body} }}\n}}\n', name)


def _compiling_threads(monkeypatch):
    """The names of the threads that compile a kernel through the shim, from now on."""
    from minicavs.cuda import shim

    threads, made = [], shim.shim_kernel
    monkeypatch.setattr(shim, "shim_kernel", lambda code, name: (
        threads.append(threading.current_thread().name), made(code, name))[1])
    return threads


def test_a_kernel_compiles_ahead_on_a_worker_and_its_launch_waits_for_it(monkeypatch):
    """``cuda/ahead.py``: a kernel made starts compiling on a worker thread; ``ready`` (what a
    launch and the C issuer call first) returns once it has, and the launch compiles nothing."""
    from minicavs.cuda import ahead

    threads = _compiling_threads(monkeypatch)
    kernel = _fill_kernel("minicavs_ahead_fill")
    ahead.start(kernel, cp.cuda.Device(0))
    while not threads:  # (once a worker has it, ready waits for it to end)
        time.sleep(0.001)
    assert ahead.ready(kernel) is kernel and ahead.pending() == 0
    assert threads == ["minicavs-cuda-compile"]
    assert "minicavs_ahead_fill" not in [name for name, _ in ahead.failures()]
    out = cp.empty(5, np.float32)
    kernel((1,), (32,), (out, np.int64(5)))
    np.testing.assert_array_equal(out.get(), [0, 2, 4, 6, 8])
    assert threads == ["minicavs-cuda-compile"]  # (not again at the launch)


def test_a_kernel_not_started_yet_is_compiled_by_its_launch(monkeypatch):
    """A kernel still queued when it is needed is taken back (its launch compiles it at once,
    not after the kernels queued before it), and no worker compiles it after."""
    from minicavs.cuda import ahead

    threads = _compiling_threads(monkeypatch)
    monkeypatch.setattr(ahead, "MOST_WORKERS", 0)  # (no worker starts: it stays queued)
    kernel = _fill_kernel("minicavs_ahead_taken", "out[i] = 7.0f;")
    ahead.start(kernel)
    assert ahead.pending() == 1
    assert ahead.ready(kernel) is kernel and ahead.pending() == 0 and threads == []
    out = cp.empty(3, np.float32)
    kernel((1,), (32,), (out, np.int64(3)))
    np.testing.assert_array_equal(out.get(), [7, 7, 7])
    assert threads == [threading.current_thread().name]
    monkeypatch.setattr(ahead, "MOST_WORKERS", 8)
    other = _fill_kernel("minicavs_ahead_after_taken", "out[i] = 1.0f;")
    ahead.start(other)  # (a worker now: it skips the taken one)
    while ahead.pending():
        time.sleep(0.001)
    assert threads == [threading.current_thread().name, "minicavs-cuda-compile"]


def test_a_forked_child_waits_for_none_of_its_parents_compiles(monkeypatch):
    """The parent's workers do not exist in a forked child: it compiles what it launches."""
    from minicavs.cuda import ahead

    monkeypatch.setattr(ahead, "MOST_WORKERS", 0)  # (it stays queued in the parent)
    kernel = _fill_kernel("minicavs_ahead_forked", "out[i] = 5.0f;")
    ahead.start(kernel)
    pid = os.fork()
    if pid == 0:  # the child: nothing pending, its launch compiles the kernel
        ok = False
        try:
            ok = ahead.pending() == 0 and ahead.ready(kernel) is kernel
            out = cp.empty(2, np.float32)
            kernel((1,), (32,), (out, np.int64(2)))
            ok = ok and out.get().tolist() == [5.0, 5.0]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0 and ahead.pending() == 1
    ahead.ready(kernel)  # (taken back here too)


def test_a_kernel_that_fails_to_compile_ahead_raises_at_its_launch():
    """A compile ahead's failure is not lost: the launch compiles again and raises the
    compiler's error."""
    from minicavs.cuda import ahead

    kernel = _fill_kernel("minicavs_ahead_broken", "out[i] = undeclared;")
    ahead.start(kernel)
    while ahead.pending():  # (its worker's compile failed, quietly)
        time.sleep(0.001)
    assert ahead.ready(kernel) is kernel
    assert ahead.failures()[-1][0] == "minicavs_ahead_broken"
    with pytest.raises(mc_errors.KernelCompileError, match="undeclared"):
        kernel((1,), (32,), (cp.empty(2, np.float32), np.int64(2)))


def test_the_common_kernels_compiled_ahead_stop_at_exit(tmp_path):
    """The kernels a GPU job's first graphs or block start compiling (side by side): a
    process that ends while they compile stops their compilers, leaves no scratch behind."""
    fake = tmp_path / "slow-c++"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "slow-c++ 1.0"; '
                    'exit 0; fi\nsleep 60\n')
    fake.chmod(0o755)
    script = textwrap.dedent("""
        import time
        import minicavs as mc
        from minicavs.cuda import ahead, kernels
        mc.set_device("cuda")
        kernels.compile_ahead()  # (what a GPU job's first graphs or block start)
        print("PENDING", ahead.pending(), len(kernels.COMMON))
        time.sleep(1)  # (their compilers running when the process ends)
        """)
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", CXX=str(fake),
               MINICAVS_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    pending, common = map(int, done.stdout.split("PENDING")[1].split())
    assert pending == common  # (all queued or compiling: the compiler takes a minute)
    assert time.perf_counter() - started < 45
    assert not list((tmp_path / "shim").glob("*.part"))


def test_autobatched_lstm_steps_on_the_emulated_device(emulated_run):
    """lstm_step chains under autobatch equal NumPy (values and gradients), and each step's
    batch takes few launches: an operand gather where its rows are not one run, the two
    products and one kernel for the sums and the cell (``SummedCellStep``; the sums were a
    launch of their own, the cell's CuPy ufuncs ten, and a copy into the slab one more)."""
    cpu, cuda = emulated_run["cpu"]["lstm"], emulated_run["cuda"]["lstm"]
    for k, (g, r) in enumerate(zip(cuda["values"], cpu["values"])):
        _close(g, r, f"value {k}")
    assert cpu["per_step_batch"] is None  # (counted on the emulated device only)
    assert cuda["per_step_batch"] <= 3, cuda["explain"]  # (the sums apart: 4)
    _close(cuda["xent"], cpu["xent"], "softmax cross-entropy")
    assert cuda["xent_launches"] <= 4  # gather, flag, the kernel, the flag back (was 13)
    assert "forward launches per batch" in cuda["explain"]


def test_autobatched_batches_issued_from_c_equal_the_interpreters(emulated_run):
    """Batches issued from C (autobatch/launches.py), forward and backward, and the '+'
    strategy's one product a signature for its shared operands, give the interpreter's values
    and gradients, and NumPy's: every batch whose ops have a launch there goes through C (here
    all but the sums), in no more launches than the interpreter makes; a launch that fails
    names the batch and its op."""
    cpu, cuda = emulated_run["cpu"]["from_c"]["python"], emulated_run["cuda"]["from_c"]
    for choice in ("python", "c"):
        for k, (g, r) in enumerate(zip(cuda[choice]["values"], cpu["values"])):
            _close(g, r, f"{choice}: value {k}")
    assert cuda["python"]["from_c"] is None and cuda["c"]["why"] is not None
    sums = {"sum (12,)", "sum (8,)"}
    assert set(cuda["c"]["why"]) == sums | {f"{s} (backward)" for s in sums}, cuda["c"]["why"]
    assert cuda["c"]["from_c"] == cuda["c"]["backward_from_c"] == cuda["c"]["batches"] - 2
    from_c, products = cuda["c"]["shared_from_c"]  # ('+': one product a signature, all from C)
    assert from_c == products > 0, cuda["c"]["shared_from_c"]
    for phase, (c, python) in enumerate(zip(cuda["c"]["launches"], cuda["python"]["launches"])):
        assert c <= python, (phase, c, python)
    assert "batches issued from C: forward " in cuda["c"]["explain"]
    assert "sum (12,): sum has no launch here" in cuda["c"]["explain"]
    from_c, half, single = cuda["half"]  # (float16: no kernel of ours takes it)
    assert from_c == 0 and abs(half - single) < 0.05 * max(1.0, abs(single)), cuda["half"]
    assert "autobatched batch: tanh (12,): fused tanh failed on rows 0..2" in cuda["failure"], \
        cuda["failure"]
    assert "(status 700 " in cuda["failure"], cuda["failure"]


GENERATED = textwrap.dedent(r'''
    import sys
    sys.path.insert(0, "tests")
    import numpy as np
    from hypothesis import HealthCheck, given, settings, strategies as st
    import minicavs as mc
    import test_autobatch as generated
    from minicavs.autobatch import segment

    mc.set_device("cuda")
    issued = [0, 0]
    forward = segment.Segment._forward

    def counted(self):
        forward(self)
        issued[0] += self.stats.get("batches_from_c", 0)
        issued[1] += self.stats["batches"]

    segment.Segment._forward = counted

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(samples=generated.samples_st, branch_reads=st.booleans())
    def check(samples, branch_reads):
        ref_values, ref_grads = generated._run(samples, None, branch_reads)
        for strategy in ("agenda+", "depth", "agenda", "depth+"):
            values, grads = generated._run(samples, strategy, branch_reads)
            for v, r in zip(values, ref_values):
                np.testing.assert_allclose(v, r, rtol=generated.RTOL, atol=generated.ATOL,
                                           err_msg=strategy)
            for name in ref_grads:
                np.testing.assert_allclose(grads[name], ref_grads[name], rtol=generated.RTOL,
                                           atol=generated.ATOL,
                                           err_msg=f"{strategy}: gradient of {name}")

    check()
    print("ISSUED", *issued)
''')


def test_generated_programs_with_batches_issued_from_c_match_eager(tmp_path):
    """tests/test_autobatch.py's generated programs (sequences, trees, DAGs over thirteen kinds
    of node, branches that read a value mid-block) on the emulated device: autobatched under
    each strategy, most batches issued from C (the plain strategies' backward batches with a
    parameter's gradient on the interpreter), equal to eager execution on the same device
    (float64, 1e-9)."""
    script = tmp_path / "generated.py"
    script.write_text(GENERATED)
    env = dict(os.environ, MINICAVS_CUDA_EMULATE="1", MINICAVS_DEVICE="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MINICAVS_CUDA_ISSUER", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    from_c, batches = map(int, done.stdout.split("ISSUED")[-1].split())
    assert batches > 100 and from_c > batches // 2, (from_c, batches)


def test_repeated_rows_on_the_emulated_device_add_every_term(emulated_run):
    """A backward scatter with repeated rows (the atomic kernel, and ``add.at`` into a view of
    some columns) equals NumPy; the segment's row indices went over in one copy."""
    cpu, cuda = emulated_run["cpu"]["repeated"], emulated_run["cuda"]["repeated"]
    for k, (g, r) in enumerate(zip(cuda["values"], cpu["values"])):
        _close(g, r, f"value {k}")
    assert cuda["scatters"] > 0 and cpu["uploads"] is None
    assert cuda["uploads"] <= 2  # the indices, and the data leaves' slab (was one a gather)
    assert cuda["host_us_per_node"] > 0 and cpu["host_us_per_node"] > 0
    # minicavs' own host time leaves the stand-in library's time out, the kernels' and its
    # bookkeeping's (which on a GPU is CuPy's and the driver's), as the level loops' does
    slowed = cuda["slowed"]  # (the same step's host time, the stand-ins slept in or not)
    assert slowed["slept_s"] > 0.05, slowed
    assert slowed["host_s"] - slowed["unslowed_host_s"] < 0.25 * slowed["slept_s"], slowed


def test_an_lstm_segment_moves_its_indices_to_the_device_once(emulated_run):
    # the indices, the data leaves' slab, a kernel's constant on its first run (was 2 more
    # per batch of steps: a gather's and a scatter's host indices)
    assert emulated_run["cuda"]["lstm"]["uploads"] <= 3


def test_a_training_steps_launches_beside_f_are_what_they_must_be(emulated_run):
    """A batch's index arrays go to the device in one copy (its child slots with them); the
    cross-entropy gradient of a mean (one value for every row) is its kernel alone; reading the
    loss is one copy back (no fingerprint of the array: the copy cannot write into it); Adam
    steps every parameter in one launch (and one copy of their addresses, none where they are
    those of a step before)."""
    found = emulated_run["overheads"]
    assert found["indices"] == {"copy": 1}, found
    assert found["xent_grad"] == {"kernel": 1}, found
    assert found["item"] == {"copy": 1}, found
    assert found["adam"] == {"copy": 1, "kernel": 1}, found  # (three parameters, one launch)
    assert found["adam_again"] == {"kernel": 1}, found


def test_a_calls_rows_go_to_the_device_once_for_its_forward_and_backward(emulated_run):
    copies = emulated_run["overheads"]["rows_copied"]
    assert copies.count("_selected") == 1, copies


def test_ids_copied_from_the_host_are_checked_by_the_bounds_taken_there(emulated_run):
    """A take of rows by word ids made on the host checks them by the bounds taken before the
    copy: the ids as int32 and the gather, no reductions, no read back (a wait for the device);
    a cross-entropy's labels likewise (its kernel's flag not read). A bad id, and one written
    through ``.data`` after the copy, are still caught and named."""
    found = emulated_run["overheads"]["host_ids"]
    assert found["take"] == {"copy": 1, "kernel": 1}, found
    assert found["take_view"] == {"copy": 1, "kernel": 1}, found
    assert found["rows"] == [[0, 1, 2], [9, 10, 11], [0, 0, 0]], found
    assert found["xent"] == {"kernel": 1}, found
    assert "index 5 at position 1" in found["bad"], found
    assert "index 4 at position 1" in found["written"], found
    assert "label 3" in found["bad_label"], found


_LAYOUTS = ("rows", "window", "transposed", "transposed window")


def _laid_out(x, layout, rng):
    """``x`` (values) as a device array of ``layout``: its own rows, some columns of a wider
    array, the transpose of a row-major array, or of some of its columns."""
    wide = lambda a: np.concatenate(  # noqa: E731
        [rng.standard_normal((a.shape[0], 2)).astype(a.dtype), a,
         rng.standard_normal((a.shape[0], 3)).astype(a.dtype)], axis=1)
    if layout == "rows":
        return cp.asarray(x)
    if layout == "window":
        return cp.asarray(wide(x))[:, 2:2 + x.shape[1]]
    if layout == "transposed":
        return cp.asarray(np.ascontiguousarray(x.T)).T
    return cp.asarray(wide(np.ascontiguousarray(x.T)))[:, 2:2 + x.shape[0]].T


@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from(_LAYOUTS), st.sampled_from(_LAYOUTS), st.sampled_from(("rows", "window")),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**16))
def test_products_through_cublas_equal_numpy_for_every_layout(m, n, k, layout_a, layout_b,
                                                              layout_out, dtype, seed):
    """cuda/blas.py's one cuBLAS call (emulated: column-major, as cuBLAS reads it) for windows
    and transposed views of the operands, into an output that may be a window itself."""
    from minicavs.cuda import blas

    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal(s).astype(dtype) for s in ((m, k), (k, n)))
    a, b = _laid_out(x, layout_a, rng), _laid_out(y, layout_b, rng)
    out = _laid_out(np.full((m, n), np.nan, dtype), layout_out, rng)
    assert blas._plan(a, b, out)  # (the layouts it is for: no fallback)
    assert blas.matmul(cp, a, b, out) is out
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.get(), x @ y, rtol=tol, atol=tol)
    np.testing.assert_allclose(blas.matmul(cp, a, b).get(), x @ y, rtol=tol, atol=tol)


def test_products_cublas_cannot_take_go_to_matmul(monkeypatch):
    from minicavs.cuda import blas

    calls = []
    gemm = cp.cuda.cublas.sgemm
    monkeypatch.setattr(cp.cuda.cublas, "sgemm", lambda *args: calls.append(1) or gemm(*args))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    a, w = cp.asarray(x), cp.asarray(rng.standard_normal((3, 5)).astype(np.float32))
    strided = a[:, ::2]  # (columns two apart: no leading dimension describes it)
    assert blas.operand(strided) is None
    np.testing.assert_allclose(blas.matmul(cp, strided, w).get(), x[:, ::2] @ w.get(),
                               rtol=1e-5)
    assert calls == []
    square = cp.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    expected = square.get() @ square.get()
    np.testing.assert_allclose(blas.matmul(cp, square, square).get(), expected, rtol=1e-5)
    assert calls == [1]  # (the cuBLAS call where the layouts allow)
    np.testing.assert_allclose(blas.matmul(cp, square, square, out=square).get(), expected,
                               rtol=1e-5)
    assert calls == [1]  # (not where the output is an operand)
    ints = cp.asarray(np.arange(6).reshape(2, 3))
    assert (blas.matmul(cp, ints, ints.T).get() == np.arange(6).reshape(2, 3) @
            np.arange(6).reshape(2, 3).T).all()


def test_column_sums_are_one_cublas_call_and_equal_numpy():
    """A bias's gradient, a matrix's rows summed (some of them too: the rows a loss reads), is
    ones · X in one cuBLAS call on a GPU, the row of ones made once; any other sum is CuPy's."""
    import minicavs as mc
    from minicavs.ops import reduce

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((300, 9)).astype(dtype)
        reduce._column_sums(cp, cp.asarray(x), (0,), False)  # (the row of ones: 300 or more)
        for rows, expected in ((cp.asarray(x), x.sum(0)), (cp.asarray(x)[7:250], x[7:250].sum(0))):
            with emulated.counter.measure() as got:
                sums = reduce._column_sums(cp, rows, (0,), False)
            assert got == {"library": 1}, got
            np.testing.assert_allclose(sums.get(), expected, rtol=1e-5, atol=1e-5)
        with emulated.counter.measure() as got:
            kept = reduce._column_sums(cp, cp.asarray(x), (0,), True)
        assert kept.shape == (1, 9) and got == {"copy": 1, "library": 1}, got
        with emulated.counter.measure() as got:  # (over the columns: CuPy's reduction)
            np.testing.assert_allclose(reduce._column_sums(cp, cp.asarray(x), (1,), False).get(),
                                       x.sum(1), rtol=1e-5, atol=1e-5)
        assert "library" not in got, got
    t = mc.tensor(cp.asarray(x), requires_grad=True)  # (through the op: its value and gradient)
    mc.sum(t, axis=0).backward(mc.tensor(cp.asarray(np.arange(9.0))))
    np.testing.assert_allclose(t.grad.numpy(), np.broadcast_to(np.arange(9.0), x.shape))


# --- the C issuer (cuda/issuer.py) on the emulated device's driver ------------------------------

def _issuer_or_skip():
    from minicavs.cpu import build
    from minicavs.cuda import issuer

    reason = build.unavailable()
    if reason is not None:
        pytest.skip(f"the C issuer needs native code: {reason}")
    return issuer, issuer.Driver(cp)


def _run_table(issuer, driver, ops, names, arrays, lo, n):
    from minicavs.cpu.kernels import data_address

    table = np.array([data_address(a) for a in arrays], np.int64)
    context = driver.context(table)
    driver.issue(issuer.Table(np.array([len(names)] + ops, np.int64), names.__getitem__),
                 lo, n, context)


def test_the_issuer_finds_each_operand_at_the_levels_first_row():
    """A table's pointers are ``table[slot] + offset + lo * row_bytes``; its product has the
    level's rows; its launch runs over n rows of its width (here: zeros into columns 2..5 of
    rows lo..lo+n of a (10, 7) buffer, then C[lo:lo+n] = A[lo:lo+n] @ B through cuBLAS's
    stand-in, column-major as a GPU's)."""
    from minicavs.cuda import blas, windows

    issuer, driver = _issuer_or_skip()
    rng = np.random.default_rng(0)
    buffer = cp.asarray(rng.standard_normal((10, 7)).astype(np.float32))
    a = cp.asarray(rng.standard_normal((10, 3)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    c = cp.asarray(np.full((10, 4), np.nan, np.float32))
    before, a_host, b_host = buffer.get(), a.get(), b.get()
    zeros = emulated.RawKernel(windows.zero_source(4, 7, np.float32).code,
                               windows.zero_source(4, 7, np.float32).name)
    ops = [issuer.LAUNCH, emulated.c_function(zeros), 4, 3,
           issuer.POINTER, 0, 7 * 4, 2 * 4, issuer.ROWS, 0, 0, 0, issuer.FIRST, 0, 0, 0,
           issuer.GEMM, 0, blas.OP_N, blas.OP_N, 4, 3, 2, 0, 0, 4, 1, 3 * 4, 0, 3, 3, 4 * 4, 0, 4]
    with emulated.counter.measure() as launched:
        _run_table(issuer, driver, ops, ["zeros", "product"], [buffer, a, b, c], lo=3, n=5)
    assert launched == {"kernel": 1, "library": 1}
    expected = before.copy()
    expected[3:8, 2:6] = 0
    np.testing.assert_array_equal(buffer.get(), expected)
    np.testing.assert_allclose(c.get()[3:8], a_host[3:8] @ b_host, rtol=1e-6)
    assert np.isnan(c.get()[:3]).all() and np.isnan(c.get()[8:]).all()
    with emulated.counter.measure() as launched:  # (no rows: nothing to launch)
        _run_table(issuer, driver, ops, ["zeros", "product"], [buffer, a, b, c], lo=3, n=0)
    assert launched == {}


def test_a_failed_launch_from_the_issuer_says_which_operation_and_rows():
    """A stand-in's own error (here cuBLAS's: a leading dimension below the rows) reaches the
    caller as it was raised; a status from the driver (700, an illegal address) becomes a
    DeviceError naming the operation and the level's rows."""
    import ctypes

    from minicavs.errors import DeviceError

    issuer, driver = _issuer_or_skip()
    a, b, c = (cp.zeros((4, 4), np.float32) for _ in range(3))
    bad_ld = [issuer.GEMM, 0, 0, 0, 4, 4, 1, 0, 0, 1, 0, 16, 0, 4, 2, 16, 0, 4]
    with pytest.raises(ValueError, match="leading dimension 1 below the 4 rows"):
        _run_table(issuer, driver, bad_ld, ["product h @ U"], [a, b, c], lo=0, n=2)
    failing = emulated._LAUNCH_T(lambda *args: 700)
    driver.launch = ctypes.cast(failing, ctypes.c_void_p).value
    ops = [issuer.LAUNCH, 1, 4, 2, issuer.ROWS, 0, 0, 0, issuer.FIRST, 0, 0, 0]
    with pytest.raises(DeviceError, match=r"level loop: the level's gathers failed on rows "
                                          r"5\.\.6 \(status 700 "):
        _run_table(issuer, driver, ops, ["the level's gathers"], [a], lo=5, n=2)
    # several levels in one C call: the error names the level that failed (the first has no
    # rows, so nothing is launched for it)
    from minicavs.cpu.kernels import data_address

    table = issuer.Table(np.array([1] + ops, np.int64), ["the level's gathers"].__getitem__)
    context = driver.context(np.array([data_address(a)], np.int64))
    with pytest.raises(DeviceError, match=r"failed on rows 7\.\.9 \(status 700 "):
        driver.issue_levels([(table, 0, 0), (table, 7, 3)], context)
    assert not emulated.c_failure


def test_without_native_code_the_issuer_says_why(monkeypatch):
    """No compiler (or MINICAVS_NATIVE=0): levels are issued from Python, and explain()'s
    backend name carries this reason."""
    from minicavs.cpu import build
    from minicavs.cuda import issuer

    monkeypatch.setattr(build, "unavailable", lambda: "MINICAVS_NATIVE=0 is set")
    issuer.driver.cache_clear()
    try:
        assert issuer.driver(cp) == "the C issuer needs native code (MINICAVS_NATIVE=0 is set)"
    finally:
        issuer.driver.cache_clear()
    monkeypatch.setenv("MINICAVS_CUDA_ISSUER", "gpu")
    with pytest.raises(mc_errors.ArgumentError, match="MINICAVS_CUDA_ISSUER='gpu': expected 'c'"):
        issuer.enabled()


@given(st.integers(1, 9), st.integers(1, 7), st.integers(1, 9), st.sampled_from([0, 1]),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 3), st.integers(0, 2**16))
def test_the_row_product_kernel_equals_numpy(n, k, n_cols, op_b, dtype, pad, seed):
    """cuda/products.py's kernel through the shim: ``C = A · B`` for n rows of A read at a
    wider row stride, B row-major or the transpose of one, into rows of C at a wider stride,
    rows and columns not multiples of its 4 x 4 tiles; C's other columns untouched."""
    from minicavs.cuda import products, shim

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, k + pad)).astype(dtype)
    w = rng.standard_normal((k, n_cols) if op_b == 0 else (n_cols, k)).astype(dtype)
    c = np.full((n, n_cols + pad), np.nan, dtype)
    name, code = products.product_source(np.dtype(dtype), op_b)
    kernel = shim.shim_kernel(code, name)
    width = -(-n_cols // 4)
    kernel((max(1, -(-n * width // 256)),), (256,),
           (a, w, c, np.int64(k + pad), np.int64(w.shape[1]), np.int64(n_cols + pad),
            np.int64(n_cols), np.int64(k), np.int64(n), np.int64(0)))
    want = a[:, :k].astype(np.float64) @ (w if op_b == 0 else w.T).astype(np.float64)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c[:, :n_cols], want, rtol=tol, atol=tol * max(1.0, k))
    assert np.isnan(c[:, n_cols:]).all()


def test_which_product_a_level_runs_is_measured_or_forced(monkeypatch):
    """Ours only where forced or measured faster: on the emulated device nothing is timed, so
    cuBLAS's stand-in; MINICAVS_KERNELS=own / blas force one."""
    from minicavs.cuda import products

    issuer, driver = _issuer_or_skip()
    monkeypatch.delenv("MINICAVS_KERNELS", raising=False)
    assert products.most_rows(driver, np.float32, 0, 64, 128) == 0
    monkeypatch.setenv("MINICAVS_KERNELS", "own")
    assert products.most_rows(driver, np.float32, 0, 64, 128) == products.ALWAYS
    monkeypatch.setenv("MINICAVS_KERNELS", "blas")
    assert products.most_rows(driver, np.float32, 1, 64, 128) == 0


def test_a_product_runs_our_kernel_up_to_its_measured_rows_and_cublas_past_them():
    """The issuer's PRODUCT: at most ``most`` rows our kernel (a launch), more rows the gemm
    (a library call); both write C[lo:lo+n] = A[lo:lo+n] @ B."""
    from minicavs.cuda import blas, products

    issuer, driver = _issuer_or_skip()
    rng = np.random.default_rng(1)
    a, b = (cp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((12, 5), (5, 6)))
    c = cp.asarray(np.full((12, 6), np.nan, np.float32))
    gemm = [0, blas.OP_N, blas.OP_N, 6, 5, 1, 0, 0, 6, 0, 5 * 4, 0, 5, 2, 6 * 4, 0, 6]
    own = products.launch_body(driver, np.float32, blas.OP_N, (0, 5 * 4, 0), (1, 0, 0),
                               (2, 6 * 4, 0), 5, 6, 6, 6, 5)
    ops = [issuer.PRODUCT, 4] + own + gemm + [issuer.PRODUCT, 4] + own + gemm
    for lo, n, expected in ((1, 4, "kernel"), (5, 6, "library")):
        with emulated.counter.measure() as launched:
            _run_table(issuer, driver, ops, ["product", "again"], [a, b, c], lo=lo, n=n)
        assert launched == {expected: 2}, (n, launched)
    np.testing.assert_allclose(c.get()[1:11], a.get()[1:11] @ b.get(), rtol=1e-5)
    assert np.isnan(c.get()[[0, 11]]).all()


def test_a_table_must_pass_a_kernel_its_parameter_count():
    """cuLaunchKernel reads as many arguments as the kernel declares: a table is checked
    against the kernel's source when it is written, never launched short."""
    from minicavs.cuda import issuer, windows
    from minicavs.errors import KernelCompileError

    zeros = emulated.RawKernel(windows.zero_source(4, 7, np.float32).code,
                               windows.zero_source(4, 7, np.float32).name)
    issuer.check_arguments(zeros, 3)  # out, n, lo
    with pytest.raises(KernelCompileError, match=r"minicavs_zero_rows_f32_4_7 takes 3 "
                                                 r"arguments, a table passes 2"):
        issuer.check_arguments(zeros, 2)
