"""Convolution, pooling and resampling, built the way the anchors build them: im2col and one
product (docs/conv.md, "How they are built", explains each part and its measurements).

Two primitives, each the other's VJP: ``unfold`` (im2col: the sliding windows of the last axes,
(..., *S) -> (..., *K, *out), each window offset one contiguous plane) and ``fold`` (col2im,
overlaps summing). Everything else is composed from them, ``matmul``, ``max``/``sum`` and
``take``, so its gradient, batching rule and CUDA form come from theirs — except the
convolution's product, ``conv_windows``, one primitive with two gradient primitives, for speed.
Layout (PyTorch's): channels first, ``x`` is (N, C, *spatial) or, unbatched, (C, *spatial) —
which is what a vertex cell sees, the vertex axis playing N. On NumPy float32/float64 the
primitives run as native loops (``cpu/kernels.py``, ``cpu/conv.py``) where the toolchain is
available; elsewhere, and on CuPy, as strided views and whole-plane adds (``_unfold_arrays``,
``_fold_arrays``) and ``matmul``/``tensordot``.
"""

import builtins
import math

import numpy as np

from . import batching, elementwise, indexing, linalg, reduce, shape
from ..cpu import conv as native_conv, kernels as native_kernels
from .registry import Aval, Op, apply, common_dtype, describe, needs_grad, register
from ..errors import ArgumentError, ShapeError

_INTEGERS = (int, np.integer)


# --- the two primitives -------------------------------------------------------------------------

def _windows(size, kernel, stride, dilation, padding):
    """Output positions along each axis: windows of span d·(k-1)+1, every s-th, over the
    padded extent."""
    return tuple((n + b + a - d * (k - 1) - 1) // s + 1
                 for n, k, s, d, (b, a) in zip(size, kernel, stride, dilation, padding))


def _check_fits(name, size, kernel, dilation, padding, what="argument 0"):
    for axis, (n, k, d, (b, a)) in enumerate(zip(size, kernel, dilation, padding)):
        span = d * (k - 1) + 1
        if span > n + b + a:
            dilated = f" (dilated to {span})" if d > 1 else ""
            raise ShapeError(f"op '{name}': the kernel {tuple(kernel)} is larger than {what} "
                             f"on spatial axis {axis}: kernel size {k}{dilated} > input size "
                             f"{n}" + (f" + padding {b} + {a}" if b or a else ""))


def _unfold_arrays(xp, x, kernel, stride, dilation, padding, value):
    nd = len(kernel)
    lead = x.ndim - nd
    if builtins.any(b or a for b, a in padding):
        x = xp.pad(x, [(0, 0)] * lead + [tuple(p) for p in padding], constant_values=value)
    out = _windows(x.shape[lead:], kernel, stride, dilation, ((0, 0),) * nd)
    st = x.strides[lead:]
    view = xp.lib.stride_tricks.as_strided(
        x, x.shape[:lead] + tuple(kernel) + out,
        x.strides[:lead] + tuple(s * d for s, d in zip(st, dilation))
        + tuple(s * t for s, t in zip(st, stride)))
    return xp.ascontiguousarray(view)  # a copy: the windows overlap, a view would alias


def _fold_arrays(xp, cols, size, kernel, stride, dilation, padding):
    nd = len(kernel)
    lead = cols.shape[:cols.ndim - 2 * nd]
    out = cols.shape[cols.ndim - nd:]
    canvas = xp.zeros(lead + tuple(n + b + a for n, (b, a) in zip(size, padding)), cols.dtype)
    for offset in np.ndindex(*kernel):  # one whole plane per window offset
        target = tuple(slice(o * d, o * d + s * (m - 1) + 1, s)
                       for o, d, s, m in zip(offset, dilation, stride, out))
        canvas[(Ellipsis,) + target] += cols[(Ellipsis,) + offset + (slice(None),) * nd]
    crop = tuple(slice(b, b + n) for n, (b, _) in zip(size, padding))
    return xp.ascontiguousarray(canvas[(Ellipsis,) + crop])


def _unfold_forward(xp, x, kernel, stride, dilation, padding, value):
    window = (kernel, stride, dilation, padding, value)
    if xp is np and (done := native_kernels.unfold(x, *window)) is not None:
        return done  # (the native loop returns None where it does not apply)
    return _unfold_arrays(xp, x, *window)


def _fold_forward(xp, cols, size, kernel, stride, dilation, padding):
    window = (size, kernel, stride, dilation, padding)
    if xp is np and (done := native_kernels.fold(cols, *window)) is not None:
        return done
    return _fold_arrays(xp, cols, *window)


def _infer_unfold(x, kernel, stride, dilation, padding, value):
    nd = len(kernel)
    if len(x.shape) < nd:
        raise ShapeError(f"op 'unfold': argument 0 has shape {describe(x.shape)}, fewer than "
                         f"the {nd} spatial axes of the kernel {tuple(kernel)}")
    size = tuple(x.shape[len(x.shape) - nd:])
    _check_fits("unfold", size, kernel, dilation, padding)
    out = _windows(size, kernel, stride, dilation, padding)
    return Aval(tuple(x.shape[:len(x.shape) - nd]) + tuple(kernel) + out, np.dtype(x.dtype))


