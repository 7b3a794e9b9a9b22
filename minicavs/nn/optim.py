"""Optimisers: SGD (with momentum), Adam and Adagrad.

``step()`` updates each parameter's ``p.data`` in place with ``xp`` (NumPy or CuPy, whichever
holds it) and skips parameters whose ``grad`` is None. Per-parameter state (momentum buffers,
moment estimates, step counts) is created at a parameter's first update and kept as arrays of
the parameter's shape and dtype, so :meth:`Optimizer.state_dict` can save it and training
resumes exactly where it stopped. Gradients are never modified in place: a leaf's ``.grad``
may share memory with another tensor's.
"""

import numpy as np

from .. import backend, validate
from ..autodiff import Tensor, versions
from ..errors import ArgumentError, CheckpointError, DTypeError, ShapeError
from ..ops.registry import describe


class Optimizer:
    """Base class. Subclasses name their ``hyperparameters`` (attributes of the optimiser, e.g.
    ``opt.lr``, free to change between steps) and their ``state_names`` (per-parameter arrays;
    a name in ``counters`` is an integer step count instead), and write ``_update``, which
    creates the state at a parameter's first update: all of ``state_names`` or none."""

    hyperparameter_names = ("lr", "weight_decay")
    state_names = ()
    counters = ()

    def __init__(self, params, **hyperparameters):
        kind = type(self).__name__
        if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
            raise ArgumentError(f"{kind}: params must be a list of parameters (e.g. "
                                f"model.parameters()), got {type(params).__name__}")
        unique = {}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise ArgumentError(f"{kind}: parameter {i} is not a Tensor that requires grad "
                                    f"(got {type(p).__name__})")
            unique.setdefault(id(p), p)
        if not unique:
            raise ArgumentError(f"{kind}: got an empty list of parameters")
        self.params = list(unique.values())
        self.state = [{} for _ in self.params]
        for name in self.hyperparameter_names:
            setattr(self, name, hyperparameters[name])
        self.check_hyperparameters()

    @property
    def hyperparameters(self):
        return {name: getattr(self, name) for name in self.hyperparameter_names}

    # The range of each hyperparameter a subclass may have (those of PyTorch's optimisers).
    _RANGES = {"lr": dict(minimum=0.0), "weight_decay": dict(minimum=0.0),
               "momentum": dict(minimum=0.0), "eps": dict(minimum=0.0)}

    def check_hyperparameters(self):
        """Raise :class:`ArgumentError` for a hyperparameter out of its range (NaN, a negative
        learning rate, a beta of 1); ``step()`` checks again, as they may be changed."""
        for name in self.hyperparameter_names:
            problem = self._hyperparameter_problem(name, getattr(self, name))
            if problem:
                raise ArgumentError(f"{type(self).__name__}: {problem}")

    def _hyperparameter_problem(self, name, value):
        try:
            if name != "betas":
                validate.number(value, name, **self._RANGES.get(name, {}))
            elif not isinstance(value, (tuple, list)) or len(value) != 2:
                return f"betas must be a pair (beta1, beta2), got {value!r}"
            else:
                for i, beta in enumerate(value):
                    validate.number(beta, f"betas[{i}]", minimum=0, maximum=1, open_maximum=True)
        except ArgumentError as exc:
            return str(exc)
        return None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.check_hyperparameters()
        for i, (p, state) in enumerate(zip(self.params, self.state)):
            if p.grad is None:
                continue
            grad = p.grad.data
            if grad.shape != p.shape or grad.dtype != p.dtype:
                error = ShapeError if grad.shape != p.shape else DTypeError
                raise error(f"{type(self).__name__}.step: parameter {i} has shape "
                            f"{describe(p.shape)} and dtype {p.dtype}, its grad has shape "
                            f"{describe(grad.shape)} and dtype {grad.dtype}")
            xp = backend.get_array_module(p._array, grad, op=f"{type(self).__name__}.step")
            if self.weight_decay:
                grad = grad + self.weight_decay * p._array  # L2 penalty: its gradient is wd * p
            self._update(xp, p._array, grad, state)
            versions.changed(p)  # a backward still pending for the old values refuses to run

    def _update(self, xp, param, grad, state):
        raise NotImplementedError

    # --- saving and restoring -------------------------------------------------------------------
    def state_dict(self):
        """``{"type", "hyperparameters", "state"}``; ``state`` has one dict per parameter (in
        the order given to the optimiser) of NumPy arrays (counters as 0-d int64 arrays)."""
        return {"type": type(self).__name__, "hyperparameters": self.hyperparameters,
                "state": [{k: np.array(v, np.int64) if k in self.counters else
                           backend.to_numpy(v).copy() for k, v in s.items()}
                          for s in self.state]}

    def state_mismatches(self, state_dict, names=None):
        """Why ``state_dict`` cannot be loaded into this optimiser: a list of lines, empty if
        it can. ``names`` (one per parameter) make the lines name parameters, not positions."""
        names = names or [f"parameter {i}" for i in range(len(self.params))]
        kind = type(self).__name__
        if state_dict.get("type") != kind:
            return [f"the state is for optimiser {state_dict.get('type')!r}, this one is {kind!r}"]
        problems = []
        if sorted(state_dict.get("hyperparameters", {})) != sorted(self.hyperparameter_names):
            problems.append(f"hyperparameters {sorted(state_dict.get('hyperparameters', {}))}; "
                            f"{kind} has {sorted(self.hyperparameter_names)}")
        for name, value in state_dict.get("hyperparameters", {}).items():
            problem = name in self.hyperparameter_names and self._hyperparameter_problem(name,
                                                                                          value)
            if problem:
                problems.append(f"hyperparameter {problem}")
        states = state_dict.get("state", [])
        if len(states) != len(self.params):
            return problems + [f"state for {len(states)} parameters; this optimiser has "
                               f"{len(self.params)}"]
        for p, name, state in zip(self.params, names, states):
            if state and sorted(state) != sorted(self.state_names):
                problems.append(f"{name}: state {sorted(state)}; {kind} keeps "
                                f"{sorted(self.state_names)} (or nothing before the first step)")
                continue
            for key, value in state.items():
                value = np.asarray(value)
                if key in self.counters:
                    if value.shape != () or value.dtype.kind not in "iu":
                        problems.append(f"{name}: state {key!r} must be an integer count, got "
                                        f"shape {describe(value.shape)} and dtype {value.dtype}")
                elif value.shape != tuple(p.shape) or value.dtype != p.dtype:
                    problems.append(f"{name}: state {key!r} has shape {describe(value.shape)} "
                                    f"and dtype {value.dtype}; the parameter has shape "
                                    f"{describe(p.shape)} and dtype {p.dtype}")
        return problems

    def load_state_dict(self, state_dict, names=None):
        """Restore hyperparameters and state; on any mismatch change nothing and raise a
        :class:`CheckpointError` listing them all."""
        problems = self.state_mismatches(state_dict, names)
        if problems:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: the state does not "
                                  f"match:\n  " + "\n  ".join(problems))
        for name, value in state_dict["hyperparameters"].items():
            if isinstance(getattr(self, name), tuple):
                value = tuple(value)  # JSON gives lists back
            setattr(self, name, value)
        self.state = [
            {k: int(v) if k in self.counters else backend.to_device(np.array(v), p.device)
             for k, v in s.items()}
            for p, s in zip(self.params, state_dict["state"])]


