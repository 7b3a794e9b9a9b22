"""Every primitive of the op registry, checked twice: its values against plain NumPy, and its
VJP with ``mc.gradcheck`` (float64 finite differences) on hypothesis-drawn shapes that include
broadcasting, size-1 and size-0 dimensions. Each test declares the primitives it covers with
``@covers``; the last test fails if a registered primitive has no test.

While these tests run, every eager op call also checks that the op's ``infer`` (used by the
symbolic layer) predicts the shape and dtype its forward actually produced.
"""

import math
import warnings

import numpy as np
import pytest
import scipy.special
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from minicavs.autodiff.tensor import Tensor
from minicavs.ops import registry
from minicavs.testing import (GRID, broadcastable_shapes, float_arrays, index_arrays,
                              positive_arrays, shapes, tie_free_arrays)

TESTED = set()


def covers(*names):
    """Mark a test as the test of the primitives ``names``."""
    TESTED.update(names)
    return lambda test: test


@pytest.fixture(autouse=True, scope="module")
def infer_matches_forward():
    """Wrap eager execution: after each op, compare ``op.infer`` with the real output."""
    original = Tensor.__dict__["__minicavs_apply__"].__func__

    def checked(cls, op, args, attrs):
        result = original(cls, op, args, attrs)
        predicted = op.infer(*[a if hasattr(a, "shape") else Tensor(a) for a in args], **attrs)
        outputs = result if op.multi_output else [result]
        predicted = predicted if op.multi_output else [predicted]
        for p, out in zip(predicted, outputs):
            if not isinstance(out, Tensor):  # recorded by a symbolic tracer, not run
                continue
            assert tuple(p.shape) == tuple(out.shape) and np.dtype(p.dtype) == out.dtype, (
                f"op '{op.name}': infer says {p}, forward gave {out.shape} {out.dtype}")
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Tensor, "__minicavs_apply__", classmethod(checked))
        mp.setattr(registry, "_default_handler", Tensor.__minicavs_apply__)
        yield


def check(out, expected, rtol=1e-12, atol=1e-12):
    """``out`` (a Tensor) equals NumPy's ``expected`` in shape, dtype and values."""
    expected = np.asarray(expected)
    assert out.shape == expected.shape, (out.shape, expected.shape)
    assert out.dtype == expected.dtype, (out.dtype, expected.dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=atol)


def t(a, requires_grad=False):
    return mc.tensor(a, requires_grad=requires_grad)


# --- elementwise ------------------------------------------------------------------------------

# name -> (op, NumPy reference, strategy for argument 0, strategy for argument 1)
BINARY = {
    "add": (mc.add, np.add, float_arrays, float_arrays),
    "sub": (mc.sub, np.subtract, float_arrays, float_arrays),
    "mul": (mc.mul, np.multiply, float_arrays, float_arrays),
    "div": (mc.div, np.divide, float_arrays, lambda s: float_arrays(s, min_magnitude=0.5)),
    "maximum": (mc.maximum, np.maximum, tie_free_arrays,
                lambda s: tie_free_arrays(s, offset=GRID / 2)),
    "minimum": (mc.minimum, np.minimum, tie_free_arrays,
                lambda s: tie_free_arrays(s, offset=GRID / 2)),
    "power": (lambda a, b: a ** b, np.power, positive_arrays, float_arrays),
}


@covers(*BINARY)
@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_elementwise(name, data):
    op, reference, first, second = BINARY[name]
    shape_a, shape_b = data.draw(broadcastable_shapes())
    a, b = data.draw(first(shape_a)), data.draw(second(shape_b))
    check(op(t(a), t(b)), reference(a, b))
    # float32 stays float32, and a Python scalar takes the tensor's dtype
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    check(op(t(a32), t(b32)), reference(a32, b32), rtol=1e-6, atol=1e-6)
    assert op(t(a32), 1.5).dtype == np.float32 and op(1.5, t(b32)).dtype == np.float32
    assert mc.gradcheck(op, [a, b])


# name -> (op, NumPy reference, strategy of inputs)
UNARY = {
    "neg": (mc.neg, np.negative, float_arrays),
    "exp": (mc.exp, np.exp, float_arrays),
    "log": (mc.log, np.log, positive_arrays),
    "tanh": (mc.tanh, np.tanh, lambda s: float_arrays(s, bound=3.0)),
    "sigmoid": (mc.sigmoid, scipy.special.expit, lambda s: float_arrays(s, bound=4.0)),
    "relu": (mc.relu, lambda x: np.maximum(x, 0), lambda s: tie_free_arrays(s, GRID / 2)),
    "expm1": (mc.expm1, np.expm1, float_arrays),
    "log1p": (mc.log1p, np.log1p, lambda s: float_arrays(s, bound=0.9)),
    "sin": (mc.sin, np.sin, float_arrays),
    "cos": (mc.cos, np.cos, float_arrays),
    "erf": (mc.erf, scipy.special.erf, float_arrays),
    # piecewise constant: values off the steps, so finite differences see the zero gradient
    "floor": (mc.floor, np.floor, lambda s: tie_free_arrays(s, GRID / 2)),
    "ceil": (mc.ceil, np.ceil, lambda s: tie_free_arrays(s, GRID / 2)),
    "rint": (mc.rint, np.rint, lambda s: tie_free_arrays(s, GRID / 4)),
}


