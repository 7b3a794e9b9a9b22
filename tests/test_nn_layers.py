"""minicavs.nn beyond Linear and Embedding: parameters found in containers and in vertex
functions, train/eval, Sequential, Dropout, LayerNorm, activations, LSTM/GRU (cells inside a
vertex function too), AdamW, parameter groups, LR schedules, mc.save/mc.load."""

import numpy as np
import pytest
import scipy.special

import minicavs as mc
from minicavs import nn


def t(a, requires_grad=False):
    return mc.tensor(np.asarray(a), requires_grad=requires_grad)


# --- parameters are found wherever a user keeps them -------------------------------------------

class TreeModel(nn.Module):
    """The issue's case: a cell's weights held only by the VertexFunction, a Linear head."""

    def __init__(self, H=4):
        W = mc.Parameter(np.random.randn(2 * H, H).astype(np.float32) * 0.3, name="W")
        b = mc.Parameter(np.zeros(H, np.float32))

        def cell(v):
            v.scatter(mc.tanh(mc.concat([v.gather(0), v.gather(1)]) @ W + b + v.pull()))

        self.F = mc.VertexFunction(cell, pull_shape=(H,), scatter_shape=(H,), arity=2)
        self.heads = {"sentiment": nn.Linear(H, 2), "extra": [nn.Linear(H, 1)]}

    def forward(self, batch, pull):
        return self.heads["sentiment"](self.F(batch, pull=pull))


def test_parameters_in_dicts_and_captured_by_a_vertex_function_are_found_and_train():
    model = TreeModel()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["heads.sentiment.weight", "heads.sentiment.bias", "heads.extra.0.weight",
                     "heads.extra.0.bias", "F.W", "F.p1"]
    W = dict(model.named_parameters())["F.W"]
    before = W.numpy().copy()
    opt = nn.Adam(model.parameters(), lr=0.01)
    batch = mc.GraphBatch([mc.InputGraph(children=[[], [], [0, 1]])])
    pull = t(np.random.randn(3, 4).astype(np.float32))
    for _ in range(3):
        opt.zero_grad()
        mc.cross_entropy(model(batch, pull), np.array([0, 1, 1])).backward()
        opt.step()
    assert not np.array_equal(W.numpy(), before)  # the cell's weights did train
    assert list(model.state_dict()) == names


def test_static_functions_captured_parameters_are_found():
    class WithStatic(nn.Module):
        def __init__(self):
            self.scale = mc.Parameter(np.ones(3, np.float32), name="scale")

            @mc.symbolic
            def f(x):
                return x * self.scale

            self.f = f

    model = WithStatic()
    assert [n for n, _ in model.named_parameters()] == ["scale"]  # found once, as an attribute
    orphan = mc.Parameter(np.ones(2, np.float32))
    holder = nn.Module()
    holder.fns = [mc.symbolic(lambda x: x * orphan, mc.spec((2,)))]
    assert [n for n, _ in holder.named_parameters()] == ["fns.0.p0"]


def test_train_and_eval_reach_every_submodule():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.Sequential(nn.Dropout(0.2)))
    assert all(m.training for m in model.modules())
    assert model.eval() is model and not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_sequential_and_activation_modules():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.LeakyReLU(0.2))
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                        "2.bias"]
    assert len(model) == 4 and isinstance(model[1], nn.ReLU) and len(model[:2]) == 2
    x = np.random.randn(5, 3).astype(np.float32)
    h = np.maximum(x @ model[0].weight.numpy() + model[0].bias.numpy(), 0)
    y = h @ model[2].weight.numpy() + model[2].bias.numpy()
    np.testing.assert_allclose(model(t(x)).numpy(), np.where(y > 0, y, 0.2 * y), rtol=1e-5,
                               atol=1e-6)
    z = t(np.array([-1.0, 0.5]))
    for module, fn in [(nn.Tanh(), mc.tanh), (nn.Sigmoid(), mc.sigmoid), (nn.GELU(), mc.gelu),
                       (nn.SiLU(), mc.silu), (nn.ELU(alpha=0.5), lambda v: mc.elu(v, 0.5)),
                       (nn.Softplus(), mc.softplus), (nn.Softmax(axis=-1), mc.softmax),
                       (nn.LogSoftmax(), mc.log_softmax), (nn.Identity(), lambda v: v)]:
        np.testing.assert_array_equal(module(z).numpy(), fn(z).numpy())
    with pytest.raises(mc.UnsupportedError, match="Sequential: item 0 is a function"):
        nn.Sequential(mc.relu)


