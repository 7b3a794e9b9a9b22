"""The central property of the runtime: batched execution equals a plain per-sample
evaluation of the same cell, in values and in every gradient (Cavs' correctness contract)."""

from dataclasses import fields
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.vertex import evaluate_per_sample

from graph_strategies import forests
from threads import run_in_threads
from vertex_cells import binary_tree_lstm, child_sum_tree_lstm, embedding_tree_lstm, k_ary_cell

E, H = 3, 4

# Every test here runs on both CPU backends: the native level loops and the NumPy interpreter.
pytestmark = pytest.mark.usefixtures("cpu_backend")


def _relative_error(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)), initial=0.0))


def _grad(t):
    """A parameter no vertex used has no gradient in the per-sample run: that is zero."""
    return t.grad.numpy() if t.grad is not None else np.zeros(t.shape)


def _check_batched_equals_reference(F, params, graphs, seed=0, X=None):
    rng = np.random.default_rng(seed)
    batch = mc.GraphBatch(graphs)
    if X is None:
        X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    weights = rng.standard_normal((batch.num_vertices,) + F.push_shape)
    leaves = ([X] if X.requires_grad else []) + params

    out = F(batch, pull=X)
    loss = (out * mc.tensor(weights)).sum() + (out * out).sum()
    loss.backward()
    batched = [out.numpy(), loss.item()] + [_grad(t) for t in leaves]
    for t in leaves:
        t.grad = None

    ref_out = evaluate_per_sample(F, batch, X)
    ref_loss = (ref_out * mc.tensor(weights)).sum() + (ref_out * ref_out).sum()
    ref_loss.backward()
    reference = [ref_out.numpy(), ref_loss.item()] + [_grad(t) for t in leaves]
    for t in leaves:
        t.grad = None

    names = ["pushed outputs", "loss"] + ["grad X"] * X.requires_grad + [
        f"grad {p.name}" for p in params]
    for name, got, want in zip(names, batched, reference):
        assert np.shape(got) == np.shape(want), name
        assert _relative_error(got, want) <= 1e-9, f"{name}: {_relative_error(got, want)}"


@given(forests(max_arity=2, max_vertices=16), st.integers(0, 2**16))
def test_binary_tree_lstm_batched_equals_per_sample(graphs, seed):
    F, params = binary_tree_lstm(E, H, np.random.default_rng(seed))
    _check_batched_equals_reference(F, params, graphs, seed)


@given(forests(max_arity=4, max_vertices=16), st.integers(0, 2**16))
def test_child_sum_tree_lstm_batched_equals_per_sample(graphs, seed):
    F, params = child_sum_tree_lstm(E, H, np.random.default_rng(seed))
    _check_batched_equals_reference(F, params, graphs, seed)


@given(st.integers(0, 4).flatmap(lambda a: st.tuples(st.just(a), forests(max_arity=a, max_graphs=8))),
       st.integers(0, 2**16))
def test_k_ary_cell_batched_equals_per_sample(arity_and_graphs, seed):
    arity, graphs = arity_and_graphs
    F, params = k_ary_cell(E, H, arity, np.random.default_rng(seed))
    _check_batched_equals_reference(F, params, graphs, seed)


SWITCHES = [f.name for f in fields(mc.vertex.Options)]
any_options = st.fixed_dictionaries({name: st.booleans() for name in SWITCHES})
CELLS = {"binary": lambda rng, o: binary_tree_lstm(E, H, rng, options=o),
         "child-sum": lambda rng, o: child_sum_tree_lstm(E, H, rng, options=o),
         "3-ary": lambda rng, o: k_ary_cell(E, H, 3, rng, options=o)}


@given(st.sampled_from(sorted(CELLS)), any_options, forests(max_arity=3, max_vertices=12),
       st.integers(0, 2**16))
def test_every_combination_of_passes_equals_per_sample(cell, options, graphs, seed):
    """Each pass is an optimisation: with any set of them switched off, the batched runtime
    still equals the per-sample reference (which runs no pass at all)."""
    if cell == "binary":
        graphs = [g for g in graphs if g.max_arity <= 2] or [mc.InputGraph.chain(3)]
    F, params = CELLS[cell](np.random.default_rng(seed), options)
    _check_batched_equals_reference(F, params, graphs, seed)


@given(any_options, forests(max_arity=2, max_vertices=16), st.integers(0, 2**16))
def test_embedded_words_with_zero_rows_equal_per_sample(options, graphs, seed):
    """Pulled word ids, -1 at internal vertices: the zero rows of the embedding, of x W and of
    the table's gradient are skipped (zero_rows), with the same results."""
    rng = np.random.default_rng(seed)
    F, params = embedding_tree_lstm(E, H, 7, rng, options=options)
    batch = mc.GraphBatch(graphs)
    words = np.where(batch.num_children == 0, rng.integers(0, 7, batch.num_vertices), -1)
    _check_batched_equals_reference(F, params, graphs, seed, X=mc.tensor(words))


