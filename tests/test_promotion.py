"""Type promotion (docs/tensors.md, registry.py): NumPy's rules between arrays, except that an
integer or bool meeting a float takes the float's dtype; Python and NumPy scalars are weak; ops
that need floats compute integers in the default dtype. Every expectation below is written out
by hand from those rules, and checked through real ops (eager, traced and inside a cell)."""

import numpy as np
import pytest

import minicavs as mc
from minicavs import nn


def t(a, dtype=None, requires_grad=False):
    return mc.tensor(np.asarray(a, dtype=dtype), requires_grad=requires_grad)


# (dtype of a, dtype of b, dtype of a + b)
ARRAY_PAIRS = [
    ("float32", "float32", "float32"), ("float32", "float64", "float64"),
    ("float64", "float32", "float64"), ("int32", "int64", "int64"), ("int8", "uint8", "int16"),
    ("int64", "float32", "float32"), ("int32", "float64", "float64"),
    ("uint8", "float32", "float32"), ("bool", "int32", "int32"), ("bool", "float32", "float32"),
    ("bool", "bool", "bool"), ("float16", "float32", "float32"),
]


@pytest.mark.parametrize("a, b, expected", ARRAY_PAIRS)
def test_between_arrays(a, b, expected):
    x, y = t([1, 0], a), t([1, 1], b)
    op = mc.logical_or if expected == "bool" else mc.add
    assert op(x, y).dtype == expected and op(y, x).dtype == expected
    if expected != "bool":
        assert mc.maximum(x, y).dtype == expected and (x * y).dtype == expected
        assert mc.concat([x, y]).dtype == expected and mc.stack([x, y]).dtype == expected
        assert mc.where(np.array([True, False]), x, y).dtype == expected
        expected_values = np.add(np.array([1, 0], a), np.array([1, 1], b)).astype(expected)
        np.testing.assert_array_equal((x + y).numpy(), expected_values)


# (dtype of the tensor, the scalar, dtype of tensor + scalar)
SCALARS = [
    ("float32", 0.5, "float32"), ("float64", 0.5, "float64"), ("float16", 2, "float16"),
    ("int32", 0.5, "float32"), ("int32", 2, "int32"), ("int8", 100, "int8"),
    ("uint8", 3, "uint8"), ("bool", 1, "int64"), ("bool", 0.5, "float32"),
    ("bool", True, "bool"), ("float32", np.float64(0.5), "float32"),
    ("int32", np.int64(2), "int32"), ("float32", True, "float32"),
]


@pytest.mark.parametrize("dtype, scalar, expected", SCALARS)
def test_python_and_numpy_scalars_are_weak(dtype, scalar, expected):
    x = t([1, 0], dtype)
    op = mc.logical_or if expected == "bool" else mc.add
    assert op(x, scalar).dtype == expected and op(scalar, x).dtype == expected


def test_the_issue_cases():
    x = t([1, 2], "int32")
    out = x + 0.5
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.numpy(), [1.5, 2.5])
    assert mc.mean(x).item() == 1.5 and mc.mean(x).dtype == np.float32
    mask = np.array([True, False])
    where = mc.where(mask, 4, 2)
    assert where.dtype == np.int64 and where.tolist() == [4, 2]
    assert mc.where(mask, 4.0, 2).dtype == np.float32
    data = mc.tensor(np.random.randn(3))  # float64
    weights = mc.Parameter(nn.init.normal((3,)))  # float32
    assert (data + weights).dtype == np.float64
    assert (data * 2).dtype == np.float64


def test_scalars_alone_and_integer_overflow():
    assert mc.add(1, 2).dtype == np.int64 and mc.add(1.0, 2).dtype == np.float32
    assert mc.where(np.array(True), True, False).dtype == np.bool_
    with pytest.raises(mc.DTypeError, match=r"op 'add': argument 1 is the integer 300, out of "
                                            r"range for the other operands' dtype int8"):
        t([1], "int8") + 300
    with pytest.raises(mc.DTypeError, match="out of range for .* uint8"):
        t([1], "uint8") + (-1)


@pytest.mark.parametrize("fn, name", [
    (mc.exp, "exp"), (mc.log, "log"), (mc.tanh, "tanh"), (mc.sigmoid, "sigmoid"),
    (mc.sqrt, "sqrt"), (mc.sin, "sin"), (lambda x: x / 2, "div"), (mc.softmax, "softmax"),
    (lambda x: mc.logsumexp(x), "logsumexp"), (lambda x: mc.var(x), "var"),
    (lambda x: x ** 0.5, "pow")])
