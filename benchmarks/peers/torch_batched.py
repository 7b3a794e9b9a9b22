"""PyTorch, batched by hand: what a skilled user writes to batch each workload.

* Tree-LSTM: DGL's schedule. Per mini-batch, NumPy computes every vertex's level (height) and
  orders the vertices by level, so each level is one contiguous block of rows; h and c live
  in storage preallocated for all vertices. Level 0 (all leaves: an SST vertex has 0 or 2
  children) is one embedding lookup and one GEMM; each later level gathers its children's
  rows with one ``index_select`` per storage, runs the cell once on the whole level and
  writes its rows into its block. The classifier is one GEMM over all internal rows.
* TreeRNN / RNTN: the same schedule; leaves are one embedding lookup, each level one
  ``index_select``, one GEMM (and for the RNTN one ``einsum`` for xᵀ V x).
* Tree-FC: the perfect reshape. Complete trees numbered level by level make adjacent rows
  siblings, so a level is ``(B, n, H) -> (B, n/2, 2H)`` and one GEMM: no gather at all.
* Var-LSTM: ``nn.LSTM`` over a ``PackedSequence``, and one GEMM + cross-entropy over the
  packed outputs. Note: on the CPU, PyTorch 2.13 runs a packed sequence with its native
  per-step loop (addmm + gate ops per time step); its oneDNN fused LSTM
  (``aten::mkldnn_rnn_layer``) is taken only for a padded (T, B, E) input. ``options["lstm"] =
  "padded"`` runs that instead: the whole padded block through oneDNN (an LSTM is causal, so
  the real tokens' outputs are exact), the softmax layer and loss on the real tokens only.
  The two were within noise of each other here at one thread.

``construction_seconds``: the per-batch NumPy schedule (levels, orders, index arrays,
padding/packing) and, on a GPU, copying its index arrays to the device, measured inside each
step. ``device="cuda"`` runs the same code on a GPU (``torch_batched_cuda``, the peer of
minicavs-cuda); ``loss.item()`` each step waits for the device, so epoch times are real.
"""

import time

import numpy as np

from benchmarks import common, generation
from benchmarks.peers import _torch

available = _torch.available


def tree_schedule(trees):
    """Levels of a batch of binary trees with vectorised NumPy: the vertices in level order,
    the level offsets, and each row's children as rows (interleaved left, right)."""
    sizes = np.array([t.num_vertices for t in trees])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    arrays = [common.tree_arrays(t) for t in trees]
    left = np.concatenate([a[0] + np.where(a[0] >= 0, o, 0) for a, o in zip(arrays, offsets)])
    right = np.concatenate([a[1] + np.where(a[1] >= 0, o, 0) for a, o in zip(arrays, offsets)])
    internal = np.flatnonzero(left >= 0)
    level = np.zeros(len(left), dtype=np.int64)
    while True:  # one pass per level of the deepest tree; children-first, so this converges
        new = 1 + np.maximum(level[left[internal]], level[right[internal]])
        if np.array_equal(new, level[internal]):
            break
        level[internal] = new
    order = np.argsort(level, kind="stable")
    row_of = np.empty_like(order)
    row_of[order] = np.arange(len(order))
    level_offsets = np.concatenate([[0], np.cumsum(np.bincount(level))])
    children = np.stack([row_of[left[order]], row_of[right[order]]], axis=1)  # -1 rows: leaves
    return order, level_offsets, children