def test_an_embeddings_gradient_from_a_small_vocabulary_adds_before_it_multiplies(monkeypatch):
    """The table's gradient of the embedded Tree-LSTM, two words over 24 leaves: the rows of
    dG are added into the table's rows first and the sums multiplied by Wᵀ (fewer rows than
    dG·Wᵀ), with the per-sample reference's values and gradients."""
    from minicavs.runtime import interpreter

    ran = []
    scatter = interpreter._ScatterFirst.scatter
    monkeypatch.setattr(interpreter._ScatterFirst, "scatter",
                        lambda self, *args: ran.append(len(self.x)) or scatter(self, *args))
    rng = np.random.default_rng(11)
    F, params = embedding_tree_lstm(E, H, 2, rng)
    graphs = [mc.InputGraph.complete_binary(8)] * 3
    batch = mc.GraphBatch(graphs)
    words = np.where(batch.num_children == 0, rng.integers(0, 2, batch.num_vertices), -1)
    _check_batched_equals_reference(F, params, graphs, 11, X=mc.tensor(words))
    assert ran and min(ran) >= 4, ran


def test_gate_gradient_blocks_zero_at_the_leaves_skip_their_products(monkeypatch):
    """In ∂F of the embedded Tree-LSTM the forget gates' gradients are zero at the leaves (no
    child cell), the only rows where x is nonzero: dx = dG·Wᵀ and dW = xᵀ·dG run the other gate
    columns there and none of the forget gates' (linalg._column_blocks), with the per-sample
    reference's results."""
    from minicavs.ops import linalg

    found = []
    blocks = linalg._column_blocks
    monkeypatch.setattr(linalg, "_column_blocks", lambda *args: found.append(blocks(*args))
                        or found[-1])
    rng = np.random.default_rng(5)
    F, params = embedding_tree_lstm(E, H, 7, rng)
    graphs = [mc.InputGraph([[], [], [0, 1], [], [2, 3]]), mc.InputGraph([[], [], [0, 1]])]
    batch = mc.GraphBatch(graphs)
    words = np.where(batch.num_children == 0, rng.integers(0, 7, batch.num_vertices), -1)
    _check_batched_equals_reference(F, params, graphs, 5, X=mc.tensor(words))
    leaves = int(batch.level_offsets[1])
    split = [b for b in found if b is not None]
    assert len(split) == 2, found  # dx and dW
    for b in split:  # the gates i | f_l f_r | o u: the forget gates on no leaf row
        assert [(c0, c1) for c0, c1, _ in b] == [(0, H), (H, 3 * H), (3 * H, 5 * H)], b
        assert [rows for *_, rows in b] == [(0, leaves), (0, 0), (0, leaves)], b


@given(st.integers(0, 2**16), st.sampled_from([None, (0, 0), (2, 5)]))
def test_products_by_column_blocks_equal_the_whole_products(seed, within):
    """X·W and Xᵀ·G where X (or G) concatenates parts nonzero on different rows, as the
    whole-batch product rule runs them (each block of parts on its own rows): equal to the
    products of the whole on the rows read (``within``: the rows of X·W read; None: all)."""
    from types import SimpleNamespace

    from minicavs.ops import batching, linalg, shape

    rng = np.random.default_rng(seed)
    n, widths, V = 9, (2, 3, 1, 2), batching.VERTICES
    ranges, parts = {}, []
    for k, w in enumerate(widths):
        lo, hi = sorted(rng.integers(0, n + 1, 2).tolist())
        ranges[f"p{k}"] = (lo, hi)
        part = np.zeros((n, w))
        part[lo:hi] = rng.standard_normal((hi - lo, w))
        parts.append(part)
    x = np.concatenate(parts, axis=1)
    W, y = rng.standard_normal((x.shape[1], 4)), rng.standard_normal((n, 3))
    y[:1] = y[7:] = 0
    ranges["y"] = (1, 7)

    def node(key, shape_, op=None, inputs=(), **attrs):
        return SimpleNamespace(key=key, shape=shape_, kind="op" if op else "input", op=op,
                               inputs=tuple(inputs), attrs=attrs, dtype=np.dtype(np.float64))

    concat = node("x", (V, x.shape[1]), shape.CONCAT,
                  [node(f"p{k}", (V, w)) for k, w in enumerate(widths)], axis=1)
    range_of = lambda s: ranges.get(s.key, (0, 1 << 62))  # noqa: E731
    xw = node("xW", (V, 4), linalg.MATMUL, [concat, node("W", W.shape)])
    done = linalg._matmul_on_nonzero_rows(np, xw, [x, W], range_of, within)
    want = x @ W
    if within is not None:
        want[:within[0]] = want[within[1]:] = 0
    if done is not None:  # (None: one block on all rows, the plain product runs)
        got, (lo, hi) = done
        if within is not None:
            got[:within[0]] = got[within[1]:] = 0
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        assert not got[:lo].any() and not got[hi:].any()
    yt = node("yt", (3, V), shape.TRANSPOSE, [node("y", (V, 3))], axes=(1, 0))
    ytx = node("ytx", (3, x.shape[1]), linalg.MATMUL, [yt, concat])
    done = linalg._matmul_on_nonzero_rows(np, ytx, [y.T, x], range_of, None)
    if done is not None:
        np.testing.assert_allclose(done[0], y.T @ x, rtol=1e-12, atol=1e-12)


