"""minicavs.nn: modules and their state dicts, initialisers, optimisers (checked against hand
computations)."""

import numpy as np
import pytest

import minicavs as mc
from minicavs import nn


class Tiny(nn.Module):
    def __init__(self, hidden=4, dtype=None):
        self.embed = nn.Embedding(5, 3, dtype=dtype)
        self.layers = [nn.Linear(3, hidden, dtype=dtype), nn.Linear(hidden, 2, bias=False,
                                                                    dtype=dtype)]
        self.scale = mc.Parameter(np.ones(1, dtype or np.float32))
        self.note = "not a parameter"

    def forward(self, ids):
        h = mc.tanh(self.layers[0](self.embed(ids)))
        return self.layers[1](h) * self.scale


# --- modules ----------------------------------------------------------------------------------

def test_parameters_are_found_and_named_in_assignment_order():
    model = Tiny()
    assert [name for name, _ in model.named_parameters()] == [
        "embed.weight", "layers.0.weight", "layers.0.bias", "layers.1.weight", "scale"]
    assert all(isinstance(p, mc.Parameter) for p in model.parameters())
    assert [p.shape for p in model.parameters()] == [(5, 3), (3, 4), (4,), (4, 2), (1,)]


def test_a_shared_parameter_is_listed_once():
    class Tied(nn.Module):
        def __init__(self):
            self.encoder = nn.Embedding(4, 2)
            self.decoder = nn.Linear(2, 4)
            self.decoder.weight = self.encoder.weight  # (4, 2): tied, as in language models
    assert [n for n, _ in Tied().named_parameters()] == ["encoder.weight", "decoder.bias"]


def test_linear_and_embedding_forward():
    layer = nn.Linear(3, 2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = x @ layer.weight.numpy() + layer.bias.numpy()
    np.testing.assert_allclose(layer(mc.tensor(x)).numpy(), expected, rtol=1e-6)
    assert layer.weight.shape == (3, 2) and layer.weight.dtype == np.float32
    table = nn.Embedding(4, 3)
    ids = np.array([[0, 3], [3, 1]])
    np.testing.assert_array_equal(table(ids).numpy(), table.weight.numpy()[ids])


def test_state_dict_is_a_copy_and_load_state_dict_writes_in_place():
    model = Tiny()
    state = model.state_dict()
    assert list(state) == [name for name, _ in model.named_parameters()]
    state["scale"][0] = 5.0
    assert model.scale.numpy()[0] == 1.0  # the state dict is a copy
    array = model.scale.data
    model.load_state_dict(state)
    assert model.scale.data is array and array[0] == 5.0  # same array, new values
    other = Tiny()
    other.load_state_dict(model.state_dict())
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), other.named_parameters()):
        assert n1 == n2 and np.array_equal(p1.numpy(), p2.numpy())


def test_load_state_dict_names_every_mismatch_and_changes_nothing():
    model = Tiny()
    before = model.state_dict()
    state = Tiny(hidden=6).state_dict()
    state["extra.weight"] = np.zeros(2, np.float32)
    del state["scale"]
    state["embed.weight"] = state["embed.weight"].astype(np.float64)
    with pytest.raises(mc.CheckpointError) as info:
        model.load_state_dict(state)
    message = str(info.value)
    assert "missing: 'scale' (the model has shape (1,), float32)" in message
    assert "unexpected: 'extra.weight'" in message
    assert "'layers.0.weight': shape (3, 4) in the model, (3, 6) in the state" in message
    assert "'layers.0.bias': shape (4,) in the model, (6,) in the state" in message
    assert "'layers.1.weight': shape (4, 2) in the model, (6, 2) in the state" in message
    assert "'embed.weight': dtype float32 in the model, float64 in the state" in message
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_zero_grad():
    model = Tiny()
    mc.sum(model(np.array([1, 2]))).backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


# --- initialisers -----------------------------------------------------------------------------

