"""Pieces the example models share: a cache of input graphs, the way a model runs its vertex
functions (batched, or per sample for the reference checks), what a prepared batch counts, and
small weight helpers."""

import functools

import numpy as np

from .. import ops
from ..autodiff import Parameter, Tensor, no_grad, tensor
from ..nn import init
from ..vertex import InputGraph


def runner(run):
    """``run`` as given (e.g. ``minicavs.vertex.evaluate_per_sample``), else the batched call.

    Every model's ``loss``/``predict`` takes ``run=``, so a test can evaluate the very same
    model per sample and compare losses and gradients with the batched runtime.
    """
    return run or (lambda F, batch, pull=None: F(batch, pull=pull))


class GraphCache:
    """The InputGraph of each tree, built once: an epoch revisits the same Tree objects, and
    validating and converting their child lists again every epoch would be wasted work.

    Keyed by ``id(tree)``; the entry keeps the tree alive, so an id is never reused for another
    tree while it is cached.
    """

    def __init__(self):
        self._graphs = {}

    def __call__(self, tree):
        entry = self._graphs.get(id(tree))
        if entry is None or entry[0] is not tree:
            entry = (tree, InputGraph(tree.children))
            self._graphs[id(tree)] = entry
        return entry[1]

    def __len__(self):
        return len(self._graphs)


# Chains of each length, built once and shared: an InputGraph is read-only.
chain = functools.lru_cache(maxsize=None)(InputGraph.chain)


class Counts:
    """What a prepared batch of chains or trees in ``graphs`` counts: ``num_samples`` (what
    throughput counts) and ``num_targets`` (what the loss is summed over)."""

    @property
    def num_samples(self):
        return self.graphs.num_graphs

    @property
    def num_targets(self):
        return len(self.targets)


def teacher_forced(model, batches):
    """``(loss per target, accuracy)`` of ``model.logits`` over prepared batches."""
    total, correct, count = 0.0, 0, 0
    with no_grad():
        for batch in batches:
            logits = model.logits(batch)
            total += cross_entropy_sum(logits, batch.targets).item()
            correct += int((logits.numpy().argmax(-1) == batch.targets).sum())
            count += batch.num_targets
    return total / max(count, 1), correct / max(count, 1)


def weight(shape, dtype, name=None):
    """A Xavier-initialised weight (in, out)."""
    return Parameter(init.xavier_uniform(shape, dtype=dtype), name=name)


def bias(size, dtype, name=None, value=0.0):
    return Parameter(np.full(size, value, dtype=np.dtype(dtype)), name=name)


def lstm_bias(hidden, gate_names, dtype, name=None):
    """A bias for stacked gates with the forget gates set to 1: the cell starts out keeping
    its memory, the usual remedy for vanishing gradients early in training."""
    values = np.concatenate([np.full(hidden, 1.0 if g.startswith("f") else 0.0)
                             for g in gate_names])
    return Parameter(values.astype(np.dtype(dtype)), name=name)


def as_ids(array):
    """A (n, 1) int64 Tensor of word ids: what a vertex function with pull_shape=(1,) and
    pull_dtype int64 pulls, one id per vertex (-1: no word, a zero embedding row)."""
    return tensor(np.asarray(array, dtype=np.int64).reshape(-1, 1))


def indices(array):
    """An int64 index Tensor on the current device: ops refuse to mix a NumPy index with
    CuPy data, so every index a model computes on the host goes through here."""
    return tensor(np.asarray(array, dtype=np.int64))


def cross_entropy_sum(logits, labels):
    """Summed softmax cross-entropy of ``logits`` (n, C) against int labels (n,)."""
    labels = labels if isinstance(labels, Tensor) else indices(labels)
    return ops.softmax_cross_entropy(logits, labels, reduction="sum")
