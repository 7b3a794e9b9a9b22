"""Memory: schedule arrays sized by the edges, a per-call estimate that bounds what a call
allocates, batches split to fit a memory budget (same results) or refused with a clear error,
and allocation failures reported with the buffer, the batch and what to reduce."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.runtime import interpreter_only
from minicavs.data import random_binary_tree
from minicavs.runtime import call, memory

from graph_strategies import forests
from vertex_cells import binary_tree_lstm, child_sum_tree_lstm

E, H = 4, 8


@pytest.fixture(autouse=True)
def _default_budget():
    yield
    mc.set_memory_budget(None)


def _trees(count, seed=0, low=3, high=30):
    rng = np.random.default_rng(seed)
    return [mc.InputGraph(random_binary_tree(int(rng.integers(low, high)), rng=rng).children)
            for _ in range(count)]


def test_a_vertex_with_100000_children_costs_memory_by_edges_not_by_vertices_times_arity():
    n = 100_000
    batch = mc.GraphBatch([mc.InputGraph([[]] * n + [list(range(n))])])
    schedule = [a for a in vars(batch).values() if isinstance(a, np.ndarray)]
    assert sum(a.nbytes for a in schedule) < 40 * 8 * (n + 1)  # a few arrays of V or E int64

    def cell(v):  # reads two of the 100,000 child slots
        v.scatter(mc.tanh(v.gather(0) + v.gather(n - 1) + v.pull()))
    F = mc.VertexFunction(cell, scatter_shape=(2,), pull_shape=(2,), arity=n, dtype="float64")
    X = mc.tensor(np.linspace(-1, 1, 2 * (n + 1)).reshape(n + 1, 2), requires_grad=True)
    out = F(batch, pull=X)
    (out * out).sum().backward()
    root = np.tanh(np.tanh(X.numpy()[0]) + np.tanh(X.numpy()[n - 1]) + X.numpy()[n])
    np.testing.assert_allclose(out.numpy()[n], root, rtol=1e-12)
    assert len(batch._child_rows) == 2  # only the slots the cell gathers were made


@pytest.mark.parametrize("make", [binary_tree_lstm, child_sum_tree_lstm])
@pytest.mark.parametrize("training", [False, True])
def test_the_estimate_bounds_what_a_call_allocates(make, training):
    F, _ = make(16, 32, np.random.default_rng(0))
    batch = mc.GraphBatch(_trees(120))
    X = mc.tensor(np.random.default_rng(1).standard_normal((batch.num_vertices, 16)),
                  requires_grad=training)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        if training:
            out = F(batch, pull=X)
            (out * out).sum().backward()
        else:
            with mc.no_grad():
                F(batch, pull=X)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    estimate = F.memory_model.need(memory.batch_sizes(batch), training)
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_budget_sizes_are_parsed():
    assert memory.parse_size("512M") == 512 * 2**20
    assert memory.parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert memory.parse_size(4096) == 4096
    with pytest.raises(mc.ArgumentError, match="memory budget: expected a positive number"):
        mc.set_memory_budget("lots")
    with pytest.raises(mc.ArgumentError, match="memory budget"):
        mc.set_memory_budget(-1)
    mc.set_memory_budget("3k")
    assert mc.memory_budget() == 3072


def test_the_budget_comes_from_the_environment_or_the_available_memory(monkeypatch):
    monkeypatch.setenv("MINICAVS_MEMORY_BUDGET", "64M")
    assert mc.memory_budget() == 64 * 2**20
    monkeypatch.delenv("MINICAVS_MEMORY_BUDGET")
    monkeypatch.setattr(memory, "_default", {})
    monkeypatch.setattr(memory.backend, "available_memory", lambda device=None: 10 * 2**30)
    assert mc.memory_budget() == int(9 * 2**30)


def _run(F, params, batch, X, training):
    for p in params + [X]:
        p.grad = None
    if not training:
        with mc.no_grad():
            return [F(batch, pull=X).numpy()]
    out = F(batch, pull=X)
    (out * out).sum().backward()
    return [out.numpy(), X.grad.numpy()] + [p.grad.numpy() for p in params]


@given(forests(max_arity=2, max_graphs=24, kinds=("tree", "chain", "dag")),
       st.integers(2, 6), st.booleans())
def test_a_batch_over_the_budget_is_split_with_the_same_results(graphs, parts, training):
    F, params = binary_tree_lstm(E, H, np.random.default_rng(0))
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(np.random.default_rng(1).standard_normal((batch.num_vertices, E)),
                  requires_grad=True)
    mc.set_memory_budget(None)  # (the previous example's budget)
    whole = _run(F, params, batch, X, training)
    model, sizes = F.memory_model, memory.batch_sizes(batch)
    # A budget for about 1/parts of the batch (each graph must fit alone), plus what all of
    # them keep for backward when training.
    kept = model.kept.at(sizes) if training else 0
    alone = max(model.need(memory.batch_sizes(batch, i, i + 1), training)
                for i in range(batch.num_graphs))
    mc.set_memory_budget(kept + max(alone, model.need(sizes, training) // parts))
    plan = memory.plan(F, batch, training)
    if plan is not None:
        assert [a for a, _ in plan] == sorted({a for a, _ in plan})
        assert plan[0][0] == 0 and plan[-1][1] == batch.num_graphs
    split = _run(F, params, batch, X, training)
    for got, want in zip(split, whole):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_splitting_lowers_the_peak_memory_of_a_training_step():
    F, params = binary_tree_lstm(16, 32, np.random.default_rng(0))
    batch = mc.GraphBatch(_trees(200))
    X = mc.tensor(np.random.default_rng(1).standard_normal((batch.num_vertices, 16)),
                  requires_grad=True)
    peaks = []
    for budget in (None, "half"):
        if budget:
            model, sizes = F.memory_model, memory.batch_sizes(batch)
            mc.set_memory_budget((model.kept.at(sizes) + model.need(sizes, True)) // 2)
        F.executable.pool, F.backward_executable.pool = memory.BufferPool(), memory.BufferPool()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _run(F, params, batch, X, True)
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        tracemalloc.stop()
    assert memory.plan(F, batch, True) is not None
    assert peaks[1] < 0.85 * peaks[0], peaks


def test_a_batch_that_cannot_fit_is_refused_before_it_runs():
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0))
    batch = mc.GraphBatch(_trees(50))
    X = mc.tensor(np.ones((batch.num_vertices, E)), requires_grad=True)
    mc.set_memory_budget("20k")
    with pytest.raises(mc.OutOfMemoryError) as info:
        F(batch, pull=X)
    message = str(info.value)
    assert message.startswith(f"vertex function 'cell': a batch of {batch.num_vertices:,} "
                              f"vertices and ")
    assert "in 50 graph(s)" in message and "more than the memory budget of 20.0 kB" in message
    assert "keeps for backward alone take" in message
    assert "Reduce the batch size (graphs per batch)" in message
    with mc.no_grad(), pytest.raises(mc.OutOfMemoryError, match=r"sample 0 alone needs"):
        mc.set_memory_budget(200)
        F(batch, pull=X)


def test_a_failed_allocation_names_the_buffer_the_batch_and_what_to_reduce(monkeypatch):
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0))
    batch = mc.GraphBatch(_trees(10))
    X = mc.tensor(np.ones((batch.num_vertices, E)))
    tries = []

    def refuse(shape, dtype=None):
        tries.append(shape)
        raise MemoryError(f"Unable to allocate an array with shape {shape}")

    class NoMemory:  # numpy, but every batch buffer allocation fails
        __name__ = "numpy"

        def __getattr__(self, name):
            return refuse if name == "empty" else getattr(np, name)

    pool = memory.BufferPool()
    with pytest.raises(mc.OutOfMemoryError) as info:
        pool.acquire(NoMemory(), call.buffer_specs(F.program, batch.indices(np)))
    assert len(tries) == 2  # once more after the free sets were dropped
    assert str(info.value).startswith("cannot allocate buffer '") and "of cell" in str(info.value)

    def fail(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000000, 2000)")
    monkeypatch.setattr(call, "take_rows", fail)
    with pytest.raises(mc.OutOfMemoryError) as info:
        F(batch, pull=X)
    message = str(info.value)
    assert message.startswith("vertex function 'cell': out of memory in the forward pass over "
                              f"a batch of {batch.num_vertices:,} vertices")
    assert "Unable to allocate 7.45 GiB" in message and "needs about" in message
    assert "Reduce the batch size" in message and "MINICAVS_MEMORY_BUDGET" in message


def test_fused_kernels_keep_one_level_of_scratch_not_one_per_level_size():
    F, _ = binary_tree_lstm(E, 64, np.random.default_rng(0))

    def scratch_bytes():
        kernels = [k for ins in F.program.core if hasattr(ins, "step")
                   for k in getattr(ins.step, "_kernels", {}).values()]
        return sum(a.nbytes for k in kernels for a in getattr(k._local, "flat", {}).values())

    def run(copies):  # (the NumPy interpreter's fused kernels; native loops: test_native.py)
        batch = mc.GraphBatch([mc.InputGraph.complete_binary(2)] * copies)
        with mc.no_grad(), interpreter_only():
            F(batch, pull=mc.tensor(np.ones((batch.num_vertices, E))))

    run(40)  # the largest level first
    largest = scratch_bytes()
    for copies in range(1, 40):  # then levels of 39 other sizes: nothing more is kept
        run(copies)
    assert 0 < scratch_bytes() == largest
