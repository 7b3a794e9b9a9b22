"""The LSTM cell and a chain LSTM's step as primitives, for code that records every op
(automatic batching; docs/autobatch.md, "Writing the model: fewer nodes").

``lstm_cell(pre, *c_prev)``: composed from primitives (``composite.lstm_gates``) an LSTM update
is 13 ops — which the vertex runtime fuses into one kernel anyway, but which autobatch records
and schedules one by one: 13 nodes and batches per step. As one primitive it is one node, and
its gradient one primitive (no batching rule: it appears only in ∂ graphs of batched ones).
``pre`` holds the gate pre-activations [i, f_1 … f_k, o, u] on its last axis ((3 + k)·H), one
forget gate per previous cell ``c_prev[j]`` (k = 0: a Tree-LSTM leaf; 1: a chain LSTM; 2: a
binary Tree-LSTM vertex). The result is [h, c] (2H): c = σ(i)⊙tanh(u) + Σ_j σ(f_j)⊙c_prev[j],
h = σ(o)⊙tanh(c).

``lstm_step``: a whole step, [h, c] = ``lstm_cell(x·W + h·U + b, c)``, as DyNet's
``VanillaLSTMBuilder`` and ``torch.nn.LSTMCell`` run it: one recorded node instead of six. Its
batching rule writes the step back as those primitives on the batch's rows, so a batched
kernel, its ∂ and the ``+`` strategies' parameter gradients are the primitives' own; only an
eager call's VJP recomputes the two products (its ``out`` holds [h, c], not the gates).
Traced, the step is its primitives (``Op.expand``).
"""

import numpy as np

from . import batching, elementwise, linalg, shape
from .. import backend
from .registry import Aval, Op, apply, describe, needs_grad, register, require_float
from ..cpu import kernels as native_kernels
from ..cuda import kernels as cuda_kernels
from ..errors import ArgumentError, ShapeError


def _gates(xp, pre, k):
    """σ(i), [σ(f_j)], σ(o), tanh(u) from the stacked pre-activations."""
    H = pre.shape[-1] // (3 + k)
    s = elementwise.SIGMOID.forward(xp, pre[..., :(2 + k) * H])  # (quiet where e^-x overflows)
    forget = [s[..., (1 + j) * H:(2 + j) * H] for j in range(k)]
    return s[..., :H], forget, s[..., (1 + k) * H:(2 + k) * H], xp.tanh(pre[..., (2 + k) * H:])


def _forward(xp, pre, *c_prev):
    # One pass over the rows where it applies: in C (cpu/kernels.py), or one CUDA kernel
    # (cuda/kernels.py) where CuPy's ufuncs take ten launches.
    done = native_kernels.lstm_cell(pre, c_prev) if xp is np else \
        cuda_kernels.lstm_cell(pre, c_prev)
    if done is not None:
        return done
    i, forget, o, u = _gates(xp, pre, len(c_prev))
    H = u.shape[-1]
    out = xp.empty(pre.shape[:-1] + (2 * H,), pre.dtype)
    c = out[..., H:]
    xp.multiply(i, u, out=c)
    for f, cj in zip(forget, c_prev):
        c += f * cj
    xp.multiply(o, xp.tanh(c), out=out[..., :H])
    return out


def _infer(pre, *c_prev):
    require_float("lstm_cell", pre, 0)
    k = len(c_prev)
    last = pre.shape[-1] if len(pre.shape) else 0
    if not len(pre.shape) or last % (3 + k) or not last:
        raise ShapeError(f"op 'lstm_cell': argument 0 (the gate pre-activations) has shape "
                         f"{describe(pre.shape)}; with {k} previous cell(s) its last axis must "
                         f"be a positive multiple of {3 + k} (gates i, {k} forget, o, u)")
    H = last // (3 + k)
    for j, c in enumerate(c_prev):
        if tuple(c.shape) != tuple(pre.shape[:-1]) + (H,) or np.dtype(c.dtype) != np.dtype(
                pre.dtype):
            raise ShapeError(f"op 'lstm_cell': argument {j + 1} (a previous cell) has shape "
                             f"{describe(c.shape)} and dtype {c.dtype}; expected "
                             f"{describe(tuple(pre.shape[:-1]) + (H,))} and {pre.dtype}")
    return Aval(tuple(pre.shape[:-1]) + (2 * H,), np.dtype(pre.dtype))


def _vjp(g, out, pre, *c_prev):
    grads = apply(LSTM_CELL_GRAD, pre, *c_prev, out, g)
    k = len(c_prev)
    H = pre.shape[-1] // (3 + k)
    d_pre = shape.slice_axis(grads, 0, (3 + k) * H)
    return (d_pre, *(shape.slice_axis(grads, (3 + k + j) * H, (4 + k + j) * H)
                     for j in range(k)))


