"""Vertex kinds and recursive definitions (kinds.py, recursive.py).

The batched runs are compared, in float64 on hypothesis forests (trees, n-ary trees, chains,
DAGs with shared children), with two independent definitions of the same model: the
per-sample eager reference (``evaluate_per_sample``) and a single hand-written cell that
computes every branch and picks one per vertex with ``mc.where`` (masked work).
"""

import dataclasses
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.vertex import evaluate_per_sample
from graph_strategies import forests
from threads import run_in_threads
from vertex_cells import recursive_tree_lstm

E, H, C, ARITY = 3, 4, 2, 3


def _params(seed):
    rng = np.random.default_rng(seed)
    shapes = {"W": (E, H), "W_leaf": (E, H), "b": (H,), "b_leaf": (H,), "W_out": (H, C),
              **{f"U{k}": (H, H) for k in range(ARITY)}}
    return {name: mc.Parameter(rng.normal(scale=0.7, size=shape), name=name)
            for name, shape in shapes.items()}


def _recursive(p, push=True, options=None):
    """A leaf: tanh(x W_leaf + b_leaf); a vertex with children c_k:
    tanh(x W + Σ_k state(c_k) U_k + b). Every vertex pushes h W_out (if ``push``)."""

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), push_shape=(C,) if push else None,
                  arity=ARITY, dtype="float64", options=options)
    def model(node):
        x = node.pull()
        if node.is_leaf:
            h = mc.tanh(x @ p["W_leaf"] + p["b_leaf"])
        else:
            total = x @ p["W"] + p["b"]
            for k, child in enumerate(node.children):
                total = total + model(child) @ p[f"U{k}"]
            h = mc.tanh(total)
        if push:
            node.push(h @ p["W_out"])
        return h

    return model


def _masked(p, push=True):
    """The same model as one cell: both branches for every vertex, chosen with mc.where from a
    leaf flag pulled as the last column."""

    def cell(v):
        pulled = v.pull()
        x, is_leaf = pulled[:E], pulled[E:]
        leaf = mc.tanh(x @ p["W_leaf"] + p["b_leaf"])
        total = x @ p["W"] + p["b"]
        for k in range(ARITY):
            total = total + v.gather(k) @ p[f"U{k}"]
        h = mc.where(is_leaf > 0.5, leaf, mc.tanh(total))
        v.scatter(h)
        if push:
            v.push(h @ p["W_out"])

    return mc.VertexFunction(cell, pull_shape=(E + 1,), scatter_shape=(H,),
                             push_shape=(C,) if push else None, arity=ARITY, dtype="float64")


def _loss_and_grads(run, params, X, target):
    for t in list(params) + [X]:
        t.grad = None
    out = run(X)
    loss = mc.sum(out * target)
    loss.backward()
    return out.numpy(), [t.grad.numpy().copy() if t.grad is not None else None
                         for t in list(params) + [X]]


def _assert_same(a, b):
    (out_a, grads_a), (out_b, grads_b) = a, b
    np.testing.assert_allclose(out_a, out_b, rtol=1e-9, atol=1e-10)
    for ga, gb in zip(grads_a, grads_b):
        if ga is None or gb is None:  # a parameter no vertex of this batch uses
            assert ga is None or not ga.any()
            assert gb is None or not gb.any()
        else:
            np.testing.assert_allclose(ga, gb, rtol=1e-9, atol=1e-10)


SWITCHES = [f.name for f in dataclasses.fields(mc.vertex.Options)]


# The backends a kinded call may report: the native loop (the cpu_backend fixture's "native"
# case), the interpreter when the fixture asks for it, nothing for a kind without levels.
RAN = ("native", "interpreter (interpreter_only() is active)", "none (no per-level instructions)")


@pytest.mark.usefixtures("cpu_backend")  # every kind through the one driver, on both backends
@given(forests(max_arity=ARITY, max_graphs=6), st.integers(0, 2**16),
       st.fixed_dictionaries({name: st.booleans() for name in SWITCHES}), st.booleans())
