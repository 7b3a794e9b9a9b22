"""The everyday ops of issue 25 — division with remainders, bitwise ops and shifts, sorting,
running products and extrema, scatters, einsum, roll, isclose, in-place updates — against
NumPy (always) and PyTorch (where installed), values and dtypes; their gradients with
``mc.gradcheck`` in float64; hypothesis properties; bad input.

Each test of a primitive declares it with ``@covers``; ``tests/test_ops.py`` counts these in
its check that every registered primitive has a test.
"""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from peers import torch_or_skip

PRIMITIVES = set()


def covers(*names):
    PRIMITIVES.update(names)
    return lambda test: test


def t(a, requires_grad=False):
    return mc.tensor(np.asarray(a), requires_grad=requires_grad)


def same(out, expected):
    """``out`` (a Tensor) is NumPy's ``expected``: shape, dtype and values (NaN where NaN)."""
    expected = np.asarray(expected)
    assert out.shape == expected.shape and out.dtype == expected.dtype, (
        out.shape, out.dtype, expected.shape, expected.dtype)
    np.testing.assert_array_equal(out.numpy(), expected)



INTS = [np.int8, np.int32, np.int64, np.uint8]
RNG = np.random.default_rng(25)


# --- division: %, //, fmod; trunc and copysign --------------------------------------------------

def _int_operands(dtype):
    a = np.array([-7, -6, -1, 0, 1, 5, 7, 100], dtype=np.int64)
    b = np.array([2, -3, 5, -2, -1, 3, -7, 9], dtype=np.int64)
    if np.dtype(dtype).kind == "u":
        a, b = np.abs(a), np.abs(b)
    return a.astype(dtype), b.astype(dtype)


