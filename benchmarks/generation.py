"""The generation workload: TD-TreeLSTM trees grown top-down from label-conditioned roots, a
structure decided at run time (the recursion paper §6.4), written once per system.

The math, identical in every system (E = H = 128, float32, no gradients):

* a vertex pulls a condition id — at a root its label ``i % 5``, below ``LEFT`` or ``RIGHT``
  (its slot under its parent) — and reads its parent's (h, c), zeros at a root;
* ``i, f, o, u = split(emb[cond] W + h_p U + b)``, ``c = σ(i)⊙tanh(u) + σ(f)⊙c_p``,
  ``h = σ(o)⊙tanh(c)``, ``logits = h W_out + b_out`` over 1 + VOCAB classes;
* the decision: the vertex gets two children (LEFT, RIGHT) if ``logits[0] > 0`` and its
  depth is below ``MAX_DEPTH``, else it is a leaf whose word is ``argmax(logits[1:])``.

Systems: **minicavs** ``mc.grow`` (F on every tree's frontier at once, one batched decision per
step); **torch-eager** the iterative baseline, one tree at a time and one cell call per vertex
(each decision reads its value); **torch-batched** the same frontier schedule as minicavs,
written by hand in PyTorch; **dynet** one graph per tree, vertex by vertex (each decision
needs its value, so the autobatcher has nothing pending to group). Throughput is trees/s over
``batches`` of B = 64 or 1 roots; ``loss@1`` is replaced by the vertices grown from the first
batch, the same in every system up to float32 rounding at the threshold.
"""

import numpy as np

from benchmarks import common

NUM_LABELS = 61  # distinct root conditions (so trees differ), then LEFT and RIGHT
LEFT, RIGHT = NUM_LABELS, NUM_LABELS + 1
CONDITIONS = NUM_LABELS + 2
VOCAB = 1000
MAX_DEPTH = 8  # at most 2**9 - 1 vertices per tree; with the common weights trees of 256
# roots have 1 to 495 vertices (median 11, mean 165)


def load(spec, size):
    labels = np.arange(size) % NUM_LABELS
    batches = [labels[i:i + spec.batch_size].tolist() for i in range(0, size, spec.batch_size)]
    data = {"workload": spec.name, "kind": spec.kind, "title": spec.title, "unit": spec.unit,
            "embed": spec.embed, "hidden": spec.hidden, "num_classes": 1 + VOCAB,
            "vocab_size": VOCAB, "batch_size": spec.batch_size, "batches": batches,
            "num_samples": size, "units": size, "check": "vertices@1",
            "source": f"{size} roots, labels i % {NUM_LABELS}"}
    grown = reference(data, common.init_params(data))
    data["vertices"] = int(sum(grown))
    data["source"] += f", {data['vertices']:,} vertices grown (NumPy reference)"
    return data


def init_params(data, rng, uniform):
    E, H = data["embed"], data["hidden"]
    b = np.zeros(4 * H, np.float32)
    b[H:2 * H] = 1.0  # forget gate open
    b_out = np.zeros(1 + VOCAB, np.float32)
    return {"emb": rng.standard_normal((CONDITIONS, E)).astype(np.float32),
            "W": uniform((E, 4 * H), E), "U": uniform((H, 4 * H), H), "b": b,
            "W_out": uniform((H, 1 + VOCAB), H), "b_out": b_out}


