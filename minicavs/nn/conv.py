"""Convolution and pooling layers, PyTorch's names and layouts: ``Conv1d``, ``Conv2d``,
``ConvTranspose1d``, ``ConvTranspose2d``, ``MaxPool2d``, ``AvgPool2d``,
``AdaptiveAvgPool2d``, ``Upsample`` and ``Flatten``. Each is composed from ``ops/conv.py``,
so it also works inside a vertex cell, where an input is one vertex's (C, H, W).

Weights are stored as PyTorch stores them — (out, in / groups, *kernel); transposed
convolutions (in, out / groups, *kernel) — and start as PyTorch's do: U(-b, b) with
b = 1 / sqrt(fan_in), for the weight and the bias.
"""

import math

import numpy as np

from .. import ops
from ..autodiff import Parameter
from ..errors import ArgumentError
from . import init
from .module import Module


def _pair(name, value, nd):
    items = (value,) * nd if isinstance(value, (int, np.integer)) else tuple(value)
    if len(items) != nd or not all(isinstance(v, (int, np.integer)) and v > 0 for v in items):
        raise ArgumentError(f"{name}: kernel_size must be a positive int or {nd} of them, got "
                            f"{value!r}")
    return tuple(int(v) for v in items)


def _channels(name, in_channels, out_channels, groups):
    for label, value in (("in_channels", in_channels), ("out_channels", out_channels),
                         ("groups", groups)):
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ArgumentError(f"{name}: {label} must be a positive int, got {value!r}")
    for label, value in (("in_channels", in_channels), ("out_channels", out_channels)):
        if value % groups:
            raise ArgumentError(f"{name}: groups={groups} does not divide {label}={value}")


class _ConvNd(Module):
    _transposed = False

    def __init__(self, nd, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, dtype, output_padding=0):
        name = type(self).__name__
        _channels(name, in_channels, out_channels, groups)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(name, kernel_size, nd)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.output_padding = int(groups), output_padding
        if self._transposed:
            shape = (self.in_channels, self.out_channels // self.groups) + self.kernel_size
        else:
            shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        bound = 1.0 / math.sqrt(shape[1] * math.prod(self.kernel_size))
        self.weight = Parameter(init.uniform(shape, -bound, bound, dtype))
        self.bias = Parameter(init.uniform((self.out_channels,), -bound, bound, dtype)) \
            if bias else None

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding!r})")


class _Conv(_ConvNd):
    op = None  # ops.conv1d or ops.conv2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, dtype=None):
        super().__init__(self.nd, in_channels, out_channels, kernel_size, stride, padding,
                         dilation, groups, bias, dtype)

    def forward(self, x):
        return type(self).op(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                             self.groups)


class _ConvTranspose(_ConvNd):
    _transposed = True
    op = None  # ops.conv_transpose1d or ops.conv_transpose2d

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, dtype=None):
        super().__init__(self.nd, in_channels, out_channels, kernel_size, stride, padding,
                         dilation, groups, bias, dtype, output_padding)

    def forward(self, x):
        return type(self).op(x, self.weight, self.bias, self.stride, self.padding,
                             self.output_padding, self.groups, self.dilation)


class Conv1d(_Conv):
    """``conv1d`` with a learned weight (out, in / groups, k) and bias (out,)."""
    nd, op = 1, staticmethod(ops.conv1d)


class Conv2d(_Conv):
    """``conv2d`` with a learned weight (out, in / groups, kH, kW) and bias (out,)."""
    nd, op = 2, staticmethod(ops.conv2d)


class ConvTranspose1d(_ConvTranspose):
    """``conv_transpose1d`` with a learned weight (in, out / groups, k) and bias (out,)."""
    nd, op = 1, staticmethod(ops.conv_transpose1d)


class ConvTranspose2d(_ConvTranspose):
    """``conv_transpose2d`` with a learned weight (in, out / groups, kH, kW) and bias (out,)."""
    nd, op = 2, staticmethod(ops.conv_transpose2d)


class _Apply(Module):
    """A parameterless layer: ``fn(x, **options)``."""
    fn = None

    def __init__(self, **options):
        self.options = options

    def forward(self, x):
        return type(self).fn(x, **self.options)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({args})"


class MaxPool2d(_Apply):
    """``max_pool2d``; ``stride`` defaults to the kernel size."""
    fn = staticmethod(ops.max_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, ceil_mode=ceil_mode)


class AvgPool2d(_Apply):
    """``avg_pool2d``; ``stride`` defaults to the kernel size."""
    fn = staticmethod(ops.avg_pool2d)

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__(kernel_size=kernel_size, stride=stride, padding=padding,
                         ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                         divisor_override=divisor_override)


class AdaptiveAvgPool2d(_Apply):
    """``adaptive_avg_pool2d`` to ``output_size``."""
    fn = staticmethod(ops.adaptive_avg_pool2d)

    def __init__(self, output_size):
        super().__init__(output_size=output_size)


class Upsample(_Apply):
    """``interpolate`` by ``size`` or ``scale_factor``."""
    fn = staticmethod(ops.interpolate)

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None):
        super().__init__(size=size, scale_factor=scale_factor, mode=mode,
                         align_corners=align_corners)


class Flatten(_Apply):
    """Axes ``start_dim`` to ``end_dim`` merged (default: all but the first)."""
    fn = staticmethod(lambda x, start_dim, end_dim: ops.flatten(x, start_dim, end_dim))

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__(start_dim=start_dim, end_dim=end_dim)


__all__ = ["Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "Upsample", "Flatten"]
