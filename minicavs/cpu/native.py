"""Which backend runs a Program's level loop on the CPU, and the native one's call.

:func:`level_loop` gives the compiled loop of a program (``codegen.py``, built by
``build.py``), made on the program's first run and kept with it, or None when the NumPy
interpreter runs it — with the reason in :func:`backend_of` (what ``F.explain()`` and
``python -m minicavs doctor`` report):

* ``MINICAVS_NATIVE=0`` in the environment, or :func:`interpreter_only` around the calls;
* no C++ compiler (one warning per process says so, and how to get one);
* the program holds something the generator does not compile (its reason names it).

:class:`NativeLoop` runs in place of the interpreter's ``_level_loop``: same arguments, same
effects — the level plans are the interpreter's, computed here in Python (a few microseconds a
level); then one C call runs every level. The interpreter still runs F's eager and lazy
instructions (whole-batch NumPy/BLAS calls), debug mode (which checks each instruction) and
CuPy arrays.
"""

import contextlib
import ctypes
import threading
import warnings

import numpy as np

from ..ops.batching import row_domain
from ..vertex.program import RUN
from ..vertex.zero_rows import hull
from . import blas, build

_state = threading.local()
_warned = set()
_NATIVE_KEY = ("native",)  # where a program keeps its loop (Program._plans, the memo)


@contextlib.contextmanager
def interpreter_only():
    """Run vertex functions on the NumPy interpreter inside this block (tests compare the two)."""
    before = getattr(_state, "off", False)
    _state.off = True
    try:
        yield
    finally:
        _state.off = before


def unavailable():
    """Why no native code runs at all in this process (None: it can)."""
    return build.native_unavailable()


def _warn_once(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"minicavs: the native CPU backend is off ({reason}); vertex functions "
                      f"run on the NumPy interpreter, several times slower", stacklevel=4)


def level_loop(program):
    """The compiled level loop of ``program``, or None (the interpreter runs it)."""
    if getattr(_state, "off", False):
        return None
    entry = program._plans.get(_NATIVE_KEY)
    if entry is None:
        entry = program._plans[_NATIVE_KEY] = _make(program)
    return entry if isinstance(entry, NativeLoop) else None


def backend_of(program):
    """``"native"`` or ``"interpreter (<why>)"`` for ``program`` as it last ran or would run."""
    if getattr(_state, "off", False):
        return "interpreter (interpreter_only() is active)"
    entry = program._plans.get(_NATIVE_KEY)
    if entry is None:
        reason = unavailable()
        return f"interpreter ({reason})" if reason else "native (not compiled yet)"
    return "native" if isinstance(entry, NativeLoop) else f"interpreter ({entry})"


def _make(program):
    """A :class:`NativeLoop`, or the reason (a string) the program stays interpreted."""
    reason = unavailable()
    if reason is not None:
        _warn_once(reason)
        return reason
    from . import codegen  # (imports the fusion code generator: only when compiling)

    try:
        spec = codegen.generate(program, blas.gemm("float32")[1])  # one interface for s and d
    except codegen.Unsupported as exc:
        return str(exc)
    lib, _ = build.build(spec.source, "levels", origin=f"program {program.name!r}")
    return NativeLoop(spec, lib)


