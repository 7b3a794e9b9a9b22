"""The native backend: a Program's level loop compiled to C++ (codegen.py), built and cached
by the toolchain in ``minicavs/cpu/`` (build.py, blas.py).

:func:`compile_loop` makes a Program's :class:`NativeLoop` — or says, as a string, why the
program stays on the interpreter (the generator does not compile something it holds). The
choice between backends is made in one place, ``backends.py``, which keeps the loop in the
program's :class:`~.executable.Executable`.

A call's loop (:meth:`NativeLoop.start`) computes the level plans in Python — the same plans
the interpreter runs, a few microseconds a level — then each :meth:`_NativeRun.run` is one C
call over a range of levels: the whole loop for one cell, a run of consecutive levels of one
kind when several kinds step together. Eager and lazy instructions stay whole-batch NumPy/BLAS
calls (interpreter.py).
"""

import ctypes
import math
import os
import threading

import numpy as np

from ..cpu import blas, build, calibrate, isa, products, team
from ..cpu.kernels import data_address
from ..ops.batching import row_domain
from .codegen import ACTIONS, INTO_CHILDREN, ONTO_CHILDREN, ROW_COUNTS, VARIANTS
from .plans import RUN, SKIP, ZERO, record_written, written_by_plan
from .program import ScatterAdd


def compile_loop(program, spec=None):
    """A :class:`NativeLoop` for ``program``, or the reason (a string) it stays interpreted;
    ``spec``: its generated loop, where :func:`compile_ahead` made it."""
    spec = spec if spec is not None else _generate(program)
    if isinstance(spec, str):
        return spec
    lib, _ = build.build(spec.source, "levels", origin=f"program {program.name!r}")
    return NativeLoop(spec, lib)


def compile_ahead(program):
    """``program``'s generated loop (or why there is none), its library compiling on a thread
    of its own (``build.compile_ahead``): ∂F's beside F's, which the caller compiles now."""
    spec = _generate(program)
    if not isinstance(spec, str):
        build.compile_ahead(spec.source, "levels", origin=f"program {program.name!r}")
    return spec


def _generate(program):
    from . import codegen  # (imports the fusion code generator: only when compiling)

    try:  # (one gemm interface for float32 and float64)
        return codegen.generate(program, calibrate.gemm("float32")[1], profile=PROFILE)
    except codegen.Unsupported as exc:
        return str(exc)


# MINICAVS_NATIVE_PROFILE=1: each level loop also times its instructions (NativeLoop.profile)
PROFILE = os.environ.get("MINICAVS_NATIVE_PROFILE", "") not in ("", "0")


def _panel_rows(spec, slot, transposed):
    """The loop's ``panel_rows`` entries of one product's weight in one layout: for each entry
    of rows (``codegen.ROW_COUNTS``: a few rows by their count, more by their power of two),
    whether the library's panel kernel over the weight packed beats the BLAS on this machine
    (cpu/calibrate.py: measured once per CPU, BLAS and shape, then read from its file)."""
    (k, m), = {(k, m) for s, k, m in spec.products if s == slot}
    return [_panels_win(spec.dtype, rows, k, m, transposed) for rows in ROW_COUNTS]


# (dtype, rows, k, m, transposed) -> bool, for this process. The weight's own k and m, not
# powers of two: a bucket had a 256 x 640 weight's verdict run a 256 x 1024 one's 8 rows at
# 0.78x the BLAS (benchmarks/kernels.py); a program has few weights, each measured once.
_panel_wins = {}