@covers(*UNARY)
@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_unary_elementwise(name, data):
    op, reference, inputs = UNARY[name]
    x = data.draw(inputs(data.draw(shapes())))
    check(op(t(x)), reference(x), rtol=1e-14)
    x32 = x.astype(np.float32)
    check(op(t(x32)), reference(x32), rtol=1e-6, atol=1e-7)
    assert mc.gradcheck(op, [x])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_is_stable_for_large_inputs(dtype):
    x = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], dtype=dtype)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        xt = t(x, requires_grad=True)
        y = mc.sigmoid(xt)
        y.sum().backward()
    assert y.dtype == dtype
    np.testing.assert_allclose(y.numpy(), [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)
    assert np.isfinite(xt.grad.numpy()).all()
    np.testing.assert_allclose(xt.grad.numpy()[[0, 2, 4]], [0.0, 0.25, 0.0])


@covers("pow")
@given(data=st.data(), exponent=st.sampled_from([2, 3, 1, 0, -1, -2.0, 0.5, 1.5]))
def test_pow(data, exponent):
    shape = data.draw(shapes())
    if float(exponent).is_integer() and exponent > 0:
        x = data.draw(float_arrays(shape))
    elif float(exponent).is_integer():  # a pole at 0
        x = data.draw(float_arrays(shape, min_magnitude=0.5))
    else:  # fractional powers need x > 0
        x = data.draw(positive_arrays(shape))
    check(mc.pow(t(x), exponent), np.power(x, float(exponent)), rtol=1e-14)
    check(t(x) ** exponent, np.power(x, float(exponent)), rtol=1e-14)
    assert mc.gradcheck(lambda x: x ** exponent, [x])


def test_pow_gradient_at_zero_with_exponent_zero_is_zero():
    x = t(np.array([0.0, 2.0]), requires_grad=True)
    (x ** 0.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])  # not NaN (0 * 0 ** -1)
    y = t(np.array([0.0, 2.0]), requires_grad=True)
    mc.pow(y, t(np.array([0.0, 0.0]))).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.0])


def test_power_with_tensor_exponents_and_scalar_bases():
    x = np.array([0.5, 1.0, 2.0])
    check(2 ** t(x), 2 ** x)
    check(t(x) ** t(x), x ** x)
    check(t(np.array([-2.0, 3.0])) ** t(np.array([2.0, 3.0])), np.array([4.0, 27.0]))
    ints = np.array([1, 2, 3])
    check(t(ints) ** 2, ints ** 2)  # int64 stays int64
    check(t(ints) ** 0.5, np.sqrt(ints).astype(np.float32), rtol=1e-6)  # float32: the default
    check(2 ** t(ints), 2 ** ints)
    with pytest.raises(mc.DTypeError, match="integers to negative integer powers"):
        t(ints) ** t(np.array([-1, 1, 1]))
    # d/dy x^y = x^y log x, with the limit 0 at x = 0 (as PyTorch)
    base, exponent = t(np.array([0.0, 2.0]), requires_grad=True), t(np.array([2.0, 3.0]),
                                                                  requires_grad=True)
    (base ** exponent).sum().backward()
    np.testing.assert_allclose(exponent.grad.numpy(), [0.0, 8 * np.log(2)])
    np.testing.assert_allclose(base.grad.numpy(), [0.0, 12.0])


@covers("where")
@given(data=st.data())
def test_where(data):
    shape_c, shape_a, shape_b = data.draw(broadcastable_shapes(num_shapes=3))
    cond = data.draw(hnp.arrays(np.bool_, shape_c))
    a, b = data.draw(float_arrays(shape_a)), data.draw(float_arrays(shape_b))
    check(mc.where(cond, t(a), t(b)), np.where(cond, a, b))
    check(mc.where(t(cond), t(a), 0.0), np.where(cond, a, 0.0))
    assert mc.gradcheck(mc.where, [cond, a, b])


@covers("astype")
@given(data=st.data())
def test_astype(data):
    x = data.draw(float_arrays(data.draw(shapes()), bound=5.0))
    check(mc.astype(t(x), np.float32), x.astype(np.float32))
    check(t(x).astype("int32"), x.astype(np.int32))
    check(mc.astype(t(x.astype(np.int64)), np.float64), x.astype(np.int64).astype(np.float64))
    assert mc.astype(t(x), np.float64).dtype == np.float64  # same dtype: no op at all
    # The gradient goes back in the input's dtype. Through float32 a finite-difference step
    # of 1e-6 drowns in rounding; astype is linear, so a large step is exact.
    x32 = t(x.astype(np.float32), requires_grad=True)
    mc.astype(x32, np.float64).sum().backward()
    assert x32.grad.dtype == np.float32
    assert mc.gradcheck(lambda x: mc.astype(mc.astype(x, np.float32) * 3.0, np.float64), [x],
                        eps=1e-2, atol=1e-3, rtol=1e-3)


COMPARISONS = {"greater": (mc.greater, np.greater), "greater_equal": (mc.greater_equal,
               np.greater_equal), "equal": (mc.equal, np.equal)}


@covers(*COMPARISONS)
@pytest.mark.parametrize("name", sorted(COMPARISONS))
@given(data=st.data())
def test_comparisons(name, data):
    op, reference = COMPARISONS[name]
    shape_a, shape_b = data.draw(broadcastable_shapes())
    small = st.integers(-2, 2).map(float)  # a coarse grid, so ties (and equal -> True) happen
    a = data.draw(hnp.arrays(np.float64, shape_a, elements=small))
    b = data.draw(hnp.arrays(np.float64, shape_b, elements=small))
    out = op(t(a, requires_grad=True), t(b))
    check(out, reference(a, b))
    assert not out.requires_grad  # masks have no gradient
    assert op(t(a), 0.0).dtype == np.bool_