@covers("remainder", "floor_divide", "fmod")
@pytest.mark.parametrize("dtype", INTS + [np.float32, np.float64])
def test_division_ops_equal_numpy_and_keep_the_dtype(dtype):
    a, b = _int_operands(dtype)
    if np.dtype(dtype).kind == "f":
        a, b = a * 0.75, b * 1.25
    same(t(a) % t(b), np.remainder(a, b))
    same(t(a) // t(b), np.floor_divide(a, b))
    same(mc.fmod(t(a), t(b)), np.fmod(a, b))
    same(mc.remainder(t(a), t(b)), np.remainder(a, b))
    same(mc.mod(t(a), 3), np.mod(a, dtype(3)))  # a scalar takes the tensor's dtype
    same(7 % t(b), np.remainder(dtype(7), b))
    same(100 // t(b), np.floor_divide(dtype(100), b))


def test_division_ops_equal_pytorch():
    torch = torch_or_skip()
    for dtype in (np.int64, np.float64):
        a, b = _int_operands(dtype)
        for mine, theirs in ((lambda x, y: x % y, torch.remainder),
                             (lambda x, y: x // y, torch.floor_divide), (mc.fmod, torch.fmod)):
            want = theirs(torch.from_numpy(a), torch.from_numpy(b)).numpy()
            same(mine(t(a), t(b)), want)


def test_division_of_floats_at_zeros_infinities_and_nans_is_numpys():
    values = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan, 1e-300])
    a, b = [g.ravel() for g in np.meshgrid(values, values)]
    with np.errstate(all="ignore"):
        for fn, ref in ((mc.remainder, np.remainder), (mc.floor_divide, np.floor_divide),
                        (mc.fmod, np.fmod), (mc.copysign, np.copysign)):
            got, want = fn(t(a), t(b)).numpy(), ref(a, b)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0.0 too


@given(data=st.data())
def test_integer_division_identity_and_the_sign_of_the_remainder(data):
    dtype = data.draw(st.sampled_from([np.int8, np.int32, np.int64]))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=5))
    a = data.draw(hnp.arrays(dtype, shape, elements=st.integers(-100, 100)))
    b = data.draw(hnp.arrays(dtype, shape, elements=st.integers(-9, 9).filter(bool)))
    q, r = (t(a) // t(b)).numpy(), (t(a) % t(b)).numpy()
    np.testing.assert_array_equal(q * b + r, a)  # Python's divmod identity
    assert np.all((r == 0) | (np.sign(r) == np.sign(b)))  # % has the divisor's sign
    assert np.all(np.abs(r) < np.abs(b))
    f = mc.fmod(t(a), t(b)).numpy()
    assert np.all((f == 0) | (np.sign(f) == np.sign(a)))  # fmod has the dividend's sign


def _away_from_steps(shape, divisor):
    """Dividends whose quotients by ``divisor`` are at least 0.1 from an integer, so finite
    differences do not cross a step of % or //."""
    q = RNG.uniform(-3, 3, shape)
    q = np.where(np.abs(q - np.round(q)) < 0.1, q + 0.3, q)
    return q * divisor


@covers("trunc", "copysign")
def test_gradients_of_the_division_ops_trunc_and_copysign():
    b = np.array([[1.5, -2.0, 0.75], [-1.25, 3.0, 2.5]])
    a = _away_from_steps((2, 3), b)
    for fn in (mc.remainder, mc.fmod, mc.floor_divide, mc.copysign):
        assert mc.gradcheck(fn, [a, b])
    assert mc.gradcheck(lambda x, y: mc.remainder(x, y[0]), [a, b])  # broadcast divisor
    x = a + 0.05
    assert mc.gradcheck(mc.trunc, [x])
    same(mc.trunc(t(x)), np.trunc(x))
    # zero gradients, not missing ones (floor's rule)
    xt, yt = t(a, True), t(b, True)
    (mc.floor_divide(xt, yt).sum() + mc.trunc(xt).sum()).backward()
    assert np.all(xt.grad.numpy() == 0) and np.all(yt.grad.numpy() == 0)
    # copysign: |a| with b's sign, the gradient 0 at a = 0 (PyTorch's)
    zt = t(np.array([0.0, 2.0, -3.0]), True)
    mc.copysign(zt, t(np.array([-1.0, -1.0, 1.0]))).sum().backward()
    np.testing.assert_array_equal(zt.grad.numpy(), [0.0, -1.0, -1.0])


def test_trunc_and_copysign_make_floats_as_numpy():
    i = np.array([-3, 2], np.int32)
    assert mc.trunc(t(np.array([-1.7, 1.7], np.float32))).dtype == np.float32
    assert mc.copysign(t(i), -1.0).dtype == mc.default_dtype()  # integers become floats
    same(mc.copysign(t(np.array([1.0, -2.0])), t(np.array([-0.0, 0.0]))), [-1.0, 2.0])


def test_division_bad_input():
    a = t(np.array([1, 2, 3]))
    with pytest.raises(mc.ArgumentError, match=r"op 'remainder': integer division by zero "
                                               r"\(argument 1, the divisor, is 0 at position "
                                               r"\(1,\)"):
        a % t(np.array([1, 0, 1]))
    with pytest.raises(mc.ArgumentError, match="op 'floor_divide': integer division by zero"):
        a // 0
    with pytest.raises(mc.DTypeError, match="op 'fmod': arguments must be integer or float "
                                            "arrays, got dtype bool"):
        mc.fmod(t(np.array([True])), t(np.array([True])))
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isinf((t([1.0]) // 0.0).numpy()).all()  # floats: inf, as NumPy


# --- bitwise ops and shifts ---------------------------------------------------------------------

@covers("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift", "right_shift")
@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_ops_and_shifts_equal_numpy(dtype):
    a, b = _int_operands(dtype)
    same(t(a) & t(b), np.bitwise_and(a, b))
    same(t(a) | t(b), np.bitwise_or(a, b))
    same(t(a) ^ t(b), np.bitwise_xor(a, b))
    same(~t(a), np.invert(a))
    same(t(a) & 6, np.bitwise_and(a, dtype(6)))
    shifts = np.array([0, 1, 3, 7, 8, 31, 63, 64], dtype=dtype)  # the width and beyond: 0
    same(t(a) << t(shifts), np.left_shift(a, shifts))
    same(t(a) >> t(shifts), np.right_shift(a, shifts))  # negative values: -1
    same(1 << t(np.abs(b)), np.left_shift(dtype(1), np.abs(b)))
    same(mc.left_shift(t(a), 2), np.left_shift(a, dtype(2)))


def test_bitwise_ops_on_bools_and_mixed_equal_pytorch():
    torch = torch_or_skip()
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    i = np.array([3, -4, 5, 0], np.int32)
    for op in ("__and__", "__or__", "__xor__"):
        for x, y in ((p, q), (p, i), (i, i[::-1].copy())):
            want = getattr(torch.from_numpy(x), op)(torch.from_numpy(y)).numpy()
            same(getattr(t(x), op)(t(y)), want)
    same(~t(p), ~p)
    same(mc.bitwise_not(t(p)), ~p)
    same(t(i) << 3, (torch.from_numpy(i) << 3).numpy())
    same(t(i) >> 1, (torch.from_numpy(i) >> 1).numpy())


def test_bitwise_bad_input():
    x = t(np.array([1.5, 2.0]))
    with pytest.raises(mc.UnsupportedError, match="operator &: minicavs defines it on boolean "
                                                  "tensors .* and integer tensors .* got dtype "
                                                  "float"):
        x & x
    with pytest.raises(mc.UnsupportedError, match="operator ~: .* got dtype float"):
        ~x
    with pytest.raises(mc.DTypeError, match="op 'left_shift': arguments must be integer "
                                            "tensors, got dtype bool"):
        t(np.array([True])) << t(np.array([True]))
    with pytest.raises(mc.DTypeError, match="op 'bitwise_and': arguments must be integer or "
                                            "bool tensors, got dtype float"):
        mc.bitwise_and(x, x)
    assert mc.ops.OPS["bitwise_and"].vjp is None  # integers: nothing to differentiate


# --- isclose, allclose --------------------------------------------------------------------------

def test_isclose_and_allclose_equal_numpy_and_pytorch():
    a = np.array([1.0, 1.0 + 1e-6, np.inf, -np.inf, np.inf, np.nan, 0.0, 1e-9])
    b = np.array([1.0, 1.0, np.inf, -np.inf, -np.inf, np.nan, 1e-9, 0.0])
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 0.0, "atol": 1e-12}):
        same(mc.isclose(t(a), t(b), **kwargs), np.isclose(a, b, **kwargs))
        assert mc.allclose(t(a[:2]), t(b[:2]), **kwargs) == np.allclose(a[:2], b[:2], **kwargs)
    same(t(a).isclose(t(b)), np.isclose(a, b))
    assert mc.allclose(t(a), t(a), equal_nan=True) and not mc.allclose(t(a), t(a))
    i = np.array([1, 2, 3])
    same(mc.isclose(t(i), t(i + np.array([0, 1, 0]))), [True, False, True])
    torch = torch_or_skip()
    same(mc.isclose(t(a), t(b)), torch.isclose(torch.from_numpy(a), torch.from_numpy(b)).numpy())
    with pytest.raises(mc.ArgumentError, match="isclose: rtol must be a non-negative number"):
        mc.isclose(t(a), t(b), rtol=-1)


# --- sort, argsort, topk, unique ---------------------------------------------------------------

@covers("argsort", "take_along_axis", "put_along_axis_add")
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_are_stable_and_equal_pytorch(descending):
    torch = torch_or_skip()
    x = np.array([[3.0, 1.0, 3.0, np.nan, 2.0, 1.0], [0.0, -1.0, 5.0, 5.0, -np.inf, 0.0]])
    for axis in (0, 1, -1):
        values, indices = mc.sort(t(x), axis=axis, descending=descending)
        want = torch.sort(torch.from_numpy(x), dim=axis, descending=descending, stable=True)
        same(values, want.values.numpy())
        same(indices, want.indices.numpy())
        same(mc.argsort(t(x), axis, descending), want.indices.numpy())
    if not descending:  # NumPy's stable sort, NaN last
        same(mc.argsort(t(x)), np.argsort(x, kind="stable"))
    i = np.array([3, 1, 2, 1], np.int8)
    same(t(i).sort().values, np.sort(i))  # any dtype, kept
    same(mc.sort(t(np.float64(2.0))).values, np.float64(2.0))  # 0-d


@given(x=hnp.arrays(np.int16, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                    elements=st.integers(-3, 3)),
       descending=st.booleans())
def test_sorted_values_are_a_stable_permutation(x, descending):
    axis = x.ndim - 1
    values, indices = mc.sort(t(x), axis=axis, descending=descending)
    v, i = values.numpy(), indices.numpy()
    np.testing.assert_array_equal(np.take_along_axis(x, i, axis), v)
    step = np.diff(v.astype(np.int64), axis=axis)
    assert np.all(step <= 0 if descending else step >= 0)
    ties = np.diff(v.astype(np.int64), axis=axis) == 0
    assert np.all(np.diff(i, axis=axis)[ties] > 0)  # equal values keep their order


def test_sort_topk_gradients_go_to_each_values_place():
    x = RNG.permutation(24).reshape(4, 6) / 8.0  # distinct values: no ties to split
    assert mc.gradcheck(lambda a: mc.sort(a, axis=0).values, [x])
    assert mc.gradcheck(lambda a: mc.sort(a, descending=True).values, [x])
    assert mc.gradcheck(lambda a: mc.topk(a, 3, axis=1).values, [x])
    assert mc.gradcheck(lambda a: mc.topk(a, 2, axis=0, largest=False).values, [x])
    s = mc.sort(t(x, True))
    assert s.values.requires_grad and not s.indices.requires_grad  # indices: no gradient
    idx = np.array([[0, 0, 2], [1, 0, 0]])  # (repeats: their gradients add up)
    same(mc.take_along_axis(t(x[:2, :3]), idx, 1), np.take_along_axis(x[:2, :3], idx, 1))
    assert mc.gradcheck(lambda a: mc.take_along_axis(a, idx, 1), [x[:2, :3]])
    assert mc.gradcheck(lambda g: mc.put_along_axis_add(g, idx, 1, 4), [x[:2, :3]])
    with pytest.raises(mc.IndexRangeError, match=r"op 'take_along_axis': index 3 at position "
                                                 r"\(0, 1\) is out of range for axis 1 with "
                                                 r"size 3"):
        mc.take_along_axis(t(x[:2, :3]), np.array([[0, 3, 0], [0, 0, 0]]), 1)
    with pytest.raises(mc.ShapeError, match=r"op 'take_along_axis': indices of shape \(2,\) "
                                            r"must have the shape of argument 0"):
        mc.take_along_axis(t(x), np.array([0, 1]), 1)


def test_topk_equals_pytorch_and_numpy():
    torch = torch_or_skip()
    x = RNG.standard_normal((3, 7))
    for k, largest, axis in ((3, True, 1), (2, False, 0), (7, True, -1), (0, True, 1)):
        values, indices = t(x).topk(k, axis=axis, largest=largest)
        want = torch.topk(torch.from_numpy(x), k, dim=axis, largest=largest)
        same(values, want.values.numpy())
        same(indices, want.indices.numpy())  # no ties here: the same indices
    with pytest.raises(mc.ShapeError, match=r"topk: k=8 must be an int in 0..7 \(the size of "
                                            r"axis 1 of x with shape \(3, 7\)\)"):
        mc.topk(t(x), 8)


def test_unique_equals_numpy_and_pytorch():
    torch = torch_or_skip()
    x = np.array([[3, 1, 3], [2, 1, 7]])
    values, inverse, counts = mc.unique(t(x), return_inverse=True, return_counts=True)
    want_v, want_i, want_c = np.unique(x, return_inverse=True, return_counts=True)
    same(values, want_v)
    same(inverse, want_i.reshape(x.shape))
    same(counts, want_c)
    tv, ti, tc = torch.unique(torch.from_numpy(x), return_inverse=True, return_counts=True)
    same(inverse, ti.numpy())
    same(counts, tc.numpy())
    rows, inv = mc.unique(t(np.array([[1, 2], [0, 5], [1, 2]])), return_inverse=True, axis=0)
    same(rows, [[0, 5], [1, 2]])
    same(inv, [1, 0, 1])


def test_unique_is_not_differentiable_and_not_traceable():
    x = t(np.array([2.0, 1.0, 2.0]), True)
    u = mc.unique(x)
    same(u, [1.0, 2.0])
    with pytest.raises(mc.UnsupportedError, match="op 'unique' is not differentiable"):
        (u * 2).sum().backward()
    with pytest.raises(mc.GraphError, match="unique: its result's size depends on the values"):
        mc.trace(mc.unique, ((3,), "float64"))


# --- cumprod, cummax, cummin --------------------------------------------------------------------

@covers("cumprod")
def test_cumprod_equals_numpy_and_its_gradient_is_exact_at_zeros():
    x = RNG.uniform(0.5, 1.5, (3, 5)) * RNG.choice([-1, 1], (3, 5))
    for axis in (0, 1):
        np.testing.assert_allclose(mc.cumprod(t(x), axis).numpy(), np.cumprod(x, axis))
        assert mc.gradcheck(lambda a: mc.cumprod(a, axis), [x])
    one_zero, two_zeros = x.copy(), x.copy()
    one_zero[1, 2] = 0.0
    two_zeros[0, 1] = two_zeros[0, 3] = 0.0
    two_zeros[2, 0] = 0.0
    for z in (one_zero, two_zeros):
        assert mc.gradcheck(lambda a: mc.cumprod(a, 1), [z])
        assert mc.gradcheck(lambda a: mc.cumprod(a, 0), [z])
    i = np.array([1, 2, 3], np.int8)
    same(mc.cumprod(t(i)), np.cumprod(i, dtype=np.int64))  # small integers widen, as cumsum


def _grad(fn, x, weights):
    x = t(x, requires_grad=True)
    (fn(x) * t(weights)).sum().backward()
    return x.grad.numpy()


def test_running_sum_and_product_gradients_sum_from_the_end_without_cancelling():
    # The reverse running sum written as sum(g) - cumsum(g) + g lost every small term next
    # to a large one: [1e8, 1, 1, 1, 1, 1] instead of [1e8 + 5, 5, 4, 3, 2, 1].
    for dtype, big in ((np.float32, 1e8), (np.float64, 1e17)):
        w = np.array([big, 1, 1, 1, 1, 1], dtype)
        got = _grad(mc.cumsum, np.ones(6, dtype), w)
        np.testing.assert_allclose(got, [big + 5, 5, 4, 3, 2, 1], rtol=1e-6)
        np.testing.assert_array_equal(got[1:], [5, 4, 3, 2, 1])
    x = np.array([1000, 1000, 1000, 1e-3, 1e-3, 1e-3, 1], np.float32)
    exact = [sum(np.prod(np.delete(x.astype(np.float64)[:j + 1], i)) for j in range(i, 7))
             for i in range(7)]
    np.testing.assert_allclose(_grad(mc.cumprod, x, np.ones(7, np.float32)), exact, rtol=1e-5)
    with_zeros = np.array([1000, 0, 1000, 1e-3, 0, 1e-3, 1], np.float64)
    exact = [sum(np.prod(np.delete(with_zeros[:j + 1], i)) for j in range(i, 7))
             for i in range(7)]
    np.testing.assert_allclose(_grad(mc.cumprod, with_zeros, np.ones(7)), exact, rtol=1e-12)


@covers("cumargmax", "cumargmin")
def test_cummax_and_cummin_equal_pytorch_with_ties_and_nans():
    torch = torch_or_skip()
    x = np.array([[3.0, 1.0, 3.0, np.nan, 2.0, np.nan], [0.0, -1.0, 5.0, 5.0, 4.0, -1.0]])
    for fn, theirs in ((mc.cummax, torch.cummax), (mc.cummin, torch.cummin)):
        for axis in (0, 1):
            values, indices = fn(t(x), axis)
            want = theirs(torch.from_numpy(x), axis)
            same(values, want.values.numpy())
            same(indices, want.indices.numpy())
    i = np.array([2, 7, 7, 1], np.int32)
    same(t(i).cummax().values, np.maximum.accumulate(i))
    same(t(i).cummin().indices, [0, 0, 0, 3])


def test_cummax_gradient_goes_to_where_the_maximum_was_found():
    x = RNG.permutation(20).reshape(4, 5) / 4.0
    assert mc.gradcheck(lambda a: mc.cummax(a, 1).values, [x])
    assert mc.gradcheck(lambda a: mc.cummin(a, 0).values, [x])
    xt = t(np.array([1.0, 3.0, 2.0, 3.0]), True)
    mc.cummax(xt).values.sum().backward()
    # running maxima from positions 0, 1, 1, 3 (a tie takes the later index): PyTorch's
    np.testing.assert_array_equal(xt.grad.numpy(), [1.0, 2.0, 0.0, 1.0])


# --- roll ---------------------------------------------------------------------------------------

def test_roll_equals_numpy_and_pytorch():
    torch = torch_or_skip()
    x = np.arange(24.0).reshape(2, 3, 4)
    for shift, axis in ((1, None), (-5, None), (2, 1), (7, -1), ((1, -2), (0, 2)), (3, (1, 2))):
        want = np.roll(x, shift, axis)
        same(mc.roll(t(x), shift, axis), want)
        if np.ndim(shift) == np.ndim(axis) or axis is None:  # (torch does not broadcast shifts)
            np.testing.assert_array_equal(torch.roll(torch.from_numpy(x), shift, axis).numpy(),
                                          want)
    assert mc.gradcheck(lambda a: mc.roll(a, (1, -2), (0, 1)), [RNG.standard_normal((3, 4))])
    with pytest.raises(mc.ShapeError, match="roll: 2 shifts for 3 axes"):
        mc.roll(t(x), (1, 2), (0, 1, 2))


# --- scatter, scatter_add, scatter_reduce -------------------------------------------------------

INDEX = np.array([[0, 1, 2, 0], [2, 1, 0, 0], [0, 0, 0, 1]])  # repeats: rows 0 and 2


@covers("scatter_reduce_rows")
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_equals_pytorch_and_gradchecks(reduce, include_self):
    torch = torch_or_skip()
    x, src = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 5))
    for axis, index in ((0, INDEX), (1, INDEX[:, :3])):
        got = mc.scatter_reduce(t(x), axis, index, t(src), reduce, include_self=include_self)
        want = torch.scatter_reduce(torch.from_numpy(x), axis, torch.from_numpy(index),
                                    torch.from_numpy(src), reduce, include_self=include_self)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        assert mc.gradcheck(lambda a, s: mc.scatter_reduce(a, axis, index, s, reduce,
                                                           include_self=include_self), [x, src])


