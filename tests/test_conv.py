"""Convolution, pooling and resampling (minicavs/ops/conv.py, minicavs/nn/conv.py).

Values and gradients are compared with PyTorch where it is installed (float64, to 1e-10), and
always with a direct NumPy loop over output positions (the definition, not im2col) on
hypothesis shapes, strides, paddings, dilations and groups; gradients are checked in float64 by
finite differences. The native im2col/col2im loops are compared with the NumPy path, and the
ops run inside a vertex function and under automatic batching equal to eager execution.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minicavs as mc
from minicavs.cpu import conv as native_conv, kernels as native_kernels
from minicavs.ops import conv as conv_ops
from minicavs.ops.registry import apply
from minicavs.errors import ArgumentError, ShapeError
from peers import torch_or_skip

RNG = np.random.default_rng(0)


def _normal(*shape):
    return RNG.standard_normal(shape)


def _distinct(*shape):
    """Values far apart from each other (max pooling has no ties)."""
    n = int(np.prod(shape))
    return (RNG.permutation(n).reshape(shape) - n / 2) / 8.0


# --- the definitions, as direct loops ---------------------------------------------------------

def conv2d_loops(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """out[n, o, i, j] = Σ_{c in o's group, p, q} x_pad[n, c, i·s + p·d, j·s + q·d] w[o, c, p, q]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, [(0, 0), (0, 0), (ph, ph), (pw, pw)])
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg:(g + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                           j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, oc, i, j] = np.tensordot(patch, w[oc], axes=3)
    return out if b is None else out + b[None, :, None, None]


def max_pool2d_loops(x, k, s, p):
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)], constant_values=-np.inf)
    oh, ow = (xp.shape[2] - k) // s + 1, (xp.shape[3] - k) // s + 1
    return np.array([[xp[:, :, i * s:i * s + k, j * s:j * s + k].max(axis=(2, 3))
                      for j in range(ow)] for i in range(oh)]).transpose(2, 3, 0, 1)


# --- against PyTorch ----------------------------------------------------------------------------

