"""Chapter 11: a decide(frontier) for mc.grow that grows every sample into a complete binary
tree of depth 2 (7 vertices): return, per frontier row, how many children it gets, and one
pulled id per child (any id in 0..3). ``frontier.depth`` is each row's depth.
Check: python -m minicavs.exercises check growth"""
import numpy as np


def decide(frontier):
    counts = np.zeros(len(frontier.depth), dtype=np.int64)
    return counts, np.zeros(counts.sum(), dtype=np.int64)
