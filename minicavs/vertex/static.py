"""Static functions: ``mc.symbolic(fn, *specs)``, a traced graph used as one differentiable op.

Static declaration (Cavs Fig. 2a): the function is traced once; its graph and the graph of its
derivative go through the same passes as a vertex function's (rewrites, fusion) and run on the
same driver — a Program with no levels, only an eager phase. ``backward(create_graph=True)``
replays both programs on recorded Tensors, so the gradient is differentiable again.
"""

import numpy as np

from .. import backend
from ..runtime.executor import RECORD
from ..autodiff.symbolic import Symbol, trace
from ..autodiff.tensor import Tensor, is_grad_enabled
from ..errors import DTypeError, GraphError, ShapeError
from ..ops import registry
from ..ops.registry import Aval, Op
from ..runtime import call, driver
from ..runtime.executable import Executable
from ..runtime.passes import compile_static


class StaticFunction:
    """A traced function used as one differentiable op on Tensors (see :func:`symbolic`).

    Given input specs, it is traced once, now. Without them (``@mc.symbolic`` as a bare
    decorator) it is traced at its first call, for the shapes and dtypes of that call's
    arguments, and again for each new combination (the traces are kept, as ``jax.jit`` does)."""

    def __init__(self, fn, input_specs, name=None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "static")
        self._traces = {}  # (shape, dtype) of each input -> _Trace
        self._latest = None
        if input_specs is not None:
            self._latest = _Trace(fn, input_specs, self.name)
            self._traces[None] = self._latest
        self.__doc__ = getattr(fn, "__doc__", None)

    def _current(self):
        if self._latest is None:
            raise GraphError(f"static function {self.name!r} has not been traced yet: it is "
                             f"traced at its first call, for that call's input shapes")
        return self._latest

    @property
    def graph(self):
        return self._current().graph

    @property
    def program(self):
        return self._current().forward.program

    @property
    def backward_program(self):
        return self._current().backward.program

    @property
    def backward_graph(self):
        return self.backward_program.graph

    @property
    def graphs(self):
        """The graph of every trace so far."""
        return [t.graph for t in self._traces.values()]

    def __call__(self, *args):
        if any(isinstance(a, Symbol) for a in args) or (
                registry.recording_threads and registry.recording.scope is not None):
            # inside another trace, or an mc.autobatch block: the function inlined, its ops
            # recorded (and batched) with the rest (as one op, its ∂ would be traced there)
            return self.fn(*args)
        if None in self._traces:
            trace_ = self._traces[None]
        else:
            key = tuple(_signature(i, a) for i, a in enumerate(args))
            trace_ = self._traces.get(key)
            if trace_ is None:
                trace_ = self._traces[key] = _Trace(self.fn, [spec_ for spec_ in key], self.name)
        self._latest = trace_
        return trace_(*args)

    def __repr__(self):
        traced = ", ".join(str(len(t.graph.op_nodes())) for t in self._traces.values())
        return f"StaticFunction({self.name!r}: {len(self._traces)} trace(s), ops {traced or '-'})"


def _signature(position, a):
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise GraphError(f"static function: argument {position} is a {type(a).__name__}; pass "
                         f"Tensors or arrays (their shapes and dtypes decide the trace)")
    return (tuple(int(d) for d in a.shape), np.dtype(a.dtype))


