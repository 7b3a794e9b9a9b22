"""Argument checks shared by the public entry points: sizes, shapes, numbers, dtypes, paths.

Each check returns the value in its normal form (a Python int, a tuple of ints, a float, a
NumPy dtype) or raises :class:`~minicavs.errors.ArgumentError` naming the function, the
argument, what it must be and what it got. ``owner`` is how the message names the caller:
``"VertexFunction"``, ``"SGD"``, ``"--batch-size"``.

:func:`option` turns a check into an ``argparse`` type, so every command-line flag is checked
when the command line is parsed, before any data is read or any training starts.
"""

import argparse
import math
import os

import numpy as np

from .errors import ArgumentError

# dtype kinds minicavs computes with: booleans, signed and unsigned integers, floats.
NUMERIC_KINDS = "biuf"


def _fail(owner, name, expected, value, error=ArgumentError):
    where = f"{owner}: " if owner else ""
    what = f"{name} " if name else ""
    return error(f"{where}{what}must be {expected}, got {shown(value)}")


def shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_integer(value):
    """A Python or NumPy integer (not a bool, which Python counts as an int)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(value, name, owner="", minimum=None, maximum=None, error=ArgumentError):
    """``value`` as a Python int in ``[minimum, maximum]``."""
    if not is_integer(value):
        raise _fail(owner, name, "an integer", value, error)
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise _fail(owner, name, _range_text(minimum, maximum), value, error)
    return value


def _range_text(minimum, maximum, open_minimum=False, open_maximum=False):
    low, high = _num(minimum), _num(maximum)
    if maximum is None:
        return f"{'>' if open_minimum else '>='} {low}"
    if minimum is None:
        return f"{'<' if open_maximum else '<='} {high}"
    return f"in {'(' if open_minimum else '['}{low}, {high}{')' if open_maximum else ']'}"


def _num(x):
    return f"{x:g}" if isinstance(x, float) else str(x)


def number(value, name, owner="", minimum=None, maximum=None, open_minimum=False,
           open_maximum=False, error=ArgumentError):
    """``value`` as a finite Python float in ``[minimum, maximum]`` (an open end excludes the
    bound itself)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise _fail(owner, name, "a real number", value, error)
    x = float(value)
    if not math.isfinite(x):
        raise _fail(owner, name, "a finite number", value, error)
    low = minimum is not None and (x <= minimum if open_minimum else x < minimum)
    high = maximum is not None and (x >= maximum if open_maximum else x > maximum)
    if low or high:
        raise _fail(owner, name, _range_text(minimum, maximum, open_minimum, open_maximum),
                    value, error)
    return x


def shape(value, name, owner="", minimum=1, error=ArgumentError):
    """A shape as a tuple of ints >= ``minimum``; an int ``n`` means ``(n,)``, as in NumPy."""
    if is_integer(value):
        value = (value,)
    if not isinstance(value, (tuple, list)):
        raise _fail(owner, name, "a shape: a tuple of sizes such as (64,)", value, error)
    if not all(is_integer(d) and d >= minimum for d in value):
        raise _fail(owner, name, f"a shape: a tuple of integer sizes >= {minimum}", value,
                    error)
    return tuple(int(d) for d in value)


def dtype(value, name, owner="", kinds=NUMERIC_KINDS, error=ArgumentError):
    """``value`` as a NumPy dtype of one of ``kinds`` (NumPy's kind letters: ``"f"`` float,
    ``"iu"`` integer, ``"b"`` bool)."""
    try:
        result = np.dtype(value)
    except TypeError:
        result = None
    if result is None or result.kind not in kinds:
        names = list(dict.fromkeys({"b": "bool", "i": "integer", "u": "integer",
                                    "f": "float"}[k] for k in kinds))
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise _fail(owner, name, f"a {listed} dtype", value, error)
    return result


def writable_file(path, name="path", owner=""):
    """``path`` as a string naming a file that can be created or replaced: its directory
    exists (or can be made) and accepts a new file. Checked by making and removing one."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise _fail(owner, name, "a file path", path)
    path = os.fspath(path)
    if os.path.isdir(path):
        raise _fail(owner, name, "a file path, not a directory", path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.probe")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as exc:
        where = f"{owner}: " if owner else ""
        raise ArgumentError(f"{where}{name} {path!r} cannot be written: {exc.strerror or exc} "
                            f"(in directory {directory!r})") from None
    return path


# --- environment variables -------------------------------------------------------------------

ON_WORDS, OFF_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name, default):
    """The switch in environment variable ``name``: ``1/true/yes/on`` or ``0/false/no/off`` (any
    case, spaces ignored); unset or empty gives ``default``. Anything else is an
    :class:`ArgumentError` naming the variable: a typo must not switch the wrong way silently."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ON_WORDS or text in OFF_WORDS:
        return text in ON_WORDS
    raise ArgumentError(f"environment variable {name}={os.environ[name]!r}: expected one of "
                        f"{'/'.join(ON_WORDS)} (on) or {'/'.join(OFF_WORDS)} (off)")


def env_seconds(name, default):
    """A positive, finite number of seconds from environment variable ``name`` (``default``
    when unset or empty); anything else is an :class:`ArgumentError` naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"environment variable {name}={os.environ[name]!r}: expected a "
                            f"positive number of seconds")
    return value


# --- command-line flags ---------------------------------------------------------------------

def option(check, convert=str, **limits):
    """An ``argparse`` type: the flag's text through ``convert`` (int, float, str), then
    ``check(value, name, **limits)``; a bad value becomes argparse's usage error (exit 2)."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(convert, "a value")
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        try:
            return check(value, "", **limits)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = check.__name__
    return parse


def count(minimum=1, maximum=None):
    """An integer flag: ``--batch-size`` (>= 1), ``--epochs`` (>= 0), ..."""
    return option(integer, int, minimum=minimum, maximum=maximum)


def real(minimum=None, maximum=None, open_minimum=False, open_maximum=False):
    """A finite number flag: ``--lr`` (> 0), ``--clip`` (>= 0), ..."""
    return option(number, float, minimum=minimum, maximum=maximum, open_minimum=open_minimum,
                  open_maximum=open_maximum)
