"""Level plans: what each core instruction of a Program does on one level — RUN, ZERO (write its
zeros) or SKIP — from which per-row values are zero there, which sinks no vertex of the level
reads and whether the children's concat is read where their states are (``call.py``). Every
backend runs these plans, so all of them skip the same work.

A plan depends only on two small sets and that flag, and levels share few such patterns: :class:`LevelPlans`
keeps each pattern's plan, one cache per Program, owned by its :class:`~.executable.Executable`.
"""

import bisect

from .program import RUN, ZERO, SKIP, Gather  # noqa: F401 (the actions: re-exported)
from .zero_rows import FULL, hull, intersect


class LevelPlans:
    """The plans of one Program, memoised by (zero values, unneeded sinks, in place)."""

    def __init__(self, program):
        self.program = program
        self._plans = {}
        self._zeros = {}  # (zero, unneeded, in place) -> every value known zero there

    def plan(self, zero, unneeded, in_place=False):
        """Per core instruction, RUN, ZERO or SKIP on a level where the per-row values ``zero``
        (keys) are all zero and the sinks ``unneeded`` (keys) are read by no one; ``in_place``:
        the children's concat is read where their states are (``Part.children_in_place``),
        so it and its gathers are skipped where they would run."""
        key = (zero, unneeded, in_place)
        plan = self._plans.get(key)
        if plan is None:
            zero = set(zero)
            plan = []
            concat = self.program.children_concat if in_place else None
            for ins in self.program.core:
                action, zeros = ins.action(zero, unneeded)
                zero.update(zeros)
                if concat is not None and action == RUN and (isinstance(ins, Gather) or any(
                        o.key == concat[0] for o in ins.writes)):
                    action = SKIP
                plan.append(action)
            readers = self.program.level_local_readers
            if readers is not None:  # zeros no running step of the level reads: not written
                for k in reversed(range(len(plan))):
                    if plan[k] == ZERO and readers[k] is not None and \
                            all(plan[r] != RUN for r in readers[k]):
                        plan[k] = SKIP
            self._zeros[key] = frozenset(zero)  # (with the outputs of a run step that are
            # zero there: computed from zeros, so written as zeros)
            plan = self._plans[key] = tuple(plan)
        return plan

    def per_level(self, ranges, rows, in_place=False):
        """``(plans, which, zeros)``: the distinct plans of a call's levels, per level t the
        index of its plan (a list), and per plan the values known zero on its levels (the
        outputs of run steps among them, made from zeros) — one pattern of zero values and
        unneeded sinks per level, one plan per distinct pattern (a batch has few). In plain Python over lists: a
        call has tens of levels and values, where each NumPy call cost 10-30 us in a loop's
        setup (cold, between a step's launches: the emulated GPU's host time per level)."""
        program = self.program
        levels = range(rows.num_levels)
        spans, masks = {}, {}  # domain -> its levels' rows; (range, domain) -> zero levels
        keys, columns = [], []  # one column of the pattern per candidate / sink: per level, bool
        for k, domain in program.zero_candidates:  # zero on a level: its range misses the rows
            found = ranges.get(k)
            if found is None:
                continue
            mask = masks.get((found, domain))
            if mask is None:
                span = spans.get(domain)
                if span is None:
                    span = spans[domain] = _Levels(rows.level_windows(domain))
                mask = masks[(found, domain)] = span.outside(*found)
            keys.append(("zero", k))
            columns.append(mask)
        if program.skips_unread_sinks:
            sinks = {s.key for s in program.sinks}
            needed = {}  # a sink no vertex of the level reads (one value may serve several slots)
            for slot, s in program.slots:
                if s.key in sinks:
                    has = rows.has_child_levels(slot)
                    before = needed.get(s.key)
                    needed[s.key] = has if before is None else [a or b for a, b in
                                                                  zip(before, has)]
            for key, has in needed.items():
                keys.append(("unneeded", key))
                columns.append([not h for h in has])
        if not keys:
            patterns = [(frozenset(), frozenset())]
            which = [0] * len(levels)
        else:
            first = {}  # each level's pattern (a tuple of bools) -> its index among the distinct
            which = [first.setdefault(p, len(first)) for p in zip(*columns)]
            patterns = [(frozenset(k for (kind, k), on in zip(keys, p) if on and kind == "zero"),
                         frozenset(k for (kind, k), on in zip(keys, p)
                                   if on and kind == "unneeded")) for p in first]
        plans = [self.plan(*pattern, in_place) for pattern in patterns]
        return plans, which, [self._zeros[pattern + (in_place,)] for pattern in patterns]