def _panels_win(dtype, rows, k, m, transposed):
    if calibrate.forced() is not None:  # (MINICAVS_KERNELS=own or blas: not remembered)
        return calibrate.forced() == "own"
    key = (np.dtype(dtype).name, rows, k, m, transposed)
    wins = _panel_wins.get(key)
    if wins is None:
        one_row = rows == 1 and calibrate.gemv(dtype)[0] is not None  # (what the loop calls)
        gemm = calibrate.gemv(dtype) if one_row else calibrate.gemm(dtype)
        name = (f"loop panels {'f32' if key[0] == 'float32' else 'f64'} "
                f"{products.rows_text(products.rows_key(rows))}x{k}x{m}"
                f"{' Bᵀ' if transposed else ''} ({isa.target()}), against {gemm[2]}"
                + ("'s gemv" if one_row else ""))

        def make():
            rng = np.random.default_rng(0)
            x = rng.standard_normal((rows, k)).astype(dtype)
            w = rng.standard_normal((m, k) if transposed else (k, m)).astype(dtype)
            out = np.empty((rows, m), dtype=dtype)
            own = products.panels_call(x, products.pack_panels(w.T if transposed else w), out)
            other = calibrate.one_thread_gemv if one_row else calibrate.one_thread_gemm
            return own, other(gemm[:2], x, w.T if transposed else w, out)  # (one thread each,
            # as a team's member calls them)
        with team.one_blas_thread():
            wins = _panel_wins[key] = calibrate.own_is_faster(name, make)
    return wins


_routing = threading.Lock()
_routes_of = {}  # a loop library's handle -> its panel_rows table, {(slot, transposed): forced}


