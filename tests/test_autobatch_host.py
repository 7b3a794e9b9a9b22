"""Autobatch's host side (issue 42): row indices planned once per segment, scatters that add
every term of a repeated row, and the host time per node a segment reports.

The emulated device's side (one upload of indices per segment, the same values and gradients
as NumPy) is in ``test_cuda_emulated.py``.
"""

import math

import numpy as np
import pytest

import minicavs as mc
from minicavs.autobatch import STRATEGIES, segment

RTOL, ATOL = 1e-9, 1e-12


def repeated_rows_program(rng, W, b):
    """Per sample, one value read by several nodes of one batch (its row repeats in that
    batch's gather, so its gradient is a scatter with repeated rows), also through a view of
    its columns, and twice by one node. Returns the loss."""
    losses = []
    for i in range(5):
        v = mc.tanh(mc.tensor(rng.normal(size=4)) @ W + b)
        reads = [mc.tanh(v) for _ in range(3)] + [mc.sigmoid(v[1:3]) for _ in range(i % 3 + 1)]
        reads.append(mc.concat([v, v]) @ mc.concat([W, W], axis=0))
        losses.append(mc.sum(mc.concat(reads) ** 2))
    return mc.add_n(losses)


def _grads(strategy, monkeypatch=None):
    rng = np.random.default_rng(5)
    W, b = mc.Parameter(rng.normal(size=(4, 4)) * 0.5), mc.Parameter(rng.normal(size=4) * 0.1)
    if strategy is None:
        loss = repeated_rows_program(rng, W, b)
        loss.backward()
    else:
        with mc.autobatch(strategy) as ab:
            loss = repeated_rows_program(rng, W, b)
            loss.backward()
        if strategy != "none":  # (a batch of one node reads one row)
            assert ab.segments[0].stats["scatter_made"] > 0
    return float(loss), W.grad.numpy(), b.grad.numpy()


@pytest.mark.parametrize("native", [True, False], ids=["native scatter", "numpy scatter"])
def test_repeated_rows_add_all_their_terms(monkeypatch, native):
    if not native:  # the NumPy forms: a gather-add-scatter where rows are distinct, add.at not
        monkeypatch.setattr(segment.kernels, "scatter_add_rows", lambda *a: False)
    ref = _grads(None)
    for strategy in STRATEGIES:
        for got, want in zip(_grads(strategy), ref):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=strategy)


def test_repeats_are_found_per_batch_and_operand():
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 6, size=rng.integers(1, 5))
        rows = rng.integers(0, 8, size=(int(sizes.sum()), 3))
        got = segment._repeats(rows, sizes)
        hi = np.cumsum(sizes)
        for j, (lo, z) in enumerate(zip(hi - sizes, hi)):
            for k in range(3):
                assert got[j, k] == (len(set(rows[lo:z, k].tolist())) < z - lo)


def test_a_segments_indices_are_one_array_and_its_entries_views_of_it():
    rng = np.random.default_rng(1)
    W, b = mc.Parameter(rng.normal(size=(4, 4))), mc.Parameter(rng.normal(size=4))
    with mc.autobatch("agenda") as ab:
        repeated_rows_program(rng, W, b).backward()
    seg = ab.segments[0]
    rows = [e[3] for b in seg.plan for e in b.inputs if e[3] is not None and e[1] is not None]
    assert rows and all(r.base is rows[0].base and r.dtype == np.int64 and r.flags.c_contiguous
                        for r in rows)
    assert any(not e[4] for b in seg.plan for e in b.inputs if e[3] is not None)  # repeats


def test_segments_report_their_host_time_per_node():
    rng = np.random.default_rng(2)
    W, b = mc.Parameter(rng.normal(size=(4, 4))), mc.Parameter(rng.normal(size=4))
    with mc.autobatch("agenda+") as ab:
        repeated_rows_program(rng, W, b).backward()
    stats = ab.segments[0].stats
    assert math.isfinite(stats["host_us_per_node"]) and stats["host_us_per_node"] > 0
    assert stats["kernel_s"] >= 0
    assert "host time per node" in ab.explain()
