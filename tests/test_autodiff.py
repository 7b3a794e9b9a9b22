"""Eager autodiff: higher derivatives, long chains, no_grad, accumulation, the second-backward
rule, dtype rules, error messages, gradcheck's own failure reports, and the backend switches."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs import backend
from minicavs.ops.registry import Aval, Op, apply
from minicavs.testing import float_arrays, shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def t(a, requires_grad=False):
    return mc.tensor(a, requires_grad=requires_grad)


def gradient(f, x):
    """df/dx as a Tensor that can itself be differentiated (works with and without grad mode)."""
    with mc.enable_grad():
        leaf = x if x.requires_grad else mc.tensor(x.data, requires_grad=True)
        f(leaf).sum().backward(create_graph=True)
        g, leaf.grad = leaf.grad, None  # hand the gradient out; leave .grad as it was
    return g


# --- higher derivatives -----------------------------------------------------------------------

@given(x=float_arrays(shapes(max_dims=2, min_side=1), bound=3.0))
def test_second_derivative_of_tanh(x):
    xt = t(x, requires_grad=True)
    g = gradient(mc.tanh, xt)
    np.testing.assert_allclose(g.numpy(), 1 - np.tanh(x) ** 2, rtol=1e-12)
    g.sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), -2 * np.tanh(x) * (1 - np.tanh(x) ** 2),
                               rtol=1e-10, atol=1e-14)


def test_second_and_third_derivative_of_cube():
    x = t(np.array([-1.5, 0.0, 2.0]), requires_grad=True)
    d1 = gradient(lambda x: x ** 3, x)
    d2 = gradient(lambda x: gradient(lambda x: x ** 3, x), x)
    d3 = gradient(lambda x: gradient(lambda x: gradient(lambda x: x ** 3, x), x), x)
    np.testing.assert_allclose(d1.numpy(), 3 * x.numpy() ** 2)
    np.testing.assert_allclose(d2.numpy(), 6 * x.numpy())
    np.testing.assert_allclose(d3.numpy(), [6.0, 6.0, 6.0])


@given(data=st.data())
def test_gradcheck_of_gradient_functions(data):
    x = data.draw(float_arrays(data.draw(shapes(max_dims=2, max_side=3)), bound=2.0))
    w = np.linspace(-1, 1, x.size).reshape(x.shape) if x.size else np.zeros(x.shape)
    assert mc.gradcheck(lambda x: gradient(lambda x: mc.tanh(x) * w, x), [x])
    assert mc.gradcheck(lambda x: gradient(lambda x: mc.sigmoid(x) * mc.exp(x * 0.5), x), [x])
    logits = data.draw(float_arrays((2, 3)))
    labels = np.array([0, 2])
    assert mc.gradcheck(lambda z: gradient(lambda z: mc.softmax_cross_entropy(z, labels), z),
                        [logits])


def test_create_graph_gives_differentiable_gradients_and_plain_backward_does_not():
    x = t(np.array([0.5, -0.25]), requires_grad=True)
    mc.tanh(x).sum().backward()
    assert x.grad.is_leaf and not x.grad.requires_grad
    x.grad = None
    mc.tanh(x).sum().backward(create_graph=True)
    assert x.grad.requires_grad and not x.grad.is_leaf


# --- the tape ---------------------------------------------------------------------------------

def test_a_chain_of_100000_ops_backpropagates_without_recursion():
    x = t(np.array([1.0, 2.0]), requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y + 0.5
    y.sum().backward()
    np.testing.assert_array_equal(y.numpy(), [50_001.0, 50_002.0])
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_no_grad_records_nothing_and_restores_the_mode():
    x = t(np.ones(3), requires_grad=True)
    with mc.no_grad():
        assert not mc.is_grad_enabled()
        y = mc.tanh(x) * 2
        with mc.enable_grad():
            z = mc.tanh(x)
        assert not mc.is_grad_enabled()
    assert mc.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    assert z.requires_grad
    with pytest.raises(mc.MinicavsError, match="does not require grad"):
        y.sum().backward()
    with pytest.raises(RuntimeError), mc.no_grad():
        raise RuntimeError("leave the block by an exception")
    assert mc.is_grad_enabled()


def test_gradients_accumulate_across_backward_calls():
    x = t(np.array([1.0, -2.0]), requires_grad=True)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0 + 3.0, -4.0 + 3.0])
    x.zero_grad()
    assert x.grad is None


def test_second_backward_through_a_graph_needs_retain_graph():
    x = t(np.array([1.0, 2.0]), requires_grad=True)
    y = (mc.tanh(x) * 2).sum()
    y.backward()
    with pytest.raises(mc.MinicavsError, match="second time.*retain_graph=True"):
        y.backward()

    x.zero_grad()
    y = (mc.tanh(x) * 2).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()  # allowed, and adds up
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)


def test_backward_of_a_leaf_and_of_a_shared_input():
    x = t(np.array(3.0), requires_grad=True)
    x.backward()
    assert x.grad.item() == 1.0
    y = t(np.array([2.0]), requires_grad=True)
    (y * y * y + y).sum().backward()  # the same leaf reaches the sum along several paths
    np.testing.assert_allclose(y.grad.numpy(), [3 * 4.0 + 1])


def test_backward_with_an_explicit_gradient():
    x = t(np.array([1.0, 2.0]), requires_grad=True)
    (x * 3.0).backward(np.array([1.0, 10.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 30.0])


def test_cast_to_an_integer_ends_the_gradient():
    x = t(np.array([1.7, -2.3]), requires_grad=True)
    y = x.astype("int64")
    assert not y.requires_grad
    z = y.astype("float64") * x  # only the second factor carries a gradient
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, -2.0])


def test_multi_output_records_pass_none_for_unused_outputs():
    seen = []

    def vjp(grads, outs, x):
        seen.append([g is None for g in grads])
        total = 0
        for g, k in zip(grads, (2.0, 3.0)):
            if g is not None:
                total = total + g * k
        return (total,)

    pair = Op("test_pair", lambda xp, x: (x * 2, x * 3),
              lambda x: (Aval(x.shape, x.dtype), Aval(x.shape, x.dtype)), vjp,
              multi_output=True)  # not registered: it exists only in this test
    x = t(np.array([1.0, 2.0]), requires_grad=True)
    double, triple = apply(pair, x)
    triple.sum().backward()
    assert seen == [[True, False]]
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    x.zero_grad()
    double, triple = apply(pair, x)
    (double + triple).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 5.0])


# --- dtypes -----------------------------------------------------------------------------------

def test_tensor_dtype_rules():
    assert t(np.zeros(2, np.float64)).dtype == np.float64
    assert t(np.zeros(2, np.float32)).dtype == np.float32
    assert t(np.zeros(2, np.int32)).dtype == np.int32
    assert t([1.0, 2.0]).dtype == np.float32
    assert t([1, 2]).dtype == np.float32
    assert t(3.0).dtype == np.float32
    assert t([1, 2], requires_grad=False).shape == (2,)
    assert mc.tensor([1, 2], dtype="int64").dtype == np.int64
    assert mc.Parameter([1.0]).dtype == np.float32
    assert mc.Parameter(np.zeros(2)).dtype == np.float64 and mc.Parameter([0.0]).requires_grad


def test_python_scalars_never_change_a_tensors_dtype():
    x32, x64 = t(np.ones(2, np.float32)), t(np.ones(2))
    for result in (x32 * 2.5, 2.5 * x32, x32 + 1, x32 - np.float64(1.0), 1.0 / x32, x32 ** 2,
                   mc.maximum(x32, 0.0), mc.where(x32 > 0, x32, 0.0)):
        assert result.dtype == np.float32
    assert (x64 * 2.5).dtype == np.float64 and (2 + x64).dtype == np.float64
    assert (t(np.array([1, 2])) + 1).dtype == np.int64


@pytest.mark.parametrize("op_name, call", [
    ("add", lambda a, b: a + b), ("mul", lambda a, b: a * b), ("matmul", lambda a, b: a @ b),
    ("concat", lambda a, b: mc.concat([a, b])), ("maximum", mc.maximum)])
def test_mixing_float32_and_float64_promotes_to_float64(op_name, call):
    a, b = t(np.ones(2, np.float32), requires_grad=True), t(np.ones(2, np.float64))
    out = call(a, b)
    assert out.dtype == np.float64  # NumPy's rule (tests/test_promotion.py has the table)
    assert call(a, np.ones(2)).dtype == np.float64
    out.sum().backward()
    assert a.grad.dtype == np.float32  # the cast's gradient goes back in a's own dtype


def test_only_float_tensors_require_grad():
    with pytest.raises(mc.DTypeError, match="only float tensors can require gradients, got "
                                            "dtype int64"):
        t(np.array([1, 2]), requires_grad=True)
    assert mc.tanh(t(np.array([1, 2]))).dtype == mc.default_dtype()  # ints become floats


# --- error messages ---------------------------------------------------------------------------

@pytest.mark.parametrize("call, pattern", [
    (lambda: mc.add(t(np.zeros((2, 3))), t(np.zeros(4))),
     r"op 'add': argument 0 has shape \(2, 3\) and argument 1 has shape \(4,\), which do not "
     r"broadcast together"),
    (lambda: mc.where(np.ones(3, bool), t(np.zeros(3)), t(np.zeros((2, 2)))),
     r"op 'where': argument 0 has shape \(3,\) and argument 2 has shape \(2, 2\)"),
    (lambda: mc.matmul(t(np.zeros((2, 3))), t(np.zeros((4, 5)))),
     r"op 'matmul': argument 0 has shape \(2, 3\) and argument 1 has shape \(4, 5\); the inner "
     r"dimensions 3 and 4 differ"),
    (lambda: mc.matmul(t(np.zeros(3)), t(np.zeros(()))),
     r"op 'matmul': arguments must have at least one dimension, got shapes \(3,\) and \(\)"),
    (lambda: mc.concat([t(np.zeros((2, 3))), t(np.zeros((4, 2)))], axis=1),
     r"op 'concat': argument 0 has shape \(2, 3\) and argument 1 has shape \(4, 2\); all "
     r"dimensions but axis 1 must match"),
    (lambda: mc.reshape(t(np.zeros((2, 3))), (4, 2)),
     r"op 'reshape': argument 0 has shape \(2, 3\) \(6 elements\), which cannot be reshaped to "
     r"\(4, 2\) \(8 elements\)"),
    (lambda: mc.transpose(t(np.zeros((2, 3))), (0, 0)),
     r"op 'transpose': \(0, 0\) is not a permutation of the 2 axes of argument 0 with shape "
     r"\(2, 3\)"),
    (lambda: mc.broadcast_to(t(np.zeros((2, 3))), (3, 3)),
     r"op 'broadcast_to': argument 0 has shape \(2, 3\), which cannot be broadcast to \(3, 3\)"),
    (lambda: mc.slice_axis(t(np.zeros((2, 3))), 1, 5, axis=1),
     r"op 'slice_axis': slice 1:5 is out of range for axis 1 of argument 0 with shape \(2, 3\)"),
    (lambda: mc.sum(t(np.zeros((2, 3))), axis=2),
     r"op 'sum': axis 2 is out of range for argument 0 with 2 dimension\(s\)"),
    (lambda: mc.max(t(np.zeros((2, 0))), axis=1),
     r"op 'max': cannot reduce an empty axis of argument 0 with shape \(2, 0\)"),
    (lambda: mc.take_rows(t(np.zeros((3, 2))), np.array([0, 3])),
     r"op 'take_rows': index 3 at position 1 is out of range for 3 rows"),
    (lambda: mc.take_rows(t(np.zeros((3, 2))), np.array([[0]])),
     r"op 'take_rows': argument 0 must have rows and argument 1 must be a 1-D index, got shapes "
     r"\(3, 2\) and \(1, 1\)"),
    (lambda: mc.take_rows(t(np.zeros((3, 2))), np.array([0.0])),
     r"op 'take_rows': argument 1 must be an integer array of indices, got dtype float64"),
    (lambda: mc.scatter_add_rows(t(np.zeros((3, 2))), np.array([0, 1]), 4),
     r"op 'scatter_add_rows': argument 1 must index the rows of argument 0, got shapes \(3, 2\) "
     r"and \(2,\)"),
    (lambda: mc.scatter_add_rows(t(np.zeros((2, 2))), np.array([0, -2]), 4),
     r"op 'scatter_add_rows': index -2 at position 1 is out of range for 4 rows"),
    (lambda: mc.one_hot(np.array([0, 4]), 3, "float32"),
     r"op 'one_hot': label 4 at position \(1,\) is out of range for 3 classes"),
    (lambda: t(np.zeros((2, 3))).backward(),
     r"backward\(\) on a tensor that does not require grad"),
    (lambda: t(np.zeros((2, 3)), requires_grad=True).backward(),
     r"backward\(\) without a gradient needs a tensor with one element, got shape \(2, 3\)"),
    (lambda: t(np.zeros(2), requires_grad=True).backward(np.zeros(3)),
     r"backward\(\): grad has shape \(3,\)"),
])
def test_error_messages_name_op_arguments_and_shapes(call, pattern):
    with pytest.raises(mc.MinicavsError, match=pattern):
        call()


def test_errors_are_also_builtin_exceptions():
    with pytest.raises(ValueError):
        mc.add(t(np.zeros(2)), t(np.zeros(3)))
    with pytest.raises(TypeError):
        mc.add(t(np.zeros(2, np.int8)), 300)  # a weak scalar that does not fit
    with pytest.raises(IndexError):
        mc.take_rows(t(np.zeros((1, 1))), np.array([1]))


# --- gradcheck can fail -----------------------------------------------------------------------

def _square_with_wrong_vjp():
    """x² whose VJP forgets the factor 2: a bug gradcheck must catch."""
    return Op("test_bad_square", lambda xp, x: x * x, lambda x: Aval(x.shape, x.dtype),
              lambda g, out, x: (g * x,))


def test_gradcheck_reports_a_wrong_vjp_entry_by_entry():
    bad = _square_with_wrong_vjp()
    x = np.array([1.0, -2.0, 3.0])
    with pytest.raises(mc.GradientCheckError) as info:
        mc.gradcheck(lambda a, b: a * 2.0 + apply(bad, b), [x, x.copy()])
    message = str(info.value)
    assert "input 1 (entry)" in message  # input 0 is right; the wrong one is named
    assert "3 of 3 entries differ" in message
    assert "largest absolute error" in message and "largest relative error" in message
    assert "analytic" in message and "numerical" in message


def test_gradcheck_reports_a_wrong_vjp_along_random_directions():
    bad = _square_with_wrong_vjp()
    x = np.linspace(-1, 1, 100).reshape(10, 10)  # more entries than full_limit
    with pytest.raises(mc.GradientCheckError, match=r"input 0 \(random direction 0\)"):
        mc.gradcheck(lambda x: apply(bad, x), [x])


def test_gradcheck_catches_a_monkeypatched_primitive(monkeypatch):
    tanh = mc.ops.OPS["tanh"]
    assert mc.gradcheck(mc.tanh, [np.array([0.3, -0.7])])
    monkeypatch.setattr(tanh, "vjp", lambda g, out, x: (g * (1 + out * out),))
    with pytest.raises(mc.GradientCheckError, match="input 0"):
        mc.gradcheck(mc.tanh, [np.array([0.3, -0.7])])


def test_gradcheck_needs_float64():
    with pytest.raises(mc.GradientCheckError, match="needs float64 inputs, got float32"):
        mc.gradcheck(mc.tanh, [np.zeros(2, np.float32)])


# --- backend ----------------------------------------------------------------------------------

def test_cuda_without_cupy_says_cupy_is_missing(monkeypatch):
    monkeypatch.setattr(backend, "_cupy", False)  # as if the import had failed
    with pytest.raises(mc.DeviceError, match="device 'cuda' needs CuPy, which is not installed"):
        mc.set_device("cuda")
    assert mc.get_device() == "cpu"
    assert not mc.gpu_available()


def test_cuda_without_a_gpu_says_the_gpu_is_missing(monkeypatch):
    class NoDevice:
        @staticmethod
        def getDeviceCount():
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    class FakeCupy:
        cuda = type("cuda", (), {"runtime": NoDevice})

    monkeypatch.setattr(backend, "_cupy", FakeCupy)
    with pytest.raises(mc.DeviceError, match="device 'cuda' needs a GPU.*no CUDA-capable device"):
        mc.set_device("cuda")
    assert mc.get_device() == "cpu"


def test_a_gpu_found_once_is_not_looked_for_again(monkeypatch):
    """Each look is a driver call (about 0.1 ms); tensors move to the device many times a step.
    Another CuPy module (here a second stand-in) is asked again."""
    def fake():
        asked = []

        class Runtime:
            @staticmethod
            def getDeviceCount():
                asked.append(1)
                return 1

        return type("FakeCupy", (), {"cuda": type("cuda", (), {"runtime": Runtime})}), asked

    first, asked_first = fake()
    monkeypatch.setattr(backend, "_gpu_seen", None)
    monkeypatch.setattr(backend, "_cupy", first)
    assert [backend.cupy_or_error() for _ in range(3)] == [first] * 3
    assert len(asked_first) == 1
    second, asked_second = fake()
    monkeypatch.setattr(backend, "_cupy", second)
    assert backend.cupy_or_error() is second and len(asked_second) == 1


def test_cuda_on_this_machine():
    if mc.gpu_available():
        pytest.skip("a GPU is present: the error path cannot be seen here")
    with pytest.raises(mc.DeviceError, match=r"device 'cuda' needs (CuPy|a GPU)"):
        mc.set_device("cuda")
    assert mc.get_device() == "cpu"


def test_unknown_device_is_named():
    with pytest.raises(mc.DeviceError, match=r"unknown device 'tpu'; expected one of"):
        mc.set_device("tpu")


def _python(code, **env):
    environment = dict(os.environ, PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=120)


def test_minicavs_device_environment_variable():
    code = ("import minicavs as mc\nprint(mc.get_device())\n"
            "try:\n    mc.tensor([1.0]); print('made')\n"
            "except mc.DeviceError as e:\n    print('DeviceError', e)\n")
    cpu = _python(code, MINICAVS_DEVICE="cpu")
    assert cpu.stdout.split("\n")[:2] == ["cpu", "made"], cpu.stderr
    unknown = _python(code, MINICAVS_DEVICE="tpu")
    assert unknown.returncode != 0 and "unknown device 'tpu'" in unknown.stderr
    if not mc.gpu_available():  # the name is accepted; the first tensor says what is missing
        cuda = _python(code, MINICAVS_DEVICE="cuda")
        assert cuda.stdout.startswith("cuda\nDeviceError device 'cuda' needs"), cuda.stderr


def test_seed_makes_random_draws_reproducible():
    mc.seed(7)
    first = (backend.rng().standard_normal(3), np.random.rand(2))
    mc.seed(7)
    second = (backend.rng().standard_normal(3), np.random.rand(2))
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    mc.seed(8)
    assert not np.array_equal(backend.rng().standard_normal(3), first[0])


def test_default_dtype_must_be_float():
    with pytest.raises(mc.DTypeError, match="the default dtype must be a float type, got int32"):
        mc.set_default_dtype("int32")
    previous = mc.default_dtype()
    try:
        mc.set_default_dtype("float64")
        assert t([1.0]).dtype == np.float64
    finally:
        mc.set_default_dtype(previous)


def test_backward_skips_the_product_for_an_input_that_needs_no_gradient(monkeypatch):
    """matmul's VJP computes no gradient for data (an image batch, features): one product in
    backward instead of two, and the weight's gradient unchanged."""
    from minicavs.ops import linalg

    rng = np.random.default_rng(0)
    x = mc.tensor(rng.normal(size=(5, 4, 3)))  # data: no gradient wanted
    W = mc.Parameter(rng.normal(size=(3, 2)))
    loss = mc.sum(mc.tanh(x @ W))
    calls = []
    real = linalg.matmul
    monkeypatch.setattr(linalg, "matmul", lambda a, b: calls.append((a.shape, b.shape))
                        or real(a, b))
    loss.backward()
    assert len(calls) == 1 and x.grad is None
    h = np.tanh(x.numpy() @ W.numpy())
    np.testing.assert_allclose(W.grad.numpy(), np.einsum("nki,nkj->ij", x.numpy(), 1 - h * h),
                               rtol=1e-12)
    x2 = mc.tensor(x.numpy(), requires_grad=True)  # wanted: both products run
    calls.clear()
    W.grad = None
    mc.sum(mc.tanh(x2 @ W)).backward()
    assert len(calls) == 2 and x2.grad is not None
