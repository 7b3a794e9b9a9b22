"""Each rank's share of an epoch.

``--batch-size`` is per rank. Step k of an epoch with N ranks trains on the global batch k that
one process with batch N × B would train on (the same shuffle: :func:`minicavs.data.
batches.minibatches` with the generator seeded by (seed, epoch)), cut into N contiguous parts whose
sizes differ by at most one; rank r takes part r. Every rank therefore makes the same number of
steps, and a short last batch is spread over the ranks (a rank may get nothing in a step where
fewer samples than ranks are left; it still takes part in the step's collectives).
"""

import numpy as np

from ..data.batches import minibatches


def shard(batch, rank, size):
    """Part ``rank`` of ``size`` of ``batch`` (a list): contiguous, sizes differing by at most
    one, earlier parts the longer (NumPy's ``array_split``)."""
    if not 0 <= rank < size:
        raise ValueError(f"shard: rank {rank} is not in 0..{size - 1}")
    base, extra = divmod(len(batch), size)
    start = rank * base + min(rank, extra)
    return batch[start:start + base + (rank < extra)]


class DistributedSampler:
    """The batches of ``samples`` that one rank trains on, epoch by epoch.

    ``DistributedSampler(samples, batch_size, rank=r, size=n, seed=s).batches(epoch)`` is a
    list with one list of samples per step; over the ranks, step k holds exactly the samples of
    step k of ``minibatches(samples, n * batch_size, default_rng([s, epoch]))``.
    ``shuffle=False`` keeps the samples' order (evaluation).
    """

    def __init__(self, samples, batch_size, *, rank=0, size=1, seed=0, shuffle=True):
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"DistributedSampler: rank {rank} of {size} ranks is not valid")
        self.samples = samples
        self.batch_size = int(batch_size)
        self.rank, self.size = int(rank), int(size)
        self.seed = seed
        self.shuffle = shuffle

    def __len__(self):
        """Steps per epoch (the same on every rank)."""
        step = self.batch_size * self.size
        return (len(self.samples) + step - 1) // step

    def global_batches(self, epoch):
        """The batches of all ranks together, as one process with N × B would see them."""
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        return minibatches(self.samples, self.batch_size * self.size, rng)

    def batches(self, epoch):
        """This rank's samples for each step of ``epoch``."""
        return [shard(batch, self.rank, self.size) for batch in self.global_batches(epoch)]