def test_dropout():
    x = t(np.ones((200, 50)))
    layer = nn.Dropout(0.3)
    y = layer(x).numpy()
    kept = y != 0
    assert 0.65 < kept.mean() < 0.75
    np.testing.assert_allclose(y[kept], 1 / 0.7)  # the expectation is unchanged
    xg = t(np.ones(1000), requires_grad=True)
    out = layer(xg)
    out.sum().backward()
    np.testing.assert_array_equal(xg.grad.numpy(), out.numpy())  # gradient through the mask
    layer.eval()
    assert layer(x) is x
    assert nn.dropout(x, 1.0).numpy().sum() == 0
    mc.seed(5)
    first = nn.dropout(x, 0.5).numpy()
    mc.seed(5)
    np.testing.assert_array_equal(first, nn.dropout(x, 0.5).numpy())

    def cell(v):
        v.scatter(nn.dropout(v.pull(), 0.5))

    with pytest.raises(mc.GraphError, match="dropout in training mode inside a traced function"):
        mc.VertexFunction(cell, pull_shape=(2,), scatter_shape=(2,))


def test_layer_norm_values_and_gradients():
    norm = nn.LayerNorm((2, 3), dtype="float64")
    norm.weight.data[...] = np.random.randn(2, 3)
    norm.bias.data[...] = np.random.randn(2, 3)
    x = np.random.randn(4, 2, 3)
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = x.var(axis=(1, 2), keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * norm.weight.numpy() + norm.bias.numpy()
    np.testing.assert_allclose(norm(t(x)).numpy(), expected, rtol=1e-12)
    assert mc.gradcheck(lambda x, w, b: _layer_norm(norm, x, w, b), [x, norm.weight.numpy(),
                                                                     norm.bias.numpy()])
    with pytest.raises(mc.ShapeError, match="does not end in the normalized shape"):
        norm(t(np.zeros((2, 3, 2))))


def _layer_norm(norm, x, w, b):
    norm.weight, norm.bias = w, b
    return norm(x)


# --- recurrent layers -------------------------------------------------------------------------

def _sigmoid(x):
    return scipy.special.expit(x)


def _lstm_reference(cell, x, h, c):
    """One LSTM step in NumPy, gates [i, f, o, u] (mc.lstm_gates)."""
    gates = x @ cell.weight_ih.numpy() + h @ cell.weight_hh.numpy() + cell.bias.numpy()
    i, f, o, u = np.split(gates, 4, axis=-1)
    c = _sigmoid(i) * np.tanh(u) + _sigmoid(f) * c
    return _sigmoid(o) * np.tanh(c), c


def _gru_reference(cell, x, h):
    """PyTorch's GRU equations in NumPy."""
    r_x, z_x, n_x = np.split(x @ cell.weight_ih.numpy() + cell.bias_ih.numpy(), 3, -1)
    r_h, z_h, n_h = np.split(h @ cell.weight_hh.numpy() + cell.bias_hh.numpy(), 3, -1)
    r, z = _sigmoid(r_x + r_h), _sigmoid(z_x + z_h)
    n = np.tanh(n_x + r * n_h)
    return (1 - z) * n + z * h


def test_lstm_and_gru_over_a_sequence_equal_numpy():
    T, N, E, H = 4, 3, 5, 6
    x = np.random.randn(T, N, E)
    lstm = nn.LSTM(E, H, num_layers=2, dtype="float64")
    out, (h_n, c_n) = lstm(t(x))
    inputs = x
    for layer, cell in enumerate(lstm.layers):
        h = c = np.zeros((N, H))
        outputs = []
        for step in range(T):
            h, c = _lstm_reference(cell, inputs[step], h, c)
            outputs.append(h)
        inputs = np.stack(outputs)
        np.testing.assert_allclose(h_n.numpy()[layer], h, rtol=1e-12)
        np.testing.assert_allclose(c_n.numpy()[layer], c, rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), inputs, rtol=1e-12)
    gru = nn.GRU(E, H, batch_first=True, dtype="float64")
    h0 = np.random.randn(1, N, H)
    batch_major = x.transpose(1, 0, 2)  # (N, T, E)
    out, h_n = gru(t(batch_major), t(h0))
    h, outputs = h0[0], []
    for step in range(T):
        h = _gru_reference(gru.layers[0], batch_major[:, step], h)
        outputs.append(h)
    np.testing.assert_allclose(out.numpy(), np.stack(outputs, 1), rtol=1e-12)
    np.testing.assert_allclose(h_n.numpy()[0], h, rtol=1e-12)


