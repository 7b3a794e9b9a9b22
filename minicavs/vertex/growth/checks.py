"""The checks of growing: F can grow, the arguments of :func:`~.loop.grow`, each answer of
``decide``, and the ``max_vertices`` budget."""

import numpy as np

from ... import backend, validate
from ...autodiff.tensor import Tensor
from ...errors import ArgumentError, DTypeError, GraphError, ShapeError
from ...ops.registry import describe
from ..function import VertexFunction

ON_BUDGET = ("error", "truncate")


def check_growable(f):
    if not isinstance(f, VertexFunction):
        raise GraphError(f"grow: F must be a VertexFunction, got {type(f).__name__}")
    if f.edge_child_input is not None:
        raise GraphError(f"grow: vertex function {f.name!r} uses gather_sum, but a grown vertex "
                         f"has one parent; read its state with v.gather(0)")
    if any(k != 0 for k in f.gather_slots):
        raise GraphError(f"grow: vertex function {f.name!r} gathers child slot(s) "
                         f"{[k for k in f.gather_slots if k != 0]}, but a grown vertex reads "
                         f"only its parent, with v.gather(0)")


def check_arguments(f, root_pull, num_samples, max_vertices, on_budget, seed, where):
    check_growable(f)
    validate.integer(max_vertices, "max_vertices (the most vertices one sample may grow)", where,
                     minimum=1)
    if on_budget not in ON_BUDGET:
        raise ArgumentError(f"{where}: on_budget must be 'error' or 'truncate', got "
                            f"{validate.shown(on_budget)}")
    if f.pull_input is None:
        if root_pull is not None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing, but "
                             f"root_pull was given; pass num_samples= instead")
        if num_samples is None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing: say how many "
                             f"samples to grow with num_samples=")
        validate.integer(num_samples, "num_samples", where, minimum=0)
        check_seed(seed, int(num_samples), where)
        return None, int(num_samples)
    if root_pull is None:
        raise GraphError(f"{where}: vertex function {f.name!r} pulls: give root_pull, one "
                         f"row per sample (what each root pulls)")
    array = root_pull._array if isinstance(root_pull, Tensor) else \
        root_pull if backend.is_cupy_array(root_pull) else np.asarray(root_pull)
    expected = (array.shape[0] if array.ndim else None,) + f.pull_shape
    if array.ndim == 0 or tuple(array.shape) != expected:
        raise ShapeError(f"{where}: root_pull has shape {describe(array.shape)}, expected "
                         f"(samples, {', '.join(map(str, f.pull_shape))}) — one row of "
                         f"vertex function {f.name!r}'s pull_shape {describe(f.pull_shape)} "
                         f"per sample")
    if num_samples is not None and num_samples != array.shape[0]:
        raise ShapeError(f"{where}: num_samples={num_samples} but root_pull has "
                         f"{array.shape[0]} rows")
    if not np.can_cast(array.dtype, f.pull_dtype, "same_kind"):
        raise DTypeError(f"{where}: root_pull has dtype {array.dtype}, but vertex function "
                         f"{f.name!r} pulls {f.pull_dtype}")
    check_seed(seed, int(array.shape[0]), where)
    return array.astype(f.pull_dtype, copy=False), int(array.shape[0])


def check_seed(seed, num_samples, where):
    """``seed``: one integer (sample s draws from the stream of ``(seed, s)``) or one integer
    per sample (sample s from the stream of ``seed[s]``, wherever it sits in the batch)."""
    if validate.is_integer(seed):
        validate.integer(seed, "seed (of the per-sample generators)", where, minimum=0)
        return
    seeds = np.asarray(seed) if isinstance(seed, (list, tuple, np.ndarray)) else None
    if seeds is None or seeds.ndim != 1 or (seeds.size and seeds.dtype.kind not in "iu"):
        raise ArgumentError(f"{where}: seed must be an integer, or one integer per sample, got "
                            f"{validate.shown(seed)}")
    if len(seeds) != num_samples:
        raise ShapeError(f"{where}: seed has {len(seeds)} per-sample seeds for "
                         f"{num_samples} samples")
    if seeds.size and seeds.min() < 0:
        i = int(np.argmin(seeds))
        raise ArgumentError(f"{where}: the seed of sample {i} is {int(seeds[i])}, expected >= 0")