@given(st.lists(st.integers(0, 3), max_size=8), st.integers(-2, 14), st.integers(-2, 14))
def test_the_levels_a_range_of_rows_misses_are_those_of_the_definition(sizes, lo, hi):
    """The level plans' zero levels of a value whose rows outside ``[lo, hi)`` are zero, found
    by two bisections (runtime/plans.py): every level, empty ones too, where
    ``max(start, lo) >= min(end, hi)``."""
    from minicavs.runtime import plans

    ends = np.cumsum(sizes).tolist()
    windows = list(zip([0] + ends[:-1], ends))
    assert plans._Levels(windows).outside(lo, hi) == \
        [max(s, lo) >= min(e, hi) for s, e in windows]


@given(st.integers(0, 2**16), st.sampled_from([None, (0, 9), (0, 4), (3, 7), (6, 12)]))
def test_a_product_writes_the_rows_its_readers_read(seed, within):
    """X·W on X's nonzero rows (lo, hi): every row a reader reads (``within``, None: all) is
    the product's, zero outside (lo, hi); the rows outside ``within`` (an embedding gradient's
    rows at internal vertices, which its scatter skips) are not written (the output's memory
    comes back as NaN here: they stay NaN)."""
    from types import SimpleNamespace

    from minicavs.ops import batching, linalg

    rng = np.random.default_rng(seed)
    n = 10
    lo, hi = sorted(rng.integers(0, n + 1, 2).tolist())
    if hi - lo == n:
        lo = 1
    x = np.zeros((n, 3))
    x[lo:hi] = rng.standard_normal((hi - lo, 3))
    W = rng.standard_normal((3, 4))

    def node(key, shape_, op=None, inputs=()):
        return SimpleNamespace(key=key, shape=shape_, kind="op" if op else "input", op=op,
                               inputs=tuple(inputs), attrs={}, dtype=np.dtype(np.float64))

    xw = node("xW", (batching.VERTICES, 4), linalg.MATMUL,
              [node("x", (batching.VERTICES, 3)), node("W", W.shape)])
    empty = np.empty
    with mock.patch.object(np, "empty", lambda *a, **k: empty(*a, **k) * np.nan):
        got, _ = linalg._matmul_on_nonzero_rows(
            np, xw, [x, W], lambda s: (lo, hi) if s.key == "x" else None, within)
    r0, r1 = (0, n) if within is None else (within[0], min(within[1], n))
    np.testing.assert_allclose(got[r0:r1], (x @ W)[r0:r1], rtol=1e-12, atol=1e-12)
    if max(lo, r0) < min(hi, r1):  # (else no row is read nonzero: all zeros, no product)
        assert np.isnan(got[:r0]).all() and np.isnan(got[r1:]).all()


@given(any_options, forests(max_arity=3, max_vertices=12, kinds=("tree", "dag")),
       st.integers(0, 2**16))
def test_gathers_sharing_one_gradient_equal_per_sample(options, graphs, seed):
    """In ``tanh(gather(0) + gather(2) + pull)`` the gradients of both gathers and of the
    pulled input are one value of ∂F: each slot's scatter-add still runs on every level where
    a vertex has that child, and the pulled input's gradient is kept for all rows."""
    rng = np.random.default_rng(seed)
    W = mc.Parameter(rng.standard_normal((H, H)) * 0.5, name="W")

    def cell(v):
        h = mc.tanh(v.gather(0) + v.gather(2) + v.pull())
        v.scatter(h)
        v.push(h @ W)

    F = mc.VertexFunction(cell, pull_shape=(H,), scatter_shape=(H,), arity=3,
                          dtype="float64", options=options)
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, H)), requires_grad=True)
    _check_batched_equals_reference(F, [W], graphs, seed, X=X)


@given(any_options, forests(max_arity=2, max_vertices=8), st.integers(0, 2**16))
def test_a_cell_without_gathers_equals_per_sample(options, graphs, seed):
    """F with no gather has no core: ∂F reads the caller's gradient of the states (F returns
    them) only in its lazy phase, over all rows."""
    rng = np.random.default_rng(seed)
    W = mc.Parameter(rng.standard_normal((E, H)) * 0.5, name="W")
    F = mc.VertexFunction(lambda v: v.scatter(mc.tanh(v.pull() @ W)), pull_shape=(E,),
                          scatter_shape=(H,), dtype="float64", options=options)
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    results = []
    for run in (F, lambda b, pull: evaluate_per_sample(F, b, pull)):
        W.grad = X.grad = None
        out = run(batch, pull=X)
        (out * out).sum().backward()
        results.append([out.numpy(), W.grad.numpy(), X.grad.numpy()])
    for got, want in zip(*results):
        assert _relative_error(got, want) <= 1e-9