def count_flops(data):
    """Forward only: per vertex 2E·4H + 2H·4H (none at a root: its parent state is zero)
    + 2H·C GEMM, 10H + 2C elementwise."""
    E, H, C = data["embed"], data["hidden"], data["num_classes"]
    vertices, roots = data["vertices"], data["num_samples"]
    gemm = vertices * (2 * E * 4 * H + 2 * H * C) + (vertices - roots) * 2 * H * 4 * H
    elementwise = vertices * (10 * H + 2 * C)
    return {"gemm": gemm, "elementwise": elementwise, "total": gemm + elementwise,
            "formula": "vertices·(2E·4H + 2H·C) + non-roots·2H·4H GEMM + "
                       "vertices·(10H + 2C) elementwise, forward only"}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference(data, params):
    """The vertices of each tree, grown with NumPy one frontier at a time (the check)."""
    H = data["hidden"]
    sizes = []
    for labels in data["batches"]:
        tree = np.arange(len(labels))
        cond = np.asarray(labels)
        h = c = np.zeros((len(labels), H), np.float32)
        depth = 0
        counts = np.zeros(len(labels), np.int64)
        while len(cond):
            counts += np.bincount(tree, minlength=len(labels))
            gates = params["emb"][cond] @ params["W"] + h @ params["U"] + params["b"]
            i, f, o, u = np.split(gates, 4, axis=1)
            c = _sigmoid(i) * np.tanh(u) + _sigmoid(f) * c
            h = _sigmoid(o) * np.tanh(c)
            logits = h @ params["W_out"] + params["b_out"]
            expand = (logits[:, 0] > 0) & (depth < MAX_DEPTH)
            rows = np.repeat(np.flatnonzero(expand), 2)
            tree, h, c = tree[rows], h[rows], c[rows]
            cond = np.tile([LEFT, RIGHT], int(expand.sum()))
            depth += 1
        sizes.extend(counts.tolist())
    return sizes


def _result(loop, data, versions):
    return common.summarize(loop, data, versions=versions)


# --- minicavs ------------------------------------------------------------------------------------

def td_tree_lstm(params, hidden, vertex_options=None):
    """The TD-TreeLSTM's vertex function over ``params`` (as Parameters, on the current
    device): a vertex's [h, c] from its parent's, and its push the logits [expand, words]."""
    import minicavs as mc

    P = {name: mc.Parameter(array.copy(), name=name) for name, array in params.items()}
    table, W, U, b, W_out, b_out = (P[k] for k in ("emb", "W", "U", "b", "W_out", "b_out"))

    def cell(v):
        x = mc.embedding(table, v.pull())
        h_parent, c_parent = mc.split(v.gather(0), 2)
        h, c = mc.lstm_gates(x @ W + h_parent @ U + b, c_parent)
        v.scatter(mc.concat([h, c]))
        v.push(h @ W_out + b_out)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(2 * hidden,),
                          push_shape=(1 + VOCAB,), arity=1, dtype="float32",
                          name="td_tree_lstm", options=vertex_options)
    return F, P


def run_minicavs(data, params, epochs, warmup, device="cpu", vertex_options=None):
    import minicavs as mc
    from minicavs import backend

    mc.set_device(device)
    F, _ = td_tree_lstm(params, data["hidden"], vertex_options)

    def expand_or_stop(frontier):
        logits = frontier.push
        expand = backend.to_numpy(logits[:, 0] > 0) & (frontier.depth < MAX_DEPTH)
        backend.to_numpy(logits[:, 1:].argmax(axis=1))  # the leaves' words
        return 2 * expand, np.tile([LEFT, RIGHT], int(expand.sum()))

    def step(labels):
        with mc.no_grad():
            growth = mc.grow(F, np.asarray(labels, np.int64), expand_or_stop,
                             max_vertices=2 ** (MAX_DEPTH + 1))
        return {"loss": growth.num_vertices}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return _result(loop, data, {"minicavs": mc.__version__, "device": device,
                                "vertex_options": vertex_options})


# --- PyTorch -------------------------------------------------------------------------------------

def _torch_cell(P, F):
    def cell(x, h, c):
        gates = F.linear(x, P["W"], P["b"])
        if h is not None:
            gates = gates + F.linear(h, P["U"])
        i, f, o, u = gates.chunk(4, dim=-1)
        c = torch_sigmoid(i) * u.tanh() + (torch_sigmoid(f) * c if c is not None else 0)
        h = torch_sigmoid(o) * c.tanh()
        return h, c, F.linear(h, P["W_out"], P["b_out"])
    return cell


def torch_sigmoid(x):
    return x.sigmoid()