def _into(pre, *rest):
    """The cell written into ``out`` (a batch's rows of its slab): on a GPU the kernel writes
    there, saving the copy's launch."""
    *c_prev, out = rest
    if cuda_kernels.lstm_cell(pre, c_prev, out) is None:
        out[...] = _forward(backend.get_array_module(pre), pre, *c_prev)


LSTM_CELL = register(Op("lstm_cell", _forward, _infer, _vjp, batch=batching.leading_axes_rule,
                        into=_into))


def _grad_forward(xp, pre, *rest):
    *c_prev, out, g = rest
    done = native_kernels.lstm_cell_grad(pre, c_prev, out, g) if xp is np else \
        cuda_kernels.lstm_cell_grad(pre, c_prev, out, g)
    if done is not None:
        return done
    k = len(c_prev)
    i, forget, o, u = _gates(xp, pre, k)
    H = u.shape[-1]
    c, gh = out[..., H:], g[..., :H]
    tc = xp.tanh(c)
    grads = xp.empty(pre.shape[:-1] + ((3 + 2 * k) * H,), pre.dtype)
    d_c = g[..., H:] + gh * o * (1 - tc * tc)
    grads[..., :H] = d_c * u * i * (1 - i)
    for j, (f, cj) in enumerate(zip(forget, c_prev)):
        grads[..., (1 + j) * H:(2 + j) * H] = d_c * cj * f * (1 - f)
        grads[..., (3 + k + j) * H:(4 + k + j) * H] = d_c * f
    grads[..., (1 + k) * H:(2 + k) * H] = gh * tc * o * (1 - o)
    grads[..., (2 + k) * H:(3 + k) * H] = d_c * i * (1 - u * u)
    return grads


def _grad_infer(pre, *rest):
    *c_prev, out, g = rest
    _infer(pre, *c_prev)
    k = len(c_prev)
    H = pre.shape[-1] // (3 + k)
    return Aval(tuple(pre.shape[:-1]) + ((3 + 2 * k) * H,), np.dtype(pre.dtype))


def _grad_into(pre, *rest):
    """The gradients written into ``out`` (automatic batching's block of a signature's rows,
    which its shared operands' one product reads as one: segment.py)."""
    *operands, out = rest
    *c_prev, cell_out, g = operands
    if backend.get_array_module(pre) is not np or \
            native_kernels.lstm_cell_grad(pre, c_prev, cell_out, g, out) is None:
        out[...] = _grad_forward(backend.get_array_module(pre), pre, *operands)


# [∂pre, ∂c_prev[0], …] side by side. No vjp: second derivatives of lstm_cell are not
# supported (compose the cell from primitives, ``lstm_gates``, for those).
LSTM_CELL_GRAD = register(Op("lstm_cell_grad", _grad_forward, _grad_infer, into=_grad_into))


def lstm_cell(pre, *c_prev):
    """[h, c] of one LSTM update (see the module docstring); ``h, c = split(result, 2)``."""
    return apply(LSTM_CELL, pre, *c_prev)


# --- a chain LSTM's step, fused -----------------------------------------------------------------
# Operands: (x, state, W, U, b), or (gates, state, U) with gates = x·W + b computed beforehand.

_FULL, _HOISTED = ("x", "state", "W", "U", "b"), ("gates", "state", "U")


def _recurrent(operands):
    """The recurrent operands of either form: (state, U)."""
    return operands[1], operands[3 if len(operands) == 5 else 2]


def _step_forward(xp, *args):
    state, U = _recurrent(args)
    H = U.shape[0]
    pre = linalg._product(xp, state[..., :H], U)
    if len(args) == 5:  # (the order of the sums is the composition's: x·W + h·U + b)
        x, _, W, _, b = args
        pre = linalg._product(xp, x, W) + pre
        pre += b
    else:
        pre = args[0] + pre
    return _forward(xp, pre, state[..., H:])


def _step_infer(*args):
    if len(args) not in (3, 5):
        raise ShapeError(f"op 'lstm_step': takes (x, state, W, U, b) or (gates, state, U), got "
                         f"{len(args)} operands")
    names = _FULL if len(args) == 5 else _HOISTED
    first = args[0]
    for i, a in enumerate(args):
        require_float("lstm_step", a, i)
        if np.dtype(a.dtype) != np.dtype(first.dtype):
            raise ShapeError(f"op 'lstm_step': argument {i} ({names[i]}) has dtype {a.dtype}, "
                             f"argument 0 ({names[0]}) has {first.dtype}; they must agree")
    u_at = names.index("U")
    U = args[u_at]
    if len(U.shape) != 2 or not U.shape[0] or U.shape[1] != 4 * U.shape[0]:
        raise ShapeError(f"op 'lstm_step': argument {u_at} (U) has shape {describe(U.shape)}; "
                         f"expected (H, 4H), the hidden state times gates i, f, o, u")
    if not len(first.shape):
        raise ShapeError(f"op 'lstm_step': argument 0 ({names[0]}) is a scalar; expected "
                         f"(..., {'E' if len(args) == 5 else '4H'}) rows")
    H, lead = U.shape[0], tuple(first.shape[:-1])
    expected = {"state": lead + (2 * H,), "W": (first.shape[-1], 4 * H), "b": (4 * H,),
                "gates": lead + (4 * H,)}
    for i, name in enumerate(names):
        if name in expected and tuple(args[i].shape) != expected[name]:
            raise ShapeError(f"op 'lstm_step': argument {i} ({name}) has shape "
                             f"{describe(args[i].shape)}; with {names[0]} of shape "
                             f"{describe(first.shape)} and U of shape {describe(U.shape)} "
                             f"expected {describe(expected[name])}")
    return Aval(lead + (2 * H,), np.dtype(first.dtype))