class NativeLoop:
    """One program's compiled level loop."""

    backend = "native"

    def __init__(self, spec, lib):
        self.spec = spec
        self.dtype = spec.dtype
        lib.minicavs_set_gemm(ctypes.c_void_p(calibrate.gemm(spec.dtype)[0]),
                              ctypes.c_void_p(calibrate.gemv(spec.dtype)[0]))
        lib.minicavs_set_blas_threads(ctypes.c_void_p(blas.threads_local()))
        # (each product's route, per layout of its weight, measured at its first call in it;
        # one table per library in the process, as the library's own)
        self._panel_rows, self._routed = _routes_of.setdefault(lib._handle, (np.zeros(
            (max(1, len(spec.slots)), 2, len(ROW_COUNTS)), dtype=np.int8), {}))
        kernel = products.panel_kernel(spec.dtype)
        # (the products' weights, where the library's panel kernel is there to run them)
        self._products = {slot for slot, _, _ in spec.products} if kernel is not None else ()
        if kernel is not None:
            lib.minicavs_set_panels(ctypes.c_void_p(ctypes.cast(kernel, ctypes.c_void_p).value),
                                    ctypes.c_int64(products.panel_width(spec.dtype)))
        lib.minicavs_set_panel_rows(ctypes.c_void_p(self._panel_rows.ctypes.data))
        self._run = lib.minicavs_levels
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._run.argtypes = [i64, i64, i64, p, p, p, p, i64, p, i64, p, i64, i64, i64, i64, i64]
        self._run.restype = None
        self._lib = lib
        self._codes = {}  # plan -> (action codes, keys and domains of the buffers it writes)
        self._readers = {}  # value -> the core instructions that read it
        self._reading = {}  # (value, a level's codes) -> whether the level reads it
        self._written = None  # the values the loop writes into (the program's buffers)
        self._scratch = threading.local()  # per thread: reused scratch rows (no page faults)

    def profile(self):
        """Seconds each core instruction took since the last call, by thread 0 (its barrier
        included), as ``[(instruction, seconds)]`` — only in a MINICAVS_NATIVE_PROFILE=1
        process; else None."""
        if not PROFILE:
            return None
        seconds = np.zeros(self.spec.num_core)
        self._lib.minicavs_profile(seconds.ctypes.data_as(ctypes.c_void_p))
        return list(zip(self.spec.notes, seconds.tolist()))

    def start(self, part):
        """The loop of one bound call (a :class:`~.call.Part`): a :class:`_NativeRun`, or the
        reason (a string) the interpreter must run it."""
        keep = []  # arrays the C call reads, alive until it returns
        args = self._bind(part.program, part.env, part.rows, keep)
        if args is None:
            return "a value the loop writes is not in a layout it can write"
        return _NativeRun(self, part, args, keep)

    def _codes_of(self, program, plan, zeros, env):
        """``(codes, writes, runs)`` of a plan on levels where the values ``zeros`` are zero:
        each instruction's action code (an elementwise step with one zero input runs its
        variant that reads 0 for it, and a zero only such variants read is not written), the
        buffers it writes, how many instructions run."""
        entry = self._codes.get((plan, zeros))
        if entry is None:
            codes = np.array([self.spec.actions[a] for a in plan], dtype=np.int8)
            if any(self.spec.variants):
                _zero_variants(codes, program, self.spec.variants, zeros)
            writes = [(o.key, row_domain(o.shape)) for ins, a in zip(program.core, plan)
                      if a == RUN for o in ins.writes
                      if o.key in env and row_domain(o.shape)]
            runs = int(np.count_nonzero((codes == 1) | (codes >= VARIANTS)))
            entry = self._codes[(plan, zeros)] = (codes, writes, runs)
        return entry

    def _bind(self, program, env, rows, keep):
        """The pointer and stride arrays of the C call, or None if an array the loop writes is
        in a layout it cannot write. Every array is read in a layout the generated code
        supports (:func:`_rows_layout`, :func:`_matrix_layout`), else from a contiguous copy:
        reversed, broadcast (stride 0), strided, unaligned or DLPack-shared arrays give the
        interpreter's values."""
        slots = self.spec.slots
        # (strides: each slot's (ld, transposed), then each product's packed weight, or 0)
        pointers, strides = [0] * len(slots), [0] * (3 * len(slots))
        widest = rows.widest
        if self._written is None:
            self._written = program.buffered | {part.key for part, *_ in program.aliases}
        for s in slots:
            if s.kind == "batch":
                array = env[s.node.key]
                if array.dtype != self.dtype:
                    return None
                ld = _rows_layout(array)
                if ld is None:
                    if s.node.key in self._written:  # (our own buffers: always a good layout)
                        return None
                    array = np.ascontiguousarray(array)
                    ld = _rows_layout(array)
                strides[2 * s.index] = ld
            elif s.kind == "shared":
                array = env[s.node.key]
                if array.dtype != self.dtype:
                    return None
                layout = _matrix_layout(array) if array.ndim == 2 else (
                    (0, 0) if array.flags.c_contiguous and _aligned(array) else None)
                if layout is None:
                    array = np.ascontiguousarray(array)
                    layout = (array.shape[-1], 0) if array.ndim == 2 else (0, 0)
                strides[2 * s.index: 2 * s.index + 2] = layout
                if s.index in self._products and self._routes(s.index, layout[1]):
                    packed = self._packed(s.index, array)
                    keep.append(packed)
                    strides[2 * len(slots) + s.index] = data_address(packed)
            elif s.kind == "scratch":
                array = self._scratch_rows(s, widest)
            else:  # child
                array = np.ascontiguousarray(rows.slot_rows(s.slot), dtype=np.int64)
            keep.append(array)
            pointers[s.index] = data_address(array)
        return np.array(pointers, dtype=np.uintp), np.array(strides, dtype=np.int64)

    def _routes(self, slot, transposed):
        """Whether a product of weight ``slot`` in that layout runs on the panels for some row
        count: its ``panel_rows`` entries measured at its first call (cpu/calibrate.py), and
        handed to the loop."""
        forced = calibrate.forced()  # (MINICAVS_KERNELS: its choices, not the measured)
        if self._routed.get((slot, transposed), 0) != forced:
            with _routing:
                if self._routed.get((slot, transposed), 0) != forced:
                    self._panel_rows[slot, transposed] = _panel_rows(self.spec, slot,
                                                                     transposed)
                    self._lib.minicavs_set_panel_rows(
                        ctypes.c_void_p(self._panel_rows.ctypes.data))
                    self._routed[slot, transposed] = forced
        return bool(self._panel_rows[slot, transposed].any())

    def _packed(self, slot, w):
        """Weight ``w`` packed for the panel kernel, into the thread's scratch for ``slot``
        (the weight changes between calls: a training step; packed once for all levels)."""
        arrays = getattr(self._scratch, "panels", None)
        if arrays is None:
            arrays = self._scratch.panels = {}
        threads = 1 if build.forked_child() else team.team_size()
        arrays[slot] = products.pack_panels(w, arrays.get(slot), threads)
        return arrays[slot]

    def _scratch_rows(self, slot, rows):
        """Scratch of ``rows`` rows for ``slot``, reused from the thread's last call: fresh
        memory each call costs a page fault per 4 KiB, more than the loops that use it."""
        arrays = getattr(self._scratch, "arrays", None)
        if arrays is None:
            arrays = self._scratch.arrays = {}
        array = arrays.get(slot.index)
        if array is None or len(array) < rows:
            array = arrays[slot.index] = np.empty((rows, slot.width), dtype=self.dtype)
        return array