class _Trace:
    """One trace of a static function: its graph, the Programs of it and of its derivative,
    and the op that runs them."""

    def __init__(self, fn, input_specs, name):
        self.name = name
        self.graph = trace(fn, *input_specs, name=name)
        self.forward, self.backward = map(Executable, compile_static(self.graph))
        self._op = Op(f"static:{name}", self._forward, self._infer, self._vjp,
                      multi_output=len(self.graph.outputs) > 1)

    def __call__(self, *args):
        if len(args) != len(self.graph.inputs):
            raise GraphError(f"static function {self.name!r} takes {len(self.graph.inputs)} "
                             f"inputs, got {len(args)}")
        # ``saved`` is this call's box for the forward values ∂ reads: the op itself holds no
        # state, the call's attributes (kept by the autodiff record) do.
        return registry.apply(self._op, *args, *self.graph.captured, saved={})

    def _infer(self, *avals, saved):
        n_in = len(self.graph.inputs)
        for i, (a, s) in enumerate(zip(avals[:n_in], self.graph.inputs)):
            if tuple(a.shape) != s.shape or np.dtype(a.dtype) != s.dtype:
                error = ShapeError if tuple(a.shape) != s.shape else DTypeError
                raise error(f"static function {self.name!r}: argument {i} has shape "
                            f"{tuple(a.shape)} and dtype {np.dtype(a.dtype)}, but it was traced "
                            f"for shape {s.shape} and dtype {s.dtype}")
        outs = [Aval(o.shape, o.dtype) for o in self.graph.outputs]
        return tuple(outs) if self._op.multi_output else outs[0]

    def _run(self, exe, xp, values):
        """Run ``exe``'s program on ``values`` (symbol -> value); returns its environment. On
        ``RECORD`` (differentiating again) constants are Tensors, recorded like the rest."""
        constants = None if xp is not RECORD else {
            n.key: Tensor(n.value) for n in exe.program.graph.nodes if n.kind == "const"}
        part = call.bind_static(exe, xp, values, constants)
        driver.run([part], xp)
        return part.env

    def _forward(self, xp, *arrays, saved):
        env = self._run(self.forward, xp, zip(self.graph.inputs + self.graph.params, arrays))
        outs = [env[o.key] for o in self.forward.program.graph.outputs]
        if is_grad_enabled():
            saved["env"] = env
        return tuple(outs) if self._op.multi_output else outs[0]

    def _vjp(self, g, out, *inputs, saved):
        gs = list(g) if self._op.multi_output else [g]
        bw = self.backward.program.graph
        if is_grad_enabled():  # create_graph: replay both programs on recorded Tensors
            xp = RECORD
            forward = self._run(self.forward, xp, zip(self.graph.inputs + self.graph.params,
                                                      inputs))
            zero = lambda o: Tensor(np.zeros(o.shape, o.dtype))  # noqa: E731
        else:
            xp = backend.get_array_module(*[t.data for t in inputs])
            forward = saved["env"]
            zero = lambda o: xp.zeros(o.shape, o.dtype)  # noqa: E731
            gs = [None if gi is None else gi.data for gi in gs]
        cotangents = [zero(o) if gi is None else gi for gi, o in zip(gs, self.graph.outputs)]
        env = self._run(self.backward, xp, list(zip(bw.cotangents, cotangents)) + [
            (ref, forward[value.key]) for ref, value in zip(bw.inputs[len(bw.cotangents):],
                                                           bw.forward_refs)])
        by_symbol = {s.key: env[o.key] for s, o in zip(bw.grad_of, bw.outputs)}
        wrap = (lambda v: v) if xp is RECORD else Tensor
        return [wrap(by_symbol[s.key]) if s.key in by_symbol else None
                for s in self.graph.inputs + self.graph.params]


def symbolic(fn=None, *input_specs, name=None):
    """Trace ``fn`` and return a :class:`StaticFunction`: a callable on Tensors that runs the
    traced graph and differentiates through ∂graph.

    ``input_specs`` are shapes, ``(shape, dtype)`` pairs, ``mc.spec(...)`` or example arrays;
    with them ``fn`` is traced now. Three decorator forms::

        @mc.symbolic                     # traced at the first call, per input shapes/dtypes
        @mc.symbolic()                   # the same
        @mc.symbolic((4, 8), (8,))       # traced now, for these specs
    """
    if fn is None:
        return lambda f: StaticFunction(f, input_specs or None, name=name)
    if not callable(fn):  # @mc.symbolic(spec, ...): fn is the first spec
        specs = (fn,) + input_specs
        return lambda f: StaticFunction(f, specs, name=name)
    return StaticFunction(fn, input_specs if input_specs else None, name=name)