def test_recursive_equals_masked_cell_and_eager_reference(graphs, seed, options, push):
    """Every kind's programs, with any pass switched off, give the reference's values and
    gradients; returning states (no push) sends the caller's gradient in through them."""
    p = _params(seed)
    params = list(p.values())
    batch = mc.GraphBatch(graphs)
    rng = np.random.default_rng(seed + 1)
    X = mc.tensor(rng.normal(size=(batch.num_vertices, E)), requires_grad=True)
    target = rng.normal(size=(batch.num_vertices, C if push else H))
    model, masked = _recursive(p, push, options), _masked(p, push)
    flag = (batch.num_children == 0).astype(np.float64)[:, None]

    batched = _loss_and_grads(lambda x: model(batch, pull=x), params, X, target)
    eager = _loss_and_grads(lambda x: evaluate_per_sample(model, batch, pull=x), params, X,
                            target)
    hand = _loss_and_grads(lambda x: masked(batch, pull=mc.concat([x, mc.tensor(flag)])),
                           params, X, target)
    _assert_same(batched, eager)
    _assert_same(batched, hand)
    # one kind per number of children that occurs, each on its own rows
    kinds = model.explain()["kinds"]
    assert sum(k["vertices"] for k in kinds.values()) == batch.num_vertices
    assert set(kinds) == {"leaf" if a == 0 else f"arity {a}"
                          for a in set(batch.num_children.tolist())}
    if not options["lazy_batching"]:  # (per-level parameter sums stay on the interpreter)
        return
    for kind in kinds.values():
        assert kind["forward_backend"] in RAN and kind["backward_backend"] in RAN, kind


@pytest.mark.usefixtures("cpu_backend")
@given(forests(max_arity=ARITY, max_graphs=5), st.integers(0, 2**16), st.booleans(),
       st.sampled_from(["internal", "leaves", "any"]))
def test_rows_of_a_recursive_call_equal_those_rows_taken_from_all(graphs, seed, push, which):
    """``model(batch, pull=X, rows=r)`` against ``take_rows(model(batch, pull=X), r)``: values
    and every gradient, where ``r`` holds only internal vertices (the leaf kind is asked for
    none of its rows: its pushed output's gradient is zero, and ∂F skips its products), only
    leaves, or any vertices, repeated too."""
    p = _params(seed)
    batch = mc.GraphBatch(graphs)
    rng = np.random.default_rng(seed + 1)
    X = mc.tensor(rng.normal(size=(batch.num_vertices, E)), requires_grad=True)
    pool = {"internal": np.flatnonzero(batch.num_children > 0),
            "leaves": np.flatnonzero(batch.num_children == 0),
            "any": np.arange(batch.num_vertices)}[which]
    if not len(pool):
        pool = np.arange(batch.num_vertices)
    rows = rng.choice(pool, size=int(rng.integers(1, 6)))
    model = _recursive(p, push)
    target = rng.normal(size=(len(rows), C if push else H))
    selected = _loss_and_grads(lambda x: model(batch, pull=x, rows=rows), list(p.values()), X,
                               target)
    taken = _loss_and_grads(lambda x: mc.take_rows(model(batch, pull=x), mc.tensor(rows)),
                            list(p.values()), X, target)
    _assert_same(selected, taken)


def test_a_recursive_call_on_a_child_takes_no_rows():
    p = _params(0)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), arity=ARITY, dtype="float64")
    def model(node):
        h = mc.tanh(node.pull() @ p["W_leaf"])
        for child in node.children:
            h = h + model(child, rows=[0])
        return h

    batch = mc.GraphBatch([mc.InputGraph([[], [0]])])
    with pytest.raises(mc.errors.GraphError, match="a call on a child takes no pull=, tag= or "
                                                   "rows="):
        model(batch, pull=mc.tensor(np.ones((2, E))))