def test_options_are_checked():
    with pytest.raises(mc.GraphError, match="unknown switch 'bogus'.*the switches are"):
        binary_tree_lstm(E, H, np.random.default_rng(0), options={"bogus": True})
    with pytest.raises(mc.GraphError, match="switch 'fuse' must be True or False"):
        binary_tree_lstm(E, H, np.random.default_rng(0), options={"fuse": 1})


@pytest.mark.parametrize("options", [dict(hoist_eager=False), dict(lazy_batching=False),
                                     dict(hoist_eager=False, lazy_batching=False)])
def test_ablation_switches_keep_results(options):
    rng = np.random.default_rng(3)
    graphs = [mc.InputGraph.complete_binary(4), mc.InputGraph.chain(5),
              mc.InputGraph([[], [0], [0, 1]])]
    W, U = (mc.Parameter(rng.standard_normal(s) * 0.5) for s in [(E, H), (H, H)])

    def cell(v):
        h = mc.tanh(v.pull() @ W + (v.gather(0) + v.gather(1)) @ U)
        v.scatter(h)
        v.push(h * 2.0)

    results = []
    for opts in [None, options]:
        F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), push_shape=(H,),
                              arity=2, dtype="float64", options=opts)
        batch = mc.GraphBatch(graphs)
        X = mc.tensor(np.random.default_rng(0).standard_normal((batch.num_vertices, E)),
                      requires_grad=True)
        (F(batch, pull=X) ** 2).sum().backward()
        results.append([X.grad.numpy(), W.grad.numpy(), U.grad.numpy()])
        X.grad = W.grad = U.grad = None
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_float32_runs_and_matches_float64_closely():
    rng = np.random.default_rng(0)
    F32, p32 = binary_tree_lstm(E, H, np.random.default_rng(1), dtype="float32")
    F64, p64 = binary_tree_lstm(E, H, np.random.default_rng(1), dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(8)])
    X = rng.standard_normal((batch.num_vertices, E))
    out32 = F32(batch, pull=mc.tensor(X.astype(np.float32)))
    out64 = F64(batch, pull=mc.tensor(X))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32.numpy(), out64.numpy(), rtol=1e-4, atol=1e-5)


def test_encoder_decoder_through_push_and_pull():
    """An encoder's pushed root states are pulled by a decoder (seq2seq): the chained
    vertex functions equal the same computation evaluated per sample."""
    rng = np.random.default_rng(7)
    We = mc.Parameter(rng.standard_normal((E, H)) * 0.5, name="We")
    Ue = mc.Parameter(rng.standard_normal((H, H)) * 0.5, name="Ue")
    Wd = mc.Parameter(rng.standard_normal((H, H)) * 0.5, name="Wd")
    Ud = mc.Parameter(rng.standard_normal((H, H)) * 0.5, name="Ud")

    def encoder_cell(v):
        h = mc.tanh(v.pull() @ We + v.gather(0) @ Ue)
        v.scatter(h)
        v.push(h)

    def decoder_cell(v):
        h = mc.tanh(v.pull() @ Wd + v.gather(0) @ Ud)
        v.scatter(h)
        v.push(h)

    encoder = mc.VertexFunction(encoder_cell, pull_shape=(E,), scatter_shape=(H,),
                                push_shape=(H,), arity=1, dtype="float64")
    decoder = mc.VertexFunction(decoder_cell, pull_shape=(H,), scatter_shape=(H,),
                                push_shape=(H,), arity=1, dtype="float64")
    source_lengths, target_lengths = [3, 5, 1], [4, 2, 3]
    src = mc.GraphBatch([mc.InputGraph.chain(n) for n in source_lengths])
    tgt = mc.GraphBatch([mc.InputGraph.chain(n) for n in target_lengths])
    X = mc.tensor(rng.standard_normal((src.num_vertices, E)), requires_grad=True)
    # Each decoder step pulls the encoder's last state of its sentence.
    last = src.offsets[1:] - 1
    step_to_sentence = np.repeat(np.arange(len(target_lengths)), target_lengths)
    leaves = [X, We, Ue, Wd, Ud]

    def run(evaluate):
        enc = evaluate(encoder, src, X)
        context = mc.take_rows(enc, last[step_to_sentence])
        dec = evaluate(decoder, tgt, context)
        return (dec * dec).sum()

    run(lambda F, b, p: F(b, pull=p)).backward()
    batched = [_grad(t) for t in leaves]
    for t in leaves:
        t.grad = None
    run(evaluate_per_sample).backward()
    for got, t in zip(batched, leaves):
        assert _relative_error(got, _grad(t)) <= 1e-9