def test_ops_that_need_floats_compute_integers_in_the_default_dtype(fn, name):
    ints = np.array([1, 2, 4])
    out = fn(t(ints))
    assert out.dtype == np.float32, name
    mc.set_default_dtype("float64")
    try:
        assert fn(t(ints)).dtype == np.float64, name
    finally:
        mc.set_default_dtype("float32")


def test_integer_reductions_widen_and_divisions_are_true_divisions():
    small = t([100, 100, 100], "int8")
    assert mc.sum(small).dtype == np.int64 and mc.sum(small).item() == 300
    assert mc.sum(t([True, True, False])).item() == 2
    assert (t([3], "int32") / t([2], "int32")).tolist() == [1.5]


def test_the_gradient_of_a_promoted_operand_comes_back_in_its_own_dtype():
    a = t([1.0, 2.0], "float32", requires_grad=True)
    b = t([3.0, 4.0], "float64", requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float64
    np.testing.assert_array_equal(a.grad.numpy(), [3.0, 4.0])


def test_promotion_is_recorded_in_traced_graphs_as_an_explicit_cast():
    graph = mc.trace(lambda x, y: x + y, mc.spec((3,), "float32"), mc.spec((3,), "float64"))
    assert [n.op.name for n in graph.op_nodes()] == ["astype", "add"]
    assert graph.outputs[0].dtype == np.float64
    static = mc.symbolic(lambda x: x * 2 + 0.5, mc.spec((2,), "int32"))
    assert static(np.array([1, 2], np.int32)).tolist() == [2.5, 4.5]


# --- vertex functions take their dtype from their parameters and pull ------------------------

def _chain_cell(W, U):
    def cell(v):
        v.scatter(mc.tanh(v.pull() @ W + v.gather(0) @ U))
    return cell


def test_a_vertex_function_takes_float64_from_its_parameters():
    W = mc.Parameter(np.random.randn(3, 4))  # float64, as the user's data
    U = mc.Parameter(np.random.randn(4, 4))
    F = mc.VertexFunction(_chain_cell(W, U), pull_shape=(3,), scatter_shape=(4,), arity=1)
    assert F.dtype == np.float64 and F.pull_dtype == np.float64
    batch = mc.GraphBatch([mc.InputGraph.chain(3)])
    out = F(batch, pull=mc.tensor(np.random.randn(3, 3)))
    assert out.dtype == np.float64
    out.sum().backward()
    assert W.grad.dtype == np.float64


def test_a_vertex_function_of_float32_parameters_stays_float32():
    W = mc.Parameter(np.random.randn(3, 4).astype(np.float32))
    U = mc.Parameter(np.random.randn(4, 4).astype(np.float32))
    F = mc.VertexFunction(_chain_cell(W, U), pull_shape=(3,), scatter_shape=(4,), arity=1)
    assert F.dtype == np.float32


def test_a_dtype_mismatch_names_the_vertex_function_and_its_dtype_argument():
    W = mc.Parameter(np.random.randn(3, 4))  # float64
    U = mc.Parameter(np.random.randn(4, 4))
    with pytest.raises(mc.DTypeError, match=r"vertex function 'cell': v.scatter\(x\): x has "
                                            r"dtype float64, but the vertex function's states "
                                            r"and outputs are float32 \(given as "
                                            r"dtype='float32'\); pass VertexFunction\(..., "
                                            r"dtype='float64'\)") as info:
        mc.VertexFunction(_chain_cell(W, U), pull_shape=(3,), scatter_shape=(4,), arity=1,
                          dtype="float32")
    assert "test_promotion.py" in str(info.value)  # and it points at the user's line
    F = mc.VertexFunction(_chain_cell(W, U), pull_shape=(3,), scatter_shape=(4,), arity=1)
    batch = mc.GraphBatch([mc.InputGraph.chain(2)])
    with pytest.raises(mc.DTypeError, match=r"pull has dtype float32, expected float64; declare "
                                            r"VertexFunction\(..., pull_dtype='float32'\)"):
        F(batch, pull=mc.tensor(np.zeros((2, 3), np.float32)))