@pytest.mark.usefixtures("cpu_backend")
@given(forests(max_arity=2, max_graphs=6), st.integers(0, 2**16))
def test_kinds_equal_one_masked_cell(graphs, seed):
    p = _params(seed)
    params = list(p.values())
    batch = mc.GraphBatch(graphs)
    rng = np.random.default_rng(seed + 2)
    X = mc.tensor(rng.normal(size=(batch.num_vertices, E)), requires_grad=True)
    target = rng.normal(size=(batch.num_vertices, C))

    def leaf(v):
        h = mc.tanh(v.pull() @ p["W_leaf"] + p["b_leaf"])
        v.scatter(h)
        v.push(h @ p["W_out"])

    def internal(v):  # W_out is shared by both kinds: one gradient, the sum of both
        h = mc.tanh(v.pull() @ p["W"] + p["b"] + v.gather(0) @ p["U0"] + v.gather(1) @ p["U1"])
        v.scatter(h)
        v.push(h @ p["W_out"])

    kinds = mc.VertexFunction.by_kind({"leaf": leaf, "internal": internal}, by="leaf",
                                      pull_shape=(E,), scatter_shape=(H,), push_shape=(C,),
                                      arity=2, dtype="float64")
    flag = (batch.num_children == 0).astype(np.float64)[:, None]
    masked = _masked(p)
    _assert_same(_loss_and_grads(lambda x: kinds(batch, pull=x), params, X, target),
                 _loss_and_grads(lambda x: masked(batch, pull=mc.concat([x, mc.tensor(flag)])),
                                 params, X, target))
    stats = kinds.explain()
    assert stats["forward_backend"] in RAN and stats["backward_backend"] in RAN, stats


@pytest.mark.parametrize("options", [None, {"fuse": False, "lazy_batching": False,
                                            "zero_rows": False, "strided_gathers": False}])
def test_kinds_by_tag_and_by_arity_match_the_reference(options):
    """Kinds chosen by a tag per vertex, and by arity (a chain's vertices have one child),
    with states returned (no push) so the caller's gradient enters through the states."""
    p = _params(3)
    graphs = [mc.InputGraph([[], [], [0, 1], [2], [3]]), mc.InputGraph([[], [0], [1], [0, 2]])]
    batch = mc.GraphBatch(graphs)
    rng = np.random.default_rng(5)
    X = mc.tensor(rng.normal(size=(batch.num_vertices, E)), requires_grad=True)
    target = rng.normal(size=(batch.num_vertices, H))
    tag = np.array([0, 1, 0, 1, 0, 1, 0, 1, 1])

    def even(v):
        v.scatter(mc.tanh(v.pull() @ p["W"] + v.gather(0) @ p["U0"] + v.gather(1) @ p["U1"]))

    def odd(v):
        v.scatter(mc.sigmoid(v.pull() @ p["W_leaf"] + v.gather(0) @ p["U2"]))

    tagged = mc.VertexFunction.by_kind({0: even, 1: odd}, by="tag", pull_shape=(E,),
                                       scatter_shape=(H,), arity=2, dtype="float64",
                                       options=options)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), arity=2, dtype="float64",
                  options=options)
    def by_tag(node):
        states = [by_tag(child) for child in node.children]
        if node.tag == 0:
            total = node.pull() @ p["W"]
            for k, s in enumerate(states):
                total = total + s @ p[f"U{k}"]
            return mc.tanh(total)
        total = node.pull() @ p["W_leaf"]
        if states:
            total = total + states[0] @ p["U2"]
        return mc.sigmoid(total)

    params = list(p.values())
    by_tag(batch, pull=X, tag=tag)
    assert set(by_tag.kinds) == {(a, t) for a in range(3) for t in range(2)}  # all read the tag
    reference = _loss_and_grads(lambda x: evaluate_per_sample(by_tag, batch, pull=x, tag=tag),
                                params, X, target)
    _assert_same(_loss_and_grads(lambda x: tagged(batch, pull=x, tag=tag), params, X, target),
                 reference)
    # the per-sample reference runs kinds too: each vertex its kind's cell
    _assert_same(_loss_and_grads(lambda x: evaluate_per_sample(tagged, batch, pull=x, tag=tag),
                                 params, X, target), reference)
    for beyond in (2, -1, 2**40):  # a tag with no cell: the same clear error, batched or not
        bad = tag.copy()
        bad[4] = beyond
        for run in (tagged, lambda *a, **k: evaluate_per_sample(tagged, *a, **k)):
            with pytest.raises(mc.IndexRangeError,
                               match=rf"sample 0, vertex 4 is of kind {beyond} \(its tag\), "
                                     r"which has no cell; the kinds are \[0, 1\]"):
                run(batch, pull=X, tag=bad)
    _assert_same(_loss_and_grads(lambda x: by_tag(batch, pull=x, tag=tag), params, X, target),
                 reference)

    cells = {a: (lambda v, a=a: v.scatter(mc.tanh(sum((v.gather(k) @ p[f"U{k}"]
                                                       for k in range(a)), v.pull() @ p["W"]))))
             for a in range(3)}
    by_arity = mc.VertexFunction.by_kind(cells, by="arity", pull_shape=(E,), scatter_shape=(H,),
                                         dtype="float64", options=options)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def plain(node):
        return mc.tanh(sum((plain(c) @ p[f"U{k}"] for k, c in enumerate(node.children)),
                           node.pull() @ p["W"]))

    _assert_same(_loss_and_grads(lambda x: by_arity(batch, pull=x), params, X, target),
                 _loss_and_grads(lambda x: evaluate_per_sample(plain, batch, pull=x), params,
                                 X, target))
    assert set(by_arity.explain()["kinds"]) == {0, 1, 2}