def test_scatter_reduce_of_integers_and_the_prod_gradient_at_zeros():
    torch = torch_or_skip()
    x, src = np.array([[1, 2], [3, 4]]), np.array([[2, 5], [7, -8]])
    index = np.array([[0, 0], [0, 0]])
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        got = mc.scatter_reduce(t(x), 0, index, t(src), reduce)
        same(got, torch.scatter_reduce(torch.from_numpy(x), 0, torch.from_numpy(index),
                                       torch.from_numpy(src), reduce).numpy())
    zeros = np.array([[0.0, 2.0], [3.0, 0.0]])
    assert mc.gradcheck(lambda a, s: mc.scatter_reduce(a, 0, index, s, "prod"),
                        [zeros, np.array([[0.5, 0.0], [1.5, 0.0]])])


def test_scatter_and_scatter_add_equal_pytorch_and_gradcheck():
    torch = torch_or_skip()
    x, src = RNG.standard_normal((3, 4)), RNG.standard_normal((2, 4))
    unique_index = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])  # (no repeats along axis 0)
    tx, ts, ti = torch.from_numpy(x), torch.from_numpy(src), torch.from_numpy(unique_index)
    same(mc.scatter(t(x), 0, unique_index, t(src)), torch.scatter(tx, 0, ti, ts).numpy())
    same(t(x).scatter(0, unique_index, value=2.5), torch.scatter(tx, 0, ti, 2.5).numpy())
    np.testing.assert_allclose(mc.scatter_add(t(x), 0, INDEX[:2], t(src)).numpy(),
                               torch.scatter_add(tx, 0, torch.from_numpy(INDEX[:2]), ts).numpy())
    np.testing.assert_allclose(
        mc.scatter(t(x), 0, INDEX[:2], t(src), reduce="multiply").numpy(),
        torch.scatter(tx, 0, torch.from_numpy(INDEX[:2]), ts, reduce="multiply").numpy())
    assert mc.gradcheck(lambda a, s: mc.scatter_add(a, 0, INDEX[:2], s), [x, src])
    assert mc.gradcheck(lambda a, s: mc.scatter(a, 1, unique_index[:, :2], s), [x, src])
    # a repeated index writes the last value (NumPy's rule), which alone gets a gradient
    s = t(np.array([[1.0, 2.0, 3.0]]), True)
    out = mc.scatter(t(np.zeros((1, 2))), 1, np.array([[1, 0, 1]]), s)
    same(out, [[2.0, 3.0]])
    out.sum().backward()
    same(s.grad, [[0.0, 1.0, 1.0]])


