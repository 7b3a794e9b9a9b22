"""Indexing as NumPy does it, composed from primitives: ``x[key]`` (integers, slices of any
step, ``None``, ``...``, integer arrays and boolean masks), ``take`` along an axis, ``gather``
(NumPy's ``take_along_axis``), ``flip`` and ``masked_fill``.

Integers and positive-step slices become ``slice_axis`` and ``reshape`` (so they work inside a
vertex cell, on per-vertex symbols); everything that picks elements by index becomes one
``take_rows`` on the indexed axes flattened into rows, so gradients scatter-add (an index that
repeats adds up). Index arrays are data: NumPy or CuPy arrays, lists, or integer Tensors; they
are checked against the axis they index before anything runs, and a boolean mask becomes the
indices of its true elements (so its result's size depends on the values: not while tracing).
"""

import numpy as np

from .. import backend
from . import elementwise as ew, index, shape
from .registry import describe, normalize_axis
from ..errors import ArgumentError, DTypeError, GraphError, IndexRangeError, ShapeError

_INTEGERS = (int, np.integer)


def _is_symbolic(x):
    return getattr(type(x), "__minicavs_priority__", 0) >= 2  # Symbol, VertexSymbol


def _concrete(what, idx):
    """An index as a NumPy array (a Tensor's data is copied from the GPU if needed)."""
    if _is_symbolic(idx):
        raise GraphError(f"{what}: the index is a traced value; indexing by values computed "
                         f"inside a traced function is not supported (its result's shape would "
                         f"depend on data); pass the indices as data, or use mc.take_rows")
    data = idx.data if getattr(type(idx), "__minicavs_priority__", None) == 1 else idx  # Tensor
    array = backend.to_numpy(data) if backend.is_cupy_array(data) else np.asarray(data)
    if array.dtype == object or array.dtype.kind not in "biu":
        if array.size == 0 and array.dtype.kind == "f":  # x[[]]: an empty index, as in NumPy
            return array.astype(np.int64)
        raise DTypeError(f"{what}: indices must be integers or booleans, got dtype "
                         f"{array.dtype}")
    return array


def _checked(what, idx, size, axis):
    """``idx`` (integers) with negative entries counted from the end, as int64; an entry
    outside [-size, size) is an IndexRangeError naming it, its position and the axis."""
    idx = np.asarray(idx, dtype=np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        position = tuple(int(i[0]) for i in np.nonzero(bad)) if idx.ndim else ()
        raise IndexRangeError(f"{what}: index {int(idx[position])} "
                              f"{'at position ' + str(position) + ' ' if idx.ndim else ''}is "
                              f"out of range for axis {axis} with size {size}")
    return np.where(idx < 0, idx + size, idx)


def _on_device_of(x, idx):
    """Index data where ``x`` lives: a CuPy array for a CUDA tensor (a traced symbol keeps a
    NumPy constant, which the interpreter moves itself)."""
    if getattr(x, "device", "cpu") == "cuda" and not _is_symbolic(x):
        return backend.to_device(idx, "cuda")
    return idx


def moveaxis(x, source, destination):
    ndim = len(x.shape)
    source = normalize_axis("moveaxis", source, ndim)
    destination = normalize_axis("moveaxis", destination, ndim)
    order = [a for a in range(ndim) if a != source]
    order.insert(destination, source)
    return shape.transpose(x, order)


def _take_flat(x, flat_idx, idx_shape):
    """Rows ``flat_idx`` (valid, non-negative, NumPy) of ``x``: shape ``idx_shape + rest``."""
    rows = index.take_rows(x, _on_device_of(x, flat_idx.reshape(-1)))
    return shape.reshape(rows, tuple(idx_shape) + tuple(x.shape[1:]))


def take(x, indices, axis=None):
    """Elements of ``x`` at ``indices`` along ``axis`` (None: of the flattened ``x``), as
    ``numpy.take``: the result's shape is ``x.shape[:axis] + indices.shape +
    x.shape[axis + 1:]``. Negative indices count from the end."""
    if axis is None:
        x, axis = shape.reshape(x, (-1,)), 0
    axis = normalize_axis("take", axis, len(x.shape))
    idx = _concrete("take", indices)
    if idx.dtype == np.bool_:
        raise DTypeError("take: indices must be integers; for a boolean mask use x[mask]")
    idx = _checked("take", idx, x.shape[axis], axis)
    picked = _take_flat(moveaxis(x, axis, 0), idx, idx.shape)
    return _index_axes_to(picked, idx.ndim, axis)


def _index_axes_to(x, count, position):
    """``x`` with its first ``count`` axes (an index's) moved to start at ``position``."""
    if not position or not count:
        return x
    order = list(range(count, count + position)) + list(range(count)) + list(
        range(count + position, len(x.shape)))
    return shape.transpose(x, order)


def flip(x, axis=None):
    """``x`` reversed along ``axis`` (an int, a tuple, or None: every axis)."""
    axes = range(len(x.shape)) if axis is None else (
        (axis,) if isinstance(axis, _INTEGERS) else tuple(axis))
    axes = [normalize_axis("flip", a, len(x.shape), zero_d=True) for a in axes]
    if len(set(axes)) != len(axes):  # twice reversed would be no flip at all: a mistake
        raise ShapeError(f"op 'flip': repeated axis in {axis}")
    for a in axes:
        if len(x.shape) and x.shape[a] > 1:  # (a 0-d x, flipped along axis 0 or -1, is x)
            x = take(x, np.arange(x.shape[a] - 1, -1, -1), a)
    return x


def gather(x, indices, axis):
    """``numpy.take_along_axis``: ``out[..., i, ...] = x[..., indices[..., i, ...], ...]``
    along ``axis``; ``indices`` has ``x``'s rank and broadcasts against it on the other axes.
    (PyTorch's ``gather`` is the same where ``indices`` is no larger than ``x`` there.)"""
    axis = normalize_axis("gather", axis, len(x.shape))
    idx = _concrete("gather", indices)
    if idx.ndim != len(x.shape):
        raise ShapeError(f"gather: indices have {idx.ndim} dimension(s) and x has "
                         f"{len(x.shape)}; they must have the same rank")
    idx = _checked("gather", idx, x.shape[axis], axis)
    others = [d for d in range(len(x.shape)) if d != axis]
    try:
        rest = np.broadcast_shapes(tuple(x.shape[d] for d in others),
                                   tuple(idx.shape[d] for d in others))
    except ValueError:
        raise ShapeError(f"gather: indices with shape {describe(idx.shape)} do not broadcast "
                         f"against x with shape {describe(x.shape)} on the axes other than "
                         f"{axis}") from None
    out_shape = rest[:axis] + (idx.shape[axis],) + rest[axis:]
    full = rest[:axis] + (x.shape[axis],) + rest[axis:]
    x = shape.broadcast_to(x, full)
    idx = np.broadcast_to(idx, out_shape)
    coords = list(np.indices(out_shape, sparse=True))
    coords[axis] = idx
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*coords)), tuple(full))
    return _take_flat(shape.reshape(x, (-1,)), flat, out_shape)


