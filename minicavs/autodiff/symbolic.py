"""Symbolic graphs: trace a Python function once, get a static dataflow ``Graph``.

While tracing, ops applied to :class:`Symbol` objects record nodes instead of computing (the
op registry dispatches on the operand kind, so the same ``mc.tanh`` works on Tensors and
Symbols). Shapes and dtypes are inferred and checked as each node is recorded, and an error
points at the line of *user* code that made the bad node.

Tensors the traced function closes over are captured as graph inputs of kind ``"param"``
(the "outer reference" rule of the recursion paper, §5): their values are read each time the
graph runs, so an optimiser updating them in place is seen.

:func:`grad_graph` derives the backward graph ∂ symbolically, by running every op's VJP on
symbols; ∂ is an ordinary Graph whose inputs are output cotangents and the forward values it
needs. ``mc.symbolic`` (``minicavs/vertex/static.py``) wraps a traced function as a
differentiable op on Tensors (static declaration, Cavs Fig. 2a), run by the vertex interpreter.
"""

import itertools

import numpy as np

from .. import backend
from ..errors import ArgumentError, GraphError, MinicavsError, TracedBranchError
from ..locations import format_location, user_location
from ..ops import registry
from ..ops.operators import OperatorMixin
from ..ops.registry import Aval
from .tensor import Tensor

_KEYS = itertools.count()


class Symbol(OperatorMixin):
    """A value in a traced graph: an input, a captured parameter, a constant or an op's output.

    ``shape`` and ``dtype`` are static. ``inputs`` are the Symbols an op node consumes.
    """

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "kind", "value", "name", "where",
                 "tracer", "role", "key", "__weakref__")
    __minicavs_priority__ = 2  # a Symbol anywhere among the operands turns the call into a node

    def __init__(self, kind, shape, dtype, op=None, inputs=(), attrs=None, value=None, name=None,
                 where=None, tracer=None, role=None):
        self.kind = kind  # "input" | "param" | "const" | "op"
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.op, self.inputs, self.attrs = op, tuple(inputs), dict(attrs or {})
        self.value = value  # the constant's array, or the captured Tensor of a "param"
        self.name, self.where, self.tracer = name, where, tracer
        self.role = role  # free-form tag for the vertex runtime ("gather", "pull", ...)
        # What tables of symbols are keyed by (environments, plans, passes): unique for the
        # life of the process, unlike id(), which a collected symbol's successor may reuse.
        self.key = next(_KEYS)

    @classmethod
    def __minicavs_apply__(cls, op, args, attrs):
        if op.expand is not None:  # a fused op: its primitives go into the graph
            return op.expand(*args, **attrs)
        tracers = registry.tracers()
        if not tracers:
            raise GraphError(f"op '{op.name}' was applied to a Symbol outside of tracing: "
                             f"symbols exist only while their function is traced")
        return tracers[-1].record(op, args, attrs)

    def label(self):
        if self.kind == "op":
            return self.op.name
        return f"{self.kind} {self.name}" if self.name else self.kind

    def __repr__(self):
        return f"Symbol({self.label()}, shape={self.shape}, dtype={self.dtype})"

    # A Symbol has no value while tracing: explain instead of failing deep inside NumPy.
    def __bool__(self):
        raise TracedBranchError(
            f"the truth value of a traced {self!r} is unknown while tracing: Python control flow "
            f"(if/while) cannot depend on values inside a traced function. Use mc.where(cond, a, b) "
            f"for a choice per element, or branch outside the function."
            + format_location(user_location()))

    def __array__(self, *args, **kwargs):
        raise GraphError(f"{self!r} has no value while tracing; it cannot become a NumPy array. "
                         "Compute with mc.* functions inside traced functions."
                         + format_location(user_location()))

    def _no_number(self, conversion="conversion to a Python number"):
        raise GraphError(f"{conversion} of traced value '{self.label()}' of shape "
                         f"{registry.describe(self.shape)}: a symbol has no value while "
                         f"tracing, so it cannot become a Python number. Compute with mc.* "
                         f"functions (mc.astype for a dtype change) inside traced functions."
                         + format_location(user_location()))

    def __float__(self): self._no_number("float()")
    def __int__(self): self._no_number("int()")
    def __index__(self): self._no_number("use as an index")
    def __complex__(self): self._no_number("complex()")
    def item(self): self._no_number(".item()")
    def tolist(self): self._no_number(".tolist()")
    def numpy(self): return self.__array__()


# --- tracing --------------------------------------------------------------------------------------