def test_scatter_bad_input():
    x, src = t(np.zeros((3, 4))), t(np.ones((2, 4)))
    with pytest.raises(mc.IndexRangeError, match=r"scatter_add: index 3 at position \(1, 2\) is "
                                                 r"out of range for axis 0 of input with size 3"):
        mc.scatter_add(x, 0, np.array([[0, 1, 2, 0], [2, 1, 3, 0]]), src)
    with pytest.raises(mc.ShapeError, match="scatter: index has 1 dimension.* and input has 2"):
        mc.scatter(x, 0, np.array([0, 1]), src)
    with pytest.raises(mc.ShapeError, match=r"index of shape \(3, 4\) is larger than src "
                                            r"\(2, 4\) on axis 0"):
        mc.scatter(x, 0, np.zeros((3, 4), np.int64), src)
    with pytest.raises(mc.ArgumentError, match="scatter_reduce: reduce must be one of sum, "
                                               "prod, mean, amax, amin, got 'max'"):
        mc.scatter_reduce(x, 0, np.zeros((2, 4), np.int64), src, "max")
    with pytest.raises(mc.ArgumentError, match="scatter: give exactly one of src"):
        mc.scatter(x, 0, np.zeros((2, 4), np.int64))


# --- einsum -------------------------------------------------------------------------------------