class NativeLoop:
    """One program's compiled level loop; called like the interpreter's ``_level_loop``."""

    def __init__(self, spec, lib):
        self.spec = spec
        self.dtype = spec.dtype
        lib.minicavs_set_gemm(ctypes.c_void_p(blas.gemm(spec.dtype)[0]))
        self._run = lib.minicavs_levels
        p = ctypes.c_void_p
        self._run.argtypes = [ctypes.c_int64, p, p, p, p, ctypes.c_int64, p, ctypes.c_int64, p,
                              ctypes.c_int64]
        self._run.restype = None
        self._lib = lib
        self._codes = {}  # id(plan) -> (action codes, keys of the buffers it writes)
        self._scratch = threading.local()  # per thread: reused scratch rows (no page faults)

    def __call__(self, program, xp, env, ranges, rows, moves, check=None):
        from ..vertex import interpreter

        keep = []  # arrays the C call reads, alive until it returns
        args = self._bind(env, rows, keep)
        if args is None:  # an array without unit column stride: the interpreter runs it
            counts = interpreter._level_loop(program, xp, env, ranges, rows, moves, check)
            counts.backend = "interpreter (an input of the loop is not row-contiguous)"
            return counts
        table = np.empty((rows.num_levels, self.spec.num_core), dtype=np.int8)
        written, counts = {}, interpreter.LevelCounts()
        counts.backend = "native"
        for t, window, plan in interpreter.level_plans(program, ranges, rows):
            codes, writes = self._codes_of(program, plan, env)
            table[t] = codes
            counts.append(int(np.count_nonzero(codes == 1)))
            for key, domain in writes:
                written[key] = hull(written.get(key, (0, 0)), window[domain])
        pointers, strides = args
        states, d_states = moves.states, moves.d_states
        offsets = np.ascontiguousarray(rows.level_offsets, dtype=np.int64)
        self._run(rows.num_levels, offsets.ctypes.data, table.ctypes.data,
                  pointers.ctypes.data, strides.ctypes.data, _spare_row(states, d_states),
                  _address(states), _row_stride(states), _address(d_states),
                  _row_stride(d_states))
        interpreter.record_written(program, ranges, written)
        return counts

    def _codes_of(self, program, plan, env):
        entry = self._codes.get(id(plan))
        if entry is None:
            codes = np.array([self.spec.actions[a] for a in plan], dtype=np.int8)
            writes = [(id(o), row_domain(o.shape)) for ins, a in zip(program.core, plan)
                      if a == RUN for o in ins.writes
                      if id(o) in env and row_domain(o.shape)]
            entry = self._codes[id(plan)] = (codes, writes, plan)  # plan kept: its id stays
        return entry[0], entry[1]

    def _bind(self, env, rows, keep):
        """The pointer and stride arrays of the C call, or None if an array cannot be read
        with unit column stride."""
        slots = self.spec.slots
        pointers = np.zeros(len(slots), dtype=np.uintp)
        strides = np.zeros(2 * len(slots), dtype=np.int64)
        widest = int(np.diff(rows.level_offsets).max())
        for s in slots:
            if s.kind == "batch":
                array = env[id(s.node)]
                if array.dtype != self.dtype or (array.ndim == 2 and
                                                 array.strides[1] != array.itemsize):
                    return None
                strides[2 * s.index] = array.strides[0] // array.itemsize
            elif s.kind == "shared":
                array = env[id(s.node)]
                if array.dtype != self.dtype:
                    return None
                if array.ndim == 2 and array.strides[1] == array.itemsize:
                    strides[2 * s.index] = array.strides[0] // array.itemsize
                elif array.ndim == 2 and array.strides[0] == array.itemsize:  # a transpose
                    strides[2 * s.index: 2 * s.index + 2] = (
                        array.strides[1] // array.itemsize, 1)
                else:
                    array = np.ascontiguousarray(array)
                    strides[2 * s.index] = array.shape[-1] if array.ndim == 2 else 1
            elif s.kind == "scratch":
                array = self._scratch_rows(s, widest)
            else:  # child
                array = np.ascontiguousarray(rows.slot_rows(s.slot), dtype=np.int64)
            keep.append(array)
            pointers[s.index] = array.ctypes.data
        return pointers, strides


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


def _spare_row(states, d_states):
    """Where an absent child (-1) reads and adds: the last row of the state (or its
    gradient), as ``np.take`` reads it in the interpreter."""
    array = states if states is not None else d_states
    return 0 if array is None else len(array) - 1


def _address(array):
    return None if array is None else array.ctypes.data


def _row_stride(array):
    return 0 if array is None else array.strides[0] // array.itemsize