class _Levels:
    """A call's levels as rows in one domain, in order: which of them a range of rows misses."""

    def __init__(self, windows):
        self.starts = [lo for lo, _ in windows]
        self.ends = [hi for _, hi in windows]
        self.empty = [t for t, (lo, hi) in enumerate(windows) if hi <= lo]

    def outside(self, lo, hi):
        """Per level, whether it has no row in ``[lo, hi)``: the levels ending by ``lo``, those
        starting from ``hi``, and the empty ones (rows in order: two bisections)."""
        n = len(self.starts)
        if hi <= lo:
            return [True] * n
        before, after = bisect.bisect_right(self.ends, lo), bisect.bisect_left(self.starts, hi)
        after = max(after, before)
        mask = [True] * before + [False] * (after - before) + [True] * (n - after)
        for t in self.empty:
            mask[t] = True
        return mask


def record_written(program, ranges, written):
    """After the loop: each buffer's zero-row range is the hull of the levels that wrote it
    (``written``: key -> (lo, hi)). (A buffer the eager or lazy phase fills over all rows has
    the range its step gave it.)"""
    sources = {s.key for s in program.sources}
    made_whole = program.made_whole
    for b in program.buffers:  # rows no level wrote are stale (the pool's), i.e. unused
        # (∂F's state gradient is filled by the caller and the adds)
        if b.key not in sources and b.key not in made_whole:
            ranges[b.key] = written.get(b.key, (0, 0))
    for part, concat, *_ in program.aliases:  # a part the loop wrote: the rows it wrote (on
        # the others it was cleared, or stale outside its concat's); else its concat's
        if concat.key in made_whole:
            continue
        whole = ranges.get(concat.key, FULL)
        ranges[part.key] = intersect(whole, written[part.key]) \
            if part.key in written and not {part.key, concat.key} & sources else whole


def written_by_plan(writes, zeros, which, rows):
    """What a level loop writes (key -> rows): the hull of the rows of every level that wrote a
    buffer, taken once per plan and domain, a plan's writes being the same on each of its
    levels. Per plan: ``writes``, its ``(key, domain)`` pairs; ``zeros``, the values made from
    zeros there (written as zeros: not counted); ``which``, each level's plan."""
    written, hulls = {}, {}  # domain -> per plan, the hull of its levels' rows
    for p, pairs in enumerate(writes):
        for key, domain in pairs:
            if key in zeros[p]:
                continue
            by_plan = hulls.get(domain)
            if by_plan is None:
                by_plan = hulls[domain] = _hulls_by_plan(rows.level_windows(domain), which,
                                                         len(writes))
            if by_plan[p] is not None:
                widen(written, key, by_plan[p])
    return written


def _hulls_by_plan(windows, which, count):
    """Per plan (of ``count``; ``which``: each level's), ``(lo, hi)``: the hull of the rows of
    its levels that have any (``windows``: each level's rows), or None."""
    hulls = [None] * count
    for (lo, hi), p in zip(windows, which):
        if hi > lo:
            found = hulls[p]
            hulls[p] = (lo, hi) if found is None else (min(found[0], lo), max(found[1], hi))
    return hulls


def widen(written, key, window):
    """Add one level's rows ``window`` to what ``key`` has written (``written``: key -> hull)."""
    written[key] = hull(written.get(key, (0, 0)), window)
