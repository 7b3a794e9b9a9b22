"""A binary Tree-LSTM built on the runtime learns: the loss on generated trees goes down."""

import numpy as np

import minicavs as mc
from minicavs.data import synthetic_treebank
from minicavs.nn import Adam

from vertex_cells import embedding_tree_lstm


def test_binary_tree_lstm_loss_goes_down():
    trees, vocab = synthetic_treebank(64, seed=1)
    rng = np.random.default_rng(0)
    E, H, C = 16, 16, 5
    F, params = embedding_tree_lstm(E, H, len(vocab), rng, dtype="float32", classes=C,
                                    scale=0.5)
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
