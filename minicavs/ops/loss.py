"""Losses. ``softmax_cross_entropy`` (integer labels, a stable log-sum-exp) and its gradient
are primitives, the hot loop of a language model; ``cross_entropy`` (class weights,
``ignore_index``, label smoothing, probability targets), ``nll_loss`` and the binary
cross-entropies are composed from it and from other primitives. The class axis is the last
one, as everywhere in minicavs (PyTorch puts it second)."""

import numpy as np

from . import activations, batching, elementwise as ew, index, reduce, shape
from .. import backend
from ..cpu import kernels as native_kernels
from ..cuda import kernels as cuda_kernels
from .registry import Aval, Op, apply, describe, register, require_float, require_int
from ..errors import ArgumentError, IndexRangeError, ShapeError


def _xent_forward(xp, logits, labels):
    # one CUDA kernel (cuda/kernels.py), where CuPy's ufuncs take eight
    if xp is not np and (done := cuda_kernels.softmax_xent(logits, labels)) is not None:
        return done
    num_classes = logits.shape[-1]
    found = index.out_of_range(labels, 0, num_classes - 1)  # (one sync on CuPy)
    if found is not None:
        raise IndexRangeError(f"op 'softmax_cross_entropy': label {found[0]} at position "
                              f"{found[1]} is out of range for {num_classes} classes")
    # the native kernel: two passes per row, rows split between cores
    if xp is np and (done := native_kernels.softmax_cross_entropy(logits, labels)) is not None:
        return done
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


def _xent_into(logits, labels, out):
    """The losses written into ``out`` (a batch's slab rows): on a GPU by the kernel itself."""
    if cuda_kernels.softmax_xent(logits, labels, out) is None:
        out[...] = _xent_forward(backend.get_array_module(logits), logits, labels)


SOFTMAX_CROSS_ENTROPY = register(Op(
    "softmax_cross_entropy", _xent_forward, _infer_xent,
    lambda g, out, logits, labels: (apply(SOFTMAX_CROSS_ENTROPY_GRAD, logits, labels, g), None),
    nondiff_args=(1,), batch=batching.leading_axes_rule, promotes=(0,), promotes_to_float=True,
    into=_xent_into))


# The gradient (softmax(logits) - onehot(labels)) * g is a primitive of its own: over a
# vocabulary-sized softmax it is the hot loop of a language model, and as one op it takes five
# passes over the logits and one allocation, where composing it from primitives takes a dozen.
# It has no batching rule: it appears only in ∂F, which is derived from the batched F.
def _xent_grad_forward(xp, logits, labels, g):
    grad = native_kernels.softmax_cross_entropy_grad(logits, labels, g) if xp is np else \
        cuda_kernels.softmax_xent_grad(logits, labels, g)
    if grad is not None:
        return grad
    probs = logits - xp.max(logits, axis=-1, keepdims=True)
    xp.exp(probs, out=probs)
    probs *= (g / xp.sum(probs, axis=-1))[..., None]
    rows = probs.reshape(-1, logits.shape[-1])
    rows[xp.arange(rows.shape[0]), labels.reshape(-1)] -= g.reshape(-1)
    return probs


def _xent_grad_vjp(u, out, logits, labels, g):
    """Second derivatives: with p = softmax(logits), d[(p - y) g]/d logits is
    g (diag(p) - p pᵀ), which is symmetric; d/dg is (p - y)."""
    probs = activations.softmax(logits, axis=-1)
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
    return _reduce("softmax_cross_entropy", apply(SOFTMAX_CROSS_ENTROPY, logits, labels),
                   reduction)


def _reduce(name, losses, reduction, total_weight=None):
    if reduction == "none" or (total_weight is None and reduction in ("sum", "mean")
                               and tuple(losses.shape) == ()):
        return losses  # (the sum or mean of one loss is that loss: no op for it)
    if reduction == "sum":
        return reduce.sum(losses)
    if reduction == "mean":
        return reduce.mean(losses) if total_weight is None else reduce.sum(losses) / total_weight
    raise ArgumentError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _class_targets(name, logits, target, ignore_index):
    """(labels with ignored entries set to class 0, the mask of kept entries or None)."""
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ShapeError(f"{name}: argument 0 (logits) has shape {describe(logits.shape)} and "
                         f"the target has shape {describe(target.shape)}; expected integer "
                         f"labels of shape {describe(tuple(logits.shape[:-1]))} (or "
                         f"probabilities of the logits' shape)")
    if np.dtype(target.dtype) != np.int64:  # (an ignore_index of -100 must fit the labels)
        target = ew.astype(target, np.int64)
    if ignore_index is None:
        return target, None
    kept = ew.not_equal(target, ignore_index)
    return ew.where(kept, target, 0), kept


