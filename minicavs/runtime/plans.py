"""Level plans: what each core instruction of a Program does on one level — RUN, ZERO (write its
zeros) or SKIP — from which per-row values are zero there and which sinks no vertex of the
level reads. Every backend runs these plans, so all of them skip the same work.

A plan depends only on two small sets, and levels share few such patterns: :class:`LevelPlans`
keeps each pattern's plan, one cache per Program, owned by its :class:`~.executable.Executable`.
"""

from .program import RUN, ZERO, SKIP  # noqa: F401 (re-exported: the actions)
from .zero_rows import FULL, hull, intersect, is_empty


class LevelPlans:
    """The plans of one Program, memoised by (zero values, unneeded sinks)."""

    def __init__(self, program):
        self.program = program
        self._plans = {}

    def plan(self, zero, unneeded):
        """Per core instruction, RUN, ZERO or SKIP on a level where the per-row values ``zero``
        (keys) are all zero and the sinks ``unneeded`` (keys) are read by no one."""
        key = (zero, unneeded)
        plan = self._plans.get(key)
        if plan is None:
            zero = set(zero)
            plan = []
            for ins in self.program.core:
                action, zeros = ins.action(zero, unneeded)
                zero.update(zeros)
                plan.append(action)
            readers = self.program.level_local_readers
            if readers is not None:  # zeros no running step of the level reads: not written
                for k in reversed(range(len(plan))):
                    if plan[k] == ZERO and readers[k] is not None and \
                            all(plan[r] != RUN for r in readers[k]):
                        plan[k] = SKIP
            plan = self._plans[key] = tuple(plan)
        return plan

    def levels(self, ranges, rows):
        """Per level, in the order the loop runs them: ``(t, window, plan)`` — the level, its
        rows (``{"vertex": (lo, hi), "edge": (lo, hi)}``) and its plan; ``ranges`` (key -> (lo,
        hi)) are the rows outside which per-row values are zero."""
        program = self.program
        candidates = program.zero_candidates
        sinks = {s.key for s in program.sinks}
        sink_slots = [(slot, s.key) for slot, s in program.slots if s.key in sinks] \
            if program.skips_unread_sinks else []
        levels = range(rows.num_levels)
        for t in (reversed(levels) if program.reverse else levels):
            window = {"vertex": rows.vertices(t), "edge": rows.edges(t)}
            zero = frozenset(k for k, d in candidates
                             if k in ranges and is_empty(intersect(ranges[k], window[d])))
            # A sink no vertex of the level reads (one value may be the sink of several slots).
            needed = {sink for slot, sink in sink_slots if rows.has_child(slot, t)}
            unneeded = frozenset(sink for _, sink in sink_slots if sink not in needed)
            yield t, window, self.plan(zero, unneeded)


def record_written(program, ranges, written):
    """After the loop: each buffer's zero-row range is the hull of the levels that wrote it
    (``written``: key -> (lo, hi))."""
    sources = {s.key for s in program.sources}
    for b in program.buffers:  # rows no level wrote are stale (the pool's), i.e. unused
        if b.key not in sources:  # (∂F's state gradient is filled by the caller and the adds)
            ranges[b.key] = written.get(b.key, (0, 0))
    for part, concat, *_ in program.aliases:
        ranges[part.key] = ranges.get(concat.key, FULL)


def widen(written, key, window):
    """Add one level's rows ``window`` to what ``key`` has written (``written``: key -> hull)."""
    written[key] = hull(written.get(key, (0, 0)), window)
