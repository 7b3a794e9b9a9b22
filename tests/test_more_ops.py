"""The ops a NumPy or PyTorch user reaches for, composed from primitives: each compared with
NumPy (or SciPy, or a NumPy formula of the definition) and gradient-checked in float64 on
hypothesis shapes with broadcasting, size-0 and size-1 axes. Losses are also compared with
PyTorch where it is installed."""

import numpy as np
import pytest
import scipy.special
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from minicavs.testing import (GRID, broadcastable_shapes, float_arrays, index_arrays,
                              positive_arrays, shapes, tie_free_arrays)
from peers import torch_or_skip


def t(a, requires_grad=False):
    return mc.tensor(np.asarray(a), requires_grad=requires_grad)


def check(out, expected, rtol=1e-12, atol=1e-12):
    expected = np.asarray(expected)
    assert out.shape == expected.shape, (out.shape, expected.shape)
    assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=atol)


@st.composite
def axes_for(draw, shape):
    ndim = len(shape)
    if ndim == 0 or draw(st.booleans()):
        return None
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return axes[0] - ndim if len(axes) == 1 and draw(st.booleans()) else tuple(axes)


# --- elementwise composites ------------------------------------------------------------------

def _gelu(x):
    return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# name -> (function, NumPy reference, strategy of inputs)
