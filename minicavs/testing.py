"""Hypothesis strategies for testing code built on minicavs (imported by tests only: it needs
``hypothesis``, which minicavs itself does not).

Shapes include size-1 and size-0 dimensions, because that is where broadcasting and gradient
reductions go wrong. Float arrays are float64 with bounded elements, so ``mc.gradcheck``'s finite
differences are well conditioned; where an op has a kink or a pole (log, div, relu, max) there
are strategies that keep the values away from it.
"""

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

GRID = 1 / 8  # the spacing of tie_free_arrays: far wider than any finite-difference step


def shapes(min_dims=0, max_dims=3, min_side=0, max_side=4):
    """Array shapes; sides from ``min_side`` (0: empty arrays too) to ``max_side``."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=4):
    """A tuple of ``num_shapes`` shapes that broadcast together (NumPy rules), e.g.
    ``((3, 1, 2), (4, 2))``: dimensions differ in rank, in 1 versus n, and may be 0."""
    return hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=min_side,
        max_side=max_side).map(lambda b: b.input_shapes)


def float_arrays(shape, bound=2.0, min_magnitude=0.0, dtype=np.float64):
    """Arrays with elements in [-bound, bound] and ``|x| >= min_magnitude`` (e.g. 0.5 for the
    denominator of a division). ``shape`` is a tuple or a strategy of tuples."""
    magnitude = st.floats(min_magnitude, bound, allow_subnormal=False)
    elements = st.tuples(st.booleans(), magnitude).map(lambda s: -s[1] if s[0] else s[1])
    return hnp.arrays(dtype, _shape(shape), elements=elements)


def positive_arrays(shape, low=0.5, high=2.0, dtype=np.float64):
    """Arrays with elements in [low, high]: inputs of log, bases of fractional powers."""
    return hnp.arrays(dtype, _shape(shape), elements=st.floats(low, high, allow_subnormal=False))


def tie_free_arrays(shape, offset=0.0, max_steps=40, dtype=np.float64):
    """Arrays of *distinct* values ``k * GRID + offset`` with |k| <= max_steps (more steps if
    the array has more elements than that leaves room for).

    For ops whose gradient jumps where two values tie (max, maximum) or at zero (relu): use
    ``offset=GRID / 2`` for relu inputs, and offsets 0 and ``GRID / 2`` for the two arguments of
    maximum, which then never tie either.
    """
    def build(shape_):
        size = int(np.prod(shape_))
        steps = max(max_steps, size)
        ks = st.lists(st.integers(-steps, steps), min_size=size, max_size=size, unique=True)
        return ks.map(lambda k: (np.array(k, dtype=dtype).reshape(shape_) * GRID
                                 + offset).astype(dtype))
    return _shape(shape).flatmap(build)


def index_arrays(num_rows, shape, allow_missing=False, dtype=np.int64):
    """Integer indices into ``num_rows`` rows, repeats likely; with ``allow_missing``, -1 (the
    'no row' index of take_rows and scatter_add_rows) appears too."""
    if num_rows == 0 and not allow_missing:
        raise ValueError("index_arrays: there is no valid index into 0 rows; pass "
                         "allow_missing=True to draw -1s")
    low = -1 if allow_missing else 0
    return hnp.arrays(dtype, _shape(shape), elements=st.integers(low, num_rows - 1))


def _shape(shape):
    if isinstance(shape, st.SearchStrategy):
        return shape
    return st.just((int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape))