def _cases():
    x, x1 = _normal(2, 4, 9, 10), _normal(2, 4, 11)
    return {
        "conv2d stride padding dilation groups": (
            [x, _normal(6, 2, 3, 2), _normal(6)],
            lambda F, x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2),
                                        dilation=(1, 2), groups=2)),
        "conv2d depthwise": ([x, _normal(4, 1, 3, 3)],
                             lambda F, x, w: F.conv2d(x, w, padding=1, groups=4)),
        "conv2d padding same, dilation 2": (
            [x, _normal(5, 4, 3, 3)], lambda F, x, w: F.conv2d(x, w, padding="same", dilation=2)),
        "conv2d padding valid": ([x, _normal(5, 4, 2, 4)],
                                 lambda F, x, w: F.conv2d(x, w, padding="valid")),
        "conv2d unbatched (C, H, W)": ([x[0], _normal(3, 4, 3, 3), _normal(3)],
                                       lambda F, x, w, b: F.conv2d(x, w, b, stride=2)),
        "conv3d (the NumPy path: 3-D windows)": (
            [_normal(2, 2, 5, 4, 6), _normal(4, 1, 2, 3, 2)],
            lambda F, x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1, dilation=(2, 1, 1),
                                     groups=2)),
        "max_pool3d, avg_pool3d": (
            [_distinct(1, 2, 5, 4, 6)],
            lambda F, x: F.max_pool3d(x, 2, padding=1) * 2 + F.avg_pool3d(x, 2, padding=1)),
        "conv1d": ([x1, _normal(3, 4, 4), _normal(3)],
                   lambda F, x, w, b: F.conv1d(x, w, b, stride=2, padding=1)),
        "conv1d same, even kernel": ([x1, _normal(4, 2, 4)],
                                     lambda F, x, w: F.conv1d(x, w, padding="same", groups=2)),
        "conv_transpose2d": (
            [x, _normal(4, 3, 3, 2), _normal(6)],
            lambda F, x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 3), padding=(1, 0),
                                                  output_padding=(1, 2), groups=2,
                                                  dilation=(1, 2))),
        "conv_transpose1d": ([x1, _normal(4, 2, 3)],
                             lambda F, x, w: F.conv_transpose1d(x, w, stride=2, padding=1)),
        "max_pool2d": ([_distinct(2, 3, 9, 10)],
                       lambda F, x: F.max_pool2d(x, 3, stride=2, padding=1)),
        "max_pool2d ceil_mode, dilation": (
            [_distinct(2, 3, 9, 10)],
            lambda F, x: F.max_pool2d(x, (2, 3), stride=2, dilation=(2, 1), ceil_mode=True)),
        "max_pool1d": ([_distinct(2, 3, 11)], lambda F, x: F.max_pool1d(x, 3, 2, 1)),
        "avg_pool2d": ([x], lambda F, x: F.avg_pool2d(x, 3, stride=2, padding=1)),
        "avg_pool2d ceil_mode, count_include_pad=False": (
            [x], lambda F, x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                                           count_include_pad=False)),
        "avg_pool2d ceil_mode": ([x], lambda F, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)),
        "avg_pool2d divisor_override": ([x], lambda F, x: F.avg_pool2d(x, 2,
                                                                       divisor_override=3)),
        "avg_pool1d": ([x1], lambda F, x: F.avg_pool1d(x, 3, 2, 1, True, False)),
        "adaptive_avg_pool2d": ([x], lambda F, x: F.adaptive_avg_pool2d(x, (4, 3))),
        "adaptive_avg_pool2d (None, 1)": ([x], lambda F, x: F.adaptive_avg_pool2d(x, (None, 1))),
        "adaptive_avg_pool1d": ([x1], lambda F, x: F.adaptive_avg_pool1d(x, 4)),
        "interpolate nearest, size": (
            [x], lambda F, x: F.interpolate(x, size=(13, 7), mode="nearest")),
        "interpolate nearest, scale_factor": (
            [x], lambda F, x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest")),
        "interpolate nearest-exact": (
            [x], lambda F, x: F.interpolate(x, size=(5, 17), mode="nearest-exact")),
        "interpolate bilinear": (
            [x], lambda F, x: F.interpolate(x, size=(13, 7), mode="bilinear")),
        "interpolate bilinear, scale_factor": (
            [x], lambda F, x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear")),
        "interpolate bilinear, align_corners": (
            [x], lambda F, x: F.interpolate(x, size=(13, 7), mode="bilinear",
                                            align_corners=True)),
        "interpolate linear": ([x1], lambda F, x: F.interpolate(x, scale_factor=2.5,
                                                                mode="linear")),
        "interpolate area": ([x], lambda F, x: F.interpolate(x, size=(4, 6), mode="area")),
        "unfold": ([x], lambda F, x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=2)),
        "fold": ([_normal(2, 4 * 6, 20)],
                 lambda F, c: F.fold(c, (7, 9), (2, 3), padding=1, stride=2)),
    }


CASES = _cases()


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # PyTorch's note on its own copy
@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_equal_pytorch(name):
    torch = torch_or_skip()
    arrays, fn = CASES[name]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ms = [mc.tensor(a, requires_grad=True) for a in arrays]
    expected, out = fn(torch.nn.functional, *ts), fn(mc, *ms)
    assert out.shape == tuple(expected.shape) and out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = np.random.default_rng(1).standard_normal(out.shape)
    (expected * torch.tensor(g)).sum().backward()
    (out * mc.tensor(g)).sum().backward()
    for m, t in zip(ms, ts):
        np.testing.assert_allclose(m.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-10)


# --- against the definition, on generated geometries -------------------------------------------

