"""Vertex functions: F, declared once with gather/scatter/pull/push, traced and analysed once.

``VertexFunction(cell, ...)`` calls ``cell(v)`` a single time with a :class:`Vertex` whose
primitives return per-vertex symbols (Cavs §3.1):

* ``v.pull()``      this vertex's external input (a row of the tensor passed as ``pull=``);
* ``v.gather(k)``   the state child k scattered (zeros where the vertex has no child k);
* ``v.gather_sum(fn=None)``  the sum over *all* children of ``fn(child_state)`` (default: the
  states themselves) — the child-sum form; ``fn`` may use the vertex's own symbols;
* ``v.scatter(x)``  this vertex's state, what its parents gather;
* ``v.push(x)``     this vertex's output to the outside (returned by ``F(batch, ...)``).

The recorded graph F is batched (see batching.py); its backward ∂F is derived once, and both are
split into eager / core / lazy nodes (Cavs Proposition 1) for the runtime (runtime.py).
"""

import numpy as np

from .. import backend
from ..autodiff.symbolic import Graph, Symbol, Tracer, _format_location, _user_location
from ..errors import DTypeError, GraphError, ShapeError
from ..ops import index, registry, shape as shape_ops
from ..ops.registry import Op, describe
from . import runtime
from .batching import EDGES, VERTICES, BatchedTrace, VertexSymbol
from .graphs import GraphBatch


class Vertex:
    """The vertex being defined, as the cell sees it (one object per trace)."""

    def __init__(self, function, tracer):
        self._f = function
        self._tracer = tracer
        self._trace = BatchedTrace(tracer, self.edge_parent)
        self._pull = None
        self._gathers = {}
        self._edge_child = None
        self._edge_parent = None
        self.scattered = None
        self.pushed = None

    def pull(self):
        f = self._f
        if f.pull_shape is None:
            raise GraphError("v.pull() used, but the vertex function declares no pull_shape"
                             + _format_location(_user_location()))
        if self._pull is None:
            self._pull = self._tracer.input((VERTICES,) + f.pull_shape, f.pull_dtype,
                                            name="pull", role="pull")
        return self._trace.wrap(self._pull)

    def gather(self, k):
        f = self._f
        if f.arity is None or not 0 <= k < f.arity:
            declared = "declares no arity" if f.arity is None else f"declares arity {f.arity}"
            raise GraphError(f"v.gather({k}): the vertex function {declared}; gather(k) needs "
                             f"0 <= k < arity (use gather_sum for any number of children)"
                             + _format_location(_user_location()))
        if k not in self._gathers:
            self._gathers[k] = self._tracer.input((VERTICES,) + f.scatter_shape, f.dtype,
                                                  name=f"gather{k}", role=("gather", k))
        return self._trace.wrap(self._gathers[k])

    def edge_parent(self):
        if self._edge_parent is None:
            self._edge_parent = self._tracer.input((EDGES,), np.int64, name="edge_parent",
                                                   role="edge_parent")
        return self._edge_parent

    def gather_sum(self, fn=None):
        """Σ over the children c of ``fn(state of c)``; without ``fn``, Σ of the states."""
        f = self._f
        if self._edge_child is None:
            self._edge_child = self._tracer.input((EDGES,) + f.scatter_shape, f.dtype,
                                                  name="child_state", role="edge_child")
        child = self._trace.wrap(self._edge_child)
        per_edge = child if fn is None else fn(child)
        where = _user_location()
        if not isinstance(per_edge, VertexSymbol) or per_edge.domain is None:
            raise GraphError("gather_sum(fn): fn must return a value computed from the child's "
                             "state it is given" + _format_location(where))
        edges = per_edge.symbol
        if per_edge.domain == "vertex":
            edges = self._trace.to_edges(edges)
        total = index.scatter_add_rows(edges, self.edge_parent(), VERTICES)
        self._f.gather_sum_shapes.append(total.shape[1:])  # for the per-sample reference
        return self._trace.wrap(total)

    def _as_vertex_symbol(self, x, what, shape, dtype):
        where = _user_location()
        if isinstance(x, VertexSymbol):
            symbol, domain = x.symbol, x.domain
        elif isinstance(x, Symbol):
            symbol, domain = x, None
        else:
            raise GraphError(f"v.{what}(x): x must be a value computed in the cell, got "
                             f"{type(x).__name__}" + _format_location(where))
        per_vertex = symbol.shape[1:] if domain else symbol.shape
        if domain == "edge":
            raise GraphError(f"v.{what}(x): x is a per-edge value; sum it over the children "
                             f"with v.gather_sum first" + _format_location(where))
        if shape is not None and tuple(per_vertex) != tuple(shape):
            raise ShapeError(f"v.{what}(x): x has per-vertex shape {describe(per_vertex)}, but "
                             f"the vertex function declares {what}_shape={describe(shape)}"
                             + _format_location(where))
        if symbol.dtype != dtype:
            raise DTypeError(f"v.{what}(x): x has dtype {symbol.dtype}, the vertex function "
                             f"uses {dtype}" + _format_location(where))
        if domain is None:  # the same value for every vertex
            symbol = shape_ops.broadcast_to(symbol, (VERTICES,) + tuple(per_vertex))
        return symbol

    def scatter(self, x):
        if self.scattered is not None:
            raise GraphError("v.scatter() called twice: a vertex scatters one state"
                             + _format_location(_user_location()))
        self.scattered = self._as_vertex_symbol(x, "scatter", self._f.scatter_shape, self._f.dtype)

    def push(self, x):
        if self.pushed is not None:
            raise GraphError("v.push() called twice: a vertex pushes one output"
                             + _format_location(_user_location()))
        self.pushed = self._as_vertex_symbol(x, "push", self._f.push_shape, self._f.dtype)


