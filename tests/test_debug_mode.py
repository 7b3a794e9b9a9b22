"""Debug mode: the first NaN or infinity of eager code, of F or of ∂F is reported with the op,
the user's line and, in a vertex function, the level, sample and vertex; off, nothing is
checked."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import minicavs as mc

H = 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own "invalid value" notes
        yield


def _log_cell():
    W = mc.Parameter(np.eye(H) * 0.5, name="W")

    def cell(v):
        s = v.gather(0) + v.gather(1)
        v.scatter(mc.log(v.pull() + s @ W))  # NaN where the argument is negative
    return mc.VertexFunction(cell, scatter_shape=(H,), pull_shape=(H,), arity=2,
                             dtype="float64")


def test_f_reports_op_line_level_sample_and_vertex():
    F = _log_cell()
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph([[], [], [0, 1]])])
    X = np.ones((batch.num_vertices, H))
    X[4, 1] = -5.0  # sample 1, vertex 1: a leaf
    with mc.debug(), pytest.raises(mc.NonFiniteError) as info:
        F(batch, pull=mc.tensor(X))
    message = str(info.value)
    assert message.startswith("debug mode: op 'log' in vertex function 'cell' produced a "
                              "non-finite value (level 0, sample 1, vertex 1): 1 NaN, 0 inf of 9")
    assert "test_debug_mode.py" in message and "v.scatter(mc.log(v.pull() + s @ W))" in message
    out = F(batch, pull=mc.tensor(X))  # debug mode off: no check, the NaN goes through
    assert np.isnan(out.numpy()).any()


def test_df_reports_the_line_of_the_op_whose_derivative_failed():
    def cell(v):
        v.scatter((v.pull() + v.gather(0)) ** 0.5)  # d/dx at 0 is infinite
    F = mc.VertexFunction(cell, scatter_shape=(H,), pull_shape=(H,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(2), mc.InputGraph.chain(3)])
    X = np.ones((batch.num_vertices, H))
    X[2, 2] = 0.0  # sample 1, vertex 0, a leaf: sqrt(0) is finite, its derivative is not
    pull = mc.tensor(X, requires_grad=True)
    with mc.debug():
        out = F(batch, pull=pull)
        with pytest.raises(mc.NonFiniteError) as info:
            out.sum().backward()
    message = str(info.value)
    assert "in ∂F (the backward) of vertex function 'cell' produced a non-finite value " \
           "(level 0, sample 1, vertex 0)" in message
    assert "v.scatter((v.pull() + v.gather(0)) ** 0.5)" in message


def test_a_non_finite_pulled_input_is_reported_before_f_runs():
    F = _log_cell()
    batch = mc.GraphBatch([mc.InputGraph.chain(2), mc.InputGraph.chain(3)])
    X = np.ones((batch.num_vertices, H))
    X[3, 0] = np.inf
    with mc.debug(), pytest.raises(mc.NonFiniteError,
                                   match=r"the pulled input in vertex function 'cell' holds a "
                                         r"non-finite value \(sample 1, vertex 1\): 0 NaN, 1 inf"):
        F(batch, pull=mc.tensor(X))


def test_eager_ops_and_their_gradients():
    with mc.debug():
        x = mc.tensor(np.array([1.0, -1.0]), requires_grad=True)
        with pytest.raises(mc.NonFiniteError) as info:
            mc.log(x)
        assert str(info.value).startswith(
            "debug mode: op 'log' produced a non-finite value (1 NaN, 0 inf of 2; first at "
            "index (1,)); its arguments were all finite")
        assert "mc.log(x)" in str(info.value)

        y = mc.sum(mc.tensor(np.array([4.0, 0.0]), requires_grad=True) ** 0.5)
        with pytest.raises(mc.NonFiniteError, match=r"op 'pow' during backward\(\), in the "
                                                    r"gradient of op 'pow' recorded at .*"
                                                    r"test_debug_mode.py:\d+ produced"):
            y.backward()

        bad = mc.tensor(np.array([np.nan, 1.0]))
        with pytest.raises(mc.NonFiniteError, match=r"argument\(s\) \[0\] already held NaN"):
            mc.exp(bad)


def test_static_functions_are_checked_per_instruction():
    f = mc.symbolic(lambda x: mc.log(x) * 2.0, ((2,), "float64"))
    with mc.debug(), pytest.raises(mc.NonFiniteError, match="op 'log' in static function"):
        f(mc.tensor(np.array([1.0, -1.0])))



def test_an_autobatched_batch_is_named_as_such():
    """A non-finite value made by a batch of mc.autobatch names the block's batch and the
    user's line, forward and backward (it was "in static function None")."""
    W = mc.Parameter(np.eye(2))
    with mc.debug(), pytest.raises(mc.NonFiniteError,
                                   match=r"op 'log' in an mc.autobatch batch of op 'log' produced"
                                         r"(.|\n)*test_debug_mode.py"):
        with mc.autobatch():
            mc.add_n([mc.sum(mc.log(mc.tensor(np.array([[1.0, v]])) @ W))
                      for v in (1.0, -1.0)]).item()
    with mc.debug(), pytest.raises(mc.NonFiniteError, match="in the backward of an mc.autobatch "
                                                            "batch of op"):
        with mc.autobatch():
            mc.add_n([mc.sum(mc.sqrt(mc.tensor(np.array([[1.0, v]])) @ W))
                      for v in (1.0, 0.0)]).backward()

def test_the_environment_variable_switches_it_on():
    code = ("import numpy as np, minicavs as mc\n"
            "assert mc.is_debug_enabled()\n"
            "try:\n    mc.log(mc.tensor(np.array([-1.0])))\n"
            "except mc.NonFiniteError as e:\n    print('caught', str(e).splitlines()[0])\n")
    env = dict(os.environ, PYTHONPATH=ROOT, MINICAVS_DEBUG="1")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "caught debug mode: op 'log' produced a non-finite value" in done.stdout


def test_set_debug_and_nesting():
    assert not mc.is_debug_enabled()
    mc.set_debug(True)
    try:
        with mc.debug(False):
            assert np.isnan(mc.log(mc.tensor([-1.0])).item())
        assert mc.is_debug_enabled()
    finally:
        mc.set_debug(False)
