"""Input graphs, batches and the level schedule: validation errors and scheduler invariants."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import minicavs as mc

from graph_strategies import forests, input_graph
from threads import run_in_threads
from vertex_cells import binary_tree_lstm


# --- validation: every error names the sample and the vertex -----------------------------------

def test_cycle_names_a_vertex_on_it():
    with pytest.raises(mc.GraphError, match=r"sample 4: the graph has a cycle through vertex [123]"):
        mc.InputGraph([[], [2], [3], [1]], sample=4)


def test_self_loop_is_a_cycle():
    with pytest.raises(mc.GraphError, match="cycle through vertex 0"):
        mc.InputGraph([[0]])


@pytest.mark.parametrize("children, message", [
    ([[], [5]], r"sample 2: vertex 1: child index 5 is out of range for a graph of 2 vertices"),
    ([[], [-1]], r"sample 2: vertex 1: child index -1 is out of range"),
    ([[], [0.5]], r"sample 2: vertex 1: child 0.5 is not an integer vertex index"),
    ([[], ["0"]], r"sample 2: vertex 1: child '0' is not an integer vertex index"),
    ([], r"sample 2: an input graph needs at least one vertex"),
])
def test_bad_children(children, message):
    with pytest.raises(mc.GraphError, match=message):
        mc.InputGraph(children, sample=2)


@pytest.mark.parametrize("children, message", [
    ([[], [0, True]], r"vertex 1: child True is not an integer vertex index"),  # (NumPy: 1)
    ([[], [np.array(0)]], r"vertex 1: child array\(0\) is not an integer vertex index"),
    ([[], [np.uint64(2**64 - 1)]], r"vertex 1: child index 18446744073709551615 is out of"),
    ([[], [2**70]], r"vertex 1: child index 1180591620717411303424 is out of range"),
    ([[], {0: 1}], r"vertex 1: its children must be a list of vertex indices"),
])
def test_children_numpy_would_convert_are_refused_as_given(children, message):
    # The common input is checked in bulk (one array of all children); what that array
    # would turn into something else is refused with the value the caller wrote.
    with pytest.raises(mc.GraphError, match=message):
        mc.InputGraph(children)


class _Kids(list):
    """A list subclass: InputGraph checks its children one by one, not in bulk."""


@given(input_graph(max_arity=3))
def test_children_checked_in_bulk_give_the_graph_checked_one_by_one(graph):
    children = [graph.children(v) for v in range(graph.num_vertices)]
    reference = mc.InputGraph([_Kids(k) for k in children])
    for form in (children, [tuple(k) for k in children],
                 [np.asarray(k, np.int32) for k in children],
                 [[np.int64(c) for c in k] for k in children]):
        got = mc.InputGraph(form)
        for name in ("child_ptr", "child_ids", "roots"):
            assert np.array_equal(getattr(got, name), getattr(reference, name)), name
        assert got.child_ids.dtype == np.int64 and not got.child_ids.flags.writeable


def test_from_parents_errors():
    with pytest.raises(mc.GraphError, match=r"vertex 1: parent 7 is out of range"):
        mc.InputGraph.from_parents([-1, 7])
    with pytest.raises(mc.GraphError, match="cycle"):
        mc.InputGraph.from_parents([1, 0])


def test_more_children_than_declared_arity_names_sample_and_vertex():
    F, _ = binary_tree_lstm(3, 2, np.random.default_rng(0))
    graphs = [mc.InputGraph.chain(2), mc.InputGraph([[], [], [], [0, 1, 2]])]
    batch = mc.GraphBatch(graphs)
    with pytest.raises(mc.GraphError, match=r"sample 1, vertex 3: has 3 children, but vertex "
                                            r"function 'cell' declares arity 2"):
        F(batch, pull=mc.tensor(np.zeros((batch.num_vertices, 3))))


def test_pull_of_the_wrong_shape_is_explained():
    F, _ = binary_tree_lstm(3, 2, np.random.default_rng(0))
    batch = mc.GraphBatch([mc.InputGraph.chain(4)])
    with pytest.raises(mc.ShapeError, match=r"pull has shape \(3, 3\), expected \(4, 3\)"):
        F(batch, pull=mc.tensor(np.zeros((3, 3))))


def test_cell_errors_point_at_the_users_line():
    W = mc.Parameter(np.zeros((5, 2)))

    def cell(v):
        v.scatter(v.pull() @ W)  # pull is (3,), W is (5, 2)

    with pytest.raises(mc.ShapeError) as info:
        mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(2,))
    message = str(info.value)
    assert "op 'matmul'" in message and "(3,)" in message and "(5, 2)" in message
    assert "test_vertex_graphs.py" in message and "v.scatter(v.pull() @ W)" in message


def test_scatter_shape_mismatch_and_missing_scatter():
    def wrong(v):
        v.scatter(mc.concat([v.pull(), v.pull()]))

    with pytest.raises(mc.ShapeError, match=r"per-vertex shape \(6,\), but the vertex function "
                                            r"declares scatter_shape=\(3,\)"):
        mc.VertexFunction(wrong, pull_shape=(3,), scatter_shape=(3,))
    with pytest.raises(mc.GraphError, match="never calls v.scatter"):
        mc.VertexFunction(lambda v: None, pull_shape=(3,), scatter_shape=(3,))


def test_gather_beyond_arity_is_explained():
    with pytest.raises(mc.GraphError, match=r"v.gather\(2\): the vertex function declares arity 2"):
        mc.VertexFunction(lambda v: v.scatter(v.gather(2)), scatter_shape=(3,), arity=2)


def test_data_dependent_python_control_flow_is_explained():
    def cell(v):
        x = v.pull()
        if x.sum() > 0:  # not traceable
            v.scatter(x)

    with pytest.raises(mc.GraphError, match="truth value"):
        mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(3,))


# --- the schedule -------------------------------------------------------------------------------

def _levels_by_recursion(children):
    level = {}

    def of(v):
        if v not in level:
            level[v] = 1 + max(map(of, children[v]), default=-1)
        return level[v]

    return [of(v) for v in range(len(children))]


@given(input_graph(max_arity=3, max_vertices=30))
def test_a_graphs_levels_are_made_with_it_from_child_lists_in_any_numbering(graph):
    """Children numbered before parents: the levels come from one pass at construction; in
    another numbering, from the frontier loop (made with the graph, or when first asked)."""
    children = [graph.children(v) for v in range(graph.num_vertices)]
    expected = _levels_by_recursion(children)
    for made in (graph, mc.InputGraph(children), mc.InputGraph(tuple(map(tuple, children)))):
        assert made.levels().tolist() == expected
        assert not made.levels().flags.writeable


@given(input_graph(max_arity=3, max_vertices=30))
def test_a_graph_made_in_one_c_pass_equals_one_made_by_the_python_path(graph):
    """Child lists of Python ints, children numbered first (a parsed tree), take one C pass
    (``vertex/native.py``); every array equals the Python path's, and is read-only."""
    from minicavs.vertex import graphs, native

    children = [graph.children(v) for v in range(graph.num_vertices)]
    ordered = native.ordered_child_lists(children) is not None
    assert ordered == all(c < v for v in range(len(children)) for c in children[v]) or \
        native.unavailable() is not None
    made = mc.InputGraph(children)
    original = graphs.native.ordered_child_lists
    graphs.native.ordered_child_lists = lambda children: None
    try:
        reference = mc.InputGraph(children)
    finally:
        graphs.native.ordered_child_lists = original
    for name in ("child_ptr", "child_ids", "roots", "num_children"):
        a, b = getattr(made, name), getattr(reference, name)
        assert a.dtype == b.dtype == np.int64 and a.tolist() == b.tolist(), name
        assert not a.flags.writeable
    assert made.levels().tolist() == reference.levels().tolist() == \
        _levels_by_recursion(children)


