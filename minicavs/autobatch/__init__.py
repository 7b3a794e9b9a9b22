"""Automatic batching of plain per-sample eager code (DyNet's on-the-fly batching, with the
backward-pass strategy of the backward-batching paper). See ``docs/autobatch.md``.

    with mc.autobatch("agenda+") as ab:
        losses = [model(sample) for sample in batch]   # written per sample, recorded lazily
        loss = mc.sum(mc.stack(losses))
        loss.backward()                                 # forward and backward run batched
    print(ab.explain())

A front-end beside the vertex-function ones: it records ops on Tensors (through the hook in
``autodiff/tensor.py``) and runs them through the ops' own batching rules (``ops/batching.py``)
and VJPs; nothing below it imports it.
"""

from .scope import AutoBatch, LazyTensor, autobatch
from .schedule import STRATEGIES

__all__ = ["AutoBatch", "LazyTensor", "STRATEGIES", "autobatch"]
