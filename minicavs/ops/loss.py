"""Softmax cross-entropy with integer labels, computed with a stable log-sum-exp."""

import numpy as np

from . import batching, composite, index
from .registry import Aval, Op, apply, describe, register, require_float, require_int
from ..errors import ArgumentError, IndexRangeError, ShapeError


def _xent_forward(xp, logits, labels):
    num_classes = logits.shape[-1]
    low, high = index._index_bounds(labels) if labels.size else (0, -1)  # one sync on CuPy
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        where = tuple(int(i[0]) for i in (labels == bad).nonzero())
        raise IndexRangeError(f"op 'softmax_cross_entropy': label {bad} at position {where} is "
                              f"out of range for {num_classes} classes")
    shifted = logits - xp.max(logits, axis=-1, keepdims=True)
    picked = xp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
    xp.exp(shifted, out=shifted)  # in place: over a vocabulary, every pass counts
    return xp.log(xp.sum(shifted, axis=-1)) - picked


def _infer_xent(logits, labels):
    require_float("softmax_cross_entropy", logits, 0)
    require_int("softmax_cross_entropy", labels, 1)
    if len(logits.shape) == 0 or tuple(logits.shape[:-1]) != tuple(labels.shape) \
            or logits.shape[-1] == 0:
        raise ShapeError(f"op 'softmax_cross_entropy': argument 0 (logits) has shape "
                         f"{describe(logits.shape)} and argument 1 (labels) has shape "
                         f"{describe(labels.shape)}; expected labels of shape "
                         f"{describe(tuple(logits.shape[:-1]))} and at least one class")
    return Aval(tuple(labels.shape), np.dtype(logits.dtype))


SOFTMAX_CROSS_ENTROPY = register(Op(
    "softmax_cross_entropy", _xent_forward, _infer_xent,
    lambda g, out, logits, labels: (apply(SOFTMAX_CROSS_ENTROPY_GRAD, logits, labels, g), None),
    nondiff_args=(1,), batch=batching.leading_axes_rule))


# The gradient (softmax(logits) - onehot(labels)) * g is a primitive of its own: over a
# vocabulary-sized softmax it is the hot loop of a language model, and as one op it takes five
# passes over the logits and one allocation, where composing it from primitives takes a dozen.
# It has no batching rule: it appears only in ∂F, which is derived from the batched F.
def _xent_grad_forward(xp, logits, labels, g):
    probs = logits - xp.max(logits, axis=-1, keepdims=True)
    xp.exp(probs, out=probs)
    probs *= (g / xp.sum(probs, axis=-1))[..., None]
    rows = probs.reshape(-1, logits.shape[-1])
    rows[xp.arange(rows.shape[0]), labels.reshape(-1)] -= g.reshape(-1)
    return probs


def _xent_grad_vjp(u, out, logits, labels, g):
    """Second derivatives: with p = softmax(logits), d[(p - y) g]/d logits is
    g (diag(p) - p pᵀ), which is symmetric; d/dg is (p - y)."""
    from . import reduce, shape
    probs = composite.softmax(logits, axis=-1)
    target = index.one_hot(labels, logits.shape[-1], logits.dtype)
    pu = probs * u
    d_logits = shape.expand_dims(g, -1) * (pu - probs * reduce.sum(pu, axis=-1, keepdims=True))
    return d_logits, None, reduce.sum((probs - target) * u, axis=-1)


SOFTMAX_CROSS_ENTROPY_GRAD = register(Op(
    "softmax_cross_entropy_grad", _xent_grad_forward,
    lambda logits, labels, g: (_infer_xent(logits, labels), Aval(tuple(logits.shape),
                                                                  np.dtype(logits.dtype)))[1],
    _xent_grad_vjp, nondiff_args=(1,)))


def softmax_cross_entropy(logits, labels, reduction="mean"):
    """Cross-entropy of ``softmax(logits)`` against integer ``labels``.

    ``logits``: (..., C); ``labels``: (...) integers in [0, C). ``reduction`` is "mean" (as in
    PyTorch), "sum", or "none" for the per-example losses.
    """
    losses = apply(SOFTMAX_CROSS_ENTROPY, logits, labels)
    if reduction == "none":
        return losses
    from . import reduce
    if reduction == "sum":
        return reduce.sum(losses)
    if reduction == "mean":
        return reduce.mean(losses)
    raise ArgumentError(f"softmax_cross_entropy: reduction must be 'mean', 'sum' or 'none', "
                        f"got {reduction!r}")
