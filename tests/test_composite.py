"""Composite functions (written with primitives): values against NumPy, gradients by gradcheck."""

import numpy as np
import pytest
import scipy.special
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.testing import float_arrays, index_arrays, shapes


def t(a, requires_grad=False):
    return mc.tensor(a, requires_grad=requires_grad)


@given(data=st.data())
def test_softmax_and_log_softmax(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1, min_side=1)), bound=4.0))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    np.testing.assert_allclose(mc.softmax(t(x), axis).numpy(), scipy.special.softmax(x, axis),
                               rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(mc.log_softmax(t(x), axis).numpy(),
                               scipy.special.log_softmax(x, axis), rtol=1e-12, atol=1e-12)
    assert mc.gradcheck(lambda x: mc.softmax(x, axis), [x])
    assert mc.gradcheck(lambda x: mc.log_softmax(x, axis), [x])


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        p, logp = mc.softmax(t(x)), mc.log_softmax(t(x))
    np.testing.assert_allclose(p.numpy(), [[1, 0, 0]])
    np.testing.assert_allclose(logp.numpy(), [[0, -1000, -2000]])


@given(data=st.data(), batch=shapes(max_dims=2, max_side=3), bias=st.booleans(),
       sizes=st.tuples(st.integers(0, 3), st.integers(0, 3)))
def test_linear(data, batch, bias, sizes):
    n_in, n_out = sizes
    x = data.draw(float_arrays(batch + (n_in,)))
    w = data.draw(float_arrays((n_in, n_out)))
    b = data.draw(float_arrays((n_out,)))
    expected = x @ w + (b if bias else 0)
    out = mc.linear(t(x), t(w), t(b) if bias else None)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12, atol=1e-12)
    if bias:
        assert mc.gradcheck(mc.linear, [x, w, b])
    else:
        assert mc.gradcheck(mc.linear, [x, w])


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@given(data=st.data(), hidden=st.integers(0, 3), batch=shapes(max_dims=2, max_side=3))
def test_lstm_gates(data, hidden, batch):
    pre = data.draw(float_arrays(batch + (4 * hidden,), bound=3.0))
    c_prev = data.draw(float_arrays(batch + (hidden,)))
    i, f, o, u = np.split(pre, 4, axis=-1)
    c = _sigmoid(i) * np.tanh(u) + _sigmoid(f) * c_prev
    h = _sigmoid(o) * np.tanh(c)
    h_out, c_out = mc.lstm_gates(t(pre), t(c_prev))
    np.testing.assert_allclose(h_out.numpy(), h, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(c_out.numpy(), c, rtol=1e-12, atol=1e-15)
    # both outputs feed the checked function, so both VJP paths are exercised
    assert mc.gradcheck(lambda p, c: mc.concat(mc.lstm_gates(p, c), axis=-1), [pre, c_prev])


@given(data=st.data(), keepdims=st.booleans())
def test_mean(data, keepdims):
    x = data.draw(float_arrays(data.draw(shapes(min_side=1))))
    axis = data.draw(st.one_of(st.none(), st.integers(-x.ndim, x.ndim - 1))) if x.ndim else None
    np.testing.assert_allclose(mc.mean(t(x), axis, keepdims).numpy(),
                               np.mean(x, axis=axis, keepdims=keepdims), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t(x).mean(axis, keepdims).numpy(),
                               np.mean(x, axis, keepdims=keepdims), rtol=1e-12, atol=1e-15)
    assert mc.gradcheck(lambda x: mc.mean(x, axis, keepdims), [x])


def test_mean_keeps_float32():
    assert mc.mean(t([1.0, 2.0])).dtype == np.float32


@given(data=st.data(), sections=st.integers(1, 3), part=st.integers(0, 2))
def test_split(data, sections, part):
    base = data.draw(shapes(min_dims=1, max_dims=2, max_side=3))
    axis = data.draw(st.integers(0, len(base) - 1))
    shape = list(base)
    shape[axis] *= sections
    x = data.draw(float_arrays(tuple(shape)))
    parts = mc.split(t(x), sections, axis)
    for got, want in zip(parts, np.split(x, sections, axis), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    sizes = [0, shape[axis]] if part == 0 else [shape[axis]]
    assert [p.shape[axis] for p in mc.split(t(x), sizes, axis)] == sizes
    assert [p.shape[axis] for p in mc.split(t(x), np.array(sizes), axis)] == sizes  # (sizes
    # given as an array: not taken for the two-halves fast path)
    assert mc.gradcheck(lambda x: mc.split(x, sections, axis)[part % sections] * 2.0, [x])


def test_split_errors_name_the_sizes():
    with pytest.raises(mc.ShapeError, match=r"op 'split': axis 1 .* shape \(2, 5\) cannot be "
                                            r"split into 2 equal parts"):
        mc.split(t(np.zeros((2, 5))), 2, axis=1)
    with pytest.raises(mc.ShapeError, match=r"sizes \[1, 1\] do not add up to 5"):
        mc.split(t(np.zeros((2, 5))), [1, 1], axis=1)


@given(data=st.data(), num=st.integers(1, 5), dim=st.integers(0, 3),
       ids_shape=shapes(max_dims=2, max_side=3))
def test_embedding(data, num, dim, ids_shape):
    table = data.draw(float_arrays((num, dim)))
    ids = data.draw(index_arrays(num, ids_shape))
    out = mc.embedding(t(table), ids)
    np.testing.assert_array_equal(out.numpy(), table[ids])
    assert mc.gradcheck(mc.embedding, [table, ids])


def test_embedding_gradient_adds_repeated_ids():
    table = t(np.zeros((3, 2)), requires_grad=True)
    mc.embedding(table, np.array([[0, 2], [2, 2]])).sum().backward()
    np.testing.assert_array_equal(table.grad.numpy(), [[1, 1], [0, 0], [3, 3]])


@given(data=st.data(), reduction=st.sampled_from(["mean", "sum", "none"]))
def test_softmax_cross_entropy_reductions(data, reduction):
    batch = data.draw(shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
    logits = data.draw(float_arrays(batch + (3,), bound=3.0))
    labels = data.draw(index_arrays(3, batch))
    per_example = -np.take_along_axis(scipy.special.log_softmax(logits, -1), labels[..., None],
                                      -1)[..., 0]
    expected = {"mean": per_example.mean(), "sum": per_example.sum(), "none": per_example}
    out = mc.softmax_cross_entropy(t(logits), labels, reduction=reduction)
    np.testing.assert_allclose(out.numpy(), expected[reduction], rtol=1e-12)
    assert mc.gradcheck(lambda z, y: mc.softmax_cross_entropy(z, y, reduction), [logits, labels])


def test_softmax_cross_entropy_errors():
    logits = t(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none', got 'avg'"):
        mc.softmax_cross_entropy(logits, np.array([0, 1]), reduction="avg")
    with pytest.raises(mc.IndexRangeError, match=r"label 3 at position \(1,\) is out of range "
                                                 r"for 3 classes"):
        mc.softmax_cross_entropy(logits, np.array([0, 3]))
    with pytest.raises(mc.ShapeError, match=r"argument 0 \(logits\) has shape \(2, 3\) and "
                                            r"argument 1 \(labels\) has shape \(3,\)"):
        mc.softmax_cross_entropy(logits, np.array([0, 1, 2]))
    with pytest.raises(mc.DTypeError, match="argument 1 must be an integer array"):
        mc.softmax_cross_entropy(logits, np.array([0.0, 1.0]))


def test_expand_dims_and_squeeze():
    x = t(np.arange(6.0).reshape(2, 3))
    assert mc.expand_dims(x, 0).shape == (1, 2, 3)
    assert mc.expand_dims(x, -1).shape == (2, 3, 1)
    assert mc.squeeze(mc.expand_dims(x, 1), 1).shape == (2, 3)
    with pytest.raises(mc.ShapeError, match=r"op 'squeeze': axis 0 of argument 0 with shape \(2, 3\) has size 2, not 1"):
        mc.squeeze(x, 0)