def _einsum_cases():
    r = np.random.default_rng(3)
    A, B = r.standard_normal((3, 3)), r.standard_normal((3, 4))
    C, D = r.standard_normal((2, 3, 4)), r.standard_normal((2, 4, 5))
    E = r.standard_normal((1, 3, 3))
    return [("ij,jk->ik", [A, B]), ("ij,jk", [A, B]), ("ii->i", [A]), ("ii", [A]),
            ("ij->", [B]), ("ji", [B]), ("bij,bjk->bik", [C, D]),
            ("...ij,...jk->...ik", [E, C]), ("...ii->...i", [E]), ("i,i->", [A[0], A[1]]),
            ("i,j->ij", [A[0], B[0]]), ("ijk->kji", [C]), ("bij,bjk,kl->bil",
                                                            [C, D, r.standard_normal((5, 2))]),
            ("i...->...", [C]), ("ij, jk -> ki", [A, B])]


@covers("einsum")
@pytest.mark.parametrize("subscripts, operands", _einsum_cases(), ids=lambda c: str(c)[:20])
def test_einsum_equals_numpy_and_pytorch_and_gradchecks(subscripts, operands):
    want = np.einsum(subscripts, *operands)
    got = mc.einsum(subscripts, *[t(o) for o in operands])
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    assert mc.gradcheck(lambda *xs: mc.einsum(subscripts, *xs), operands)
    torch = torch_or_skip()
    theirs = torch.einsum(subscripts, *[torch.from_numpy(o) for o in operands]).numpy()
    np.testing.assert_allclose(got.numpy(), theirs, rtol=1e-12, atol=1e-12)