def test_initialisers_are_reproducible_with_seed():
    mc.seed(3)
    first = Tiny().state_dict()
    mc.seed(3)
    second = Tiny().state_dict()
    mc.seed(4)
    third = Tiny().state_dict()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    assert not np.array_equal(first["layers.0.weight"], third["layers.0.weight"])


def test_initialiser_ranges_and_dtypes():
    w = nn.init.xavier_uniform((30, 20))
    assert w.dtype == np.float32 and np.abs(w).max() <= np.sqrt(6 / 50)
    assert np.abs(w).max() > 0.8 * np.sqrt(6 / 50)  # the range is used, not a narrow part
    u = nn.init.uniform((1000,), -0.5, 0.25, dtype=np.float64)
    assert u.dtype == np.float64 and u.min() >= -0.5 and u.max() < 0.25
    assert not nn.init.zeros((2, 3)).any() and nn.init.zeros((2,), "float64").dtype == np.float64
    assert abs(nn.init.normal((4000,), std=2.0).std() - 2.0) < 0.1
    with pytest.raises(mc.ShapeError, match=r"init.xavier_uniform: needs a weight with at least "
                                            r"2 dimensions \(in, out\), got shape \(3,\)"):
        nn.init.xavier_uniform((3,))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 3, 6)])
def test_orthogonal(shape):
    w = nn.init.orthogonal(shape, gain=2.0, dtype=np.float64)
    m = w.reshape(-1, shape[-1])
    small = min(m.shape)
    gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
    np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-12)


# --- optimisers -------------------------------------------------------------------------------

def _param(values):
    return mc.Parameter(np.array(values, dtype=np.float64))


def _set_grad(p, values):
    p.grad = mc.tensor(np.array(values, dtype=p.dtype))


def test_adam_one_and_two_steps_by_hand():
    p = _param([1.0, -2.0])
    opt = nn.Adam([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    _set_grad(p, [0.5, -0.1])
    opt.step()
    # m = 0.1 g, v = 0.001 g²; bias correction divides them by 0.1 and 0.001: m̂ = g, v̂ = g²
    expected = np.array([1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 * 0.1 / (0.1 + 1e-8)])
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-15)
    _set_grad(p, [0.2, 0.3])
    opt.step()
    m = 0.9 * np.array([0.05, -0.01]) + 0.1 * np.array([0.2, 0.3])
    v = 0.999 * np.array([0.00025, 0.00001]) + 0.001 * np.array([0.04, 0.09])
    m_hat, v_hat = m / (1 - 0.9 ** 2), v / (1 - 0.999 ** 2)
    expected = expected - 0.1 * m_hat / (np.sqrt(v_hat) + 1e-8)
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-14)
    assert opt.state[0]["step"] == 2


def test_sgd_plain_and_with_momentum_by_hand():
    p = _param([1.0])
    opt = nn.SGD([p], lr=0.1)
    _set_grad(p, [2.0])
    opt.step()
    np.testing.assert_allclose(p.numpy(), [0.8])
    assert opt.state == [{}]  # no momentum, no buffer

    p = _param([1.0])
    opt = nn.SGD([p], lr=0.1, momentum=0.9)
    for g in (1.0, 2.0):
        _set_grad(p, [g])
        opt.step()
    # v1 = 1, p = 1 - 0.1; v2 = 0.9 * 1 + 2 = 2.9, p = 0.9 - 0.29
    np.testing.assert_allclose(p.numpy(), [0.61], rtol=1e-15)
    np.testing.assert_allclose(opt.state[0]["velocity"], [2.9])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sgd_updates_large_tables_in_place_and_leaves_the_gradient_alone(dtype):
    """Plain SGD on contiguous NumPy floats runs as the BLAS's axpy (no temporary): the same
    values as ``p - lr * g``, the parameter's memory updated in place, the gradient unchanged;
    a strided gradient takes NumPy's path, with the same result."""
    rng = np.random.default_rng(2)
    for grad in (rng.standard_normal((300, 40)).astype(dtype),
                 rng.standard_normal((40, 300)).astype(dtype).T):  # (strided)
        start = rng.standard_normal((300, 40)).astype(dtype)
        p = nn.Parameter(start.copy())
        memory = p.data
        p.grad = mc.tensor(grad)
        nn.SGD([p], lr=0.25).step()
        np.testing.assert_allclose(p.numpy(), start - np.asarray(0.25, dtype) * grad,
                                   rtol=1e-6 if dtype == "float32" else 1e-15)
        assert p.data is memory or np.shares_memory(p.data, memory)
        np.testing.assert_array_equal(p.grad.numpy(), grad)


