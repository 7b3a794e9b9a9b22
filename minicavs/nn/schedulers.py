"""Learning-rate schedules: each sets ``group["lr"]`` of every parameter group of an
optimiser from the group's initial rate and a step count. Call ``scheduler.step()`` once per
epoch or per update, after ``optimizer.step()``, as in PyTorch.

``StepLR`` (multiply by ``gamma`` every ``step_size`` steps), ``CosineAnnealingLR`` (half a
cosine from the initial rate down to ``eta_min`` over ``T_max`` steps, after an optional linear
warm-up), ``LinearWarmup`` (from ``start_factor`` of the rate up to the full rate over
``warmup_steps``) and ``LambdaLR`` (any factor ``fn(step)``).
"""

import math

from .optim import Optimizer


class LRScheduler:
    """Base class: ``lr_at(base_lr, step)`` is the rate of a group whose initial rate is
    ``base_lr`` after ``step`` calls of :meth:`step`. The rate for step 0 is set at once."""

    def __init__(self, optimizer):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__}: expected an Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def lr_at(self, base_lr, step):
        raise NotImplementedError

    def _apply(self):
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(base, self.last_step)

    def step(self):
        self.last_step += 1
        self._apply()

    def get_last_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        return {"type": type(self).__name__, "last_step": self.last_step,
                "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state):
        if state.get("type") != type(self).__name__:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state is for "
                             f"{state.get('type')!r}")
        if len(state["base_lrs"]) != len(self.base_lrs):
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state has "
                             f"{len(state['base_lrs'])} parameter groups, the optimiser "
                             f"{len(self.base_lrs)}")
        self.last_step = int(state["last_step"])
        self.base_lrs = [float(b) for b in state["base_lrs"]]
        self._apply()


class StepLR(LRScheduler):
    """``base_lr * gamma ** (step // step_size)``."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if step_size < 1:
            raise ValueError(f"StepLR: step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer)

    def lr_at(self, base_lr, step):
        return base_lr * self.gamma ** (step // self.step_size)


class LinearWarmup(LRScheduler):
    """From ``start_factor * base_lr`` up to ``base_lr`` in ``warmup_steps`` equal steps,
    then constant."""

    def __init__(self, optimizer, warmup_steps, start_factor=0.0):
        if warmup_steps < 0 or not 0.0 <= start_factor <= 1.0:
            raise ValueError(f"LinearWarmup: warmup_steps must be >= 0 and start_factor in "
                             f"[0, 1], got {warmup_steps} and {start_factor}")
        self.warmup_steps, self.start_factor = int(warmup_steps), float(start_factor)
        super().__init__(optimizer)

    def lr_at(self, base_lr, step):
        if step >= self.warmup_steps:
            return base_lr
        return base_lr * (self.start_factor + (1 - self.start_factor) * step / self.warmup_steps)


class CosineAnnealingLR(LRScheduler):
    """``eta_min + (base_lr - eta_min) * (1 + cos(π t / T_max)) / 2`` for t = 0 .. T_max, then
    ``eta_min``. With ``warmup_steps``, the rate first rises linearly from 0 over that many
    steps and the cosine runs over the ``T_max`` steps after it."""

    def __init__(self, optimizer, T_max, eta_min=0.0, warmup_steps=0):
        if T_max < 1 or warmup_steps < 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be >= 1 and warmup_steps >= 0, "
                             f"got {T_max} and {warmup_steps}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        self.warmup_steps = int(warmup_steps)
        super().__init__(optimizer)

    def lr_at(self, base_lr, step):
        if step < self.warmup_steps:
            return base_lr * step / self.warmup_steps
        t = min(step - self.warmup_steps, self.T_max)
        cosine = (1 + math.cos(math.pi * t / self.T_max)) / 2
        return self.eta_min + (base_lr - self.eta_min) * cosine


class LambdaLR(LRScheduler):
    """``base_lr * fn(step)``."""

    def __init__(self, optimizer, fn):
        self.fn = fn
        super().__init__(optimizer)

    def lr_at(self, base_lr, step):
        return base_lr * float(self.fn(step))
