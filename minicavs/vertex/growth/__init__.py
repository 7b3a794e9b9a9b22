"""Graphs grown at run time: structures decided from values computed along the way (the
recursion paper §6.4: TD-TreeLSTM; incremental decoding).

``grow(F, root_pull, decide)`` starts one root per sample and repeats, top-down:

1. run F once on the **frontier** of every sample (one batching task: F's Program — eager,
   core for one level, lazy — on the frontier's rows, its gathers reading the parents' states
   kept from the step before);
2. call ``decide(frontier)`` once for the whole frontier: from F's pushed outputs it says how
   many children each frontier vertex gets and what each child pulls (argmax, sampling from a
   seeded generator, a threshold, or any user function — see :class:`Frontier`);
3. append the children; stop when no sample has a frontier left, or at the ``max_vertices``
   budget of a sample (an error, or a truncation the caller chose).

A grown vertex reads its **parent's** state with ``v.gather(0)`` (zeros at a root), so the
structure found is an ordinary input graph for F in which each vertex's one child (slot 0) is
its parent: levels are depths, and F called on it recomputes exactly what the growth computed.
That is how gradients work: the growth itself runs without a record; ``Growth.output`` is
``F(growth.batch, pull)`` on the structure found when gradients are enabled — the ordinary ∂F
then runs through the same tasks (one more batched forward, no per-vertex work). Teacher forcing
is the same F on a given structure (:func:`top_down`); a loss on generated structures
(REINFORCE: the log-probabilities of the choices made, weighted by a reward) backpropagates
through ``Growth.output``.

:func:`grow_per_sample` grows each sample alone, the cell run eagerly vertex by vertex — the
reference the batched growth is tested against.

The package, by job: ``loop.py`` (the growing loop), ``frontier.py`` (what a decision sees, and the
seeded per-sample streams), ``step.py`` (F's Program on one frontier, through the runtime's
driver), ``checks.py`` (the arguments, decide's answers, the budget), ``result.py`` (the
:class:`Growth`), ``reference.py`` (the per-sample reference), ``teacher.py`` (``top_down``).
"""

from .frontier import Frontier
from .loop import grow
from .reference import grow_per_sample
from .result import Growth
from .teacher import TopDown, top_down

__all__ = ["Frontier", "Growth", "TopDown", "grow", "grow_per_sample", "top_down"]