def test_einsum_promotes_like_matmul_and_takes_a_list():
    a = np.ones((2, 3), np.float32)
    assert mc.einsum("ij,jk->ik", [t(a), t(np.ones((3, 2), np.float64))]).dtype == np.float64
    same(mc.einsum("ij->j", t(np.arange(6).reshape(2, 3))), [3, 5, 7])  # integers stay


def test_einsum_bad_input():
    a, b = t(np.ones((2, 3))), t(np.ones((4, 5)))
    with pytest.raises(mc.ShapeError, match="op 'einsum': subscript 'j' has size 3 in argument "
                                            "0 and 4 in argument 1"):
        mc.einsum("ij,jk->ik", a, b)
    with pytest.raises(mc.ArgumentError, match="einsum: 'ij->ik' names 1 operand"):
        mc.einsum("ij->ik", a, b)
    with pytest.raises(mc.ArgumentError, match="the output of 'ij->ik' must name letters of "
                                               "the inputs"):
        mc.einsum("ij->ik", a)
    with pytest.raises(mc.ShapeError, match="term 'ijk' names 3 axes, but operand 0 has shape "
                                            r"\(2, 3\)"):
        mc.einsum("ijk->i", a)
    with pytest.raises(mc.ArgumentError, match="a term holds letters and at most one '...'"):
        mc.einsum("i1->i", a)


def test_einsum_cumprod_sort_cummax_and_roll_inside_a_vertex_function():
    rng = np.random.default_rng(7)
    W = mc.Parameter(rng.standard_normal((3, 4)) * 0.5)

    def cell(v):
        x = v.pull()
        h = mc.tanh(mc.einsum("i,ij->j", x, W)) + v.gather(0)
        ranks = mc.astype(mc.argsort(h), h.dtype)
        v.scatter(mc.roll(mc.cumprod(h, 0), 1, 0) + ranks * 0.1 + mc.sort(h).values
                  + mc.cummax(h, 0).values * 0.5)

    F = mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(4,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.chain(2)])
    X = mc.tensor(rng.standard_normal((batch.num_vertices, 3)))
    out = F(batch, pull=X)
    expected = mc.evaluate_per_sample(F, batch, pull=X)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


