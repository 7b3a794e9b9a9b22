"""PyTorch eager, one graph per sample: dynamic declaration without batching.

What a PyTorch user writes for a per-sample model: walk the tree (children before parents) or
the sentence, one cell evaluation per vertex/token, and sum the per-sample losses of the
mini-batch before one backward and one Adam step. Two things are done per mini-batch rather
than per vertex, as a user who knows PyTorch does them: the embedding lookup (one lookup of the
batch's words, then ``unbind``; a lookup per leaf would make each leaf's backward write a dense
V×E gradient) and the loss (each sample's classified vertices stacked into one linear +
cross-entropy). Everything on the recursion is per vertex.

Graph construction cannot be separated from computation here (define-by-run: declaring an op
runs it), so ``construction_seconds`` is not reported.
"""

import numpy as np

from benchmarks import common, generation
from benchmarks.peers import _torch

available = _torch.available


def run(data, params, epochs, warmup, options=None):
    if data["kind"] == "td_generate":
        return generation.run_torch_eager(data, params, epochs, warmup)
    import torch
    import torch.nn.functional as F

    P = _torch.parameters(params)
    optimizer = torch.optim.Adam(list(P.values()), lr=1e-3)
    H = data["hidden"]
    kind = data["kind"]

    if kind == "var_lstm":
        cell = torch.nn.LSTMCell(data["embed"], H)  # gates i, f, g, o: the common order
        with torch.no_grad():
            cell.weight_ih.copy_(P["W"])
            cell.weight_hh.copy_(P["U"])
            cell.bias_ih.copy_(P["b"])
            cell.bias_hh.zero_()
        optimizer = torch.optim.Adam(list(P.values()) + list(cell.parameters()), lr=1e-3)
        eos = data["eos"]

        def batch_loss(sentences):
            inputs = [np.concatenate([[eos], s[:-1]]) for s in sentences]
            xs = F.embedding(torch.from_numpy(np.concatenate(inputs)), P["emb"]).unbind(0)
            losses, k = [], 0
            for s in sentences:
                h = torch.zeros(H)
                c = torch.zeros(H)
                outputs = []
                for _ in range(len(s)):
                    h, c = cell(xs[k], (h, c))
                    outputs.append(h)
                    k += 1
                logits = F.linear(torch.stack(outputs), P["W_out"], P["b_out"])
                losses.append(F.cross_entropy(logits, torch.from_numpy(s), reduction="sum"))
            return torch.stack(losses).sum()

    elif kind == "tree_lstm":
        def batch_loss(trees):
            words = np.concatenate([t.words[t.words >= 0] for t in trees])
            xs = F.embedding(torch.from_numpy(words), P["emb"]).unbind(0)
            losses, k = [], 0
            for tree in trees:
                h, c, internal = [None] * tree.num_vertices, [None] * tree.num_vertices, []
                for v, kids in enumerate(tree.children):
                    if kids:
                        left, right = kids
                        gates = F.linear(torch.cat([h[left], h[right]]), P["U"], P["b"])
                        i, f_l, f_r, o, u = gates.chunk(5)
                        c[v] = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c[left]
                                + torch.sigmoid(f_r) * c[right])
                        internal.append(v)
                    else:
                        gates = F.linear(xs[k], P["W"], P["b"])
                        k += 1
                        i, _, _, o, u = gates.chunk(5)
                        c[v] = torch.sigmoid(i) * torch.tanh(u)
                    h[v] = torch.sigmoid(o) * torch.tanh(c[v])
                logits = F.linear(torch.stack([h[v] for v in internal]), P["W_out"],
                                  P["b_out"])
                labels = torch.from_numpy(tree.labels[internal])
                losses.append(F.cross_entropy(logits, labels, reduction="sum"))
            return torch.stack(losses).sum()

    elif kind in ("tree_rnn", "rntn"):
        V = P.get("V")  # RNTN: (H, 2H, 2H)

        def batch_loss(trees):
            words = np.concatenate([t.words[t.words >= 0] for t in trees])
            xs = F.embedding(torch.from_numpy(words), P["emb"]).unbind(0)
            losses, k = [], 0
            for tree in trees:
                h, internal = [None] * tree.num_vertices, []
                for v, kids in enumerate(tree.children):
                    if kids:
                        x = torch.cat([h[kids[0]], h[kids[1]]])
                        total = F.linear(x, P["U"], P["b"])
                        if V is not None:
                            total = total + torch.mv(torch.matmul(V, x), x)
                        h[v] = torch.tanh(total)
                        internal.append(v)
                    else:
                        h[v] = xs[k]
                        k += 1
                logits = F.linear(torch.stack([h[v] for v in internal]), P["W_out"],
                                  P["b_out"])
                losses.append(F.cross_entropy(logits, torch.from_numpy(tree.labels[internal]),
                                              reduction="sum"))
            return torch.stack(losses).sum()

    else:  # tree_fc
        def batch_loss(trees):
            words = np.concatenate([t.words[t.words >= 0] for t in trees])
            xs = F.embedding(torch.from_numpy(words), P["emb"]).unbind(0)
            roots, k = [], 0
            for tree in trees:
                h = [None] * tree.num_vertices
                for v, kids in enumerate(tree.children):
                    if kids:
                        h[v] = torch.tanh(F.linear(torch.cat([h[kids[0]], h[kids[1]]]),
                                                   P["U"], P["b"]))
                    else:
                        h[v] = torch.tanh(F.linear(xs[k], P["W"], P["b"]))
                        k += 1
                roots.append(h[-1])
            losses = [F.cross_entropy(F.linear(root, P["W_out"], P["b_out"]),
                                      torch.tensor(tree.labels[-1]), reduction="sum")
                      for root, tree in zip(roots, trees)]
            return torch.stack(losses).sum()

    def step(batch):
        optimizer.zero_grad(set_to_none=True)
        loss = batch_loss(batch)
        loss.backward()
        optimizer.step()
        return {"loss": loss.item()}

    loop = common.train_loop(step, data["batches"], epochs, warmup)
    return common.summarize(loop, data, versions=_torch.version(),
                            construction_note="define-by-run: not separable")