def test_pull_only_and_no_push():
    """A cell without push returns the scattered states; one without gathers is a plain map."""
    W = mc.Parameter(np.random.default_rng(0).standard_normal((E, H)))

    def cell(v):
        v.scatter(mc.tanh(v.pull() @ W))

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), dtype="float64")
    batch = mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph([[]])])
    X = np.random.default_rng(1).standard_normal((batch.num_vertices, E))
    out = F(batch, pull=mc.tensor(X))
    np.testing.assert_allclose(out.numpy(), np.tanh(X @ W.numpy()), rtol=1e-12)


def test_deep_graphs_do_not_recurse():
    """A 10,000-vertex chain and a 5,000-deep tree run forward and backward."""
    W = mc.Parameter(np.full((1, 2), 0.5))
    U = mc.Parameter(np.full((2, 2), 0.3))

    def cell(v):
        h = mc.tanh(v.pull() @ W + (v.gather(0) + v.gather(1)) @ U)
        v.scatter(h)

    F = mc.VertexFunction(cell, pull_shape=(1,), scatter_shape=(2,), arity=2, dtype="float64")
    depth = 5000
    # A caterpillar: spine vertex i has the previous spine vertex and a fresh leaf as children.
    children = [[]]
    for _ in range(depth):
        spine = len(children) - 1
        children.append([])  # the leaf
        children.append([spine, len(children) - 1])
    chain = mc.InputGraph.chain(10_000)
    tree = mc.InputGraph(children)
    assert tree.height() == depth
    for graph in (chain, tree):
        batch = mc.GraphBatch([graph])
        X = mc.tensor(np.ones((batch.num_vertices, 1)), requires_grad=True)
        F(batch, pull=X).sum().backward()
        assert np.isfinite(W.grad.numpy()).all() and np.isfinite(X.grad.numpy()).all()
        assert batch.num_levels == graph.height() + 1
        W.grad = U.grad = None


def test_backward_twice_needs_retain_graph():
    F, params = binary_tree_lstm(E, H, np.random.default_rng(0))
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(4)])
    X = mc.tensor(np.ones((batch.num_vertices, E)))
    loss = F(batch, pull=X).sum()
    loss.backward(retain_graph=True)
    first = params[0].grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(params[0].grad.numpy(), 2 * first)
    with pytest.raises(mc.MinicavsError, match="second time"):
        loss.backward()


