"""The front-ends of the vertex-centric runtime (Cavs): input graphs, and the ways to declare a
dynamic network whose Programs the execution layer (``minicavs/runtime/``) runs. Read in this
order:

``graphs.py``       InputGraph/GraphBatch and the level schedule (which vertices run together)
``cell.py``         the cell, traced once with gather/scatter/pull/push into F and ∂F's Programs
``function.py``     the VertexFunction API: one cell, the one-kind case of kinds.py's call
``batching.py``     how each op of the cell runs on a whole level at once (rules in ``ops/``)
``frontend.py``     what the batched front-ends share: argument checks, ``explain()``
``kinds.py``        vertex kinds: one cell per kind (leaf, arity, tag), each on its own rows
``recursive.py``    ``mc.recursive``: a function of one node calling itself on its children
``reference.py``    a plain per-sample evaluation the batched runtime is tested against
``static.py``       ``mc.symbolic``: a static graph as a Program with no levels, same interpreter
``growth.py``       ``mc.grow``: structures decided at run time, F run on every sample's frontier
"""

from .graphs import GraphBatch, InputGraph
from .cell import TracedCell, Vertex
from .function import VertexFunction
from .kinds import KindedFunction
from ..runtime.passes import Options
from .recursive import RecursiveFunction, recursive
from .static import StaticFunction, symbolic
from .reference import evaluate_per_sample
from .growth import Frontier, Growth, grow, grow_per_sample, top_down
