"""The growing loop: F on every sample's frontier, ``decide`` once per step, children appended."""

import numpy as np

from ... import backend
from ...errors import ArgumentError
from .checks import apply_budget, check_arguments, check_children, kept_children
from .frontier import Frontier, SampleStreams
from .result import Growth
from .step import run_step


def grow(F, root_pull, decide, *, num_samples=None, max_vertices=1024, on_budget="error",
         seed=0):
    """Grow one structure per sample from its root, top-down, F run on every sample's frontier
    at once (see the module docstring). ``root_pull``: one row per sample, what each root
    pulls (a Tensor — gradients reach it through ``Growth.output`` — or an array; None with
    ``num_samples=`` if F pulls nothing). ``decide(frontier)`` -> ``(counts, child_pull)``
    (:class:`Frontier`). ``max_vertices``: the most vertices one sample may have; past it,
    ``on_budget="error"`` raises a GraphError, ``"truncate"`` keeps the first ones and marks
    the sample in ``Growth.truncated``. ``seed``: of the per-sample generators behind
    ``Frontier.uniform``/``sample`` — one integer (sample s draws from ``(seed, s)``) or one
    per sample (sample s draws from ``seed[s]``, at whatever position it sits). Returns a :class:`Growth`."""
    where = "grow"
    pull, n = check_arguments(F, root_pull, num_samples, max_vertices, on_budget, seed,
                                where)
    if not callable(decide):
        raise ArgumentError(f"{where}: decide must be a function decide(frontier) -> (counts, "
                            f"child_pull), got {type(decide).__name__}")
    xp = backend.device_module()  # F runs where its parameters and F(batch, pull) would
    streams = SampleStreams(seed)
    made = np.ones(n, np.int64)
    truncated = np.zeros(n, bool)
    sample, vertex = np.arange(n), np.zeros(n, np.int64)
    depth, slot, parent = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1)
    parent_rows, parent_states = np.full(n, -1), None
    records, sizes = [], []
    kept_bytes = 0  # the records' arrays: every vertex grown so far, kept for the Growth
    if pull is not None:
        pull = backend.to_device(pull)
    while len(sample):
        def names(i, sample=sample, vertex=vertex):
            return f"sample {int(sample[i])}, vertex {int(vertex[i])}"

        state, push, parent_states = run_step(F, xp, pull, parent_rows, parent_states, names,
                                              kept_bytes, len(sizes))
        kept_bytes += sum(a.nbytes for a in (state, push, pull) if a is not None)
        records.append(dict(sample=sample, vertex=vertex, depth=depth, slot=slot, parent=parent,
                            pull=pull, state=state, push=push))
        sizes.append(len(sample))
        frontier = Frontier(push, state, pull, sample, vertex, depth, slot, streams)
        counts, child_pull = check_children(F, decide(frontier), frontier, names, where)
        first_new = made.copy()
        counts, asked = apply_budget(counts, sample, made, max_vertices, on_budget, truncated,
                                     where)
        parent_rows = np.repeat(np.arange(len(sample)), counts)
        starts = np.cumsum(counts) - counts
        slot = np.arange(len(parent_rows)) - np.repeat(starts, counts)
        parent = vertex[parent_rows]
        sample = sample[parent_rows]
        vertex = first_new[sample] + np.arange(len(sample)) - np.searchsorted(sample, sample)
        depth = depth[parent_rows] + 1
        if child_pull is not None:
            pull = child_pull if asked is None else \
                child_pull[xp.asarray(np.flatnonzero(kept_children(asked, counts)))]
    return Growth(F, n, records, truncated, root_pull, sizes)