def test_derived_comparisons_and_operators():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0])
    check(mc.less(t(a), t(b)), a < b)
    check(mc.less_equal(t(a), t(b)), a <= b)
    check(t(a) > t(b), a > b)
    check(t(a) >= 2.0, a >= 2.0)
    check(t(a) < t(b), a < b)
    check(t(a) <= t(b), a <= b)


# --- reductions -------------------------------------------------------------------------------

@st.composite
def axes_for(draw, shape):
    """None, one axis (maybe negative) or a tuple of distinct axes of ``shape``."""
    ndim = len(shape)
    if ndim == 0 or draw(st.booleans()):
        return None
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    negative = [a - ndim if draw(st.booleans()) else a for a in axes]
    return negative[0] if len(negative) == 1 and draw(st.booleans()) else tuple(negative)


@covers("sum")
@given(data=st.data(), keepdims=st.booleans())
def test_sum(data, keepdims):
    x = data.draw(float_arrays(data.draw(shapes())))
    axis = data.draw(axes_for(x.shape))
    check(mc.sum(t(x), axis, keepdims), np.sum(x, axis=axis, keepdims=keepdims), atol=1e-12)
    check(t(x).sum(axis=axis, keepdims=keepdims), np.sum(x, axis=axis, keepdims=keepdims))
    assert mc.gradcheck(lambda x: mc.sum(x, axis, keepdims), [x])


@pytest.mark.parametrize("in_call", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, cols, window", [(2, 3, False), (64, 128, True), (1417, 384, True),
                                                (20000, 5, False)])
def test_column_sums_of_a_matrix_are_the_exact_sums_within_rounding(rows, cols, window, dtype,
                                                                    in_call, monkeypatch):
    """A matrix's rows summed (a bias's gradient) runs as ones · X on NumPy's BLAS — inside a
    call of native loops on the team where it applies (forced here), its rows split — for whole
    matrices and column windows of wider ones (a gate's columns): each column within the
    rounding bound of a sum of ``rows`` terms (rows · eps · the sum of magnitudes) of its
    exact sum (``math.fsum``), in its own dtype, and with keepdims."""
    from minicavs.cpu import calibrate, products

    rng = np.random.default_rng(rows)
    wide = rng.random((rows, cols + 6)).astype(dtype)
    x = wide[:, 2:2 + cols] if window else np.ascontiguousarray(wide[:, :cols])
    exact = np.array([math.fsum(x[:, j].astype(np.float64)) for j in range(cols)])
    ran = []
    if in_call:
        monkeypatch.setenv(calibrate.ENVIRONMENT, "own")
        monkeypatch.setattr(products, "matmul", _counted(products.matmul, ran))
    with products.team_products(in_call):
        got = mc.sum(t(x), axis=0).numpy()
        assert mc.sum(t(x), axis=0, keepdims=True).numpy().shape == (1, cols)
    assert got.dtype == dtype and got.shape == (cols,)
    assert np.all(np.abs(got - exact) <= rows * np.finfo(dtype).eps * exact)  # (x >= 0)
    assert all(done == products.team_ready() for done in ran) and bool(ran) == in_call


def _counted(matmul, ran):
    """``matmul`` that appends to ``ran`` whether it ran the product (not None)."""
    def counted(a, b, out=None):
        done = matmul(a, b, out)
        ran.append(done is not None)
        return done
    return counted


@covers("max")
@given(data=st.data(), keepdims=st.booleans())
def test_max(data, keepdims):
    shape = data.draw(shapes())
    x = data.draw(tie_free_arrays(shape))
    axis = data.draw(axes_for(shape))
    reduced = range(len(shape)) if axis is None else np.atleast_1d(axis)
    if any(shape[a] == 0 for a in reduced):
        with pytest.raises(mc.ShapeError, match=r"op 'max': cannot reduce an empty axis"):
            mc.max(t(x), axis, keepdims)
        return
    check(mc.max(t(x), axis, keepdims), np.max(x, axis=axis, keepdims=keepdims))
    assert mc.gradcheck(lambda x: mc.max(x, axis, keepdims), [x])


@covers("min")
@given(data=st.data(), keepdims=st.booleans())
def test_min(data, keepdims):
    shape = data.draw(shapes())
    x = data.draw(tie_free_arrays(shape))
    axis = data.draw(axes_for(shape))
    reduced = range(len(shape)) if axis is None else np.atleast_1d(axis)
    if any(shape[a] == 0 for a in reduced):
        with pytest.raises(mc.ShapeError, match=r"op 'min': cannot reduce an empty axis"):
            mc.min(t(x), axis, keepdims)
        return
    check(mc.min(t(x), axis, keepdims), np.min(x, axis=axis, keepdims=keepdims))
    assert mc.gradcheck(lambda x: mc.min(x, axis, keepdims), [x])
    u = np.array([[3, 250], [7, 1]], np.uint8)  # no negation trick: right for unsigned too
    check(mc.min(t(u), axis=1), np.array([3, 1], np.uint8))