class Tracer:
    """Records the nodes of one graph while a function is being traced."""

    def __init__(self):
        self.nodes = []
        self.captured = {}  # id(Tensor) -> its "param" Symbol
        self.captured_tensors = []
        self.location = None  # the (file, line) recorded nodes get; None: the user's line

    def active(self):
        """A block in which this tracer records the thread's ops (``registry.tracing``)."""
        return registry.tracing(self)

    def add(self, symbol):
        symbol.tracer = self
        self.nodes.append(symbol)
        return symbol

    def input(self, shape, dtype, name=None, role=None):
        return self.add(Symbol("input", shape, dtype, name=name, role=role))

    def capture(self, t, where=None):
        symbol = self.captured.get(id(t))
        if symbol is None:
            if t._creator is not None:
                raise GraphError(
                    "a traced function used a Tensor that was itself computed from parameters "
                    "outside the function; its gradient would stop there. Compute it inside "
                    "the traced function from the parameters instead."
                    + format_location(where))
            symbol = self.add(Symbol("param", t.shape, t.dtype, value=t, where=where,
                                     name=t.name or f"p{len(self.captured)}"))
            self.captured[id(t)] = symbol
            self.captured_tensors.append(t)
        return symbol

    def constant(self, value):
        value = np.asarray(value) if isinstance(value, np.generic) else value
        return self.add(Symbol("const", value.shape, value.dtype, value=value))

    def _as_symbol(self, op, position, a, where):
        if isinstance(a, Symbol):
            if a.tracer is not self:
                raise GraphError(f"op '{op.name}': argument {position} is a symbol of another "
                                 f"(finished or outer) trace; pass values into a traced function "
                                 f"as its inputs" + format_location(where))
            return a
        if isinstance(a, Tensor):
            return self.capture(a, where)
        is_array = backend.is_array(a)
        if isinstance(a, np.generic) or (is_array and a.ndim == 0):
            return self.constant(backend.to_numpy(a))
        if is_array and np.dtype(a.dtype).kind in "iub":
            return self.constant(a)  # integer arrays (indices, labels) are fixed data
        kind = type(a).__name__
        raise GraphError(
            f"op '{op.name}': argument {position} is a {kind} of shape "
            f"{getattr(a, 'shape', '?')}. A traced function captures only minicavs Tensors: "
            f"wrap the array as mc.Parameter(array) if it should be trained, or "
            f"mc.tensor(array) for a constant, and use that in the function."
            + format_location(where))

    def record(self, op, args, attrs):
        where = self.location or user_location()
        if op.multi_output:
            raise GraphError(f"op '{op.name}' returns several values and cannot be recorded in "
                             f"a traced graph" + format_location(where))
        inputs = [self._as_symbol(op, i, a, where) for i, a in enumerate(args)]
        try:
            aval = op.infer(*inputs, **attrs)
        except MinicavsError as exc:
            raise type(exc)(str(exc) + format_location(where)) from None
        return self.add(Symbol("op", aval.shape, aval.dtype, op=op, inputs=inputs, attrs=attrs,
                               where=where))


def _as_aval(spec, position):
    if isinstance(spec, (Aval, Symbol, Tensor)) or backend.is_array(spec):
        return Aval(tuple(spec.shape), np.dtype(spec.dtype))
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], (int, np.integer)):
        return Aval(tuple(spec[0]), np.dtype(spec[1]))
    if isinstance(spec, (tuple, list)):
        return Aval(tuple(spec), backend.default_dtype())
    raise ArgumentError(f"input spec {position}: expected a shape, (shape, dtype), an array or "
                        f"a Tensor, got {spec!r}")


def spec(shape, dtype=None):
    """The shape and dtype of a traced function's input: ``mc.spec((4, 8), "float64")``."""
    return Aval(tuple(shape), np.dtype(dtype) if dtype is not None else backend.default_dtype())


def trace(fn, *input_specs, name=None, input_names=None):
    """Trace ``fn`` on symbolic inputs once; return its :class:`Graph`."""
    tracer = Tracer()
    avals = [_as_aval(s, i) for i, s in enumerate(input_specs)]
    names = input_names or [f"x{i}" for i in range(len(avals))]
    with tracer.active():
        inputs = [tracer.input(a.shape, a.dtype, name=n) for a, n in zip(avals, names)]
        result = fn(*inputs)
    outputs = _as_outputs(result, getattr(fn, "__name__", "function"))
    return Graph(tracer.nodes, inputs, outputs, name=name or getattr(fn, "__name__", None))