def _infer_fold(cols, size, kernel, stride, dilation, padding):
    nd = len(kernel)
    expected = tuple(kernel) + _windows(size, kernel, stride, dilation, padding)
    rank = len(cols.shape)
    if rank < 2 * nd or tuple(cols.shape[rank - 2 * nd:]) != expected:
        raise ShapeError(f"op 'fold': argument 0 has shape {describe(cols.shape)}; windows of "
                         f"{tuple(kernel)} over {tuple(size)} must end in {describe(expected)}")
    return Aval(tuple(cols.shape[:rank - 2 * nd]) + tuple(size), np.dtype(cols.dtype))


UNFOLD = register(Op(
    "unfold", _unfold_forward, _infer_unfold,
    lambda g, out, x, kernel, stride, dilation, padding, value:
    (_fold(g, tuple(x.shape[len(x.shape) - len(kernel):]), kernel, stride, dilation, padding),),
    batch=batching.leading_axes_rule))
FOLD = register(Op(
    "fold", _fold_forward, _infer_fold,
    lambda g, out, cols, size, kernel, stride, dilation, padding:
    (_unfold(g, kernel, stride, dilation, padding),),
    batch=batching.leading_axes_rule))


def _unfold(x, kernel, stride, dilation, padding, value=0.0):
    """(..., *S) -> (..., *kernel, *out): the windows, each offset one plane."""
    if not builtins.any(b or a for b, a in padding):
        value = 0.0  # unused: one signature for batching and CSE
    return apply(UNFOLD, x, kernel=tuple(kernel), stride=tuple(stride),
                 dilation=tuple(dilation), padding=tuple(padding), value=value)


def _fold(cols, size, kernel, stride, dilation, padding):
    """(..., *kernel, *out) -> (..., *size): the adjoint of :func:`_unfold`."""
    return apply(FOLD, cols, size=tuple(size), kernel=tuple(kernel), stride=tuple(stride),
                 dilation=tuple(dilation), padding=tuple(padding))


# --- the filters applied to the windows: one primitive and its two gradients -------------------

# ``conv_windows(cols, w, b)``: y[..., o, *out] = Σ_{c, k} w[o, c, k] · cols[..., c, k, *out]
# + b[o], for windows as ``unfold`` lays them out and filters (O, C, *K). Its two gradients are
# primitives too, each the others' adjoint (as PyTorch's convolution and its two backward
# convolutions); they have no batching rule: they appear only in ∂ graphs of batched ones.

def _lead_rank(cols_rank, nd):
    return cols_rank - 2 * nd - 1


def _matrices(cols_shape, nd):
    """(samples, C·K, L): the windows of each sample as one matrix."""
    lead = _lead_rank(len(cols_shape), nd)
    return (math.prod(cols_shape[:lead]), math.prod(cols_shape[lead:len(cols_shape) - nd]),
            math.prod(cols_shape[len(cols_shape) - nd:]))


def _infer_conv_windows(cols, w, *bias):
    nd = len(w.shape) - 2
    rank = len(cols.shape)
    dtype = common_dtype("conv_windows", (cols, w, *bias))
    if nd < 1 or rank < 2 * nd + 1 or tuple(cols.shape[rank - 2 * nd - 1:rank - nd]) != \
            tuple(w.shape[1:]):
        raise ShapeError(f"op 'conv_windows': argument 0 (the windows) has shape "
                         f"{describe(cols.shape)} and argument 1 (the filters) "
                         f"{describe(w.shape)}; the windows must be (..., C, *kernel, *out) "
                         f"for filters (O, C, *kernel)")
    if bias and tuple(bias[0].shape) != (w.shape[0],):
        raise ShapeError(f"op 'conv_windows': argument 2 (the bias) has shape "
                         f"{describe(bias[0].shape)}; expected {describe((w.shape[0],))}")
    return Aval(tuple(cols.shape[:rank - 2 * nd - 1]) + (w.shape[0],)
                + tuple(cols.shape[rank - nd:]), dtype)


def _conv_windows_forward(xp, cols, w, *bias):
    nd, b = w.ndim - 2, bias[0] if bias else None
    if xp is np and (done := native_conv.product(cols, w, b, nd)) is not None:
        return done
    samples, window, length = _matrices(cols.shape, nd)
    lead, out = cols.shape[:_lead_rank(cols.ndim, nd)], cols.shape[cols.ndim - nd:]
    y = xp.matmul(w.reshape(w.shape[0], window), cols.reshape(lead + (window, length)))
    y = y.reshape(lead + (w.shape[0],) + out)
    return y if b is None else y + b.reshape((-1,) + (1,) * nd)