_FIELDS = ("offsets", "child_ptr", "child_ids", "roots", "sample_of", "level", "num_levels",
           "order", "row_of", "level_offsets", "edge_parent_row", "edge_child_row", "edge_slot",
           "edge_level_offsets", "edge_parent_local", "is_forest")


@given(forests(max_arity=3, max_vertices=20, kinds=("tree", "chain", "dag")))
def test_a_batch_scheduled_in_one_c_pass_equals_the_numpy_schedule(graphs):
    """Where every graph has its levels, the batch's schedule is one C pass
    (``vertex/native.py``): each field equals the NumPy path's, read-only."""
    from minicavs.vertex import graphs as module, native

    for g in graphs:
        g.levels()  # (made for every graph: the C pass needs them)
    made = native.batch_schedule(graphs)
    assert (made is None) == (native.unavailable() is not None)
    module._SCHEDULES.__init__()  # (no schedule shared from an earlier batch)
    fast = mc.GraphBatch(graphs)
    original = module.native.batch_schedule
    module.native.batch_schedule = lambda graphs: None
    try:
        module._SCHEDULES.__init__()
        reference = mc.GraphBatch(graphs)
    finally:
        module.native.batch_schedule = original
    for name in _FIELDS:
        a, b = getattr(fast, name), getattr(reference, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == np.int64 and a.tolist() == b.tolist(), name
            assert not a.flags.writeable, name
        else:
            assert a == b, name
    for k in range(3):
        assert fast.child_rows_of(k).tolist() == reference.child_rows_of(k).tolist()


def test_a_batch_of_graphs_without_levels_yet_is_scheduled_by_numpy_and_keeps_them():
    from minicavs.vertex import native

    graphs = [mc.InputGraph.from_parents([2, 2, -1]), mc.InputGraph.from_parents([-1, 0])]
    assert native.batch_schedule(graphs) is None  # (no levels yet: the NumPy path)
    batch = mc.GraphBatch(graphs)
    assert batch.level.tolist() == [0, 0, 1] + [1, 0]  # (the second: vertex 1 is 0's child)
    assert [g.levels().tolist() for g in graphs] == [[0, 0, 1], [1, 0]]  # (kept)
    assert native.batch_schedule(graphs) is not None or native.unavailable() is not None


@pytest.mark.parametrize("children", [
    [[], [0, True]], [[], [np.int64(0)]], [[], [2 ** 70]], [[], [-1]], [[], [1]], [[1], []],
    ([], [0]), [[], range(1)], [[], np.array([0])], [[], (0,), [0, 1]]])
def test_the_c_pass_leaves_every_other_form_to_the_python_path(children):
    """Anything but Python ints below their parent goes the Python way, which checks it."""
    from minicavs.vertex import native

    ordered = native.unavailable() is None and all(
        type(c) is int and 0 <= c < v for v, kids in enumerate(children) for c in kids) and \
        all(type(k) in (list, tuple) for k in children)
    assert (native.ordered_child_lists(children) is not None) == ordered  # (no native: None)


@pytest.mark.parametrize("make", [lambda: mc.InputGraph.chain(7),
                                  lambda: mc.InputGraph.complete_binary(1),
                                  lambda: mc.InputGraph.complete_binary(16),
                                  lambda: mc.InputGraph.from_parents([2, 2, 4, 4, -1])])
def test_the_constructors_levels_equal_the_definition(make):
    graph = make()
    children = [graph.children(v) for v in range(graph.num_vertices)]
    assert graph.levels().tolist() == _levels_by_recursion(children)


@given(forests(max_arity=3, max_vertices=20, kinds=("tree", "chain", "dag")))
def test_schedule_invariants(graphs):
    batch = mc.GraphBatch(graphs)
    n = batch.num_vertices
    # Every vertex is in exactly one level: order is a permutation, levels are contiguous.
    assert sorted(batch.order.tolist()) == list(range(n))
    assert np.all(np.diff(batch.level[batch.order]) >= 0)
    for t in range(batch.num_levels):
        r0, r1 = batch.rows_of_level(t)
        assert np.all(batch.level[batch.order[r0:r1]] == t)
    # Each vertex sits above all its children, exactly one above the highest.
    for v in range(n):
        kids = batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]]
        expected = 0 if kids.size == 0 else 1 + batch.level[kids].max()
        assert batch.level[v] == expected
    # The number of levels is the height of the tallest graph plus one.
    assert batch.num_levels == max(g.height() for g in graphs) + 1
    # Child-row indices point at the rows of the right children.
    for k, rows in enumerate(map(batch.child_rows_of, range(batch.max_arity))):
        for r in range(n):
            v = batch.order[r]
            kids = batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]]
            assert rows[r] == (batch.row_of[kids[k]] if k < kids.size else -1)


