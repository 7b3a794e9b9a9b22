"""Modules: containers of Parameters and of other Modules.

There is nothing to register by hand: a Module's attributes that are Parameters or Modules (or
lists, tuples and dicts of them, nested) *are* its parameters and submodules, found by walking
``vars(self)`` in the order they were assigned. Names are dotted paths: ``encoder.weight``,
``layers.0.bias``, ``heads.sentiment.weight``. The Parameters a function held in an
attribute uses are found too, after all the others, so optimisers and checkpoints see them:

* a vertex function or a static function (``mc.symbolic``): those its cell captured, ``F.W``
  (the Parameter's name, else ``p0``, ``p1``, ... in capture order);
* a function of several kinds (``VertexFunction.by_kind``): those of every kind's cell, each
  once, ``F.W`` (unnamed: ``F.<kind>.p0``, its place in that kind's capture order);
* a recursive function (``mc.recursive``): it is traced only on its first call, per kind of
  vertex, so before that nothing has been captured. What is knowable before is what its
  Python function closes over: Parameters in its closure cells and the globals it reads (also
  inside lists, tuples and dicts), named by the Parameter's name, else the variable
  (``F.table``, ``F.layers.0``) — the same names before and after the first call. Parameters
  reached only another way (an attribute, ``self.W``) join once a kind that uses them has been
  traced (``F.p0``, ...): hold them in the Module, or close over them, to have them from the
  start.

``train()`` and ``eval()`` set ``training`` on a module and every submodule: Dropout drops
only in training.
"""

import inspect

import numpy as np

from .. import backend
from ..autodiff import Parameter, versions
from ..errors import CheckpointError
from ..ops import embedding, linear
from ..ops.registry import describe
from ..vertex import KindedFunction, RecursiveFunction, StaticFunction, VertexFunction
from . import init


def _held(name, value, kinds):
    """(dotted name, item) for each instance of ``kinds`` that ``value`` is or holds in its
    lists, tuples and dicts."""
    if isinstance(value, kinds):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _held(f"{name}.{i}", item, kinds)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _held(f"{name}.{key}", item, kinds)


FUNCTIONS = (VertexFunction, StaticFunction, KindedFunction, RecursiveFunction)


def _captured(value):
    """(name, Parameter) for each Parameter a function of :data:`FUNCTIONS` uses (see the
    module docstring), each once, the names unique within the function."""
    if isinstance(value, VertexFunction):
        found = _graph_params([value.graph])
    elif isinstance(value, StaticFunction):
        found = _graph_params(value.graphs)
    elif isinstance(value, KindedFunction):
        found = [(name if p.name else f"{kind}.{name}", p) for kind, cell in value.cells.items()
                 for name, p in _graph_params([cell.graph])]
    elif isinstance(value, RecursiveFunction):
        found = list(_closed_over(value.fn))
        traced = [p for p in value.params if isinstance(p, Parameter)]  # in kind order
        found += [(p.name or f"p{i}", p) for i, p in enumerate(traced)]
    else:
        return
    seen, names = set(), set()
    for name, p in found:
        if id(p) in seen:
            continue
        seen.add(id(p))
        unique, k = name, 1
        while unique in names:  # two Parameters of one name: the second gets a suffix
            unique, k = f"{name}_{k}", k + 1
        names.add(unique)
        yield unique, p


def _graph_params(graphs):
    return [(node.name, node.value) for graph in graphs for node in graph.params
            if isinstance(node.value, Parameter)]


def _closed_over(fn):
    """(name, Parameter) for the Parameters ``fn``'s closure cells and the globals it reads
    hold, directly or in lists, tuples and dicts: what a recursive function can capture when
    it is traced, known before."""
    fn = getattr(fn, "__func__", fn)
    if not inspect.isfunction(fn):
        return
    variables = inspect.getclosurevars(fn)
    for scope in (variables.nonlocals, variables.globals):
        for variable, value in scope.items():
            for name, p in _held(variable, value, Parameter):
                yield (p.name or name), p


class Module:
    """Base class of layers and models: define ``forward``; call the module to run it."""

    training = True  # until train(False) or eval(); a class default, so __init__ may skip super

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def _children(self):
        """(name, Parameter or Module) for each one the attributes hold, containers unpacked."""
        for name, value in vars(self).items():
            yield from _held(name, value, (Parameter, Module))

    def named_modules(self, prefix=""):
        """``(dotted name, Module)`` for this module ("") and every submodule, each once."""
        seen = set()

        def walk(module, path):
            if id(module) in seen:
                return
            seen.add(id(module))
            yield path, module
            for name, value in module._children():
                if isinstance(value, Module):
                    yield from walk(value, f"{path}.{name}" if path else name)

        return walk(self, prefix)

    def modules(self):
        return [m for _, m in self.named_modules()]

    def named_parameters(self):
        """``(dotted name, Parameter)`` pairs in assignment order (depth first), then those only
        a function held in an attribute uses (see the module docstring); a Parameter shared by
        two submodules comes once, under its first name, so an optimiser never updates it twice."""
        seen, found = set(), []

        def walk(module, prefix, visited):
            if id(module) in visited:
                return
            visited.add(id(module))
            for name, value in module._children():
                if isinstance(value, Module):
                    walk(value, f"{prefix}{name}.", visited)
                elif id(value) not in seen:
                    seen.add(id(value))
                    found.append((prefix + name, value))

        walk(self, "", set())
        for path, module in self.named_modules():
            prefix = f"{path}." if path else ""
            for attribute, value in vars(module).items():
                for name, function in _held(attribute, value, FUNCTIONS):
                    for param_name, p in _captured(function):
                        if id(p) not in seen:
                            seen.add(id(p))
                            found.append((f"{prefix}{name}.{param_name}", p))
        return iter(found)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        """Training mode (``mode=False``: evaluation) for this module and every submodule."""
        for module in self.modules():
            module.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

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
            versions.writing(p)
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
