"""Shape primitives: reshape, transpose, broadcast_to, concat, and slicing along one axis
(``slice_axis``, whose adjoint is ``pad_axis``). ``split`` is composed of slices."""

import numpy as np

from . import batching, elementwise
from .registry import (Aval, Op, apply, common_dtype, describe, normalize_axis, register)
from .rows import FULL, HULL, KEEPS
from ..errors import ShapeError


def resized(shape, axis, size):
    """``shape`` with axis ``axis`` of length ``size``, as a tuple."""
    return tuple(shape[:axis]) + (size,) + tuple(shape[axis + 1:])


def _infer_reshape(x, shape):
    if int(np.prod(x.shape)) != int(np.prod(shape)):
        raise ShapeError(f"op 'reshape': argument 0 has shape {describe(x.shape)} "
                         f"({int(np.prod(x.shape))} elements), which cannot be reshaped to "
                         f"{describe(shape)} ({int(np.prod(shape))} elements)")
    return Aval(tuple(shape), np.dtype(x.dtype))


def _infer_transpose(x, axes):
    return Aval(tuple(x.shape[a] for a in axes), np.dtype(x.dtype))


def _infer_broadcast_to(x, shape):
    try:
        if np.broadcast_shapes(tuple(x.shape), shape) != shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"op 'broadcast_to': argument 0 has shape {describe(x.shape)}, which "
                         f"cannot be broadcast to {describe(shape)}") from None
    return Aval(shape, np.dtype(x.dtype))


def _infer_concat(*xs, axis):
    first = xs[0]
    for i, x in enumerate(xs[1:], 1):
        if len(x.shape) != len(first.shape) or any(
                a != b for d, (a, b) in enumerate(zip(x.shape, first.shape)) if d != axis):
            raise ShapeError(f"op 'concat': argument 0 has shape {describe(first.shape)} and "
                             f"argument {i} has shape {describe(x.shape)}; all dimensions but "
                             f"axis {axis} must match")
    dtype = common_dtype("concat", xs)
    return Aval(resized(first.shape, axis, int(sum(x.shape[axis] for x in xs))), dtype)


def _infer_slice(x, start, stop, axis):
    return Aval(resized(x.shape, axis, stop - start), np.dtype(x.dtype))


def _infer_pad(x, before, after, axis):
    return Aval(resized(x.shape, axis, x.shape[axis] + before + after), np.dtype(x.dtype))


def _inverse_permutation(axes):
    return tuple(int(i) for i in np.argsort(axes))


def _concat_vjp(g, out, *xs, axis):
    bounds = np.cumsum([0] + [x.shape[axis] for x in xs])
    return tuple(slice_axis(g, int(a), int(b), axis) for a, b in zip(bounds[:-1], bounds[1:]))


def _slice_forward(xp, x, start, stop, axis):
    return x[(slice(None),) * axis + (slice(start, stop),)]


def _pad_forward(xp, x, before, after, axis):
    out = xp.zeros(resized(x.shape, axis, x.shape[axis] + before + after), dtype=x.dtype)
    out[(slice(None),) * axis + (slice(before, before + x.shape[axis]),)] = x
    return out


# --- batching rules (see batching.py) -----------------------------------------------------------

def _batch_reshape(op, items, attrs, out):
    (x, d), = items
    return apply(op, x, shape=(batching.row_count(d),) + tuple(attrs["shape"]))


def _batch_transpose(op, items, attrs, out):
    (x, _), = items
    return apply(op, x, axes=(0,) + batching.shift(attrs["axes"]))


def _batch_broadcast_to(op, items, attrs, out):
    (x, d), = items
    target = tuple(attrs["shape"])
    return apply(op, batching.lift(x, d, len(target)), shape=(batching.row_count(d),) + target)