def test_recurrent_gradients():
    lstm_cell = nn.LSTMCell(3, 2, dtype="float64")
    x, h, c = np.random.randn(2, 3), np.random.randn(2, 2), np.random.randn(2, 2)
    assert mc.gradcheck(lambda x, h, c: mc.concat(lstm_cell(x, (h, c))), [x, h, c])
    gru_cell = nn.GRUCell(3, 2, dtype="float64")
    assert mc.gradcheck(lambda x, h: gru_cell(x, h), [x, h])
    assert mc.gradcheck(lambda x: gru_cell(x), [x])  # no state: zeros
    gru = nn.GRU(3, 2, num_layers=2, dtype="float64")
    assert mc.gradcheck(lambda x: gru(x)[0], [np.random.randn(3, 2, 3)])
    with pytest.raises(mc.ShapeError, match=r"LSTM: input of shape \(2, 3\); expected \(T, N, "
                                            r"input\)"):
        nn.LSTM(3, 2)(t(np.zeros((2, 3))))


def test_lstm_and_gru_cells_inside_a_vertex_function_equal_the_per_sample_reference():
    class ChainModel(nn.Module):
        def __init__(self):
            self.lstm = nn.LSTMCell(3, 4, dtype="float64")
            self.gru = nn.GRUCell(4, 4, dtype="float64")

            def cell(v):
                h_prev, c_prev = mc.split(v.gather(0), 2)
                h, c = self.lstm(v.pull(), (h_prev, c_prev))
                v.scatter(mc.concat([h, c]))
                v.push(self.gru(h, h_prev))

            self.F = mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(8,),
                                       push_shape=(4,), arity=1)

    model = ChainModel()
    assert model.F.dtype == np.float64  # from the cells' parameters
    assert len(model.parameters()) == 7 and len(model.F.params) == 7
    batch = mc.GraphBatch([mc.InputGraph.chain(4), mc.InputGraph.chain(2)])
    pull = np.random.randn(6, 3)
    batched = model.F(batch, pull=t(pull))
    reference = mc.evaluate_per_sample(model.F, batch, t(pull))
    np.testing.assert_allclose(batched.numpy(), reference.numpy(), rtol=1e-12)
    batched.sum().backward()
    grads = [p.grad.numpy() for p in model.parameters()]
    model.zero_grad()
    reference.sum().backward()
    for g, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-10, atol=1e-12)


# --- optimisers and schedules ------------------------------------------------------------------

def test_adamw_decays_apart_from_the_adam_step_by_hand():
    p = mc.Parameter(np.array([1.0, -2.0]))
    opt = nn.AdamW([p], lr=0.1, weight_decay=0.5)
    p.grad = t([0.2, 0.0])
    opt.step()
    decayed = np.array([1.0, -2.0]) * (1 - 0.1 * 0.5)
    m, v = 0.1 * np.array([0.2, 0.0]), 0.001 * np.array([0.04, 0.0])
    step = 0.1 * (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8)
    np.testing.assert_allclose(p.numpy(), decayed - step, rtol=1e-12)
    assert nn.AdamW([mc.Parameter(np.ones(1))]).weight_decay == 0.01  # PyTorch's default


