"""The rules the passes ask of an op are declared with the op (minicavs/ops/), and a rule an
op lacks is an error or a documented safe default, never a silent guess.

These tests check that every registered primitive declares what the passes need, that a
throwaway op without a rule fails clearly (or falls back to the documented default), that the
zero-row rules now on the ops give what the old table in vertex/zero_rows.py gave, and that a
task's symbolic sizes print as ``V`` and ``E``.
"""

import itertools

import numpy as np
import pytest

import minicavs as mc
from minicavs.runtime.analysis import merge_common_subexpressions
from minicavs.runtime.executor import OpStep
from minicavs.ops import OPS, registry
from minicavs.ops.batching import EDGES, VERTICES, dim_text, row_domain
from minicavs.ops.elementwise import SIGMOID, elementwise
from minicavs.ops.formula import c_expr, writer
from minicavs.ops.registry import Aval, Op, describe
from minicavs.ops.rows import EMPTY, FULL, hull, index_rows, intersect
from minicavs.runtime.zero_rows import node_range

ELEMENTWISE = {name for name, op in OPS.items() if op.is_elementwise}


def _throwaway(**rules):
    """An unregistered unary op that doubles its argument, with only the given rules."""
    return Op("throwaway", lambda xp, x: 2 * x, lambda x: Aval(tuple(x.shape), x.dtype),
              **rules)


# --- every primitive declares what the passes ask ------------------------------------------------

def test_every_op_usable_in_a_cell_has_a_batching_rule():
    # Those appear only in ∂F, which is derived from the batched F: no rule needed; and
    # scatter_reduce_rows, whose targets are positions in one whole array (ops/scatter.py).
    assert {name for name, op in OPS.items() if op.batch is None} == {
        "scatter_add_rows", "softmax_cross_entropy_grad", "lstm_cell_grad",
        "conv_windows_input_grad", "conv_windows_weight_grad", "scatter_reduce_rows"}


def test_elementwise_ops_have_a_c_expression_and_a_numpy_writer():
    assert len(ELEMENTWISE) == 38
    for name in ELEMENTWISE:
        op = OPS[name]
        assert callable(op.into), name
        assert op.in_place == (name != "where"), name  # where copies b, then a over it


def test_the_other_rules_are_where_the_passes_expect_them():
    def having(field):
        return {name for name, op in OPS.items() if getattr(op, field)}

    # (not maximum and minimum: of two equal zeros they return the second, as NumPy does)
    assert having("commutative") == {"add", "mul", "bitwise_and", "bitwise_or", "bitwise_xor"}
    assert having("associative") == {"add", "mul"}  # regrouping needs both
    assert having("quiet_overflow") == {"sigmoid"}
    assert having("join") == {"pad_axis"}
    assert having("keeps_rows") == {"reshape"}
    assert having("assembles_in_place") == {"concat"}
    assert having("on_nonzero_rows") == {"matmul", "sum"}
    assert {n: op.row_index_arg for n, op in OPS.items() if op.row_index_arg is not None} == {
        "take_rows": 1, "scatter_add_rows": 1}
    assert having("zero_rows") == {"neg", "tanh", "relu", "astype", "slice_axis", "pad_axis",
                                   "reshape", "transpose", "sum", "max", "min", "broadcast_to",
                                   "mul", "add", "sub", "concat", "matmul", "expm1", "log1p",
                                   "sin", "erf", "floor", "ceil", "rint", "cumsum", "trunc",
                                   "cumprod", "bitwise_and", "bitwise_or", "bitwise_xor"}
    # promotion: which operands each op brings to one dtype (registry.py, "Type promotion")
    assert OPS["where"].promotes == (1, 2) and OPS["concat"].promotes == "all"
    assert OPS["take_rows"].promotes == () and OPS["astype"].promotes == ()
    assert {n for n, op in OPS.items() if op.promotes_to_float} >= {
        "div", "exp", "log", "tanh", "sigmoid", "softmax", "log_softmax", "sin", "erf"}
    # (linear, lstm_cell, softmax_cross_entropy: a batch's rows of its slab written in place,
    # no copy; the last two by their CUDA kernels, cuda/kernels.py; lstm_cell_grad: a '+'
    # signature's block of rows, autobatch/segment.py, by the native kernel)
    assert {name for name, op in OPS.items() if op.into} == ELEMENTWISE | {
        "matmul", "linear", "lstm_cell", "softmax_cross_entropy", "lstm_cell_grad"}


# --- a missing rule is a clear error, or the documented default ----------------------------------