class _NativeRun:
    """The native loop of one call: the plan of every level made up front, then C calls."""

    backend = "native"

    def __init__(self, loop, part, args, keep):
        program, rows, ranges = part.program, part.rows, part.ranges
        self.loop, self.part, self.keep = loop, part, keep
        plans, which, zeros = part.exe.plans.per_level(ranges, rows,
                                                        part.children_in_place is not None)
        codes = [loop._codes_of(program, plan, z, part.env) for plan, z in zip(plans, zeros)]
        self.table = np.stack([c for c, _, _ in codes])[which]  # each level's action codes
        runs = [codes[p][2] for p in which]
        if part.gradient_in_place is not None:  # (its windows' and adds' work is the gemm's:
            _into_children(self.table, program, part)  # still counted as run)
        if part.stale_rows:  # (a level's codes are its plan's unless changed just above)
            _clear_rows_read(self.table, program, loop, part, which,
                             part.gradient_in_place is not None)
        if part.children_in_place is not None:
            _leave_leaf_concat(self.table, program, loop.spec.variants, part)
        self.counts = runs[::-1] if program.reverse else runs  # in loop order
        self.written = written_by_plan([writes for _, writes, _ in codes], zeros, which, rows)
        self.pointers, self.strides = args
        self.offsets = np.ascontiguousarray(rows.level_offsets, dtype=np.int64)
        self.threads, self.split_rows, self.split_macs = team_size(rows, loop.spec)

    def run(self, first, stop):
        """Levels ``first`` to ``stop`` of the loop's order (top-down for ∂F), in one C call."""
        part = self.part
        states, d_states = part.states, part.d_states
        self.loop._run(part.rows.num_levels, first, stop, data_address(self.offsets),
                       data_address(self.table), data_address(self.pointers),
                       data_address(self.strides), _spare_row(states, d_states),
                       _address(states), _row_stride(states), _address(d_states),
                       _row_stride(d_states), self.threads, int(part.rows.is_forest),
                       self.split_rows, self.split_macs)

    def finish(self):
        record_written(self.part.program, self.part.ranges, self.written)
        return self.counts


def _zero_variants(codes, program, variants, zeros):
    """In a plan's action ``codes`` (changed in place): an instruction that runs with exactly
    one of its variants' inputs zero runs that variant (codegen.VARIANTS); then a ZERO whose
    value lives only during its level and no instruction reads but through such a variant is
    skipped (a leaf level's product of its zero children: 16 MB a Tree-FC batch not written
    and not read again)."""
    zeroed = {}  # instruction -> the input it reads as 0
    for k, keys in enumerate(variants):
        if keys and codes[k] == ACTIONS[RUN]:
            found = [j for j, key in enumerate(keys) if key in zeros]
            if len(found) == 1:
                codes[k] = VARIANTS + found[0]
                zeroed[k] = keys[found[0]]
    readers = program.level_local_readers
    if not zeroed or readers is None:
        return
    core = program.core
    for k in reversed(range(len(codes))):
        if codes[k] == ACTIONS[ZERO] and readers[k] is not None and not any(
                _reads(codes[r], core[r], variants[r], {o.key for o in core[k].writes})
                for r in readers[k]):
            codes[k] = ACTIONS[SKIP]