def _join_padded_slices(pads):
    """The gradients of slices (``split``) arrive zero-padded to the full width; adding those
    pads would cost one pass per slice over the full array. Slices that do not overlap are
    joined with one concat instead, the columns none of them covers (an unused gate's) a zero
    block in it: one pass where a pad per run and their sum took about five."""
    axes = {g.attrs["axis"] for g in pads}
    if len(axes) != 1:
        return pads
    axis = axes.pop()
    pads = sorted(pads, key=lambda g: g.attrs["before"])
    width = pads[0].shape[axis]
    runs, overlapping = [], []  # runs: [start, stop, pieces] of slices that follow each other
    for g in pads:
        start = g.attrs["before"]
        piece = g.inputs[0]
        if runs and runs[-1][1] == start:
            runs[-1][1] += piece.shape[axis]
            runs[-1][2].append(piece)
        elif runs and runs[-1][1] > start:  # overlapping slices: plain addition
            overlapping.append(g)
        else:
            runs.append([start, start + piece.shape[axis], [piece]])
    if len(runs) == 1:
        (start, stop, pieces), = runs
        return [pad_axis(concat(pieces, axis=axis), start, width - stop, axis)] + overlapping
    parts, at = [], 0
    for start, stop, pieces in runs + [[width, width, []]]:
        if start > at:  # a zero block: an empty slice padded (no op makes zeros of a shape)
            parts.append(pad_axis(slice_axis(pieces[0] if pieces else parts[-1], 0, 0, axis),
                                  0, start - at, axis))
        parts += pieces
        at = stop
    return [concat(parts, axis=axis)] + overlapping


RESHAPE = register(Op("reshape", lambda xp, x, shape: xp.reshape(x, shape), _infer_reshape,
                      lambda g, out, x, shape: (reshape(g, tuple(x.shape)),),
                      batch=_batch_reshape, zero_rows=KEEPS, keeps_rows=True, native="view"))
TRANSPOSE = register(Op("transpose", lambda xp, x, axes: xp.transpose(x, axes), _infer_transpose,
                        lambda g, out, x, axes: (transpose(g, _inverse_permutation(axes)),),
                        batch=_batch_transpose,
                        zero_rows=lambda ranges, axes: KEEPS(ranges) if axes[0] == 0 else FULL))
BROADCAST_TO = register(Op("broadcast_to", lambda xp, x, shape: xp.broadcast_to(x, shape),
                           _infer_broadcast_to,
                           lambda g, out, x, shape: (elementwise.unbroadcast(g, x.shape),),
                           batch=_batch_broadcast_to, zero_rows=KEEPS, native="view"))
CONCAT = register(Op("concat", lambda xp, *xs, axis: xp.concatenate(xs, axis=axis),
                     _infer_concat, _concat_vjp, batch=batching.along_axis_rule, zero_rows=HULL,
                     assembles_in_place=True, promotes="all"))
SLICE_AXIS = register(Op("slice_axis", _slice_forward, _infer_slice,
                         lambda g, out, x, start, stop, axis:
                         (pad_axis(g, start, x.shape[axis] - stop, axis),),
                         batch=batching.along_axis_rule, zero_rows=KEEPS, native="window"))
PAD_AXIS = register(Op("pad_axis", _pad_forward, _infer_pad,
                       lambda g, out, x, before, after, axis:
                       (slice_axis(g, before, before + x.shape[axis], axis),),
                       batch=batching.along_axis_rule, zero_rows=KEEPS, join=_join_padded_slices,
                       native="pad"))