def test_a_trace_that_never_reads_the_tag_serves_every_tag():
    p = _params(4)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def leaves_ignore_tags(node):
        if node.is_leaf:
            return mc.tanh(node.pull() @ p["W_leaf"])
        total = sum((leaves_ignore_tags(c) @ p[f"U{k}"] for k, c in enumerate(node.children)),
                    node.pull() @ (p["W"] if node.tag == 0 else p["W_leaf"]))
        return mc.tanh(total)

    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]])])
    X = mc.tensor(np.random.default_rng(1).normal(size=(5, E)), requires_grad=True)
    tag = np.array([0, 1, 1, 2, 0])
    out = leaves_ignore_tags(batch, pull=X, tag=tag)
    assert set(leaves_ignore_tags.kinds) == {(0, None), (2, 1), (2, 0)}
    reference = evaluate_per_sample(leaves_ignore_tags, batch, pull=X, tag=tag)
    np.testing.assert_allclose(out.numpy(), reference.numpy(), rtol=1e-12)


def test_recursive_on_one_input_graph_traces_each_kind_once():
    p = _params(0)
    model = _recursive(p)
    g = mc.InputGraph([[], [], [0, 1], [], [2, 3]])
    X = mc.tensor(np.random.default_rng(0).normal(size=(5, E)))
    one = model(g, pull=X).numpy()
    both = model(mc.GraphBatch([g, g]), pull=mc.concat([X, X], axis=0)).numpy()
    np.testing.assert_allclose(both, np.concatenate([one, one]), rtol=1e-12)
    assert list(model.kinds) == [(0, None), (2, None)]  # traced on the first call, then cached
    text = model.dump()
    assert text == model.program.dump()
    assert "kind leaf:" in text and "kind arity 2:" in text
    assert "top-down" in model.backward_program.dump()
    assert "gather %" not in text.split("kind arity 2:")[0]  # the leaf's program gathers nothing
    leaf_program = model.kinds[(0, None)].program
    assert leaf_program.core == () and not leaf_program.gathers_from