def test_buffers_are_reused_across_batches_and_not_shared_between_live_calls():
    F, params = binary_tree_lstm(E, H, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    b1 = mc.GraphBatch([mc.InputGraph.complete_binary(8)])
    b2 = mc.GraphBatch([mc.InputGraph.chain(6)])
    X1 = mc.tensor(rng.standard_normal((b1.num_vertices, E)))
    X2 = mc.tensor(rng.standard_normal((b2.num_vertices, E)))
    alone = [F(b1, pull=X1).sum(), F(b2, pull=X2).sum()]
    grads_alone = []
    for loss in alone:
        loss.backward()
        grads_alone.append(params[1].grad.numpy().copy())
        params[1].grad = None
    # Both calls alive at once, backward in the opposite order: no call may see the other's
    # buffers.
    l1, l2 = F(b1, pull=X1).sum(), F(b2, pull=X2).sum()
    l2.backward()
    g2 = params[1].grad.numpy().copy()
    params[1].grad = None
    l1.backward()
    np.testing.assert_allclose(params[1].grad.numpy(), grads_alone[0], rtol=1e-12)
    np.testing.assert_allclose(g2, grads_alone[1], rtol=1e-12)
    del l1, l2
    pooled = F.executable.pool._free
    assert pooled, "released buffers go back to the pool"


def test_explain_reports_levels_and_ops():
    F, _ = binary_tree_lstm(E, H, np.random.default_rng(0))
    batch = mc.GraphBatch([mc.InputGraph.complete_binary(8), mc.InputGraph.chain(3)])
    X = mc.tensor(np.ones((batch.num_vertices, E)))
    F(batch, pull=X).sum().backward()
    figures = F.explain()
    assert figures["levels"] == 4
    assert figures["vertices_per_level"] == [9, 5, 3, 1]  # 8 + 1 leaves, then 4 + 1, 2 + 1, 1
    assert len(figures["forward_ops_per_level"]) == 4
    assert len(figures["backward_ops_per_level"]) == 4
    assert figures["forward_seconds"] > 0 and figures["backward_seconds"] > 0


def _selected_vs_taken(F, params, batch, X, rows, seed=0):
    """F(..., rows=) against take_rows(F(...), rows): outputs and every gradient."""
    weights = mc.tensor(np.random.default_rng(seed).standard_normal(
        (len(rows),) + tuple(F(batch, pull=X).shape[1:])))
    results = []
    for selected in (True, False):
        for t in [X] + params:
            t.grad = None
        out = F(batch, pull=X, rows=rows) if selected else mc.take_rows(
            F(batch, pull=X), mc.tensor(rows))
        ((out * weights).sum() + (out * out).sum()).backward()
        results.append([out.numpy()] + [_grad(t) for t in [X] + params])
    for k, (got, want) in enumerate(zip(*results)):
        assert np.shape(got) == np.shape(want), k
        assert _relative_error(got, want) <= 1e-12, (k, _relative_error(got, want))


@given(forests(max_graphs=3, max_vertices=7, max_arity=2), st.integers(0, 2**16),
       st.booleans())
def test_rows_of_a_call_equal_those_rows_taken_from_all(graphs, seed, push):
    """``F(batch, pull=X, rows=r)``: the rows ``r`` (any vertices, repeated too) of the
    output, with the gradients of ``take_rows(F(batch, pull=X), r)`` — pushed outputs or the
    scattered states, one kind or several (``by_kind``: leaves and internal vertices)."""
    rng = np.random.default_rng(seed)
    F, params = binary_tree_lstm(E, H, rng, push=push)
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    rows = rng.integers(0, batch.num_vertices, size=int(rng.integers(1, 6)))
    _selected_vs_taken(F, params, batch, X, rows, seed)
    _selected_vs_taken(F, params, batch, X, batch.roots, seed)
    W = mc.Parameter(rng.standard_normal((E, H)))
    kinded = mc.VertexFunction.by_kind(
        {"leaf": lambda v: v.scatter(mc.tanh(v.pull() @ W)),
         "internal": lambda v: v.scatter(mc.tanh(v.pull() @ W + v.gather(0) + v.gather(1)))},
        by="leaf", pull_shape=(E,), scatter_shape=(H,), arity=2, dtype="float64")
    _selected_vs_taken(kinded, [W], batch, X, rows, seed)


def test_rows_of_a_call_are_checked():
    rng = np.random.default_rng(0)
    F, _ = binary_tree_lstm(E, H, rng)
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1]])])
    X = mc.tensor(rng.standard_normal((3, E)))
    with pytest.raises(mc.errors.IndexRangeError, match=r"rows\[1\] = 3 is not a vertex of "
                                                         r"the batch \(it has 3: ids 0\.\.2\)"):
        F(batch, pull=X, rows=[2, 3])
    with pytest.raises(mc.errors.GraphError, match="rows= must be a 1-D array of vertex ids"):
        F(batch, pull=X, rows=np.array([0.0, 1.0]))
    with pytest.raises(mc.errors.GraphError, match="rows= must be a 1-D array of vertex ids"):
        F(batch, pull=X, rows=[[0]])


def test_a_loss_on_some_rows_sums_the_push_gradient_over_those_rows(monkeypatch):
    """``F(batch, pull=X, rows=internal)`` (a loss on the internal vertices, one block of rows
    in level order): the pushed classifier's gradient is zero on the leaves' rows, so its
    weight's product and its bias's sum run on the internal rows only — values and every
    gradient equal to ``take_rows`` of all rows."""
    from minicavs.ops import reduce
    rng = np.random.default_rng(5)
    W = mc.Parameter(rng.standard_normal((E, H)) * 0.5)
    Wo, bo = mc.Parameter(rng.standard_normal((H, 3))), mc.Parameter(rng.standard_normal(3))

    def cell(v):
        h = mc.tanh(v.pull() @ W + v.gather(0) + v.gather(1))
        v.scatter(h)
        v.push(h @ Wo + bo)
    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,), push_shape=(3,), arity=2,
                          dtype="float64")
    graphs = [mc.InputGraph([[], [], [0, 1], [], [2, 3]]), mc.InputGraph([[], [], [0, 1]])]
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    internal = np.flatnonzero(batch.num_children > 0)
    summed = []  # rows of each sum over rows that ran on some rows only
    column_sums = reduce._column_sums
    monkeypatch.setattr(reduce, "_column_sums", lambda xp, x, *rest: (
        summed.append(len(x)), column_sums(xp, x, *rest))[1])
    _selected_vs_taken(F, [W, Wo, bo], batch, X, internal)
    assert summed == [len(internal)]  # bo's gradient: the internal rows only (taken: all)


