"""Structures grown at run time (minicavs/vertex/growth/): the batched growth equals each
sample grown alone, vertex by vertex — same decisions, outputs and gradients, in float64 — and
the edges (no samples, samples that stop at the root, a stop rule that never fires, bad
decisions) give what a user expects."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.vertex.growth import grow, grow_per_sample, top_down
from minicavs.vertex.growth.frontier import Frontier, SampleStreams

P, H, OUT = 3, 5, 4


def _cell(rng, pull_ids=False, vocab=6):
    """A top-down cell: its state from its pull and its parent's state (v.gather(0))."""
    table = mc.Parameter(rng.standard_normal((vocab, P)) * 0.7, name="table")
    W = mc.Parameter(rng.standard_normal((P, H)) * 0.7, name="W")
    U = mc.Parameter(rng.standard_normal((H, H)) * 0.7, name="U")
    b = mc.Parameter(rng.standard_normal(H) * 0.3, name="b")
    W_out = mc.Parameter(rng.standard_normal((H, OUT)), name="W_out")

    def top_down_cell(v):
        x = mc.reshape(mc.embedding(table, v.pull()), (P,)) if pull_ids else v.pull()
        h = mc.tanh(x @ W + v.gather(0) @ U + b)
        v.scatter(h)
        v.push(h @ W_out)

    F = mc.VertexFunction(top_down_cell, pull_shape=(1,) if pull_ids else (P,),
                          pull_dtype="int64" if pull_ids else None, scatter_shape=(H,),
                          push_shape=(OUT,), arity=1, dtype="float64")
    return F, ([table] if pull_ids else []) + [W, U, b, W_out]


def _decide(rule, max_depth):
    """A batched decision: how many children (0..3) from the pushed outputs, each child
    pulling its parent's first outputs (float pulls) or a chosen id (int pulls)."""
    def decide(frontier):
        if rule == "argmax":
            choice = frontier.argmax()
        elif rule == "sample":
            choice = frontier.sample()
        else:
            choice = 3 * frontier.above(frontier.push[:, 0], 0.0)
        counts = np.where(frontier.depth >= max_depth, 0, choice)
        if frontier.pull.dtype.kind == "i":
            child_pull = np.repeat(choice[:, None], counts, axis=0)
        else:
            child_pull = np.repeat(frontier.push[:, :P], counts, axis=0)
        return counts, child_pull
    return decide


def _loss(out, weights):
    return (out * mc.tensor(weights)).sum() + (out * out).sum()


def _grads(leaves):
    grads = [t.grad.numpy().copy() if t.grad is not None else np.zeros(t.shape) for t in leaves]
    for t in leaves:
        t.grad = None
    return grads


@pytest.mark.usefixtures("cpu_backend")  # F on each frontier: native loop and interpreter
@given(st.integers(1, 6), st.sampled_from(["argmax", "sample", "threshold"]),
       st.booleans(), st.integers(0, 2**16))
