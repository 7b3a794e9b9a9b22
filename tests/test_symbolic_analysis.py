"""Graph analyses (fusion groups, eager/core/lazy classes, CSE, DCE), the step executor and the
DOT drawing, on hand-built graphs whose right answers are written down here by hand — above all
the binary Tree-LSTM cell of Cavs Fig. 4 and Fig. 7."""

import copy
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
import scipy.special

import minicavs as mc
from minicavs.runtime import analysis
from minicavs.runtime.analysis import (backward_sources_and_sinks, dependency_classes,
                                        eliminate_dead, freeze, fusion_groups,
                                        merge_common_subexpressions)
from minicavs.runtime.executor import (NumpyFusedKernel, OpByOpKernel, make_fused_kernel,
                                        plan_steps, run_steps, sigmoid_expit_into,
                                        sigmoid_tanh_into)
from minicavs.ops.elementwise import SIGMOID

from graph_executor import GraphExecutor

N, E, H, C = 3, 5, 4, 2  # vertices in the task, pull size, hidden size, head classes


def tree_lstm(head=False, dtype="float64"):
    """The binary Tree-LSTM vertex function F of Cavs Fig. 4, traced on a task of N vertices.

    Inputs x (pull), h_l, c_l, h_r, c_r (gathers); gates = W x + U [h_l, h_r] + b, split into
    i, f_l, f_r, o, u; c = σ(i)⊙tanh(u) + σ(f_l)⊙c_l + σ(f_r)⊙c_r; h = σ(o)⊙tanh(c); outputs the
    scattered [h, c] and the pushed h (and, with ``head``, a lazy head h·V). Returns the graph and
    a dict of the named intermediate symbols."""
    rng = np.random.default_rng(7)
    W = mc.Parameter(rng.standard_normal((E, 5 * H)).astype(dtype) * 0.5, name="W")
    U = mc.Parameter(rng.standard_normal((2 * H, 5 * H)).astype(dtype) * 0.5, name="U")
    b = mc.Parameter(rng.standard_normal(5 * H).astype(dtype) * 0.1, name="b")
    V = mc.Parameter(rng.standard_normal((H, C)).astype(dtype), name="V")
    s = {}

    def cell(x, h_l, c_l, h_r, c_r):
        s.update(x=x, h_l=h_l, c_l=c_l, h_r=h_r, c_r=c_r)
        s["Wx"] = mc.matmul(x, W)
        s["hh"] = mc.concat([h_l, h_r])
        s["Uh"] = mc.matmul(s["hh"], U)
        s["pre"] = s["Wx"] + s["Uh"]
        s["gates"] = s["pre"] + b
        s["i"], s["fl"], s["fr"], s["o"], s["u"] = mc.split(s["gates"], 5)
        s["si"], s["tu"] = mc.sigmoid(s["i"]), mc.tanh(s["u"])
        s["iu"] = s["si"] * s["tu"]
        s["sfl"] = mc.sigmoid(s["fl"])
        s["flc"] = s["sfl"] * c_l
        s["c1"] = s["iu"] + s["flc"]
        s["sfr"] = mc.sigmoid(s["fr"])
        s["frc"] = s["sfr"] * c_r
        s["c"] = s["c1"] + s["frc"]
        s["so"], s["tc"] = mc.sigmoid(s["o"]), mc.tanh(s["c"])
        s["h"] = s["so"] * s["tc"]
        s["scatter"] = mc.concat([s["h"], s["c"]])
        outs = [s["scatter"], s["h"]]
        if head:
            s["head"] = mc.matmul(s["h"], V)
            outs.append(s["head"])
        return tuple(outs)

    specs = [mc.spec((N, E), dtype)] + [mc.spec((N, H), dtype)] * 4
    graph = mc.trace(cell, *specs, input_names=["x", "h_l", "c_l", "h_r", "c_r"])
    return graph, s


def ids(nodes):
    return {id(n) for n in nodes}


def tree_lstm_inputs(dtype="float64", seed=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((N, E)).astype(dtype)] + [
        rng.standard_normal((N, H)).astype(dtype) for _ in range(4)]


# --- fusion groups ------------------------------------------------------------------------------

