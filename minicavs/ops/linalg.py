"""Matrix product with NumPy's rules: 1-D operands are vectors, leading dimensions batch and
broadcast. On CuPy this is cuBLAS; on NumPy, the BLAS NumPy was built with."""

import numpy as np

from . import batching, elementwise, shape
from .. import backend
from ..cpu import products as native_products
from ..cuda import blas
from .registry import (Aval, Op, apply, broadcast_shapes, common_dtype, describe, needs_grad,
                       register)
from .rows import FULL, intersect, is_empty
from ..errors import GraphError, ShapeError


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
    # (a product for an input that needs no gradient — data, an image batch — is skipped)
    grad_a = grad_b = None
    if needs_grad(a):
        grad_a = elementwise.unbroadcast(matmul(g2, _swap_last(b2)), a2_shape)
        grad_a = shape.reshape(grad_a, tuple(a.shape))
    if needs_grad(b) and len(b2_shape) == 2 and len(a2_shape) > 2:
        # A weight matrix shared over a batch: one large GEMM instead of a batched one and a sum.
        k, n = b2_shape
        rows = int(np.prod(a2_shape[:-1]))  # not -1: that is ambiguous when k or n is 0
        grad_b = matmul(_swap_last(shape.reshape(a2, (rows, k))), shape.reshape(g2, (rows, n)))
    elif needs_grad(b):
        grad_b = elementwise.unbroadcast(matmul(_swap_last(a2), g2), b2_shape)
    return grad_a, None if grad_b is None else shape.reshape(grad_b, tuple(b.shape))


def _batch_matmul(op, items, attrs, out):
    (a, da), (b, db) = items
    a_rank = len(a.shape) - (1 if da else 0)
    b_rank = len(b.shape) - (1 if db else 0)
    if da and not db:  # per-vertex @ shared: NumPy's rules batch over the leading axis
        if b_rank <= 2:
            return apply(op, a, b)
        # a shared stack of matrices: the vertex axis ahead of the stack's axes, which
        # broadcast against the row's (a vector is a (1, k) matrix)
        rows = batching.row_count(da)
        ones = (1,) * (b_rank - max(a_rank, 2))
        a4 = shape.reshape(a, (rows,) + ones + ((1,) if a_rank == 1 else ()) + a.shape[1:])
        return shape.reshape(apply(op, a4, b), (rows,) + tuple(out.shape))
    if db and not da:  # shared @ per-vertex
        if b_rank == 1:  # A @ x for each vertex is X @ Aᵀ for the task
            if a_rank > 2:
                raise GraphError("op 'matmul': a shared stack of matrices times a per-vertex "
                                 "vector has no batching rule; reshape the stack to 2-D")
            a_t = a if a_rank == 1 else shape.transpose(a)
            return apply(op, b, a_t)
        return apply(op, a, b)
    rows = batching.row_count(da)
    a3 = shape.reshape(a, (rows, 1) + a.shape[1:]) if a_rank == 1 else a
    b3 = shape.reshape(b, (rows,) + b.shape[1:] + (1,)) if b_rank == 1 else b
    return shape.reshape(apply(op, a3, b3), (rows,) + tuple(out.shape))


def _zero_rows_matmul(ranges):
    a, b = ranges
    return a if a is not None and b is None else FULL  # x·W: a zero row of x gives a zero row