def _as_outputs(result, fname):
    single = not isinstance(result, (tuple, list))
    outputs = [result] if single else list(result)
    for i, out in enumerate(outputs):
        if not isinstance(out, Symbol):
            raise GraphError(f"traced function {fname!r} must return symbols computed from its "
                             f"inputs; output {i} is {type(out).__name__}")
    return outputs


# --- graphs ---------------------------------------------------------------------------------------

class Graph:
    """A static dataflow graph: ``nodes`` in topological order, ``inputs``, ``outputs``, and the
    captured parameters (``params``, nodes of kind "param" whose ``value`` is the Tensor)."""

    def __init__(self, nodes, inputs, outputs, name=None):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.name = name
        self.nodes = _reachable_in_order(nodes, self.outputs, keep=self.inputs)
        self.params = [n for n in self.nodes if n.kind == "param"]

    @property
    def captured(self):
        """The Tensors the traced function closed over, in the order of ``params``."""
        return [p.value for p in self.params]

    def op_nodes(self):
        return [n for n in self.nodes if n.kind == "op"]

    def consumers(self):
        """node -> list of the nodes that use it (by identity)."""
        users = {n.key: [] for n in self.nodes}
        for n in self.nodes:
            for x in n.inputs:
                users[x.key].append(n)
        return users

    def evaluate(self, *input_arrays, params=None):
        """Run on arrays; return the list of output arrays. ``params`` overrides the captured
        Tensors' current values (a list of arrays in the order of ``self.params``)."""
        env = self.run(input_arrays, params)
        return [env[o.key] for o in self.outputs]

    def run(self, input_arrays, params=None, env=None):
        """Evaluate every node, op by op; return the environment ``node.key -> array``."""
        if len(input_arrays) != len(self.inputs):
            raise GraphError(f"graph {self.name!r} takes {len(self.inputs)} inputs, "
                             f"got {len(input_arrays)}")
        env = {} if env is None else env
        param_values = params if params is not None else [p.value.data for p in self.params]
        env.update(zip((s.key for s in self.inputs + self.params),
                       list(input_arrays) + param_values))
        xp = backend.get_array_module(*input_arrays, *param_values)
        for n in self.nodes:  # in traced order, which is topological: inputs come first
            if n.kind == "const" and n.key not in env:
                env[n.key] = n.value if xp is np else xp.asarray(n.value)
            elif n.kind == "op":
                if any(x.key not in env for x in n.inputs):
                    raise GraphError(f"graph {self.name!r}: {n!r} comes before its inputs")
                env[n.key] = n.op.forward(xp, *[env[x.key] for x in n.inputs], **n.attrs)
        return env

    def summary(self, classes=None, groups=None):
        """One line per node: index, what it is, shape, dtype, and its inputs. With the
        runtime's ``classes`` (``dependency_classes``) or ``groups`` (``fusion_groups``) each
        line also shows the node's eager/core/lazy class and fused group."""
        from .visualize import summary
        return summary(self, classes, groups)

    def to_dot(self, classes=None, groups=None):
        """Graphviz DOT text of the graph, fused ``groups`` as clusters and nodes coloured by
        their eager/core/lazy ``classes`` where given (see ``autodiff/visualize.py``)."""
        from .visualize import to_dot
        return to_dot(self, classes, groups)

    def __repr__(self):
        return (f"Graph({self.name!r}: {len(self.inputs)} inputs, {len(self.params)} params, "
                f"{len(self.op_nodes())} ops, {len(self.outputs)} outputs)")


def _reachable_in_order(nodes, outputs, keep=()):
    """The nodes that outputs depend on, in the given (topological) order; ``keep`` always."""
    needed = {k.key for k in keep}
    stack = list(outputs)
    while stack:
        n = stack.pop()
        if n.key in needed:
            continue
        needed.add(n.key)
        stack.extend(n.inputs)
    return [n for n in nodes if n.key in needed]


# --- symbolic backward ----------------------------------------------------------------------------

class BackwardGraph(Graph):
    """∂ of a forward graph. Inputs: one cotangent per forward output, then the forward values
    the VJPs read (``forward_refs[i]`` is the forward Symbol behind ``inputs[len(cotangents)+i]``).
    Outputs: the gradients of ``wrt`` (``grad_of[i]`` is the forward Symbol of output i)."""

    def __init__(self, nodes, cotangents, refs, outputs, grad_of, forward):
        self.cotangents, self.forward, self.grad_of = cotangents, forward, grad_of
        used = {x.key for n in _reachable_in_order(nodes, outputs) for x in (n,) + n.inputs}
        self.forward_refs = [fwd for fwd, sym in refs if sym.key in used]
        ref_inputs = [sym for fwd, sym in refs if sym.key in used]
        super().__init__(nodes, cotangents + ref_inputs, outputs,
                         name=f"d({forward.name})" if forward.name else "backward")


