"""Optimisers: SGD (with momentum), Adam, AdamW and Adagrad, with parameter groups.

``step()`` updates each parameter's ``p.data`` in place with ``xp`` (NumPy or CuPy, whichever
holds it) and skips parameters whose ``grad`` is None. Per-parameter state (momentum buffers,
moment estimates, step counts) is created at a parameter's first update and kept as arrays of
the parameter's shape and dtype, so :meth:`Optimizer.state_dict` can save it and training
resumes exactly where it stopped. Gradients are never modified in place: a leaf's ``.grad``
may share memory with another tensor's.

Parameter groups (as in PyTorch): ``params`` is a list of Parameters, or a list of dicts
``{"params": [...], "lr": ..., ...}`` whose entries override the optimiser's hyperparameters
for that group (e.g. no weight decay on biases). ``opt.param_groups`` lists them; an LR
scheduler (``schedulers.py``) sets each group's "lr". ``opt.lr`` reads a hyperparameter all
groups share, and setting it sets it in every group.
"""

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .. import backend, validate
from ..autodiff import Tensor, versions
from ..errors import ArgumentError, CheckpointError, DTypeError, ShapeError
from ..ops.registry import describe


class Optimizer:
    """Base class. Subclasses name their ``hyperparameters`` (``opt.param_groups[i][name]``;
    ``opt.name`` when every group has the same value) and their ``state_names``
    (per-parameter arrays; a name in ``counters`` is an integer step count instead), and write
    ``_update(xp, param, grad, state, group)``, which creates the state at a parameter's first
    update: all of ``state_names`` or none."""

    hyperparameter_names = ("lr", "weight_decay")
    state_names = ()
    counters = ()

    def __init__(self, params, **defaults):
        kind = type(self).__name__
        if isinstance(params, Tensor) or not hasattr(params, "__iter__"):
            raise ArgumentError(f"{kind}: params must be a list of parameters (e.g. "
                                f"model.parameters()) or of parameter groups (dicts), got "
                                f"{type(params).__name__}")
        params = list(params)
        groups = params if params and all(isinstance(g, dict) for g in params) else [
            {"params": params}]
        self.param_groups, self.params, seen = [], [], set()
        for k, group in enumerate(groups):
            unknown = set(group) - {"params"} - set(self.hyperparameter_names)
            if unknown:
                raise ArgumentError(f"{kind}: parameter group {k} has unknown settings "
                                    f"{sorted(unknown)}; it takes "
                                    f"{list(self.hyperparameter_names)}")
            if "params" not in group:
                raise ArgumentError(f"{kind}: parameter group {k} has no 'params' entry")
            members = []
            for i, p in enumerate(group["params"]):
                if not isinstance(p, Tensor) or not p.requires_grad:
                    where = f"parameter {i}" + (f" of group {k}" if len(groups) > 1 else "")
                    raise ArgumentError(f"{kind}: {where} is not a Tensor that requires grad "
                                        f"(got {type(p).__name__})")
                if id(p) not in seen:  # a repeated parameter is updated once
                    seen.add(id(p))
                    members.append(p)
            self.param_groups.append(dict(defaults, **{n: v for n, v in group.items()
                                                       if n != "params"}, params=members))
            self.params += members
        if not self.params:
            raise ArgumentError(f"{kind}: got an empty list of parameters")
        for group in self.param_groups:  # (a list of betas, from JSON or the caller)
            if isinstance(group.get("betas"), list):
                group["betas"] = tuple(group["betas"])
        self.state = [{} for _ in self.params]
        self.check_hyperparameters()

    def __getattr__(self, name):  # opt.lr: a hyperparameter every group shares
        if name in type(self).hyperparameter_names and "param_groups" in self.__dict__:
            values = [g[name] for g in self.param_groups]
            if any(v != values[0] for v in values):
                raise AttributeError(f"{type(self).__name__}.{name}: the parameter groups have "
                                     f"different values {values}; read param_groups[i]"
                                     f"[{name!r}]")
            return values[0]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in type(self).hyperparameter_names and "param_groups" in self.__dict__:
            for group in self.param_groups:
                group[name] = tuple(value) if name == "betas" else value
        else:
            super().__setattr__(name, value)

    @property
    def hyperparameters(self):
        """The hyperparameters of the first group (of every group, if they agree)."""
        return {name: self.param_groups[0][name] for name in self.hyperparameter_names}

    # The range of each hyperparameter a subclass may have (those of PyTorch's optimisers).
    _RANGES = {"lr": dict(minimum=0.0), "weight_decay": dict(minimum=0.0),
               "momentum": dict(minimum=0.0), "eps": dict(minimum=0.0)}

    def check_hyperparameters(self):
        """Raise :class:`ArgumentError` for a hyperparameter out of its range (NaN, a negative
        learning rate, a beta of 1); ``step()`` checks again, as they may be changed."""
        for k, group in enumerate(self.param_groups):
            for name in self.hyperparameter_names:
                problem = self._hyperparameter_problem(name, group[name])
                if problem:
                    where = f" (parameter group {k})" if len(self.param_groups) > 1 else ""
                    raise ArgumentError(f"{type(self).__name__}: {problem}{where}")

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

    def reset_state(self):
        """Forget every parameter's state (moments, AdaGrad's sums), keeping the
        hyperparameters: the next step is a first step again. Socher et al.'s AdaGrad
        (Stanford CoreNLP's sentiment trainer) does this every epoch."""
        self.state = [{} for _ in self.params]

    def step(self):
        self.check_hyperparameters()
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                self._step_one(i, p, self.state[i], group)
                i += 1

    def _step_one(self, i, p, state, group):
        if p.grad is None:
            return
        grad = p.grad.data
        if grad.shape != p.shape or grad.dtype != p.dtype:
            error = ShapeError if grad.shape != p.shape else DTypeError
            raise error(f"{type(self).__name__}.step: parameter {i} has shape "
                        f"{describe(p.shape)} and dtype {p.dtype}, its grad has shape "
                        f"{describe(grad.shape)} and dtype {grad.dtype}")
        xp = backend.get_array_module(p._array, grad, op=f"{type(self).__name__}.step")
        versions.writing(p)
        if group["weight_decay"] and not self.decoupled_weight_decay:
            grad = grad + group["weight_decay"] * p._array  # L2 penalty: its gradient is wd * p
        self._update(xp, p._array, grad, state, group)
        versions.changed(p)  # a backward still pending for the old values refuses to run

    decoupled_weight_decay = False

    def _update(self, xp, param, grad, state, group):
        raise NotImplementedError

    # --- saving and restoring -------------------------------------------------------------------
    def state_dict(self):
        """``{"type", "hyperparameters", "param_groups", "state"}``: ``hyperparameters`` are
        the first group's, ``param_groups`` each group's hyperparameters and the positions of
        its parameters; ``state`` has one dict per parameter (in the optimiser's order) of
        NumPy arrays (counters as 0-d int64 arrays)."""
        groups, start = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append(dict({n: group[n] for n in self.hyperparameter_names},
                               params=list(range(start, start + count))))
            start += count
        return {"type": type(self).__name__, "hyperparameters": self.hyperparameters,
                "param_groups": groups,
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
        hyperparameters = state_dict.get("hyperparameters", {})
        saved_groups = state_dict.get("param_groups")
        if sorted(hyperparameters) != sorted(self.hyperparameter_names):
            problems.append(f"hyperparameters {sorted(hyperparameters)}; "
                            f"{kind} has {sorted(self.hyperparameter_names)}")
        for group in list(saved_groups or []) + [hyperparameters]:
            for name in (n for n in group if n in self.hyperparameter_names):
                problem = self._hyperparameter_problem(name, group[name])
                if problem:
                    problems.append(f"hyperparameter {problem}")
        if saved_groups is not None:
            sizes = [len(g["params"]) for g in saved_groups]
            mine = [len(g["params"]) for g in self.param_groups]
            if sizes != mine:
                problems.append(f"parameter groups of sizes {sizes}; this optimiser has {mine}")
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
        """Restore hyperparameters (per group) and state; on any mismatch change nothing and
        raise a :class:`CheckpointError` listing them all."""
        problems = self.state_mismatches(state_dict, names)
        if problems:
            raise CheckpointError(f"{type(self).__name__}.load_state_dict: the state does not "
                                  f"match:\n  " + "\n  ".join(problems))
        saved_groups = state_dict.get("param_groups") or [
            state_dict["hyperparameters"]] * len(self.param_groups)
        for group, saved in zip(self.param_groups, saved_groups):
            for name in self.hyperparameter_names:
                value = saved[name]
                group[name] = tuple(value) if isinstance(value, list) else value  # JSON lists
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

    def _update(self, xp, param, grad, state, group):
        if group["momentum"]:  # plain SGD keeps no buffer at all
            if not state:
                state["velocity"] = xp.zeros_like(param)
            velocity = state["velocity"]
            velocity *= group["momentum"]
            velocity += grad
            grad = velocity
        if not _axpy(xp, -group["lr"], grad, param):
            param -= group["lr"] * grad


def _axpy(xp, a, x, y):
    """``y += a * x`` in place with the BLAS's axpy, for contiguous NumPy float arrays of one
    dtype; False where it does not apply. No temporary: ``y -= lr * g`` makes one as large as
    the parameter (an 18 MB embedding table: 1.9 ms a step, 0.7 ms here)."""
    if xp is not np or x.dtype != y.dtype or x.dtype.char not in "fd" or x.shape != y.shape \
            or not (x.flags.c_contiguous and y.flags.c_contiguous and y.flags.writeable):
        return False
    from scipy.linalg import blas

    flat = y.reshape(-1)
    out = (blas.saxpy if x.dtype.char == "f" else blas.daxpy)(x.reshape(-1), flat, a=a)
    if out is not flat and not np.shares_memory(out, y):  # (f2py worked on a copy)
        y[...] = out.reshape(y.shape)
    return True


class Adam(Optimizer):
    """Adam (Kingma and Ba, 2015), with bias-corrected moment estimates:
    ``m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``."""

    hyperparameter_names = ("lr", "betas", "eps", "weight_decay")
    state_names = ("step", "m", "v")
    counters = ("step",)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def step(self):
        """Each group's parameters in one pass per device — NumPy ones in one native call
        (``cpu/kernels.py``), CuPy ones in one launch (``cuda/kernels.py``): m, v and p read
        and written once each — where that applies; the others one by one."""
        self.check_hyperparameters()
        i = 0
        for group in self.param_groups:
            batches = {np: [], "device": []}
            for p in group["params"]:
                if not self._queue(i, p, self.state[i], group, batches):
                    self._step_one(i, p, self.state[i], group)
                i += 1
            for xp, batch in batches.items():
                if batch:
                    self._batched_step(group, batch, xp is np)

    def _queue(self, i, p, state, group, batches):
        """Queue parameter ``i`` for its device's one pass; False if it must be updated alone
        (another array type, an L2 penalty, a gradient of another shape or dtype)."""
        grad = p.grad.data if p.grad is not None else None
        on_host = type(p._array) is np.ndarray
        if grad is None or (on_host and type(grad) is not np.ndarray) \
                or not (on_host or backend.is_cupy_array(p._array)) \
                or grad.shape != p.shape or grad.dtype != p.dtype \
                or p.dtype not in (np.float32, np.float64) \
                or (group["weight_decay"] and not self.decoupled_weight_decay) \
                or not p._array.flags.c_contiguous:
            return False
        xp = np if on_host else backend.get_array_module(p._array, grad, op="Adam.step")
        if not state:
            state.update(step=0, m=xp.zeros_like(p._array), v=xp.zeros_like(p._array))
        batches[np if on_host else "device"].append((p, xp.ascontiguousarray(grad), state))
        return True

    def _batched_step(self, group, batch, on_host):
        from ..cpu import kernels as host_kernels
        from ..cuda import kernels as device_kernels

        step_all = host_kernels.adam if on_host else device_kernels.adam_many
        beta1, beta2 = group["betas"]
        by_step = {}
        for p, grad, state in batch:  # (parameters added later have fewer steps)
            state["step"] += 1
            by_step.setdefault((state["step"], p.dtype), []).append((p, grad, state))
        decay = 1 - group["lr"] * group["weight_decay"] if self.decoupled_weight_decay else 1.0
        for (t, _), members in by_step.items():
            for p, _, _ in members:
                versions.writing(p)
            arrays = [[p._array for p, _, _ in members], [g for _, g, _ in members],
                      [s["m"] for _, _, s in members], [s["v"] for _, _, s in members]]
            if not step_all(*arrays, beta1, beta2, group["eps"], 1 - beta2 ** t,
                            group["lr"] / (1 - beta1 ** t), decay):
                for p, grad, state in members:
                    state["step"] -= 1
                    self._update(backend.get_array_module(p._array), p._array, grad, state,
                                 group)
            for p, _, _ in members:
                versions.changed(p)

    def _update(self, xp, param, grad, state, group):
        if not state:
            state.update(step=0, m=xp.zeros_like(param), v=xp.zeros_like(param))
        decay = 1 - group["lr"] * group["weight_decay"] if self.decoupled_weight_decay else 1.0
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t, m, v = state["step"], state["m"], state["v"]
        if xp is not np:  # on the GPU: one launch (cuda/kernels.py) instead of thirteen
            from ..cuda import kernels

            if kernels.adam_many([param], [xp.ascontiguousarray(grad)], [m], [v], beta1, beta2,
                                 group["eps"], 1 - beta2 ** t, group["lr"] / (1 - beta1 ** t),
                                 decay):
                return
        if decay != 1.0:
            param *= decay  # AdamW: decay apart from Adam
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
        scratch += group["eps"]
        xp.divide(m, scratch, out=scratch)
        scratch *= group["lr"] / (1 - beta1 ** t)
        param -= scratch


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019): each step first
    shrinks the weights, ``p *= 1 - lr * weight_decay``, then takes the Adam step on the plain
    gradient, so the decay is not scaled by Adam's per-weight step sizes (default 0.01, as in
    PyTorch)."""

    decoupled_weight_decay = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011): ``s += g²;  p -= lr * g / (sqrt(s) + eps)`` — the step
    size of each weight shrinks with the gradients it has seen."""

    hyperparameter_names = ("lr", "eps", "weight_decay")
    state_names = ("sum",)

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay)

    def _update(self, xp, param, grad, state, group):
        if not state:
            state["sum"] = xp.zeros_like(param)
        state["sum"] += grad * grad
        param -= group["lr"] * grad / (xp.sqrt(state["sum"]) + group["eps"])