def _children_in_order_by_definition(batch, arity):
    """The first row from which every row r has children arity (r - first) + j (j < arity) and
    no other, rows before it none — by looking at each row, or None."""
    n = batch.num_vertices
    kids = [[int(batch.child_rows_of(j)[r]) for j in range(batch.max_arity)
             if batch.child_rows_of(j)[r] >= 0] for r in range(n)]
    first = sum(not k for k in kids)
    if first == n or any(kids[:first]):
        return None
    ok = all(kids[r] == [arity * (r - first) + j for j in range(arity)] for r in range(first, n))
    return first if ok else None


@given(forests(max_arity=3, max_vertices=20, kinds=("tree", "chain", "dag")),
       st.integers(1, 3))
def test_children_in_order_is_its_definition(graphs, arity):
    batch = mc.GraphBatch(graphs)
    assert batch.indices().children_in_order(arity) == \
        _children_in_order_by_definition(batch, arity)


def test_complete_trees_and_chains_of_one_size_have_their_children_in_order():
    trees = mc.GraphBatch([mc.InputGraph.complete_binary(8)] * 2).indices()
    assert trees.children_in_order(2) == 16 and trees.children_in_order(3) is None
    chains = mc.GraphBatch([mc.InputGraph.chain(3)] * 4).indices()
    assert chains.children_in_order(1) == 4
    assert chains.children_in_order(2) is None  # (no vertex has a second child)
    later = mc.GraphBatch([mc.InputGraph.complete_binary(4), mc.InputGraph.complete_binary(2)])
    assert later.indices().children_in_order(2) == 6  # (the small tree's root last on level 1)
    first = mc.GraphBatch([mc.InputGraph.complete_binary(2), mc.InputGraph.complete_binary(4)])
    assert first.indices().children_in_order(2) is None  # (its root first on level 1: the
    # big root's children are rows 7 and 8, not 6 and 7)


