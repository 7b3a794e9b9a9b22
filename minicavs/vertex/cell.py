"""The traced cell: F declared once with gather/scatter/pull/push, traced and compiled once.

A cell is a function ``cell(v)`` that defines one vertex. :class:`TracedCell` calls it a single
time with a :class:`Vertex` whose primitives return per-vertex symbols (Cavs §3.1):

* ``v.pull()``      this vertex's external input (a row of the tensor passed as ``pull=``);
* ``v.gather(k)``   the state child k scattered (zeros where the vertex has no child k);
* ``v.gather_sum(fn=None)``  the sum over *all* children of ``fn(child_state)`` (default: the
  states themselves) — the child-sum form; ``fn`` may use the vertex's own symbols;
* ``v.scatter(x)``  this vertex's state, what its parents gather;
* ``v.push(x)``     this vertex's output to the outside (returned by ``F(batch, ...)``).

The recorded graph F is batched (see batching.py). The passes (``minicavs/runtime/passes.py``)
make the Programs of F and its derivative ∂F from it once, read through the small interface
``passes.CellGraph``; each Program gets its :class:`~minicavs.runtime.executable.Executable`
(its caches), and the cell its memory model. A traced cell does not run by itself: the kinded
call (kinds.py) binds the Programs of one cell per kind to each call's values, and a
:class:`~minicavs.vertex.function.VertexFunction` is that call with one kind.
"""

import numpy as np

from .. import backend, validate
from ..autodiff.symbolic import Graph, Symbol, Tracer
from ..errors import DTypeError, GraphError, ShapeError
from ..ops import index, shape as shape_ops
from ..ops.registry import describe
from ..runtime import memory, passes
from ..runtime.executable import Executable
from .batching import EDGES, VERTICES, BatchedTrace, VertexSymbol
from ..locations import format_location, user_location


class Vertex:
    """The vertex being defined, as the cell sees it (one object per trace)."""

    def __init__(self, function, tracer, defer_dtype_errors=False):
        self._f = function
        self._tracer = tracer
        # While F's dtype is provisional, a dtype mismatch is kept, not raised (see
        # TracedCell._trace_with_dtype).
        self.defer_dtype_errors = defer_dtype_errors
        self.dtype_errors = []
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
                             + format_location(user_location()))
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
                             + format_location(user_location()))
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
        where = user_location()
        if not isinstance(per_edge, VertexSymbol) or per_edge.domain is None:
            raise GraphError("gather_sum(fn): fn must return a value computed from the child's "
                             "state it is given" + format_location(where))
        edges = per_edge.symbol
        if per_edge.domain == "vertex":
            edges = self._trace.to_edges(edges)
        total = index.scatter_add_rows(edges, self.edge_parent(), VERTICES)
        self._f.gather_sum_shapes.append(total.shape[1:])  # for the per-sample reference
        return self._trace.wrap(total)

    def _as_vertex_symbol(self, x, what, shape, dtype):
        where = user_location()
        if isinstance(x, VertexSymbol):
            symbol, domain = x.symbol, x.domain
        elif isinstance(x, Symbol):
            symbol, domain = x, None
        else:
            raise GraphError(f"v.{what}(x): x must be a value computed in the cell, got "
                             f"{type(x).__name__}" + format_location(where))
        per_vertex = symbol.shape[1:] if domain else symbol.shape
        if domain == "edge":
            raise GraphError(f"v.{what}(x): x is a per-edge value; sum it over the children "
                             f"with v.gather_sum first" + format_location(where))
        if shape is not None and tuple(per_vertex) != tuple(shape):
            raise ShapeError(f"v.{what}(x): x has per-vertex shape {describe(per_vertex)}, but "
                             f"the vertex function declares {what}_shape={describe(shape)}"
                             + format_location(where))
        if symbol.dtype != dtype:
            f = self._f
            origin = ("given as dtype=" if f.dtype_given else
                      "inferred from its parameters and pull; no dtype= given")
            error = DTypeError(
                f"vertex function {f.name!r}: v.{what}(x): x has dtype {symbol.dtype}, but the "
                f"vertex function's states and outputs are {dtype} ({origin}"
                f"{repr(dtype.name) if f.dtype_given else ''}); pass VertexFunction(..., "
                f"dtype='{symbol.dtype}') or convert x with x.astype('{dtype}')"
                + format_location(where))
            if not self.defer_dtype_errors:
                raise error
            self.dtype_errors.append(error)
        if domain is None:  # the same value for every vertex
            symbol = shape_ops.broadcast_to(symbol, (VERTICES,) + tuple(per_vertex))
        return symbol

    def scatter(self, x):
        if self.scattered is not None:
            raise GraphError("v.scatter() called twice: a vertex scatters one state"
                             + format_location(user_location()))
        self.scattered = self._as_vertex_symbol(x, "scatter", self._f.scatter_shape, self._f.dtype)

    def push(self, x):
        if self.pushed is not None:
            raise GraphError("v.push() called twice: a vertex pushes one output"
                             + format_location(user_location()))
        self.pushed = self._as_vertex_symbol(x, "push", self._f.push_shape, self._f.dtype)