def _conv_windows_vjp(g, out, cols, w, *bias):
    nd = len(w.shape) - 2
    d_cols = apply(CONV_WINDOWS_INPUT_GRAD, g, w) if needs_grad(cols) else None
    d_w = apply(CONV_WINDOWS_WEIGHT_GRAD, cols, g) if needs_grad(w) else None
    if not bias:
        return d_cols, d_w
    rank = len(g.shape)  # the bias: summed over the samples and the output positions
    axes = tuple(range(rank - nd - 1)) + tuple(range(rank - nd, rank))
    return d_cols, d_w, reduce.sum(g, axis=axes) if needs_grad(bias[0]) else None


def _batch_conv_windows(op, items, attrs, out):
    (cols, cols_rows), (w, w_rows), *bias = items
    if not w_rows and not (bias and bias[0][1]):  # shared filters: any leading axes will do
        return apply(op, cols, w, *(b for b, _ in bias))
    # Filters per row: one matmul, broadcast over the rows, of (rows, 1.., O, C·K) and the
    # windows (.., C·K, L); then the bias, per row or not.
    rows = batching.row_count(w_rows or bias[0][1])
    filters = tuple(w.shape[1:]) if w_rows else tuple(w.shape)
    nd = len(filters) - 2
    per_row = tuple(cols.shape[1:]) if cols_rows else tuple(cols.shape)
    lead, spatial = per_row[:_lead_rank(len(per_row), nd)], per_row[len(per_row) - nd:]
    window, length = math.prod(filters[1:]), math.prod(spatial)
    matrix = shape.reshape(cols, ((rows,) if cols_rows else ()) + lead + (window, length))
    w2 = shape.reshape(w, ((rows,) + (1,) * len(lead) if w_rows else ()) + (filters[0], window))
    y = shape.reshape(linalg.matmul(w2, matrix), (rows,) + lead + (filters[0],) + spatial)
    if bias:
        b, b_rows = bias[0]
        y = y + shape.reshape(b, ((rows,) + (1,) * len(lead) if b_rows else ())
                              + (filters[0],) + (1,) * nd)
    return y


CONV_WINDOWS = register(Op("conv_windows", _conv_windows_forward, _infer_conv_windows,
                           _conv_windows_vjp, batch=_batch_conv_windows, promotes="all"))


def _infer_input_grad(g, w):
    nd = len(w.shape) - 2
    rank = len(g.shape)
    if nd < 1 or rank < nd + 1 or g.shape[rank - nd - 1] != w.shape[0]:
        raise ShapeError(f"op 'conv_windows_input_grad': argument 0 (the output gradient) has "
                         f"shape {describe(g.shape)}; expected (..., {w.shape[0]}, *out) for "
                         f"filters {describe(w.shape)}")
    return Aval(tuple(g.shape[:rank - nd - 1]) + tuple(w.shape[1:])
                + tuple(g.shape[rank - nd:]), common_dtype("conv_windows_input_grad", (g, w)))


def _input_grad_forward(xp, g, w):
    """∂cols = wᵀ · g, per sample."""
    nd = w.ndim - 2
    if xp is np and (done := native_conv.input_grad(g, w, nd)) is not None:
        return done
    lead, out = g.shape[:g.ndim - nd - 1], g.shape[g.ndim - nd:]
    matrix = w.reshape(w.shape[0], -1)
    d = xp.matmul(matrix.T, g.reshape(lead + (w.shape[0], math.prod(out))))
    return d.reshape(lead + w.shape[1:] + out)


def _input_grad_vjp(u, out, g, w):
    return (apply(CONV_WINDOWS, u, w) if needs_grad(g) else None,
            apply(CONV_WINDOWS_WEIGHT_GRAD, u, g) if needs_grad(w) else None)


CONV_WINDOWS_INPUT_GRAD = register(Op("conv_windows_input_grad", _input_grad_forward,
                                      _infer_input_grad, _input_grad_vjp))


def _infer_weight_grad(cols, g):
    nd = len(cols.shape) - len(g.shape)
    lead = _lead_rank(len(cols.shape), nd)
    if nd < 1 or lead < 0 or tuple(g.shape[:lead]) != tuple(cols.shape[:lead]) \
            or tuple(g.shape[lead + 1:]) != tuple(cols.shape[len(cols.shape) - nd:]):
        raise ShapeError(f"op 'conv_windows_weight_grad': argument 0 (the windows) has shape "
                         f"{describe(cols.shape)} and argument 1 (the output gradient) "
                         f"{describe(g.shape)}; expected (..., C, *kernel, *out) and "
                         f"(..., O, *out)")
    return Aval((g.shape[lead],) + tuple(cols.shape[lead:len(cols.shape) - nd]),
                common_dtype("conv_windows_weight_grad", (cols, g)))