@st.composite
def conv_geometries(draw):
    groups = draw(st.integers(1, 3))
    cg, og = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 7))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 7))
    n = draw(st.integers(1, 2))
    return dict(x=(n, groups * cg, h, w), w=(groups * og, cg, kh, kw), stride=(sh, sw),
                padding=(ph, pw), dilation=(dh, dw), groups=groups)


@settings(max_examples=25, deadline=None)
@given(geometry=conv_geometries(), seed=st.integers(0, 2 ** 16))
def test_conv2d_equals_the_definition_and_its_gradients_check(geometry, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(geometry.pop("x")), rng.standard_normal(geometry.pop("w"))
    b = rng.standard_normal(w.shape[0])
    out = mc.conv2d(mc.tensor(x), mc.tensor(w), mc.tensor(b), **geometry)
    np.testing.assert_allclose(out.numpy(), conv2d_loops(x, w, b, **geometry), rtol=1e-10,
                               atol=1e-10)
    assert mc.gradcheck(lambda x, w, b: mc.conv2d(x, w, b, **geometry), [x, w, b])


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 3), s=st.integers(1, 3), p=st.integers(0, 1), h=st.integers(3, 7),
       seed=st.integers(0, 2 ** 16))
def test_max_pool2d_equals_the_definition_and_its_gradients_check(k, s, p, h, seed):
    p = min(p, k // 2)
    x = np.random.default_rng(seed).permutation(2 * 3 * h * h).reshape(2, 3, h, h) / 8.0
    np.testing.assert_array_equal(mc.max_pool2d(mc.tensor(x), k, s, p).numpy(),
                                  max_pool2d_loops(x, k, s, p))
    assert mc.gradcheck(lambda x: mc.max_pool2d(x, k, s, p), [x])


def test_gradients_check_in_float64():
    x, w = _normal(2, 4, 6, 5), _normal(4, 2, 2, 3)
    assert mc.gradcheck(lambda x, w: mc.conv_transpose2d(x, w, stride=2, padding=1, groups=2,
                                                         output_padding=1), [x, w])
    assert mc.gradcheck(lambda x: mc.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                count_include_pad=False), [x])
    assert mc.gradcheck(lambda x: mc.adaptive_avg_pool2d(x, (4, 2)), [x])
    assert mc.gradcheck(lambda x: mc.interpolate(x, scale_factor=1.5, mode="bilinear"), [x])
    assert mc.gradcheck(lambda x: mc.interpolate(x, size=(9, 3)), [x])
    c = _normal(2, 12, 6)
    assert mc.gradcheck(lambda c: mc.fold(c, (4, 5), (2, 3), stride=(2, 1)), [c])


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
def test_second_derivatives_equal_pytorch():
    # fold is unfold's VJP and unfold fold's, so a gradient can be differentiated again
    torch = torch_or_skip()
    x, w, v = _normal(1, 2, 5, 5), _normal(3, 2, 3, 3), _normal(1, 2, 5, 5)
    grads = []
    for lib, make in ((mc, lambda a: mc.tensor(a, requires_grad=True)),
                      (torch, lambda a: torch.tensor(a, requires_grad=True))):
        xt, wt = make(x), make(w)
        y = lib.nn.functional.max_pool2d(lib.nn.functional.conv2d(xt, wt, padding=1), 2) \
            if lib is torch else mc.max_pool2d(mc.conv2d(xt, wt, padding=1), 2)
        (y * y).sum().backward(create_graph=True)
        gx = xt.grad
        xt.grad = wt.grad = None
        (gx * (torch.tensor(v) if lib is torch else mc.tensor(v))).sum().backward()
        grads.append([np.asarray(xt.grad.detach().numpy() if lib is torch else xt.grad.numpy()),
                      np.asarray(wt.grad.detach().numpy() if lib is torch else wt.grad.numpy())])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


# --- hand-derived values --------------------------------------------------------------------------

