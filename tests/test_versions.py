"""Version counters: a tensor that backward needs and that was changed in place after the
forward pass saved it makes backward raise, naming the tensor and the op; reading it does not."""

import numpy as np
import pytest

import minicavs as mc
from peers import torch_or_skip


def _forward(W):
    x = mc.tensor(np.ones((1, 2)))
    return mc.sum(mc.tanh(x @ W))


def test_writing_a_parameter_between_forward_and_backward_is_refused():
    W = mc.Parameter(np.ones((2, 2)), name="W")
    y = _forward(W)
    W.data[...] = 100
    with pytest.raises(mc.InPlaceModificationError,
                       match=r"backward\(\): argument 1 of op 'matmul', a parameter 'W' of shape "
                             r"\(2, 2\) float64, was changed in place after the forward pass "
                             r"saved it"):
        y.backward()
    assert W.grad is None


def test_reading_data_or_numpy_between_forward_and_backward_is_fine():
    W = mc.Parameter(np.ones((2, 2)), name="W")
    expected = _forward(mc.Parameter(np.ones((2, 2))))
    expected.backward()
    y = _forward(W)
    assert W.data.sum() == 4 and W.numpy().sum() == 4  # handed out, not changed
    y.backward()
    assert np.array_equal(W.grad.numpy(), 0 * W.numpy() + W.grad.numpy())
    y2 = _forward(W)
    for _ in range(3):
        W.data
    y2.backward()


def test_a_write_that_puts_back_the_same_values_is_not_a_change():
    W = mc.Parameter(np.ones((2, 2)))
    y = _forward(W)
    W.data[0, 0] = 1.0
    y.backward()
    assert W.grad is not None


def test_an_optimiser_step_before_backward_is_refused():
    W = mc.Parameter(np.ones((2, 2)), name="W")
    opt = mc.nn.SGD([W], lr=0.1)
    _forward(W).backward()
    y = _forward(W)
    opt.step()  # the step belongs after y.backward()
    with pytest.raises(mc.InPlaceModificationError, match="parameter 'W'"):
        y.backward()


def test_changing_a_saved_intermediate_is_refused():
    x = mc.tensor(np.array([0.5, 1.0]), requires_grad=True)
    y = mc.tanh(x)  # tanh's gradient reads its output
    loss = mc.sum(y * 2.0)
    y.data[0] = 0.0
    with pytest.raises(mc.InPlaceModificationError, match="argument 0 of op 'mul', a tensor of "
                                                          r"shape \(2,\) float64"):
        loss.backward()
    y = mc.tanh(x)
    y.data[1] = 0.0
    with pytest.raises(mc.InPlaceModificationError, match="its output of op 'tanh'"):
        y.backward(np.ones(2))


def test_a_detached_tensor_shares_the_version_counter():
    W = mc.Parameter(np.ones((2, 2)))
    y = _forward(W)
    W.detach().data[1, 1] = 7.0
    with pytest.raises(mc.InPlaceModificationError):
        y.backward()


def test_assigning_data_and_loading_a_state_count_as_changes():
    W = mc.Parameter(np.ones((2, 2)))
    y = _forward(W)
    W.data = np.zeros((2, 2))
    with pytest.raises(mc.InPlaceModificationError):
        y.backward()

    class M(mc.nn.Module):
        def __init__(self):
            self.W = mc.Parameter(np.ones((2, 2)))
    m = M()
    y = _forward(m.W)
    m.load_state_dict({"W": np.full((2, 2), 3.0)})
    with pytest.raises(mc.InPlaceModificationError):
        y.backward()


def test_through_a_vertex_function_the_message_names_the_captured_parameter():
    H = 3
    W = mc.Parameter(np.eye(H, dtype=np.float32) * 0.5, name="U")

    def cell(v):
        v.scatter(mc.tanh(v.gather(0) @ W + v.pull()))

    F = mc.VertexFunction(cell, scatter_shape=(H,), pull_shape=(H,), arity=1, name="rnn")
    batch = mc.GraphBatch([mc.InputGraph.chain(4)])
    out = F(batch, pull=mc.tensor(np.ones((4, H), np.float32)))
    loss = mc.sum(out)
    W.data[...] = 100
    with pytest.raises(mc.InPlaceModificationError) as info:
        loss.backward()
    message = str(info.value)
    assert "parameter 'U' (captured at " in message and "test_versions.py" in message
    assert "of op 'vertex:rnn'" in message


def test_debug_mode_also_catches_a_write_through_an_array_held_from_before():
    array = np.array([0.5, 1.0])
    x = mc.tensor(array, requires_grad=True)  # shares ``array``
    with mc.debug():
        y = mc.sum(mc.exp(x))
    array[0] = 3.0  # no .data access: only the fingerprint taken in debug mode sees this
    with pytest.raises(mc.InPlaceModificationError, match="argument 0 of op 'exp'"):
        y.backward()
    y = mc.sum(mc.exp(mc.tensor(array, requires_grad=True)))
    array[0] = 4.0  # outside debug mode this write is not seen (documented)
    y.backward()


def test_static_functions_are_checked_too():
    W = mc.Parameter(np.ones((2, 2)))
    f = mc.symbolic(lambda x: mc.tanh(x @ W), ((1, 2), "float64"))
    y = mc.sum(f(mc.tensor(np.ones((1, 2)))))
    W.data[0, 0] = 5.0
    with pytest.raises(mc.InPlaceModificationError, match="static:"):
        y.backward()


def test_memory_shared_through_dlpack_and_changed_before_backward_is_refused():
    """A DLPack producer owns the memory (NumPy's here; PyTorch's below when installed): its
    writes bump no counter, so records fingerprint imported tensors, in any mode."""
    owner = np.array([0.5, 1.0, 2.0])
    x = mc.from_dlpack(owner)
    W = mc.Parameter(np.ones(3), name="W")
    loss = mc.sum(mc.exp(x * W))
    owner[1] = 7.0  # the owner writes between forward and backward
    with pytest.raises(mc.InPlaceModificationError, match="op 'mul'"):
        loss.backward()
    loss = mc.sum(mc.exp(x * W))  # unchanged: backward runs, gradients from these values
    loss.backward()
    np.testing.assert_allclose(W.grad.numpy(), owner * np.exp(owner))

    torch = torch_or_skip()
    t = torch.tensor([1.0, 2.0], dtype=torch.float64)
    shared = mc.from_dlpack(t)  # (a Parameter copies: optimisers write their own array)
    shared.name = "from torch"
    loss = mc.sum(shared * W[:2])
    t.mul_(3)
    with pytest.raises(mc.InPlaceModificationError, match="tensor 'from torch'"):
        loss.backward()


def test_reading_data_every_step_never_wears_a_record_out():
    """Versions whose content is the same share one fingerprint: a hundred reads of ``.data``
    (a loop logging the weights) leave every record checkable, and a real write is still
    caught after them."""
    W = mc.Parameter(np.array([1.0, 2.0]))
    loss = 0
    for i in range(100):
        loss = loss + mc.sum(W * float(i))
        W.data
    loss.backward(retain_graph=True)
    np.testing.assert_array_equal(W.grad.numpy(), [4950.0, 4950.0])
    W.data[0] = 5.0
    with pytest.raises(mc.InPlaceModificationError):
        loss.backward()