def run_torch_eager(data, params, epochs, warmup):
    """The iterative baseline: one tree at a time, one cell call per vertex."""
    import torch
    import torch.nn.functional as F
    from benchmarks.peers import _torch

    P = _torch.parameters(params)
    cell = _torch_cell(P, F)
    emb = P["emb"]

    def grow_one(label):
        count = 0
        pending = [(label, None, None, 0)]
        while pending:
            cond, h_p, c_p, depth = pending.pop()
            h, c, logits = cell(emb[cond], h_p, c_p)
            count += 1
            if logits[0].item() > 0 and depth < MAX_DEPTH:
                pending.append((RIGHT, h, c, depth + 1))
                pending.append((LEFT, h, c, depth + 1))
            else:
                logits[1:].argmax().item()  # the leaf's word
        return count

    def step(labels):
        with torch.no_grad():
            return {"loss": sum(grow_one(label) for label in labels)}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return _result(loop, data, _torch.version())


def run_torch_batched(data, params, epochs, warmup, device="cpu"):
    """The frontier schedule by hand: each step one cell call on every tree's frontier."""
    import torch
    import torch.nn.functional as F
    from benchmarks.peers import _torch

    P = _torch.parameters(params, device)
    cell = _torch_cell(P, F)
    sides = torch.tensor([LEFT, RIGHT], device=device)

    def step(labels):
        count = 0
        with torch.no_grad():
            cond = torch.tensor(labels, device=device)
            h = c = None
            depth = 0
            while len(cond):
                h, c, logits = cell(P["emb"][cond], h, c)
                count += len(cond)
                expand = logits[:, 0] > 0
                if depth >= MAX_DEPTH:
                    expand = torch.zeros_like(expand)
                logits[:, 1:].argmax(dim=1).cpu()  # the leaves' words
                rows = torch.repeat_interleave(torch.nonzero(expand)[:, 0], 2)
                h, c = h[rows], c[rows]
                cond = sides.repeat(len(rows) // 2)
                depth += 1
        return {"loss": count}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return _result(loop, data, _torch.version(device))


# --- DyNet ---------------------------------------------------------------------------------------

def run_dynet(data, params, epochs, warmup):
    """One graph per tree, vertex by vertex: a decision reads its vertex's value."""
    import dynet as dy

    model = dy.ParameterCollection()
    emb = model.lookup_parameters_from_numpy(params["emb"])
    W = model.parameters_from_numpy(params["W"].T.copy())
    U = model.parameters_from_numpy(params["U"].T.copy())
    b = model.parameters_from_numpy(params["b"])
    W_out = model.parameters_from_numpy(params["W_out"].T.copy())
    b_out = model.parameters_from_numpy(params["b_out"])
    H = data["hidden"]

    def grow_one(label):
        dy.renew_cg()
        count = 0
        pending = [(label, None, None, 0)]
        while pending:
            cond, h_p, c_p, depth = pending.pop()
            gates = dy.affine_transform([b, W, dy.lookup(emb, cond)])
            if h_p is not None:
                gates = gates + U * h_p
            i, f, o = (dy.logistic(dy.pick_range(gates, k * H, (k + 1) * H)) for k in range(3))
            u = dy.tanh(dy.pick_range(gates, 3 * H, 4 * H))
            c = dy.cmult(i, u) if c_p is None else dy.cmult(i, u) + dy.cmult(f, c_p)
            h = dy.cmult(o, dy.tanh(c))
            logits = dy.affine_transform([b_out, W_out, h]).npvalue()
            count += 1
            if logits[0] > 0 and depth < MAX_DEPTH:
                pending.append((RIGHT, h, c, depth + 1))
                pending.append((LEFT, h, c, depth + 1))
            else:
                int(np.argmax(logits[1:]))  # the leaf's word
        return count

    def step(labels):
        return {"loss": sum(grow_one(label) for label in labels)}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return _result(loop, data, {"dynet": getattr(dy, "__version__", "?")})