@covers("prod")
@given(data=st.data(), keepdims=st.booleans(), zeros=st.integers(0, 2))
def test_prod(data, keepdims, zeros):
    x = data.draw(float_arrays(data.draw(shapes(max_side=3)), min_magnitude=0.5))
    if x.size:  # put some exact zeros in: their gradient is the product of the others
        x.reshape(-1)[:zeros] = 0.0
    axis = data.draw(axes_for(x.shape))
    check(mc.prod(t(x), axis, keepdims), np.prod(x, axis=axis, keepdims=keepdims))
    assert mc.gradcheck(lambda x: mc.prod(x, axis, keepdims), [x])


def test_prod_gradient_with_zeros_by_hand():
    x = t(np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]]), requires_grad=True)
    mc.prod(x, axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 6, 0], [0, 0, 0], [8, 4, 2]])
    check(mc.prod(t(np.array([1, 2, 3], np.int32))), np.int64(6))  # ints widen, as in NumPy


@covers("argmax", "argmin")
@given(data=st.data(), keepdims=st.booleans())
def test_argmax_and_argmin(data, keepdims):
    small = st.integers(-2, 2).map(float)  # ties happen: the first index wins, as in NumPy
    x = data.draw(hnp.arrays(np.float64, data.draw(shapes(min_side=1)), elements=small))
    axis = None if x.ndim == 0 or data.draw(st.booleans()) else data.draw(
        st.integers(-x.ndim, x.ndim - 1))
    check(mc.argmax(t(x), axis, keepdims), np.argmax(x, axis=axis, keepdims=keepdims))
    check(mc.argmin(t(x), axis, keepdims), np.argmin(x, axis=axis, keepdims=keepdims))
    out = mc.argmax(t(x, requires_grad=True), axis)
    assert out.dtype == np.int64 and not out.requires_grad  # an index has no gradient
    with pytest.raises(mc.ShapeError, match="op 'argmax': argument 0 with shape .* is empty"):
        mc.argmax(t(np.zeros((0, 2))))


@covers("cumsum")
@given(data=st.data())
def test_cumsum(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1))))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check(mc.cumsum(t(x), axis), np.cumsum(x, axis=axis), atol=1e-12)
    assert mc.gradcheck(lambda x: mc.cumsum(x, axis), [x])
    ints = np.array([[1, 2], [3, 4]], np.int32)
    check(mc.cumsum(t(ints), 0), np.cumsum(ints, 0))  # int64, as NumPy's


def test_max_splits_the_gradient_among_ties():
    x = t(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]), requires_grad=True)
    mc.max(x, axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize("op", [mc.maximum, mc.minimum])
def test_maximum_and_minimum_split_the_gradient_of_a_tie_like_max(op):
    a, b = t(np.array([1.0, 2.0, 5.0]), requires_grad=True), t(np.array([1.0, 3.0, 4.0]),
                                                             requires_grad=True)
    op(a, b).sum().backward()
    wins = [0.5, 0.0, 1.0] if op is mc.maximum else [0.5, 1.0, 0.0]
    np.testing.assert_array_equal(a.grad.numpy(), wins)
    np.testing.assert_array_equal(b.grad.numpy(), [1 - w for w in wins])
    nan = op(t(np.array([np.nan, 1.0])), t(np.array([0.0, np.nan]))).numpy()
    assert np.isnan(nan).all()  # NaN propagates, as in NumPy


# --- shape ops --------------------------------------------------------------------------------

@covers("reshape")
@given(data=st.data())
def test_reshape(data):
    x = data.draw(float_arrays(data.draw(shapes())))
    size = x.size
    target = data.draw(st.sampled_from(
        [(size,), (-1,), tuple(reversed(x.shape)), (1,) + x.shape, x.shape + (1,),
         (1, -1) if size else (1, 0)]))
    check(mc.reshape(t(x), target), np.reshape(x, target))
    check(t(x).reshape(*target), np.reshape(x, target))
    assert mc.gradcheck(lambda x: mc.reshape(x, target), [x])


@covers("transpose")
@given(data=st.data())
def test_transpose(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1))))
    axes = data.draw(st.permutations(range(x.ndim)))
    check(mc.transpose(t(x), axes), np.transpose(x, axes))
    check(mc.transpose(t(x)), np.transpose(x))
    check(t(x).T, x.T)
    assert mc.gradcheck(lambda x: mc.transpose(x, axes), [x])


@covers("broadcast_to")
@given(data=st.data())
def test_broadcast_to(data):
    shape, other = data.draw(broadcastable_shapes())
    target = np.broadcast_shapes(shape, other)
    x = data.draw(float_arrays(shape))
    check(mc.broadcast_to(t(x), target), np.broadcast_to(x, target))
    assert mc.gradcheck(lambda x: mc.broadcast_to(x, target), [x])


@covers("concat")
@given(data=st.data())
def test_concat(data):
    base = data.draw(shapes(min_dims=1))
    axis = data.draw(st.integers(-len(base), len(base) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=2, max_size=3))
    pieces = []
    for size in sizes:
        shape = list(base)
        shape[axis] = size
        pieces.append(data.draw(float_arrays(tuple(shape))))
    check(mc.concat([t(p) for p in pieces], axis), np.concatenate(pieces, axis))
    assert mc.gradcheck(lambda *xs: mc.concat(xs, axis), pieces)


@covers("slice_axis")
@given(data=st.data())
def test_slice_axis(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1))))
    axis = data.draw(st.integers(0, x.ndim - 1))
    start = data.draw(st.integers(0, x.shape[axis]))
    stop = data.draw(st.integers(start, x.shape[axis]))
    expected = np.take(x, np.arange(start, stop), axis=axis)
    check(mc.slice_axis(t(x), start, stop, axis), expected)
    assert mc.gradcheck(lambda x: mc.slice_axis(x, start, stop, axis), [x])