def grad_graph(graph, wrt=None, unreached="zeros", also=()):
    """Build ∂``graph``: the gradients of ``graph``'s outputs (weighted by cotangent inputs)
    with respect to ``wrt`` (default: every float input and captured parameter).

    A symbol of ``wrt`` that no output depends on gets a zero gradient (``unreached="zeros"``)
    or is left out of the outputs (``"drop"``); ``grad_of`` says which symbol each output is for.
    ``also``: forward op nodes whose whole cotangent is output too, after the gradients (the
    backward-batching strategy hands them to the product of a shared operand's gradient).
    """
    if wrt is None:
        wrt = [s for s in graph.inputs + graph.params if s.dtype.kind == "f"]
    wanted = {s.key for s in wrt}
    kept = {s.key: None for s in also}  # key -> its cotangent, once complete
    # Only nodes that depend on something in wrt (or in also) carry gradient.
    carries = set(wanted) | set(kept)
    for n in graph.nodes:
        if n.kind == "op" and any(x.key in carries for i, x in enumerate(n.inputs)
                                  if i not in n.op.nondiff_args):
            carries.add(n.key)

    tracer = Tracer()
    refs = {}  # forward symbol's key -> (forward symbol, backward input mirroring it)

    def mirror(s):
        if s.kind == "const":
            return tracer.constant(s.value) if s.key not in refs else refs[s.key][1]
        if s.key not in refs:
            refs[s.key] = (s, tracer.input(s.shape, s.dtype, name=f"fwd%{s.label()}", role="ref"))
        return refs[s.key][1]

    with tracer.active():
        cotangents = [tracer.input(o.shape, o.dtype, name=f"d_out{i}", role="cotangent")
                      for i, o in enumerate(graph.outputs)]
        grads = {}  # forward symbol's key -> the gradient contributions reaching it
        for o, c in zip(graph.outputs, cotangents):
            if o.key in carries:
                grads.setdefault(o.key, []).append(c)
        for n in reversed(graph.nodes):
            if n.kind != "op" or n.key not in grads or n.op.vjp is None:
                continue
            g = _sum_gradients(grads.pop(n.key))
            if n.key in kept:
                kept[n.key] = g
            tracer.location = n.where  # ∂'s nodes point at the line of the op they differentiate
            input_grads = n.op.vjp(g, mirror(n), *[mirror(x) for x in n.inputs], **n.attrs)
            tracer.location = None
            for i, (x, gx) in enumerate(zip(n.inputs, input_grads)):
                if gx is None or i in n.op.nondiff_args or x.key not in carries:
                    continue
                if isinstance(gx, Symbol) and gx.tracer is not tracer:
                    gx = tracer.constant(gx.value)
                grads.setdefault(x.key, []).append(gx)
        outputs, grad_of = [], []
        reached = [(s, _sum_gradients(grads[s.key]) if s.key in grads else None) for s in wrt
                   if s.key in grads or unreached != "drop"]
        for s, g in reached + [(s, kept[s.key]) for s in also]:
            if g is None:  # not reached: the gradient is zero
                g = tracer.constant(np.zeros(s.shape, s.dtype))
            elif not isinstance(g, Symbol) or g.tracer is not tracer or g.kind == "input":
                g = g + 0  # an output must be a node of its own (a cotangent passed through)
            outputs.append(g)
            grad_of.append(s)
    return BackwardGraph(tracer.nodes, cotangents, list(refs.values()), outputs, grad_of, graph)


def _sum_gradients(contributions):
    """Add up the gradients reaching one symbol. Terms made by an op that knows a cheaper way
    to add its values (``op.join``: the zero-padded gradients of slices become one concat) are
    joined first."""
    terms = list(contributions)
    joinable = {}  # id(op) -> the terms it made
    for g in terms:
        if isinstance(g, Symbol) and g.kind == "op" and g.op.join is not None:
            joinable.setdefault(id(g.op), []).append(g)
    for made in joinable.values():
        if len(made) > 1:
            rest = [g for g in terms if not any(g is m for m in made)]
            terms = made[0].op.join(made) + rest
    total = terms[0]
    for g in terms[1:]:
        total = total + g
    return total