def test_a_call_while_another_thread_traces_is_a_call():
    """One thread traces a kind (its definition part-way through) while another calls the
    same function: the second call is a call of its own, not a call on a child inside the
    first one's trace (the traced node was one for the whole object: it raised), and a kind
    both threads meet first is traced once, with one id."""
    tracing, called = threading.Event(), threading.Event()
    U = mc.Parameter(np.array([[0.5, -1.0], [0.25, 2.0]]))
    slow = threading.local()

    @mc.recursive(scatter_shape=(2,), pull_shape=(2,), dtype="float64")
    def model(node):
        if getattr(slow, "on", False) and node.is_leaf:
            tracing.set()
            called.wait(0.5)  # (the other thread's call comes in now; it waits for the kinds)
        h = node.pull() @ U
        for child in node.children:
            h = h + model(child)
        return mc.tanh(h)

    leaf, pair = mc.InputGraph([[]]), mc.InputGraph([[], [], [0, 1]])
    X1, X3 = np.array([[1.0, -1.0]]), np.array([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])
    seen = {}

    def work(k):
        if k == 0:
            slow.on = True
            seen[0] = model(leaf, pull=mc.tensor(X1)).numpy()
        else:
            tracing.wait(10)
            called.set()
            seen[1] = model(pair, pull=mc.tensor(X3)).numpy()

    run_in_threads(work, 2)
    u = U.numpy()
    np.testing.assert_allclose(seen[0], np.tanh(X1 @ u), rtol=1e-12)
    h0, h1 = np.tanh(X3[0] @ u), np.tanh(X3[1] @ u)
    want = np.stack([h0, h1, np.tanh(X3[2] @ u + h0 + h1)])
    np.testing.assert_allclose(seen[1], want, rtol=1e-12)
    assert sorted(model.kinds) == [(0, None), (2, None)]


# --- errors -------------------------------------------------------------------------------

def _words_batch():
    g = mc.InputGraph([[], [], [0, 1]])
    return mc.GraphBatch([g]), mc.tensor(np.ones((3, E)))


def test_branch_on_a_computed_value_is_an_error_pointing_to_graph_facts():
    p = _params(0)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def branchy(node):
        h = mc.tanh(node.pull() @ p["W"])
        if not node.is_leaf and mc.sum(branchy(node.children[0])) > 0:
            return h * 2
        return h

    with pytest.raises(mc.TracedBranchError) as info:
        branchy(*_words_batch()[:1], pull=_words_batch()[1])
    message = str(info.value)
    assert "'branchy'" in message and "arity 2" in message
    assert "node.is_leaf" in message and "grown at run time" in message
    assert "mc.sum(branchy(node.children[0])) > 0" in message  # the user's line


@pytest.mark.parametrize("bad_call, expected", [
    (lambda f, node: f(node), "the node itself"),
    (lambda f, node: f(mc.zeros((H,))), "got a Tensor"),
    (lambda f, node: f(node.children[0], pull=1), "takes no pull="),
])
def test_a_recursive_call_on_something_not_a_child_is_an_error(bad_call, expected):
    p = _params(0)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def model(node):
        if node.is_leaf:
            return mc.tanh(node.pull() @ p["W"])
        return bad_call(model, node)

    batch, X = _words_batch()
    with pytest.raises(mc.GraphError, match=expected) as info:
        model(batch, pull=X)
    assert "'model'" in str(info.value)


def test_missing_or_wrong_return_is_an_error():
    p = _params(0)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def forgets(node):
        mc.tanh(node.pull() @ p["W"])

    batch, X = _words_batch()
    with pytest.raises(mc.GraphError, match="returned nothing for a vertex of kind 'leaf'"):
        forgets(batch, pull=X)

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def wrong_shape(node):
        return node.pull() @ p["W"] @ p["W_out"]

    with pytest.raises(mc.ShapeError, match=r"per-vertex shape \(2,\).*scatter_shape=\(4,\)"):
        wrong_shape(batch, pull=X)


