"""A binary Tree-LSTM built on the runtime learns: the loss on generated trees goes down."""

import numpy as np

import minicavs as mc
from minicavs.data import synthetic_treebank
from minicavs.nn import Adam


def test_binary_tree_lstm_loss_goes_down():
    trees, vocab = synthetic_treebank(64, seed=1)
    rng = np.random.default_rng(0)
    E, H, C = 16, 16, 5
    table = mc.Parameter(rng.standard_normal((len(vocab), E)).astype(np.float32) * 0.3)
    W = mc.Parameter(rng.standard_normal((E, 5 * H)).astype(np.float32) * 0.2)
    U = mc.Parameter(rng.standard_normal((2 * H, 5 * H)).astype(np.float32) * 0.2)
    b = mc.Parameter(np.zeros(5 * H, np.float32))
    Wo = mc.Parameter(rng.standard_normal((H, C)).astype(np.float32) * 0.2)
    params = [table, W, U, b, Wo]

    def cell(v):
        x = mc.embedding(table, v.pull())  # word id; -1 (internal vertex) gives zeros
        h_l, c_l = mc.split(v.gather(0), 2)
        h_r, c_r = mc.split(v.gather(1), 2)
        i, f_l, f_r, o, u = mc.split(x @ W + mc.concat([h_l, h_r]) @ U + b, 5)
        c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
        h = mc.sigmoid(o) * mc.tanh(c)
        v.scatter(mc.concat([h, c]))
        v.push(h @ Wo)

    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(2 * H,),
                          push_shape=(C,), arity=2)
    batch = mc.GraphBatch([mc.InputGraph(t.children) for t in trees])
    words = mc.tensor(np.concatenate([t.words for t in trees]))
    labels = np.concatenate([t.labels for t in trees])
    optimizer = Adam(params, lr=0.02)
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        loss = mc.softmax_cross_entropy(F(batch, pull=words), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.6 * losses[0], losses