def test_tree_lstm_fusion_groups_match_figure_7():
    graph, s = tree_lstm()
    groups = fusion_groups(graph)
    # By hand: the two adds of the linear transformation, and the whole gate/cell arithmetic
    # after the split (Fig. 7's "Fused Kernel"). Slices, concats and matmuls are not elementwise.
    linear = ["pre", "gates"]
    cell = ["si", "tu", "iu", "sfl", "flc", "c1", "sfr", "frc", "c", "so", "tc", "h"]
    assert [ids(g.members) for g in groups] == [ids(s[k] for k in linear),
                                                ids(s[k] for k in cell)]
    g0, g1 = groups
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    for g in groups:  # members in topological order
        assert [position[id(m)] for m in g.members] == sorted(position[id(m)] for m in g.members)
    assert [id(x) for x in g0.inputs] == [id(s["Wx"]), id(s["Uh"]), id(graph.params[2])]
    assert [id(x) for x in g0.outputs] == [id(s["gates"])]
    assert ids(g1.inputs) == ids(s[k] for k in ["i", "u", "fl", "c_l", "fr", "c_r", "o"])
    assert [id(x) for x in g1.inputs] == [id(s[k]) for k in ["i", "u", "fl", "c_l", "fr", "c_r",
                                                             "o"]]  # order of first use
    assert [id(x) for x in g1.outputs] == [id(s["c"]), id(s["h"])]  # used by scatter / push
    # Singletons are not groups by default; with min_size=1 nothing else changes here.
    assert len(fusion_groups(graph, min_size=1)) == 2


def test_keep_makes_internal_members_group_outputs():
    graph, s = tree_lstm()
    bw = mc.grad_graph(graph)
    groups = fusion_groups(graph, keep=bw.forward_refs)
    cell = groups[1]
    kept = ids(bw.forward_refs)
    assert ids(m for m in cell.members if id(m) in kept) <= ids(cell.outputs)
    assert id(s["si"]) in ids(cell.outputs)  # ∂F reads σ(i)
    assert id(s["iu"]) not in ids(cell.outputs)  # nothing outside reads σ(i)⊙tanh(u)


def test_merging_across_a_non_fused_node_is_refused():
    # t = tanh(x) feeds both a matmul and the add that consumes the matmul's result: a group
    # {tanh, add} would have to run before and after the matmul.
    W = mc.Parameter(np.eye(3))

    def f(x):
        t = mc.tanh(x)
        m = mc.matmul(t, W)
        y = t + m
        return mc.sigmoid(y)

    graph = mc.trace(f, mc.spec((2, 3), "float64"))
    tanh, matmul, add, sigmoid = graph.op_nodes()
    groups = fusion_groups(graph, min_size=1)
    assert [ids(g.members) for g in groups] == [{id(tanh)}, {id(add), id(sigmoid)}]
    assert [ids(g.members) for g in fusion_groups(graph)] == [{id(add), id(sigmoid)}]
    x = np.random.default_rng(0).standard_normal((2, 3))
    np.testing.assert_allclose(GraphExecutor(graph, min_size=1).run(x)[0],
                               graph.evaluate(x)[0], rtol=1e-12)