def test_adagrad_by_hand():
    p = _param([1.0, 1.0])
    opt = nn.Adagrad([p], lr=0.1, eps=1e-10)
    _set_grad(p, [2.0, -1.0])
    opt.step()
    _set_grad(p, [1.0, 0.0])
    opt.step()
    expected = np.array([1.0 - 0.1 * 2 / (2 + 1e-10) - 0.1 * 1 / (np.sqrt(5) + 1e-10),
                         1.0 + 0.1 * 1 / (1 + 1e-10) - 0.0])
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-15)


def test_weight_decay_adds_to_the_gradient():
    p = _param([2.0])
    opt = nn.SGD([p], lr=0.1, weight_decay=0.5)
    _set_grad(p, [1.0])
    opt.step()
    np.testing.assert_allclose(p.numpy(), [2.0 - 0.1 * (1.0 + 0.5 * 2.0)])


@pytest.mark.parametrize("make", [lambda ps: nn.SGD(ps, lr=0.1, momentum=0.5),
                                  lambda ps: nn.Adam(ps, lr=0.1),
                                  lambda ps: nn.Adagrad(ps, lr=0.1)])
def test_optimisers_skip_parameters_without_grad_and_keep_float32(make):
    a = mc.Parameter(np.ones(3, np.float32))
    b = mc.Parameter(np.ones(2, np.float32))
    opt = make([a, b, a])  # a repeated parameter is updated once
    assert len(opt.params) == 2
    (a * a).sum().backward()
    grad = a.grad.numpy().copy()
    opt.step()
    assert a.dtype == np.float32 and not np.array_equal(a.numpy(), np.ones(3))
    np.testing.assert_array_equal(b.numpy(), np.ones(2))
    np.testing.assert_array_equal(a.grad.numpy(), grad)  # gradients are not modified
    assert opt.state[1] == {}
    opt.zero_grad()
    assert a.grad is None