def _step_composed(*args):
    """The step as primitives: (the cell's gate pre-activations, c, h, h·U, x·W or None)."""
    state, U = _recurrent(args)
    H = U.shape[0]
    h, c = shape.slice_axis(state, 0, H), shape.slice_axis(state, H, 2 * H)
    hu = linalg.matmul(h, U)
    if len(args) == 5:
        x, _, W, _, b = args
        xw = linalg.matmul(x, W)
        return elementwise.add(elementwise.add(xw, hu), b), c, h, hu, xw
    return elementwise.add(args[0], hu), c, h, hu, None


def _step_vjp(g, out, *args):
    pre, c, h, hu, xw = _step_composed(*args)
    state, U = _recurrent(args)
    d_pre, d_c = _vjp(g, out, pre, c)
    d_h, d_U = linalg._matmul_vjp(d_pre, hu, h, U)
    if d_h is None and needs_grad(state):  # (h was sliced here, with no gradient of its own)
        d_h = linalg.matmul(d_pre, shape.transpose(U))
    d_state = None if d_h is None else shape.concat([d_h, d_c], axis=-1)
    if len(args) == 3:
        return d_pre, d_state, d_U
    x, _, W, _, b = args
    d_x, d_W = linalg._matmul_vjp(d_pre, xw, x, W)
    return d_x, d_state, d_W, d_U, elementwise.unbroadcast(d_pre, tuple(b.shape))


def _step_batch(op, items, attrs, out):
    """The step as primitives on the batch's rows (each through its own batching rule)."""
    domain = next(d for _, d in items if d)
    rows = batching.row_count(domain)
    H = out.shape[-1] // 2
    gates = Aval(tuple(out.shape[:-1]) + (4 * H,), out.dtype)

    def per_row(item):
        s, d = item
        return s if d else shape.broadcast_to(s, (rows,) + tuple(s.shape))

    state = per_row(items[1])
    h, c = shape.slice_axis(state, 0, H), shape.slice_axis(state, H, 2 * H)
    hu = linalg.MATMUL.batch(linalg.MATMUL, [(h, domain), _recurrent(items)[1]], {}, gates)
    if len(items) == 3:
        return apply(LSTM_CELL, elementwise.add(per_row(items[0]), hu), c)
    xw = linalg.MATMUL.batch(linalg.MATMUL, [(per_row(items[0]), domain), items[2]], {}, gates)
    pre = elementwise.add(xw, hu)
    pre = batching.elementwise_rule(elementwise.ADD, [(pre, domain), items[4]], {}, gates)
    return apply(LSTM_CELL, pre, c)


def _step_expand(*args):
    pre, c, _, _, _ = _step_composed(*args)
    return apply(LSTM_CELL, pre, c)


LSTM_STEP = register(Op("lstm_step", _step_forward, _step_infer, _step_vjp, batch=_step_batch,
                        promotes="all", expand=_step_expand, argument_names=_FULL))


def lstm_step(x, state, W, U=None, b=None):
    """The next [h, c] of a chain LSTM from input ``x`` and ``state`` = [h, c] (see the module
    docstring): gates [i, f, o, u] = x·W + h·U + b; ``h, c = split(result, 2)``.

    ``lstm_step(gates, state, U)``: the input's part of the gates, ``x·W + b``, computed
    beforehand — for every step at once, one product over all the steps' inputs (the input
    projection cuDNN hoists out of the recurrence); the step adds ``h·U`` and runs the cell."""
    if U is None and b is None:
        return apply(LSTM_STEP, x, state, W)  # (W in the place of U)
    if U is None or b is None:
        raise ArgumentError("lstm_step: pass (x, state, W, U, b), or (gates, state, U) with "
                            f"gates = x·W + b; got U {'missing' if U is None else 'given'} and "
                            f"b {'missing' if b is None else 'given'}")
    return apply(LSTM_STEP, x, state, W, U, b)