def _weight_grad_forward(xp, cols, g):
    """∂w = Σ over samples of g · colsᵀ."""
    nd = cols.ndim - g.ndim
    if xp is np and (done := native_conv.weight_grad(cols, g, nd)) is not None:
        return done
    samples, window, length = _matrices(cols.shape, nd)
    out_channels = g.shape[_lead_rank(cols.ndim, nd)]
    d = xp.tensordot(g.reshape(samples, out_channels, length),
                     cols.reshape(samples, window, length), axes=([0, 2], [0, 2]))
    return d.reshape((out_channels,) + cols.shape[_lead_rank(cols.ndim, nd):cols.ndim - nd])


def _weight_grad_vjp(u, out, cols, g):
    return (apply(CONV_WINDOWS_INPUT_GRAD, g, u) if needs_grad(cols) else None,
            apply(CONV_WINDOWS, cols, u) if needs_grad(g) else None)


CONV_WINDOWS_WEIGHT_GRAD = register(Op("conv_windows_weight_grad", _weight_grad_forward,
                                       _infer_weight_grad, _weight_grad_vjp))


# --- arguments ------------------------------------------------------------------------------------

def _ints(name, argument, value, nd, minimum):
    """An int or a sequence of ``nd`` ints, each >= ``minimum``, as a tuple."""
    items = (value,) * nd if isinstance(value, _INTEGERS) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if items is None or len(items) != nd or not builtins.all(
            isinstance(v, _INTEGERS) and not isinstance(v, bool) for v in items):
        raise ArgumentError(f"{name}: {argument} must be an int or {nd} ints, got {value!r}")
    if builtins.any(v < minimum for v in items):
        raise ArgumentError(f"{name}: {argument} must be >= {minimum}, got {value!r}")
    return tuple(int(v) for v in items)


def _padding(name, padding, nd, kernel, dilation, stride):
    """((before, after), ...) per spatial axis from an int, ints, 'valid' or 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * nd
        if padding == "same":
            if builtins.any(s != 1 for s in stride):
                raise ArgumentError(f"{name}: padding='same' needs stride 1, got stride "
                                    f"{stride}")
            total = [d * (k - 1) for k, d in zip(kernel, dilation)]
            return tuple((t // 2, t - t // 2) for t in total)  # the odd one on the right
        raise ArgumentError(f"{name}: padding must be an int, {nd} ints, 'valid' or 'same', "
                            f"got {padding!r}")
    return tuple((p, p) for p in _ints(name, "padding", padding, nd, 0))


def _spatial_input(name, x, nd):
    """x's leading axes (() unbatched, (N,) batched) and its channel count."""
    rank = len(x.shape)
    if rank not in (nd + 1, nd + 2):
        spatial = {1: "L", 2: "H, W"}.get(nd, "D, H, W")
        raise ShapeError(f"{name}: input has shape {describe(x.shape)}; expected (N, C, "
                         f"{spatial}) or, unbatched, (C, {spatial})")
    return tuple(x.shape[:rank - nd - 1]), int(x.shape[rank - nd - 1])


def _check_groups(name, groups, channels, what):
    if not isinstance(groups, _INTEGERS) or isinstance(groups, bool) or groups < 1:
        raise ArgumentError(f"{name}: groups must be a positive int, got {groups!r}")
    for count, label in zip(channels, what):
        if count % groups:
            raise ArgumentError(f"{name}: groups={groups} does not divide the {count} {label}")
    return int(groups)


def _check_bias(name, bias, channels):
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ShapeError(f"{name}: bias has shape {describe(bias.shape)}; expected one per "
                         f"output channel, {describe((channels,))}")


def _add_bias(y, bias, nd):
    return y if bias is None else y + shape.reshape(bias, (bias.shape[0],) + (1,) * nd)


# --- convolutions -------------------------------------------------------------------------------

def _conv(name, nd, x, weight, bias, stride, padding, dilation, groups):
    lead, channels = _spatial_input(name, x, nd)
    if len(weight.shape) != nd + 2:
        raise ShapeError(f"{name}: weight has shape {describe(weight.shape)}; expected "
                         f"(out_channels, in_channels / groups, {nd} kernel size(s))")
    out_channels, group_channels = int(weight.shape[0]), int(weight.shape[1])
    kernel = tuple(int(k) for k in weight.shape[2:])
    groups = _check_groups(name, groups, (out_channels,), ("output channels (weight.shape[0])",))
    if channels != group_channels * groups:
        raise ShapeError(f"{name}: input of shape {describe(x.shape)} has {channels} channels, "
                         f"but weight of shape {describe(weight.shape)} with groups={groups} "
                         f"expects {group_channels * groups} (weight.shape[1] × groups)")
    _check_bias(name, bias, out_channels)
    stride = _ints(name, "stride", stride, nd, 1)
    dilation = _ints(name, "dilation", dilation, nd, 1)
    pads = _padding(name, padding, nd, kernel, dilation, stride)
    _check_fits(name, tuple(x.shape[len(x.shape) - nd:]), kernel, dilation, pads,
                what=f"the input {describe(x.shape)}")
    cols = _unfold(x, kernel, stride, dilation, pads)  # (*lead, C, *K, *out)
    if groups == 1:  # the product and the bias as one op (conv_windows)
        return apply(CONV_WINDOWS, cols, weight, *(() if bias is None else (bias,)))
    return _composed_product(cols, weight, bias, groups)