def masked_fill(x, mask, value):
    """``x`` with ``value`` where ``mask`` is true; keeps ``x``'s dtype (as PyTorch)."""
    if not _is_symbolic(value) and not hasattr(value, "shape"):
        value = np.asarray(value).astype(x.dtype)
    return ew.where(mask, value, x)


# --- x[key] -------------------------------------------------------------------------------------

def _index_kind(entry):
    if entry is None:
        return "new"
    if entry is Ellipsis:
        return "ellipsis"
    if isinstance(entry, slice):
        return "slice"
    if isinstance(entry, (bool, np.bool_)):
        raise IndexRangeError("indexing with a Python bool is not supported; use a boolean "
                              "mask array")
    if isinstance(entry, _INTEGERS):
        return "int"
    return "array"


def _normalise_key(x, key):
    """The key as a list of (kind, value) covering every axis of ``x``: kinds "int", "slice",
    "new" (None) and "array" (int64 arrays; a boolean mask becomes one per axis it covers)."""
    key = key if isinstance(key, tuple) else (key,)
    entries = []
    for k in key:
        kind = _index_kind(k)
        if kind == "array":
            k = _concrete("indexing", k)
            if k.ndim == 0 and k.dtype != np.bool_:
                kind, k = "int", int(k)
        entries.append((kind, k))
    consumed = sum(k.ndim if kind == "array" and k.dtype == np.bool_ else
                   kind in ("int", "slice", "array") for kind, k in entries)
    ellipses = [i for i, (kind, _) in enumerate(entries) if kind == "ellipsis"]
    if len(ellipses) > 1:
        raise IndexRangeError("an index can only have a single ellipsis ('...')")
    ndim = len(x.shape)
    if consumed > ndim:
        raise IndexRangeError(f"too many indices: {consumed} for a tensor of shape "
                              f"{describe(x.shape)} ({ndim} dimension(s))")
    fill = [("slice", slice(None))] * (ndim - consumed)
    if ellipses:
        entries[ellipses[0]:ellipses[0] + 1] = fill
    else:
        entries += fill
    out, axis = [], 0
    for kind, k in entries:
        if kind == "array" and k.dtype == np.bool_:
            covered = tuple(x.shape[axis:axis + k.ndim])
            if k.ndim == 0 or covered != k.shape:
                raise IndexRangeError(f"boolean index of shape {describe(k.shape)} does not "
                                      f"match the indexed axes {axis}.. of shape "
                                      f"{describe(x.shape)}")
            out += [("array", axis + j, a) for j, a in enumerate(np.nonzero(k))]
            axis += k.ndim
        elif kind == "new":
            out.append(("new", None, None))
        else:
            out.append((kind, axis, k))
            axis += 1
    return out


