"""Debug mode: stop at the first NaN or infinity and say where it came from.

Switched on by the environment variable ``MINICAVS_DEBUG=1`` or, for a block, by
``with mc.debug(): ...`` (``mc.set_debug(True)`` for the rest of the process). Then every op
output of eager code (forward and backward) and every instruction of a vertex function's F and
∂F (``runtime/driver.py``, ``runtime/finite_check.py``) is checked, and the first non-finite value raises
:class:`~minicavs.errors.NonFiniteError` naming the op, the user's line and, inside a vertex
function, the level, sample and vertex of the first bad row. Recorded ops also keep the user's
line and a fingerprint of what they saved (``versions.py``). Off, none of this runs: the checks
sit behind one flag test.
"""

import contextlib

import numpy as np

from .. import backend, validate
from ..errors import NonFiniteError
from ..locations import format_location, user_location

# 1/true/yes/on or 0/false/no/off; a typo is an error naming the variable, not "on".
enabled = validate.env_flag("MINICAVS_DEBUG", False)
# The record whose VJP is running, so a bad gradient names the forward op it belongs to.
backward_of = None


def set_debug(on=True):
    """Switch debug mode on or off for the rest of the process."""
    global enabled
    enabled = bool(on)


def is_debug_enabled():
    return enabled


@contextlib.contextmanager
def debug(on=True):
    """Debug mode (or, with ``on=False``, none) inside the block."""
    global enabled
    previous, enabled = enabled, bool(on)
    try:
        yield
    finally:
        enabled = previous


def first_non_finite(array):
    """None if ``array`` is finite (or not a float array), else ``(index, what)``: the index
    of its first NaN or infinity (a tuple) and a summary such as ``"2 NaN, 1 inf of 12"``."""
    if array is None or np.dtype(array.dtype).kind not in "fc":
        return None
    xp = backend.get_array_module(array)
    finite = xp.isfinite(array)
    if bool(finite.all()):
        return None
    bad = backend.to_numpy(~finite)
    nans = int(backend.to_numpy(xp.isnan(array)).sum())
    index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    infs = int(bad.sum()) - nans
    return index, f"{nans} NaN, {infs} inf of {array.size}"


location_text = format_location  # (runtime/finite_check.py's name for it)


def check_eager(op, inputs, outputs):
    """After an eager op (``Tensor.__minicavs_apply__``): raise at the first non-finite output,
    saying whether an input already held one."""
    for k, out in enumerate(outputs):
        found = first_non_finite(out._array)
        if found is None:
            continue
        index, summary = found
        which = f" output {k}" if len(outputs) > 1 else ""
        bad_inputs = [i for i, x in enumerate(inputs) if first_non_finite(x._array)]
        cause = (f"argument(s) {bad_inputs} already held NaN or inf" if bad_inputs else
                 "its arguments were all finite")
        during = ""
        record = backward_of
        if record is not None:
            during = (f" during backward(), in the gradient of op '{record.op.name}'"
                      + (f" recorded at {record.where[0]}:{record.where[1]}" if record.where
                         else ""))
        raise NonFiniteError(f"debug mode: op '{op.name}'{which}{during} produced a non-finite "
                             f"value ({summary}; first at index {index}); {cause}"
                             + format_location(user_location()))