def _composed_product(cols, weight, bias, groups):
    """The product of the windows with the filters composed from matmul and reshapes: with
    groups, and the reference ``conv_windows`` is tested against."""
    nd = len(weight.shape) - 2
    out_channels, group_channels = int(weight.shape[0]), int(weight.shape[1])
    lead = tuple(cols.shape[:_lead_rank(len(cols.shape), nd)])
    out = tuple(cols.shape[len(cols.shape) - nd:])
    k, length = math.prod(weight.shape[2:]), math.prod(out)
    # one product per group, batched: (G, O/G, C/G·K) @ (*lead, G, C/G·K, L)
    w = shape.reshape(weight, (groups, out_channels // groups, group_channels * k))
    y = linalg.matmul(w, shape.reshape(cols, lead + (groups, group_channels * k, length)))
    return _add_bias(shape.reshape(y, lead + (out_channels,) + out), bias, nd)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's ``conv1d`` (a cross-correlation): ``x`` (N, C, L) or (C, L), ``weight``
    (O, C / groups, K), ``bias`` (O,); ``padding`` an int, 'valid' or 'same'."""
    return _conv("conv1d", 1, x, weight, bias, stride, padding, dilation, groups)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's ``conv2d``: ``x`` (N, C, H, W) or (C, H, W), ``weight`` (O, C / groups, kH,
    kW), ``bias`` (O,); ``stride``, ``padding``, ``dilation`` an int or a pair, ``padding``
    also 'valid' or 'same' (stride 1; an odd total padding puts the extra one after)."""
    return _conv("conv2d", 2, x, weight, bias, stride, padding, dilation, groups)


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """PyTorch's ``conv3d``: ``x`` (N, C, D, H, W) or (C, D, H, W), ``weight``
    (O, C / groups, kD, kH, kW) (windows on the NumPy/CuPy path: the native loops are 1-D and
    2-D)."""
    return _conv("conv3d", 3, x, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(name, nd, x, weight, bias, stride, padding, output_padding, groups,
                    dilation):
    lead, channels = _spatial_input(name, x, nd)
    if len(weight.shape) != nd + 2:
        raise ShapeError(f"{name}: weight has shape {describe(weight.shape)}; expected "
                         f"(in_channels, out_channels / groups, {nd} kernel size(s))")
    group_out = int(weight.shape[1])
    kernel = tuple(int(k) for k in weight.shape[2:])
    groups = _check_groups(name, groups, (channels,), ("input channels",))
    if int(weight.shape[0]) != channels:
        raise ShapeError(f"{name}: input of shape {describe(x.shape)} has {channels} channels, "
                         f"but weight of shape {describe(weight.shape)} expects "
                         f"{weight.shape[0]} (weight.shape[0])")
    out_channels = group_out * groups
    _check_bias(name, bias, out_channels)
    stride = _ints(name, "stride", stride, nd, 1)
    dilation = _ints(name, "dilation", dilation, nd, 1)
    pads = _ints(name, "padding", padding, nd, 0)
    extra = _ints(name, "output_padding", output_padding, nd, 0)
    if builtins.any(e >= s for e, s in zip(extra, stride)):
        raise ArgumentError(f"{name}: output_padding {extra} must be smaller than the stride "
                            f"{stride}")
    size_in = tuple(int(n) for n in x.shape[len(x.shape) - nd:])
    size = tuple((n - 1) * s - 2 * p + d * (k - 1) + e + 1
                 for n, s, p, d, k, e in zip(size_in, stride, pads, dilation, kernel, extra))
    if builtins.any(n <= 0 for n in size):
        raise ShapeError(f"{name}: input {describe(x.shape)} with padding {pads} gives an "
                         f"empty output {size}")
    k, length = math.prod(kernel), math.prod(size_in)
    # Wᵀ per group: (G, O/G·K, C/G) @ (*lead, G, C/G, L), then the windows added into place.
    w = shape.transpose(shape.reshape(weight, (groups, channels // groups, group_out * k)),
                        (0, 2, 1))
    if groups == 1:
        w = shape.reshape(w, (group_out * k, channels))
        xs = shape.reshape(x, lead + (channels, length))
    else:
        xs = shape.reshape(x, lead + (groups, channels // groups, length))
    cols = shape.reshape(linalg.matmul(w, xs), lead + (out_channels,) + kernel + size_in)
    y = _fold(cols, size, kernel, stride, dilation, tuple((p, p) for p in pads))
    return _add_bias(y, bias, nd)


def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """PyTorch's ``conv_transpose1d``: ``weight`` (C, O / groups, K); the gradient of
    ``conv1d`` with respect to its input."""
    return _conv_transpose("conv_transpose1d", 1, x, weight, bias, stride, padding,
                           output_padding, groups, dilation)


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """PyTorch's ``conv_transpose2d``: ``x`` (N, C, H, W) or (C, H, W), ``weight``
    (C, O / groups, kH, kW); output size (H - 1)·stride - 2·padding + dilation·(kH - 1) +
    output_padding + 1."""
    return _conv_transpose("conv_transpose2d", 2, x, weight, bias, stride, padding,
                           output_padding, groups, dilation)


# --- pooling ------------------------------------------------------------------------------------

def _pool_geometry(name, nd, x, kernel_size, stride, padding, dilation, ceil_mode):
    """(kernel, stride, dilation, padding per side) of a pooling window; ``ceil_mode`` adds
    padding after so that a last partial window counts (if it starts inside the input or the
    left padding, as in PyTorch)."""
    _spatial_input(name, x, nd)
    kernel = _ints(name, "kernel_size", kernel_size, nd, 1)
    stride = kernel if stride is None or stride == () else _ints(name, "stride", stride, nd, 1)
    dilation = _ints(name, "dilation", dilation, nd, 1)
    pads = _ints(name, "padding", padding, nd, 0)
    if builtins.any(2 * p > k for p, k in zip(pads, kernel)):
        raise ArgumentError(f"{name}: padding {pads} must be at most half the kernel size "
                            f"{kernel}")
    size = tuple(int(n) for n in x.shape[len(x.shape) - nd:])
    sides = [(p, p) for p in pads]
    _check_fits(name, size, kernel, dilation, sides, what=f"the input {describe(x.shape)}")
    if ceil_mode:
        for axis, (n, k, s, d, p) in enumerate(zip(size, kernel, stride, dilation, pads)):
            out = -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1
            if (out - 1) * s >= n + p:
                out -= 1
            sides[axis] = (p, p + builtins.max(0, (out - 1) * s + d * (k - 1) + 1 - n - 2 * p))
    return kernel, stride, dilation, tuple(sides)


def _window_axes(x, nd):
    rank = len(x.shape)
    return tuple(range(rank - nd, rank))  # the kernel axes of unfold(x)


def _max_pool(name, nd, x, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, dilation, sides = _pool_geometry(name, nd, x, kernel_size, stride, padding,
                                                     dilation, ceil_mode)
    dtype = np.dtype(x.dtype)
    lowest = -np.inf if dtype.kind == "f" else (
        int(np.iinfo(dtype).min) if dtype.kind in "iu" else False)
    cols = _unfold(x, kernel, stride, dilation, sides, lowest)
    return reduce.max(cols, axis=_window_axes(x, nd))


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The maximum of each window of ``x`` (N, C, L) or (C, L); ``stride`` defaults to the
    kernel size; padding counts as -inf. A tie shares the gradient evenly (PyTorch gives it
    to one element)."""
    return _max_pool("max_pool1d", 1, x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The maximum of each window of ``x`` (N, C, H, W) or (C, H, W), as PyTorch's
    ``max_pool2d`` (``ceil_mode`` included); a tie shares the gradient evenly."""
    return _max_pool("max_pool2d", 2, x, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The maximum of each window of ``x`` (N, C, D, H, W) or (C, D, H, W)."""
    return _max_pool("max_pool3d", 3, x, kernel_size, stride, padding, dilation, ceil_mode)


def _avg_pool(name, nd, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    kernel, stride, dilation, sides = _pool_geometry(name, nd, x, kernel_size, stride, padding,
                                                     1, ceil_mode)
    total = reduce.sum(_unfold(x, kernel, stride, dilation, sides), axis=_window_axes(x, nd))
    dtype = np.result_type(np.dtype(x.dtype), np.float32) if np.dtype(x.dtype).kind != "f" \
        else np.dtype(x.dtype)
    if divisor_override is not None:
        if not isinstance(divisor_override, _INTEGERS) or divisor_override <= 0:
            raise ArgumentError(f"{name}: divisor_override must be a positive int, got "
                                f"{divisor_override!r}")
        return total / dtype.type(divisor_override)
    if not builtins.any(b or a for b, a in sides) or (
            count_include_pad and sides == tuple((p, p) for p, _ in sides)):
        return total / dtype.type(math.prod(kernel))
    # Windows that reach into the padding: count the elements each one covers (the input, and
    # with count_include_pad the symmetric padding too, never the extra ceil_mode one).
    size = tuple(int(n) for n in x.shape[len(x.shape) - nd:])
    counted = np.ones(size)
    if count_include_pad:  # the symmetric padding counts: start from the padded extent
        counted = np.ones(tuple(n + 2 * b for n, (b, _) in zip(size, sides)))
        sides = tuple((0, a - b) for b, a in sides)
    counts = _unfold_arrays(np, counted, kernel, stride, dilation, sides, 0.0)
    return total / indexing._on_device_of(x, counts.sum(axis=tuple(range(nd))).astype(dtype))


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """The mean of each window of ``x`` (N, C, L) or (C, L), as PyTorch's ``avg_pool1d``."""
    return _avg_pool("avg_pool1d", 1, x, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, None)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean of each window of ``x`` (N, C, H, W) or (C, H, W), as PyTorch's
    ``avg_pool2d``: padding counts as zeros (``count_include_pad``: in the divisor too)."""
    return _avg_pool("avg_pool2d", 2, x, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean of each window of ``x`` (N, C, D, H, W) or (C, D, H, W)."""
    return _avg_pool("avg_pool3d", 3, x, kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


# --- resampling: products with small constant matrices ----------------------------------------

def _output_size(name, x, nd, size):
    sizes = (size,) * nd if size is None or isinstance(size, _INTEGERS) else tuple(size)
    if len(sizes) != nd:
        raise ArgumentError(f"{name}: output_size must be an int or {nd} values, got {size!r}")
    spatial = x.shape[len(x.shape) - nd:]
    out = tuple(int(n) if s is None else s for s, n in zip(sizes, spatial))
    if not builtins.all(isinstance(s, _INTEGERS) and s > 0 for s in out):
        raise ArgumentError(f"{name}: output sizes must be positive ints, got {size!r}")
    return tuple(int(s) for s in out)


def _along(x, matrix, axis_from_end, dtype):
    """``matrix`` (out, in) applied along axis -``axis_from_end`` of ``x``."""
    m = indexing._on_device_of(x, np.ascontiguousarray(matrix, dtype=dtype))
    if axis_from_end == 1:
        return linalg.matmul(x, m.T)
    if axis_from_end == 2:
        return linalg.matmul(m, x)
    moved = indexing.moveaxis(x, -axis_from_end, -1)
    return indexing.moveaxis(linalg.matmul(moved, m.T), -1, -axis_from_end)  # (3-D: D axis)


def _float_dtype(x):
    from ..backend import default_dtype

    dtype = np.dtype(x.dtype)
    return dtype if dtype.kind == "f" else default_dtype()


def _average_matrix(n, m):
    """(m, n): row i averages inputs [floor(i·n/m), ceil((i+1)·n/m)), as PyTorch's adaptive
    pooling."""
    a = np.zeros((m, n))
    for i in range(m):
        lo, hi = (i * n) // m, -(-((i + 1) * n) // m)
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def _adaptive_avg_pool(name, nd, x, output_size):
    _spatial_input(name, x, nd)
    out = _output_size(name, x, nd, output_size)
    dtype = _float_dtype(x)
    for axis in range(nd):
        n = int(x.shape[len(x.shape) - nd + axis])
        if n != out[axis]:
            x = _along(x, _average_matrix(n, out[axis]), nd - axis, dtype)
    return x


def adaptive_avg_pool1d(x, output_size):
    """Averages over ``output_size`` nearly equal windows of ``x`` (N, C, L) or (C, L)."""
    return _adaptive_avg_pool("adaptive_avg_pool1d", 1, x, output_size)


def adaptive_avg_pool2d(x, output_size):
    """Averages of ``x`` (N, C, H, W) or (C, H, W) over an ``output_size`` grid of nearly
    equal windows (an int, a pair; None keeps that axis), as PyTorch's."""
    return _adaptive_avg_pool("adaptive_avg_pool2d", 2, x, output_size)


def _linear_matrix(n, m, scale, align_corners):
    """(m, n) linear interpolation weights, PyTorch's source coordinates."""
    a = np.zeros((m, n))
    dst = np.arange(m, dtype=np.float64)
    if align_corners:
        src = dst * ((n - 1) / (m - 1) if m > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    frac = src - lo
    np.add.at(a, (np.arange(m), lo), 1.0 - frac)
    np.add.at(a, (np.arange(m), hi), frac)
    return a


_MODES = {"nearest": 1, "nearest-exact": 1, "linear": 1, "bilinear": 2, "area": 1}


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """PyTorch's ``interpolate`` for ``x`` of shape ``(N, C, *spatial)``: ``size`` or
    ``scale_factor`` (an int/float or one per spatial axis); ``mode`` "nearest" (PyTorch's legacy rule
    floor(dst · scale)), "nearest-exact", "linear" (1 spatial axis), "bilinear" (2), or
    "area" (adaptive average pooling). ``align_corners`` only for the linear modes. With a
    ``scale_factor`` the source coordinates use 1 / scale_factor, as PyTorch does. The result
    has ``x``'s dtype: the linear and area modes round integers half up, as PyTorch's uint8
    kernels do, so an image stays an image."""
    name = "interpolate"
    if mode not in _MODES:
        raise ArgumentError(f"{name}: mode must be one of {', '.join(map(repr, _MODES))}, got "
                            f"{mode!r}")
    nd = len(x.shape) - 2
    if nd < 1 or (mode == "linear" and nd != 1) or (mode == "bilinear" and nd != 2):
        wanted = {"linear": "3-D (N, C, L)", "bilinear": "4-D (N, C, H, W)"}.get(
            mode, "(N, C, *spatial) with at least one spatial axis")
        raise ShapeError(f"{name}: mode {mode!r} needs {wanted} input, got shape "
                         f"{describe(x.shape)}")
    linear = mode in ("linear", "bilinear")
    if align_corners is not None and not linear:
        raise ArgumentError(f"{name}: align_corners applies only to the linear modes, not "
                            f"{mode!r}")
    if (size is None) == (scale_factor is None):
        raise ArgumentError(f"{name}: give exactly one of size and scale_factor")
    spatial = tuple(int(n) for n in x.shape[2:])
    if size is not None:
        out = _output_size(name, x, nd, size)
        scales = tuple(np.float32(n) / np.float32(m) if not linear else n / m
                       for n, m in zip(spatial, out))
    else:
        factors = (scale_factor,) * nd if np.ndim(scale_factor) == 0 else tuple(scale_factor)
        if len(factors) != nd or not builtins.all(
                isinstance(f, (_INTEGERS, float, np.floating)) and 0 < f < math.inf
                for f in factors):
            raise ArgumentError(f"{name}: scale_factor must be finite and positive, one or "
                                f"{nd} numbers, got {scale_factor!r}")
        out = tuple(int(math.floor(n * f)) for n, f in zip(spatial, factors))
        if not builtins.all(out):
            raise ShapeError(f"{name}: scale_factor {scale_factor!r} gives an empty output "
                             f"{out} from {spatial}")
        scales = tuple(1.0 / f for f in factors)
    if mode != "area" and not linear:
        return _nearest(x, mode, spatial, out, scales)
    dtype = np.dtype(x.dtype)
    if mode == "area":
        x = _adaptive_avg_pool(name, nd, x, out)
    else:
        for axis, (n, m, scale) in enumerate(zip(spatial, out, scales)):
            x = _along(x, _linear_matrix(n, m, scale, bool(align_corners)), nd - axis,
                       _float_dtype(x))
    return x if dtype.kind == "f" else elementwise.astype(elementwise.floor(x + 0.5), dtype)


def _nearest(x, mode, spatial, out, scales):
    nd = len(spatial)
    for axis, (n, m, scale) in enumerate(zip(spatial, out, scales)):
        # PyTorch's index arithmetic, in float32 as its kernels do it
        dst = np.arange(m, dtype=np.float32) + np.float32(0.5 if mode == "nearest-exact" else 0.0)
        src = np.minimum(np.floor(dst * np.float32(scale)).astype(np.int64), n - 1)
        if m != n or (src != np.arange(n)).any():
            x = indexing.take(x, src, axis=len(x.shape) - (nd - axis))
    return x


# --- PyTorch's unfold and fold ----------------------------------------------------------------

def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """PyTorch's ``unfold`` (im2col): ``x`` (N, C, H, W) -> (N, C·kH·kW, L), column l the
    window at output position l, entries in (c, kh, kw) order."""
    lead, channels = _spatial_input("unfold", x, 2)
    kernel = _ints("unfold", "kernel_size", kernel_size, 2, 1)
    dilation = _ints("unfold", "dilation", dilation, 2, 1)
    stride = _ints("unfold", "stride", stride, 2, 1)
    pads = tuple((p, p) for p in _ints("unfold", "padding", padding, 2, 0))
    _check_fits("unfold", tuple(x.shape[-2:]), kernel, dilation, pads,
                what=f"the input {describe(x.shape)}")
    cols = _unfold(x, kernel, stride, dilation, pads)  # (*lead, C, kH, kW, outH, outW)
    return shape.reshape(cols, lead + (channels * math.prod(kernel), math.prod(cols.shape[-2:])))


def fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """PyTorch's ``fold`` (col2im), the adjoint of :func:`unfold`: (N, C·kH·kW, L) ->
    (N, C, H, W) with ``output_size`` (H, W), overlapping entries summed."""
    size = _ints("fold", "output_size", output_size, 2, 1)
    kernel = _ints("fold", "kernel_size", kernel_size, 2, 1)
    dilation = _ints("fold", "dilation", dilation, 2, 1)
    stride = _ints("fold", "stride", stride, 2, 1)
    pads = tuple((p, p) for p in _ints("fold", "padding", padding, 2, 0))
    _check_fits("fold", size, kernel, dilation, pads, what=f"output_size {size}")
    out = _windows(size, kernel, stride, dilation, pads)
    k = math.prod(kernel)
    rank = len(cols.shape)
    if rank not in (2, 3) or cols.shape[-2] % k or cols.shape[-1] != math.prod(out):
        raise ShapeError(f"fold: argument 0 has shape {describe(cols.shape)}; expected "
                         f"(N, C·{k}, {math.prod(out)}) for kernel {kernel} over {size}")
    lead = tuple(cols.shape[:rank - 2])
    grid = shape.reshape(cols, lead + (cols.shape[-2] // k,) + kernel + out)
    return _fold(grid, size, kernel, stride, dilation, pads)


__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "max_pool1d",
           "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d", "interpolate", "unfold", "fold"]