def test_an_op_without_a_batching_rule_cannot_be_used_in_a_cell():
    op = _throwaway()

    def cell(v):
        v.scatter(registry.apply(op, v.pull()))

    with pytest.raises(mc.GraphError, match="op 'throwaway' has no batching rule, so it cannot "
                                            "be used inside a vertex function") as info:
        mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(3,))
    assert "test_op_rules.py" in str(info.value)  # and it points at the user's line


def test_an_op_without_a_writer_is_computed_and_copied():
    graph = mc.trace(lambda x: registry.apply(_throwaway(), x), mc.spec((2, 3), "float64"))
    x, out = np.arange(6.0).reshape(2, 3), np.empty((2, 3))
    env = {graph.inputs[0].key: x}
    OpStep(graph.outputs[0]).run(np, env, outs={graph.outputs[0].key: out})
    assert env[graph.outputs[0].key] is out
    np.testing.assert_array_equal(out, 2 * x)


def test_an_op_without_a_zero_row_rule_has_no_zero_rows():
    graph = mc.trace(lambda x: registry.apply(_throwaway(), x), mc.spec((VERTICES, 3)))
    assert node_range(graph.outputs[0], [EMPTY]) == FULL
    keeps = mc.trace(lambda x: -x, mc.spec((VERTICES, 3)))  # neg keeps zero rows zero
    assert node_range(keeps.outputs[0], [EMPTY]) == EMPTY


def test_rules_that_cannot_work_are_refused_when_the_op_is_defined():
    with pytest.raises(ValueError, match="op 'throwaway': in_place needs a writer"):
        _throwaway(in_place=True)
    with pytest.raises(ValueError, match="elementwise op 'half' needs a NumPy writer"):
        elementwise("half", forward=lambda xp, x: x / 2, vjp=None, c="({0} / 2)")
    assert "half" not in OPS
    with pytest.raises(ValueError, match="not a chain"):
        writer(lambda xp, x: xp.exp(x) * xp.tanh(x))
    with pytest.raises(ValueError, match="read each of its 1 operand"):
        writer(lambda xp, x: x * (1 - x))  # in place, the second read would see the first write


def test_cse_merges_the_arguments_of_commutative_ops_in_either_order():
    def count(commutative):
        op = Op("pair", lambda xp, a, b: a - b, lambda a, b: Aval(tuple(a.shape), a.dtype),
                commutative=commutative)
        graph = mc.trace(lambda a, b: (registry.apply(op, a, b), registry.apply(op, b, a)),
                         mc.spec((3,)), mc.spec((3,)))
        return len(merge_common_subexpressions(graph).op_nodes())

    assert count(commutative=True) == 1
    assert count(commutative=False) == 2


def test_slice_gradients_are_joined_by_pad_axis_rule():
    graph = mc.trace(lambda x: [p * float(k + 1) for k, p in enumerate(mc.split(x, 3))],
                     mc.spec((2, 6), "float64"))
    names = [n.op.name for n in mc.grad_graph(graph).op_nodes()]
    assert names.count("concat") == 1 and "pad_axis" not in names and "add" not in names


# --- sigmoid is written once ----------------------------------------------------------------------

def test_sigmoid_forward_c_expression_and_writer_come_from_one_formula():
    assert SIGMOID.c_expr == "(1 / (1 + exp(-{0})))"
    assert c_expr(lambda xp, x: xp.tanh(-(-x)) * 0.5) == "(tanh(-(-{0})) * ({T})0.5)"
    x = np.array([-1000.0, -20.0, -1.5, 0.0, 2.0, 1000.0], dtype=np.float32)
    want = SIGMOID.forward(np, x)
    out = np.empty_like(x)
    with np.errstate(over="ignore"):
        SIGMOID.into(x, out)
    np.testing.assert_array_equal(out, want)
    with np.errstate(over="ignore"):
        SIGMOID.into(x, x)  # in place
    np.testing.assert_array_equal(x, want)


# --- zero rows: the rules on the ops give what the old name table gave ----------------------------

_OLD_KEEPS = {"neg", "tanh", "relu", "astype", "slice_axis", "pad_axis", "reshape", "transpose",
              "sum", "max", "broadcast_to"}


def _old_node_range(node, args):
    """vertex/zero_rows.py's node_range before the rules moved onto the ops (by op name)."""
    if row_domain(node.shape) is None:
        return None
    name = node.op.name
    rows = [r for r in args if r is not None]
    if not rows:
        return FULL
    if name in _OLD_KEEPS:
        if name in ("sum", "max") and 0 in node.attrs["axes"]:
            return FULL
        if name == "transpose" and node.attrs["axes"][0] != 0:
            return FULL
        return args[0] if args[0] is not None else FULL
    if name == "mul":
        out = FULL
        for r in rows:
            out = intersect(out, r)
        return out
    if name in ("add", "sub", "concat"):
        if len(rows) < len(args):
            return FULL
        out = EMPTY
        for r in rows:
            out = hull(out, r)
        return out
    if name == "matmul" and args[0] is not None and args[1] is None:
        return args[0]
    return FULL


