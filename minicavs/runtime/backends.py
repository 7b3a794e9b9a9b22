"""Which backend runs a Program's level loop: chosen here, and only here, with the reason.

* **native** (native.py): on NumPy, where native code is on (``minicavs/cpu/build.py``:
  ``MINICAVS_NATIVE``, a C++ compiler) and the generator compiles the program;
* **interpreter** (interpreter.py): the reference, everywhere else — on CuPy, on recorded
  Tensors, in debug mode (it checks each instruction), inside :func:`interpreter_only`, or for
  a program the generator does not compile. Its name carries the reason, as ``explain()``
  reports it: ``"interpreter (<why>)"`` (on CuPy: ``"cupy"``).

Both are called the same way: ``loop = level_loop(part, xp, check)``, then ``loop.run(first,
stop)`` over ranges of levels and ``loop.finish()`` for the instructions run per level.
"""

import contextlib
import threading
import warnings

import numpy as np

from ..cpu import build
from . import native
from .interpreter import InterpreterLoop

NO_LEVEL_WORK = "none (no per-level instructions)"
_state = threading.local()
_warned = set()


@contextlib.contextmanager
def interpreter_only():
    """Run every level loop on the NumPy interpreter inside this block (tests compare the two)."""
    before = getattr(_state, "off", False)
    _state.off = True
    try:
        yield
    finally:
        _state.off = before


def level_loop(part, xp, check=None):
    """The loop that runs ``part`` (a bound Program, call.py) on array module ``xp``."""
    reason = None
    if part.program.core and xp is np and check is None:
        reason = _why_not_native(part.exe)
        if reason is None:
            run = part.exe.native.start(part)
            if not isinstance(run, str):
                return run
            reason = run
    part.clear_stale_children()  # (only the native loop writes them, or reads them as 0)
    part.clear_stale_rows()
    if not part.program.core:  # (a leaf kind: all its work is eager)
        return InterpreterLoop(part, xp, check, backend=NO_LEVEL_WORK)
    if xp is not np:
        return InterpreterLoop(part, xp, check, backend=getattr(xp, "__name__", "recorded"))
    if check is not None:
        return InterpreterLoop(part, xp, check,
                               "interpreter (debug mode checks each instruction)")
    return InterpreterLoop(part, xp, backend=f"interpreter ({reason})")


def native_ready(part):
    """Whether ``part``'s level loop will run natively (compiling it now if needed), before
    the loop is bound; a part without level work counts as native."""
    if part.rows is None or not part.program.core:
        return True
    return _why_not_native(part.exe) is None


def _why_not_native(exe):
    """None if ``exe``'s compiled loop can run (compiled on first use, kept in ``exe``), else
    why not."""
    if getattr(_state, "off", False):
        return "interpreter_only() is active"
    if exe.native is None:
        reason = build.unavailable()
        if reason is not None:
            _warn_once(reason)
            return reason  # (not kept: the environment may change)
        companion = exe.companion
        if companion is not None and companion.native is None:  # (its compiler runs beside)
            companion.native_spec = native.compile_ahead(companion.program)
        exe.native = native.compile_loop(exe.program, exe.native_spec)
        exe.native_spec = None
    return exe.native if isinstance(exe.native, str) else None


def static_backend(xp):
    """What runs a static Program (one eager phase: ``driver.run_static``) on array module
    ``xp``, in words, as ``explain()`` reports it."""
    if xp is not np:
        return f"the interpreter on {xp.__name__}, fused groups as generated kernels"
    reason = build.unavailable()
    return ("the interpreter on numpy, fused groups as native loops" if reason is None else
            f"the interpreter on numpy, fused groups op by op ({reason})")


def backend_of(exe):
    """``"native"`` or ``"interpreter (<why>)"`` for ``exe`` on NumPy, as it would run now."""
    if getattr(_state, "off", False):
        return "interpreter (interpreter_only() is active)"
    if exe.native is None:
        reason = build.unavailable()
        return f"interpreter ({reason})" if reason else "native (not compiled yet)"
    return "native" if not isinstance(exe.native, str) else f"interpreter ({exe.native})"


def _warn_once(reason):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"minicavs: the native CPU backend is off ({reason}); vertex functions "
                      f"run on the NumPy interpreter, several times slower", stacklevel=5)
