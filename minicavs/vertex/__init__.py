"""The vertex-centric runtime (Cavs): input graphs, vertex functions and their batched
execution. Read in this order:

``graphs.py``       InputGraph/GraphBatch and the level schedule (which vertices run together)
``function.py``     the VertexFunction API: the cell, traced once with gather/scatter/pull/push
``batching.py``     how each op of the cell runs on a whole level at once (rules in ``ops/``)
``program.py``      the Program: F and ∂F as eager, per-level and lazy instructions
``passes.py``       the passes that build a Program from the traced graph, one switch each
``zero_rows.py``    the zero-row facts some passes use to skip work
``interpreter.py``  the loop that runs a Program over a batch on NumPy or CuPy
``memory.py``       a call's buffers (pooled), its memory estimate, and sub-batches over budget
``finite_check.py`` debug mode in F and ∂F: the first NaN or infinity, with its op and vertex
``kinds.py``        vertex kinds: one cell per kind (leaf, arity, tag), each on its own rows
``recursive.py``    ``mc.recursive``: a function of one node calling itself on its children
``reference.py``    a plain per-sample evaluation the batched runtime is tested against
``static.py``       ``mc.symbolic``: a static graph as a Program with no levels, same interpreter
``growth.py``       ``mc.grow``: structures decided at run time, F run on every sample's frontier
"""

from .graphs import GraphBatch, InputGraph
from .function import Vertex, VertexFunction
from .kinds import KindedFunction
from .passes import Options
from .recursive import RecursiveFunction, recursive
from .static import StaticFunction, symbolic
from .reference import evaluate_per_sample
from .growth import Frontier, Growth, grow, grow_per_sample, top_down