def test_batched_growth_equals_per_sample_growth(samples, rule, pull_ids, seed):
    rng = np.random.default_rng(seed)
    F, params = _cell(rng, pull_ids)
    roots = (mc.tensor(rng.integers(0, 6, (samples, 1))) if pull_ids else
             mc.tensor(rng.standard_normal((samples, P)), requires_grad=True))
    decide = _decide(rule, max_depth=3)
    leaves = params + ([] if pull_ids else [roots])

    batched = grow(F, roots, decide, seed=seed)
    reference = grow_per_sample(F, roots, decide, seed=seed)
    for s in range(samples):  # the same decisions
        np.testing.assert_array_equal(batched.parents[s], reference.parents[s])
    np.testing.assert_array_equal(batched.slot, reference.slot)
    np.testing.assert_array_equal(batched.depth, reference.depth)
    np.testing.assert_allclose(batched.pull, reference.pull, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(batched.push, reference.push, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(batched.output.numpy(), reference.output.numpy(), rtol=1e-10,
                               atol=1e-12)

    weights = rng.standard_normal(batched.push.shape)
    _loss(batched.output, weights).backward()
    got = _grads(leaves)
    _loss(reference.output, weights).backward()
    want = _grads(leaves)
    for p, g, w in zip(leaves, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10, err_msg=f"grad of {p.name}")


def test_levels_of_the_structure_found_are_the_growth_steps():
    rng = np.random.default_rng(1)
    F, _ = _cell(rng)
    found = grow(F, rng.standard_normal((4, P)), _decide("argmax", 4))
    batch = found.batch
    assert batch.num_graphs == 4 and batch.num_vertices == found.num_vertices
    np.testing.assert_array_equal(batch.level, found.depth)
    assert found.frontier_sizes == np.bincount(found.depth).tolist()
    # the tree view, top-down: each vertex's children in slot order
    for s in range(4):
        tree = found.tree(s)
        rows = slice(found.offsets[s], found.offsets[s + 1])
        for v in range(tree.num_vertices):
            kids = tree.children(v)
            assert found.slot[rows][kids].tolist() == list(range(len(kids)))


@pytest.mark.usefixtures("cpu_backend")
def test_teacher_forcing_on_a_given_tree_equals_growing_it():
    """F on top_down(trees) (training on known structures) computes what growing the same
    trees computes: a decision that follows the trees reproduces them."""
    rng = np.random.default_rng(2)
    F, params = _cell(rng, pull_ids=True)
    trees = [mc.InputGraph([[], [], [0, 1], [], [2, 3]]), mc.InputGraph([[]]),
             mc.InputGraph([[], [0], [1]])]
    forced = top_down(trees)
    words = np.concatenate([np.arange(g.num_vertices) % 6 for g in trees])
    offsets = np.cumsum([0] + [g.num_vertices for g in trees])
    ids = words[np.concatenate([o + forced.vertex[forced.batch.offsets[s]:
                                                  forced.batch.offsets[s + 1]]
                                for s, o in enumerate(offsets[:-1])])]
    teacher = F(forced.batch, pull=mc.tensor(ids[:, None]))

    batch = forced.batch
    parent = np.concatenate([np.where(p >= 0, p + o, -1) for p, o in
                             zip(map(_parents, batch.graphs), batch.offsets)])

    def follow(frontier):  # the known trees as a decision
        rows = batch.offsets[frontier.sample_of] + frontier.vertex
        children = [np.flatnonzero(parent == r) for r in rows]
        return np.array([len(c) for c in children]), ids[np.concatenate(children)][:, None]

    found = grow(F, ids[forced.batch.offsets[:-1], None], follow)
    for s in range(3):
        np.testing.assert_array_equal(found.parents[s], _parents(forced.batch.graphs[s]))
    np.testing.assert_allclose(found.push, teacher.numpy(), rtol=1e-12, atol=1e-12)
    teacher.sum().backward()
    want = _grads(params)
    found.output.sum().backward()
    for p, g, w in zip(params, _grads(params), want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=p.name)


def _parents(graph):
    """A grown graph's parent array (each vertex's child 0 is its parent; -1 at the root)."""
    parent = np.full(graph.num_vertices, -1)
    has = graph.num_children > 0
    parent[has] = graph.child_ids
    return parent


def test_top_down_renumbers_breadth_first_with_slots_and_depths():
    tree = mc.InputGraph([[], [], [0, 1], [], [3, 2]])  # root 4: children 3, then 2
    forced = top_down([tree])
    assert forced.vertex.tolist() == [4, 3, 2, 0, 1]
    assert forced.slot.tolist() == [0, 0, 1, 0, 1]
    assert forced.depth.tolist() == [0, 1, 1, 2, 2]
    assert _parents(forced.batch.graphs[0]).tolist() == [-1, 0, 0, 2, 2]
    with pytest.raises(mc.GraphError, match="sample 0 is not a tree"):
        top_down([mc.InputGraph([[], [0], [0, 1]])])  # vertex 0 has two parents


def test_a_stop_rule_that_never_fires_meets_max_vertices():
    rng = np.random.default_rng(3)
    F, _ = _cell(rng)

    def always_two(frontier):
        return np.full(len(frontier), 2), np.repeat(frontier.push[:, :P], 2, axis=0)

    with pytest.raises(mc.GraphError, match=r"sample 0 reached max_vertices=10: it has 7 "
                                            r"vertices and decide asks for 8 more.*truncate"):
        grow(F, rng.standard_normal((2, P)), always_two, max_vertices=10)
    cut = grow(F, rng.standard_normal((2, P)), always_two, max_vertices=10,
               on_budget="truncate")
    assert cut.truncated.tolist() == [True, True]
    assert [len(p) for p in cut.parents] == [10, 10]
    # the first ten in growth order are kept: the whole third level, one child of the fourth
    assert cut.frontier_sizes == [2, 4, 8, 6]
    reference = grow_per_sample(F, cut.pull[cut.offsets[:-1]], always_two, max_vertices=10,
                                on_budget="truncate")
    np.testing.assert_allclose(cut.push, reference.push, rtol=1e-10)


@pytest.mark.parametrize("huge", [2**40, 2**63 - 1, 1e30, np.uint64(2**64 - 1)])
def test_an_enormous_child_count_meets_the_budget_at_once(huge):
    """Counts past any budget neither wrap around in int64 nor allocate a row per child asked
    for before the budget is checked (issue 23: terabytes, or a negative count)."""
    num_samples = 2

    def enormous(frontier):  # each root asks for a huge number of children, then none
        return np.where(frontier.depth == 0, huge, 0), None

    def cell(v):  # pulls nothing: no child_pull rows bound what decide may ask for
        h = mc.tanh(v.gather(0) + 1.0)
        v.scatter(h)
        v.push(h)

    nothing_pulled = mc.VertexFunction(cell, scatter_shape=(3,), push_shape=(3,), arity=1,
                                       dtype="float64")
    with pytest.raises(mc.GraphError, match="reached max_vertices=50"):
        grow(nothing_pulled, None, enormous, num_samples=num_samples, max_vertices=50)
    cut = grow(nothing_pulled, None, enormous, num_samples=num_samples, max_vertices=50,
               on_budget="truncate")
    assert [len(p) for p in cut.parents] == [50, 50] and cut.truncated.all()


def test_sampling_at_a_tiny_temperature_is_the_argmax():
    logits = np.array([[0.0, 3.0, 1.0], [-5.0, -7.0, -6.0], [2.0, 2.5, 900.0]])
    frontier = Frontier(logits, logits, None, np.arange(3), np.zeros(3, np.int64),
                        np.zeros(3, np.int64), np.zeros(3, np.int64), SampleStreams(0))
    for temperature in (1e-3, 1e-12, 1e-300, 1e-308):  # (logits / 1e-308 overflow to inf)
        assert frontier.sample(temperature=temperature).tolist() == [1, 0, 2]


def test_frontier_above_takes_one_value_per_row():
    values = np.array([[0.5], [-1.0]])
    frontier = Frontier(values, values, None, np.arange(2), np.zeros(2, np.int64),
                        np.zeros(2, np.int64), np.zeros(2, np.int64), SampleStreams(0))
    assert frontier.above(values).tolist() == [1, 0]
    with pytest.raises(mc.ShapeError, match=r"Frontier.above: values has shape \(2, 2\), "
                                            r"expected \(2,\) or \(2, 1\)"):
        frontier.above(np.ones((2, 2)))


def test_an_empty_batch_grows_nothing():
    rng = np.random.default_rng(4)
    F, _ = _cell(rng)
    found = grow(F, np.zeros((0, P)), _decide("argmax", 3))
    assert found.num_samples == 0 and found.num_vertices == 0 and found.batch is None
    assert found.frontier_sizes == [] and found.parents == []
    assert found.output.shape == (0, OUT)


def test_samples_that_stop_at_the_root():
    rng = np.random.default_rng(5)
    F, params = _cell(rng)
    roots = rng.standard_normal((4, P))

    def only_sample_two_grows(frontier):
        counts = ((frontier.sample_of == 2) & (frontier.depth < 2)).astype(int) * 2
        return counts, np.repeat(frontier.push[:, :P], counts, axis=0)

    found = grow(F, roots, only_sample_two_grows)
    assert [len(p) for p in found.parents] == [1, 1, 7, 1]
    assert found.frontier_sizes == [4, 2, 4]
    # a root's output is F on a vertex with no parent: the per-sample evaluation of F
    alone = mc.evaluate_per_sample(F, mc.GraphBatch([mc.InputGraph([[]])]),
                                   mc.tensor(roots[:1]))
    np.testing.assert_allclose(found.push[0], alone.numpy()[0], rtol=1e-12)

    def nobody_grows(frontier):
        return np.zeros(len(frontier), int), None

    assert grow(F, roots, nobody_grows).frontier_sizes == [4]


def test_reinforce_through_the_structure_found():
    """A loss on generated structures: log-probabilities of the sampled choices times a
    reward; its gradient equals the per-sample growth's."""
    rng = np.random.default_rng(6)
    F, params = _cell(rng, pull_ids=True)
    roots = rng.integers(0, 6, (5, 1))
    results = []
    for how in (grow, grow_per_sample):
        sampled = {}

        def sample_children(frontier):
            choice = frontier.sample()
            sampled.update(zip(zip(frontier.sample_of.tolist(), frontier.vertex.tolist()),
                               choice.tolist()))
            counts = np.where(frontier.depth >= 2, 0, choice % 3)
            return counts, np.repeat(choice[:, None], counts, axis=0)

        found = how(F, roots, sample_children, seed=11)
        vertex = np.arange(found.num_vertices) - found.offsets[found.sample_of]
        choice = np.array([sampled[(s, v)] for s, v in zip(found.sample_of, vertex)])
        reward = np.bincount(found.sample_of, minlength=5)[found.sample_of].astype(float)  # size
        log_p = mc.log_softmax(found.output, axis=-1)
        loss = -(mc.take(log_p, choice[:, None], axis=1)[:, 0] * mc.tensor(reward)).sum()
        loss.backward()
        results.append((found.parents, choice, _grads(params)))
    (parents, choice, got), (ref_parents, ref_choice, want) = results
    for a, b in zip(parents, ref_parents):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(choice, ref_choice)
    assert len(choice) > 5  # some samples grew
    for p, g, w in zip(params, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10, err_msg=p.name)


def test_sampling_is_seeded_per_sample():
    rng = np.random.default_rng(7)
    F, _ = _cell(rng)
    roots = rng.standard_normal((3, P))
    decide = _decide("sample", 4)
    a, b = grow(F, roots, decide, seed=1), grow(F, roots, decide, seed=1)
    assert all((x == y).all() for x, y in zip(a.parents, b.parents))
    # sample 1 grows the same tree alone (its row of the roots, its own stream)
    alone = grow(F, roots[1:2], lambda fr: decide(_renumbered(fr, 1)), seed=1)
    np.testing.assert_array_equal(alone.parents[0], a.parents[1])


def test_a_sample_with_its_own_seed_grows_the_same_tree_at_any_position():
    """seed=[...] (one per sample): a sample's draws follow it, not its position."""
    rng = np.random.default_rng(9)
    F, _ = _cell(rng)
    roots = rng.standard_normal((4, P))
    decide = _decide("sample", 4)
    seeds = [5, 17, 3, 40]
    batch = grow(F, roots, decide, seed=seeds)
    reversed_batch = grow(F, roots[::-1], decide, seed=seeds[::-1])
    reference = grow_per_sample(F, roots, decide, seed=seeds)
    assert len({len(p) for p in batch.parents}) > 1  # the samples grew different trees
    for s in range(4):
        alone = grow(F, roots[s:s + 1], decide, seed=[seeds[s]])
        np.testing.assert_array_equal(alone.parents[0], batch.parents[s])
        np.testing.assert_array_equal(reversed_batch.parents[3 - s], batch.parents[s])
        np.testing.assert_array_equal(reference.parents[s], batch.parents[s])
    for bad, error, text in (([1, 2], mc.ShapeError, "2 per-sample seeds for 4 samples"),
                             ([1, -2, 3, 4], mc.ArgumentError, "seed of sample 1 is -2"),
                             ([1.5, 2, 3, 4], mc.ArgumentError, "one integer per sample"),
                             (-1, mc.ArgumentError, "seed")):
        with pytest.raises(error, match=text):
            grow(F, roots, decide, seed=bad)


def test_grow_keeps_to_the_memory_budget(monkeypatch):
    """A frontier too large for the budget left beside what the growth keeps runs in chunks of
    rows (the same structure and values as unbudgeted); where not one row fits, a clear
    OutOfMemoryError before anything is allocated."""
    from minicavs.vertex.growth import step as growth_step

    rng = np.random.default_rng(12)
    F, _ = _cell(rng)
    roots = rng.standard_normal((24, P))
    decide = _decide("argmax", 3)
    free = grow(F, roots, decide, seed=0)
    forward = F.memory_model.forward
    kept_at_most = sum(len(p) for p in free.parents) * (H + OUT + P) * 8
    chunks = []
    real = growth_step.run_frontier
    monkeypatch.setattr(growth_step, "run_frontier",
                        lambda *a: chunks.append(len(a[3])) or real(*a))
    budget = kept_at_most + forward.at((5, 0, 5, 0))
    mc.set_memory_budget(budget)
    try:
        budgeted = grow(F, roots, decide, seed=0)
        sizes = free.frontier_sizes
        assert sum(chunks) == sum(sizes) and len(chunks) > len(sizes)  # some step was split
        assert max(chunks) < max(sizes)
        assert all(forward.at((c, 0, c, 0)) <= budget for c in chunks)
        for a, b in zip(budgeted.parents, free.parents):
            np.testing.assert_array_equal(a, b)
        with mc.no_grad():  # the growth's own values (with gradients: F re-run, budgeted)
            np.testing.assert_allclose(budgeted.output.numpy(), free.output.numpy(),
                                       rtol=1e-12)
        mc.set_memory_budget(forward.at((0, 0, 0, 0)) + 1)
        with pytest.raises(mc.OutOfMemoryError, match=r"grow: step 0 \(a frontier of 24 "
                                                      r"vertices\).*memory budget"):
            grow(F, roots, decide, seed=0)
    finally:
        mc.set_memory_budget(None)


def _renumbered(frontier, s):
    frontier.sample_of = frontier.sample_of + s
    return frontier


def test_bad_input_gets_clear_errors():
    rng = np.random.default_rng(8)
    F, _ = _cell(rng)
    roots = rng.standard_normal((2, P))
    with pytest.raises(mc.ShapeError, match=r"root_pull has shape \(2, 4\), expected "
                                            r"\(samples, 3\)"):
        grow(F, np.zeros((2, 4)), _decide("argmax", 2))
    with pytest.raises(mc.GraphError, match="must return \\(counts, child_pull\\)"):
        grow(F, roots, lambda fr: fr.argmax())
    with pytest.raises(mc.ShapeError, match=r"counts have shape \(3,\), expected \(2,\)"):
        grow(F, roots, lambda fr: (np.zeros(3, int), None))
    with pytest.raises(mc.GraphError, match="sample 1, vertex 0: decide asked for -1 children"):
        grow(F, roots, lambda fr: (np.array([0, -1]), None))
    with pytest.raises(mc.DTypeError, match="counts must be integers"):
        grow(F, roots, lambda fr: (np.array([0.5, 1.0]), None))
    with pytest.raises(mc.ShapeError, match=r"child_pull has shape \(1, 3\), expected "
                                            r"\(3, 3\)"):
        grow(F, roots, lambda fr: (np.array([1, 2]), np.zeros((1, P))))
    with pytest.raises(mc.GraphError, match="gave no child_pull for 2 children"):
        grow(F, roots, lambda fr: (np.array([1, 1]), None))
    with pytest.raises(mc.ArgumentError, match="on_budget must be 'error' or 'truncate'"):
        grow(F, roots, _decide("argmax", 2), on_budget="stop")
    with pytest.raises(mc.ArgumentError, match="max_vertices"):
        grow(F, roots, _decide("argmax", 2), max_vertices=0)
    with pytest.raises(mc.ArgumentError, match="seed"):
        grow(F, roots, _decide("argmax", 2), seed="x")
    with pytest.raises(mc.NonFiniteError, match="logits of sample 1, vertex 0 are not finite"):
        grow(F, roots, lambda fr: (fr.sample(np.where(fr.sample_of[:, None] == 1, np.nan,
                                                      fr.push)), None))
    with pytest.raises(mc.ArgumentError, match="temperature"):
        grow(F, roots, lambda fr: (fr.sample(temperature=0.0), None))
    with pytest.raises(mc.DTypeError, match="child_pull has dtype float64, but vertex "
                                            "function 'top_down_cell' pulls int64"):
        F_ids, _ = _cell(rng, pull_ids=True)
        grow(F_ids, np.zeros((2, 1), np.int64), lambda fr: (np.ones(2, int), np.zeros((2, 1))))

    def two_slots(v):
        v.scatter(mc.tanh(v.gather(0) + v.gather(1)))

    pair = mc.VertexFunction(two_slots, scatter_shape=(H,), arity=2, dtype="float64")
    with pytest.raises(mc.GraphError, match=r"gathers child slot\(s\) \[1\].*v.gather\(0\)"):
        grow(pair, None, _decide("argmax", 2), num_samples=2)


# --- incremental decoding ------------------------------------------------------------------------

def _greedy_by_rerunning_the_chain(model, batch, max_length):
    """What Seq2Seq.generate did before growth: rerun the decoder over the whole chain decoded
    so far at every step (quadratic), and take the last step's argmax."""
    from minicavs.models.seq2seq import BOS, EOS

    pairs = batch.num_samples
    with mc.no_grad():
        summaries = model._summaries(batch, None)
        outputs = np.zeros((pairs, 0), np.int64)
        for length in range(1, max_length + 1):
            previous = np.concatenate([np.full((pairs, 1), BOS), outputs], axis=1)
            graphs = mc.GraphBatch([mc.InputGraph.chain(length)] * pairs)
            logits = model._decode(summaries, graphs, previous.reshape(-1),
                                   np.repeat(np.arange(pairs), length), None)
            last = logits.numpy().reshape(pairs, length, -1)[:, -1]
            outputs = np.concatenate([outputs, last.argmax(-1)[:, None]], axis=1)
    result = []
    for row in outputs:
        end = np.flatnonzero(row == EOS)
        result.append(row[:end[0]] if end.size else row)
    return result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq2seq_greedy_decoding_is_linear_and_equals_rerunning_the_chain(seed, monkeypatch):
    from minicavs.models import Seq2Seq, reversal_task
    from minicavs.vertex.growth import step as growing

    mc.seed(seed)
    model = Seq2Seq(7, embed_dim=4, hidden=6, dtype="float64")
    pairs = reversal_task(12, vocab_size=7, max_length=5, rng=seed)
    batch = model.prepare(pairs)
    rows_run = []
    run_frontier = growing.run_frontier
    monkeypatch.setattr(growing, "run_frontier",
                        lambda f, xp, pull, parents, *rest:
                        rows_run.append(len(parents)) or run_frontier(f, xp, pull, parents, *rest))
    decoded = model.generate(batch, max_length=9)
    want = _greedy_by_rerunning_the_chain(model, batch, 9)
    assert [d.tolist() for d in decoded] == [w.tolist() for w in want]
    # one decoder row per token emitted (the EOS included), not one per prefix of a chain
    emitted = sum(min(len(d) + 1, 9) for d in decoded)
    assert sum(rows_run) == emitted and len(rows_run) == max(min(len(d) + 1, 9) for d in decoded)


# --- TD-TreeLSTM ---------------------------------------------------------------------------------

def test_td_tree_lstm_teacher_forcing_and_generation():
    from minicavs.data import make_splits
    from minicavs.models import TDTreeLSTM
    from minicavs.vertex import evaluate_per_sample

    splits = make_splits(sizes=(6, 1, 1))
    mc.seed(3)
    model = TDTreeLSTM(len(splits.vocab), embed_dim=4, hidden=6, dtype="float64")
    trees = splits.train[:4]
    batch = model.prepare(trees)
    E, L = model.num_expand, model.num_labels
    # per vertex in the batch's order: the class it must predict and the condition it pulls
    want_targets, want_conditions = [], []
    for t, tree in enumerate(trees):
        parent = {c: (v, k) for v, kids in enumerate(tree.children) for k, c in enumerate(kids)}
        for v in batch.structure.vertex[batch.structure.batch.sample_of == t]:
            kids = tree.children[v]
            want_targets.append(tree.labels[kids[0]] * L + tree.labels[kids[1]] if kids
                                else E + tree.words[v])
            p, k = parent.get(v, (None, -1))
            sibling = tree.labels[tree.children[p][1 - k]] if p is not None else L
            want_conditions.append(model.condition(tree.labels[v], sibling, 1 + k))
    assert batch.targets.tolist() == want_targets
    assert batch.conditions.numpy().ravel().tolist() == want_conditions
    params = model.parameters()
    model.loss(batch).backward()
    got = _grads(params)
    model.loss(batch, run=evaluate_per_sample).backward()
    for p, g, w in zip(params, got, _grads(params)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=p.name)

    # a model that always expands down to the budget, then its generation as Trees
    model.b_out.data[...] = 0
    model.b_out.data[3 * L + 1] = 50.0  # always two children, labelled 3 and 1
    generated, growth = model.generate([0, 3], vocab=splits.vocab, max_vertices=7, greedy=True)
    assert growth.truncated.tolist() == [True, True]
    for tree, root in zip(generated, [0, 3]):  # 7 vertices: a full binary tree, leaves cut
        assert [len(k) for k in tree.children] == [0, 0, 2, 0, 0, 2, 2]
        assert tree.tokens == ["…"] * 4
        assert tree.labels.tolist() == [3, 1, 3, 3, 1, 1, root]
    model.b_out.data[:E] = -50.0  # now every vertex is a leaf: one word per tree
    generated, growth = model.generate([1, 2, 4], vocab=splits.vocab, greedy=True)
    assert [t.num_vertices for t in generated] == [1, 1, 1]
    words = growth.push.argmax(-1) - E
    assert [t.tokens for t in generated] == [[splits.vocab.token(w)] for w in words]
    assert [t.labels.tolist() for t in generated] == [[1], [2], [4]]

    from minicavs.data.tree import DataError, Tree
    unary = Tree([[], [0]], [3, -1], [2, 2])
    with pytest.raises(DataError, match="sample 1, vertex 1: has 1 children"):
        model.prepare([trees[0], unary])


def _sequence_log_p(model, source, tokens, ends_with_eos):
    """log p(tokens [+ EOS] | source) by teacher forcing."""
    from minicavs.models.seq2seq import EOS

    target = np.asarray(list(tokens) + [EOS] * ends_with_eos, np.int64)
    if len(target) == 0:
        return 0.0
    with mc.no_grad():
        logits = model.logits(model.prepare([(source, target)])).numpy().astype(np.float64)
    z = logits - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(log_p[np.arange(len(target)), target].sum())


def test_beam_search_of_width_one_is_greedy_and_a_wide_beam_is_exhaustive():
    import itertools

    from minicavs.models import Seq2Seq, reversal_task
    from minicavs.models.seq2seq import EOS

    mc.seed(4)
    model = Seq2Seq(5, embed_dim=4, hidden=8, dtype="float64")
    train = reversal_task(256, vocab_size=5, max_length=3, rng=5)
    optimizer = mc.nn.Adam(model.parameters(), lr=0.05)
    for step in range(40):  # a little training: hypotheses of different lengths win
        optimizer.zero_grad()
        model.loss(model.prepare(train[step % 8 * 32:][:32])).backward()
        optimizer.step()
    pairs = reversal_task(6, vocab_size=5, max_length=3, rng=4)
    batch = model.prepare(pairs)
    greedy = model.generate(batch, max_length=3)
    narrow = model.beam_search(batch, beam_size=1, max_length=3)
    assert [t.tolist() for t, _ in narrow] == [g.tolist() for g in greedy]

    # every hypothesis: up to 2 tokens then EOS, or 3 tokens without it (85 in all)
    others = [t for t in range(5) if t != EOS]
    hypotheses = [(list(p), True) for n in range(3) for p in itertools.product(others, repeat=n)]
    hypotheses += [(list(p), False) for p in itertools.product(others, repeat=3)]
    wide = model.beam_search(batch, beam_size=100, max_length=3)
    for (source, _), (tokens, score) in zip(pairs, wide):
        scored = [(_sequence_log_p(model, source, h, eos), h) for h, eos in hypotheses]
        best_score, best = max(scored, key=lambda x: x[0])
        assert tokens.tolist() == best and abs(score - best_score) < 1e-9
    assert len({len(tokens) for tokens, _ in wide}) > 1


@pytest.mark.gpu
def test_growth_on_the_gpu_equals_the_cpu():
    rng = np.random.default_rng(9)
    F, params = _cell(rng, pull_ids=True)
    roots = rng.integers(0, 6, (8, 1))
    decide = _decide("sample", 3)
    on_cpu = grow(F, roots, decide, seed=2)
    on_cpu.output.sum().backward()
    want = _grads(params)
    mc.set_device("cuda")
    for p in params:
        p.data = mc.backend.to_device(p.data)
    on_gpu = grow(F, roots, decide, seed=2)
    for a, b in zip(on_gpu.parents, on_cpu.parents):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(mc.backend.to_numpy(on_gpu.push), on_cpu.push, rtol=1e-10)
    on_gpu.output.sum().backward()
    for p, g, w in zip(params, _grads(params), want):
        np.testing.assert_allclose(mc.backend.to_numpy(g), w, rtol=1e-9, atol=1e-12,
                                   err_msg=p.name)