def test_small_cases_by_hand():
    x = mc.tensor(np.arange(9.0).reshape(1, 1, 3, 3))
    # a 2×2 kernel of ones sums each 2×2 window: 0+1+3+4, 1+2+4+5, ...
    np.testing.assert_array_equal(mc.conv2d(x, mc.tensor(np.ones((1, 1, 2, 2)))).numpy(),
                                  [[[[8.0, 12.0], [20.0, 24.0]]]])
    np.testing.assert_array_equal(mc.max_pool2d(x, 2, 1).numpy(), [[[[4.0, 5.0], [7.0, 8.0]]]])
    np.testing.assert_array_equal(mc.avg_pool2d(x, 3).numpy(), [[[[4.0]]]])
    # the transposed convolution of a single 1 paints the kernel at stride offsets
    one = mc.tensor(np.ones((1, 1, 2, 1)))
    k = mc.tensor(np.array([[[[1.0], [2.0]]]]))
    np.testing.assert_array_equal(mc.conv_transpose2d(one, k, stride=(3, 1)).numpy(),
                                  [[[[1.0], [2.0], [0.0], [1.0], [2.0]]]])
    # bilinear with align_corners doubles [0, 3] to the line through them
    line = mc.tensor(np.array([[[0.0, 3.0]]]))
    np.testing.assert_allclose(mc.interpolate(line, size=4, mode="linear",
                                              align_corners=True).numpy(), [[[0, 1, 2, 3]]])


# --- the native loops equal the NumPy path -------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_im2col_and_col2im_equal_the_numpy_path(monkeypatch, dtype):
    x = _normal(2, 3, 7, 8).astype(dtype)
    w = _normal(4, 3, 3, 2).astype(dtype)
    x1 = _normal(2, 3, 9).astype(dtype)

    def run():
        xt, wt = mc.tensor(x, requires_grad=True), mc.tensor(w, requires_grad=True)
        x1t = mc.tensor(x1, requires_grad=True)
        y = (mc.conv2d(xt, wt, stride=(2, 1), padding=(2, 1), dilation=(1, 2)).sum()
             + mc.max_pool2d(xt, 3, 2, 1, ceil_mode=True).sum()
             + mc.conv_transpose1d(x1t, mc.tensor(w[:3, :, 0]), stride=3).sum()
             + mc.avg_pool1d(x1t, 2).sum())
        y.backward()
        return [y.numpy(), xt.grad.numpy(), wt.grad.numpy(), x1t.grad.numpy()]

    native = run()
    assert native_kernels.unfold(x, (3, 2), (1, 1), (1, 1), ((0, 0), (0, 0)), 0.0) is not None
    monkeypatch.setattr(native_kernels, "unfold", lambda *a: None)
    monkeypatch.setattr(native_kernels, "fold", lambda *a: None)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for a, b in zip(native, run()):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# --- the fused product (conv_windows) equals the composed one -----------------------------------

def _composed_conv2d(x, w, b=None, stride=1, padding=0, dilation=1):
    """conv2d with the product composed from matmul and reshapes (the groups path)."""
    name = "conv2d"
    stride, dilation = conv_ops._ints(name, "stride", stride, 2, 1), conv_ops._ints(
        name, "dilation", dilation, 2, 1)
    pads = conv_ops._padding(name, padding, 2, tuple(w.shape[2:]), dilation, stride)
    cols = conv_ops._unfold(x, tuple(w.shape[2:]), stride, dilation, pads)
    return conv_ops._composed_product(cols, w, b, 1)


def _values_and_gradients(conv, x, w, b, input_grad, geometry, dtype=np.float64):
    xt = mc.tensor(x.astype(dtype), requires_grad=input_grad)
    wt = mc.tensor(w.astype(dtype), requires_grad=True)
    bt = None if b is None else mc.tensor(b.astype(dtype), requires_grad=True)
    y = conv(xt, wt, bt, **geometry)
    weights = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    (y * mc.tensor(weights)).sum().backward()
    assert (xt.grad is not None) == input_grad
    return [y.numpy(), wt.grad.numpy()] + ([] if b is None else [bt.grad.numpy()]) + (
        [xt.grad.numpy()] if input_grad else [])


