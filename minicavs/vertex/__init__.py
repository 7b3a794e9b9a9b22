"""The vertex-centric runtime (Cavs): input graphs, vertex functions and their batched
execution. ``graphs.py`` holds InputGraph/GraphBatch and the level schedule, ``batching.py`` the
per-op batching rules, ``function.py`` the VertexFunction API, ``runtime.py`` the executor,
``reference.py`` a plain per-sample evaluation to check the runtime against."""

from .graphs import GraphBatch, InputGraph
from .function import Vertex, VertexFunction
from .runtime import Options
from .reference import evaluate_per_sample
