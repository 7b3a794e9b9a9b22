"""What ``decide(frontier)`` sees of a growing step: the :class:`Frontier`, and the seeded
generator of each sample behind its random choices."""

import numpy as np

from ... import backend, validate
from ...errors import NonFiniteError, ShapeError
from ...ops.registry import describe


class Frontier:
    """The vertices F just ran on, one row each, grouped by sample (in sample order):
    ``push`` (F's pushed outputs, or its states if it pushes nothing), ``state``, ``pull``,
    ``sample_of`` (which sample), ``vertex`` (its index in that sample, in growth order; 0 is
    the root), ``depth`` and ``slot`` (its position among its parent's children; 0 at a root).
    Arrays are NumPy or CuPy (the device's).

    ``decide(frontier)`` returns ``(counts, child_pull)``: ``counts[i]`` children for row i,
    and one pulled row per child — row i's children first, in slot order, then row i+1's —
    shape ``(counts.sum(), *F.pull_shape)`` (None if F pulls nothing). The helpers below make
    the usual choices batched: :meth:`argmax`, :meth:`sample`, :meth:`above`.
    """

    def __init__(self, push, state, pull, sample, vertex, depth, slot, streams):
        self.push, self.state, self.pull = push, state, pull
        self.sample_of, self.vertex, self.depth, self.slot = sample, vertex, depth, slot
        self._streams = streams

    def __len__(self):
        return len(self.sample_of)

    def argmax(self, values=None):
        """Per row, the index of the largest entry of ``values`` (default: ``push``), last
        axis."""
        values = self.push if values is None else values
        return backend.get_array_module(values).argmax(values, axis=-1)

    def above(self, values, threshold=0.0):
        """Per row, 1 where ``values`` (one per row) exceeds ``threshold``, else 0."""
        xp = backend.get_array_module(values)
        shape = tuple(getattr(values, "shape", ()))
        if shape not in ((len(self),), (len(self), 1)):
            raise ShapeError(f"Frontier.above: values has shape {describe(shape)}, expected "
                             f"({len(self)},) or ({len(self)}, 1): one value per frontier row")
        return (xp.reshape(values, (len(self),)) > threshold).astype(np.int64)

    def uniform(self, size=()):
        """Uniform numbers in [0, 1), shape ``(len(self), *size)``, drawn from each sample's
        own seeded generator (``grow``'s ``seed``): a sample draws the same numbers whatever
        the other samples do, and, given its own seed (``seed=[...]``, one per sample), at any
        position of any batch."""
        return self._streams.uniform(self.sample_of, size)

    def sample(self, logits=None, temperature=1.0):
        """Per row, an index drawn from softmax(``logits`` / temperature) (default logits:
        ``push``) with :meth:`uniform` — seeded, per sample."""
        logits = np.asarray(backend.to_numpy(self.push if logits is None else logits),
                            np.float64)
        validate.number(temperature, "temperature", "Frontier.sample", open_minimum=True,
                        minimum=0)
        bad = ~np.isfinite(logits).all(axis=-1)
        if bad.any():  # no probabilities to draw from: say where, do not draw index 0
            i = int(np.flatnonzero(bad)[0])
            raise NonFiniteError(f"Frontier.sample: the logits of sample "
                                 f"{int(self.sample_of[i])}, vertex {int(self.vertex[i])} are "
                                 f"not finite "
                                 f"({logits[i][~np.isfinite(logits[i])][0]})")
        # Shift before dividing: at a tiny temperature logits / temperature overflows to inf,
        # and inf - inf is NaN (which drew index 0); shifted, the largest is 0 and exp(0) = 1.
        with np.errstate(over="ignore"):  # (-inf for the others: probability 0)
            p = np.exp((logits - logits.max(axis=-1, keepdims=True)) / temperature)
        cdf = np.cumsum(p, axis=-1)
        u = self.uniform() * cdf[:, -1]
        return np.minimum((cdf <= u[:, None]).sum(axis=-1), logits.shape[-1] - 1)


class SampleStreams:
    """One seeded generator per sample, made when the sample first draws: seeded with
    ``(seed, s)`` for sample s when ``seed`` is one integer (a sample's numbers depend on its
    position in the batch), or with ``seed[s]`` when it is one integer per sample (the same
    numbers wherever the sample sits)."""

    def __init__(self, seed):
        self.seed = seed
        self._rngs = {}

    def _stream(self, s):
        rng = self._rngs.get(s)
        if rng is None:
            entropy = [self.seed, s] if np.ndim(self.seed) == 0 else int(self.seed[s])
            rng = self._rngs[s] = np.random.default_rng(entropy)
        return rng

    def uniform(self, sample, size):
        sample = backend.to_numpy(sample)
        size = tuple(np.atleast_1d(size)) if np.ndim(size) or size != () else ()
        out = np.empty((len(sample),) + size)
        starts = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]]) if len(sample) else []
        for lo, hi in zip(starts, list(starts[1:]) + [len(sample)]):
            out[lo:hi] = self._stream(int(sample[lo])).random((hi - lo,) + size)
        return out
