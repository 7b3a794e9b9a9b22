"""Partitioning a recorded graph into batches: the depth and agenda strategies (the table in
docs/autobatch.md, "The strategies").

Input: per node its signature id and depth (1 + the deepest pending input) and the edges
between pending nodes. Output: batches, each an array of node indices of one signature whose
inputs are all in earlier batches. The set-up is NumPy over whole arrays; the agenda loop does
a fixed handful of array operations per *batch*, never per node — and where native code runs,
the same loop runs in C in one call (``cpu/kernels.agenda_schedule``; the NumPy loop below is
its reference). ``depth``: one batch per (depth, signature), by depth (TensorFlow Fold);
``agenda``: repeatedly every ready node of the signature of lowest *average* depth (DyNet);
``none``: every node alone. Within each batch the nodes are then ordered as their first reader
reads them (``in_reader_order``), so that later batches read rows in place.
"""

import numpy as np

from ..cpu import kernels


def batches_none(num_nodes):
    return [np.array([i], dtype=np.int64) for i in range(num_nodes)]


def batches_by_depth(sig, depth):
    """One batch per (depth, signature), by depth, then signature."""
    if not len(sig):
        return []
    order = np.lexsort((sig, depth))
    d, s = depth[order], sig[order]
    cuts = np.flatnonzero((d[1:] != d[:-1]) | (s[1:] != s[:-1])) + 1
    return np.split(order, cuts)


def batches_by_agenda(sig, depth, src, dst, num_sigs, native=True):
    """DyNet's agenda over nodes with signatures ``sig`` and depths ``depth``; ``src -> dst``
    are the edges between nodes (repeats allowed). ``native``: the loop below runs in C where
    native code runs (the same batches; this NumPy form is its reference)."""
    n = len(sig)
    if not n:
        return []
    waiting = np.bincount(dst, minlength=n).astype(np.int64)  # inputs not yet computed
    # Consumers of each node as CSR, to release them when a batch is done.
    by_src = np.argsort(src, kind="stable")
    consumers = dst[by_src]
    consumer_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=consumer_ptr[1:])
    # The nodes of each signature contiguous, so "the ready nodes of signature s" is a scan
    # of that signature's segment only.
    per_sig = np.argsort(sig, kind="stable")
    position = np.empty(n, dtype=np.int64)
    position[per_sig] = np.arange(n)
    sig_count = np.bincount(sig, minlength=num_sigs)
    sig_start = np.zeros(num_sigs + 1, dtype=np.int64)
    np.cumsum(sig_count, out=sig_start[1:])
    average_depth = np.bincount(sig, weights=depth, minlength=num_sigs) / np.maximum(sig_count, 1)
    ready = np.zeros(n, dtype=bool)  # indexed by position in per_sig
    first = np.flatnonzero(waiting == 0)
    ready[position[first]] = True
    ready_count = np.bincount(sig[first], minlength=num_sigs).astype(np.int64)
    if native:  # the same loop in C, one call (cpu/kernels.py), where native code runs
        batches = kernels.agenda_schedule(sig, waiting, consumer_ptr, consumers, per_sig,
                                          position, sig_start, average_depth, ready,
                                          ready_count)
        if batches is not None:
            return batches
    priority = np.where(ready_count > 0, average_depth, np.inf)
    batches, done = [], 0
    while done < n:
        s = int(priority.argmin())
        lo, hi = sig_start[s], sig_start[s + 1]
        hits = np.flatnonzero(ready[lo:hi])
        batch = per_sig[lo + hits]
        ready[lo + hits] = False
        ready_count[s] = 0
        priority[s] = np.inf
        batches.append(batch)
        done += len(batch)
        # Release the consumers: one fewer input waiting for each edge out of the batch.
        starts, stops = consumer_ptr[batch], consumer_ptr[batch + 1]
        lengths = stops - starts
        total = int(lengths.sum())
        if not total:
            continue
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
        released = consumers[np.arange(total) + offsets]
        np.subtract.at(waiting, released, 1)
        now_ready = np.unique(released[waiting[released] == 0])
        if len(now_ready):
            ready[position[now_ready]] = True
            newly = np.bincount(sig[now_ready], minlength=num_sigs)
            ready_count += newly
            touched = newly > 0
            priority[touched] = average_depth[touched]
    return batches


def in_reader_order(batches, src, dst, num_nodes, native=True):
    """``batches`` with each one's nodes reordered so that a later batch finds its operand rows
    as one run where it can — an LSTM step the previous step's states, the words' embeddings
    in the order the first LSTM reads them — a view instead of a gather (and, backwards, an
    add into rows instead of a scatter). Each node goes where its first reader (one in the
    earliest batch that reads it) is, nodes no batch reads last. From the last batch back: a
    reader's place is final before the nodes it reads are placed. ``native``: the same loop in
    C where native code runs (``cpu/kernels.reader_order``; this NumPy form is its reference)."""
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    if len(batches) < 2 or not len(src) or sizes.max() == 1:
        return batches
    if native:
        order, ends = np.concatenate(batches).astype(np.int64, copy=False), np.cumsum(sizes)
        if kernels.reader_order(order, ends, src, dst):
            return np.split(order, ends[:-1])
    batch_of = np.empty(num_nodes, dtype=np.int64)
    batch_of[np.concatenate(batches)] = np.repeat(np.arange(len(batches)), sizes)
    first_batch = np.full(num_nodes, len(batches), dtype=np.int64)
    np.minimum.at(first_batch, src, batch_of[dst])
    first = batch_of[dst] == first_batch[src]
    reader = np.full(num_nodes, num_nodes, dtype=np.int64)  # num_nodes: none
    reader[src[first]] = dst[first]
    at = np.full(num_nodes + 1, num_nodes, dtype=np.int64)  # a node's place, in run order
    places = np.arange(num_nodes, dtype=np.int64)
    batches, hi = list(batches), num_nodes
    for i in range(len(batches) - 1, -1, -1):
        nodes = batches[i]
        lo = hi - len(nodes)
        if len(nodes) > 1:
            nodes = batches[i] = nodes[np.argsort(at[reader[nodes]], kind="stable")]
        at[nodes] = places[lo:hi]
        hi = lo
    return batches


STRATEGIES = ("none", "depth", "agenda", "depth+", "agenda+")


def plan(strategy, sig, depth, src, dst, num_sigs):
    base = strategy.rstrip("+")
    if base == "none":
        return batches_none(len(sig))
    if base == "depth":
        batches = batches_by_depth(sig, depth)
    else:
        batches = batches_by_agenda(sig, depth, src, dst, num_sigs)
    return in_reader_order(batches, src, dst, len(sig))