def check_children(f, answer, frontier, names, where):
    """``decide``'s answer as (counts: int64 NumPy, child_pull: array or None), checked."""
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise GraphError(f"{where}: decide(frontier) must return (counts, child_pull), got "
                         f"{type(answer).__name__} {validate.shown(answer)}")
    counts, child_pull = answer
    counts = np.asarray(backend.to_numpy(counts))
    n = len(frontier)
    if counts.shape != (n,):
        raise ShapeError(f"{where}: decide's counts have shape {describe(counts.shape)}, "
                         f"expected ({n},): one number of children per frontier vertex")
    if n and counts.dtype.kind not in "iub":
        if counts.dtype.kind != "f" or not (counts == np.round(counts)).all():
            raise DTypeError(f"{where}: decide's counts must be integers, got dtype "
                             f"{counts.dtype}")
    # (a count past any budget is as good as 2**62, and no longer wraps around in int64)
    counts = np.minimum(counts, 2**62).astype(np.int64)
    if (counts < 0).any():
        i = int(np.flatnonzero(counts < 0)[0])
        raise GraphError(f"{where}: {names(i)}: decide asked for {int(counts[i])} children "
                         f"(a count must be >= 0)")
    if f.arity is not None and f.arity < 1 and counts.any():
        raise GraphError(f"{where}: vertex function {f.name!r} declares arity {f.arity}, so "
                         f"a grown vertex cannot read its parent; declare arity=1")
    total = int(counts.sum())
    if f.pull_input is None:
        if child_pull is not None:
            raise GraphError(f"{where}: vertex function {f.name!r} pulls nothing, so decide's "
                             f"child_pull must be None")
        return counts, None
    if child_pull is None:
        if total:
            raise GraphError(f"{where}: decide gave no child_pull for {total} children; "
                             f"vertex function {f.name!r} pulls {describe(f.pull_shape)}")
        xp = backend.get_array_module(frontier.pull)
        return counts, xp.zeros((0,) + f.pull_shape, f.pull_dtype)
    xp = backend.get_array_module(frontier.pull)
    child_pull = child_pull._array if isinstance(child_pull, Tensor) else xp.asarray(child_pull)
    if tuple(child_pull.shape) != (total,) + f.pull_shape:
        raise ShapeError(f"{where}: decide's child_pull has shape {describe(child_pull.shape)}, "
                         f"expected {describe((total,) + f.pull_shape)}: one row of pull_shape "
                         f"per child ({total} children asked for)")
    if not np.can_cast(child_pull.dtype, f.pull_dtype, "same_kind"):
        raise DTypeError(f"{where}: decide's child_pull has dtype {child_pull.dtype}, but "
                         f"vertex function {f.name!r} pulls {f.pull_dtype}")
    return counts, child_pull.astype(f.pull_dtype, copy=False)


def apply_budget(counts, sample, made, max_vertices, on_budget, truncated, where):
    """Cut ``counts`` so that no sample passes ``max_vertices`` (or raise); ``made``: per
    sample, the vertices grown so far (updated). Returns ``(counts, asked)``: ``asked`` is the
    counts decide gave when some were cut (:func:`kept_children` then says which children
    stay), else None. Nothing here is sized by what decide asked for, which may be huge."""
    asked = np.bincount(sample, weights=counts, minlength=len(made))  # (float: no overflow)
    over = np.flatnonzero(made + asked > max_vertices)
    if over.size and on_budget == "error":
        s = int(over[0])
        raise GraphError(
            f"{where}: sample {s} reached max_vertices={max_vertices}: it has {int(made[s])} "
            f"vertices and decide asks for {asked[s]:.0f} more (its stop rule has not "
            f"fired); raise max_vertices, check the stop rule, or pass on_budget='truncate' "
            f"to keep the first {max_vertices} vertices")
    if not over.size:
        made += asked.astype(np.int64)
        return counts, None
    # Rows are grouped by sample: each row keeps what room its sample has left after the
    # rows before it.
    before = np.cumsum(counts, dtype=np.float64) - counts
    first_row = np.searchsorted(sample, sample)
    before -= before[first_row]
    room = (max_vertices - made)[sample]
    kept = np.clip(room - before, 0, counts).astype(np.int64)
    truncated[over] = True
    made += np.bincount(sample, weights=kept, minlength=len(made)).astype(np.int64)
    return kept, counts


def kept_children(asked, kept):
    """Which of the children decide asked for (``asked`` per row; row i's children first)
    stay when each row keeps its first ``kept`` of them: a mask over all of them."""
    starts = np.cumsum(asked) - asked
    rank = np.arange(int(asked.sum())) - np.repeat(starts, asked)
    return rank < np.repeat(kept, asked)