@given(input_graph(max_arity=2, max_vertices=30))
def test_ops_per_level_do_not_depend_on_the_batch_size(graph):
    F, _ = binary_tree_lstm(3, 2, np.random.default_rng(0))
    counts = []
    for copies in (1, 5):
        batch = mc.GraphBatch([graph] * copies)
        out = F(batch, pull=mc.tensor(np.ones((batch.num_vertices, 3))))
        out.sum().backward()
        stats = F.explain()
        assert stats["levels"] == graph.height() + 1
        counts.append((stats["forward_ops_per_level"], stats["backward_ops_per_level"]))
    assert counts[0] == counts[1]
    # A level runs at most the core steps of F (and ∂F): fewer where its vertices lack some
    # children, whose gathered rows are zero (the leaves' level always).
    forward, backward = counts[0]
    assert max(forward) <= len(F.program.core)
    assert max(backward) <= len(F.backward_program.core)
    assert forward[0] < len(F.program.core) or graph.num_vertices == 1 or \
        len(F.program.core) == 0


def test_constructors():
    chain = mc.InputGraph.chain(5)
    assert chain.children(4) == [3] and chain.height() == 4 and chain.roots.tolist() == [4]
    tree = mc.InputGraph.complete_binary(256)
    assert tree.num_vertices == 511 and tree.height() == 8 and tree.roots.tolist() == [510]
    parents = mc.InputGraph.from_parents([-1, 0, 0, 1])
    assert parents.children(0) == [1, 2] and parents.children(1) == [3]
    dag = mc.InputGraph([[], [0], [0, 1]])  # vertex 0 has two parents
    batch = mc.GraphBatch([dag, chain])
    assert batch.roots.tolist() == [2, 7] and not batch.is_forest
    assert batch.offsets.tolist() == [0, 3, 8]