def _reads(code, ins, variants, keys):
    """Whether instruction ``ins``, run with action ``code``, reads one of ``keys``: not where
    it is skipped or writes zeros, nor through a variant that reads that value as 0."""
    if code in (ACTIONS[SKIP], ACTIONS[ZERO]):
        return False
    read = {x.key for x in ins.reads} & keys
    return bool(read - {variants[code - VARIANTS]} if code >= VARIANTS else read)


def _clear_rows_read(table, program, loop, part, which, changed):
    """Zeros into the rows of ``part.stale_rows`` (eager values left unwritten outside their
    range) that a level's instructions read: on a level partly outside the range. A level
    wholly outside reads them as 0 (its variant, ``table``'s codes) or not at all. ``which``:
    each level's plan; ``changed``: whether levels' codes may differ from their plan's."""
    windows = part.rows.level_windows("vertex")
    for key, (lo, hi, *base) in part.stale_rows.items():
        value = None
        for (s, e), read in zip(windows, _levels_reading(table, program, loop, key, which,
                                                         changed)):
            if read and e > s and (s < lo or e > hi):
                if value is None:
                    value = part.env[base[0] if base else key]
                value[s:max(s, min(e, lo))] = 0
                value[max(s, hi):max(e, hi)] = 0
    # (the marks stay: the rows no level read are still unwritten, for the readers after it)


def _levels_reading(table, program, loop, key, which, changed):
    """Per level of ``table`` (action codes; ``which``, ``changed``: see
    :func:`_clear_rows_read`), whether an instruction reads value ``key`` (not through a
    variant that reads it as 0), as :func:`_reads` says: worked out once per distinct row of
    codes (a call's levels repeat a few plans) and kept by the loop."""
    cache = loop._reading
    if len(cache) > 4096:  # (a bound: ever new plans forget, and are worked out again)
        cache.clear()
    readers = loop._readers.get(key)
    if readers is None:
        readers = loop._readers[key] = [r for r, ins in enumerate(program.core)
                                        if any(x.key == key for x in ins.reads)]
    by_plan, reading = {}, []
    for t, p in enumerate(which):
        found = by_plan.get(t if changed else p)
        if found is None:
            codes = table[t]
            row = codes.tobytes()
            found = cache.get((key, row))
            if found is None:
                found = cache[(key, row)] = any(_reads(codes[r], program.core[r],
                                                       loop.spec.variants[r], {key})
                                                for r in readers)
            by_plan[t if changed else p] = found
        reading.append(found)
    return reading


def _leave_leaf_concat(table, program, variants, part):
    """F on a batch whose children are read where their states are (``children_in_place``):
    the concat's rows below the first with children (the leaves': zero, 33 MB a Tree-FC batch)
    are not cleared where no step of their levels reads them — only what reads the concat
    outside the loop could, and it keeps to its range or clears them (``Part.stale_rows``)."""
    concat, first = part.children_in_place
    keys = {concat} | {p.key for p, c, *_ in program.aliases if c.key == concat}
    core = program.core
    writers = [k for k, ins in enumerate(core) if any(o.key in keys for o in ins.writes)]
    offsets = np.asarray(part.rows.level_offsets)
    done = False
    for t in np.flatnonzero(offsets[1:] <= first):
        codes = table[t]
        if all(codes[k] in (ACTIONS[SKIP], ACTIONS[ZERO]) for k in writers) and not any(
                _reads(codes[r], ins, variants[r], keys) for r, ins in enumerate(core)):
            for k in writers:
                codes[k] = ACTIONS[SKIP]
            done = True
    if done:
        part.stale_rows[concat] = (first, part.rows.num_vertices)


