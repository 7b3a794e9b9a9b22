import numpy as np


def decide(frontier):
    counts = np.where(frontier.depth < 2, 2, 0)
    return counts, np.zeros(counts.sum(), dtype=np.int64)