def test_parameter_groups():
    a, b = mc.Parameter(np.ones(2)), mc.Parameter(np.ones(2))
    opt = nn.SGD([{"params": [a]}, {"params": [b], "lr": 0.5, "weight_decay": 0.1}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    a.grad, b.grad = t(np.ones(2)), t(np.ones(2))
    opt.step()
    np.testing.assert_allclose(a.numpy(), [0.9, 0.9])
    np.testing.assert_allclose(b.numpy(), 1 - 0.5 * (1 + 0.1))
    with pytest.raises(AttributeError, match=r"SGD.lr: the parameter groups have different "
                                             r"values \[0.1, 0.5\]"):
        opt.lr
    opt.lr = 0.2  # sets every group
    assert opt.lr == 0.2 and opt.momentum == 0.0
    with pytest.raises(ValueError, match="parameter group 0 has unknown settings"):
        nn.SGD([{"params": [a], "betas": (0.9, 0.9)}], lr=0.1)
    # the groups survive a state dict round trip and a checkpoint
    opt.param_groups[1]["lr"] = 0.7
    copy = nn.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    copy.load_state_dict(opt.state_dict())
    assert [g["lr"] for g in copy.param_groups] == [0.2, 0.7]
    assert copy.param_groups[1]["weight_decay"] == 0.1


def test_parameter_groups_in_a_checkpoint(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = nn.Adam([{"params": model[0].parameters(), "lr": 0.01},
                   {"params": model[1].parameters(), "weight_decay": 0.1}], lr=0.001)
    nn.save_checkpoint(tmp_path / "run.npz", model, opt)
    copy_model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    copy = nn.Adam([{"params": copy_model[0].parameters()},
                    {"params": copy_model[1].parameters()}], lr=0.5)
    nn.load_checkpoint(tmp_path / "run.npz", copy_model, copy)
    assert [(g["lr"], g["weight_decay"]) for g in copy.param_groups] == [(0.01, 0.0),
                                                                        (0.001, 0.1)]


def test_schedules():
    def lrs(make, steps):
        opt = nn.SGD([mc.Parameter(np.ones(1))], lr=1.0)
        scheduler = make(opt)
        values = [opt.lr]
        for _ in range(steps):
            scheduler.step()
            values.append(opt.lr)
        return values

    assert lrs(lambda o: nn.StepLR(o, 2, gamma=0.5), 5) == [1, 1, 0.5, 0.5, 0.25, 0.25]
    assert lrs(lambda o: nn.LinearWarmup(o, 4), 5) == [0, 0.25, 0.5, 0.75, 1, 1]
    cosine = lrs(lambda o: nn.CosineAnnealingLR(o, 4, eta_min=0.1), 6)
    np.testing.assert_allclose(cosine, [1, 0.1 + 0.9 * (1 + np.cos(np.pi / 4)) / 2, 0.55,
                                        0.1 + 0.9 * (1 + np.cos(3 * np.pi / 4)) / 2, 0.1, 0.1,
                                        0.1])
    warm = lrs(lambda o: nn.CosineAnnealingLR(o, 2, warmup_steps=2), 4)
    np.testing.assert_allclose(warm, [0, 0.5, 1, 0.5, 0])
    assert lrs(lambda o: nn.LambdaLR(o, lambda s: 1 / (s + 1)), 2) == [1, 0.5, 1 / 3]
    opt = nn.SGD([mc.Parameter(np.ones(1))], lr=1.0)
    scheduler = nn.StepLR(opt, 1, gamma=0.5)
    scheduler.step()
    state = scheduler.state_dict()
    other = nn.StepLR(nn.SGD([mc.Parameter(np.ones(1))], lr=1.0), 1, gamma=0.5)
    other.load_state_dict(state)
    assert other.get_last_lr() == [0.5]


def test_save_and_load_state_dicts(tmp_path):
    model = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    opt = nn.Adam(model.parameters(), lr=0.01)
    model(t(np.random.randn(4, 3).astype(np.float32))).sum().backward()
    opt.step()
    path = tmp_path / "state.npz"
    mc.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
             "note": "hello", "tensor": t([1.0, 2.0]), "pair": (1, None)}, path)
    loaded = mc.load(path)
    assert loaded["epoch"] == 3 and loaded["note"] == "hello" and loaded["pair"] == [1, None]
    np.testing.assert_array_equal(loaded["tensor"], [1.0, 2.0])
    copy = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    copy.load_state_dict(loaded["model"])
    copy_opt = nn.Adam(copy.parameters(), lr=0.5)
    copy_opt.load_state_dict(loaded["optimizer"])
    for a, b in zip(model.parameters(), copy.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert copy_opt.lr == 0.01 and copy_opt.state[0]["step"] == 1
    with pytest.raises(mc.CheckpointError, match="save: /x is a object"):
        mc.save({"x": object()}, tmp_path / "bad.npz")
    with pytest.raises(mc.CheckpointError, match="keys must be strings"):
        mc.save({1: 2}, tmp_path / "bad.npz")
    nn.save_checkpoint(tmp_path / "checkpoint.npz", model)
    with pytest.raises(mc.CheckpointError, match="was not written by mc.save"):
        mc.load(tmp_path / "checkpoint.npz")
    with pytest.raises(mc.CheckpointError, match="no checkpoint at"):
        mc.load(tmp_path / "missing.npz")


def test_bare_symbolic_decorator_traces_per_input_signature():
    calls = []

    @mc.symbolic
    def f(x, y):
        calls.append(x.shape)
        return mc.tanh(x) * y

    x = t(np.random.randn(3, 2), requires_grad=True)
    out = f(x, t(np.ones(2)))
    np.testing.assert_allclose(out.numpy(), np.tanh(x.numpy()), rtol=1e-12)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 - np.tanh(x.numpy()) ** 2, rtol=1e-12)
    f(t(np.zeros((3, 2))), t(np.ones(2)))
    f(t(np.zeros((5, 2))), t(np.ones(2)))
    assert calls == [(3, 2), (5, 2)] and len(f.graphs) == 2  # traced once per signature

    @mc.symbolic(mc.spec((2,), "float64"))
    def g(x):
        return x * 2

    assert g.graph.inputs[0].shape == (2,)
    with pytest.raises(mc.GraphError, match="has not been traced yet"):
        mc.symbolic(lambda x: x).graph
