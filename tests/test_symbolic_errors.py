"""Mistakes made while tracing are explained: which op, which line of the user's code, and what
to do instead."""

import inspect
import os

import numpy as np
import pytest

import minicavs as mc

HERE = os.path.abspath(__file__)


def line_of(fn, text):
    """The file line number of the line of ``fn`` containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_shape_mismatch_names_the_op_and_the_user_line():
    def f(x, y):
        z = mc.tanh(x)
        return z + y  # the bad line

    with pytest.raises(mc.ShapeError) as info:
        mc.trace(f, mc.spec((2, 3), "float64"), mc.spec((4,), "float64"))
    message = str(info.value)
    assert "op 'add'" in message
    assert "(2, 3)" in message and "(4,)" in message
    assert f"{HERE}:{line_of(f, 'the bad line')}" in message
    assert "return z + y" in message  # the code itself is quoted


def test_matmul_mismatch_inside_a_helper_points_at_the_users_line():
    W = mc.Parameter(np.ones((5, 2)))

    def f(x):
        return mc.linear(x, W)  # linear is minicavs code: the line shown is this one

    with pytest.raises(mc.ShapeError) as info:
        mc.trace(f, mc.spec((2, 3), "float32"))
    assert "op 'matmul'" in str(info.value)
    assert f"{HERE}:{line_of(f, 'mc.linear(x, W)')}" in str(info.value)


def test_capturing_a_numpy_global_is_explained():
    table = np.ones((3, 3))

    def f(x):
        return mc.matmul(x, table)

    with pytest.raises(mc.GraphError) as info:
        mc.trace(f, mc.spec((2, 3), "float64"))
    message = str(info.value)
    assert "op 'matmul'" in message and "ndarray" in message
    assert "mc.Parameter" in message and "mc.tensor" in message
    assert f"{HERE}:{line_of(f, 'mc.matmul(x, table)')}" in message
    # Wrapped as the message says, it is captured as a parameter of the graph.
    wrapped = mc.tensor(table)
    graph = mc.trace(lambda x: mc.matmul(x, wrapped), mc.spec((2, 3), "float64"))
    assert graph.captured == [wrapped]


def test_python_if_on_a_symbol_is_explained():
    def f(x):
        if mc.sum(x) > 0:  # data-dependent Python control flow
            return x
        return -x

    with pytest.raises(mc.GraphError) as info:
        mc.trace(f, mc.spec((3,), "float64"))
    message = str(info.value)
    assert "Python control flow" in message and "mc.where" in message
    assert f"{HERE}:{line_of(f, 'data-dependent')}" in message


def test_symbols_do_not_escape_their_trace():
    leaked = []

    def f(x):
        leaked.append(x)
        return mc.tanh(x)

    mc.trace(f, mc.spec((2,), "float64"))
    with pytest.raises(mc.GraphError, match="outside of tracing"):
        mc.tanh(leaked[0])

    def g(y):
        return y + leaked[0]

    with pytest.raises(mc.GraphError, match="another"):
        mc.trace(g, mc.spec((2,), "float64"))


def test_executor_reports_a_wrong_number_of_inputs():
    from graph_executor import GraphExecutor

    graph = mc.trace(lambda x, y: x * y, (2,), (2,))
    with pytest.raises(mc.GraphError, match="takes 2 inputs, got 1"):
        GraphExecutor(graph).run(np.ones(2, np.float32))
