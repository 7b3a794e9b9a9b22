"""The driver: runs the bound Programs of one call (call.py) — one level loop for N Programs.

This is the Cavs loop (Alg. 1–2), for one cell (N = 1) or for several cells stepped together
(vertex kinds: N > 1, each on its own rows)::

    every part's eager instructions, once over all its rows   (lazy/eager batching, Cavs §3.4)
    for each batch level (bottom-up for F, top-down for ∂F):
        each part with vertices on that level runs its core instructions there
    every part's lazy instructions, once over all its rows

Each part's level loop is run by a backend chosen in ``backends.py`` (the native loop or the
interpreter); consecutive levels of one part go to its backend in one ``run(first, stop)``, so
one cell is one call for all its levels, and kinds a call per run of levels of one kind. In
debug mode each instruction's outputs are checked (finite_check.py), everything on one stream.
"""

import contextlib
import time

import numpy as np

from ..autodiff import debug
from ..cpu import products
from ..cuda import streams
from . import backends
from .executor import RECORD
from .finite_check import FiniteCheck
from .interpreter import run_static_step, run_whole


def run(parts, xp):
    """Run ``parts`` (one or more :class:`~.call.Part`, over one batch) on array module ``xp``
    (or ``RECORD``); fills in each part's ``counts`` and ``backend``."""
    checks = [FiniteCheck(p.program, p.rows, p.env) if debug.enabled and xp is not RECORD
              else None for p in parts]
    with contextlib.ExitStack() as stack:
        # Where every level loop is native, the call's large products run on the same team of
        # threads as the loops (one pool: cpu/products.py).
        stack.enter_context(products.team_products(
            xp is np and not any(checks) and all(backends.native_ready(p) for p in parts)))
        # (with the debug check on, everything runs on one stream, in order: the first bad
        # value is the first one made)
        schedulers = [stack.enter_context(streams.scheduler(xp, p.program) if c is None
                                          else streams.NO_STREAMS)
                      for p, c in zip(parts, checks)]
        _whole_phase("eager", parts, schedulers, checks, xp)
        for p in parts:
            p.publish_state()
        loops = [backends.level_loop(p, xp, c) if p.rows is not None else None
                 for p, c in zip(parts, checks)]
        counter = getattr(xp, "launch_counter", None)  # the emulated device counts launches
        for p in parts:
            p.level_launches = {} if counter is not None else None
            p.level_host_seconds = 0.0 if counter is not None else None
        for k, first, stop in level_runs(parts):
            if counter is None:
                loops[k].run(first, stop)
                continue
            before, device, started = counter.snapshot(), counter.device_seconds, time.perf_counter()
            loops[k].run(first, stop)
            parts[k].level_host_seconds += time.perf_counter() - started - (
                counter.device_seconds - device)
            for what, n in counter.since(before).items():
                parts[k].level_launches[what] = parts[k].level_launches.get(what, 0) + n
        for p, loop in zip(parts, loops):
            p.counts, p.backend = (loop.finish(), loop.backend) if loop else ([], None)
            if p.children_in_place is not None:  # (its rows hold the children: none ran it)
                concat, first = p.children_in_place
                p.ranges[concat] = (first, p.rows.num_vertices)
        _whole_phase("lazy", parts, schedulers, checks, xp)
    return parts


def run_static(exe, env, xp, rows=0, outs=None):
    """Run ``exe``'s Program of one eager phase (``passes.compile_graph``) on ``env``
    (``symbol.key -> array``, its inputs bound; its constants are added): the batched kernel
    of one batch of automatic batching, whose symbolic row count V is ``rows``. ``outs``
    (``symbol.key -> array``): where outputs are written (a batch's rows of its slab). Debug
    mode checks each instruction's outputs, as in :func:`run`."""
    exe.add_constants(env, xp)
    if debug.enabled and xp is not RECORD:
        check = FiniteCheck(exe.program, None, env)
        for ins in exe.program.eager:
            run_static_step(ins, xp, env, rows, outs)
            check(ins, env)
        return env
    for ins in exe.program.eager:  # (a batch of automatic batching: thousands a step)
        if ins.symbolic:
            run_static_step(ins, xp, env, rows, outs)
        else:
            ins.step.run(xp, env, outs)
    return env


def _whole_phase(phase, parts, schedulers, checks, xp):
    for p, sched, check in zip(parts, schedulers, checks):
        outside, handed_out = p.program.read_outside_core, p.program.handed_out
        for ins in getattr(p.program, phase):
            # Rows left unwritten (Part.stale_rows), never in debug mode, which checks them: a
            # product only the level loop reads, the loop clears those it reads; any step of
            # zero rows whose value the caller does not get, its readers clear those they read.
            leave = check is None and not any(o.key in handed_out for o in ins.writes)
            loop_only = leave and phase == "eager" and ins.restrict and ins.demand is None \
                and not any(o.key in outside for o in ins.writes)
            sched.run(ins, run_whole, ins, xp, p.env, p.ranges, p.rows, p.stale_rows, leave,
                      loop_only)
            if check:
                check(ins, p.env)


def level_runs(parts):
    """``(k, first, stop)``: part k runs levels ``first``..``stop`` of its own loop order
    next. One part runs all its levels at once; several step together by batch level
    (bottom-up, or top-down for ∂F: a level's children are done, whatever their kind), a run of
    consecutive levels of one part at a time."""
    if len(parts) == 1:
        if parts[0].rows is not None:
            yield 0, 0, parts[0].rows.num_levels
        return
    reverse = parts[0].program.reverse
    events = sorted(((t, k) for k, p in enumerate(parts) for t in p.levels), reverse=reverse)
    done = [0] * len(parts)
    i = 0
    while i < len(events):
        k = events[i][1]
        j = i
        while j < len(events) and events[j][1] == k:
            j += 1
        yield k, done[k], done[k] + j - i
        done[k] += j - i
        i = j