def _matmul_on_nonzero_rows(xp, node, args, range_of, within):
    """X·W (X per row, W shared) on the rows where X is nonzero and the readers look (the
    others are zero; rows outside ``within``, which no reader looks at, are left unwritten);
    Xᵀ·G (both per row) summed over the rows where both are nonzero. Where X (or G) is a
    concatenation of columns whose parts are nonzero on different rows (a gate gradient zero
    at the leaves), each block of parts runs on its own rows."""
    a, b = node.inputs
    if (batching.row_domain(a.shape) and not batching.row_domain(b.shape)
            and not batching.has_symbolic_size(b.shape)):
        x, w = args
        n = x.shape[0]
        blocks = _column_blocks(a, range_of, within, n)
        if blocks is not None:
            return _blocks_times_shared(xp, node, x, w, blocks, n)
        lo, hi = range_of(a) if within is None else intersect(range_of(a), within)
        if not (is_empty((lo, hi)) or hi - lo < n):
            return None
        if is_empty((lo, hi)):
            return xp.zeros(x.shape[:1] + tuple(node.shape[1:]), node.dtype), (lo, hi)
        out = xp.empty(x.shape[:1] + tuple(node.shape[1:]), node.dtype)
        lo, hi = max(lo, 0), min(hi, n)
        # only the rows read outside the product are cleared (it writes the others): an
        # embedding's gradient at the internal vertices of a tree is half the rows, unread
        read = (0, n) if within is None else (max(within[0], 0), min(within[1], n))
        out[read[0]:lo] = 0
        out[max(hi, read[0]):read[1]] = 0
        _product(xp, x[lo:hi], w, out=out[lo:hi])
        return out, (lo, hi)
    if (a.kind == "op" and a.op is shape.TRANSPOSE and a.attrs["axes"] == (1, 0)
            and batching.row_domain(a.inputs[0].shape)
            and batching.row_domain(b.shape) == batching.row_domain(a.inputs[0].shape)):
        xt, g = args
        n = g.shape[0]
        blocks = _column_blocks(b, range_of, range_of(a.inputs[0]), n)
        if blocks is not None:
            out = xp.empty(node.shape, node.dtype)
            for c0, c1, (lo, hi) in blocks:
                if hi <= lo:
                    out[:, c0:c1] = 0
                else:
                    out[:, c0:c1] = _product(xp, xt[:, lo:hi], g[lo:hi, c0:c1])
            return out, None
        lo, hi = intersect(range_of(a.inputs[0]), range_of(b))
        lo, hi = max(lo, 0), min(hi, n)
        if hi - lo >= n:
            return None
        if hi <= lo:
            return xp.zeros(node.shape, node.dtype), None
        return _product(xp, xt[:, lo:hi], g[lo:hi]), None
    return None


def _column_blocks(x, range_of, within, n):
    """Where ``x`` (per row, 2-D) concatenates columns whose parts are nonzero on different
    rows: ``[(first column, stop, (lo, hi))]``, neighbouring parts of the same rows joined,
    each part's rows cut to ``within`` and to the ``n`` rows. Else None (one block)."""
    if x.kind != "op" or x.op is not shape.CONCAT or x.attrs["axis"] != 1 or len(x.shape) != 2:
        return None
    blocks, start = [], 0
    for part in x.inputs:
        lo, hi = range_of(part) if within is None else intersect(range_of(part), within)
        rows = (max(lo, 0), min(hi, n))
        if rows[1] <= rows[0]:
            rows = (0, 0)
        stop = start + part.shape[1]
        if blocks and blocks[-1][2] == rows:
            blocks[-1] = (blocks[-1][0], stop, rows)
        else:
            blocks.append((start, stop, rows))
        start = stop
    return blocks if len({rows for *_, rows in blocks}) > 1 else None


def _blocks_times_shared(xp, node, x, w, blocks, n):
    """X·W as the sum over X's column blocks of ``X[rows, block] · W[block]``, each on its own
    rows: the rows outside every block are zero; returns the product and its nonzero rows."""
    lo = min((r0 for *_, (r0, r1) in blocks if r1 > r0), default=0)
    hi = max((r1 for *_, (r0, r1) in blocks if r1 > r0), default=0)
    if hi <= lo:
        return xp.zeros((n,) + tuple(node.shape[1:]), node.dtype), (0, 0)
    out = xp.empty((n,) + tuple(node.shape[1:]), node.dtype)
    out[:lo] = 0
    out[hi:] = 0
    first = next((b for b in blocks if b[2] == (lo, hi)), None)  # (one block can write)
    if first is None:
        out[lo:hi] = 0
    else:
        _product(xp, x[lo:hi, first[0]:first[1]], w[first[0]:first[1]], out=out[lo:hi])
    for c0, c1, (r0, r1) in blocks:
        if r1 > r0 and (c0, c1, (r0, r1)) != first:
            out[r0:r1] += _product(xp, x[r0:r1, c0:c1], w[c0:c1])
    return out, (lo, hi)


