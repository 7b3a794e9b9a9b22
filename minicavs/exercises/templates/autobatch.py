"""Chapter 9: the batching rule of an op that normalises a vector to sum 1:
forward(x) = x / x.sum(axis=-1, keepdims=True). Inside mc.autobatch, a batch of nodes runs the
op once on stacked rows: ``items`` holds, per argument, (batched symbol, domain) where the
batched symbol has one more leading axis (the rows of the batch). Return the batched result,
written with ops, each row normalised on its own.
Check: python -m minicavs.exercises check autobatch"""
import minicavs as mc


def rule(op, items, attrs, out):
    (x, domain), = items
    return x / mc.sum(x)