def test_explain_reads_each_calls_own_record():
    F, _ = binary_tree_lstm(3, 2, np.random.default_rng(0))
    small, large = mc.GraphBatch([mc.InputGraph.chain(2)]), mc.GraphBatch(
        [mc.InputGraph.complete_binary(8)] * 3)
    out_small = F(small, pull=mc.tensor(np.ones((small.num_vertices, 3))))
    out_large = F(large, pull=mc.tensor(np.ones((large.num_vertices, 3))))
    assert F.explain(out_small)["vertices"] == 2 and F.explain(out_small)["levels"] == 2
    assert F.explain(out_large)["vertices"] == 45 and F.explain()["vertices"] == 45
    out_small.sum().backward()  # the backward releases the record: explain() says so
    with pytest.raises(mc.GraphError, match="not returned by vertex function"):
        F.explain(out_small)
    with pytest.raises(mc.GraphError, match="not returned by vertex function"):
        F.explain(mc.tensor(np.ones(3)))


def test_the_level_schedule_as_dot_lists_every_vertex_edge_and_task():
    """GraphBatch.to_dot(): a cluster per graph, one node per vertex with its row, an edge per
    child -> parent, and per level a task box ranked with exactly that level's vertices
    (parsed back from the text, checked against the batch's own arrays)."""
    import re

    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]]),
                           mc.InputGraph.chain(3)])
    dot = batch.to_dot()
    assert dot.startswith("digraph batch {") and dot.rstrip().endswith("}")
    assert len(re.findall(r"subgraph cluster_\d+", dot)) == batch.num_graphs
    rows = {int(v): int(r) for v, r in re.findall(r'v(\d+) \[label="\d+:\d+\\nrow (\d+)"', dot)}
    assert rows == {v: int(batch.row_of[v]) for v in range(batch.num_vertices)}
    edges = sorted((int(c), int(p)) for c, p in re.findall(r"v(\d+) -> v(\d+);", dot))
    assert edges == sorted((int(c), v) for v in range(batch.num_vertices)
                           for c in batch.child_ids[batch.child_ptr[v]:batch.child_ptr[v + 1]])
    for t in range(batch.num_levels):
        members = re.search(rf"{{ rank=same; task{t}; ([^}}]*)}}", dot).group(1)
        assert sorted(int(v) for v in re.findall(r"v(\d+);", members)) == \
            sorted(np.flatnonzero(batch.level == t).tolist())


@given(forests())
def test_levels_kept_by_the_graphs_give_the_same_schedule(graphs):
    """A batch keeps each graph's levels on the graph; a later batch of the same graphs (in
    another order, with others) concatenates them: the same schedule as computed afresh."""
    first = mc.GraphBatch(graphs)  # computes, and leaves each graph its levels
    assert all(g._level is not None for g in graphs)
    for g, lo, hi in zip(graphs, first.offsets[:-1], first.offsets[1:]):
        np.testing.assert_array_equal(g.levels(), first.level[lo:hi])
    again = mc.GraphBatch(graphs[::-1] + [mc.InputGraph([[], [0]])])
    fresh = [mc.InputGraph([g.children(v) for v in range(g.num_vertices)])
             for g in graphs[::-1]] + [mc.InputGraph([[], [0]])]
    reference = mc.GraphBatch(fresh)
    for name in ("level", "order", "level_offsets", "edge_parent_row", "edge_child_row"):
        np.testing.assert_array_equal(getattr(again, name), getattr(reference, name))


def test_an_input_graph_is_read_only():
    g = mc.InputGraph([[], [], [0, 1]])
    for array in (g.child_ptr, g.child_ids, g.roots, g.num_children, g.levels()):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1