def test_merging_that_closes_a_cycle_through_another_group_is_refused():
    # A = {a}; C = {c1, c2, c3} (c1 and c2 meet only in c3, so there is no path c1 -> c2);
    # B = {b}. a -> m1 -> c1 and c2 -> n -> b, and a feeds b directly. Merging A and B would
    # need C before it (through n) and after it (through m1): a cycle that only shows when C
    # is treated as one unit.
    W1, W2, W3 = (mc.Parameter(np.eye(3) * k) for k in (1.0, 2.0, 3.0))
    s = {}

    def f(x):
        s["a"] = mc.tanh(x)
        s["c1"] = mc.sigmoid(mc.matmul(s["a"], W1))
        s["c2"] = mc.tanh(mc.matmul(x, W2))
        s["c3"] = s["c1"] + s["c2"]
        s["b"] = s["a"] * mc.matmul(s["c2"], W3)
        return s["c3"], s["b"]

    graph = mc.trace(f, mc.spec((2, 3), "float64"))
    groups = fusion_groups(graph, min_size=1)
    assert sorted(map(len, groups)) == [1, 1, 3]
    assert ids(s[k] for k in ("c1", "c2", "c3")) in [ids(g.members) for g in groups]
    assert {id(s["a"])} in [ids(g.members) for g in groups]
    x = np.random.default_rng(0).standard_normal((2, 3))
    for got, want in zip(GraphExecutor(graph, min_size=1).run(x), graph.evaluate(x)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_fusion_respects_classes():
    graph, _ = tree_lstm(head=True)
    bw = mc.grad_graph(graph)
    gathers = graph.inputs[1:]
    classes = dependency_classes(bw, *backward_sources_and_sinks(bw, gathers, [0]))
    groups = fusion_groups(bw, classes=classes)
    assert groups
    for g in groups:
        assert len({classes[m] for m in g.members}) == 1
    # Without the classes some group mixes eager work (1 - tanh², read from the forward values)
    # into the core chain: exactly what the runtime must not do.
    assert any(len({classes[m] for m in g.members}) > 1 for g in fusion_groups(bw))


# --- eager / core / lazy ------------------------------------------------------------------------

def test_tree_lstm_classes_match_figure_7():
    graph, s = tree_lstm(head=True)
    gathers = [s[k] for k in ("h_l", "c_l", "h_r", "c_r")]
    classes = dependency_classes(graph, gathers, [s["scatter"]])
    want = {"x": "eager", "Wx": "eager",  # W·x of the pulled input: before the level loop
            "hh": "core", "Uh": "core", "pre": "core", "gates": "core", "i": "core",
            "c": "core", "h": "core", "scatter": "core", "h_l": "core",
            "head": "lazy"}  # the head on the pushed h: after the loop
    assert {k: classes[s[k]] for k in want} == want
    for p in graph.params:
        assert classes[p] == "eager"
    assert classes.nodes("lazy") == [s["head"]]
    assert classes.counts() == {"eager": 1, "core": len(graph.op_nodes()) - 2, "lazy": 1}
    assert dict(classes)[s["Wx"].key] == "eager"  # it is also a plain dict keyed by node.key


def test_tree_lstm_backward_classes_match_figure_7():
    graph, s = tree_lstm(head=True)
    bw = mc.grad_graph(graph)
    gathers = [s[k] for k in ("h_l", "c_l", "h_r", "c_r")]
    sources, sinks = backward_sources_and_sinks(bw, gathers, [0])
    assert [id(x) for x in sources] == [id(bw.cotangents[0])]
    assert len(sinks) == 4
    classes = dependency_classes(bw, sources, sinks)
    grad = {id(of): out for out, of in zip(bw.outputs, bw.grad_of)}
    W, U, b, V = graph.params
    for p in (W, U, b):  # ∂L/∂W = xᵀ·δ and friends: lazy, one big product after the loop
        assert classes[grad[id(p)]] == "lazy", p
    # The head's ∂L/∂V = hᵀ·d_head needs only the forward h and the head's cotangent, both known
    # before the backward loop: eager (as is d_head·Vᵀ, the head's gradient into h).
    assert classes[grad[id(V)]] == "eager"
    assert classes[grad[id(s["x"])]] == "lazy"  # the gradient of the pulled input
    for k in ("h_l", "c_l", "h_r", "c_r"):
        assert classes[grad[id(s[k])]] == "core"
    matmuls = [n for n in bw.op_nodes() if n.op.name == "matmul"]
    # δ·Uᵀ carries the gradient to the children: core. dW, dU and the pulled input's δ·Wᵀ are
    # lazy; the head's two products are eager.
    assert sorted(classes[m] for m in matmuls) == ["core", "eager", "eager", "lazy", "lazy",
                                                   "lazy"]
    # The cotangents of push and head are known before the backward loop: eager.
    assert classes[bw.cotangents[1]] == "eager" and classes[bw.cotangents[2]] == "eager"
    # Forward values read by ∂F are eager, and so is 1 - tanh(c)² computed from them alone.
    assert all(classes[r] == "eager" for r in bw.inputs[len(bw.cotangents):])
    assert any(classes[n] == "eager" and n.op.name == "sub" for n in bw.op_nodes())


def test_backward_sinks_by_symbol_and_ambiguity():
    def f(x, g):
        h = mc.tanh(x + g)
        return h, h  # scatter(h); push(h): one symbol, two outputs

    graph = mc.trace(f, mc.spec((2,), "float64"), mc.spec((2,), "float64"))
    bw = mc.grad_graph(graph)
    with pytest.raises(mc.GraphError, match="by its position"):
        backward_sources_and_sinks(bw, [graph.inputs[1]], [graph.outputs[0]])
    sources, sinks = backward_sources_and_sinks(bw, [graph.inputs[1]], [0])
    assert [id(x) for x in sources] == [id(bw.cotangents[0])]
    with pytest.raises(mc.GraphError, match="not a node"):
        dependency_classes(graph, [bw.cotangents[0]], graph.outputs)


def test_sink_without_source_is_eager_and_unused_source_is_lazy():
    def f(x, g):
        return mc.tanh(x), g * 2.0

    graph = mc.trace(f, mc.spec((2,), "float64"), mc.spec((2,), "float64"))
    classes = dependency_classes(graph, [graph.inputs[1]], [graph.outputs[0]])
    assert classes[graph.outputs[0]] == "eager"
    assert classes[graph.inputs[1]] == "lazy" and classes[graph.outputs[1]] == "lazy"


# --- common subexpressions and dead nodes -------------------------------------------------------

def test_merge_common_subexpressions():
    W = mc.Parameter(np.arange(9.0).reshape(3, 3))

    def f(x, y):
        a = mc.tanh(x) + y
        b = y + mc.tanh(x)  # the same, arguments swapped (add commutes)
        r = mc.reshape(a, (-1,)) + mc.reshape(b, (-1,))
        twice = x * 2.0 + x * 2.0  # equal constants, then equal products
        other = x * 3.0
        d, e = x - y, y - x  # sub does not commute
        s0, s1 = mc.sum(x, axis=0), mc.sum(x, axis=1)  # different attributes
        f32 = x.astype("float32").astype("float64") + x.astype("float32").astype("float64")
        return r, twice + other, d + e, s0 + s1, mc.matmul(x, W) + mc.matmul(x, W), f32

    graph = mc.trace(f, mc.spec((3, 3), "float64"), mc.spec((3, 3), "float64"))
    merged = merge_common_subexpressions(graph)

    def count(g, name):
        return sum(n.op.name == name for n in g.op_nodes())

    assert (count(graph, "tanh"), count(merged, "tanh")) == (2, 1)
    assert (count(graph, "reshape"), count(merged, "reshape")) == (2, 1)
    assert (count(graph, "matmul"), count(merged, "matmul")) == (2, 1)
    assert (count(graph, "astype"), count(merged, "astype")) == (4, 2)
    assert count(merged, "sub") == 2 and count(merged, "sum") == 2
    assert sum(n.kind == "const" for n in merged.nodes) == 2  # 2.0 and 3.0
    assert count(merged, "mul") == 2  # x*2 (twice in the source) and x*3
    # Inputs and parameters are the same symbols, in the same order; outputs stay separate.
    assert merged.inputs == graph.inputs and merged.params == graph.params
    assert len(merged.outputs) == len(graph.outputs)
    assert all(n.kind == "op" for n in graph.nodes if n.kind == "op")  # original untouched
    assert count(graph, "tanh") == 2
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    for got, want in zip(merged.evaluate(x, y), graph.evaluate(x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_inputs_are_never_merged():
    graph = mc.trace(lambda x, y: mc.tanh(x) + mc.tanh(y), (2,), (2,))
    merged = merge_common_subexpressions(graph)
    assert sum(n.op.name == "tanh" for n in merged.op_nodes()) == 2


def test_cse_on_backward_graph_keeps_it_a_backward_graph():
    graph, _ = tree_lstm()
    bw = mc.grad_graph(graph)
    merged = merge_common_subexpressions(bw)
    assert type(merged) is type(bw)
    assert len(merged.nodes) < len(bw.nodes)  # the many constant 1s, the repeated reshapes
    assert merged.forward_refs == bw.forward_refs and merged.grad_of == bw.grad_of
    rng = np.random.default_rng(1)
    env = graph.run(tree_lstm_inputs())
    cots = [rng.standard_normal(o.shape) for o in graph.outputs]
    args = cots + [env[f.key] for f in bw.forward_refs]
    for got, want in zip(GraphExecutor(merged).run(*args), bw.evaluate(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_eliminate_dead_keeps_the_signature():
    W = mc.Parameter(np.ones((3, 3)), name="W")

    def f(x, y):
        return mc.tanh(x), mc.matmul(y, W) * 2.0

    graph = mc.trace(f, mc.spec((3, 3), "float64"), mc.spec((3, 3), "float64"))
    only_first = copy.copy(graph)
    only_first.outputs = graph.outputs[:1]
    pruned = eliminate_dead(only_first)
    assert [n.op.name for n in pruned.op_nodes()] == ["tanh"]
    assert not any(n.kind == "const" for n in pruned.nodes)
    assert pruned.inputs == graph.inputs and pruned.params == graph.params  # W stays bound
    x = np.random.default_rng(0).standard_normal((3, 3))
    np.testing.assert_allclose(pruned.evaluate(x, x)[0], np.tanh(x))
    assert len(graph.op_nodes()) == 3  # the original is untouched


def test_freeze_compares_values_not_identities():
    assert freeze(np.array([1.0, 2.0])) == freeze(np.array([1.0, 2.0]))
    assert freeze(np.array([1.0, 2.0])) != freeze(np.array([1.0, 2.0], dtype=np.float32))
    assert freeze(np.array([np.nan])) == freeze(np.array([np.nan]))  # same bits: same value
    assert freeze(0.0) != freeze(-0.0)
    assert freeze(np.dtype("float32")) == freeze(np.float32)
    assert freeze((1, (2, 3))) == freeze((1, (2, 3))) != freeze((1, (2, 4)))
    assert freeze(1) != freeze(1.0) and freeze(True) != freeze(1)
    thing = object()
    assert freeze(thing) == freeze(thing) and freeze(thing) != freeze(object())
    hash(freeze({"a": [np.zeros(2)], "b": np.float64(1.5)}))


# --- the executor -------------------------------------------------------------------------------

def test_fused_equals_unfused_with_broadcasting_masks_and_casts():
    b = mc.Parameter(np.linspace(-1, 1, H))

    def f(x, y):
        z = mc.tanh(x + b) * mc.sigmoid(y) - mc.where(x > 0, x, 0.5 * x) ** 2
        z = mc.relu(z) + mc.maximum(x, y) / (2.0 + mc.exp(-z * z))
        return (z.astype("float32") * 3).astype("float64") - mc.log(1 + y * y), mc.neg(z)

    graph = mc.trace(f, mc.spec((N, H), "float64"), mc.spec((1, H), "float64"))
    executor = GraphExecutor(graph)
    assert max(len(g) for g in executor.groups) >= 15
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((N, H)), rng.standard_normal((1, H))
    for got, want, plain in zip(executor.run(x, y), graph.evaluate(x, y),
                                GraphExecutor(graph, fuse=False).run(x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-12)  # the float32 detour rounds too
        np.testing.assert_array_equal(plain, want)


def test_kernel_strategies_agree_and_results_survive_later_calls():
    graph, _ = tree_lstm(dtype="float32")
    group = fusion_groups(graph)[1]
    env = graph.run(tree_lstm_inputs("float32"))
    args = [env[x.key] for x in group.inputs]
    want = [env[o.key] for o in group.outputs]
    kernels = [OpByOpKernel(group, np, np.float32)] + [
        NumpyFusedKernel(group, np, np.float32, writers=w)
        for w in (None, {SIGMOID: (sigmoid_tanh_into, True)},
                  {SIGMOID: (sigmoid_expit_into, True)})]
    for k in kernels:
        first = k(*args)
        keep = [a.copy() for a in first]
        second = k(*[a + 1 for a in args])  # a second call must not overwrite the first's results
        for got, w, kept in zip(first, want, keep):
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, w, rtol=2e-6, atol=2e-6)
            np.testing.assert_array_equal(got, kept)
        assert not any(np.shares_memory(a, b) for a in first for b in second)


def test_kernels_are_cached_by_signature():
    graph, _ = tree_lstm()
    group = fusion_groups(graph)[1]
    clone = analysis.FusedGroup(group.members, group.inputs, group.outputs)
    assert make_fused_kernel(group, np, np.float64) is make_fused_kernel(clone, np, np.float64)
    assert make_fused_kernel(group, np, np.float64) is not make_fused_kernel(group, np, np.float32)


def test_sigmoid_in_a_kernel_is_quiet_and_exact_at_the_extremes():
    graph = mc.trace(lambda x: mc.sigmoid(x) * 2.0, mc.spec((4,), "float32"))
    x = np.array([-1000.0, -20.0, 0.0, 1000.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = GraphExecutor(graph).run(x)[0]
    np.testing.assert_allclose(got, 2 * scipy.special.expit(x.astype(np.float64)), rtol=1e-6)
    assert got[1] > 0  # σ(-20) = 2e-9 keeps its relative accuracy (log σ stays finite)


def test_run_steps_on_subsets_with_preallocated_outputs():
    # The vertex runtime's use: eager steps once, then the rest, some outputs into its buffers.
    graph, s = tree_lstm()
    gathers = [s[k] for k in ("h_l", "c_l", "h_r", "c_r")]
    classes = dependency_classes(graph, gathers, [s["scatter"]])
    groups = fusion_groups(graph, classes=classes)
    steps = plan_steps(graph, groups=groups)
    eager = [st for st in steps if all(classes[o] == "eager" for o in st.outputs)]
    core = [st for st in steps if st not in eager]
    inputs = tree_lstm_inputs()
    env = {x.key: a for x, a in zip(graph.inputs, inputs)}
    env.update({p.key: p.value.data for p in graph.params})
    run_steps(eager, env)
    assert s["Wx"].key in env and s["Uh"].key not in env
    h_buf, c_buf, wx_buf = np.empty((N, H)), np.empty((N, H)), np.empty((N, 5 * H))
    run_steps(core, env, outs={s["h"].key: h_buf, s["c"].key: c_buf})
    assert env[s["h"].key] is h_buf and env[s["c"].key] is c_buf
    want = graph.evaluate(*inputs)
    np.testing.assert_allclose(env[s["scatter"].key], want[0], rtol=1e-12)
    np.testing.assert_allclose(h_buf, want[1], rtol=1e-12)
    # An op step writes into a given array too (matmul directly, others by a copy).
    env2 = {x.key: a for x, a in zip(graph.inputs, inputs)}
    env2.update({p.key: p.value.data for p in graph.params})
    run_steps(eager, env2, outs={s["Wx"].key: wx_buf})
    assert env2[s["Wx"].key] is wx_buf
    np.testing.assert_allclose(wx_buf, inputs[0] @ graph.params[0].value.data, rtol=1e-12)
    with pytest.raises(mc.GraphError, match="no value"):
        run_steps(core, {})


# --- drawing ------------------------------------------------------------------------------------

def check_dot_structure(text):
    """Balanced braces, every edge's endpoints declared, every statement terminated."""
    depth = 0
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', text):  # braces inside labels do not count
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    declared = set(re.findall(r"^\s*([A-Za-z_]\w*) \[", text, re.M))
    edges = re.findall(r"^\s*(\w+) -> (\w+);", text, re.M)
    assert edges
    for a, b in edges:
        assert a in declared and b in declared, (a, b)
    return declared, edges


def test_tree_lstm_dot():
    graph, s = tree_lstm(head=True)
    gathers = [s[k] for k in ("h_l", "c_l", "h_r", "c_r")]
    classes = dependency_classes(graph, gathers, [s["scatter"]])
    text = graph.to_dot(classes, fusion_groups(graph, classes=classes))
    declared, edges = check_dot_structure(text)
    assert text.startswith('digraph "cell" {')
    assert text.count("subgraph cluster_fused_") == 2
    assert sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs) == len(edges)
    assert "invhouse" in text and "box3d" in text and "legend" in text
    assert 'fillcolor="#b7e1cd"' in text and 'fillcolor="#f9cb9c"' in text  # eager, lazy
    assert "matmul\\n(3, 20)" in text and "sigmoid\\n(3, 4)" in text
    plain = graph.to_dot()  # the graph alone: no clusters unless the runtime's are given
    check_dot_structure(plain)
    assert "cluster" not in plain
    summary = graph.summary(classes=classes, groups=fusion_groups(graph, classes=classes))
    assert re.search(r"matmul\(%0, %\d+\)\s+\(3, 20\)\s+float64 eager", summary)
    assert re.search(r"sigmoid.*core\s+g1", summary)
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed (apt-get install graphviz); the DOT text "
                    "was checked structurally only")
    result = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "<svg" in result.stdout and "fused kernel 1" in result.stdout


def test_backward_dot_and_symbolic_sizes():
    graph, _ = tree_lstm()
    bw = mc.grad_graph(graph)
    classes = dependency_classes(bw, *backward_sources_and_sinks(bw, graph.inputs[1:], [0]))
    check_dot_structure(bw.to_dot(classes))
    # A task's symbolic sizes print by name in DOT labels and summaries, as in error messages.
    cell = mc.trace(lambda x: mc.reshape(mc.tanh(x), (1_000_003, 2, 2)),
                    mc.spec((1_000_003, 4)))
    assert "tanh\\n(V, 4)" in cell.to_dot() and "shape=(V, 2, 2)" in cell.to_dot()
    assert re.search(r"tanh\(%0\)\s+\(V, 4\)", cell.summary())
