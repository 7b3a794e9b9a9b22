"""Automatic batching (minicavs/autobatch): autobatched == eager, values and every gradient.

Programs are generated per sample by hypothesis — sequences, binary trees and DAGs of many ops
with shared parameters, data-dependent Python branches (which read a value in the middle of the
batch and so force a partial execution), samples of different sizes — and run once eagerly and
once under each strategy, in float64; everything must agree to 1e-9 relative.
"""

import gc
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import minicavs as mc
from minicavs.autobatch import STRATEGIES

D = 4
RTOL, ATOL = 1e-9, 1e-12
native_recorder = sys.modules["minicavs.autobatch.native"]


@pytest.fixture(scope="module", autouse=True, params=["C recorder", "Python recorder"])
def recorder(request):
    """Every test of this file runs with each recorder: the C one (``autobatch/native.py``,
    where it builds) and the Python reference in ``scope.py``."""
    make = native_recorder.recorder
    if request.param == "C recorder":
        if native_recorder._library() is None:
            pytest.skip(f"the C recorder cannot be built here ({native_recorder.unavailable()});"
                        f" the Python recorder's run covers these tests")
    else:
        native_recorder.recorder = lambda scope, types: None
    yield request.param
    native_recorder.recorder = make


def _params(seed):
    rng = np.random.default_rng(seed)
    return {
        "W1": mc.Parameter(rng.normal(size=(D, D)) * 0.5),
        "W2": mc.Parameter(rng.normal(size=(D, D)) * 0.5),
        "Wc": mc.Parameter(rng.normal(size=(2 * D, D)) * 0.5),
        "b": mc.Parameter(rng.normal(size=(D,)) * 0.1),
        "E": mc.Parameter(rng.normal(size=(7, D))),
        "Wg": mc.Parameter(rng.normal(size=(D, 2 * D)) * 0.5),  # the cells' gates, H = D / 2
        "Ug": mc.Parameter(rng.normal(size=(D // 2, 2 * D)) * 0.5),
        "bg": mc.Parameter(rng.normal(size=(2 * D,)) * 0.1),
    }


def _unary(code, h, p):
    """One of many per-node computations, all on shape (D,)."""
    ops = [
        lambda h: mc.tanh(h @ p["W1"] + p["b"]),
        lambda h: mc.sigmoid(h) * h,
        lambda h: 1.0 - h * 0.5,
        lambda h: mc.relu(h @ p["W2"]) + h,
        lambda h: mc.concat(list(reversed(mc.split(h, 2)))),
        lambda h: mc.sum(h * h) * h * 0.1,
        lambda h: mc.exp(mc.tanh(h)) - mc.log(1.0 + h * h),
        lambda h: mc.maximum(h, h @ p["W1"]),
        lambda h: mc.softmax(h) + mc.reshape(h, (2, 2)).T.reshape((D,)),
        lambda h: h[1:].sum() * p["b"] + h,
        lambda h: mc.lstm_cell(h @ p["Wg"] + p["bg"], h[D // 2:]),  # [h, c] of H = D / 2
        lambda h: mc.lstm_step(mc.tanh(h), h, p["Wg"], p["Ug"], p["bg"]),  # h is a state
        lambda h: mc.lstm_step(mc.linear(h, p["Wg"], p["bg"]), h, p["Ug"]),  # gates first
    ]
    return ops[code % len(ops)](h)


def _combine(a, b, p):
    return mc.tanh(mc.concat([a, b]) @ p["Wc"] + p["b"])


def _sample_loss(sample, p, branch_reads):
    """One sample's loss, written plainly, per sample, with Python control flow."""
    kind, ids, codes, seed, label = sample
    rng = np.random.default_rng(seed)
    xs = [mc.embedding(p["E"], np.array(i)) if j % 2 else mc.tensor(sample_x(seed, j))
          for j, i in enumerate(ids)]
    if kind == "sequence":
        h = mc.tensor(np.zeros(D))
        for j, x in enumerate(xs):
            h = _combine(x, h, p)
            h = _unary(codes[j % len(codes)], h, p)
    elif kind == "tree":
        nodes = list(xs)
        while len(nodes) > 1:
            k = int(rng.integers(len(nodes) - 1))
            merged = _combine(nodes[k], nodes[k + 1], p)
            nodes[k:k + 2] = [_unary(codes[len(nodes) % len(codes)], merged, p)]
        h = nodes[0]
    else:  # a DAG: each node reads two earlier ones, which are often read again
        nodes = list(xs)
        for j, code in enumerate(codes):
            a, b = rng.integers(len(nodes), size=2)
            nodes.append(_unary(code, nodes[a] * nodes[b] + nodes[a], p))
        h = nodes[-1] + nodes[len(nodes) // 2]
    if branch_reads and float(mc.sum(h)) > 0:  # a value read mid-batch: a partial execution
        h = mc.tanh(h @ p["W2"])
    return mc.softmax_cross_entropy(h, np.array(label)) + mc.sum(h * p["b"])


def sample_x(seed, j):
    return np.random.default_rng([seed, j]).normal(size=D)


def _total(losses):
    return mc.sum(mc.stack(losses)) + 0.5 * mc.sum(mc.tanh(losses[0]))


def _run(samples, strategy, branch_reads, seed=0, sum_after=False):
    """The losses and gradients; ``sum_after``: the block ends with the losses, eager code
    adds them up and runs backward (the scope is a record of its tape)."""
    p = _params(seed)
    if strategy is None:
        losses = [_sample_loss(s, p, branch_reads) for s in samples]
        _total(losses).backward()
        values = [l.numpy() for l in losses]
    else:
        with mc.autobatch(strategy) as ab:
            losses = [_sample_loss(s, p, branch_reads) for s in samples]
            if not sum_after:
                _total(losses).backward()
        if sum_after:
            _total(losses).backward()
        values = [l.numpy() for l in losses]
        assert ab.segments, "the block recorded nothing"
    return values, {k: np.zeros(v.shape) if v.grad is None else v.grad.numpy()
                    for k, v in p.items()}


samples_st = st.lists(
    st.tuples(st.sampled_from(["sequence", "tree", "dag"]),
              st.lists(st.integers(0, 6), min_size=1, max_size=5),
              st.lists(st.integers(0, 12), min_size=1, max_size=4),  # _unary's 13 ops
              st.integers(0, 2**31 - 1), st.integers(0, D - 1)),
    min_size=1, max_size=5)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=samples_st, branch_reads=st.booleans(), sum_after=st.booleans())
def test_generated_programs_match_eager(samples, branch_reads, sum_after):
    ref_values, ref_grads = _run(samples, None, branch_reads)
    for strategy in STRATEGIES:
        values, grads = _run(samples, strategy, branch_reads, sum_after=sum_after)
        for v, r in zip(values, ref_values):
            np.testing.assert_allclose(v, r, rtol=RTOL, atol=ATOL, err_msg=strategy)
        for name in ref_grads:
            np.testing.assert_allclose(grads[name], ref_grads[name], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{strategy}: gradient of {name}")


def test_batches_form_and_contiguous_reads_avoid_copies():
    samples = [("sequence", [1, 2, 3, 4], [0], s, 1) for s in range(6)]
    with mc.autobatch("agenda") as ab:
        p = _params(0)
        loss = mc.sum(mc.stack([_sample_loss(s, p, False) for s in samples]))
        loss.backward()
    seg = ab.segments[0]
    # Six equal sentences: every batch holds a multiple of six nodes (a step of each, or two
    # embeddings of each), except the final stack (a concat) and sum.
    odd = [b.sig.op.name for b in seg.plan if b.n % 6]
    assert sorted(odd) == ["concat", "sum"] and len(seg.plan) < seg.stats["nodes"] / 4
    assert seg.stats["copies_avoided"] > seg.stats["copies_made"]
    text = ab.explain()
    assert "batches per signature" in text and "avoided" in text and "backward" in text


def test_plus_strategy_makes_one_product_per_parameter_signature():
    samples = [("sequence", [1, 2, 3, 4, 5], [0], s, 1) for s in range(3)]
    stats = {}
    for strategy in ("agenda", "agenda+"):
        with mc.autobatch(strategy) as ab:
            p = _params(0)
            mc.sum(mc.stack([_sample_loss(s, p, False) for s in samples])).backward()
        stats[strategy] = ab.segments[0].stats
    plus = stats["agenda+"]
    # The recurrent product runs once per step forward, but its W gradient once in all.
    assert plus["plus_products_saved"] >= 4 and plus["plus_copies"] > 0
    # All batches of a signature are one run of slab rows: their cotangents join as a view.
    assert plus["plus_copies_avoided"] > 0
    assert stats["agenda"]["plus_products"] == 0


def test_fast_path_reuses_signatures_and_never_skips_a_promotion():
    rng = np.random.default_rng(3)
    W = mc.Parameter(rng.normal(size=(D, D)))
    x64, x32 = rng.normal(size=D), rng.normal(size=D).astype(np.float32)

    def program():
        h = mc.tensor(x64) @ W
        h = mc.tanh(h @ W) + h  # the same forms again: fast-path hits
        k = mc.sigmoid(mc.tensor(x32) * 2.0)  # float32
        mixed = h + k  # float64 + float32: promotion inserts an astype, never cached
        return mc.sum(mixed * (mc.tanh(mixed @ W) + h))

    with mc.autobatch("agenda+") as ab:
        loss = program()
        loss.backward()
        value = float(loss)
    grad = W.grad.numpy()
    cached = [sig for sig, _ in ab._known.values()]
    assert len(cached) >= 4  # (the add of float64 and float32 is recorded, not cached:)
    assert all(len({a.dtype for a in sig.row_avals if a is not None}) == 1 for sig in cached)
    W.grad = None
    eager = program()
    eager.backward()
    assert value == pytest.approx(float(eager), rel=1e-12)
    np.testing.assert_allclose(grad, W.grad.numpy(), rtol=RTOL, atol=ATOL)


def test_fast_path_takes_data_operands_as_rows_of_their_own():
    """NumPy arrays and plain Tensors of data (a word's features, a label) meet the fast path
    keyed by shape and dtype, each a row of its own: the same values and gradients as eager,
    also where one needs a promotion (float32 data with float64 values: never cached)."""
    rng = np.random.default_rng(4)
    W = mc.Parameter(rng.normal(size=(D, D)))
    table = mc.Parameter(rng.normal(size=(7, D)))
    feats = [rng.normal(size=D) for _ in range(6)]
    labels = [np.array(int(k)) for k in rng.integers(0, D, 6)]

    def program():
        losses = []
        for i, (f, y) in enumerate(zip(feats, labels)):
            x = mc.embedding(table, np.array(i % 7)) * f  # ndarray data, per sample
            h = mc.tanh(x @ W) + mc.tensor(f)  # a plain data Tensor
            h = h * f.astype(np.float32)  # promotion: recorded, not cached
            losses.append(mc.softmax_cross_entropy(h, y))
        return mc.sum(mc.stack(losses))

    with mc.autobatch("agenda+") as ab:
        loss = program()
        loss.backward()
        value = float(loss)
    grads = [W.grad.numpy(), table.grad.numpy()]
    data = ((D,), np.dtype(np.float64).str)  # how the fast path keys a row of data
    assert any(data in key for key in ab._known)  # the data operands took the fast path
    W.grad = table.grad = None
    eager = program()
    eager.backward()
    assert value == pytest.approx(float(eager), rel=1e-12)
    for got, p in zip(grads, (W, table)):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=RTOL, atol=ATOL)


def test_parameter_gradients_are_handed_over_without_aliasing_the_scope_memory():
    """A parameter's gradient is given to ``.grad`` without a copy unless it may be a view of
    the scope's row memory: a parameter used as a row of its own (reshaped: its gradient is
    the cotangent's rows) keeps the first backward's gradient intact through a second
    backward (retain_graph), and an embedding table's scatter-added gradient is the one
    array made for it."""
    rng = np.random.default_rng(5)
    V = mc.Parameter(rng.normal(size=(D,)))
    table = mc.Parameter(rng.normal(size=(6, D)))

    def program():
        rows = [mc.tanh(mc.reshape(V, (1, D)) * float(i + 1)) for i in range(4)]
        rows += [mc.embedding(table, np.array([i % 6])) * V for i in range(5)]
        return mc.sum(mc.concat(rows, axis=0))

    with mc.autobatch("agenda+"):
        loss = program()
        loss.backward(retain_graph=True)
        first_V, first_table = V.grad, table.grad
        kept = first_V.numpy().copy(), first_table.numpy().copy()
        loss.backward()
    np.testing.assert_array_equal(first_V.numpy(), kept[0])  # not written by the 2nd pass
    np.testing.assert_array_equal(first_table.numpy(), kept[1])
    np.testing.assert_allclose(V.grad.numpy(), 2 * kept[0], rtol=1e-12)
    np.testing.assert_allclose(table.grad.numpy(), 2 * kept[1], rtol=1e-12)
    V.grad = table.grad = None
    program().backward()  # eager
    np.testing.assert_allclose(kept[0], V.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(kept[1], table.grad.numpy(), rtol=RTOL, atol=ATOL)



def test_slab_memory_that_cannot_be_had_is_a_clear_error():
    """A segment whose slabs do not fit: OutOfMemoryError with the size, not NumPy's raw
    MemoryError (the free pooled blocks are given back before the retry)."""
    from minicavs.runtime.memory import SLABS
    with pytest.raises(mc.OutOfMemoryError, match=r"mc.autobatch: a forced segment needs "
                                                  r"[0-9.]+ [kMGT]?B .*more than the memory "
                                                  r"budget"):
        SLABS.arrays(np, [((10 ** 7, 10 ** 7), np.float64)])
    mc.set_memory_budget("1M")  # under the one budget of every front-end
    try:
        with pytest.raises(mc.OutOfMemoryError, match=r"needs [0-9.]+ MB .*budget of 1\.0 MB"):
            with mc.autobatch():
                mc.tanh(mc.tensor(np.ones((1000, 1000))))
    finally:
        mc.set_memory_budget(None)


def test_batched_products_run_on_one_pool_of_threads(monkeypatch):
    """The batches' products run as in a call of native loops: large ones on the native team,
    the rest on one BLAS thread — never on OpenBLAS's own pool, which on a busy machine waits
    at its barriers for a thread that is not running (3.6 s a step against 0.125 s measured)."""
    from minicavs.cpu import products, team

    seen = []
    real = products.matmul

    def matmul(a, b, out=None):
        seen.append(team.in_team_products())
        return real(a, b, out)

    monkeypatch.setattr(products, "matmul", matmul)
    rng = np.random.default_rng(3)
    W = mc.Parameter(rng.normal(size=(96, 96)))
    with mc.autobatch("agenda+"):
        loss = mc.sum(mc.stack([mc.sum(mc.tanh(mc.tensor(rng.normal(size=96)) @ W))
                                for _ in range(80)]))
        loss.backward()
    assert seen and all(on == products.team_ready() for on in seen)


def test_recurrent_products_on_packed_weights_match_eager(monkeypatch):
    """An LSTM as wide as the benchmark's (256 per direction): its steps' products have few
    rows and read the recurrent weight (and, backward, its transpose) from panels packed once
    per forward and backward pass (``products.invariant_operands``); values and gradients
    equal eager execution's."""
    from minicavs.cpu import calibrate, products
    from minicavs.models.plain import BiLSTMTagger

    monkeypatch.setenv(calibrate.ENVIRONMENT, "own")  # the panels wherever they apply
    packed = []
    real = products._Panels.run

    def run(panels, a, out=None):
        done = real(panels, a, out)
        packed.append(done is not None)
        return done

    monkeypatch.setattr(products._Panels, "run", run)
    rng = np.random.default_rng(11)
    words = [f"w{i}" for i in range(12)]
    sentences = [[(words[j], "N" if j % 2 else "V") for j in rng.integers(0, 12, size=n)]
                 for n in (5, 3, 4, 6, 2, 5)]
    model = BiLSTMTagger([w for s in sentences for w, _ in s], ["N", "V"], embed=16,
                         hidden=256, mlp=8, dtype=np.float64)
    eager = mc.sum(mc.stack([model.loss(s) for s in sentences]))
    eager.backward()
    reference = [p.grad.numpy().copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    with mc.autobatch("agenda+"):
        loss = mc.sum(mc.stack([model.loss(s) for s in sentences]))
        loss.backward()
    assert float(loss) == pytest.approx(float(eager), rel=RTOL)
    for p, expect in zip(model.parameters(), reference):
        np.testing.assert_allclose(p.grad.numpy(), expect, rtol=RTOL, atol=1e-12)
    assert any(packed) == products.team_ready()  # (one core: NumPy's products throughout)


def test_the_recorders_caches_stop_growing_after_the_first_steps():
    """A training loop opens a scope per mini-batch: the caches of view forms, of signatures'
    shapes and of learned signatures fill on the first steps and then stay the same size
    (they grew by every step, about 30 entries a step of this tagger, while a scope's shapes
    were keyed by the identity of objects made afresh in each scope; interned output shapes
    and signatures carried from scope to scope each stop it)."""
    views = sys.modules["minicavs.autobatch.views"]
    signature = sys.modules["minicavs.autobatch.signature"]
    scope = sys.modules["minicavs.autobatch.scope"]
    model, samples, loss_of = _tiny_tagger(True)
    ids = {id(p) for p in model.parameters()}

    def sizes(steps):
        for _ in range(steps):
            with mc.autobatch("agenda+"):
                mc.sum(mc.stack([loss_of(s) for s in samples])).backward()
        # (learned signatures: this model's; earlier tests' leave as their models are freed)
        mine = sum(any(part in ids for part in key if type(part) is int)
                   for key in scope._LEARNED)
        return len(views._BY_ID), len(views.BY_CODE), len(signature._AVALS), mine

    first = sizes(2)
    assert sizes(10) == first


def test_a_parameter_resized_between_steps_is_a_new_form():
    """A signature learned in one scope is not reused for a parameter whose shape or dtype
    changed since (a vocabulary grown, a layer widened): the next step equals eager."""
    rng = np.random.default_rng(4)
    W = mc.Parameter(rng.normal(size=(3, 4)))
    xs = [rng.normal(size=3) for _ in range(3)]

    def step():
        W.grad = None
        with mc.autobatch("agenda+"):
            loss = mc.sum(mc.stack([mc.sum(mc.tanh(mc.tensor(x) @ W)) for x in xs]))
            loss.backward()
        return float(loss), W.grad.numpy()

    step()
    for data in (rng.normal(size=(3, 6)), rng.normal(size=(3, 6)).astype(np.float32)):
        W.data = data
        got, grad = step()
        W.grad = None
        eager = mc.sum(mc.stack([mc.sum(mc.tanh(mc.tensor(x.astype(data.dtype)) @ W))
                                 for x in xs]))
        eager.backward()
        assert got == pytest.approx(float(eager), rel=1e-6)
        np.testing.assert_allclose(grad, W.grad.numpy(), rtol=1e-5)


def test_learned_signatures_do_not_keep_a_model_alive():
    """Signatures learned in one scope serve the next (the same forms every mini-batch), but
    they hold the parameters weakly: a model dropped by the user is collected, and its
    signatures leave the cache with it."""
    import weakref

    scope = sys.modules["minicavs.autobatch.scope"]
    model, samples, loss_of = _tiny_tagger(False)
    with mc.autobatch("agenda+"):
        mc.sum(mc.stack([loss_of(s) for s in samples])).backward()
    ids = {id(p) for p in model.parameters()}

    def names_the_model(key):
        return any(part in ids for part in key if type(part) is int)

    assert any(names_the_model(k) for k in scope._LEARNED)
    alive = weakref.ref(model.W1)
    del model, loss_of
    gc.collect()
    assert alive() is None
    assert not any(names_the_model(k) for k in scope._LEARNED)


def test_slab_memory_is_reused_across_steps_but_never_under_a_live_value():
    """Every step's slabs come from the blocks of earlier steps (no fresh memory, no page
    faults), but a block is handed out again only when no value of it is alive: what a user
    kept from step 1 — the lazy tensor, a row read with ``numpy()`` — reads the same after
    many more steps over other data."""
    from minicavs.runtime.memory import SLABS as memory
    gc.collect()  # (earlier tests' scopes in reference cycles hold blocks until collected)
    rng = np.random.default_rng(8)
    W = mc.Parameter(rng.normal(size=(D, D)))

    def step(scale):
        with mc.autobatch("agenda+"):
            hs = [mc.tanh(mc.tensor(np.full(D, scale * (i + 1))) @ W) for i in range(5)]
            loss = mc.sum(mc.stack(hs))
            loss.backward()
        return hs, float(loss)

    memory.release()
    kept, _ = step(0.1)
    row = kept[2].numpy()
    expected = [h.numpy().copy() for h in kept]
    used = set()  # the pool's blocks the later steps' values lie in
    for k in range(8):
        hs, _ = step(float(k + 2))
        address = hs[0].numpy().__array_interface__["data"][0]
        used.update(id(b) for b in memory.blocks
                    if b.ctypes.data <= address < b.ctypes.data + b.nbytes)
        del hs
    for h, want in zip(kept, expected):
        np.testing.assert_array_equal(h.numpy(), want)
    np.testing.assert_array_equal(row, expected[2])
    assert 1 <= len(used) <= 2  # pooled, and the later steps reuse a block (not 8 fresh)
    assert len(memory.blocks) <= 4
    del kept, row, h
    memory.release()
    assert memory.blocks == []

@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_agenda_loop_in_c_forms_the_batches_of_its_numpy_reference(data):
    """schedule.batches_by_agenda and schedule.in_reader_order run their loops in C where
    native code runs: the same batches, node for node, in the same order, as the NumPy loops
    (ties between signatures included)."""
    from minicavs.autobatch import schedule
    from minicavs.cpu import build

    if build.unavailable() is not None:
        pytest.skip(f"native code is off here ({build.unavailable()}): no C loop to compare")
    n = data.draw(st.integers(1, 40))
    num_sigs = data.draw(st.integers(1, 5))
    sig = np.array(data.draw(st.lists(st.integers(0, num_sigs - 1), min_size=n, max_size=n)))
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                               max_size=3 * n))
    edges = [(a, b) for a, b in pairs if a < b]  # a DAG: edges go to later nodes
    src = np.array([a for a, _ in edges], dtype=np.int64)
    dst = np.array([b for _, b in edges], dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    for a, b in sorted(edges, key=lambda e: e[1]):
        depth[b] = max(depth[b], depth[a] + 1)
    got = schedule.batches_by_agenda(sig, depth, src, dst, num_sigs, native=True)
    want = schedule.batches_by_agenda(sig, depth, src, dst, num_sigs, native=False)
    assert [b.tolist() for b in got] == [b.tolist() for b in want]
    # and the reader order that follows, in C and in NumPy, node for node (repeated edges,
    # nodes read by several batches or none)
    got = schedule.in_reader_order([b.copy() for b in want], src, dst, n, native=True)
    want = schedule.in_reader_order(want, src, dst, n, native=False)
    assert [b.tolist() for b in got] == [b.tolist() for b in want]


def test_value_read_mid_block_runs_a_partial_execution():
    p = _params(1)
    with mc.autobatch("depth+") as ab:
        h = mc.tanh(mc.tensor(np.ones(D)) @ p["W1"])
        first = float(mc.sum(h))  # forces the pending nodes
        g = mc.sum(mc.sigmoid(h @ p["W2"]))
        g.backward()
    assert len(ab.segments) == 2
    with_eager = mc.tanh(mc.tensor(np.ones(D)) @ p["W1"])
    assert first == pytest.approx(float(mc.sum(with_eager)), rel=1e-12)
    W1 = p["W1"].grad.numpy()
    p["W1"].grad = p["W2"].grad = None
    mc.sum(mc.sigmoid(with_eager @ p["W2"])).backward()
    np.testing.assert_allclose(W1, p["W1"].grad.numpy(), rtol=RTOL, atol=ATOL)


def test_slices_of_the_last_axis_are_views_not_nodes():
    """split/slice_axis of a pending value's last axis records no node: the readers bind the
    base's columns, and its gradient goes back into them. Read in place, sliced again,
    read after a forced execution (as data), and as the value backward() starts from."""
    p = _params(4)

    def program(read_mid_block):
        state = mc.tanh(mc.tensor(np.linspace(-1, 1, D)) @ p["W1"])
        h, c = mc.split(state, 2)  # two views
        first, second = mc.split(c, 2)  # views of a view: columns 2 and 3
        mixed = mc.concat([first * 2.0, h, second])  # (D,) again
        if read_mid_block:
            assert float(mc.sum(h)) == pytest.approx(float(np.sum(state.numpy()[:D // 2])))
        out = mc.sigmoid(mixed @ p["W2"])
        return mc.sum(out[1:]) + mc.sum(h * c)

    for read_mid_block in (False, True):
        for t in p.values():
            t.grad = None
        eager = program(read_mid_block)
        eager.backward()
        reference = {k: t.grad.numpy().copy() for k, t in p.items() if t.grad is not None}
        for t in p.values():
            t.grad = None
        with mc.autobatch("agenda+") as ab:
            loss = program(read_mid_block)
            loss.backward()
        assert float(loss) == pytest.approx(float(eager), rel=RTOL)
        assert sum(seg.stats["views"] for seg in ab.segments) >= 4
        for k, g in reference.items():
            np.testing.assert_allclose(p[k].grad.numpy(), g, rtol=RTOL, atol=ATOL, err_msg=k)
    assert "views: " in ab.explain()

    with mc.autobatch("depth") as ab:  # backward() from a view seeds its base's columns
        state = mc.tanh(mc.tensor(np.ones(D)) @ p["W1"])
        half = mc.split(state, 2)[1]
        p["W1"].grad = None
        half.backward(np.arange(D // 2, dtype=float))
    with_eager = mc.tanh(mc.tensor(np.ones(D)) @ p["W1"])
    got = p["W1"].grad.numpy().copy()
    p["W1"].grad = None
    mc.split(with_eager, 2)[1].backward(mc.tensor(np.arange(D // 2, dtype=float)))
    np.testing.assert_allclose(got, p["W1"].grad.numpy(), rtol=RTOL, atol=ATOL)
    assert ab.segments[0].stats["nodes"] == 2  # the product and the tanh; the slice is a view

    def chain(x):  # a parameter's '+' gradient over the columns a view reads, step by step
        state = mc.tanh(x @ p["W1"])
        for _ in range(3):
            state = mc.tanh(mc.split(mc.split(state, 2)[1] @ p["Ug"], 2)[0])
        return mc.sum(state * state)

    xs = [mc.tensor(np.full(D, v)) for v in (0.5, -1.0)]
    p["Ug"].grad = None
    mc.sum(mc.stack([chain(x) for x in xs])).backward()
    reference = p["Ug"].grad.numpy().copy()
    p["Ug"].grad = None
    with mc.autobatch("agenda+") as ab:
        mc.sum(mc.stack([chain(x) for x in xs])).backward()
    np.testing.assert_allclose(p["Ug"].grad.numpy(), reference, rtol=RTOL, atol=ATOL)
    assert ab.segments[0].stats["plus_copies_avoided"] >= 1  # the views' rows, one run

    def alternating(x):  # one signature read through two views of consecutive rows
        state = mc.tanh(x @ p["W1"])
        for step in range(4):
            state = mc.tanh(mc.split(mc.split(state, 2)[step % 2] @ p["Ug"], 2)[0])
        return mc.sum(state)

    p["Ug"].grad = None
    alternating(xs[0]).backward()
    reference = p["Ug"].grad.numpy().copy()
    p["Ug"].grad = None
    with mc.autobatch("agenda+"):
        alternating(xs[0]).backward()
    np.testing.assert_allclose(p["Ug"].grad.numpy(), reference, rtol=RTOL, atol=ATOL)


def test_lazy_values_know_their_shape_and_force_on_print_and_exit():
    p = _params(2)
    with mc.autobatch("agenda") as ab:
        h = mc.tensor(np.ones(D)) @ p["W1"]
        assert h.shape == (D,) and h.dtype == np.float64
        assert not ab.segments  # knowing the shape needed no execution
        text = repr(h)  # printing forces
        assert len(ab.segments) == 1 and "lazy tensor" in text
        k = mc.tanh(h)
    assert len(ab.segments) == 2  # leaving the block forced the rest
    np.testing.assert_allclose(k.numpy(), np.tanh(np.ones(D) @ p["W1"].numpy()), rtol=RTOL)


def test_errors_name_the_problem():
    with pytest.raises(mc.ArgumentError, match="unknown strategy 'fastest'"):
        mc.autobatch("fastest")
    p = _params(3)
    with mc.autobatch("agenda"):
        with pytest.raises(mc.MinicavsError, match="cannot be nested"):
            with mc.autobatch("depth"):
                pass
    with mc.autobatch("agenda"):
        loss = mc.sum(mc.tanh(mc.tensor(np.ones(D)) @ p["W1"]))
        loss.backward()
        with pytest.raises(mc.MinicavsError, match="a second time"):
            loss.backward()
    with mc.autobatch("agenda"):
        with pytest.raises(mc.ShapeError, match="matmul"):
            mc.tensor(np.ones(D + 1)) @ p["W1"]


def test_no_grad_inside_the_block_stops_gradients():
    p = _params(4)
    with mc.autobatch("agenda+"):
        with mc.no_grad():
            frozen = mc.tanh(mc.tensor(np.ones(D)) @ p["W1"])
        loss = mc.sum(frozen @ p["W2"])
        loss.backward()
    assert p["W1"].grad is None
    np.testing.assert_allclose(p["W2"].grad.numpy(),
                               np.outer(np.tanh(np.ones(D) @ p["W1"].numpy()), np.ones(D)),
                               rtol=RTOL)


# --- the plain models, autobatched == eager ------------------------------------------------------

def test_add_n_sums_lists_of_any_length_in_a_few_batches():
    rng = np.random.default_rng(4)
    W = mc.Parameter(rng.standard_normal((3, 2)))
    lengths = [1, 2, 3, 5, 8, 13, 7]  # seven lengths: sum(stack) makes a signature of each
    xs = [rng.standard_normal((n, 3)) for n in lengths]

    def total(sum_of):
        return sum_of([sum_of([mc.sum(mc.tanh(mc.tensor(row) @ W)) for row in x]) for x in xs])

    add_n, stacked = mc.add_n, (lambda ys: mc.sum(mc.stack(ys)))
    eager = total(add_n)
    eager.backward()
    want = W.grad.numpy().copy()
    assert float(eager) == pytest.approx(sum(float(np.tanh(x @ W.numpy()).sum()) for x in xs))
    batches = {}
    for strategy in STRATEGIES:
        for name, sum_of in (("add_n", add_n), ("stack", stacked)):
            W.grad = None
            with mc.autobatch(strategy) as ab:
                loss = total(sum_of)
                loss.backward()
            assert float(loss) == pytest.approx(float(eager), rel=RTOL), (strategy, name)
            np.testing.assert_allclose(W.grad.numpy(), want, rtol=RTOL, atol=ATOL)
            batches[strategy, name] = ab.segments[0].stats["batches"]
    for strategy in ("depth", "agenda", "agenda+"):
        # The adds are one signature, run level by level: ceil(log2 13) + ceil(log2 7) levels
        # at most beside the 3 batches of the rows; a stack and a sum per distinct length.
        assert batches[strategy, "add_n"] <= 3 + 4 + 3 < batches[strategy, "stack"], strategy


def test_add_n_of_one_tensor_is_that_tensor_and_of_none_an_error():
    x = mc.tensor(np.ones(3))
    assert mc.add_n([x]) is x
    with pytest.raises(mc.ArgumentError, match="add_n: needs at least one tensor"):
        mc.add_n([])
    with pytest.raises(mc.ArgumentError, match=r"add_n: takes a list of tensors, got one of "
                                               r"shape \(3,\); .* use mc.sum"):
        mc.add_n(x)


def _tiny_tagger(char_lstm, hoist=False):
    from minicavs.models.plain import BiLSTMTagger
    sentences = [[("the", "DET"), ("cat", "NOUN"), ("sat", "VERB")],
                 [("a", "DET"), ("dog", "NOUN")],
                 [("the", "DET"), ("zebra", "NOUN"), ("ran", "VERB"), ("off", "ADP")]]
    words = [w for s in sentences for w, _ in s] + ["the", "the"]
    model = BiLSTMTagger(words, [t for s in sentences for _, t in s], embed=6, hidden=5,
                         mlp=4, char_embed=3, rare=2, char_lstm=char_lstm, dtype=np.float64,
                         hoist=hoist)
    return model, sentences, model.loss


def test_the_char_tagger_gives_an_empty_word_its_lstms_initial_state():
    """A word with no characters (an empty token in a data file): each character LSTM's state
    after no input is its initial one, so its vector is zeros — eager and autobatched alike,
    not an IndexError."""
    model, sentences, loss = _tiny_tagger(True)
    assert np.array_equal(model.word_vector("").numpy(), np.zeros(6))
    sentence = [("the", "DET"), ("", "NOUN")]
    eager = float(loss(sentence).numpy())
    with mc.autobatch("agenda+"):
        batched = loss(sentence)
        batched.backward()
    np.testing.assert_allclose(float(batched.numpy()), eager, rtol=1e-12)


def _tiny_tree_lstm():
    from minicavs.data.tree import Tree
    from minicavs.models.plain import PlainTreeLSTM
    trees = [Tree([[], [], [0, 1]], [1, 2, -1], [-1, -1, 3]),
             Tree([[], [], [0, 1], [], [2, 3]], [0, 3, -1, 4, -1], [-1, -1, -1, -1, 1]),
             Tree([[]], [2], [4])]
    model = PlainTreeLSTM(5, embed=4, hidden=3, dtype=np.float64)
    return model, trees, model.loss


@pytest.mark.parametrize("make", [lambda: _tiny_tagger(False), lambda: _tiny_tagger(True),
                                  lambda: _tiny_tagger(True, hoist=True), _tiny_tree_lstm],
                         ids=["tagger", "tagger-char", "tagger-char-hoisted", "tree-lstm"])
def test_plain_models_match_eager(make):
    model, samples, loss_of = make()
    eager = mc.sum(mc.stack([loss_of(s) for s in samples]))
    eager.backward()
    reference = [p.grad.numpy().copy() for p in model.parameters()]
    assert any(np.abs(g).sum() > 0 for g in reference)
    for strategy in STRATEGIES:
        for p in model.parameters():
            p.grad = None
        with mc.autobatch(strategy):
            loss = mc.sum(mc.stack([loss_of(s) for s in samples]))
            loss.backward()
        assert float(loss) == pytest.approx(float(eager), rel=RTOL)
        for p, ref in zip(model.parameters(), reference):
            got = np.zeros_like(ref) if p.grad is None else p.grad.numpy()
            np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=strategy)



def test_the_cells_gradients_reach_the_shared_product_as_one_view(monkeypatch):
    """Under '+', each batch of an LSTM step writes its cell's gradient into its rows of one
    block per signature, so the product for the shared weights reads every batch's gate
    gradients as one view, not a copy (the same gradients as the copy: compared here)."""
    runs = {}
    for blocks in (True, False):
        if not blocks:
            monkeypatch.setattr(sys.modules["minicavs.autobatch.segment"].Segment,
                                "_handed_blocks", lambda self: {})  # (each batch's own array)
        model, samples, loss_of = _tiny_tagger(True)
        with mc.autobatch("agenda+") as ab:
            mc.sum(mc.stack([loss_of(s) for s in samples])).backward()
        runs[blocks] = (ab.segments[0].stats, [p.grad.numpy() for p in model.parameters()])
    (with_blocks, grads), (copying, reference) = runs[True], runs[False]
    assert with_blocks["plus_copies"] < copying["plus_copies"]
    assert with_blocks["plus_copies_avoided"] > copying["plus_copies_avoided"]
    for got, want in zip(grads, reference):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)

def test_autobatch_example_trains_and_reports_accuracy(tmp_path, capsys):
    import importlib.util
    import pathlib
    lines = ["The|DET cat|NOUN sat|VERB .|PUNCT", "A|DET dog|NOUN ran|VERB", "Dogs|NOUN run|VERB"]
    for name in ("dev", "test"):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines * 4) + "\n")
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "autobatch.py"
    spec = importlib.util.spec_from_file_location("example_autobatch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for task in ("tagger", "tagger-char"):
        result = module.main(["--task", task, "--data", str(tmp_path), "--epochs", "2",
                              "--batch-size", "4", "--hidden", "6", "--embed-dim", "4",
                              "--lr", "0.05", "--no-progress", "--strategy", "depth+"])
        assert 0.0 <= result["accuracy"] <= 1.0 and result["per_second"] > 0
        assert "held-out tagging accuracy" in capsys.readouterr().out.splitlines()[-1]