@covers("pad_axis")
@given(data=st.data(), before=st.integers(0, 2), after=st.integers(0, 2))
def test_pad_axis(data, before, after):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1))))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    check(mc.pad_axis(t(x), before, after, axis), np.pad(x, widths))
    assert mc.gradcheck(lambda x: mc.pad_axis(x, before, after, axis), [x])


def test_indexing_with_integers_and_slices():
    x = np.arange(24.0).reshape(2, 3, 4)
    check(t(x)[1], x[1])
    check(t(x)[:, 1:3], x[:, 1:3])
    check(t(x)[-1, 0, 1:], x[-1, 0, 1:])
    check(t(x)[[0, 1]], x[[0, 1]])  # and the rest of NumPy's indexing: test_tensor_api.py


# --- matmul -----------------------------------------------------------------------------------

MATMUL_CASES = {  # (shape of a, shape of b) from sizes n, k, m and a batch size B
    "matrix": lambda B, n, k, m: ((n, k), (k, m)),
    "vector @ matrix": lambda B, n, k, m: ((k,), (k, m)),
    "matrix @ vector": lambda B, n, k, m: ((n, k), (k,)),
    "vector @ vector": lambda B, n, k, m: ((k,), (k,)),
    "batch @ matrix": lambda B, n, k, m: ((B, n, k), (k, m)),
    "matrix @ batch": lambda B, n, k, m: ((n, k), (B, k, m)),
    "vector @ batch": lambda B, n, k, m: ((k,), (B, k, m)),
    "batch @ vector": lambda B, n, k, m: ((B, n, k), (k,)),
    "batch @ batch": lambda B, n, k, m: ((B, n, k), (B, k, m)),
    "broadcast batches": lambda B, n, k, m: ((2, 1, n, k), (B, k, m)),
}


@covers("matmul")
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
@given(data=st.data(), sizes=st.tuples(*[st.integers(0, 3)] * 4))
def test_matmul(case, data, sizes):
    shape_a, shape_b = MATMUL_CASES[case](*sizes)
    a, b = data.draw(float_arrays(shape_a)), data.draw(float_arrays(shape_b))
    check(mc.matmul(t(a), t(b)), np.matmul(a, b))
    check(t(a) @ t(b), a @ b)
    assert mc.gradcheck(mc.matmul, [a, b])


# --- gathers and scatters ---------------------------------------------------------------------

@covers("take_rows")
@given(data=st.data(), num_rows=st.integers(0, 4), rest=shapes(max_dims=2))
def test_take_rows(data, num_rows, rest):
    x = data.draw(float_arrays((num_rows,) + rest))
    idx = data.draw(index_arrays(num_rows, st.integers(0, 6), allow_missing=True))
    expected = np.zeros((len(idx),) + rest)
    expected[idx >= 0] = x[idx[idx >= 0]]  # -1 gives a zero row
    check(mc.take_rows(t(x), idx), expected)
    check(mc.take_rows(t(x), idx.astype(np.int32)), expected)
    assert mc.gradcheck(mc.take_rows, [x, idx])


@covers("take_row")
@given(data=st.data(), num_rows=st.integers(1, 4), rest=shapes(max_dims=2))
def test_take_row_is_embedding_of_one_id(data, num_rows, rest):
    x = data.draw(float_arrays((num_rows,) + rest))
    i = data.draw(st.integers(-1, num_rows - 1))
    expected = np.zeros(rest) if i < 0 else x[i]  # -1 gives a zero row
    got = mc.embedding(t(x, requires_grad=True), np.array(i))
    assert got._creator[0].op.name == "take_row"  # one op, not a take and a reshape
    check(got, expected)
    assert mc.gradcheck(lambda table, ids: mc.embedding(table, ids), [x, np.array(i)])
    # traced, it is the take and the reshape (what the backends and fusion know)
    graph = mc.trace(lambda table, ids: mc.embedding(table, ids), mc.spec(x.shape, x.dtype),
                     mc.spec((), np.int64))
    assert [n.op.name for n in graph.nodes if n.kind == "op"] == ["reshape", "take_rows",
                                                                 "reshape"]
    with pytest.raises(mc.IndexRangeError, match=f"op 'take_row': index {num_rows} is out of "
                                                  f"range for {num_rows} rows"):
        mc.embedding(t(x), np.array(num_rows))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_take_rows_of_strided_rows_in_one_native_pass_equals_numpy(dtype):
    """The native gather (cpu/kernels.py: take_rows) reads rows at any stride (a view of some
    columns), writes zero rows for -1, and leaves a bad index to the check that names it."""
    table = np.random.default_rng(0).standard_normal((50, 40)).astype(dtype)
    view = table[:, 3:35]  # (rows 160 bytes apart, 32 elements each)
    idx = np.array([4, -1, 49, 0, 4, -1, 17] * 300)
    expected = np.where((idx >= 0)[:, None], view[np.maximum(idx, 0)], 0)
    np.testing.assert_array_equal(mc.take_rows(t(view), idx).numpy(), expected)
    with pytest.raises(mc.IndexRangeError, match="index 50 at position 2 is out of range"):
        mc.take_rows(t(view), np.array([0, -1, 50, 3]))