class VertexFunction:
    """A static vertex function F, run over batches of input graphs by the Cavs runtime.

    ``pull_shape``/``push_shape`` may be None (no external input / output). ``arity`` bounds
    the children ``gather(k)`` can address; ``dtype`` is the float type of states (default:
    ``mc.default_dtype()``), ``pull_dtype`` that of pulled rows (e.g. int64 word ids).

    ``F(batch, pull=X)`` returns a Tensor with one row per vertex in the batch's vertex order:
    the pushed outputs, or the scattered states if the cell pushes nothing.
    """

    def __init__(self, cell, scatter_shape, pull_shape=None, push_shape=None, arity=None,
                 dtype=None, pull_dtype=None, name=None, options=None):
        self.name = name or getattr(cell, "__name__", "F")
        self.scatter_shape = tuple(scatter_shape)
        self.pull_shape = None if pull_shape is None else tuple(pull_shape)
        self.push_shape = None if push_shape is None else tuple(push_shape)
        self.arity = arity
        self.dtype = np.dtype(dtype) if dtype is not None else backend.default_dtype()
        self.pull_dtype = np.dtype(pull_dtype) if pull_dtype is not None else self.dtype
        self.options = runtime.Options(**(options or {}))
        self.cell = cell
        self.gather_sum_shapes = []
        self._trace(cell)
        self.plan = runtime.Plan(self)
        self._op = Op(f"vertex:{self.name}", self.plan.forward, self._infer, self.plan.vjp)
        self.last_stats = None

    def _trace(self, cell):
        tracer = Tracer()
        with tracer.active():
            v = Vertex(self, tracer)
            cell(v)
        if v.scattered is None:
            raise GraphError(f"vertex function {self.name!r}: the cell never calls "
                             f"v.scatter(state)")
        if self.push_shape is not None and v.pushed is None:
            raise GraphError(f"vertex function {self.name!r} declares push_shape="
                             f"{self.push_shape} but the cell never calls v.push(x)")
        if v.pushed is not None and self.push_shape is None:
            self.push_shape = tuple(v.pushed.shape[1:])
        self.pull_input = v._pull
        self.gather_slots = sorted(v._gathers)  # the k of each gather(k) the cell uses
        self.gather_inputs = [v._gathers[k] for k in self.gather_slots]
        self.edge_child_input = v._edge_child
        self.edge_parent_input = v._edge_parent
        inputs = [s for s in [self.pull_input, *self.gather_inputs, self.edge_child_input,
                              self.edge_parent_input] if s is not None]
        self.scatter_output = v.scattered
        self.push_output = v.pushed
        outputs = [self.scatter_output] + ([self.push_output] if self.push_output is not None
                                           else [])
        nodes = _hoist_eager_addends(tracer.nodes, self.sources, outputs)
        self.graph = Graph(nodes, inputs, outputs, name=self.name)

    @property
    def sources(self):
        """The inputs of F that carry the children's states (the ends of the core path)."""
        return [x for x in self.gather_inputs + [self.edge_child_input] if x is not None]

    @property
    def params(self):
        """The Tensors (parameters) the cell closes over, captured as inputs of F."""
        return self.graph.captured

    @property
    def backward_graph(self):
        return self.plan.backward

    def _infer(self, *avals, batch, saved):  # noqa: ARG002 (saved: the call's state)
        pull = avals[0] if self.pull_shape is not None else None
        if pull is not None:
            expected = (batch.num_vertices,) + self.pull_shape
            if tuple(pull.shape) != expected:
                raise ShapeError(f"vertex function {self.name!r}: pull has shape "
                                 f"{describe(pull.shape)}, expected {describe(expected)} "
                                 f"(one row per vertex of the batch)")
            if np.dtype(pull.dtype) != self.pull_dtype:
                raise DTypeError(f"vertex function {self.name!r}: pull has dtype "
                                 f"{np.dtype(pull.dtype)}, expected {self.pull_dtype}")
        shape = self.push_shape if self.push_output is not None else self.scatter_shape
        return registry.Aval((batch.num_vertices,) + shape, self.dtype)

    def __call__(self, batch, pull=None):
        if not isinstance(batch, GraphBatch):
            raise GraphError(f"vertex function {self.name!r} is called on a GraphBatch, got "
                             f"{type(batch).__name__}")
        if self.arity is not None:
            batch.check_arity(self.arity, f"vertex function {self.name!r}")
        if (pull is None) != (self.pull_shape is None):
            raise GraphError(f"vertex function {self.name!r}: "
                             + ("pull= is required (the cell calls v.pull())"
                                if pull is None else "the cell pulls nothing, but pull= was given"))
        args = ([pull] if pull is not None else []) + self.params
        return registry.apply(self._op, *args, batch=batch, saved=runtime.CallState())

    def explain(self):
        """Figures of the last call: levels, vertices and ops per level, time spent where."""
        if self.last_stats is None:
            raise GraphError("explain(): the vertex function has not run yet")
        return self.last_stats

    def __repr__(self):
        return (f"VertexFunction({self.name!r}: {len(self.graph.op_nodes())} ops in F, "
                f"{len(self.plan.backward.op_nodes())} in ∂F, {len(self.params)} params)")