UNARY = {
    "abs": (mc.abs, np.abs, lambda s: tie_free_arrays(s, GRID / 2)),
    "sqrt": (mc.sqrt, np.sqrt, positive_arrays),
    "rsqrt": (mc.rsqrt, lambda x: 1 / np.sqrt(x), positive_arrays),
    "sign": (mc.sign, np.sign, lambda s: tie_free_arrays(s, GRID / 2)),
    "round": (mc.round, np.round, lambda s: tie_free_arrays(s, GRID / 4)),
    "round2": (lambda x: mc.round(x, 2), lambda x: np.round(x, 2),
               lambda s: tie_free_arrays(s, GRID / 64)),
    "leaky_relu": (lambda x: mc.leaky_relu(x, 0.1), lambda x: np.where(x > 0, x, 0.1 * x),
                   lambda s: tie_free_arrays(s, GRID / 2)),
    "gelu": (mc.gelu, _gelu, float_arrays),
    "gelu_tanh": (lambda x: mc.gelu(x, approximate="tanh"), _gelu_tanh, float_arrays),
    "silu": (mc.silu, lambda x: x * scipy.special.expit(x), float_arrays),
    "elu": (lambda x: mc.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)),
            lambda s: tie_free_arrays(s, GRID / 2)),
    "softplus": (mc.softplus, lambda x: np.logaddexp(0, x), float_arrays),
    "softplus_beta": (lambda x: mc.softplus(x, beta=2.0), lambda x: np.logaddexp(0, 2 * x) / 2,
                      float_arrays),
    "clip": (lambda x: mc.clip(x, -0.5, 1.0), lambda x: np.clip(x, -0.5, 1.0),
             lambda s: tie_free_arrays(s, GRID / 2)),
    "hardtanh": (mc.hardtanh, lambda x: np.clip(x, -1, 1), lambda s: tie_free_arrays(s, GRID / 2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_composites(name, data):
    fn, reference, inputs = UNARY[name]
    x = data.draw(inputs(data.draw(shapes())))
    check(fn(t(x)), reference(x), rtol=1e-13, atol=1e-14)
    assert mc.gradcheck(fn, [x])


def test_gradients_at_the_kinks_are_the_ones_pytorch_gives():
    def grad(fn, values):
        x = t(np.array(values), requires_grad=True)
        fn(x).sum().backward()
        return x.grad.tolist()

    assert grad(mc.abs, [0.0, -2.0]) == [0.0, -1.0]
    assert grad(lambda x: mc.clip(x, 0.0, 1.0), [0.0, 1.0, 2.0]) == [1.0, 1.0, 0.0]
    assert grad(lambda x: mc.leaky_relu(x, 0.2), [0.0]) == [0.2]
    assert grad(mc.elu, [0.0]) == [1.0]
    assert grad(mc.softplus, [0.0]) == [0.5]
    assert grad(mc.sign, [0.0, 3.0]) == [0.0, 0.0]


def test_large_inputs_do_not_overflow_into_nan():
    x = t(np.array([-800.0, 0.0, 800.0]), requires_grad=True)
    with np.errstate(over="raise", invalid="raise"):
        values = (mc.softplus(x) + mc.elu(x) + mc.silu(x)).sum()
        values.backward()
    assert np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(mc.softplus(t(np.array([-40.0, 40.0]))).numpy(),
                               np.logaddexp(0, [-40.0, 40.0]), rtol=1e-15)


@given(data=st.data())
def test_clip_with_tensor_bounds_and_a_single_bound(data):
    shape_x, shape_lo = data.draw(broadcastable_shapes())
    x = data.draw(tie_free_arrays(shape_x))
    low = data.draw(tie_free_arrays(shape_lo, offset=GRID / 2))
    check(mc.clip(t(x), t(low)), np.maximum(x, low))
    check(mc.clip(t(x), None, 0.3), np.minimum(x, 0.3))
    assert mc.gradcheck(lambda x, lo: mc.clip(x, lo), [x, low])


# --- logical and predicates -------------------------------------------------------------------

@given(data=st.data())
def test_logical_ops_and_predicates(data):
    shape_a, shape_b = data.draw(broadcastable_shapes())
    a = data.draw(hnp.arrays(np.float64, shape_a, elements=st.sampled_from(
        [0.0, 1.5, -2.0, np.inf, -np.inf, np.nan])))
    b = data.draw(hnp.arrays(np.bool_, shape_b))
    check(mc.logical_and(t(a), t(b)), np.logical_and(a, b))
    check(mc.logical_or(t(a), t(b)), np.logical_or(a, b))
    check(mc.logical_xor(t(a), t(b)), np.logical_xor(a, b))
    check(mc.logical_not(t(a)), np.logical_not(a))
    check(mc.isnan(t(a)), np.isnan(a))
    check(mc.isinf(t(a)), np.isinf(a))
    check(mc.isfinite(t(a)), np.isfinite(a))
    check(mc.not_equal(t(a), t(b)), np.not_equal(a, b))
    ints = np.array([1, 0, 3])
    check(mc.isfinite(t(ints)), np.isfinite(ints))


@given(data=st.data(), keepdims=st.booleans())
def test_any_and_all(data, keepdims):
    x = data.draw(hnp.arrays(np.float64, data.draw(shapes()), elements=st.sampled_from(
        [0.0, 1.0, np.nan])))
    axis = data.draw(axes_for(x.shape))
    check(mc.any(t(x), axis, keepdims), np.any(x, axis=axis, keepdims=keepdims))
    check(mc.all(t(x), axis, keepdims), np.all(x, axis=axis, keepdims=keepdims))
    check(t(x).any(), np.any(x))


# --- reductions ----------------------------------------------------------------------------------

@given(data=st.data(), keepdims=st.booleans(), ddof=st.integers(0, 1))
def test_var_and_std(data, keepdims, ddof):
    x = data.draw(float_arrays(data.draw(shapes(min_side=1))))
    axis = data.draw(axes_for(x.shape))
    with np.errstate(divide="ignore", invalid="ignore"):
        expected_var = np.var(x, axis=axis, keepdims=keepdims, ddof=ddof)
    check(mc.var(t(x), axis, keepdims, ddof), expected_var, atol=1e-12)
    check(t(x).std(axis, keepdims, ddof), np.sqrt(expected_var), atol=1e-12)
    if np.all(np.isfinite(expected_var)):
        assert mc.gradcheck(lambda x: mc.var(x, axis, keepdims, ddof), [x])


@given(data=st.data(), keepdims=st.booleans())
def test_logsumexp(data, keepdims):
    x = data.draw(float_arrays(data.draw(shapes()), bound=30.0))
    axis = data.draw(axes_for(x.shape))
    with np.errstate(divide="ignore"):  # an empty sum: log 0 = -inf
        expected = np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    check(mc.logsumexp(t(x), axis, keepdims), expected, rtol=1e-12)
    if x.size:
        assert mc.gradcheck(lambda x: mc.logsumexp(x, axis, keepdims), [x])


def test_logsumexp_of_minus_infinity_and_large_values():
    out = mc.logsumexp(t(np.array([[-np.inf, -np.inf], [1000.0, 1000.0]])), axis=1)
    np.testing.assert_allclose(out.numpy(), [-np.inf, 1000.0 + np.log(2)])


def test_mean_of_integers_and_reductions_as_methods():
    x = t(np.array([[1, 2], [3, 5]]))
    check(x.mean(), np.float32(2.75))
    check(x.sum(axis=0), np.array([4, 7]))
    check(x.max(), np.int64(5))
    check(x.min(axis=1), np.array([1, 3]))
    check(x.argmax(axis=1), np.array([1, 1]))
    check(x.prod(), np.int64(30))


# --- shapes ------------------------------------------------------------------------------------

@given(data=st.data(), count=st.integers(1, 3))
def test_stack(data, count):
    shape = data.draw(shapes())
    xs = [data.draw(float_arrays(shape)) for _ in range(count)]
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check(mc.stack([t(x) for x in xs], axis), np.stack(xs, axis))
    assert mc.gradcheck(lambda *xs: mc.stack(xs, axis), xs)
    with pytest.raises(mc.ShapeError, match="stacked arrays must have one shape"):
        mc.stack([t(np.zeros(2)), t(np.zeros(3))])


@given(data=st.data(), repeats=st.integers(0, 3))
def test_repeat_and_tile(data, repeats):
    x = data.draw(float_arrays(data.draw(shapes(max_side=3))))
    axis = None if x.ndim == 0 or data.draw(st.booleans()) else data.draw(
        st.integers(-x.ndim, x.ndim - 1))
    check(mc.repeat(t(x), repeats, axis), np.repeat(x, repeats, axis))
    assert mc.gradcheck(lambda x: mc.repeat(x, repeats, axis), [x])
    reps = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    check(mc.tile(t(x), reps), np.tile(x, reps))
    assert mc.gradcheck(lambda x: mc.tile(x, reps), [x])


@given(data=st.data(), k=st.integers(-2, 2))
def test_tril_and_triu(data, k):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=2))))
    check(mc.tril(t(x), k), np.tril(x, k))
    check(mc.triu(t(x), k), np.triu(x, k))
    assert mc.gradcheck(lambda x: mc.tril(x, k) + 2 * mc.triu(x, k), [x])


