"""Tracing a cell: per-vertex symbols over the batched graph F.

Inside a cell, the user sees per-vertex shapes: ``v.pull()`` is an (E,) symbol. The graph F
that minicavs records is the *batched* one: every per-vertex symbol gets a leading axis over the
vertices of a task, of symbolic size ``VERTICES`` (or ``EDGES`` for per-edge symbols). Each op
applied to a :class:`VertexSymbol` is checked in per-vertex shapes, then rewritten into ops on
batched symbols by its batching rule (``op.batch``, declared with the op in minicavs/ops/; the
symbolic sizes and the rules' helpers are in ``minicavs/ops/batching.py``).

Because F is recorded batched, its backward ∂F — derived by the ordinary symbolic VJPs — is
batched too, and the parameter gradient of ``x @ W`` comes out as one product Xᵀ·G over all
rows.
"""

from ..errors import GraphError, MinicavsError
from ..ops import index, registry
from ..ops.batching import (EDGES, VERTICES, has_symbolic_size, instantiate,  # noqa: F401
                            row_domain)  # (re-exported: the runtime's names for them)
from ..ops.registry import Aval
from ..ops.operators import OperatorMixin
from ..autodiff.symbolic import Symbol
from ..locations import format_location, user_location


def _to_symbol(name):
    def method(self):
        return getattr(self.symbol, name)()
    method.__name__ = name
    return method


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

    def __array__(self, *args, **kwargs):
        return self.symbol.__array__()

    # A value while F is traced: the Symbol's own answer (an error naming the user's line).
    __bool__, __float__, __int__, __index__, __complex__, item, tolist = (
        _to_symbol(name) for name in ("__bool__", "__float__", "__int__", "__index__",
                                      "__complex__", "item", "tolist"))

    @classmethod
    def __minicavs_apply__(cls, op, args, attrs):
        trace = next(a.trace for a in args if isinstance(a, VertexSymbol))
        return trace.apply(op, args, attrs)


class BatchedTrace:
    """Applies batching rules while a cell is traced; owns the underlying symbolic Tracer."""

    def __init__(self, tracer, edge_parent):
        self.tracer = tracer
        self.edge_parent = edge_parent  # per-edge index of the parent row (a graph input)
        self._on_edges = {}  # vertex symbol's key -> its broadcast to edges

    def wrap(self, symbol):
        return VertexSymbol(symbol, row_domain(symbol.shape), self)

    def to_edges(self, symbol):
        """A per-vertex symbol repeated for each edge of the vertex (one take of rows)."""
        edges = self._on_edges.get(symbol.key)
        if edges is None:
            edges = index.take_rows(symbol, self.edge_parent())
            self._on_edges[symbol.key] = edges
        return edges

    def apply(self, op, args, attrs):
        where = user_location()
        items = []  # (batched symbol, domain) per argument
        for i, a in enumerate(args):
            if isinstance(a, VertexSymbol):
                items.append((a.symbol, a.domain))
            elif isinstance(a, Symbol) and a.tracer is not self.tracer:
                raise GraphError(f"op '{op.name}': argument {i} is a symbol of another trace"
                                 + format_location(where))
            else:  # a value shared by all vertices (made from parameters), a Tensor, a constant
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
            raise type(exc)(str(exc) + format_location(where)) from None
        if not domains:
            return VertexSymbol(registry.apply(op, *[s for s, _ in items], **attrs), None, self)
        if op.batch is None:
            raise GraphError(f"op '{op.name}' has no batching rule, so it cannot be used inside "
                             f"a vertex function" + format_location(where))
        return self.wrap(op.batch(op, items, attrs, out))