@st.composite
def product_geometries(draw):
    """Geometries of every size of product: short rows, rows of 64+ positions and of 256+
    with few filters (which native form runs each is measured, cpu/calibrate.py)."""
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    size = draw(st.sampled_from([6, 12, 20]))
    low_h, low_w = max(1, dh * (kh - 1) + 1 - 2 * ph), max(1, dw * (kw - 1) + 1 - 2 * pw)
    h, w = draw(st.integers(low_h, max(low_h, size))), draw(st.integers(low_w, max(low_w, size)))
    n, c, o = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 5, 17]))
    return dict(x=(n, c, h, w), w=(o, c, kh, kw), stride=(sh, sw), padding=(ph, pw),
                dilation=(dh, dw), bias=draw(st.booleans()), input_grad=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(geometry=product_geometries(), seed=st.integers(0, 2 ** 16))
def test_the_fused_product_equals_the_composed_one(geometry, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(geometry.pop("x")), rng.standard_normal(geometry.pop("w"))
    b = rng.standard_normal(w.shape[0]) if geometry.pop("bias") else None
    input_grad = geometry.pop("input_grad")
    fused = _values_and_gradients(mc.conv2d, x, w, b, input_grad, geometry)
    composed = _values_and_gradients(_composed_conv2d, x, w, b, input_grad, geometry)
    for a, c in zip(fused, composed):
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernels", ["own", "blas"])
@pytest.mark.parametrize("n, c, h, o, k", [
    (3, 2, 7, 4, 3),     # 25 positions
    (2, 3, 12, 5, 3),    # 100 positions
    (2, 1, 20, 6, 5),    # 256 positions, 6 filters
    (1, 2, 21, 17, 2),   # 400 positions, 17 filters; batch 1
])
def test_native_products_equal_the_numpy_form(monkeypatch, n, c, h, o, k, dtype, kernels):
    """The native products, with the library's loops and with the gemms (which one runs a
    shape is measured on the machine, cpu/calibrate.py: both are forced here)."""
    monkeypatch.setenv("MINICAVS_KERNELS", kernels)
    x, w, b = _normal(n, c, h, h), _normal(o, c, k, k), _normal(o)
    run = lambda: _values_and_gradients(mc.conv2d, x, w, b, True, {}, dtype)  # noqa: E731
    native = run()
    assert native_conv.product(x.astype(dtype)[:, :, None, None], w.astype(dtype)[:, :, None],
                               None, 2) is not None
    for name in ("product", "weight_grad", "input_grad"):
        monkeypatch.setattr(native_conv, name, lambda *a: None)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for a, c in zip(native, run()):
        np.testing.assert_allclose(a, c, rtol=tol, atol=tol)


def test_without_native_code_the_numpy_form_runs(monkeypatch):
    x, w = _normal(2, 2, 9, 9), _normal(3, 2, 3, 3)
    before = _values_and_gradients(mc.conv2d, x, w, None, True, {})
    monkeypatch.setenv("MINICAVS_NATIVE", "0")
    assert native_conv.build.module_library.__wrapped__(  # (uncached: the switch is read)
        native_conv._SOURCE, "conv", "minicavs/cpu/conv.py") is None
    monkeypatch.setattr(native_conv, "_library", lambda: None)
    assert native_conv.product(np.zeros((1, 1, 1, 1, 1, 1)), np.zeros((1, 1, 1, 1)), None,
                               2) is None
    for a, c in zip(before, _values_and_gradients(mc.conv2d, x, w, None, True, {})):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)


def test_conv_windows_gradients_differentiate_again():
    # the three ops are each other's adjoints: ∂ of a gradient uses them again
    cols, w, g = _normal(2, 3, 2, 2, 4, 5), _normal(4, 3, 2, 2), _normal(2, 4, 4, 5)
    assert mc.gradcheck(lambda c, w: apply(conv_ops.CONV_WINDOWS_INPUT_GRAD, c, w),
                        [g, w])
    assert mc.gradcheck(lambda c, g: apply(conv_ops.CONV_WINDOWS_WEIGHT_GRAD, c, g),
                        [cols, g])
    assert mc.gradcheck(lambda c, w, b: apply(conv_ops.CONV_WINDOWS, c, w, b),
                        [cols, w, _normal(4)])


@pytest.mark.parametrize("call, words", [
    (lambda: apply(conv_ops.CONV_WINDOWS, np.ones((2, 3, 2, 2, 4, 4)), np.ones((4, 2, 2, 2))),
     ["conv_windows", "(2, 3, 2, 2, 4, 4)", "(4, 2, 2, 2)", "(O, C, *kernel)"]),
    (lambda: apply(conv_ops.CONV_WINDOWS, np.ones((3, 2, 2, 4, 4)), np.ones((4, 3, 2, 2)),
                   np.ones(3)), ["bias", "(3,)", "(4,)"]),
    (lambda: apply(conv_ops.CONV_WINDOWS_INPUT_GRAD, np.ones((2, 3, 4, 4)),
                   np.ones((4, 3, 2, 2))), ["conv_windows_input_grad", "(..., 4, *out)"]),
    (lambda: apply(conv_ops.CONV_WINDOWS_WEIGHT_GRAD, np.ones((2, 3, 2, 2, 4, 4)),
                   np.ones((2, 5, 3, 4))), ["conv_windows_weight_grad", "(2, 5, 3, 4)"]),
])
def test_bad_input_to_the_product_ops_is_a_clear_error(call, words):
    with pytest.raises(ShapeError) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --- dtypes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_keep_the_float_dtype(dtype):
    x = mc.tensor(_normal(2, 2, 6, 6).astype(dtype), requires_grad=True)
    w = mc.tensor(_normal(3, 2, 3, 3).astype(dtype), requires_grad=True)
    results = [mc.conv2d(x, w, padding=1), mc.conv_transpose2d(x, mc.tensor(w.numpy()[:2])),
               mc.max_pool2d(x, 2), mc.avg_pool2d(x, 2), mc.adaptive_avg_pool2d(x, 4),
               mc.interpolate(x, scale_factor=2, mode="bilinear"), mc.interpolate(x, size=3),
               mc.unfold(x, 2)]
    for y in results:
        assert y.dtype == dtype
    sum(mc.sum(y) for y in results).backward()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype


def test_integer_pooling():
    x = np.arange(32, dtype=np.int64).reshape(1, 2, 4, 4)
    out = mc.max_pool2d(mc.tensor(x), 2, padding=1)
    assert out.dtype == np.int64  # padding is the dtype's lowest value, never picked
    np.testing.assert_array_equal(out.numpy()[0, 0], [[0, 2, 3], [8, 10, 11], [12, 14, 15]])
    avg = mc.avg_pool2d(mc.tensor(x), 2)
    assert avg.dtype == mc.default_dtype()
    np.testing.assert_allclose(avg.numpy()[0, 0], [[2.5, 4.5], [10.5, 12.5]])


# --- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, words", [
    (lambda x, w: mc.conv2d(x, w[:, :1]), ShapeError,
     ["conv2d", "4 channels", "expects 1", "weight.shape[1]"]),
    (lambda x, w: mc.conv2d(x, mc.tensor(np.ones((2, 4, 9, 9)))), ShapeError,
     ["conv2d", "kernel (9, 9) is larger than the input", "kernel size 9 > input size 6"]),
    (lambda x, w: mc.conv2d(x, mc.tensor(np.ones((2, 4, 3, 3))), dilation=3), ShapeError,
     ["dilated to 7"]),
    (lambda x, w: mc.conv2d(x, mc.tensor(np.ones((3, 2, 3, 3))), groups=2), ArgumentError,
     ["groups=2 does not divide the 3 output channels"]),
    (lambda x, w: mc.conv2d(x, w, stride=0), ArgumentError, ["stride must be >= 1"]),
    (lambda x, w: mc.conv2d(x, w, padding="full"), ArgumentError, ["padding", "'same'"]),
    (lambda x, w: mc.conv2d(x, w, stride=2, padding="same"), ArgumentError,
     ["padding='same' needs stride 1"]),
    (lambda x, w: mc.conv2d(x, w, mc.tensor(np.ones(3))), ShapeError,
     ["bias has shape (3,)", "(2,)"]),
    (lambda x, w: mc.conv2d(mc.tensor(np.ones((6, 6))), w), ShapeError,
     ["expected (N, C, H, W) or, unbatched, (C, H, W)"]),
    (lambda x, w: mc.conv1d(x, w), ShapeError, ["conv1d", "(N, C, L)"]),
    (lambda x, w: mc.conv_transpose2d(x, mc.tensor(np.ones((4, 2, 3, 3))), stride=2,
                                      output_padding=2), ArgumentError,
     ["output_padding (2, 2) must be smaller than the stride (2, 2)"]),
    (lambda x, w: mc.max_pool2d(x, 2, padding=2), ArgumentError, ["at most half"]),
    (lambda x, w: mc.max_pool2d(x, 7), ShapeError, ["max_pool2d", "larger than the input"]),
    (lambda x, w: mc.interpolate(x, size=4, mode="bicubic"), ArgumentError, ["mode"]),
    (lambda x, w: mc.interpolate(x, size=4, align_corners=True), ArgumentError,
     ["align_corners"]),
    (lambda x, w: mc.interpolate(x), ArgumentError, ["exactly one of size and scale_factor"]),
    (lambda x, w: mc.nn.Conv2d(4, 6, 3, groups=4), ArgumentError,
     ["groups=4 does not divide out_channels=6"]),
])
def test_bad_input_is_a_clear_error(call, error, words):
    x = mc.tensor(np.ones((1, 4, 6, 6)))
    w = mc.tensor(np.ones((2, 4, 3, 3)))
    with pytest.raises(error) as info:
        call(x, w)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --- layers ---------------------------------------------------------------------------------------