def test_training_a_tiny_model_lowers_the_loss():
    mc.seed(0)
    model = Tiny()
    opt = nn.Adam(model.parameters(), lr=0.05)
    ids = np.array([0, 1, 2, 3, 4])
    labels = np.array([0, 1, 1, 0, 1])
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = mc.softmax_cross_entropy(model(ids), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


@pytest.mark.parametrize("make", [lambda ps: nn.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: nn.Adam(ps, lr=0.05, betas=(0.8, 0.99)),
                                  lambda ps: nn.Adagrad(ps, lr=0.1)])
def test_optimiser_state_dict_round_trip_continues_identically(make):
    def run(model, opt, steps):
        for step in range(steps):
            opt.zero_grad()
            mc.softmax_cross_entropy(model(np.array([step % 5, 2])), np.array([1, 0])).backward()
            opt.step()

    mc.seed(1)
    model = Tiny()
    opt = make(model.parameters())
    run(model, opt, 3)
    model_state, opt_state = model.state_dict(), opt.state_dict()
    copy = Tiny()
    copy_opt = make(copy.parameters())
    copy.load_state_dict(model_state)
    copy_opt.load_state_dict(opt_state)
    assert copy_opt.hyperparameters == opt.hyperparameters
    run(model, opt, 2)
    run(copy, copy_opt, 2)
    for (name, a), b in zip(model.state_dict().items(), copy.state_dict().values()):
        assert np.array_equal(a, b), name


def test_optimiser_load_state_dict_mismatches():
    model = Tiny()
    adam = nn.Adam(model.parameters(), lr=0.1)
    mc.sum(model(np.array([1]))).backward()
    adam.step()
    state = adam.state_dict()
    with pytest.raises(mc.CheckpointError, match="the state is for optimiser 'Adam', this one "
                                                 "is 'SGD'"):
        nn.SGD(model.parameters(), lr=0.1).load_state_dict(state)
    with pytest.raises(mc.CheckpointError, match="state for 5 parameters; this optimiser has 2"):
        nn.Adam(model.parameters()[:2], lr=0.1).load_state_dict(state)
    smaller = Tiny(hidden=3)
    with pytest.raises(mc.CheckpointError) as info:
        nn.Adam(smaller.parameters()).load_state_dict(state)
    assert ("parameter 1: state 'm' has shape (3, 4) and dtype float32; the parameter has "
            "shape (3, 3) and dtype float32") in str(info.value)
    state["state"][0] = {"m": state["state"][0]["m"]}
    with pytest.raises(mc.CheckpointError, match=r"parameter 0: state \['m'\]; Adam keeps "
                                                 r"\['m', 'step', 'v'\]"):
        nn.Adam(model.parameters()).load_state_dict(state)


def test_optimiser_rejects_bad_parameters_and_gradients():
    with pytest.raises(TypeError, match="SGD: parameter 0 is not a Tensor that requires grad"):
        nn.SGD([mc.tensor([1.0])], lr=0.1)
    with pytest.raises(ValueError, match="empty list of parameters"):
        nn.Adam([])
    p = mc.Parameter(np.ones(2, np.float32))
    p.grad = mc.tensor(np.ones(2, np.float64))
    with pytest.raises(mc.DTypeError, match=r"Adam.step: parameter 0 has shape \(2,\) and dtype "
                                            r"float32, its grad has shape \(2,\) and dtype "
                                            r"float64"):
        nn.Adam([p]).step()


def test_clip_grad_norm():
    a, b = _param([3.0]), _param([4.0])
    _set_grad(a, [3.0])
    _set_grad(b, [4.0])
    norm = nn.clip_grad_norm([a, b], 1.0)
    # The norm comes back as a 0-d Tensor where the gradients live: reading it is the
    # caller's choice (on a GPU, a wait for the device).
    assert isinstance(norm, mc.Tensor) and norm.shape == () and norm.item() == pytest.approx(5.0)
    np.testing.assert_allclose([a.grad.item(), b.grad.item()], [0.6, 0.8])
    before = [a.grad.numpy().copy(), b.grad.numpy().copy()]
    assert nn.clip_grad_norm([a, b], 10.0).item() == pytest.approx(1.0)
    for p, g in zip((a, b), before):  # under the limit: multiplied by 1, the same bits
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_clip_grad_norm_scales_each_gradient_once_in_place_or_by_a_copy():
    # A gradient is scaled in place (as PyTorch's clip_grad_norm_), rows of one slab too; one
    # array that is two parameters' gradient, or a read-only one, gets a scaled copy: scaled
    # in place, shared memory would be scaled twice.
    a, b, c, d, e, f = (_param([0.0, 0.0]) for _ in range(6))
    a.grad = mc.tensor(np.array([3.0, 0.0]))
    shared = np.array([0.0, 4.0])
    b.grad, c.grad = mc.tensor(shared), mc.tensor(shared)
    slab = np.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    d.grad, e.grad = mc.tensor(slab[0]), mc.tensor(slab[1])
    frozen = np.array([2.0, 0.0])
    frozen.flags.writeable = False
    f.grad = mc.tensor(frozen)
    owned = a.grad.numpy()
    norm = np.sqrt(9 + 16 + 16 + 1 + 1 + 4)
    assert nn.clip_grad_norm([a, b, c, d, e, f], 2.5).item() == pytest.approx(norm)
    scale = 2.5 / norm
    assert a.grad.numpy() is owned  # (in place)
    np.testing.assert_allclose(a.grad.numpy(), [3 * scale, 0.0])
    np.testing.assert_allclose(b.grad.numpy(), [0.0, 4 * scale])  # each scaled once
    np.testing.assert_allclose(c.grad.numpy(), [0.0, 4 * scale])
    np.testing.assert_array_equal(shared, [0.0, 4.0])  # (copies)
    np.testing.assert_allclose(slab, [[scale, 0.0], [0.0, scale], [5.0, 5.0]])  # (in place)
    np.testing.assert_allclose(f.grad.numpy(), [2 * scale, 0.0])
    np.testing.assert_array_equal(frozen, [2.0, 0.0])


def test_which_gradients_share_memory():
    from minicavs.nn.optim import _sharing_memory

    block = np.zeros((4, 3))
    other = np.zeros(5)
    # rows apart: none; a row inside a view of two rows: both; interleaved columns (no element
    # in common, one byte range): both, conservatively; an empty view shares nothing
    assert _sharing_memory([block[0], block[1], other]) == set()
    assert _sharing_memory([other, block[2], block[1:3], block[0]]) == {1, 2}
    assert _sharing_memory([block[:, 0], block[:, 1], other[:0], other]) == {0, 1}


def test_clip_grad_norm_of_mixed_dtypes_zero_and_missing_gradients():
    a = mc.Parameter(np.array([3.0, 0.0], np.float32))
    b, c = _param([0.0]), _param([1.0])
    a.grad = mc.tensor(np.array([0.0, 0.0], np.float32))
    _set_grad(b, [0.0])  # c has no gradient: left out
    with np.errstate(all="raise"):  # a zero norm divides nothing by zero
        assert nn.clip_grad_norm([a, b, c], 1.0).item() == 0.0
    assert a.grad.dtype == np.float32 and not a.grad.numpy().any()
    a.grad = mc.tensor(np.array([30.0, 40.0], np.float32))
    _set_grad(b, [0.0])
    assert nn.clip_grad_norm([a, b, c], 5.0).item() == pytest.approx(50.0)
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 4.0], rtol=1e-6)
    assert a.grad.dtype == np.float32 and c.grad is None
    assert nn.clip_grad_norm([c], 1.0).item() == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("make", [lambda ps: nn.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: nn.Adam(ps, lr=0.05),
                                  lambda ps: nn.Adagrad(ps, lr=0.1)])