def test_kind_errors_name_the_sample_and_vertex():
    p = _params(0)

    def leaf(v):
        v.scatter(mc.tanh(v.pull() @ p["W"]))

    by_arity = mc.VertexFunction.by_kind({0: leaf}, by="arity", pull_shape=(E,),
                                         scatter_shape=(H,), dtype="float64")
    batch, X = _words_batch()
    with pytest.raises(mc.IndexRangeError, match=r"sample 0, vertex 2 is of kind 2 .*no cell"):
        by_arity(batch, pull=X)
    tagged = mc.VertexFunction.by_kind({0: leaf, 1: leaf}, by="tag", pull_shape=(E,),
                                       scatter_shape=(H,), dtype="float64")
    with pytest.raises(mc.GraphError, match="tag= is required"):
        tagged(batch, pull=X)
    with pytest.raises(mc.ShapeError, match=r"tag has shape \(2,\), expected \(3,\)"):
        tagged(batch, pull=X, tag=[0, 1])
    with pytest.raises(mc.DTypeError, match="tag must hold integers"):
        tagged(batch, pull=X, tag=[0.5, 1, 0])
    by_sign = mc.VertexFunction.by_kind({-1: leaf, 0: leaf, 1: leaf}, by="tag",
                                        pull_shape=(E,), scatter_shape=(H,), dtype="float64")
    with pytest.raises(mc.IndexRangeError, match=r"tag 18446744073709551615 of vertex 1 is "
                                                 r"outside int64"):  # not kind -1's cell
        by_sign(batch, pull=X, tag=np.array([0, 2**64 - 1, 1], np.uint64))

    def pushes(v):
        v.scatter(mc.tanh(v.pull() @ p["W"]))
        v.push(v.pull() @ p["W"])

    with pytest.raises(mc.GraphError, match="kind 'leaf' pushes an output but kind "
                                            "'internal' does not"):
        mc.VertexFunction.by_kind({"leaf": pushes, "internal": leaf}, pull_shape=(E,),
                                  scatter_shape=(H,), dtype="float64")
    too_narrow = mc.VertexFunction.by_kind({"leaf": leaf, "internal": leaf}, pull_shape=(E,),
                                           scatter_shape=(H,), arity=1, dtype="float64")
    with pytest.raises(mc.GraphError, match="sample 0, vertex 2: has 2 children, but vertex "
                                            "function 'kinds' declares arity 1"):
        too_narrow(batch, pull=X)
    with pytest.raises(mc.GraphError, match="kind 'inner' is not 'leaf' or 'internal'"):
        mc.VertexFunction.by_kind({"inner": leaf}, pull_shape=(E,), scatter_shape=(H,))


