"""Autobatch's host side (issue 42): row indices planned once per segment, scatters that add
every term of a repeated row, and the host time per node a segment reports.

The emulated device's side (one upload of indices per segment, the same values and gradients
as NumPy) is in ``test_cuda_emulated.py``.
"""

import math

import numpy as np
import pytest

import minicavs as mc
from minicavs.autobatch import STRATEGIES, schedule, segment

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


def test_reader_order_permutes_within_batches_only():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 40))
        dst = rng.integers(1, n, size=3 * n)
        src = (rng.random(len(dst)) * dst).astype(np.int64)  # edges from earlier nodes
        sig = rng.integers(0, 3, size=n)
        depth = np.zeros(n, dtype=np.int64)
        for s, d in sorted(zip(src.tolist(), dst.tolist()), key=lambda e: e[1]):
            depth[d] = max(depth[d], depth[s] + 1)
        batches = schedule.batches_by_depth(sig, depth)
        ordered = schedule.in_reader_order(batches, src, dst, n)
        assert [sorted(b.tolist()) for b in ordered] == [sorted(b.tolist()) for b in batches]


def test_lstm_steps_read_the_previous_steps_states_in_place():
    """Chains of different lengths: each step's batch is laid out in the order the next step
    reads it, so no step gathers its states, and the inputs of every step are one run."""
    rng = np.random.default_rng(4)
    H = 3
    W, U = (mc.Parameter(rng.normal(size=(H, 4 * H))) for _ in range(2))
    b = mc.Parameter(np.zeros(4 * H))
    with mc.autobatch("agenda") as ab:
        ends = []
        for length in rng.permutation([1, 5, 2, 7, 3, 6, 4, 2]).tolist():
            state = mc.tensor(np.zeros(2 * H))
            for _ in range(length):
                state = mc.lstm_step(mc.tanh(mc.tensor(rng.normal(size=H))), state, W, U, b)
            ends.append(mc.sum(state))
        mc.add_n(ends).backward()
    steps = [b for b in ab.segments[0].plan if b.sig.op.name == "lstm_step"]
    assert len(steps) == 7 and all(entry[3] is None for b in steps for entry in b.inputs)


@pytest.mark.gpu
def test_gpu_repeated_rows_equal_numpy():
    """On CuPy: the atomic scatter, add.at into a view, device indices (float32 against the
    float64 NumPy run)."""
    from minicavs import backend

    want = _grads("agenda+")
    rng = np.random.default_rng(5)
    mc.set_device("cuda")
    try:
        W = mc.Parameter(backend.to_device((rng.normal(size=(4, 4)) * 0.5).astype(np.float32)))
        b = mc.Parameter(backend.to_device((rng.normal(size=4) * 0.1).astype(np.float32)))
        with mc.autobatch("agenda+") as ab:
            loss = repeated_rows_program(rng, W, b)
            loss.backward()
        got = float(loss), backend.to_numpy(W.grad.data), backend.to_numpy(b.grad.data)
    finally:
        mc.set_device("cpu")
    assert ab.segments[0].xp is not np
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