def test_sort_topk_cummax_cumprod_einsum_under_autobatch_equal_eager():
    rng = np.random.default_rng(11)
    xs = [t(rng.standard_normal((3, 4)), True) for _ in range(3)]

    def f(x):
        return (mc.sort(x, 1).values + mc.cumprod(x, 1) + x % 0.5 + mc.topk(x, 2, 0).values.sum()
                + mc.einsum("ij,ij->i", x, x)[:, None] + mc.cummax(x, 0).values).sum()

    eager = [f(x) for x in xs]
    sum(eager[1:], eager[0]).backward()
    want = [x.grad.numpy() for x in xs]
    for x in xs:
        x.grad = None
    with mc.autobatch():
        outs = [f(x) for x in xs]
        total = sum(outs[1:], outs[0])
    np.testing.assert_allclose([o.item() for o in outs], [e.item() for e in eager], rtol=1e-12)
    total.backward()
    for x, w in zip(xs, want):
        np.testing.assert_allclose(x.grad.numpy(), w, rtol=1e-12, atol=1e-12)


def test_the_division_ops_in_a_native_level_loop_equal_the_interpreter():
    from minicavs.cpu import build
    from minicavs.runtime import interpreter_only

    if build.unavailable() is not None:
        pytest.skip(f"the native backend is off: {build.unavailable()}")
    rng = np.random.default_rng(7)
    W = mc.Parameter(rng.standard_normal((3, 4)) * 0.5)

    def cell(v):  # the C bodies of %, //, fmod, trunc, copysign in the generated C++ loop
        h = mc.tanh(v.pull() @ W + v.gather(0))
        v.scatter(h % 0.3 + mc.trunc(h * 3.0) * 0.1 + mc.copysign(h, -h) * 0.5
                  + mc.fmod(h, 0.2) + h // 0.25 * 0.01)

    F = mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(4,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(4), mc.InputGraph.chain(3)])
    X = mc.tensor(rng.standard_normal((batch.num_vertices, 3)))
    out = F(batch, pull=X)
    assert F.explain()["forward_backend"] == "native"
    with interpreter_only():
        want = F(batch, pull=X)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_the_ops_in_a_traced_function_equal_eager_values_and_gradients():
    index = np.array([[0, 1, 2, 0], [2, 1, 0, 0]])

    def fn(x, s):
        return (mc.sort(x, axis=0).values + mc.topk(x, 2, axis=0).values.sum()
                + mc.cummax(x, 1).values + mc.cumprod(x, 1) + x % 0.7 + mc.roll(x, 1, 1)
                + mc.scatter_reduce(x, 0, index, s, "amax") + mc.scatter_add(x, 0, index, s)
                + mc.scatter(x, 0, index, s) + mc.einsum("ij,kj->ik", x, s).sum())

    traced = mc.symbolic(fn)
    rng = np.random.default_rng(5)
    grads = []
    for run in (traced, fn):
        x, s = t(rng.standard_normal((3, 4)), True), t(rng.standard_normal((2, 4)), True)
        out = run(x, s)
        out.sum().backward()
        grads.append((out.numpy(), x.grad.numpy(), s.grad.numpy()))
        rng = np.random.default_rng(5)
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# --- in-place updates ---------------------------------------------------------------------------

def test_optimiser_style_in_place_updates_under_no_grad():
    p = mc.Parameter(np.ones(3))
    same_object, version = p, p.version
    p.grad = mc.tensor(np.array([1.0, 2.0, 3.0]))
    with mc.no_grad():
        p -= 0.5 * p.grad
        p.mul_(2.0).add_(mc.tensor(np.ones(3)), alpha=3.0)
        p /= 2.0
    assert p.version == version + 4  # each write bumps the version counter
    assert p is same_object and p.requires_grad and p.is_leaf
    same(p, (((np.ones(3) - 0.5 * np.array([1.0, 2.0, 3.0])) * 2 + 3) / 2))
    with mc.no_grad():
        p.copy_(np.array([1, 2, 3])).sub_(1.0)  # copy_ converts, as astype
        same(p, [0.0, 1.0, 2.0])
        p.zero_()
        same(p, [0.0, 0.0, 0.0])
        p.fill_(1.5)
    same(p, [1.5, 1.5, 1.5])
    i = t(np.array([7, -7]))
    i //= 2
    i %= 3
    same(i, np.remainder(np.floor_divide([7, -7], 2), 3))


def test_in_place_updates_refuse_what_would_change_a_recorded_graph():
    p = mc.Parameter(np.ones(3))
    with pytest.raises(mc.UnsupportedError, match=r"operator -=: an in-place update where "
                                                  r"gradients are recorded .* mc.no_grad"):
        p -= 0.1
    with pytest.raises(mc.UnsupportedError, match="zero_: an in-place update"):
        p.zero_()
    loss = (p * 2).sum()
    term = loss
    loss += p.sum()  # a computed result: a new tensor, as Python would build
    assert loss is not term and loss.requires_grad
    y = p * 3
    with mc.no_grad():
        p.add_(1.0)  # the recorded mul saved p: its backward must refuse
    with pytest.raises(mc.InPlaceModificationError, match="was changed in place"):
        y.sum().backward()
    i = t(np.array([1, 2]))
    with pytest.raises(mc.DTypeError, match=r"operator \+=: the result has dtype float.*cannot "
                                            r"be stored in the tensor's dtype int64"):
        i += 0.5
    with pytest.raises(mc.ShapeError, match=r"the result has shape \(2, 2\), which does not fit "
                                            r"the tensor's shape \(2,\)"):
        i += t(np.ones((2, 2), np.int64))