def run(data, params, epochs, warmup, options=None, device="cpu"):
    if data["kind"] == "td_generate":
        return generation.run_torch_batched(data, params, epochs, warmup, device)
    import torch
    import torch.nn.functional as F

    P = _torch.parameters(params, device)
    optimizer = torch.optim.Adam(list(P.values()), lr=1e-3)
    H, kind = data["hidden"], data["kind"]

    def to(array):  # a NumPy array on the device (on the CPU: the same memory, no copy)
        return torch.from_numpy(array).to(device)

    if kind == "tree_lstm":
        def batch_loss(trees):
            started = time.perf_counter()
            order, level_offsets, children = tree_schedule(trees)
            words = np.concatenate([t.words for t in trees])[order]
            labels = np.concatenate([t.labels for t in trees])[order]
            n, leaves = len(order), int(level_offsets[1])
            levels = [(int(a), int(b), to(children[a:b].reshape(-1)))
                      for a, b in zip(level_offsets[1:-1], level_offsets[2:])]
            leaf_words, internal_labels = to(words[:leaves]), to(labels[leaves:])
            construction = time.perf_counter() - started
            h = torch.zeros(n, H, device=device)
            c = torch.zeros(n, H, device=device)
            x = F.embedding(leaf_words, P["emb"])
            i, _, _, o, u = F.linear(x, P["W"], P["b"]).chunk(5, dim=1)
            c0 = torch.sigmoid(i) * torch.tanh(u)
            c[:leaves] = c0
            h[:leaves] = torch.sigmoid(o) * torch.tanh(c0)
            for a, b, rows in levels:
                h_lr = h.index_select(0, rows).view(b - a, 2 * H)
                c_lr = c.index_select(0, rows).view(b - a, 2, H)
                i, f_l, f_r, o, u = F.linear(h_lr, P["U"], P["b"]).chunk(5, dim=1)
                c_t = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_lr[:, 0]
                       + torch.sigmoid(f_r) * c_lr[:, 1])
                c[a:b] = c_t
                h[a:b] = torch.sigmoid(o) * torch.tanh(c_t)
            logits = F.linear(h[leaves:], P["W_out"], P["b_out"])
            loss = F.cross_entropy(logits, internal_labels, reduction="sum")
            return loss, construction

    elif kind in ("tree_rnn", "rntn"):
        V = P.get("V")  # RNTN: (H, 2H, 2H)

        def batch_loss(trees):
            started = time.perf_counter()
            order, level_offsets, children = tree_schedule(trees)
            words = np.concatenate([t.words for t in trees])[order]
            labels = np.concatenate([t.labels for t in trees])[order]
            n, leaves = len(order), int(level_offsets[1])
            levels = [(int(a), int(b), to(children[a:b].reshape(-1)))
                      for a, b in zip(level_offsets[1:-1], level_offsets[2:])]
            leaf_words, internal_labels = to(words[:leaves]), to(labels[leaves:])
            construction = time.perf_counter() - started
            h = torch.zeros(n, H, device=device)
            h[:leaves] = F.embedding(leaf_words, P["emb"])
            for a, b, rows in levels:
                x = h.index_select(0, rows).view(b - a, 2 * H)
                total = F.linear(x, P["U"], P["b"])
                if V is not None:  # x_n V_i x_n for all rows n and slices i at once
                    total = total + torch.einsum("nj,ijk,nk->ni", x, V, x)
                h[a:b] = torch.tanh(total)
            logits = F.linear(h[leaves:], P["W_out"], P["b_out"])
            return F.cross_entropy(logits, internal_labels, reduction="sum"), construction

    elif kind == "tree_fc":
        leaves = common.TREE_FC_LEAVES

        def batch_loss(trees):
            started = time.perf_counter()
            words = to(np.stack([t.words[:leaves] for t in trees]))  # leaves: vertices 0..255
            labels = to(np.array([t.labels[-1] for t in trees]))
            construction = time.perf_counter() - started
            B = len(trees)
            h = torch.tanh(F.linear(F.embedding(words, P["emb"]), P["W"], P["b"]))
            width = leaves
            while width > 1:
                width //= 2
                h = torch.tanh(F.linear(h.reshape(B, width, 2 * H), P["U"], P["b"]))
            logits = F.linear(h.reshape(B, H), P["W_out"], P["b_out"])
            return F.cross_entropy(logits, labels, reduction="sum"), construction

    else:  # var_lstm
        from torch.nn.utils.rnn import pack_padded_sequence

        lstm = torch.nn.LSTM(data["embed"], H).to(device)  # gates i, f, g, o: common order
        with torch.no_grad():
            lstm.weight_ih_l0.copy_(P["W"])
            lstm.weight_hh_l0.copy_(P["U"])
            lstm.bias_ih_l0.copy_(P["b"])
            lstm.bias_hh_l0.zero_()
        optimizer = torch.optim.Adam(list(P.values()) + list(lstm.parameters()), lr=1e-3)
        eos = data["eos"]

        padded = (options or {}).get("lstm", "packed") == "padded"

        def batch_loss(sentences):
            started = time.perf_counter()
            lengths = np.array([len(s) for s in sentences])
            inputs = np.zeros((lengths.max(), len(sentences)), dtype=np.int64)  # (T, B)
            targets = np.full_like(inputs, -1)  # -1: padding
            for j, s in enumerate(sentences):
                inputs[0, j] = eos
                inputs[1:len(s), j] = s[:-1]
                targets[:len(s), j] = s
            if padded:  # the whole (T, B) block through oneDNN; the loss reads real tokens
                real = to(np.flatnonzero(targets.reshape(-1) >= 0))
                targets = to(targets.reshape(-1)).index_select(0, real)
            else:
                lengths = torch.from_numpy(lengths)  # pack_padded_sequence wants them on the CPU
                targets = pack_padded_sequence(to(targets), lengths, enforce_sorted=False).data
            inputs = to(inputs)
            construction = time.perf_counter() - started
            x = F.embedding(inputs, P["emb"])
            if padded:
                out, _ = lstm(x)
                out = out.reshape(-1, H).index_select(0, real)
            else:
                out, _ = lstm(pack_padded_sequence(x, lengths, enforce_sorted=False))
                out = out.data
            logits = F.linear(out, P["W_out"], P["b_out"])
            return F.cross_entropy(logits, targets, reduction="sum"), construction

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        loss, construction = batch_loss(batch)
        loss.backward()
        optimizer.step()
        return {"loss": loss.item(), "construction": construction}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return common.summarize(loop, data, versions=_torch.version(device))
