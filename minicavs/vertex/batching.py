"""Batching rules: how an op written for one vertex runs on a whole batching task.

Inside a cell, the user sees per-vertex shapes: ``v.pull()`` is an (E,) symbol. The graph F
that minicavs records is the *batched* one: every per-vertex symbol gets a leading axis over the
vertices of a task, of symbolic size ``VERTICES`` (or ``EDGES`` for per-edge symbols). Each op
applied to a :class:`VertexSymbol` is rewritten here into ops on batched symbols (JAX calls
these batching rules): elementwise ops align ranks, axes shift by one, a vertex vector times a
parameter matrix is one GEMM over all rows of the task.

The symbolic sizes are two large primes. A shape entry divisible by one of them contains the
batch axis exactly once, so :func:`instantiate` can turn any recorded attribute (a reshape
target, a row count) into the real one for a task with n vertices and e edges. Because F is
recorded batched, its backward ∂F — derived by the ordinary symbolic VJPs — is batched too, and
the parameter gradient of ``x @ W`` comes out as one product Xᵀ·G over all rows.
"""

import numpy as np

from ..errors import GraphError, MinicavsError
from ..ops import index, registry, shape as shape_ops
from ..ops.registry import Aval
from ..ops.operators import OperatorMixin
from ..autodiff.symbolic import Symbol, _format_location, _user_location

VERTICES = 1_000_003  # symbolic number of vertices in a task (a prime)
EDGES = 1_000_033  # symbolic number of edges in a task (another prime)


def instantiate(value, num_vertices, num_edges):
    """Replace the symbolic sizes in an attribute value by a task's real sizes."""
    if isinstance(value, tuple):
        return tuple(instantiate(v, num_vertices, num_edges) for v in value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= VERTICES:
        if value % VERTICES == 0:
            return int(value) // VERTICES * num_vertices
        if value % EDGES == 0:
            return int(value) // EDGES * num_edges
    return value


def has_symbolic_size(value):
    if isinstance(value, tuple):
        return any(has_symbolic_size(v) for v in value)
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and value >= VERTICES and (value % VERTICES == 0 or value % EDGES == 0))


def row_domain(shape):
    """"vertex" or "edge" if the leading axis is a task's rows; None if unbatched."""
    if shape and shape[0] == VERTICES:
        return "vertex"
    if shape and shape[0] == EDGES:
        return "edge"
    return None


class VertexSymbol(OperatorMixin):
    """A per-vertex (or per-edge) view of a batched Symbol, as the cell's code sees it."""

    __slots__ = ("symbol", "domain", "trace")
    __minicavs_priority__ = 3

    def __init__(self, symbol, domain, trace):
        self.symbol = symbol
        self.domain = domain  # "vertex", "edge", or None for values shared by all vertices
        self.trace = trace

    @property
    def shape(self):
        return self.symbol.shape[1:] if self.domain else self.symbol.shape

    @property
    def dtype(self):
        return self.symbol.dtype

    def __repr__(self):
        where = f"per {self.domain}" if self.domain else "shared"
        return f"VertexSymbol({self.symbol.label()}, shape={self.shape}, {where})"

    def __bool__(self):
        return self.symbol.__bool__()

    def __array__(self, *args, **kwargs):
        return self.symbol.__array__()

    @classmethod
    def __minicavs_apply__(cls, op, args, attrs):
        trace = next(a.trace for a in args if isinstance(a, VertexSymbol))
        return trace.apply(op, args, attrs)


class BatchedTrace:
    """Applies batching rules while a cell is traced; owns the underlying symbolic Tracer."""

    def __init__(self, tracer, edge_parent):
        self.tracer = tracer
        self.edge_parent = edge_parent  # per-edge index of the parent row (a graph input)
        self._on_edges = {}  # id(vertex symbol) -> its broadcast to edges

    def wrap(self, symbol):
        return VertexSymbol(symbol, row_domain(symbol.shape), self)

    def to_edges(self, symbol):
        """A per-vertex symbol repeated for each edge of the vertex (one take of rows)."""
        edges = self._on_edges.get(id(symbol))
        if edges is None:
            edges = index.take_rows(symbol, self.edge_parent())
            self._on_edges[id(symbol)] = edges
        return edges

    def apply(self, op, args, attrs):
        where = _user_location()
        items = []  # (batched symbol, domain) per argument
        for i, a in enumerate(args):
            if isinstance(a, VertexSymbol):
                items.append((a.symbol, a.domain))
            elif isinstance(a, Symbol):
                raise GraphError(f"op '{op.name}': argument {i} is a symbol of another trace"
                                 + _format_location(where))
            else:  # a captured Tensor, a constant
                items.append((self.tracer._as_symbol(op, i, a, where), None))
        domains = {d for _, d in items if d}
        if len(domains) > 1:  # per-edge work that uses per-vertex values
            items = [(self.to_edges(s) if d == "vertex" else s, "edge" if d else None)
                     for s, d in items]
            domains = {"edge"}
        # Check shapes as the user wrote them (per vertex), so errors speak their language.
        per_vertex = [Aval(s.shape[1:] if d else s.shape, s.dtype) for s, d in items]
        try:
            out = op.infer(*per_vertex, **attrs)
        except MinicavsError as exc:
            raise type(exc)(str(exc) + _format_location(where)) from None
        if not domains:
            return VertexSymbol(registry.apply(op, *[s for s, _ in items], **attrs), None, self)
        rule = _RULES.get(op.name) or (_elementwise_rule if op.is_elementwise else None)
        if rule is None:
            raise GraphError(f"op '{op.name}' has no batching rule, so it cannot be used inside "
                             f"a vertex function" + _format_location(where))
        result = rule(op, items, attrs, out)
        return self.wrap(result)


