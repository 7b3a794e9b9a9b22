"""What a call of a vertex function checks of its arguments, and how it reads its figures.

A :class:`KindedFunction` (one cell per kind; also what ``mc.recursive`` runs) and its one-kind
case :class:`VertexFunction` are one differentiable op over a GraphBatch; this base holds the
messages for the mistakes of a call and ``explain()``, the way to read a call's figures.
"""

import numpy as np

from ..errors import DTypeError, GraphError, ShapeError
from ..ops import registry
from ..ops.registry import describe
from .graphs import GraphBatch, InputGraph


class BatchedFunction:
    """Base of the vertex-function front-ends. Subclasses set ``name``, ``pull_shape``,
    ``pull_dtype``, ``push_shape`` (None: F returns its states), ``scatter_shape``, ``dtype``,
    ``arity``, ``_op`` (the op a call applies) and ``_last_stats``."""

    def _check_call(self, batch, pull, who="the cell"):
        """The batch (an InputGraph is a batch of one) and whether ``pull`` is given as F
        needs; returns the GraphBatch."""
        if isinstance(batch, InputGraph):
            batch = GraphBatch([batch])
        if not isinstance(batch, GraphBatch):
            raise GraphError(f"vertex function {self.name!r} is called on a GraphBatch, got "
                             f"{type(batch).__name__}")
        if self.arity is not None:
            batch.check_arity(self.arity, f"vertex function {self.name!r}")
        if (pull is None) != (self.pull_shape is None):
            raise GraphError(f"vertex function {self.name!r}: "
                             + (f"pull= is required ({who} calls v.pull())" if pull is None
                                else f"{who} pulls nothing, but pull= was given"))
        return batch

    def _infer_output(self, avals, batch):
        """The output's shape and dtype, after checking the pulled input's (``avals[0]``)."""
        if self.pull_shape is not None:
            pull = avals[0]
            expected = (batch.num_vertices,) + self.pull_shape
            if tuple(pull.shape) != expected:
                raise ShapeError(f"vertex function {self.name!r}: pull has shape "
                                 f"{describe(pull.shape)}, expected {describe(expected)} "
                                 f"(one row per vertex of the batch)")
            if np.dtype(pull.dtype) != self.pull_dtype:
                raise DTypeError(f"vertex function {self.name!r}: pull has dtype "
                                 f"{np.dtype(pull.dtype)}, expected {self.pull_dtype}; declare "
                                 f"VertexFunction(..., pull_dtype='{np.dtype(pull.dtype)}') or "
                                 f"convert it with pull.astype('{self.pull_dtype}')")
        shape = self.push_shape if self.push_shape is not None else self.scatter_shape
        return registry.Aval((batch.num_vertices,) + shape, self.dtype)

    def _argument_names(self, params):
        """What messages call the op's arguments: its pulled input, its parameters."""
        def where(p):
            at = getattr(p, "where", None)
            return f" (captured at {at[0]}:{at[1]})" if at else ""
        return (["the pulled input"] if self.pull_shape is not None else []) + [
            f"parameter {p.name!r}{where(p)}" for p in params]

    def explain(self, out=None):
        """Figures of one call (and of its backward, once run): levels, vertices and
        instructions run per level (per kind for kinds), seconds spent where, and which backend
        ran each level loop. ``out``: a Tensor this function returned, for that call's figures;
        default the latest call. ``F.program.dump()`` shows the instructions themselves."""
        if out is not None:
            record = getattr(out, "_creator", None)
            if not isinstance(record, tuple) or record[0].op is not self._op:
                raise GraphError(f"explain(out): out was not returned by vertex function "
                                 f"{self.name!r} (or its record was released by backward)")
            return record[0].attrs["call"].stats
        if self._last_stats is None:
            raise GraphError("explain(): the vertex function has not run yet")
        return self._last_stats