def test_layers_equal_pytorch_layers_with_the_same_weights():
    torch = torch_or_skip()
    x = _normal(2, 4, 8, 8)
    pairs = [(mc.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, dtype="float64"),
              torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2).double()),
             (mc.nn.ConvTranspose2d(4, 2, (2, 3), stride=2, dtype="float64"),
              torch.nn.ConvTranspose2d(4, 2, (2, 3), stride=2).double()),
             (mc.nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(3, 2, 1)),
             (mc.nn.AvgPool2d(2), torch.nn.AvgPool2d(2)),
             (mc.nn.AdaptiveAvgPool2d((3, 5)), torch.nn.AdaptiveAvgPool2d((3, 5))),
             (mc.nn.Upsample(scale_factor=2, mode="bilinear"),
              torch.nn.Upsample(scale_factor=2, mode="bilinear")),
             (mc.nn.Flatten(), torch.nn.Flatten())]
    for ours, theirs in pairs:
        params = dict(ours.named_parameters())
        assert {k: tuple(v.shape) for k, v in params.items()} == {
            k: tuple(v.shape) for k, v in theirs.named_parameters()}
        for k, v in theirs.named_parameters():  # PyTorch's init bound: 1 / sqrt(fan_in)
            bound = 1 / np.sqrt(np.prod(v.shape[1:]) if v.ndim > 1 else
                                np.prod(dict(theirs.named_parameters())["weight"].shape[1:]))
            assert np.abs(params[k].numpy()).max() <= bound
            with torch.no_grad():
                v.copy_(torch.tensor(params[k].numpy()))
        np.testing.assert_allclose(ours(mc.tensor(x)).numpy(),
                                   theirs(torch.tensor(x)).detach().numpy(), rtol=1e-10,
                                   atol=1e-10)
    conv1 = mc.nn.Conv1d(4, 2, 3, padding="same")
    assert conv1(mc.tensor(_normal(3, 4, 7).astype(np.float32))).shape == (3, 2, 7)