def _product(xp, a, b, out=None):
    """``a @ b``: a large product of NumPy matrices on the native team (cpu/products.py: the
    process's cores, one-thread gemms), of CuPy matrices one cuBLAS call (cuda/blas.py), else
    ``xp.matmul``."""
    if xp is np:
        done = native_products.matmul(a, b, out)
        if done is not None:
            return done
    elif a.ndim == b.ndim == 2:
        return blas.matmul(xp, a, b, out)
    return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)


def _matmul_into(a, b, out):
    xp = backend.get_array_module(out)
    try:
        _product(xp, a, b, out=out)
    except (ValueError, TypeError):  # e.g. 1-D operands, whose result NumPy won't write
        out[...] = xp.matmul(a, b)


MATMUL = register(Op("matmul", _product, _infer_matmul, _matmul_vjp,
                     batch=_batch_matmul, into=_matmul_into, zero_rows=_zero_rows_matmul,
                     on_nonzero_rows=_matmul_on_nonzero_rows, native="product",
                     promotes=(0, 1)))


def matmul(a, b):
    return apply(MATMUL, a, b)


# --- x·W + b as one node ----------------------------------------------------------------------

def _linear_forward(xp, x, weight, bias):
    out = _product(xp, x, weight)
    out += bias
    return out


def _infer_linear(x, weight, bias):
    product = _infer_matmul(x, weight)
    p, q = tuple(product.shape), tuple(bias.shape)
    if len(q) > len(p) or any(d not in (1, e) for d, e in zip(q[::-1], p[::-1])):
        raise ShapeError(f"op 'linear': the bias has shape {describe(bias.shape)}, which does "
                         f"not broadcast into the product's {describe(product.shape)}")
    return Aval(tuple(product.shape), common_dtype("linear", (x, weight, bias)))


def _linear_vjp(g, out, x, weight, bias):
    grad_x, grad_w = _matmul_vjp(g, out, x, weight)
    return grad_x, grad_w, elementwise.unbroadcast(g, tuple(bias.shape))


def _batch_linear(op, items, attrs, out):
    """The product and the sum, each by its own rule."""
    (x, dx), (w, dw), (b, db) = items
    product = _batch_matmul(MATMUL, [(x, dx), (w, dw)], {}, out) if dx or dw \
        else matmul(x, w)
    return batching.elementwise_rule(elementwise.ADD, [(product, dx or dw), (b, db)], {}, out)


def _expand_linear(x, weight, bias):
    return elementwise.add(matmul(x, weight), bias)


# One node for eager code and automatic batching (nn.Linear, an MLP per word: half the nodes
# of a product and a sum); traced, it is the product and the sum (``expand``), which fusion
# and the backends see as before.
def _linear_into(x, weight, bias, out):
    _matmul_into(x, weight, out)  # (a batch's rows of its slab: no copy of the result)
    out += bias


LINEAR = register(Op("linear", _linear_forward, _infer_linear, _linear_vjp,
                     batch=_batch_linear, promotes="all", expand=_expand_linear,
                     into=_linear_into, argument_names=("x", "weight", "bias")))


def linear(x, weight, bias=None):
    """``x @ weight + bias`` with ``weight`` of shape (in, out); one op (``LINEAR``)."""
    if bias is None:
        return matmul(x, weight)
    return apply(LINEAR, x, weight, bias)