@given(data=st.data(), value=st.sampled_from([0.0, 1.5, -2.0]))
def test_pad_with_a_value(data, value):
    x = data.draw(float_arrays(data.draw(shapes(max_side=3))))
    if x.ndim == 0:  # nothing to pad
        check(mc.pad(t(x), [], value), x)
        return
    widths = [tuple(data.draw(st.tuples(st.integers(0, 2), st.integers(0, 2))))
              for _ in range(x.ndim)]
    check(mc.pad(t(x), widths, value), np.pad(x, widths, constant_values=value))
    assert mc.gradcheck(lambda x: mc.pad(x, widths, value), [x])
    if x.ndim:
        check(mc.pad(t(x), 1, value), np.pad(x, 1, constant_values=value))


@given(data=st.data())
def test_flip_take_and_moveaxis(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1))))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check(mc.flip(t(x), axis), np.flip(x, axis))
    check(mc.flip(t(x)), np.flip(x))
    assert mc.gradcheck(lambda x: mc.flip(x, axis), [x])
    if x.shape[axis]:
        idx = data.draw(index_arrays(x.shape[axis], shapes(max_dims=2, max_side=3)))
        idx = idx - x.shape[axis] * data.draw(st.integers(0, 1))  # negative indices too
        check(mc.take(t(x), idx, axis), np.take(x, idx, axis))
        assert mc.gradcheck(lambda x: mc.take(x, idx, axis), [x])
    destination = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check(mc.moveaxis(t(x), axis, destination), np.moveaxis(x, axis, destination))


@given(data=st.data())
def test_gather_is_take_along_axis(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1, min_side=1, max_side=3))))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    idx_shape = tuple(data.draw(st.sampled_from([1, d])) if a != axis % x.ndim else
                      data.draw(st.integers(0, 4)) for a, d in enumerate(x.shape))
    idx = data.draw(index_arrays(x.shape[axis], idx_shape))
    check(mc.gather(t(x), idx, axis), np.take_along_axis(x, idx, axis))
    assert mc.gradcheck(lambda x: mc.gather(x, idx, axis), [x])


def test_gather_with_labels_picks_per_row():
    logits = t(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), requires_grad=True)
    picked = mc.gather(logits, np.array([[2], [0]]), axis=1)
    assert picked.tolist() == [[3.0], [4.0]]
    picked.sum().backward()
    assert logits.grad.tolist() == [[0, 0, 1], [1, 0, 0]]
    with pytest.raises(mc.IndexRangeError, match="gather: index 3 at position"):
        mc.gather(logits, np.array([[3], [0]]), axis=1)


