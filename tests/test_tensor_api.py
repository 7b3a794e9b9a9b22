"""The Tensor as a NumPy or PyTorch user reaches for it: operators, conversions to Python
numbers and NumPy, DLPack (NumPy and PyTorch, both ways), and NumPy's indexing (basic and
advanced, compared with NumPy on hypothesis-drawn keys; gradients scatter-add)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import minicavs as mc
from minicavs.testing import float_arrays, shapes
from peers import torch_or_skip


def t(a, requires_grad=False):
    return mc.tensor(np.asarray(a), requires_grad=requires_grad)


# --- operators ----------------------------------------------------------------------------------

def test_equality_operators_are_elementwise():
    a, b = t([1.0, 2.0, np.nan]), t([1.0, 3.0, np.nan])
    assert (a == b).tolist() == [True, False, False]
    assert (a != b).tolist() == [False, True, True]  # NaN != NaN, as in NumPy
    assert (a == 2.0).tolist() == [False, True, False]
    assert (2.0 == a).tolist() == [False, True, False]
    assert (a == [1.0, 0.0, 0.0]).tolist() == [True, False, False]
    assert (a == None) is False and (a != "x") is True  # noqa: E711 (not an operand: identity)
    assert len({a, b, a}) == 2  # still hashable, by identity


def test_comparisons_and_logical_operators():
    x = t([-1.0, 0.0, 2.0])
    assert (x > 0).tolist() == [False, False, True] and (0 < x).tolist() == [False, False, True]
    assert (x >= 0).tolist() == [False, True, True] and (x <= 0).tolist() == [True, True, False]
    both = (x > -1) & (x < 1)
    assert both.tolist() == [False, True, False]
    assert ((x < 0) | (x > 1)).tolist() == [True, False, True]
    assert ((x < 0) ^ (x < 1)).tolist() == [False, True, False]
    assert (~(x > 0)).tolist() == [True, True, False]
    with pytest.raises(mc.UnsupportedError, match=r"operator &: minicavs defines it on boolean "
                                                  r"tensors .* got dtype float64"):
        x & x
    with pytest.raises(mc.UnsupportedError, match="operator ~"):
        ~x


def test_arithmetic_with_reflected_scalars_and_arrays():
    x = t([1.0, 2.0])
    np.testing.assert_array_equal((2 ** x).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal((1 - x).numpy(), [0.0, -1.0])
    np.testing.assert_array_equal(abs(-x).numpy(), [1.0, 2.0])
    out = np.array([1.0, 1.0]) + x  # an ndarray on the left defers to the Tensor
    assert isinstance(out, mc.Tensor) and out.tolist() == [2.0, 3.0]
    with pytest.raises(mc.UnsupportedError, match="Tensors are immutable .* mc.where"):
        x[0] = 3.0


# --- conversions --------------------------------------------------------------------------------

def test_python_number_conversions():
    assert bool(t([0.0])) is False and bool(t(1.0)) is True
    assert float(t(2.5)) == 2.5 and int(t([[3.7]])) == 3
    assert t(np.int64(4)).item() == 4 and isinstance(t(np.int64(4)).item(), int)
    assert [10, 20, 30][t(np.array(1))] == 20  # an integer tensor is an index
    assert t([[1, 2], [3, 4]]).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert f"{t(0.123456):.3f}" == "0.123" and f"{t([1.0])}".startswith("tensor(")
    loss = t(0.5, requires_grad=True)
    assert loss > 0 and not loss < 0  # `if loss < 0:` works on one element
    with pytest.raises(mc.ShapeError, match=r"the truth value of a tensor needs a tensor with "
                                            r"one element, got shape \(2,\)"):
        bool(t([1.0, 2.0]))
    with pytest.raises(mc.ShapeError, match=r"float\(\) needs a tensor with one element"):
        float(t([1.0, 2.0]))
    with pytest.raises(mc.DTypeError, match="only an integer tensor can be used as an index"):
        [1, 2][t(1.0)]


def test_numpy_conversion():
    x = mc.tensor([[1.0, 2.0]])  # float32 (a list)
    array = np.asarray(x)
    assert isinstance(array, np.ndarray) and array.dtype == np.float32 and array.shape == (1, 2)
    assert np.shares_memory(array, x.data)
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.array(x, copy=True) is not x.data
    assert np.asarray([t(1.0), t(2.0)]).tolist() == [1.0, 2.0]  # not an object array
    assert float(np.exp(t(0.0))) == 1.0


def test_dlpack_with_numpy_both_ways():
    x = t(np.arange(6.0).reshape(2, 3))
    shared = np.from_dlpack(x)
    np.testing.assert_array_equal(shared, np.arange(6.0).reshape(2, 3))
    assert np.shares_memory(shared, x.data)  # no copy
    back = mc.from_dlpack(np.arange(3, dtype=np.int32))
    assert isinstance(back, mc.Tensor) and back.dtype == np.int32 and back.tolist() == [0, 1, 2]
    broadcast = mc.broadcast_to(t([1.0, 2.0]), (3, 2))  # a read-only view is copied first
    np.testing.assert_array_equal(np.from_dlpack(broadcast), np.broadcast_to([1.0, 2.0], (3, 2)))
    assert x.__dlpack_device__()[0] == 1  # kDLCPU
    assert not hasattr(x, "__cuda_array_interface__")  # CPU data has none
    with pytest.raises(mc.DTypeError, match="from_dlpack: list does not implement the DLPack"):
        mc.from_dlpack([1, 2])


def test_torch_interop_both_ways():
    torch = torch_or_skip()  # a benchmark extra; the protocol itself is tested above
    x = t(np.arange(4.0, dtype=np.float32))
    for converted in (torch.from_dlpack(x), torch.as_tensor(x), torch.tensor(np.asarray(x))):
        assert converted.dtype == torch.float32 and converted.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch.as_tensor(t(2.5)).item() == 2.5  # a 0-d tensor too
    back = mc.from_dlpack(torch.arange(3, dtype=torch.float64))
    assert back.dtype == np.float64 and back.tolist() == [0.0, 1.0, 2.0]
    y = t([1.0, 2.0], requires_grad=True)
    (y * mc.from_dlpack(torch.tensor([3.0, 4.0]))).sum().backward()
    assert y.grad.tolist() == [3.0, 4.0]


@pytest.mark.gpu
def test_cuda_tensors_convert_explicitly_and_share_memory():
    import cupy

    x = mc.tensor(np.arange(3.0), device="cuda")
    assert x.__cuda_array_interface__["shape"] == (3,)
    assert x.__dlpack_device__()[0] == 2
    with pytest.raises(mc.DeviceError, match="call t.numpy"):
        np.asarray(x)
    shared = cupy.from_dlpack(x)
    assert shared.data.ptr == x.data.data.ptr
    back = mc.from_dlpack(cupy.arange(3.0))
    assert back.device == "cuda" and back.tolist() == [0.0, 1.0, 2.0]


def test_symbols_have_no_numbers_while_tracing():
    def fn(x):
        float(x)

    with pytest.raises(mc.GraphError, match="float\\(\\) of traced value 'input x0'.*has no value "
                                            "while tracing, so it cannot become a Python number"):
        mc.trace(fn, mc.spec((1,)))
    graph = mc.trace(lambda x, y: mc.where(x == y, x, y), mc.spec((2,)), mc.spec((2,)))
    assert [n.op.name for n in graph.op_nodes()] == ["equal", "where"]


# --- indexing ------------------------------------------------------------------------------------

@st.composite
def index_keys(draw, shape):
    """A NumPy index for ``shape``: integers, slices (any step), None, Ellipsis, integer
    arrays (broadcasting, repeats, negatives) and boolean masks."""
    key, axis = [], 0
    ellipsis = False
    while axis < len(shape) and draw(st.booleans()):
        size = shape[axis]
        kind = draw(st.sampled_from(["int", "slice", "none", "array", "mask", "ellipsis"]))
        if kind == "int" and size:
            key.append(draw(st.integers(-size, size - 1)))
            axis += 1
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-size - 2, size + 2))
            step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(bool)))
            key.append(slice(draw(bound), draw(bound), step))
            axis += 1
        elif kind == "none":
            key.append(None)
        elif kind == "array" and size:
            key.append(draw(hnp.arrays(np.int64, draw(st.sampled_from([(2,), (2, 1), (1,)])),
                                       elements=st.integers(-size, size - 1))))
            axis += 1
        elif kind == "mask":
            key.append(draw(hnp.arrays(np.bool_, (size,))))
            axis += 1
        elif kind == "ellipsis" and not ellipsis:
            ellipsis = True
            key.append(Ellipsis)
            axis = len(shape)  # an ellipsis takes the rest, so stop
    return tuple(key)


@given(data=st.data())
def test_indexing_equals_numpy_and_its_gradient_scatter_adds(data):
    x = data.draw(float_arrays(data.draw(shapes(min_dims=1, max_side=3))))
    key = data.draw(index_keys(x.shape))
    try:
        expected = x[key]
    except IndexError:  # arrays (a mask's too) that do not broadcast: NumPy refuses the key,
        with pytest.raises(mc.IndexRangeError, match="do not broadcast together"):
            t(x)[key]  # and so does minicavs, saying why
        return
    out = t(x)[key]
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out.numpy(), expected)
    weights = np.arange(1.0, expected.size + 1).reshape(expected.shape)
    xt = t(x, requires_grad=True)
    (xt[key] * weights).sum().backward()
    grad = np.zeros_like(x)
    np.add.at(grad, key, weights)  # NumPy's own scatter-add over the same key
    np.testing.assert_array_equal(xt.grad.numpy(), grad)


def test_indexing_examples_and_errors():
    x = np.arange(24.0).reshape(2, 3, 4)
    for key in [(0, slice(None), [1, 2]), (slice(None), [0, 2], [1, 3]), ([[0], [1]], 0),
                (Ellipsis, slice(None, None, -2)), (x > 20,), (None, 1, ..., None),
                (slice(None), np.array([True, False, True]))]:
        np.testing.assert_array_equal(t(x)[key].numpy(), x[key])
    assert t(x)[t(np.array([1, 0]))].shape == (2, 3, 4)  # an integer tensor indexes too
    with pytest.raises(mc.IndexRangeError, match="index 3 is out of range for axis 1 of size 3"):
        t(x)[0, 3]
    with pytest.raises(mc.IndexRangeError, match=r"indexing: index 5 at position \(1,\) is out "
                                                 r"of range for axis 2 with size 4"):
        t(x)[..., [0, 5]]
    with pytest.raises(mc.IndexRangeError, match="too many indices: 4 for a tensor of shape"):
        t(x)[0, 0, 0, 0]
    with pytest.raises(mc.IndexRangeError, match="boolean index of shape"):
        t(x)[np.array([True, False, True])]
    with pytest.raises(mc.DTypeError, match="indices must be integers or booleans"):
        t(x)[np.array([0.5])]


def test_stepped_slices_work_inside_a_vertex_cell():
    def cell(v):
        x = v.pull()
        v.scatter(x[::2] + x[1::2] + v.gather(0))  # every other element: reshapes and slices

    F = mc.VertexFunction(cell, pull_shape=(6,), scatter_shape=(3,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(3)])
    pull = np.arange(18.0).reshape(3, 6)
    out = F(batch, pull=t(pull))
    expected = np.cumsum(pull[:, ::2] + pull[:, 1::2], axis=0)
    np.testing.assert_array_equal(out.numpy(), expected)