def _class_weights(weight, labels, num_classes, name):
    if tuple(weight.shape) != (num_classes,):
        raise ShapeError(f"{name}: weight has shape {describe(weight.shape)}; expected one per "
                         f"class, {describe((num_classes,))}")
    return shape.reshape(index.take_rows(weight, shape.reshape(labels, (-1,))),
                         tuple(labels.shape))


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """Cross-entropy of ``softmax(logits)`` (classes on the last axis) against ``target``,
    as PyTorch's ``cross_entropy``:

    * integer labels of shape ``logits.shape[:-1]``; an entry equal to ``ignore_index`` adds
      nothing, and "mean" divides by the (weighted) count of the others;
    * or class probabilities of the logits' shape (a float target; "mean" divides by the
      number of examples);
    * ``weight``: one weight per class; ``label_smoothing`` ε: the target is (1 - ε) of the
      label plus ε spread evenly over all classes.
    """
    name = "cross_entropy"
    num_classes = logits.shape[-1]
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if np.dtype(target.dtype).kind == "f":  # probabilities
        if tuple(target.shape) != tuple(logits.shape):
            raise ShapeError(f"{name}: probability targets must have the logits' shape "
                             f"{describe(logits.shape)}, got {describe(target.shape)}")
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / num_classes
        log_probs = activations.log_softmax(logits, axis=-1)
        if weight is not None:
            log_probs = log_probs * weight
        return _reduce(name, ew.neg(reduce.sum(target * log_probs, axis=-1)), reduction)
    labels, kept = _class_targets(name, logits, target, ignore_index)
    losses = apply(SOFTMAX_CROSS_ENTROPY, logits, labels)
    per_example = None if weight is None else _class_weights(weight, labels, num_classes, name)
    if per_example is not None:
        losses = losses * per_example
    if label_smoothing:
        log_probs = activations.log_softmax(logits, axis=-1)
        spread = log_probs * weight if weight is not None else log_probs
        smooth = ew.neg(reduce.sum(spread, axis=-1)) * (1.0 / num_classes)
        losses = losses * (1 - label_smoothing) + smooth * label_smoothing
    return _masked_reduce(name, losses, kept, per_example, reduction)


def _masked_reduce(name, losses, kept, per_example, reduction):
    if kept is not None:
        losses = ew.where(kept, losses, 0)
    total = None
    if reduction == "mean" and (kept is not None or per_example is not None):
        counts = per_example if per_example is not None else ew.astype(kept, losses.dtype)
        if per_example is not None and kept is not None:
            counts = ew.where(kept, counts, 0)
        total = reduce.sum(counts)
    return _reduce(name, losses, reduction, total)


def nll_loss(log_probs, target, weight=None, ignore_index=-100, reduction="mean"):
    """The negative log-likelihood of integer ``target`` under ``log_probs`` (..., C), e.g.
    from ``log_softmax``; ``weight``, ``ignore_index`` and "mean" as in :func:`cross_entropy`."""
    name = "nll_loss"
    num_classes = log_probs.shape[-1]
    labels, kept = _class_targets(name, log_probs, target, ignore_index)
    picked = reduce.sum(log_probs * index.one_hot(labels, num_classes, log_probs.dtype), axis=-1)
    losses = ew.neg(picked)
    per_example = None if weight is None else _class_weights(weight, labels, num_classes, name)
    if per_example is not None:
        losses = losses * per_example
    return _masked_reduce(name, losses, kept, per_example, reduction)


def binary_cross_entropy(probs, target, weight=None, reduction="mean"):
    """``-(y log p + (1 - y) log(1 - p))`` for probabilities ``p``; each log is clipped at
    -100, as in PyTorch, so p = 0 or 1 gives a finite loss."""
    _same_shape("binary_cross_entropy", probs, target)
    log_p = activations.clip(ew.log(probs), -100.0)
    log_not_p = activations.clip(ew.log(1 - probs), -100.0)
    losses = ew.neg(target * log_p + (1 - target) * log_not_p)
    if weight is not None:
        losses = losses * weight
    return _reduce("binary_cross_entropy", losses, reduction)


def binary_cross_entropy_with_logits(logits, target, weight=None, pos_weight=None,
                                     reduction="mean"):
    """``binary_cross_entropy(sigmoid(x), y)`` computed from the logits without overflow:
    ``(1 - y) x + (1 + (pos_weight - 1) y) softplus(-x)``."""
    _same_shape("binary_cross_entropy_with_logits", logits, target)
    log_weight = 1 if pos_weight is None else 1 + (pos_weight - 1) * target
    losses = (1 - target) * logits + log_weight * activations.softplus(ew.neg(logits))
    if weight is not None:
        losses = losses * weight
    return _reduce("binary_cross_entropy_with_logits", losses, reduction)


def _same_shape(name, x, target):
    if tuple(x.shape) != tuple(target.shape):
        raise ShapeError(f"{name}: argument 0 has shape {describe(x.shape)} and the target has "
                         f"shape {describe(target.shape)}; they must match")