@given(data=st.data())
def test_masked_fill(data):
    shape_x, shape_m = data.draw(broadcastable_shapes())
    x = data.draw(float_arrays(shape_x))
    mask = data.draw(hnp.arrays(np.bool_, shape_m))
    if np.broadcast_shapes(shape_x, shape_m) != shape_x:
        return  # masked_fill keeps x's shape, as PyTorch: the mask must fit in it
    check(mc.masked_fill(t(x), mask, -1.5), np.where(mask, -1.5, x))
    assert mc.gradcheck(lambda x: mc.masked_fill(x, mask, 0.0), [x])
    assert t(np.array([1, 2])).masked_fill(np.array([True, False]), 9).dtype == np.int64


def test_squeeze_flatten_and_expand_dims():
    scalar = t(3.0)
    assert mc.squeeze(scalar).shape == () and mc.squeeze(t(np.zeros((1, 2, 1)))).shape == (2,)
    assert mc.squeeze(t(np.zeros((1, 2, 1))), axis=-1).shape == (1, 2)
    with pytest.raises(mc.ShapeError, match=r"op 'squeeze': axis 1 of argument 0 with shape "
                                            r"\(1, 2, 1\) has size 2, not 1"):
        mc.squeeze(t(np.zeros((1, 2, 1))), axis=1)
    assert mc.squeeze(scalar, axis=0).shape == ()  # as np.squeeze and torch.squeeze
    with pytest.raises(mc.ShapeError, match="op 'squeeze': axis 1 is out of range"):
        mc.squeeze(scalar, axis=1)
    assert mc.flatten(t(np.zeros((2, 3, 4))), 1).shape == (2, 12)
    assert mc.expand_dims(t(np.zeros(3)), -1).shape == (3, 1)


# --- creation ----------------------------------------------------------------------------------

def test_creation_functions():
    check(mc.zeros(2, 3), np.zeros((2, 3), np.float32))
    check(mc.ones((2,), dtype="float64"), np.ones(2))
    check(mc.full((2, 2), 7), np.full((2, 2), 7, np.int64))
    check(mc.full((2,), 0.5), np.full(2, 0.5, np.float32))
    check(mc.full((1,), True), np.ones(1, bool))
    check(mc.arange(5), np.arange(5))
    check(mc.arange(1, 2, 0.25), np.arange(1, 2, 0.25).astype(np.float32))
    check(mc.eye(3, 4, k=1), np.eye(3, 4, 1, dtype=np.float32))
    x = mc.randn(3, dtype="float64")
    check(mc.zeros_like(x), np.zeros(3)) and check(mc.ones_like(x), np.ones(3))
    check(mc.full_like(x, 2), np.full(3, 2.0))
    assert mc.rand_like(x).dtype == np.float64 and mc.randn_like(x).shape == (3,)
    mc.seed(3)
    first = mc.rand(1000).numpy()
    mc.seed(3)
    np.testing.assert_array_equal(first, mc.rand(1000).numpy())  # reproducible with mc.seed
    assert 0 <= first.min() and first.max() < 1 and abs(first.mean() - 0.5) < 0.05
    assert abs(mc.randn(4000).numpy().std() - 1) < 0.05
    assert mc.zeros(2, requires_grad=True).requires_grad
    with pytest.raises(mc.ShapeError, match="negative dimension"):
        mc.zeros(-1)


# --- losses ------------------------------------------------------------------------------------

def _log_softmax(z):
    return z - scipy.special.logsumexp(z, axis=-1, keepdims=True)