def test_optimisers_and_checkpoints_on_the_gpu_match_the_cpu(make, tmp_path):
    results = {}
    for device in ("cpu", "cuda"):
        mc.set_device(device)
        mc.seed(0)  # the initialisers draw on the host: the same weights on both devices
        layer = nn.Linear(3, 2)
        opt = make(layer.parameters())
        x = mc.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
        target = mc.tensor(np.ones((4, 2), np.float32))
        for _ in range(3):
            opt.zero_grad()
            ((layer(x) - target) ** 2).sum().backward()
            opt.step()
        assert layer.weight.device == device
        results[device] = layer.state_dict()
        nn.save_checkpoint(tmp_path / f"{device}.npz", layer, opt)
    for name in results["cpu"]:
        np.testing.assert_allclose(results["cuda"][name], results["cpu"][name], rtol=1e-5,
                                   atol=1e-6)
    mc.set_device("cpu")
    restored = nn.Linear(3, 2)
    nn.load_checkpoint(tmp_path / "cuda.npz", restored)  # a GPU checkpoint loads on the CPU
    for name, value in restored.state_dict().items():
        np.testing.assert_array_equal(value, results["cuda"][name])


def test_a_parameter_owns_its_array():
    values = np.ones(2, np.float32)
    p = mc.Parameter(values)
    p.grad = mc.tensor(np.ones(2, np.float32))
    nn.SGD([p], lr=0.5).step()  # in place, on the parameter's own copy
    np.testing.assert_array_equal(values, [1.0, 1.0])
    np.testing.assert_array_equal(p.numpy(), [0.5, 0.5])