def test_a_sum_over_each_rows_columns_into_an_embeddings_gradient():
    """∂F's lazy phase sums each row's columns (the gradient of a width-1 embedding broadcast
    across the row) and scatters the sums into the table: a sum over the rows may run on the
    nonzero ones, one over a row's columns feeds the scatter as it is — values and gradients
    equal the per-sample evaluation."""
    rng = np.random.default_rng(7)
    table = mc.Parameter(rng.standard_normal((7, 1)), name="table")
    U = mc.Parameter(rng.standard_normal((2 * H, H)) * 0.3, name="U")

    def cell(v):
        e = mc.broadcast_to(mc.embedding(table, v.pull()), (H,))
        h = mc.tanh(e + mc.concat([v.gather(0), v.gather(1)]) @ U)
        v.scatter(h)
        v.push(h)
    F = mc.VertexFunction(cell, pull_shape=(), pull_dtype="int64", scatter_shape=(H,),
                          push_shape=(H,), arity=2, dtype="float64")
    graphs = [mc.InputGraph([[], [], [0, 1], [], [2, 3]]), mc.InputGraph([[], [], [0, 1]])]
    ids = mc.tensor(rng.integers(0, 7, sum(g.num_vertices for g in graphs)))
    _check_batched_equals_reference(F, [table, U], graphs, X=ids)


def _complete_tree(arity, depth):
    """A complete tree of ``arity`` children a vertex, ``depth`` levels below its root (heap
    order: vertex i's children are arity i + 1, ..., arity i + arity)."""
    n = sum(arity ** d for d in range(depth + 1))
    return mc.InputGraph([[arity * i + k + 1 for k in range(arity)] if arity * i + 1 < n else []
                          for i in range(n)])


def _children_concat_cell(arity, rng, push=True):
    """h = tanh(x W + [h_0, ..., h_k-1] U + b): the concat of each child's whole state (Tree-FC)."""
    W = mc.Parameter(rng.standard_normal((E, H)) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((arity * H, H)) * 0.4, name="U")
    b = mc.Parameter(rng.standard_normal(H) * 0.1, name="b")

    def cell(v):
        h = mc.tanh(v.pull() @ W + mc.concat([v.gather(k) for k in range(arity)]) @ U + b)
        v.scatter(h)
        if push:
            v.push(h * h)

    F = mc.VertexFunction(cell, pull_shape=(E,), scatter_shape=(H,),
                          push_shape=(H,) if push else None, arity=arity, dtype="float64")
    return F, [W, U, b]


@pytest.mark.parametrize("arity", [2, 3])
def test_childrens_states_read_where_they_are_equal_per_sample(arity, monkeypatch):
    """Complete trees of one depth in a batch: each level's children are one block of the
    states' rows, ``arity`` to a parent, so F's concat of them is those rows themselves — no
    gather, no concat runs (explain) — and ∂F's native loop adds their gradients into those rows
    in its gemm, on every level with children — writes them, not cleared before, where the
    caller's gradient reaches none of them (the buffers handed out filled with NaN here), and
    F leaves the leaves' rows of the concat unwritten (no one reads them);
    F, ∂F (pushed outputs, or the states of some rows) equal the per-sample evaluation and
    the same batch with its children gathered."""
    from minicavs.runtime import codegen, memory, native
    fused, written = [], []  # levels whose children's gradients the gemm adds (one a call)
    into_children = native._into_children

    def spy(table, program, part):
        fused.append(into_children(table, program, part))
        written.append(bool((table == codegen.ONTO_CHILDREN).any()))
    monkeypatch.setattr(native, "_into_children", spy)
    left = []  # per native F call: whether the leaves' concat rows were left unwritten
    leave = native._leave_leaf_concat
    monkeypatch.setattr(native, "_leave_leaf_concat", lambda table, program, variants, part: (
        leave(table, program, variants, part), left.append(bool(part.stale_rows))))
    allocate = memory.BufferPool._allocate
    monkeypatch.setattr(memory.BufferPool, "_allocate",
                        lambda *args: allocate(*args) * np.nan)
    rng = np.random.default_rng(arity)
    graphs = [_complete_tree(arity, 2)] * 3
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(rng.standard_normal((batch.num_vertices, E)), requires_grad=True)
    F, params = _children_concat_cell(arity, rng)
    states, state_params = _children_concat_cell(arity, np.random.default_rng(0), push=False)

    def run():
        (F(batch, pull=X) ** 2).sum().backward()
        stats = F.explain()
        ops = (stats["forward_ops_per_level"], stats["backward_ops_per_level"],
               stats["backward_backend"])
        for t in [X] + params:
            t.grad = None
        _check_batched_equals_reference(F, params, graphs, seed=arity)
        _selected_vs_taken(states, state_params, batch, X, batch.roots, arity)
        for p in state_params:
            p.grad = None
        (states(batch, pull=X) ** 2).sum().backward()
        return ops, [p.grad.numpy() for p in state_params]

    in_place, grads = run()
    assert bool(fused and min(fused) == 2) == (in_place[2] == "native"), fused  # (2 levels up)
    assert any(written) == bool(fused), written  # (where the caller's gradient is at roots)
    assert any(left) == bool(fused), left
    fused.clear()
    from minicavs.vertex import graphs as batches
    monkeypatch.setattr(batches.BatchIndices, "children_in_order", lambda self, k: None)
    gathered, want = run()
    assert not fused
    assert in_place[0][1:] == [n - arity - 1 for n in gathered[0][1:]], (in_place, gathered)
    assert in_place[1] == gathered[1]  # (∂F's windows and adds: the gemm's work, counted)
    for got, w in zip(grads, want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-14)