def test_take_rows_gradient_adds_over_repeated_indices():
    x = t(np.ones((3, 2)), requires_grad=True)
    mc.take_rows(x, np.array([2, 0, 2, -1, 2])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 1], [0, 0], [3, 3]])


@covers("scatter_add_rows")
@given(data=st.data(), num_rows=st.integers(0, 4), rest=shapes(max_dims=2))
def test_scatter_add_rows(data, num_rows, rest):
    idx = data.draw(index_arrays(num_rows, st.integers(0, 6), allow_missing=True))
    values = data.draw(float_arrays((len(idx),) + rest))
    expected = np.zeros((num_rows,) + rest)
    np.add.at(expected, idx[idx >= 0], values[idx >= 0])  # repeats add up, -1 is dropped
    check(mc.scatter_add_rows(t(values), idx, num_rows), expected, atol=1e-12)
    assert mc.gradcheck(lambda v, i: mc.scatter_add_rows(v, i, num_rows), [values, idx])


def test_scatter_add_rows_adds_repeated_indices():
    out = mc.scatter_add_rows(t(np.array([[1.0], [2.0], [4.0], [8.0]])), np.array([1, 1, -1, 1]),
                              3)
    np.testing.assert_array_equal(out.numpy(), [[0.0], [11.0], [0.0]])


@covers("one_hot")
@given(data=st.data(), num_classes=st.integers(1, 4), dtype=st.sampled_from(["float32",
                                                                            "float64"]))
def test_one_hot(data, num_classes, dtype):
    labels = data.draw(index_arrays(num_classes, shapes(max_dims=2)))
    out = mc.one_hot(labels, num_classes, dtype)
    check(out, np.eye(num_classes, dtype=dtype)[labels])
    assert mc.ops.OPS["one_hot"].vjp is None  # labels are data: nothing to differentiate


# --- loss -------------------------------------------------------------------------------------

@covers("softmax", "log_softmax")
@given(data=st.data())
def test_softmax_and_log_softmax_primitives(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1, min_side=1)), bound=4.0))
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check(mc.softmax(t(x), axis), scipy.special.softmax(x, axis), rtol=1e-12, atol=1e-15)
    check(mc.log_softmax(t(x), axis), scipy.special.log_softmax(x, axis), rtol=1e-12,
          atol=1e-12)
    assert mc.gradcheck(lambda x: mc.softmax(x, axis), [x])
    assert mc.gradcheck(lambda x: mc.log_softmax(x, axis), [x])