def _many_ops(a, b, w, bias, m):
    """a, b: per-row (V, 4); w (4, 3), bias (4,): shared; m: per-row (V, 2, 3)."""
    return [-a, mc.tanh(a), mc.relu(a), a.astype("float64"), mc.slice_axis(a, 1, 3),
            mc.pad_axis(a, 1, 2), mc.reshape(a, (VERTICES, 2, 2)), mc.transpose(m, (0, 2, 1)),
            mc.transpose(a), mc.sum(a, axis=1), mc.sum(a, axis=0), mc.max(m, axis=(1, 2)),
            mc.broadcast_to(bias, (VERTICES, 4)), mc.broadcast_to(mc.reshape(a, (VERTICES, 1, 4)),
                                                                 (VERTICES, 3, 4)),
            a * b, a * bias, bias * a * b, a + b, a + bias, a - b, bias - a,
            mc.concat([a, b]), mc.concat([a, mc.broadcast_to(bias, (VERTICES, 4))]),
            a @ w, mc.transpose(a) @ b, a / b, mc.exp(a), mc.sigmoid(a), mc.log(a),
            mc.maximum(a, b), mc.where(a > 0, a, b), a ** 2.0]


def test_zero_row_rules_equal_the_old_table():
    graph = mc.trace(_many_ops, mc.spec((VERTICES, 4)), mc.spec((VERTICES, 4)), mc.spec((4, 3)),
                     mc.spec((4,)), mc.spec((VERTICES, 2, 3)))
    samples = [EMPTY, FULL, (2, 5), (0, 3), (4, 9)]
    checked = set()
    for node in graph.op_nodes():
        per_row = [i for i, x in enumerate(node.inputs) if row_domain(x.shape)]
        for choice in itertools.product(samples, repeat=len(per_row)):
            args = [None] * len(node.inputs)
            for i, r in zip(per_row, choice):
                args[i] = r
            assert node_range(node, args) == _old_node_range(node, args), (node, args)
        checked.add(node.op.name)
    assert checked >= _OLD_KEEPS | {"mul", "add", "sub", "concat", "matmul", "div", "exp"}


# --- the symbolic sizes print by name -------------------------------------------------------------

def test_describe_names_the_symbolic_sizes():
    assert describe((VERTICES, 4)) == "(V, 4)"
    assert describe((2 * VERTICES,)) == "(2V,)"
    assert describe((EDGES, 3, 1)) == "(E, 3, 1)"
    assert describe((3 * EDGES,)) == "(3E,)"
    assert describe((5,)) == "(5,)" and describe(()) == "()" and describe((2, 0)) == "(2, 0)"
    assert dim_text(7) == "7" and dim_text(VERTICES) == "V"


def test_errors_on_batched_shapes_say_v():
    with pytest.raises(mc.ShapeError, match=r"argument 0 has shape \(V, 4\) and argument 1 has "
                                            r"shape \(3,\)"):
        mc.trace(lambda x, y: x + y, mc.spec((VERTICES, 4)), mc.spec((3,)))


def test_errors_inside_a_cell_speak_in_per_vertex_shapes():
    def cell(v):
        v.scatter(mc.reshape(v.pull(), (4, 2)))  # pull is (6,)

    with pytest.raises(mc.ShapeError, match=r"argument 0 has shape \(6,\) \(6 elements\), which "
                                            r"cannot be reshaped to \(4, 2\)") as info:
        mc.VertexFunction(cell, pull_shape=(6,), scatter_shape=(8,))
    assert "V" not in str(info.value).split("\n")[0]


@pytest.mark.parametrize("idx, rows", [([], EMPTY), ([-1, -1], EMPTY), ([3], (0, 1)),
                                       ([-1, 4, -1, 0, -1], (1, 4)), ([2, -1, -1, 7], (0, 4)),
                                       ([[-1, 5], [1, -1]], (1, 3))])
def test_index_rows_is_the_hull_of_the_rows_with_an_index(idx, rows):
    for dtype in (np.int32, np.int64):
        assert index_rows(np.array(idx, dtype).reshape(np.shape(idx))) == rows


@pytest.mark.gpu
def test_index_rows_on_a_gpu_equals_numpy():
    mc.set_device("cuda")
    import cupy

    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 1000):
        idx = np.where(rng.random(n) < 0.7, -1, rng.integers(0, 9, n))
        assert index_rows(cupy.asarray(idx)) == index_rows(idx)