class CombinedOptimizer:
    """Several optimisers over disjoint parameters, stepped as one: Tai et al. (2015) update
    the word embeddings with plain SGD and every other weight with AdaGrad.

    It has what a training loop uses (``params``, ``param_groups``, ``zero_grad``, ``step``,
    ``reset_state``, ``state_dict``, ``load_state_dict``); checkpoints
    (:func:`minicavs.nn.save_checkpoint`) take single optimisers only."""

    def __init__(self, optimizers):
        optimizers = list(optimizers)
        if not optimizers or not all(isinstance(o, Optimizer) for o in optimizers):
            kinds = [type(o).__name__ for o in optimizers]
            raise ArgumentError(f"CombinedOptimizer: expected a non-empty list of minicavs "
                                f"optimisers, got {kinds}")
        seen = set()
        for k, optimizer in enumerate(optimizers):
            for p in optimizer.params:
                if id(p) in seen:
                    raise ArgumentError(f"CombinedOptimizer: optimiser {k} updates a parameter "
                                        f"an earlier one also updates; each parameter must "
                                        f"have one optimiser")
                seen.add(id(p))
        self.optimizers = optimizers

    @property
    def params(self):
        return [p for optimizer in self.optimizers for p in optimizer.params]

    @property
    def param_groups(self):
        return [g for optimizer in self.optimizers for g in optimizer.param_groups]

    def zero_grad(self):
        for optimizer in self.optimizers:
            optimizer.zero_grad()

    def step(self):
        for optimizer in self.optimizers:
            optimizer.step()

    def reset_state(self):
        for optimizer in self.optimizers:
            optimizer.reset_state()

    def state_dict(self):
        return {"type": type(self).__name__,
                "parts": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict):
        parts = state_dict.get("parts") if isinstance(state_dict, dict) else None
        if not isinstance(parts, list) or state_dict.get("type") != type(self).__name__ \
                or len(parts) != len(self.optimizers):
            raise CheckpointError(f"CombinedOptimizer.load_state_dict: expected the state of a "
                                  f"CombinedOptimizer of {len(self.optimizers)} optimisers")
        problems = [f"optimiser {k}: {line}" for k, (optimizer, part) in
                    enumerate(zip(self.optimizers, parts))
                    for line in optimizer.state_mismatches(part)]
        if problems:  # check every part before changing any
            raise CheckpointError("CombinedOptimizer.load_state_dict: the state does not "
                                  "match:\n  " + "\n  ".join(problems))
        for optimizer, part in zip(self.optimizers, parts):
            optimizer.load_state_dict(part)