# --- a repeated batch structure reuses its schedule ---------------------------------------------

def _trees(seed, count=5):
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(count):
        n = int(rng.integers(1, 12))
        children = [[] for _ in range(n)]
        for v in range(1, n):
            free = [u for u in range(v) if not any(u in c for c in children)]
            if free and rng.random() < 0.7:
                children[v] = [int(u) for u in rng.choice(free, min(2, len(free)), False)]
        graphs.append(children)
    return graphs


def _schedule_fields(batch):
    from minicavs.vertex import graphs

    return {name: getattr(batch, name) for name in graphs._SCHEDULE_FIELDS
            if not name.startswith("_")}


def test_a_batch_of_the_same_structures_shares_the_schedule_of_a_recent_one():
    """New InputGraphs of the same structures (the same trees next epoch, identical generated
    trees): the schedule and the device indices are the first batch's, read-only, and equal a
    schedule made afresh."""
    from minicavs.vertex import graphs

    structures = _trees(0)
    first = mc.GraphBatch([mc.InputGraph(c) for c in structures])
    again = mc.GraphBatch([mc.InputGraph(c) for c in structures])
    assert again.order is first.order and again.indices() is first.indices()
    assert not again.order.flags.writeable and not again.child_rows_of(0).flags.writeable
    graphs._SCHEDULES.clear()
    fresh = mc.GraphBatch([mc.InputGraph(c) for c in structures])
    assert fresh.order is not first.order
    for name, value in _schedule_fields(fresh).items():
        np.testing.assert_array_equal(getattr(again, name), value, err_msg=name)
    # one tree other: its own schedule
    other = mc.GraphBatch([mc.InputGraph(c) for c in structures[:-1] + [[[], [], [0, 1]]]])
    assert other.order is not fresh.order
    assert other.num_vertices == fresh.num_vertices - len(structures[-1]) + 3


def test_the_recent_schedules_are_bounded():
    from minicavs.vertex import graphs

    graphs._SCHEDULES.clear()
    first = mc.GraphBatch([mc.InputGraph.chain(1)])
    for n in range(2, graphs._SCHEDULES.size + 2):  # as many other structures as it keeps
        mc.GraphBatch([mc.InputGraph.chain(n)])
    again = mc.GraphBatch([mc.InputGraph.chain(1)])
    assert again.order is not first.order  # (dropped: made again)
    np.testing.assert_array_equal(again.order, first.order)
    # and by their vertices: a batch past the budget is not kept, one within it pushes out
    # what it must
    graphs._SCHEDULES.clear()
    budget = graphs._SCHEDULES.vertices
    small = mc.GraphBatch([mc.InputGraph.chain(3)])
    big = [mc.InputGraph.chain(budget // 2 + 1)] * 2
    assert mc.GraphBatch(big).order is not mc.GraphBatch(big).order
    assert mc.GraphBatch([mc.InputGraph.chain(3)]).order is small.order
    half = [mc.InputGraph.chain(budget - 2)]
    assert mc.GraphBatch(half).order is mc.GraphBatch(half).order
    assert mc.GraphBatch([mc.InputGraph.chain(3)]).order is not small.order


def test_batches_of_shared_schedules_from_many_threads_equal_their_own():
    from minicavs.vertex import graphs

    sets = [_trees(seed) for seed in range(6)]
    graphs._SCHEDULES.clear()
    expected = []
    for s in sets:
        expected.append(_schedule_fields(mc.GraphBatch([mc.InputGraph(c) for c in s])))
        graphs._SCHEDULES.clear()

    def work(k):
        for i in range(30):
            s = (k + i) % len(sets)
            batch = mc.GraphBatch([mc.InputGraph(c) for c in sets[s]])
            for name, value in expected[s].items():
                np.testing.assert_array_equal(getattr(batch, name), value, err_msg=name)
            batch.child_rows_of(1)
            batch.indices()

    run_in_threads(work, 8)