def test_a_whole_step_reading_unwritten_rows_through_a_view_writes_them_first():
    """∂F of the complete-tree cell reads F's concat of the children, whose rows below the
    first with children F's native loop left unwritten (``Part.stale_rows``): its transpose (a
    view) reads nothing and passes the mark on; the parameter gradient's product on the
    nonzero rows keeps to them; a step over all rows through the view clears them first."""
    from dataclasses import replace

    from minicavs.ops import linalg, shape
    from minicavs.runtime.interpreter import run_whole

    rng = np.random.default_rng(3)
    F, params = _children_concat_cell(2, rng, push=False)
    batch = mc.GraphBatch([_complete_tree(2, 2)] * 3)
    (F(batch, pull=mc.tensor(rng.standard_normal((batch.num_vertices, E)))) ** 2).sum() \
        .backward()
    program = F.backward_executable.program
    made = {o.key: ins for ins in program.eager + program.lazy for o in ins.writes}
    product, view = next((ins, made[ins.step.node.inputs[0].key]) for ins in program.lazy
                         if ins.restrict and ins.step.node.inputs[0].key in made)
    assert view.step.node.op is shape.TRANSPOSE and product.step.node.op is linalg.MATMUL
    rows, g = view.step.node.inputs[0], product.step.node.inputs[1]
    n, lo = 12, 5
    concat = rng.standard_normal((n, rows.shape[1]))
    concat[:lo] = np.nan  # (unwritten)
    env = {rows.key: concat, g.key: rng.standard_normal((n, g.shape[1]))}
    ranges, stale = {rows.key: (lo, n)}, {rows.key: (lo, n)}
    want = concat[lo:].T @ env[g.key][lo:]
    run_whole(view, np, env, ranges, None, stale, leave=True)
    assert np.isnan(concat[:lo]).all() and len(stale) == 2  # (the view marked, nothing read)
    run_whole(product, np, env, ranges, None, stale, leave=True)
    np.testing.assert_allclose(env[product.step.node.key], want, rtol=1e-12)
    assert np.isnan(concat[:lo]).all()
    run_whole(replace(product, restrict=False), np, env, ranges, None, stale, leave=True)
    np.testing.assert_allclose(env[product.step.node.key], want, rtol=1e-12)
    assert not concat[:lo].any()


def test_calls_reading_children_in_place_keep_their_buffers_apart():
    """Two live calls whose children are read in place, and one of a batch in no such order
    between them, backward in the opposite order: each equals its call alone."""
    rng = np.random.default_rng(5)
    F, params = _children_concat_cell(2, rng)
    batches = [mc.GraphBatch([mc.InputGraph.complete_binary(8)] * 2),
               mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.complete_binary(2)]),
               mc.GraphBatch([mc.InputGraph.complete_binary(4)] * 3)]
    X = [mc.tensor(rng.standard_normal((b.num_vertices, E))) for b in batches]
    alone = []
    for b, x in zip(batches, X):
        (F(b, pull=x) ** 2).sum().backward()
        alone.append([p.grad.numpy().copy() for p in params])
        for p in params:
            p.grad = None
    losses = [(F(b, pull=x) ** 2).sum() for b, x in zip(batches, X)]
    for loss, want in reversed(list(zip(losses, alone))):
        loss.backward()
        for p, w in zip(params, want):
            np.testing.assert_allclose(p.grad.numpy(), w, rtol=1e-12, atol=1e-14)
            p.grad = None


def test_threads_reading_children_in_place_each_get_their_own_batchs_results():
    """One F called from several threads at once, on batches of complete trees of other sizes
    (other first rows, their children read in place) and on one in no such order: each call's
    outputs and its pulled input's gradient equal that call alone."""
    rng = np.random.default_rng(9)
    F, params = _children_concat_cell(2, rng)
    batches = [mc.GraphBatch([mc.InputGraph.complete_binary(n)] * m)
               for n, m in ((8, 2), (4, 3), (16, 1))]
    batches.append(mc.GraphBatch([mc.InputGraph.chain(3), mc.InputGraph.complete_binary(4)]))
    pulls = [rng.standard_normal((b.num_vertices, E)) for b in batches]

    def call(k):
        x = mc.tensor(pulls[k], requires_grad=True)
        out = F(batches[k], pull=x)
        (out ** 2).sum().backward()
        return out.numpy(), x.grad.numpy()

    alone = [call(k) for k in range(len(batches))]

    def work(k):
        for i in range(12):
            j = (k + i) % len(batches)
            for got, want in zip(call(j), alone[j]):
                assert _relative_error(got, want) <= 1e-9, (j, _relative_error(got, want))

    run_in_threads(work, 4)