def _into_children(table, program, part):
    """∂F on a batch whose children are its rows in order (``Part.gradient_in_place``): on
    each level where the product of the children's gradients and every add of its columns run,
    the product adds into the children's rows itself (``INTO_CHILDREN``: a gemm with β = 1 into
    their block of rows) and its windows and the adds do not run. Where the children's rows
    were left uncleared (``Part.stale_children``) and every level with children is such a
    level, the product writes them (``ONTO_CHILDREN``, β = 0: one pass over them fewer); else
    they are cleared now. Returns how many levels."""
    product, windows, _ = program.children_gradient
    index = {o.key: k for k, ins in enumerate(program.core) for o in ins.writes}
    adds = [k for k, ins in enumerate(program.core) if isinstance(ins, ScatterAdd)]
    p, w = index[product], [index[key] for key in windows]
    levels = (table[:, p] == ACTIONS[RUN]) & (table[:, adds] == ACTIONS[RUN]).all(axis=1)
    table[np.ix_(levels, w + adds)] = ACTIONS[SKIP]
    onto = False
    if part.stale_children:
        offsets = np.asarray(part.rows.level_offsets)  # (the table's rows: levels in order)
        with_children = (offsets[1:] > part.gradient_in_place) & (offsets[1:] > offsets[:-1])
        onto = bool((levels | ~with_children).all())
        part.clear_stale_children(written=onto)
    table[levels, p] = ONTO_CHILDREN if onto else INTO_CHILDREN
    return int(np.count_nonzero(levels))


def _aligned(array):
    return data_address(array) % array.itemsize == 0


def _rows_layout(array):
    """The row stride (in elements) of a per-row value the loop reads as ``base + i * ld``
    with each row's elements packed (C order), or None: rows must not overlap or run
    backwards, a row's elements must lie one after another (a 1-D value is one column)."""
    item = array.itemsize
    if data_address(array) % item or array.strides[0] % item:
        return None
    shape = array.shape
    width = math.prod(shape[1:]) if len(shape) != 2 else shape[1]
    if array.flags.c_contiguous:  # (most values: packed rows, one after another)
        return max(width, 1) if len(shape) > 1 else 1
    step = item
    for n, stride in zip(reversed(shape[1:]), reversed(array.strides[1:])):
        if n > 1 and stride != step and width > 1:
            return None
        step *= n
    ld = array.strides[0] // item
    return ld if ld >= max(width, 1) or shape[0] <= 1 and ld >= 0 else None


def _matrix_layout(array):
    """``(ld, transposed)`` of a shared matrix as BLAS reads it — rows of unit stride with a
    leading dimension of at least a row (row-major), or the same for its transpose — or None
    (reversed, broadcast, strided or unaligned: the caller copies it)."""
    if not _aligned(array) or any(s % array.itemsize for s in array.strides):
        return None
    rows, cols = array.shape
    s0, s1 = (s // array.itemsize for s in array.strides)
    if (s1 == 1 or cols == 1) and s0 >= max(cols, 1):
        return s0, 0
    if (s0 == 1 or rows == 1) and s1 >= max(rows, 1):
        return s1, 1
    return None


def team_size(rows, spec):
    """``(threads, split_rows, split_macs)`` of a call's level loop: the library's team
    (``cpu.kernels.team_size``: the usable cores, one where a team cannot run) — one thread for
    a batch without a level of ``split_rows`` — and where its levels and products split
    (:func:`split_at`)."""
    threads = team.team_size()
    least, macs = split_at(spec, threads)
    return (threads if rows.widest >= least else 1), least, macs


_NEVER = 1 << 62


def split_at(spec, threads):
    """``(rows, multiply-adds)`` from which a level of ``spec``'s loop, and a product inside
    it, run on a team of ``threads``: where the work — a row's multiply-adds and elements,
    counted in elements at this CPU's measured cost of each — reaches the work from which a team
    beats one thread here (``calibrate.split_rate``); at least a row a thread; never without a
    team."""
    rate = calibrate.split_rate(threads) if threads > 1 else None
    if rate is None:
        return _NEVER, _NEVER
    split, element, mac = rate
    macs, elements = spec.row_work
    return (max(threads, math.ceil(split / (elements + macs * mac / element))),
            math.ceil(split * element / mac))


def _spare_row(states, d_states):
    """Where an absent child (-1) reads and adds: the last row of the state (or its
    gradient), as ``np.take`` reads it in the interpreter."""
    array = states if states is not None else d_states
    return 0 if array is None else len(array) - 1


def _address(array):
    return None if array is None else data_address(array)


def _row_stride(array):
    return 0 if array is None else array.strides[0] // array.itemsize
