"""Cutting a dataset into mini-batches: one rule for training (``minicavs/training.py``) and
for each rank of a data-parallel run (``minicavs/distributed/sampler.py``)."""

import numpy as np

from .. import validate


def minibatches(samples, batch_size, rng=None):
    """``samples`` cut into lists of at most ``batch_size``, shuffled first if ``rng`` is
    given (a numpy Generator)."""
    validate.integer(batch_size, "batch_size", "minibatches", minimum=1)
    order = np.arange(len(samples)) if rng is None else rng.permutation(len(samples))
    return [[samples[i] for i in order[k:k + batch_size]]
            for k in range(0, len(order), batch_size)]