class SGD(Optimizer):
    """``v = momentum * v + g;  p -= lr * v`` (plain ``p -= lr * g`` when momentum is 0)."""

    hyperparameter_names = ("lr", "momentum", "weight_decay")
    state_names = ("velocity",)

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def _update(self, xp, param, grad, state):
        if self.momentum:  # plain SGD keeps no buffer at all
            if not state:
                state["velocity"] = xp.zeros_like(param)
            velocity = state["velocity"]
            velocity *= self.momentum
            velocity += grad
            grad = velocity
        param -= self.lr * grad


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2015), with bias-corrected moment estimates:
    ``m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``."""

    hyperparameter_names = ("lr", "betas", "eps", "weight_decay")
    state_names = ("step", "m", "v")
    counters = ("step",)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        betas = tuple(betas) if isinstance(betas, (tuple, list)) else betas  # checked below
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def _update(self, xp, param, grad, state):
        if not state:
            state.update(step=0, m=xp.zeros_like(param), v=xp.zeros_like(param))
        beta1, beta2 = self.betas
        state["step"] += 1
        t, m, v = state["step"], state["m"], state["v"]
        # In place, with one scratch array: an embedding table or a softmax layer is large,
        # and each temporary is a full pass over it.
        scratch = grad * (1 - beta1)
        m *= beta1
        m += scratch
        xp.multiply(grad, grad, out=scratch)
        scratch *= 1 - beta2
        v *= beta2
        v += scratch
        # p -= lr * m_hat / (sqrt(v_hat) + eps), with m_hat = m / (1 - b1^t), v_hat likewise
        xp.divide(v, 1 - beta2 ** t, out=scratch)
        xp.sqrt(scratch, out=scratch)
        scratch += self.eps
        xp.divide(m, scratch, out=scratch)
        scratch *= self.lr / (1 - beta1 ** t)
        param -= scratch


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011): ``s += g²;  p -= lr * g / (sqrt(s) + eps)`` — the step
    size of each weight shrinks with the gradients it has seen."""

    hyperparameter_names = ("lr", "eps", "weight_decay")
    state_names = ("sum",)

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay)

    def _update(self, xp, param, grad, state):
        if not state:
            state["sum"] = xp.zeros_like(param)
        state["sum"] += grad * grad
        param -= self.lr * grad / (xp.sqrt(state["sum"]) + self.eps)


def clip_grad_norm(params, max_norm):
    """Scale the gradients of ``params`` so their joint L2 norm is at most ``max_norm``;
    return the norm before clipping."""
    validate.number(max_norm, "max_norm", "clip_grad_norm", minimum=0.0, open_minimum=True)
    params = [p for p in params if p.grad is not None]
    total = float(np.sqrt(sum(float((p.grad.data * p.grad.data).sum()) for p in params)))
    if total > max_norm:
        scale = max_norm / total
        for p in params:
            p.grad = Tensor(p.grad.data * scale)  # a new array: grads may share memory
    return total