def reshape(x, shape):
    """Reshape to ``shape``; one entry may be -1 (inferred)."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(map(int, shape))
    if shape.count(-1) > 1:
        raise ShapeError(f"op 'reshape': at most one -1 allowed in {describe(shape)}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        size = int(np.prod(x.shape))
        if known == 0 or size % known:
            raise ShapeError(f"op 'reshape': argument 0 has shape {describe(x.shape)}, which "
                             f"cannot be reshaped to {describe(shape)}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if tuple(x.shape) == shape:
        return x
    return apply(RESHAPE, x, shape=shape)


def transpose(x, axes=None):
    """Permute axes (default: reverse them)."""
    ndim = len(x.shape)
    axes = tuple(range(ndim))[::-1] if axes is None else tuple(
        normalize_axis("transpose", int(a), ndim) for a in axes)
    if sorted(axes) != list(range(ndim)):
        raise ShapeError(f"op 'transpose': {axes} is not a permutation of the {ndim} axes of "
                         f"argument 0 with shape {describe(x.shape)}")
    if axes == tuple(range(ndim)):
        return x
    return apply(TRANSPOSE, x, axes=axes)


def broadcast_to(x, shape):
    shape = tuple(int(d) for d in shape)
    if tuple(x.shape) == shape:
        return x
    return apply(BROADCAST_TO, x, shape=shape)


def concat(xs, axis=-1):
    """Join a sequence of arrays along an existing axis."""
    xs = list(xs)
    if not xs:
        raise ShapeError("op 'concat': needs at least one array")
    axis = normalize_axis("concat", axis, len(xs[0].shape))
    if len(xs) == 1:
        return xs[0]
    return apply(CONCAT, *xs, axis=axis)


def slice_axis(x, start, stop, axis=-1):
    """``x[..., start:stop, ...]`` along ``axis``."""
    axis = normalize_axis("slice_axis", axis, len(x.shape))
    size = x.shape[axis]
    if not 0 <= start <= stop <= size:
        raise ShapeError(f"op 'slice_axis': slice {start}:{stop} is out of range for axis "
                         f"{axis} of argument 0 with shape {describe(x.shape)}")
    if start == 0 and stop == size:
        return x
    return apply(SLICE_AXIS, x, start=int(start), stop=int(stop), axis=axis)


def pad_axis(x, before, after, axis=-1):
    """Zero-pad ``x`` with ``before`` and ``after`` entries along ``axis``."""
    axis = normalize_axis("pad_axis", axis, len(x.shape))
    if before == 0 and after == 0:
        return x
    return apply(PAD_AXIS, x, before=int(before), after=int(after), axis=axis)


def split(x, sections, axis=-1):
    """Split into ``sections`` equal parts (an int) or parts of the given sizes (a list)."""
    x_shape = x.shape
    axis = normalize_axis("split", axis, len(x_shape))
    size = x_shape[axis]
    if type(sections) is int and sections == 2 and not size % 2:  # ([h, c] of a cell, per
        half = size // 2  # vertex of a recorded model: the checks below cost as much again)
        return [apply(SLICE_AXIS, x, start=0, stop=half, axis=axis),
                apply(SLICE_AXIS, x, start=half, stop=size, axis=axis)]
    if isinstance(sections, (int, np.integer)):
        if sections <= 0 or size % sections:
            raise ShapeError(f"op 'split': axis {axis} of argument 0 with shape "
                             f"{describe(x.shape)} cannot be split into {sections} equal parts")
        sizes = [size // sections] * int(sections)
    else:
        sizes = [int(s) for s in sections]
        if sum(sizes) != size or any(s < 0 for s in sizes):
            raise ShapeError(f"op 'split': sizes {sizes} do not add up to {size}, the length of "
                             f"axis {axis} of argument 0 with shape {describe(x.shape)}")
    if len(sizes) == 1:
        return [x]
    # The bounds are checked above: each part is one slice_axis, applied directly (a split
    # is recorded per step of a recurrent model, where these checks would cost as much as
    # the recording).
    parts, start = [], 0
    for part_size in sizes:
        parts.append(x if part_size == size else
                     apply(SLICE_AXIS, x, start=start, stop=start + part_size, axis=axis))
        start += part_size
    return parts


def expand_dims(x, axis):
    """``x`` with a new axis of size 1 at ``axis`` (-1: last)."""
    shape = list(x.shape)
    axis = normalize_axis("expand_dims", int(axis), len(shape) + 1)
    shape.insert(axis, 1)
    return reshape(x, shape)


def squeeze(x, axis=None):
    """``x`` without the size-1 axes ``axis`` (an int or a tuple; None: all of them)."""
    shape = list(x.shape)
    if axis is None:
        return reshape(x, [d for d in shape if d != 1])
    axes = {normalize_axis("squeeze", int(a), len(shape), zero_d=True)
            for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)}
    if not shape:  # a 0-d x takes axis 0 or -1, as in NumPy and PyTorch, and stays 0-d
        return x
    for a in sorted(axes):
        if shape[a] != 1:
            raise ShapeError(f"op 'squeeze': axis {a} of argument 0 with shape "
                             f"{describe(x.shape)} has size {shape[a]}, not 1")
    return reshape(x, [d for a, d in enumerate(shape) if a not in axes])


def flatten(x, start_axis=0, end_axis=-1):
    """Axes ``start_axis`` to ``end_axis`` (both included) merged into one."""
    ndim = len(x.shape)
    if ndim == 0:
        return reshape(x, (1,))
    start = normalize_axis("flatten", start_axis, ndim)
    end = normalize_axis("flatten", end_axis, ndim)
    merged = int(np.prod(x.shape[start:end + 1]))
    return reshape(x, tuple(x.shape[:start]) + (merged,) + tuple(x.shape[end + 1:]))


def stack(xs, axis=0):
    """Join arrays of one shape along a new axis."""
    xs = list(xs)
    if not xs:
        raise ShapeError("op 'stack': needs at least one array")
    first = tuple(xs[0].shape)
    for i, x in enumerate(xs[1:], 1):
        if tuple(x.shape) != first:
            raise ShapeError(f"op 'stack': argument 0 has shape {describe(first)} and argument "
                             f"{i} has shape {describe(x.shape)}; stacked arrays must have one "
                             f"shape")
    axis = normalize_axis("stack", axis, len(first) + 1)
    return concat([expand_dims(x, axis) for x in xs], axis=axis)


def repeat(x, repeats, axis=None):
    """Each element repeated ``repeats`` times (an int) along ``axis`` (None: of the flattened
    ``x``), as ``numpy.repeat``: ``[a, b]`` -> ``[a, a, b, b]``."""
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    axis = normalize_axis("repeat", axis, len(x.shape))
    if not isinstance(repeats, (int, np.integer)) or repeats < 0:
        raise ShapeError(f"op 'repeat': repeats must be a non-negative int, got {repeats!r}")
    spread = tuple(x.shape[:axis + 1]) + (int(repeats),) + tuple(x.shape[axis + 1:])
    return reshape(broadcast_to(expand_dims(x, axis + 1), spread),
                   resized(x.shape, axis, x.shape[axis] * int(repeats)))


def tile(x, reps):
    """``x`` repeated ``reps[i]`` times along axis i, as ``numpy.tile``: ``[a, b]`` ->
    ``[a, b, a, b]``."""
    reps = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(r) for r in reps)
    if any(r < 0 for r in reps):
        raise ShapeError(f"op 'tile': reps must be non-negative, got {reps}")
    ndim = max(len(reps), len(x.shape))
    reps = (1,) * (ndim - len(reps)) + reps
    x = reshape(x, (1,) * (ndim - len(x.shape)) + tuple(x.shape))
    spread = [d for r, n in zip(reps, x.shape) for d in (r, n)]
    ones = [d for n in x.shape for d in (1, n)]
    return reshape(broadcast_to(reshape(x, ones), spread),
                   [r * n for r, n in zip(reps, x.shape)])


def _triangle(x, k, lower):
    if len(x.shape) < 2:
        raise ShapeError(f"op '{'tril' if lower else 'triu'}': needs at least 2 dimensions, got "
                         f"shape {describe(x.shape)}")
    n, m = x.shape[-2:]
    keep = np.tri(n, m, k, dtype=bool) if lower else ~np.tri(n, m, k - 1, dtype=bool)
    zero = False if np.dtype(x.dtype).kind == "b" else 0  # a bool triangle stays bool
    return elementwise.where(keep, x, zero)


def tril(x, k=0):
    """The lower triangle of the last two axes (diagonal ``k`` and below); zeros above."""
    return _triangle(x, k, lower=True)


def triu(x, k=0):
    """The upper triangle of the last two axes (diagonal ``k`` and above); zeros below."""
    return _triangle(x, k, lower=False)


def pad(x, pad_width, value=0):
    """``x`` padded with ``value``, as ``numpy.pad(mode="constant")``: ``pad_width`` is one
    ``(before, after)`` pair per axis, one pair for every axis, or one int for all."""
    ndim = len(x.shape)
    if ndim == 0:
        return x  # nothing to pad (as numpy.pad)
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (ndim, 2)) \
        if np.ndim(pad_width) < 2 else np.asarray(pad_width, dtype=np.int64)
    if widths.shape != (ndim, 2) or (widths < 0).any():
        raise ShapeError(f"op 'pad': pad_width {pad_width!r} must give non-negative (before, "
                         f"after) for each of the {ndim} axes of shape {describe(x.shape)}")
    for axis, (before, after) in enumerate(widths.tolist()):
        x = pad_axis(x, before, after, axis)
    if value == 0 or not widths.any():
        return x
    inside = np.pad(np.ones(tuple(int(d) - int(b) - int(a) for d, (b, a)
                                  in zip(x.shape, widths.tolist())), bool), widths.tolist())
    return elementwise.where(inside, x, np.asarray(value).astype(x.dtype))