# --- the rules: (op, [(symbol, domain)], attrs, per-vertex output aval) -> batched symbol ------

def _rows(domain):
    return VERTICES if domain == "vertex" else EDGES


def _lift(symbol, domain, rank):
    """A batched symbol with its per-row part padded with leading 1s to ``rank`` dims."""
    per_row = symbol.shape[1:]
    if len(per_row) >= rank:
        return symbol
    return shape_ops.reshape(symbol, (_rows(domain),) + (1,) * (rank - len(per_row)) + per_row)


def _elementwise_rule(op, items, attrs, out):
    rank = len(out.shape)
    args = [_lift(s, d, rank) if d else s for s, d in items]
    return registry.apply(op, *args, **attrs)


def _shift(axes):
    return tuple(a + 1 for a in axes)


def _reduce_rule(op, items, attrs, out):
    (x, _), = items
    return registry.apply(op, x, **dict(attrs, axes=_shift(attrs["axes"])))


def _reshape_rule(op, items, attrs, out):
    (x, d), = items
    return registry.apply(op, x, shape=(_rows(d),) + tuple(attrs["shape"]))


def _transpose_rule(op, items, attrs, out):
    (x, _), = items
    return registry.apply(op, x, axes=(0,) + _shift(attrs["axes"]))


def _broadcast_to_rule(op, items, attrs, out):
    (x, d), = items
    target = tuple(attrs["shape"])
    return registry.apply(op, _lift(x, d, len(target)), shape=(_rows(d),) + target)


def _axis_rule(op, items, attrs, out):
    """concat, slice_axis, pad_axis: the axis moves by one; shared operands are broadcast."""
    domain = next(d for _, d in items if d)
    args = [s if d else shape_ops.broadcast_to(s, (_rows(domain),) + tuple(s.shape))
            for s, d in items]
    return registry.apply(op, *args, **dict(attrs, axis=attrs["axis"] + 1))


def _matmul_rule(op, items, attrs, out):
    (a, da), (b, db) = items
    a_rank = len(a.shape) - (1 if da else 0)
    b_rank = len(b.shape) - (1 if db else 0)
    if da and not db:  # per-vertex @ shared: NumPy's rules already batch over the leading axis
        return registry.apply(op, a, b)
    if db and not da:  # shared @ per-vertex
        if b_rank == 1:  # A @ x for each vertex is X @ Aᵀ for the task
            if a_rank > 2:
                raise GraphError("op 'matmul': a shared stack of matrices times a per-vertex "
                                 "vector has no batching rule; reshape the stack to 2-D")
            a_t = a if a_rank == 1 else shape_ops.transpose(a)
            return registry.apply(op, b, a_t)
        return registry.apply(op, a, b)
    rows = _rows(da)
    a3 = shape_ops.reshape(a, (rows, 1) + a.shape[1:]) if a_rank == 1 else a
    b3 = shape_ops.reshape(b, (rows,) + b.shape[1:] + (1,)) if b_rank == 1 else b
    return shape_ops.reshape(registry.apply(op, a3, b3), (rows,) + tuple(out.shape))


def _take_rows_rule(op, items, attrs, out):
    (x, dx), (idx, di) = items
    if dx:
        raise GraphError("op 'take_rows': inside a vertex function the table must be shared "
                         "(a parameter), not a per-vertex value")
    flat = shape_ops.reshape(idx, (-1,)) if len(idx.shape) > 1 else idx
    rows = index.take_rows(x, flat)
    return shape_ops.reshape(rows, (_rows(di),) + tuple(out.shape))


def _leading_axes_rule(op, items, attrs, out):
    """Ops that already work over any leading axes (softmax_cross_entropy, one_hot)."""
    domain = next(d for _, d in items if d)
    args = [s if d else shape_ops.broadcast_to(s, (_rows(domain),) + tuple(s.shape))
            for s, d in items]
    return registry.apply(op, *args, **attrs)


_RULES = {
    "sum": _reduce_rule,
    "max": _reduce_rule,
    "reshape": _reshape_rule,
    "transpose": _transpose_rule,
    "broadcast_to": _broadcast_to_rule,
    "concat": _axis_rule,
    "slice_axis": _axis_rule,
    "pad_axis": _axis_rule,
    "matmul": _matmul_rule,
    "take_rows": _take_rows_rule,
    "softmax_cross_entropy": _leading_axes_rule,
    "one_hot": _leading_axes_rule,
}
