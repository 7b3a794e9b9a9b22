"""The vertex axis: symbolic task sizes, and what the batching rules of the ops share.

Inside a vertex function the user sees per-vertex shapes (``v.pull()`` is an (E,) symbol), but
the graph F that minicavs records is batched: every per-vertex symbol has a leading axis over
the vertices of a task, of symbolic size ``VERTICES`` (``EDGES`` for per-edge symbols). An op's
batching rule (``Op(batch=...)``; JAX's name) rewrites the op on per-vertex symbols into ops on
batched ones::

    rule(op, items, attrs, out) -> batched symbol

``items`` holds, per argument, ``(batched symbol, domain)``: domain "vertex" or "edge", or None
for a value shared by all vertices (a parameter, a constant); ``out`` is the per-vertex output
aval, already checked. The rule is asked only when some argument is per row. Elementwise ops
share :func:`elementwise_rule`, ops that already work over any leading axes share
:func:`leading_axes_rule`, the others write theirs beside their forward.

The symbolic sizes are two large primes. A shape entry divisible by one of them contains the
batch axis exactly once, so :func:`instantiate` can turn any recorded attribute (a reshape
target, a row count) into the real one for a task with n vertices and e edges. Where a person
reads a shape they print as ``V`` and ``E`` (``2V``: twice a task's vertices), see
:func:`dim_text` and ``registry.describe``.
"""

import numpy as np

from . import registry

VERTICES = 1_000_003  # symbolic number of vertices in a task (a prime)
EDGES = 1_000_033  # symbolic number of edges in a task (another prime)
_NAMES = {VERTICES: "V", EDGES: "E"}


def instantiate(value, num_vertices, num_edges):
    """Replace the symbolic sizes in an attribute value by a task's real sizes."""
    if isinstance(value, tuple):
        return tuple(instantiate(v, num_vertices, num_edges) for v in value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= VERTICES:
        if value % VERTICES == 0:
            return int(value) // VERTICES * num_vertices
        if value % EDGES == 0:
            return int(value) // EDGES * num_edges
    return value


def has_symbolic_size(value):
    if isinstance(value, tuple):
        return any(has_symbolic_size(v) for v in value)
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and value >= VERTICES and (value % VERTICES == 0 or value % EDGES == 0))


def row_domain(shape):
    """"vertex" or "edge" if the leading axis is a task's rows; None if unbatched."""
    if shape and shape[0] == VERTICES:
        return "vertex"
    if shape and shape[0] == EDGES:
        return "edge"
    return None


def dim_text(d):
    """One dimension as a person reads it: ``V``, ``2V``, ``E``, or the number itself."""
    if not has_symbolic_size(d):
        return str(d)
    size = VERTICES if d % VERTICES == 0 else EDGES
    k = int(d) // size
    return _NAMES[size] if k == 1 else f"{k}{_NAMES[size]}"


# --- a row's elements (the level loops' per-row tensors: runtime/codegen.py, level_launches.py) --

def packed_strides(shape):
    """The element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def is_packed(shape, strides):
    """Whether elements of ``shape`` at element ``strides`` lie one after another (a size-1
    axis's stride does not matter)."""
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, packed_strides(shape)))


def broadcast_strides(shape, strides, target):
    """The strides of a value of ``shape`` (element ``strides``) broadcast to ``target``
    (NumPy's rule: axes right-aligned, a missing or size-1 axis repeats: stride 0); None where
    it does not broadcast to it."""
    lead = len(target) - len(shape)
    if lead < 0 or any(n not in (1, target[lead + d]) for d, n in enumerate(shape)):
        return None
    return tuple(0 if d < lead or shape[d - lead] == 1 else strides[d - lead]
                 for d in range(len(target)))


# --- helpers of the rules -----------------------------------------------------------------------

def row_count(domain):
    """The symbolic number of rows of a domain ("vertex" or "edge")."""
    return VERTICES if domain == "vertex" else EDGES


def shift(axes):
    """Per-vertex axes as axes of the batched symbol."""
    return tuple(a + 1 for a in axes)


def lift(symbol, domain, rank):
    """A batched symbol with its per-row part padded with leading 1s to ``rank`` dims."""
    per_row = symbol.shape[1:]
    if len(per_row) >= rank:
        return symbol
    return shape.reshape(symbol, (row_count(domain),) + (1,) * (rank - len(per_row)) + per_row)


def broadcast_shared(items):
    """The arguments, each shared one broadcast to the rows of the per-row ones."""
    domain = next(d for _, d in items if d)
    return [s if d else shape.broadcast_to(s, (row_count(domain),) + tuple(s.shape))
            for s, d in items]


# --- rules shared by several ops ----------------------------------------------------------------

def elementwise_rule(op, items, attrs, out):
    """Per-row operands padded to the output's rank; NumPy broadcasting does the rest."""
    rank = len(out.shape)
    return registry.apply(op, *[lift(s, d, rank) if d else s for s, d in items], **attrs)


def along_axis_rule(op, items, attrs, out):
    """For ops along ``attrs["axis"]`` (concat, softmax, cumsum, ...): it moves by one."""
    return registry.apply(op, *broadcast_shared(items), **dict(attrs, axis=attrs["axis"] + 1))


def leading_axes_rule(op, items, attrs, out):
    """For ops that already work over any leading axes (softmax_cross_entropy, one_hot)."""
    return registry.apply(op, *broadcast_shared(items), **attrs)


from . import shape  # noqa: E402 (last: shape's ops, registered on import, use the rules above)