# --- inside a vertex function and under automatic batching --------------------------------------

def _small_cnn(dtype="float64"):
    mc.seed(3)
    return mc.nn.Sequential(mc.nn.Conv2d(1, 3, 3, padding=1, dtype=dtype), mc.nn.ReLU(),
                            mc.nn.MaxPool2d(2), mc.nn.Conv2d(3, 2, 2, dtype=dtype),
                            mc.nn.AvgPool2d(2), mc.nn.Flatten(0))


def test_a_cnn_inside_a_vertex_function_equals_per_sample_evaluation():
    cnn = _small_cnn()
    U = mc.Parameter(_normal(2, 2) * 0.5)

    def cell(v):  # a recurrent cell reading one image per vertex
        h = mc.tanh(cnn(v.pull()) + v.gather(0) @ U)
        v.scatter(h)

    F = mc.VertexFunction(cell, pull_shape=(1, 6, 6), scatter_shape=(2,), arity=1,
                          dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.chain(1),
                           mc.InputGraph.chain(2)])
    images = _normal(batch.num_vertices, 1, 6, 6)
    results = []
    for run in (F, lambda b, pull: mc.evaluate_per_sample(F, b, pull)):
        X = mc.tensor(images, requires_grad=True)
        out = run(batch, pull=X)
        (out * out).sum().backward()
        results.append([out.numpy(), X.grad.numpy()] + [p.grad.numpy() for p in
                                                          cnn.parameters() + [U]])
        for p in cnn.parameters() + [U]:
            p.grad = None
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_filters_per_vertex_inside_a_vertex_function_equal_per_sample_evaluation():
    # the filters come from each vertex's pulled input: conv_windows' batching rule falls
    # back to one matmul broadcast over the rows
    image = mc.Parameter(_normal(2, 5, 5))
    b = mc.Parameter(_normal(3))

    def cell(v):
        w = mc.reshape(v.pull(), (3, 2, 2, 2))
        h = mc.sum(mc.conv2d(image, w, b, padding=1), axis=(1, 2)) + v.gather(0)
        v.scatter(mc.tanh(h))

    F = mc.VertexFunction(cell, pull_shape=(24,), scatter_shape=(3,), arity=1, dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.chain(2)])
    filters = _normal(batch.num_vertices, 24)
    results = []
    for run in (F, lambda g, pull: mc.evaluate_per_sample(F, g, pull)):
        X = mc.tensor(filters, requires_grad=True)
        out = run(batch, pull=X)
        (out * out).sum().backward()
        results.append([out.numpy(), X.grad.numpy(), image.grad.numpy(), b.grad.numpy()])
        image.grad = b.grad = None
    for a, c in zip(*results):
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("strategy", ["depth", "agenda+"])
def test_per_sample_convolutions_under_autobatch_equal_eager(strategy):
    cnn = _small_cnn()
    images = [_normal(1, 6, 6) for _ in range(5)]

    def run(batched):
        for p in cnn.parameters():
            p.grad = None
        if batched:
            with mc.autobatch(strategy) as ab:
                outs = [cnn(mc.tensor(im)) for im in images]
                loss = mc.sum(mc.stack([mc.sum(o * o) for o in outs]))
                loss.backward()
            assert any(b.n == len(images) for s in ab.segments for b in s.plan
                       if b.sig.op.name == "unfold"), "the convolutions did not batch"
        else:
            outs = [cnn(mc.tensor(im)) for im in images]
            mc.sum(mc.stack([mc.sum(o * o) for o in outs])).backward()
        return [o.numpy() for o in outs] + [p.grad.numpy() for p in cnn.parameters()]

    for a, b in zip(run(True), run(False)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