def _stepped(x, axis, start, stop, step):
    """``x[start:stop:step]`` along ``axis``."""
    count = len(range(start, stop, step))
    if step < 0:
        return take(x, np.arange(start, stop, step), axis) if count else \
            shape.slice_axis(x, 0, 0, axis)
    x = shape.slice_axis(x, start, start + (count - 1) * step + 1 if count else start, axis)
    if step == 1 or count <= 1:
        return x
    # every step-th element: pad to count * step, fold the axis into (count, step), keep column 0
    x = shape.pad_axis(x, 0, count * step - x.shape[axis], axis)
    folded = shape.reshape(x, tuple(x.shape[:axis]) + (count, step) + tuple(x.shape[axis + 1:]))
    return shape.reshape(shape.slice_axis(folded, 0, 1, axis + 1),
                         shape.resized(x.shape, axis, count))


def getitem(x, key):
    """``x[key]`` with NumPy's rules, basic and advanced (see the module docstring)."""
    if type(key) is slice and key.step in (None, 1) and x.shape:  # (x[a:b], the common case:
        start, stop, _ = key.indices(x.shape[0])  # one slice_axis, without the general
        return shape.slice_axis(x, start, max(start, stop), 0)  # path's 5 µs of Python)
    entries = _normalise_key(x, key)
    arrays = [e for e in entries if e[0] == "array"]
    if arrays:  # among arrays, an integer is a 0-d array (NumPy's rule)
        entries = [("array", a, np.asarray(k)) if kind == "int" else (kind, a, k)
                   for kind, a, k in entries]
    # basic indexing first: slices, integers, new axes; arrays keep their axis whole
    kept_shape, advanced = [], []  # advanced: (position in the result so far, index, size)
    for kind, axis, k in entries:
        if kind == "slice":
            start, stop, step = k.indices(x.shape[axis])
            x = _stepped(x, axis, start, stop, step)
            kept_shape.append(x.shape[axis])
        elif kind == "int":
            size = x.shape[axis]
            if not -size <= k < size:  # IndexError ends Python's iteration protocol
                raise IndexRangeError(f"index {k} is out of range for axis {axis} of size "
                                      f"{size}")
            k = int(k) % size
            x = shape.slice_axis(x, k, k + 1, axis)
        elif kind == "new":
            kept_shape.append(1)
        else:
            advanced.append((len(kept_shape), _checked("indexing", k, x.shape[axis], axis),
                             x.shape[axis]))
            kept_shape.append(x.shape[axis])
    x = shape.reshape(x, tuple(kept_shape))
    if not advanced:
        return x
    positions = [p for p, _, _ in advanced]
    try:
        idx = np.broadcast_arrays(*[i for _, i, _ in advanced])
    except ValueError:
        raise IndexRangeError("indexing: the index arrays have shapes " + ", ".join(
            describe(np.shape(i)) for _, i, _ in advanced) + ", which do not broadcast "
            "together") from None
    others = [p for p in range(len(kept_shape)) if p not in positions]
    moved = shape.transpose(x, positions + others)
    rows = shape.reshape(moved, (int(np.prod([s for _, _, s in advanced])),)
                         + tuple(kept_shape[p] for p in others))
    flat = np.ravel_multi_index(tuple(idx), tuple(s for _, _, s in advanced)) if idx[0].size \
        else np.zeros(idx[0].shape, np.int64)
    picked = _take_flat(rows, flat, idx[0].shape)
    adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
    # NumPy's rule: adjacent index arrays put their axes where they were, others in front
    return _index_axes_to(picked, idx[0].ndim, positions[0]) if adjacent else picked



def _ints_of(opname, name, value):
    """An int or a sequence of ints as a tuple; anything else (1.5, "a") an ArgumentError."""
    values = (value,) if np.ndim(value) == 0 else tuple(value)
    if not all(isinstance(v, _INTEGERS) for v in values):
        raise ArgumentError(f"{opname}: {name} must be an int or a tuple of ints, got "
                            f"{value!r}")
    return values


def roll(x, shift, axis=None):
    """``x`` rotated by ``shift`` places along ``axis`` (``numpy.roll``, ``torch.roll``):
    elements pushed off the end come back at the start. ``shift`` and ``axis`` may be tuples
    of one length (one shift per axis); ``axis=None`` rolls the flattened ``x``. Two slices
    and a concat, so it also works on per-vertex symbols inside a cell."""
    if axis is None:
        if not isinstance(shift, _INTEGERS):
            raise ShapeError(f"roll: without an axis the shift must be one int, got {shift!r}")
        return shape.reshape(roll(shape.reshape(x, (-1,)), shift, 0), tuple(x.shape))
    shifts, axes = _ints_of("roll", "shift", shift), _ints_of("roll", "axis", axis)
    if len(shifts) != len(axes):
        if len(shifts) != 1:
            raise ShapeError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
        shifts = shifts * len(axes)
    for s, a in zip(shifts, axes):
        a = normalize_axis("roll", int(a), len(x.shape))
        n = x.shape[a]
        s = int(s) % n if n else 0
        if s:
            x = shape.concat([shape.slice_axis(x, n - s, n, a), shape.slice_axis(x, 0, n - s, a)],
                             axis=a)
    return x
