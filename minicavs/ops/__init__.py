"""The op library. Primitives live in the modules below, one definition each (see
``registry.py``); composites are written with them. Everything here works on eager Tensors,
on Symbols while tracing, and on plain arrays (which run eagerly)."""

from .registry import OPS, Aval, Op, apply, result_dtype
from .elementwise import (abs, add, astype, ceil, cos, div, equal, erf, exp, expm1, floor,
                          greater, greater_equal, isfinite, isinf, isnan, less, less_equal, log,
                          log1p, logical_and, logical_not, logical_or, logical_xor, maximum,
                          minimum, mul, neg, not_equal, pow, relu, rint, rsqrt, sigmoid, sign,
                          sin, sqrt, sub, tanh, unbroadcast, where)
from .reduce import (add_n, all, any, argmax, argmin, cumsum, logsumexp, max, mean, min, prod, std,
                     sum, var)
from .shape import (broadcast_to, concat, expand_dims, flatten, pad, pad_axis, repeat, reshape,
                    slice_axis, split, squeeze, stack, tile, transpose, tril, triu)
from .linalg import linear, matmul
from .index import embedding, one_hot, scatter_add_rows, take_rows
from .indexing import flip, gather, masked_fill, moveaxis, roll, take
from .activations import (clip, elu, gelu, hardtanh, leaky_relu, log_softmax, silu, softmax,
                          softplus)
from .loss import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy,
                   nll_loss, softmax_cross_entropy)
from .composite import lstm_gates
from .cells import lstm_cell, lstm_step
from .arithmetic import (allclose, copysign, floor_divide, fmod, isclose, mod, remainder,
                         trunc)
from .bitwise import (bitwise_and, bitwise_not, bitwise_or, bitwise_xor, left_shift,
                      right_shift)
from .sorting import (SortResult, argsort, put_along_axis_add, sort, take_along_axis, topk,
                      unique)
from .scan import cummax, cummin, cumprod
from .scattering import scatter, scatter_add, scatter_reduce
from .contraction import einsum
from .conv import (adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, avg_pool3d,
                   conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, fold,
                   interpolate, max_pool1d, max_pool2d, max_pool3d, unfold)
from .operators import OperatorMixin

PRIMITIVES = sorted(OPS)


def round(x, decimals=0):  # noqa: A001 (mirrors numpy.round)
    """Round half to even (as NumPy), to ``decimals`` places; the gradient is zero."""
    if decimals == 0:
        return rint(x)
    scale = 10.0 ** decimals
    return rint(x * scale) / scale
