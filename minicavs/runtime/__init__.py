"""The execution layer: a Program, the passes that build it, and the one way it runs.

Every front-end (``minicavs/vertex/``: vertex functions, kinds, recursive definitions, growth,
static functions) makes Programs here and runs them through one chain::

    passes.compile_programs(...)  -> Program (F, ∂F)         program.py, passes.py, zero_rows.py,
                                                              analysis.py (the graph rewrites)
    Executable(program)           -> its caches               executable.py, plans.py, memory.py
    call.bind_forward(...)        -> a Part: one call's values call.py
    driver.run([part, ...], xp)   -> eager, the level loop, lazy          driver.py
        backends.level_loop(...)  -> native or interpreter, with why      backends.py
            native.py + codegen.py (C++ via minicavs/cpu/), interpreter.py (NumPy/CuPy)

Read in this order: ``program.py``, ``passes.py``, ``call.py``, ``driver.py``, ``backends.py``,
then a backend. ``executor.py`` runs a graph's steps (an op or a fused group); ``memory.py``
holds the batch buffers' pool, a call's memory model and the budget; ``finite_check.py`` debug
mode's check of each instruction.
"""

from .backends import interpreter_only  # noqa: F401
from .memory import memory_budget, set_memory_budget  # noqa: F401
from .passes import Options  # noqa: F401
