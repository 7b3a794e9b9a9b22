"""Matrix product with NumPy's rules: 1-D operands are vectors, leading dimensions batch and
broadcast. On CuPy this is cuBLAS; on NumPy, the BLAS NumPy was built with."""

import numpy as np

from . import elementwise, shape
from .registry import Aval, Op, apply, broadcast_shapes, common_dtype, describe, register
from ..errors import ShapeError


def _as_matrices(a_shape, b_shape):
    """Shapes with 1-D operands promoted to matrices, as NumPy's matmul does."""
    a2 = tuple(a_shape) if len(a_shape) > 1 else (1,) + tuple(a_shape)
    b2 = tuple(b_shape) if len(b_shape) > 1 else tuple(b_shape) + (1,)
    return a2, b2


def _infer_matmul(a, b):
    if len(a.shape) == 0 or len(b.shape) == 0:
        raise ShapeError(f"op 'matmul': arguments must have at least one dimension, got shapes "
                         f"{describe(a.shape)} and {describe(b.shape)}")
    a2, b2 = _as_matrices(a.shape, b.shape)
    if a2[-1] != b2[-2]:
        raise ShapeError(f"op 'matmul': argument 0 has shape {describe(a.shape)} and argument 1 "
                         f"has shape {describe(b.shape)}; the inner dimensions {a2[-1]} and "
                         f"{b2[-2]} differ")
    batch = broadcast_shapes("matmul", [Aval(a2[:-2], None), Aval(b2[:-2], None)])
    out = batch + (a2[-2],) * (len(a.shape) > 1) + (b2[-1],) * (len(b.shape) > 1)
    return Aval(out, common_dtype("matmul", (a, b)))


def _swap_last(x):
    axes = list(range(len(x.shape)))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return shape.transpose(x, axes)


def _matmul_vjp(g, out, a, b):
    a2_shape, b2_shape = _as_matrices(a.shape, b.shape)
    a2, b2 = shape.reshape(a, a2_shape), shape.reshape(b, b2_shape)
    g2 = shape.reshape(g, tuple(out.shape[:len(out.shape) - (len(a.shape) > 1) - (len(b.shape) > 1)])
                       + (a2_shape[-2], b2_shape[-1]))
    grad_a = elementwise.unbroadcast(matmul(g2, _swap_last(b2)), a2_shape)
    if len(b2_shape) == 2 and len(a2_shape) > 2:
        # A weight matrix shared over a batch: one large GEMM instead of a batched one and a sum.
        k, n = b2_shape
        rows = int(np.prod(a2_shape[:-1]))  # not -1: that is ambiguous when k or n is 0
        grad_b = matmul(_swap_last(shape.reshape(a2, (rows, k))), shape.reshape(g2, (rows, n)))
    else:
        grad_b = elementwise.unbroadcast(matmul(_swap_last(a2), g2), b2_shape)
    return shape.reshape(grad_a, tuple(a.shape)), shape.reshape(grad_b, tuple(b.shape))


MATMUL = register(Op("matmul", lambda xp, a, b: xp.matmul(a, b), _infer_matmul, _matmul_vjp))


def matmul(a, b):
    return apply(MATMUL, a, b)
