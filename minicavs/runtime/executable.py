"""An :class:`Executable`: a Program together with everything running it fills in.

A Program is immutable; what its runs learn is kept beside it, in explicit caches owned by the
one object that fills them: the level plans (plans.py), the graph's constants per array module
(uploaded to a GPU once), the pooled batch buffers (memory.py), and the backend's compiled
level loop with the reason a backend was or was not chosen (backends.py). A front-end holds
one Executable per Program (F and ∂F of each cell) and binds calls to it (call.py).
"""

from .memory import BufferPool
from .plans import LevelPlans


class Executable:
    """``program`` with its caches: ``plans``, ``pool``, constants (:meth:`constants`),
    ``native`` (set by backends.py: the compiled loop, or the reason there is none) and the
    interpreter's (``windows``, ``level_steps``)."""

    def __init__(self, program):
        self.program = program
        self.plans = LevelPlans(program)
        self.pool = BufferPool()
        self.native = None
        self.companion = None  # an Executable soon needed after this one (F's: ∂F's)
        self.native_spec = None  # its loop's generated source, where compiled ahead
        self.windows = None  # (CuPy) the level's row moves in few launches: interpreter.Windows
        self.level_steps = {}  # the interpreter's steps per level plan (interpreter._LevelSteps)
        self.zeros = {}  # the interpreter's 0-d zeros, per array module and dtype: a zero
        # level's stand-ins (made once: on a GPU, making one is a launch)
        self._constants = {}

    def constants(self, xp):
        """``{node.key: array}`` of the graph's constants on array module ``xp`` (a fresh dict,
        the arrays shared: on a GPU, uploaded once)."""
        return dict(self._constants_on(xp))

    def add_constants(self, env, xp):
        """Put the constants on ``xp`` into ``env`` where it has no value for them."""
        for key, value in self._constants_on(xp).items():
            if key not in env:
                env[key] = value

    def _constants_on(self, xp):
        values = self._constants.get(xp.__name__)
        if values is None:
            values = self._constants[xp.__name__] = {
                n.key: (n.value if xp.__name__ == "numpy" else xp.asarray(n.value))
                for n in self.program.graph.nodes if n.kind == "const"}
        return values

    def __repr__(self):
        return f"Executable({self.program!r})"