def test_a_kinded_call_over_the_memory_budget_runs_in_sub_batches_with_the_same_result():
    p = _params(1)
    model = _recursive(p)
    graphs = [mc.InputGraph.complete_binary(8) for _ in range(12)]
    batch = mc.GraphBatch(graphs)
    X = mc.tensor(np.random.default_rng(2).normal(size=(batch.num_vertices, E)),
                  requires_grad=True)
    params = list(p.values())
    target = np.random.default_rng(3).normal(size=(batch.num_vertices, C))
    whole = _loss_and_grads(lambda x: model(batch, pull=x), params, X, target)
    f = model._last
    sizes = mc.runtime.memory.batch_sizes
    two_graphs = f.memory_model.need(sizes(batch, 0, 2), True)
    kept = f.memory_model.kept.at(sizes(batch))  # what the whole batch keeps for backward
    assert f.memory_model.need(sizes(batch), True) > kept + two_graphs
    try:
        mc.set_memory_budget(kept + two_graphs)  # room for about two graphs at a time
        split = _loss_and_grads(lambda x: model(batch, pull=x), params, X, target)
        assert model.explain()["graphs"] < batch.num_graphs  # the last call was a sub-batch
        mc.set_memory_budget(kept // 2)
        with pytest.raises(mc.OutOfMemoryError, match="vertex function 'model'"):
            model(batch, pull=X)
    finally:
        mc.set_memory_budget(None)
    _assert_same(whole, split)


def test_debug_mode_names_the_kind_sample_and_vertex_of_a_nan():
    W = mc.Parameter(np.ones((E, H)))

    @mc.recursive(scatter_shape=(H,), pull_shape=(E,), dtype="float64")
    def logs(node):
        if node.is_leaf:
            return mc.log(node.pull() @ W)
        return mc.tanh(logs(node.children[0]) + logs(node.children[1]))

    X = np.ones((5, E))
    X[3] = -1  # the second leaf of the root's right subtree
    with mc.debug(), np.errstate(invalid="ignore"), \
            pytest.raises(mc.NonFiniteError, match=r"op 'log' in vertex function "
                                                   r"'logs\[leaf\]'.*sample 0, vertex 3"):
        logs(mc.InputGraph([[], [], [0, 1], [], [2, 3]]), pull=mc.tensor(X))


def test_an_arity_the_function_was_not_written_for_names_the_kind():
    """A binary definition meeting a vertex of three children fails while tracing that kind,
    and the error says which kind (issue 23: it failed inside matmul, naming nothing)."""
    H = 3
    U = mc.Parameter(np.ones((2 * H, H)), name="U")

    @mc.recursive(scatter_shape=(H,), pull_shape=(H,), dtype="float64")
    def binary(node):
        if node.is_leaf:
            return node.pull()
        return mc.tanh(mc.concat([binary(child) for child in node.children]) @ U)

    batch = mc.GraphBatch([mc.InputGraph([[], [], [], [0, 1, 2]])])
    with pytest.raises(mc.ShapeError, match=r"recursive function 'binary', tracing a vertex of "
                                            r"kind 'arity 3' \(3 children.*op 'matmul'"):
        binary(batch, pull=mc.tensor(np.ones((4, H))))


def _leaf_of_three_gates(x, W, b):
    """A Tree-LSTM leaf's state from ``x W + b`` cut into five gates, reading three (i, o, u):
    the two forget gates' columns are never read."""
    i, _, _, o, u = mc.split(x @ W + b, 5)
    return mc.sigmoid(o) * mc.tanh(mc.sigmoid(i) * mc.tanh(u))


def test_a_leaf_reading_some_gates_multiplies_by_their_columns_only():
    """``unused_columns``: a leaf that reads three of five gates of ``x W + b`` multiplies by
    those columns of W (and b) alone — its Program's product is 3H wide, the internal kind's
    4H (it leaves one gate unread) — and computes the same gradients (W's unread columns:
    zero) as with the pass off."""

    def run(options):
        rng = np.random.default_rng(4)
        W = mc.Parameter(rng.normal(size=(E, 5 * H)), name="W")
        U = mc.Parameter(rng.normal(size=(2 * H, 5 * H)), name="U")
        b = mc.Parameter(rng.normal(size=(5 * H,)), name="b")

        @mc.recursive(scatter_shape=(H,), pull_shape=(E,), arity=2, dtype="float64",
                      options=options)
        def model(node):
            if node.is_leaf:
                return _leaf_of_three_gates(node.pull(), W, b)
            i, f_l, f_r, o, u = mc.split(
                mc.concat([model(c) for c in node.children]) @ U + b, 5)
            return mc.sigmoid(o) * mc.tanh(mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l))

        batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]]),
                               mc.InputGraph([[], [], [0, 1]])])
        x = mc.tensor(rng.normal(size=(batch.num_vertices, E)))
        (model(batch, pull=x) ** 2).sum().backward()
        widths = {key: [n.shape[1] for n in cell.program.graph.nodes
                        if n.kind == "op" and n.op.name == "matmul"]
                  for key, cell in model.kinds.items()}
        return [W.grad.numpy(), U.grad.numpy(), b.grad.numpy()], widths

    on, widths = run(None)
    off, widths_off = run({"unused_columns": False})
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert np.all(on[0][:, H:3 * H] == 0)  # the forget gates' columns of W: never read
    leaf = next(key for key in widths if key[0] == 0)
    assert widths[leaf] == [3 * H] and widths_off[leaf] == [5 * H]
    inner = next(key for key in widths if key != leaf)  # (reads four: f_r unread)
    assert widths[inner] == [4 * H] and widths_off[inner] == [5 * H]


