"""The VertexFunction API: a static vertex function F, declared once, run over batches of graphs.

``VertexFunction(cell, scatter_shape, ...)`` traces ``cell(v)`` once (cell.py: the four
primitives ``v.pull()``, ``v.gather(k)`` / ``v.gather_sum(fn)``, ``v.scatter(x)``,
``v.push(x)``) and compiles F and ∂F into Programs. It is then one differentiable op: its
forward runs F's Program through the runtime's driver, its VJP ∂F's. That op is the kinded
call of kinds.py with a single kind that owns every vertex — no kinds are computed and no rows
sorted — so one call path serves a plain vertex function, vertex kinds and recursive
definitions alike.
"""

from .cell import TracedCell
from .kinds import KindedFunction


class VertexFunction(TracedCell, KindedFunction):
    """A static vertex function F, run over batches of input graphs by the Cavs runtime.

    ``pull_shape``/``push_shape`` may be None (no external input / output). ``arity`` bounds
    the children ``gather(k)`` can address; ``dtype`` is the float type of states and outputs
    (default: inferred, the common type of the float parameters the cell closes over and of a
    float ``pull_dtype``, else ``mc.default_dtype()``); ``pull_dtype`` is that of pulled rows
    (e.g. int64 word ids; default: ``dtype``).
    ``options``: a dict of pass switches (:class:`~minicavs.vertex.passes.Options`), all on by
    default; the ablation benchmark and the tests turn them off one by one.

    ``F(batch, pull=X)`` returns a Tensor with one row per vertex in the batch's vertex order:
    the pushed outputs, or the scattered states if the cell pushes nothing.
    ``F(batch, pull=X, rows=batch.roots)`` returns those vertices' rows only, as
    ``take_rows(F(batch, pull=X), batch.roots)`` would, without putting every row in the
    batch's order first and, in the backward, without a gradient row for every vertex.

    It is both a traced cell (``F.graph``, ``F.program``, ``F.executable``, ...) and the kinded
    function of one kind, that cell (``by=None``).
    """

    def __init__(self, cell, scatter_shape, pull_shape=None, push_shape=None, arity=None,
                 dtype=None, pull_dtype=None, name=None, options=None):
        TracedCell.__init__(self, cell, scatter_shape, pull_shape, push_shape, arity, dtype,
                            pull_dtype, name, options)
        self.cells, self.by, self.kind_names = {None: self}, None, {}  # one kind: all vertices
        self._make_op()

    @staticmethod
    def by_kind(cells, by="leaf", **keywords):
        """One cell per vertex kind, chosen per vertex (kinds.py): ``cells`` is ``{kind:
        cell}``; ``by`` is ``"leaf"`` (kinds "leaf", "internal"), ``"arity"`` (the number of
        children) or ``"tag"`` (an integer per vertex, ``F(batch, pull=X, tag=T)``). The other
        keywords are this class's. Each kind runs its own cell on its own rows only."""
        return KindedFunction(cells, by, **keywords)

    def __call__(self, batch, pull=None, rows=None):  # (one kind: no tag=)
        return KindedFunction.__call__(self, batch, pull, rows=rows)