def clip_grad_norm(params, max_norm):
    """Scale the gradients of ``params`` so their joint L2 norm is at most ``max_norm``;
    return the norm before clipping, as a 0-d Tensor on the gradients' device (``.item()``
    reads it). Nothing here waits for a GPU: the norm and the scale stay on the device, and
    every gradient is multiplied by ``min(1, max_norm / norm)`` (by 1 when under the limit,
    which changes no bit), as PyTorch's ``clip_grad_norm_`` does. On NumPy the gradients
    are scaled in place, as there (nothing is written under the limit); one whose memory
    another of them shares, or that is read-only, is replaced by a scaled copy — scaled in
    place, shared memory would be scaled twice (and on CuPy every one is a copy)."""
    validate.number(max_norm, "max_norm", "clip_grad_norm", minimum=0.0, open_minimum=True)
    params = [p for p in params if p.grad is not None]
    if not params:
        return Tensor(np.zeros((), backend.default_dtype()))
    grads = [p.grad.data for p in params]
    xp = backend.get_array_module(*grads, op="clip_grad_norm")
    total = xp.sqrt(xp.stack([xp.vdot(g.ravel(), g.ravel()) for g in grads]).sum())
    with np.errstate(divide="ignore"):  # a zero norm: max_norm / 0 is inf, the scale 1
        scale = xp.minimum(1, max_norm / total)
    # (a new array for an embedding table's gradient: 18 MB written to fresh pages, 6.9 ms a
    # step of the autobatched Tree-LSTM; 2.1 in place)
    if xp is np and scale == 1:  # (under the limit: nothing to write; NumPy's scale is here)
        return Tensor(xp.asarray(total))
    shared = _sharing_memory(grads) if xp is np else range(len(grads))
    for i, (p, g) in enumerate(zip(params, grads)):
        if i in shared or not g.flags.writeable:
            p.grad = Tensor(g * scale.astype(g.dtype))
        else:
            g *= scale.astype(g.dtype)
    return Tensor(xp.asarray(total))


def _sharing_memory(arrays):
    """The positions of the NumPy ``arrays`` whose bytes may overlap another's: each run of
    overlapping byte ranges, taken in order of address (a conservative test: two views that
    interleave without sharing an element count as sharing)."""
    spans = sorted((*byte_bounds(a), i) for i, a in enumerate(arrays) if a.size)
    shared, run, reach = set(), [], -1
    for lo, hi, i in spans:
        if lo >= reach:  # (a new run: it overlaps none of those before)
            if len(run) > 1:
                shared.update(run)
            run = []
        run.append(i)
        reach = max(reach, hi)
    if len(run) > 1:
        shared.update(run)
    return shared
