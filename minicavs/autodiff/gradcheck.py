"""Gradient checking by central finite differences, in float64.

``gradcheck(fn, inputs)`` reduces ``fn``'s output to a scalar with fixed random weights, then
compares the analytic gradient (backward) with numerical derivatives: every entry of a small
input (the full Jacobian-vector product), or a few random directions for a large one.
"""

import numpy as np

from .. import backend
from ..errors import GradientCheckError
from .tensor import Tensor, no_grad


def _as_float64_inputs(inputs):
    tensors = []
    for x in inputs:
        data = x.data if isinstance(x, Tensor) else x
        data = data if backend.is_array(data) else np.asarray(data)
        if np.dtype(data.dtype).kind == "f":
            if data.dtype != np.float64:
                raise GradientCheckError(f"gradcheck needs float64 inputs, got {data.dtype}: "
                                         f"finite differences in float32 are too coarse")
            tensors.append(Tensor(data.copy(), requires_grad=True))
        else:  # integer inputs (indices, labels) are passed through, not differentiated
            tensors.append(Tensor(data))
    return tensors


def gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, directions=4, full_limit=64, seed=0):
    """Check ``fn``'s gradients with respect to every float input; raise on a mismatch.

    ``fn`` takes Tensors and returns a Tensor. Inputs with at most ``full_limit`` entries are
    checked entry by entry; larger ones along ``directions`` random unit directions. Returns
    True, so ``assert gradcheck(...)`` reads naturally.
    """
    rng = np.random.default_rng(seed)
    tensors = _as_float64_inputs(inputs)
    out = fn(*tensors)
    xp = backend.get_array_module(out.data)
    weights = xp.asarray(rng.standard_normal(out.shape))

    def objective(values):
        with no_grad():
            args = [Tensor(v) if t.requires_grad else t for v, t in zip(values, tensors)]
            return float(backend.to_numpy((fn(*args).data * weights).sum()))

    (out * Tensor(weights)).sum().backward()
    base = [t.data for t in tensors]
    for i, t in enumerate(tensors):
        if not t.requires_grad:
            continue
        analytic = backend.to_numpy(t.grad.data) if t.grad is not None else np.zeros(t.shape)
        if t.data.size <= full_limit:
            numeric = np.zeros(t.shape)
            for j in np.ndindex(*t.shape):
                delta = xp.zeros(t.shape)
                delta[j] = eps
                numeric[j] = _central_difference(objective, base, i, delta, eps)
            _compare(i, analytic, numeric, atol, rtol, "entry")
        else:
            for d in range(directions):
                direction = rng.standard_normal(t.shape)
                direction /= np.linalg.norm(direction)
                numeric = _central_difference(objective, base, i, xp.asarray(direction) * eps, eps)
                projected = float(np.sum(analytic * direction))
                _compare(i, np.array([projected]), np.array([numeric]), atol, rtol,
                         f"random direction {d}")
    return True


def _central_difference(objective, base, i, delta, eps):
    plus = list(base); plus[i] = base[i] + delta
    minus = list(base); minus[i] = base[i] - delta
    return (objective(plus) - objective(minus)) / (2 * eps)


def _compare(i, analytic, numeric, atol, rtol, what):
    error = np.abs(analytic - numeric)
    bad = error > atol + rtol * np.abs(numeric)
    if bad.any():
        worst = np.unravel_index(np.argmax(error), error.shape)
        relative = error / np.maximum(np.abs(numeric), 1e-300)
        raise GradientCheckError(
            f"gradcheck failed for input {i} ({what}): {int(bad.sum())} of {bad.size} entries "
            f"differ; largest absolute error {error.max():.3e} at index {tuple(int(k) for k in worst)} "
            f"(analytic {analytic[worst]:.6e}, numerical {numeric[worst]:.6e}); largest relative "
            f"error {relative.max():.3e}; tolerance atol={atol}, rtol={rtol}")