# --- the table of every public op ---------------------------------------------------------------

def test_docs_ops_table_lists_every_public_op():
    """docs/ops.md is written by hand; this compares its rows with the public namespace."""
    import inspect
    import pathlib
    import re

    table = (pathlib.Path(__file__).parent.parent / "docs" / "ops.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
    public = {name for name, value in vars(mc.ops).items()
              if not name.startswith("_") and callable(value)
              and not inspect.isclass(value) and not inspect.ismodule(value)}
    public -= {"apply", "result_dtype", "unbroadcast"}  # the registry's machinery (said there)
    assert len(rows) == len(set(rows)), "a row appears twice in docs/ops.md"
    assert not public - set(rows), f"add to docs/ops.md: {sorted(public - set(rows))}"
    assert not set(rows) - public, f"not public ops: {sorted(set(rows) - public)}"
    assert all(hasattr(mc, name) for name in rows)  # each is mc.<name> too


# --- a 0-d tensor along axis 0 or -1; resampling and rolling with odd arguments ----------------

ALONG_AN_AXIS = {  # op(x, axis) of a 0-d x: NumPy's reductions and squeeze, PyTorch's every op
    "sum": mc.sum, "mean": mc.mean, "max": mc.max, "min": mc.min, "prod": mc.prod,
    "var": mc.var, "std": mc.std, "logsumexp": mc.logsumexp, "any": mc.any, "all": mc.all,
    "argmax": mc.argmax, "argmin": mc.argmin, "softmax": mc.softmax,
    "log_softmax": mc.log_softmax, "squeeze": mc.squeeze, "cumsum": mc.cumsum,
    "cumprod": mc.cumprod, "flip": mc.flip, "argsort": mc.argsort,
    "cummax": lambda x, a: mc.cummax(x, a).values, "cummin": lambda x, a: mc.cummin(x, a).values,
    "sort": lambda x, a: mc.sort(x, a).values}


@pytest.mark.parametrize("name", sorted(ALONG_AN_AXIS))
def test_a_0d_tensor_takes_axis_0_or_minus_1_and_no_other(name):
    op = ALONG_AN_AXIS[name]
    x = np.float64(3.0)
    for axis in (0, -1):
        out = op(t(x), axis)
        like_a_vector = np.asarray(op(t(np.array([x])), 0).numpy()).reshape(())
        same(out, like_a_vector)
    for axis in (1, -2):
        with pytest.raises(mc.ShapeError, match=rf"axis {axis} is out of range for argument 0 "
                                                r"with 0 dimension\(s\) \(a 0-d argument takes "
                                                r"axis 0 or -1\)"):
            op(t(x), axis)
    if name in ("sum", "mean", "softmax", "logsumexp", "cumsum", "cumprod", "cummax"):
        assert mc.gradcheck(lambda a: op(a, -1), [np.array(0.7)])


def test_interpolate_keeps_an_integer_dtype_in_every_mode():
    image = (np.arange(16).reshape(1, 1, 4, 4) * 10).astype(np.uint8)
    for mode, size in (("nearest", (8, 8)), ("bilinear", (8, 8)), ("area", (2, 2))):
        out = mc.interpolate(t(image), size=size, mode=mode)
        as_float = mc.interpolate(t(image.astype(np.float64)), size=size, mode=mode).numpy()
        same(out, np.floor(as_float + 0.5).astype(np.uint8))  # PyTorch's uint8: half up
    assert mc.interpolate(t(image.astype(np.int64)), scale_factor=2, mode="bilinear").dtype \
        == np.int64


@pytest.mark.parametrize("scale_factor", [float("inf"), float("nan"), -1.0, 0, "2", (2.0,)])
def test_interpolate_refuses_a_scale_factor_that_is_not_a_finite_positive_number(scale_factor):
    with pytest.raises(mc.ArgumentError, match=r"interpolate: scale_factor must be finite and "
                                               r"positive, one or 2 numbers, got "):
        mc.interpolate(t(np.ones((1, 1, 4, 4), np.float32)), scale_factor=scale_factor)


def test_unfold_of_an_empty_batch_is_empty_as_in_pytorch():
    out = mc.unfold(t(np.zeros((0, 2, 4, 4), np.float32)), 2)
    assert out.shape == (0, 8, 9) and out.dtype == np.float32


@pytest.mark.parametrize("shift, axis, message", [
    (1.5, 0, "roll: shift must be an int or a tuple of ints, got 1.5"),
    ((1, 2.5), (0, 1), r"roll: shift must be an int or a tuple of ints, got \(1, 2.5\)"),
    ("a", 0, "roll: shift must be an int or a tuple of ints, got 'a'"),
    (1, 0.0, "roll: axis must be an int or a tuple of ints, got 0.0"),
])
def test_roll_refuses_shifts_and_axes_that_are_not_ints(shift, axis, message):
    with pytest.raises(mc.ArgumentError, match=message):
        mc.roll(t(np.arange(6.0).reshape(2, 3)), shift, axis)