def test_softmax_gradient_is_within_float32_rounding_at_45_by_65():
    """The peer suite's case: the float32 gradient within 1e-7 of the float64 truth (the
    softmax composed of smaller ops was 1.4e-7 off)."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.standard_normal((45, 65)).astype(np.float32)
        g = rng.standard_normal((45, 65)).astype(np.float32)
        xt = t(x, requires_grad=True)
        mc.softmax(xt, axis=-1).backward(t(g))
        p = scipy.special.softmax(x.astype(np.float64), axis=-1)
        exact = p * (g - (g * p).sum(-1, keepdims=True))
        assert np.abs(xt.grad.numpy() - exact).max() < 1e-7


@covers("softmax_cross_entropy")
@given(data=st.data(), num_classes=st.integers(1, 4))
def test_softmax_cross_entropy(data, num_classes):
    batch = data.draw(shapes(max_dims=2, max_side=3))
    logits = data.draw(float_arrays(batch + (num_classes,), bound=4.0))
    labels = data.draw(index_arrays(num_classes, batch))
    log_probs = logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    expected = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    out = mc.softmax_cross_entropy(t(logits), labels, reduction="none")
    check(out, expected, rtol=1e-12, atol=1e-12)
    assert mc.gradcheck(lambda z, y: mc.softmax_cross_entropy(z, y, reduction="none"),
                        [logits, labels])


@covers("lstm_cell", "lstm_cell_grad")
@given(data=st.data(), forget=st.integers(0, 2), hidden=st.integers(1, 3))
def test_lstm_cell_equals_its_composition_and_gradchecks(data, forget, hidden):
    """lstm_cell(pre, *c_prev) = [h, c] of the gates composed from primitives (0, 1 or 2
    forget gates); its gradient primitive by finite differences (gradcheck of lstm_cell)."""
    batch = data.draw(shapes(max_dims=2, max_side=3))
    pre = t(data.draw(float_arrays(batch + ((3 + forget) * hidden,), bound=3.0)), True)
    cs = [t(data.draw(float_arrays(batch + (hidden,), bound=2.0)), True) for _ in range(forget)]
    gates = mc.split(pre, 3 + forget)
    c = mc.sigmoid(gates[0]) * mc.tanh(gates[-1])
    for f, c_prev in zip(gates[1:1 + forget], cs):
        c = c + mc.sigmoid(f) * c_prev
    h = mc.sigmoid(gates[1 + forget]) * mc.tanh(c)
    check(mc.lstm_cell(pre, *cs), mc.concat([h, c]).numpy(), rtol=1e-12, atol=1e-14)
    assert mc.gradcheck(lambda p, *c: mc.lstm_cell(p, *c), [pre, *cs])
    with pytest.raises(mc.ShapeError, match="lstm_cell"):
        mc.lstm_cell(t(np.zeros((3 + forget) * hidden + 1)), *cs)


@covers("linear")
@given(data=st.data(), inputs=st.integers(1, 3), outputs=st.integers(1, 3))
def test_linear_is_the_product_plus_the_bias_and_traces_as_both(data, inputs, outputs):
    """linear(x, W, b) = x·W + b (one op eagerly and under autobatch) for any leading axes of
    x; gradients by finite differences; traced, it is a matmul and an add; a bias that does
    not broadcast into the product is named."""
    batch = data.draw(shapes(max_dims=2, max_side=3))
    x = t(data.draw(float_arrays(batch + (inputs,), bound=2.0)), True)
    W = t(data.draw(float_arrays((inputs, outputs), bound=1.0)), True)
    b = t(data.draw(float_arrays((outputs,), bound=1.0)), True)
    check(mc.linear(x, W, b), x.numpy() @ W.numpy() + b.numpy(), rtol=1e-12, atol=1e-14)
    assert mc.gradcheck(mc.linear, [x, W, b])
    graph = mc.trace(lambda x, W, b: mc.linear(x, W, b), mc.spec(x.shape, "float64"),
                     mc.spec(W.shape, "float64"), mc.spec(b.shape, "float64"))
    assert [n.op.name for n in graph.op_nodes()] == ["matmul", "add"]
    with pytest.raises(mc.ShapeError, match="op 'linear': the bias has shape"):
        mc.linear(x, W, t(np.zeros(outputs + 1)))


@covers("lstm_step")
@given(data=st.data(), inputs=st.integers(1, 3), hidden=st.integers(1, 3))
def test_lstm_step_equals_its_composition_and_gradchecks(data, inputs, hidden):
    """lstm_step(x, [h, c], W, U, b) = lstm_cell(x·W + h·U + b, c) for any leading axes (none:
    one sample), every gradient by finite differences; a wrongly shaped operand is named."""
    batch = data.draw(shapes(max_dims=2, max_side=3))
    x = t(data.draw(float_arrays(batch + (inputs,), bound=2.0)), True)
    state = t(data.draw(float_arrays(batch + (2 * hidden,), bound=2.0)), True)
    W = t(data.draw(float_arrays((inputs, 4 * hidden), bound=1.0)), True)
    U = t(data.draw(float_arrays((hidden, 4 * hidden), bound=1.0)), True)
    b = t(data.draw(float_arrays((4 * hidden,), bound=1.0)), True)
    h, c = mc.split(state, 2)
    expected = mc.lstm_cell(mc.matmul(x, W) + mc.matmul(h, U) + b, c)
    check(mc.lstm_step(x, state, W, U, b), expected.numpy(), rtol=1e-12, atol=1e-14)
    assert mc.gradcheck(mc.lstm_step, [x, state, W, U, b])
    gates = mc.linear(x, W, b)  # the input's part computed beforehand
    check(mc.lstm_step(gates, state, U), expected.numpy(), rtol=1e-12, atol=1e-14)
    assert mc.gradcheck(mc.lstm_step, [t(gates.numpy(), True), state, U])
    with pytest.raises(mc.ArgumentError, match="got U given and b missing"):
        mc.lstm_step(x, state, W, U)
    with pytest.raises(mc.ShapeError, match=r"argument 0 \(gates\) has shape"):
        mc.lstm_step(x, state, U) if inputs != 4 * hidden else mc.lstm_step(state, state, U)
    with pytest.raises(mc.ShapeError, match=r"argument 1 \(state\) has shape"):
        mc.lstm_step(x, t(np.zeros(batch + (2 * hidden + 1,))), W, U, b)
    with pytest.raises(mc.ShapeError, match=r"argument 3 \(U\) has shape"):
        mc.lstm_step(x, state, W, t(np.zeros((hidden, 3 * hidden))), b)


@covers("softmax_cross_entropy_grad")
@given(data=st.data(), num_classes=st.integers(1, 4))
def test_softmax_cross_entropy_grad(data, num_classes):
    """The cross-entropy's gradient primitive: (softmax(z) - onehot(y)) * g, and its own VJP
    (the second derivative) by finite differences."""
    from minicavs.ops.loss import SOFTMAX_CROSS_ENTROPY_GRAD
    from minicavs.ops.registry import apply

    batch = data.draw(shapes(max_dims=2, max_side=3))
    logits = data.draw(float_arrays(batch + (num_classes,), bound=4.0))
    labels = data.draw(index_arrays(num_classes, batch))
    g = data.draw(float_arrays(batch, bound=2.0))
    probs = np.exp(logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True))
    expected = (probs - np.eye(num_classes)[labels]) * g[..., None]
    out = apply(SOFTMAX_CROSS_ENTROPY_GRAD, t(logits), labels, t(g))
    check(out, expected, rtol=1e-12, atol=1e-12)
    assert mc.gradcheck(lambda z, y, w: apply(SOFTMAX_CROSS_ENTROPY_GRAD, z, y, w),
                        [logits, labels, g])


@covers("unfold", "fold")
@given(data=st.data(), nd=st.integers(1, 2))
def test_unfold_and_fold_are_windows_and_their_adjoint(data, nd):
    """unfold(x)[..., k, o] = x_pad[..., o·s + k·d] for each kernel offset k and output position
    o (per spatial axis), padding filled with ``value``; fold is its adjoint:
    <unfold(x), c> = <x, fold(c)>. Both gradient-checked (each one's VJP is the other)."""
    from minicavs.ops.conv import _fold, _unfold

    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    stride = tuple(data.draw(st.integers(1, 2)) for _ in range(nd))
    dilation = tuple(data.draw(st.integers(1, 2)) for _ in range(nd))
    padding = tuple((data.draw(st.integers(0, 1)), data.draw(st.integers(0, 2)))
                    for _ in range(nd))
    size = tuple(max(d * (k - 1) + 1 - b - a, 1) + data.draw(st.integers(0, 3))
                 for k, d, (b, a) in zip(kernel, dilation, padding))
    lead = data.draw(shapes(max_dims=2, min_side=1, max_side=2))
    x = data.draw(float_arrays(lead + size))
    value = data.draw(st.sampled_from([0.0, -np.inf]))
    padded = np.pad(x, [(0, 0)] * len(lead) + list(padding), constant_values=value)
    out = tuple((n + b + a - d * (k - 1) - 1) // s + 1
                for n, k, s, d, (b, a) in zip(size, kernel, stride, dilation, padding))
    expected = np.empty(lead + kernel + out)
    for k in np.ndindex(*kernel):
        for o in np.ndindex(*out):
            source = tuple(oi * s + ki * d for oi, ki, s, d in zip(o, k, stride, dilation))
            expected[(Ellipsis,) + k + o] = padded[(Ellipsis,) + source]
    check(_unfold(t(x), kernel, stride, dilation, padding, value), expected, rtol=0, atol=0)
    cols = data.draw(float_arrays(lead + kernel + out))
    folded = _fold(t(cols), size, kernel, stride, dilation, padding)
    finite = np.where(np.isfinite(expected), expected, 0.0)
    np.testing.assert_allclose(np.sum(finite * cols), np.sum(x * folded.numpy()), rtol=1e-12,
                               atol=1e-12)
    assert mc.gradcheck(lambda x: _unfold(x, kernel, stride, dilation, padding), [x])
    assert mc.gradcheck(lambda c: _fold(c, size, kernel, stride, dilation, padding), [cols])


@covers("conv_windows", "conv_windows_input_grad", "conv_windows_weight_grad")
@given(data=st.data(), nd=st.integers(1, 2))
def test_conv_windows_applies_filters_to_windows_and_its_gradients_are_adjoints(data, nd):
    """conv_windows(cols, w, b)[..., o, p] = Σ_{c,k} w[o, c, k] cols[..., c, k, p] + b[o]; its
    input gradient is wᵀ·g and its weight gradient Σ g·colsᵀ, each checked as the adjoint
    (<y(c), g> = <c, input_grad(g)> = <w, weight_grad(c, g)>) and gradient-checked."""
    from minicavs.ops.conv import (CONV_WINDOWS, CONV_WINDOWS_INPUT_GRAD,
                                   CONV_WINDOWS_WEIGHT_GRAD)
    from minicavs.ops.registry import apply

    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    out = tuple(data.draw(st.integers(1, 4)) for _ in range(nd))
    lead = data.draw(shapes(max_dims=2, min_side=1, max_side=2))
    c, o = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    cols = data.draw(float_arrays(lead + (c,) + kernel + out))
    w, b = data.draw(float_arrays((o, c) + kernel)), data.draw(float_arrays((o,)))
    g = data.draw(float_arrays(lead + (o,) + out))
    y = apply(CONV_WINDOWS, t(cols), t(w), t(b))
    flat = cols.reshape(lead + (c * int(np.prod(kernel)), int(np.prod(out))))
    expected = (w.reshape(o, -1) @ flat).reshape(lead + (o,) + out) + b.reshape((o,) + (1,) * nd)
    check(y, expected, rtol=1e-12, atol=1e-12)
    inner = np.sum((expected - b.reshape((o,) + (1,) * nd)) * g)
    d_cols = apply(CONV_WINDOWS_INPUT_GRAD, t(g), t(w)).numpy()
    d_w = apply(CONV_WINDOWS_WEIGHT_GRAD, t(cols), t(g)).numpy()
    np.testing.assert_allclose(np.sum(cols * d_cols), inner, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.sum(w * d_w), inner, rtol=1e-10, atol=1e-10)
    assert mc.gradcheck(lambda c, w, b: apply(CONV_WINDOWS, c, w, b), [cols, w, b])
    assert mc.gradcheck(lambda g, w: apply(CONV_WINDOWS_INPUT_GRAD, g, w), [g, w])
    assert mc.gradcheck(lambda c, g: apply(CONV_WINDOWS_WEIGHT_GRAD, c, g), [cols, g])


def test_softmax_cross_entropy_is_stable_for_large_logits():
    logits = t(np.array([[1000.0, -1000.0], [-1000.0, 1000.0]], dtype=np.float32),
               requires_grad=True)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        loss = mc.softmax_cross_entropy(logits, np.array([0, 0]), reduction="none")
        loss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), [0.0, 2000.0])
    np.testing.assert_allclose(logits.grad.numpy(), [[0, 0], [-1, 1]])


# --- the registry itself ----------------------------------------------------------------------

def test_every_primitive_has_a_test():
    from test_ops_everyday import PRIMITIVES as everyday  # (issue 25's ops, tested there)

    TESTED.update(everyday)
    registered = set(mc.ops.PRIMITIVES)
    assert TESTED == registered, (f"primitives without a test: {sorted(registered - TESTED)}; "
                                  f"tested but not registered: {sorted(TESTED - registered)}")


def test_elementwise_primitives_have_a_c_expression():
    for name in set(BINARY) | set(UNARY) | set(COMPARISONS) | {"pow", "where", "astype"}:
        assert mc.ops.OPS[name].is_elementwise, name