def _cross_entropy(z, y, weight, ignore_index, smoothing, reduction):
    """PyTorch's definition, in NumPy: per kept example, (1 - ε) w_y (-log p_y) +
    ε/C Σ_c w_c (-log p_c); "mean" divides by Σ w_y over kept examples."""
    C = z.shape[-1]
    w = np.ones(C) if weight is None else weight
    logp = _log_softmax(z)
    kept = y != ignore_index
    safe = np.where(kept, y, 0)
    nll = -np.take_along_axis(logp, safe[..., None], -1)[..., 0] * w[safe]
    smooth = -(logp * w).sum(-1) / C
    losses = np.where(kept, (1 - smoothing) * nll + smoothing * smooth, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / np.where(kept, w[safe], 0).sum()


@given(data=st.data(), classes=st.integers(1, 4), smoothing=st.sampled_from([0.0, 0.1]),
       weighted=st.booleans(), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_cross_entropy_with_labels(data, classes, smoothing, weighted, reduction):
    batch = data.draw(shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    logits = data.draw(float_arrays(batch + (classes,), bound=3.0))
    labels = data.draw(index_arrays(classes, batch))
    labels = np.where(data.draw(hnp.arrays(np.bool_, batch)), -100, labels)
    labels.reshape(-1)[0] = 0  # at least one example counts
    weight = data.draw(positive_arrays((classes,))) if weighted else None
    out = mc.cross_entropy(t(logits), labels, None if weight is None else t(weight),
                           label_smoothing=smoothing, reduction=reduction)
    expected = _cross_entropy(logits, labels, weight, -100, smoothing, reduction)
    check(out, expected, rtol=1e-11)
    assert mc.gradcheck(lambda z: mc.cross_entropy(z, labels, None if weight is None else
                                                   t(weight), label_smoothing=smoothing,
                                                   reduction=reduction), [logits])


@given(data=st.data(), classes=st.integers(1, 4), smoothing=st.sampled_from([0.0, 0.2]))
def test_cross_entropy_with_probabilities_and_nll_loss(data, classes, smoothing):
    batch = data.draw(shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    logits = data.draw(float_arrays(batch + (classes,), bound=3.0))
    probs = scipy.special.softmax(data.draw(float_arrays(batch + (classes,))), axis=-1)
    target = probs * (1 - smoothing) + smoothing / classes
    expected = -(target * _log_softmax(logits)).sum(-1).mean()
    check(mc.cross_entropy(t(logits), t(probs), label_smoothing=smoothing), expected)
    assert mc.gradcheck(lambda z, p: mc.cross_entropy(z, p, label_smoothing=smoothing),
                        [logits, probs])
    labels = data.draw(index_arrays(classes, batch))
    logp = _log_softmax(logits)
    check(mc.nll_loss(t(logp), labels),
          -np.take_along_axis(logp, labels[..., None], -1).mean())
    assert mc.gradcheck(lambda lp: mc.nll_loss(lp, labels, reduction="sum"), [logp])


@given(data=st.data(), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_binary_cross_entropies(data, reduction):
    shape_ = data.draw(shapes(max_side=3))
    logits = data.draw(float_arrays(shape_, bound=5.0))
    target = data.draw(hnp.arrays(np.float64, shape_, elements=st.floats(0, 1)))
    p = scipy.special.expit(logits)
    losses = -(target * np.log(p) + (1 - target) * np.log1p(-p))
    expected = {"mean": losses.mean() if losses.size else np.float64(np.nan),
                "sum": losses.sum(), "none": losses}[reduction]
    with np.errstate(invalid="ignore"):
        check(mc.binary_cross_entropy_with_logits(t(logits), t(target), reduction=reduction),
              expected, rtol=1e-10, atol=1e-12)
        check(mc.binary_cross_entropy(t(p), t(target), reduction=reduction), expected,
              rtol=1e-8, atol=1e-10)
    if losses.size:
        assert mc.gradcheck(lambda z, y: mc.binary_cross_entropy_with_logits(z, y, reduction=
                                                                             reduction),
                            [logits, target])
        assert mc.gradcheck(lambda q: mc.binary_cross_entropy(q, t(target), reduction=reduction),
                            [np.clip(p, 0.05, 0.95)])


def test_binary_cross_entropy_limits_and_pos_weight():
    out = mc.binary_cross_entropy(t(np.array([0.0, 1.0])), t(np.array([1.0, 0.0])),
                                  reduction="none")
    assert out.tolist() == [100.0, 100.0]  # log clipped at -100, as PyTorch
    z, y = np.array([0.3, -1.2]), np.array([1.0, 0.0])
    weighted = mc.binary_cross_entropy_with_logits(t(z), t(y), pos_weight=3.0, reduction="none")
    p = scipy.special.expit(z)
    np.testing.assert_allclose(weighted.numpy(), -(3 * y * np.log(p) + (1 - y) * np.log1p(-p)))
    with pytest.raises(mc.ShapeError, match="binary_cross_entropy: argument 0 has shape"):
        mc.binary_cross_entropy(t(np.zeros(2)), t(np.zeros(3)))
    with pytest.raises(mc.ShapeError, match="cross_entropy: argument 0 .* expected integer "
                                            "labels of shape"):
        mc.cross_entropy(t(np.zeros((2, 3))), np.zeros(3, np.int64))


def test_losses_equal_pytorch():
    torch = torch_or_skip()
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    z = rng.standard_normal((6, 4))
    y = np.array([0, 3, -100, 2, 1, 3])
    w = rng.uniform(0.5, 2, 4)
    for smoothing in (0.0, 0.15):
        ours = mc.cross_entropy(t(z), y, t(w), label_smoothing=smoothing).item()
        theirs = F.cross_entropy(torch.tensor(z), torch.tensor(y), torch.tensor(w),
                                 label_smoothing=smoothing).item()
        assert ours == pytest.approx(theirs, rel=1e-12)
    probs = scipy.special.softmax(rng.standard_normal((6, 4)), axis=-1)
    assert mc.cross_entropy(t(z), t(probs), label_smoothing=0.1).item() == pytest.approx(
        F.cross_entropy(torch.tensor(z), torch.tensor(probs), label_smoothing=0.1).item(),
        rel=1e-12)
    logp = _log_softmax(z)
    assert mc.nll_loss(t(logp), y, t(w)).item() == pytest.approx(
        F.nll_loss(torch.tensor(logp), torch.tensor(y), torch.tensor(w)).item(), rel=1e-12)
    target = rng.uniform(0, 1, (6, 4))
    assert mc.binary_cross_entropy_with_logits(t(z), t(target), pos_weight=t(w)).item() == \
        pytest.approx(F.binary_cross_entropy_with_logits(
            torch.tensor(z), torch.tensor(target), pos_weight=torch.tensor(w)).item(), rel=1e-12)


# --- inside a vertex cell: the batching rules -------------------------------------------------

def test_new_ops_inside_a_vertex_cell_equal_the_per_sample_reference():
    """Each new primitive's batching rule, run by the batched runtime, against the same cell
    evaluated vertex by vertex."""
    W = mc.Parameter(np.random.randn(6, 6) * 0.5)

    def cell(v):
        x = v.pull()  # (6,)
        h = v.gather(0)
        grid = mc.reshape(x * 0.5 + h @ W, (2, 3))
        parts = [mc.softmax(grid, axis=1), mc.log_softmax(grid, axis=0),
                 mc.cumsum(grid, axis=1), mc.minimum(grid, mc.sin(grid)),
                 mc.expand_dims(mc.min(grid, axis=1), 1) + mc.prod(mc.cos(grid), axis=0),
                 mc.astype(mc.argmax(grid, axis=1, keepdims=True), grid.dtype)
                 + mc.astype(mc.argmin(grid), grid.dtype), mc.erf(grid) + mc.log1p(grid * grid),
                 mc.exp(grid) ** mc.expm1(grid) + mc.floor(grid) + mc.ceil(grid) + mc.rint(grid),
                 mc.gelu(grid) + mc.logsumexp(grid, axis=1, keepdims=True)]
        state = mc.tanh(mc.flatten(sum(parts[1:], parts[0]))[::1])
        v.scatter(state)

    F = mc.VertexFunction(cell, pull_shape=(6,), scatter_shape=(6,), arity=1)
    assert F.dtype == np.float64  # from W
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.chain(2)])
    pull = t(np.random.randn(5, 6))
    batched = F(batch, pull=pull)
    reference = mc.evaluate_per_sample(F, batch, pull)
    np.testing.assert_allclose(batched.numpy(), reference.numpy(), rtol=1e-12, atol=1e-12)
    batched.sum().backward()
    grad = W.grad.numpy().copy()
    W.grad = None
    reference.sum().backward()
    np.testing.assert_allclose(grad, W.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_lstm_step_inside_a_vertex_cell_equals_the_per_sample_reference():
    """lstm_step's batching rule (the step written back as products, sums and the cell on the
    task's rows) against the chain LSTM evaluated vertex by vertex, values and every gradient
    of its parameters."""
    rng = np.random.default_rng(3)
    W, U, b = (mc.Parameter(rng.normal(size=s) * 0.5) for s in [(3, 8), (2, 8), (8,)])

    def cell(v):
        v.scatter(mc.lstm_step(v.pull(), v.gather(0), W, U, b))

    F = mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(4,), arity=1)
    batch = mc.GraphBatch([mc.InputGraph.chain(4), mc.InputGraph.chain(2)])
    pull = t(rng.normal(size=(6, 3)))
    batched = F(batch, pull=pull)
    reference = mc.evaluate_per_sample(F, batch, pull)
    np.testing.assert_allclose(batched.numpy(), reference.numpy(), rtol=1e-12, atol=1e-12)
    weights = t(rng.normal(size=batched.shape))
    (batched * weights).sum().backward()
    grads = [p.grad.numpy().copy() for p in (W, U, b)]
    for p in (W, U, b):
        p.grad = None
    (reference * weights).sum().backward()
    for p, g in zip((W, U, b), grads):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-10, atol=1e-12)