def _hoist_eager_addends(nodes, sources, outputs):
    """Regroup sums so that the terms that need no gathered state are added together first.

    ``x @ W + [h_l, h_r] @ U + b`` is recorded as ((x W + h U) + b): two additions per level.
    As ((x W + b) + h U) the first addition is eager — once for all vertices before the level
    loop — and only one runs per level (Cavs' eager batching, applied one step further). The sum
    is the same up to floating-point rounding; any op that allows the regrouping
    (``op.associative``: add, and mul likewise) is treated so. Returns the nodes with the
    rewritten ones added.
    """
    depends = {id(x) for x in sources}
    users = {}
    for n in nodes:
        users.setdefault(id(n), [])
        for x in n.inputs:
            users.setdefault(id(x), []).append(n)
        if any(id(x) in depends for x in n.inputs):
            depends.add(id(n))
    protected = {id(o) for o in outputs}
    result = []
    for n in nodes:
        op = n.op if n.kind == "op" and n.op.associative else None
        inner = n.inputs[0] if op is not None else None
        if (inner is not None and id(n.inputs[1]) not in depends and inner.kind == "op"
                and inner.op is op and id(inner) in depends and len(users[id(inner)]) == 1
                and id(inner) not in protected):
            eager = [x for x in inner.inputs if id(x) not in depends]
            core = [x for x in inner.inputs if id(x) in depends]
            if len(eager) == 1 and len(core) == 1:
                aval = op.infer(eager[0], n.inputs[1])
                hoisted = Symbol("op", aval.shape, aval.dtype, op=op,
                                 inputs=(eager[0], n.inputs[1]), where=n.where,
                                 tracer=n.tracer)
                result.append(hoisted)
                n.inputs = (hoisted, core[0])
        result.append(n)
    return result