@pytest.mark.usefixtures("cpu_backend")
def test_slices_of_the_leaf_kinds_cut_bias_fold_into_slices_of_the_bias():
    """``fold_slices``: the leaf's bias, cut by ``unused_columns`` into its read runs and
    joined, then cut by ``bias_in_readers`` into its gates, is read as one slice of b per gate:
    no concat of b's runs, fewer instructions; the values and gradients those of the pass off
    (``_recursive``'s reference is checked with every switch on and off elsewhere)."""

    def run(options):
        rng = np.random.default_rng(5)
        W = mc.Parameter(rng.normal(size=(E, 5 * H)), name="W")
        b = mc.Parameter(rng.normal(size=(5 * H,)), name="b")
        U = mc.Parameter(rng.normal(size=(2 * H, H)), name="U")

        @mc.recursive(scatter_shape=(H,), pull_shape=(E,), arity=2, dtype="float64",
                      options=options)
        def model(node):
            if node.is_leaf:
                return _leaf_of_three_gates(node.pull(), W, b)
            return mc.tanh(mc.concat([model(c) for c in node.children]) @ U)

        batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]])])
        x = mc.tensor(rng.normal(size=(batch.num_vertices, E)))
        out = model(batch, pull=x)
        (out ** 2).sum().backward()
        leaf = next(cell for key, cell in model.kinds.items() if key[0] == 0)
        concats_of_b = [n for n in leaf.program.graph.nodes if n.kind == "op" and
                        n.op.name == "concat" and len(n.shape) == 1]
        count = len(leaf.program.eager) + len(leaf.backward_program.lazy)
        return [out.numpy(), W.grad.numpy(), b.grad.numpy(), U.grad.numpy()], concats_of_b, count

    on, concats_on, count_on = run(None)
    off, concats_off, count_off = run({"fold_slices": False})
    for a, c in zip(on, off):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)
    assert len(concats_off) == 1 and not concats_on  # (b's two read runs, joined)
    assert count_on < count_off


@pytest.mark.usefixtures("cpu_backend")
@pytest.mark.parametrize("options", [None, {"bias_in_readers": False, "alias_concats": False,
                                            "elementwise_per_level": False}])
def test_a_leaf_kinds_whole_batch_work_is_assembled_in_place(options):
    """A leaf kind runs over all its rows at once (no levels): its [h, c] is written by the
    gates' fused group straight into its columns of the scattered state (``alias_concats``
    over whole phases), the gates read ``x W`` and add their columns of ``b`` themselves
    (``bias_in_readers``: no full-size add), and ∂F's gate gradients are one group writing
    their columns of the block the products read (``elementwise_per_level`` into the lazy
    phase). Values and gradients equal the per-sample eager reference, as with those passes
    off."""
    model, params = recursive_tree_lstm(E, H, np.random.default_rng(7), options=options,
                                        classes=C)
    rng = np.random.default_rng(8)
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]]),
                           mc.InputGraph([[], [], [0, 1]]), mc.InputGraph([[]])])
    X = mc.tensor(rng.normal(size=(batch.num_vertices, E)), requires_grad=True)
    target = rng.normal(size=(batch.num_vertices, C))
    batched = _loss_and_grads(lambda x: model(batch, pull=x), params, X, target)
    eager = _loss_and_grads(lambda x: evaluate_per_sample(model, batch, pull=x), params, X,
                            target)
    _assert_same(batched, eager)

    (leaf,) = [cell for key, cell in model.kinds.items() if key[0] == 0]
    forward, backward = leaf.program, leaf.backward_program
    assert not forward.core and not backward.core  # (all over the whole batch)
    in_place = [ins.step.node for p in (forward, backward) for ins in p.eager + p.lazy
                if getattr(ins, "aliased", False)]
    full_adds = [n for n in forward.graph.nodes if n.kind == "op" and n.op.name == "add"
                 and n.shape[1:] == (3 * H,)]
    if options is None:
        assert [n.shape[1:] for n in in_place] == [(2 * H,), (3 * H,)]  # [h, c]; gates' ∂
        assert {p.key for p, *_ in forward.aliases} == {x.key for x in in_place[0].inputs}
        assert not full_adds
    else:
        assert not in_place and len(full_adds) == 1
