"""Test helper: run a whole traced graph as fused steps, as the runtime would run its Program's
eager phase — the tests compare fused and unfused runs, and both with ``graph.evaluate``. (No
runtime path runs a bare graph this way: front-ends run Programs through the driver.)"""

from minicavs import backend
from minicavs.runtime.analysis import fusion_groups
from minicavs.runtime.executor import _value, plan_steps, run_steps
from minicavs.errors import GraphError


class GraphExecutor:
    """Runs a whole graph as steps: ``GraphExecutor(graph).run(*inputs)`` returns the outputs,
    like ``graph.evaluate``. ``fuse=False`` runs every op by itself (for ablations, and to test
    that fused and unfused runs agree). ``fusion_options`` go to :func:`fusion_groups`
    (``keep=``, ``min_size=``, ``classes=``)."""

    def __init__(self, graph, fuse=True, **fusion_options):
        self.graph = graph
        self.fuse = fuse
        self.groups = fusion_groups(graph, **fusion_options) if fuse else []
        self.steps = plan_steps(graph, fuse, self.groups)

    def run(self, *inputs, params=None):
        env = self.run_env(inputs, params)
        xp = backend.get_array_module(*inputs)
        return [_value(env, o, xp) for o in self.graph.outputs]  # an output may be a constant

    def run_env(self, inputs, params=None, env=None):
        """Run every step; return the environment (values of inputs, params, constants, op
        nodes that are not fused away, and the outputs of every fused group)."""
        graph = self.graph
        if len(inputs) != len(graph.inputs):
            raise GraphError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got "
                             f"{len(inputs)}")
        params = [p.value.data for p in graph.params] if params is None else list(params)
        if len(params) != len(graph.params):
            raise GraphError(f"graph {graph.name!r} has {len(graph.params)} params, got "
                             f"{len(params)} values")
        env = {} if env is None else env
        for symbol, array in zip(graph.inputs + graph.params, list(inputs) + params):
            env[symbol.key] = array
        xp = backend.get_array_module(*inputs, *params)
        return run_steps(self.steps, env, xp)

    def __repr__(self):
        fused = sum(len(g) for g in self.groups)
        return (f"GraphExecutor({self.graph.name!r}: {len(self.steps)} steps, {len(self.groups)} "
                f"fused groups holding {fused} ops)")
