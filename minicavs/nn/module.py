"""Modules: containers of Parameters and of other Modules.

There is nothing to register by hand: a Module's attributes that are Parameters or Modules (or
lists and tuples of them) *are* its parameters and submodules, found by walking ``vars(self)``
in the order they were assigned. Names are dotted paths: ``encoder.weight``, ``layers.0.bias``.
"""

import numpy as np

from .. import backend
from ..autodiff import Parameter, versions
from ..errors import CheckpointError
from ..ops import embedding, linear
from ..ops.registry import describe
from . import init


class Module:
    """Base class of layers and models: define ``forward``; call the module to run it."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def _children(self):
        """(name, Parameter or Module) for each attribute that holds one, lists unpacked."""
        for name, value in vars(self).items():
            if isinstance(value, (Parameter, Module)):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, (Parameter, Module)):
                        yield f"{name}.{i}", item

    def named_parameters(self):
        """``(dotted name, Parameter)`` pairs in assignment order; a Parameter shared by two
        submodules comes once, under its first name, so an optimiser never updates it twice."""
        seen = set()

        def walk(module, path):
            for name, value in module._children():
                if isinstance(value, Module):
                    yield from walk(value, f"{path}{name}.")
                elif id(value) not in seen:
                    seen.add(id(value))
                    yield path + name, value

        return walk(self, "")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def state_dict(self):
        """``{name: NumPy array}``: a copy of every parameter's values."""
        return {name: backend.to_numpy(p._array).copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy ``state`` (from :meth:`state_dict`) into the parameters, in place.

        Names, shapes and dtypes must all match; otherwise nothing is changed and the
        :class:`CheckpointError` lists every mismatch.
        """
        params = dict(self.named_parameters())
        problems = state_mismatches(params, state)
        if problems:
            raise CheckpointError(f"load_state_dict: the state does not match "
                                  f"{type(self).__name__}:\n  " + "\n  ".join(problems))
        for name, p in params.items():
            xp = backend.get_array_module(p._array)
            xp.copyto(p._array, xp.asarray(state[name]))
            versions.changed(p)


def state_mismatches(params, state):
    """What differs between ``params`` ({name: Parameter}) and ``state`` ({name: array}), one
    line per problem: missing and unexpected names, then shapes and dtypes."""
    problems = [f"missing: {name!r} (the model has shape {describe(p.shape)}, {p.dtype})"
                for name, p in params.items() if name not in state]
    problems += [f"unexpected: {name!r} (not a parameter of the model)"
                 for name in state if name not in params]
    for name, p in params.items():
        if name not in state:
            continue
        value = state[name]
        if tuple(value.shape) != tuple(p.shape):
            problems.append(f"{name!r}: shape {describe(p.shape)} in the model, "
                            f"{describe(value.shape)} in the state")
        if np.dtype(value.dtype) != np.dtype(p.dtype):
            problems.append(f"{name!r}: dtype {p.dtype} in the model, {value.dtype} in the state")
    return problems


class Linear(Module):
    """``y = x @ weight + bias``; ``weight`` is stored (in_features, out_features)."""

    def __init__(self, in_features, out_features, bias=True, dtype=None):
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = Parameter(init.xavier_uniform((in_features, out_features), dtype=dtype))
        self.bias = Parameter(init.zeros((out_features,), dtype)) if bias else None

    def forward(self, x):
        return linear(x, self.weight, self.bias)


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``dim``, looked up by integer ids of any
    shape (result: ``ids.shape + (dim,)``). Initialised U(-0.05, 0.05)."""

    def __init__(self, num_embeddings, dim, dtype=None):
        self.num_embeddings, self.dim = int(num_embeddings), int(dim)
        self.weight = Parameter(init.uniform((num_embeddings, dim), -0.05, 0.05, dtype))

    def forward(self, ids):
        return embedding(self.weight, ids)