def _check_arguments(cell, name, arity):
    if not callable(cell):
        raise GraphError(f"VertexFunction: cell must be a function cell(v) that defines one "
                         f"vertex, got {type(cell).__name__}")
    if name is not None and not isinstance(name, str):
        raise GraphError(f"VertexFunction: name must be a string, got {validate.shown(name)}")
    if arity is not None:
        validate.integer(arity, "arity (the most children a vertex may have)",
                         "VertexFunction", minimum=0, error=GraphError)


class TracedCell:
    """One cell traced into F and compiled into the Programs of F and ∂F (the module docstring).

    The arguments are :class:`~minicavs.vertex.function.VertexFunction`'s. What the trace
    leaves: ``graph`` (F), its inputs by role (``pull_input``, ``gather_inputs`` of the slots
    ``gather_slots``, ``edge_child_input``/``edge_parent_input`` for ``gather_sum``) and its
    outputs (``scatter_output``, ``push_output``); ``dtype`` and ``pull_dtype`` as inferred;
    ``executable``/``backward_executable``, which run ``program``/``backward_program``.
    """

    def __init__(self, cell, scatter_shape, pull_shape=None, push_shape=None, arity=None,
                 dtype=None, pull_dtype=None, name=None, options=None):
        _check_arguments(cell, name, arity)
        self.name = name or getattr(cell, "__name__", "F")
        self.scatter_shape = validate.shape(scatter_shape, "scatter_shape", "VertexFunction",
                                            error=ShapeError)
        self.pull_shape = None if pull_shape is None else validate.shape(
            pull_shape, "pull_shape", "VertexFunction", error=ShapeError)
        self.push_shape = None if push_shape is None else validate.shape(
            push_shape, "push_shape", "VertexFunction", error=ShapeError)
        self.arity = arity
        # States carry gradients, so they are floats; pulled rows may be ids or features.
        if dtype is not None:
            dtype = validate.dtype(dtype, "dtype (of the states)", "VertexFunction", kinds="f",
                                   error=DTypeError)
        if pull_dtype is not None:
            pull_dtype = validate.dtype(pull_dtype, "pull_dtype", "VertexFunction",
                                        error=DTypeError)
        self.options = passes.Options.of(options)
        self.cell = cell
        self._trace_with_dtype(cell, dtype, pull_dtype)
        program, backward_program = passes.compile_programs(passes.CellGraph(
            self.name, self.graph, tuple(self.source_slots), self.edge_parent_input), self.options)
        # What runs the Programs, with their caches (buffers, level plans, native loops).
        self.executable = Executable(program)
        self.backward_executable = Executable(backward_program)
        self.executable.companion = self.backward_executable  # (∂F compiles beside F)
        self._memory_model = None

    def _trace_with_dtype(self, cell, dtype, pull_dtype):
        """Trace the cell. Without ``dtype``, F's float type is inferred: the common type of
        the float parameters the cell captures and of a float ``pull_dtype`` (the default
        dtype if there are none). The cell is traced once with a provisional dtype; if the
        parameters call for another, it is traced again with that one."""
        self.dtype_given = dtype is not None
        pull = None if pull_dtype is None else np.dtype(pull_dtype)
        provisional = (np.dtype(dtype) if dtype is not None else
                       pull if pull is not None and pull.kind == "f" else backend.default_dtype())
        v = self._trace(cell, provisional, pull or provisional, defer=not self.dtype_given)
        if not self.dtype_given:
            floats = [p.dtype for p in self.graph.captured if np.dtype(p.dtype).kind == "f"]
            floats += [pull] if pull is not None and pull.kind == "f" else []
            inferred = np.result_type(*floats) if floats else provisional
            if inferred != provisional:
                v = self._trace(cell, inferred, pull or inferred, defer=False)
            elif v.dtype_errors:
                raise v.dtype_errors[0]

    def _trace(self, cell, dtype, pull_dtype, defer):
        self.dtype, self.pull_dtype = np.dtype(dtype), np.dtype(pull_dtype)
        self.gather_sum_shapes = []
        tracer = Tracer()
        with tracer.active():
            v = Vertex(self, tracer, defer_dtype_errors=defer)
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
        self.graph = Graph(tracer.nodes, inputs, outputs, name=self.name)
        return v

    @property
    def source_slots(self):
        """Each input of F that carries children's states, with its child slot: ``(k,
        gather(k))``, and ``("edges", child state per edge)`` for ``gather_sum``."""
        slots = list(zip(self.gather_slots, self.gather_inputs))
        if self.edge_child_input is not None:
            slots.append(("edges", self.edge_child_input))
        return slots

    @property
    def sources(self):
        """The inputs of F that carry the children's states (the ends of the core path)."""
        return [s for _, s in self.source_slots]

    @property
    def params(self):
        """The Tensors (parameters) the cell closes over, captured as inputs of F."""
        return self.graph.captured

    @property
    def program(self):
        """F's Program (``program.dump()`` prints it)."""
        return self.executable.program

    @property
    def backward_program(self):
        """∂F's Program."""
        return self.backward_executable.program

    @property
    def backward_graph(self):
        return self.backward_program.graph

    @property
    def memory_model(self):
        """What a call needs, as bytes per vertex, edge and level row (memory.py)."""
        if self._memory_model is None:
            self._memory_model = memory.CallModel(self.program, self.backward_program)
        return self._memory_model

    def __repr__(self):
        return (f"{type(self).__name__}({self.name!r}: {len(self.graph.op_nodes())} ops in F, "
                f"{len(self.backward_graph.op_nodes())} in ∂F, {len(self.params)} params)")
