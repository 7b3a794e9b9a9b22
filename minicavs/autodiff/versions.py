"""Version counters: backward refuses a tensor that was changed in place after the forward
pass saved it, instead of silently computing gradients from the new values.

As in PyTorch, every Tensor has a version counter (shared with the tensors that share its
array: ``detach()``), a recorded op notes the version of each tensor it saves (its inputs and
outputs), and backward compares before it calls the op's VJP. minicavs' own writers bump the
counter: an optimiser step, ``load_state_dict``, assigning ``t.data = array``.

A write straight into the array (``W.data[...] = 100``) is invisible to minicavs, so handing
the array out through ``.data`` counts as a possible write: it bumps the counter, and if a
pending record saved the tensor at the current version, a fingerprint (CRC-32) of the content
is taken first. Backward then compares the content with the fingerprint, so merely reading
``.data`` is never mistaken for a change, and the normal path (no ``.data`` access between
forward and backward) costs one integer comparison per saved tensor. Versions whose content is
the same share one fingerprint (a run of versions), so reads without writes — a training loop
that logs ``W.data`` every step — never wear the record of a forward pass out. In debug mode
(``minicavs.autodiff.debug``) every saved tensor is fingerprinted when it is saved, which also
catches writes through an array reference taken before the forward pass.

Memory another library owns (``mc.from_dlpack``: a PyTorch, JAX or CuPy tensor) can be written
by its owner at any time, with no counter to bump; a record fingerprints such tensors when it
saves them, so backward catches a change there in any mode, at the cost of one checksum per
save of an imported tensor. A NumPy array wrapped without a copy and written through the
user's own reference is caught only in debug mode (a checksum of every saved tensor costs too
much to run always).
"""

import zlib

import numpy as np

from .. import backend
from ..errors import InPlaceModificationError
from ..ops import registry
from ..ops.registry import describe
from . import debug

# Distinct contents fingerprinted per tensor: a record that saved a content which was written
# over that many times (each time handed out through .data in between) is refused.
_KEEP = 64


class Version:
    """A tensor's version counter (shared by tensors sharing an array), the version a record
    last saved, and the fingerprints of saved versions that were handed out through .data."""

    __slots__ = ("count", "saved_at", "fingerprints", "external")

    def __init__(self):
        self.count = 0
        self.saved_at = -1
        # [first version, last version, fingerprint] per run of versions of one content, made
        # on the first exposure
        self.fingerprints = None
        self.external = False  # memory another library owns (mc.from_dlpack): it may write

    def fingerprint_of(self, version):
        """The fingerprint kept for ``version``, or None."""
        for first, last, value in reversed(self.fingerprints or ()):
            if first <= version <= last:
                return value
            if last < version:
                return None
        return None


def fingerprint(array):
    """A checksum of the array's content (on the GPU: two reductions, no copy to the host)."""
    if backend.is_cupy_array(array):
        xp = backend.get_array_module(array)
        words = xp.ascontiguousarray(array).reshape(-1).view(xp.uint8).astype(xp.uint64)
        weights = xp.arange(1, words.size + 1, dtype=xp.uint64)
        return int(words.sum()), int((words * weights).sum())
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def exposed(tensor):
    """``tensor``'s array is being handed out and may be written through: run what is recorded
    but not yet run that may read it, keep a fingerprint of a version a record saved, then move
    to a new version."""
    writing(tensor)
    backend.forget_range(tensor._array)
    v = tensor._versions
    if v.saved_at == v.count:
        value = fingerprint(tensor._array)
        if v.fingerprints is None:
            v.fingerprints = []
        runs = v.fingerprints
        if runs and runs[-1][2] == value and runs[-1][1] == v.count - 1:  # the same content
            runs[-1][1] = v.count
        else:
            runs.append([v.count, v.count, value])
            if len(runs) > _KEEP:
                del runs[0]
    v.count += 1


def writing(tensor):
    """minicavs is about to write into ``tensor``'s array (an optimiser step, ``.data =``, an
    in-place op): the ops this thread's automatic-batching scope recorded and has not run yet
    run first, so they read the values they were recorded with, as eager code would have."""
    if registry.recording_threads:
        scope = registry.recording.scope
        if scope is not None:
            scope.run_pending()


def changed(tensor):
    """minicavs itself wrote into ``tensor``'s array (an optimiser step, a state load); call
    :func:`writing` before the write."""
    backend.forget_range(tensor._array)
    tensor._versions.count += 1


def save(tensors):
    """The versions of ``tensors`` as a record saves them (and, in debug mode, fingerprints)."""
    saved, external = [], False
    for t in tensors:
        v = t._versions
        v.saved_at = v.count
        saved.append(v.count)
        external = external or v.external
    if debug.enabled:
        return tuple(saved), tuple(fingerprint(t._array) for t in tensors)
    if external:  # memory shared through DLPack: its owner's writes bump no counter
        return tuple(saved), tuple(fingerprint(t._array) if t._versions.external else None
                                   for t in tensors)
    return tuple(saved), None


def check(tensors, saved, op_name, where=None, roles=None):
    """Raise :class:`InPlaceModificationError` if a tensor of ``tensors`` (None: an output no
    one keeps) is no longer what the record saved."""
    counts, prints = saved
    for i, (t, count) in enumerate(zip(tensors, counts)):
        if t is None:
            continue
        v = t._versions
        if prints is not None and prints[i] is not None:
            same = fingerprint(t._array) == prints[i]
        elif v.count == count:
            continue
        else:
            known = v.fingerprint_of(count)
            same = known is not None and fingerprint(t._array) == known
        if not same:
            raise InPlaceModificationError(_message(t, op_name, where, roles[i] if roles
                                                    else f"argument {i}"))


def _message(t, op_name, where, role):
    kind = "parameter" if t.requires_grad and t._creator is None else "tensor"
    name = f" {t.name!r}" if t.name else ""
    at = f" (recorded at {where[0]}:{where[1]})" if where else ""
    return (f"backward(): {role} of op '{op_name}'{at}, a {kind}{name} of shape "
            f"{describe(t.shape)} {t.dtype}, was changed in place after the forward pass saved "
            f"it, so the gradients would be computed from the new values. Change it only after "
            f"backward() (an optimiser step belongs after backward), or run the forward pass "
            f"again after the change.")
