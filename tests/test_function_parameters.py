"""Module.parameters() sees the weights of every function a Module holds (issue 23, class 4):
a function of several kinds (``VertexFunction.by_kind``) and a recursive function
(``mc.recursive``), before its first call too, so optimisers and checkpoints include them."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minicavs as mc
from minicavs.nn import SGD, Module, load_checkpoint, save_checkpoint

H = 3


class Holder(Module):
    def __init__(self, function, **extra):
        self.function = function
        for name, value in extra.items():
            setattr(self, name, value)


def _pool(rng, size, named):
    return [mc.Parameter(rng.standard_normal((H, H)), name=f"w{i}" if n else None)
            for i, n in zip(range(size), named)]


def _kinded(pool, uses):
    """A by_kind function over arities 0..2; kind a's cell multiplies by the pool's Parameters
    ``uses[a]`` (one per use, on its pulled input and its children)."""
    def cell_of(arity, chosen):
        def cell(v):
            h = v.pull()
            for k in range(arity):
                h = h + v.gather(k)
            for i in chosen:
                h = mc.tanh(h @ pool[i])
            v.scatter(h)
        return cell

    return mc.VertexFunction.by_kind({a: cell_of(a, chosen) for a, chosen in uses.items()},
                                     by="arity", pull_shape=(H,), scatter_shape=(H,),
                                     dtype="float64")


@settings(max_examples=25, deadline=None)
@given(size=st.integers(1, 5), named=st.lists(st.booleans(), min_size=5, max_size=5),
       uses=st.dictionaries(st.integers(0, 2), st.lists(st.integers(0, 4), max_size=3),
                            min_size=1), seed=st.integers(0, 9))
def test_the_parameters_of_every_kind_are_the_module_s(size, named, uses, seed):
    rng = np.random.default_rng(seed)
    pool = _pool(rng, size, named)
    uses = {a: [i % size for i in chosen] for a, chosen in uses.items()}
    uses.setdefault(0, [])  # leaves have a kind
    model = Holder(_kinded(pool, uses))
    used = {id(pool[i]) for chosen in uses.values() for i in chosen}
    names = [name for name, _ in model.named_parameters()]
    assert {id(p) for p in model.parameters()} == used
    assert len(names) == len(set(names)) == len(used)  # each once, names unique
    state = model.state_dict()
    assert set(state) == set(names)
    for p in model.parameters():  # a checkpoint restores every one of them
        p.data[...] = 0
    model.load_state_dict(state)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), state[name])


def test_an_optimiser_of_the_module_trains_the_kinds_weights():
    rng = np.random.default_rng(0)
    pool = _pool(rng, 2, [True, False])
    model = Holder(_kinded(pool, {0: [0], 2: [1]}))
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1]])])
    before = [p.numpy().copy() for p in pool]
    optimizer = SGD(model.parameters(), lr=0.1)
    model.function(batch, pull=mc.tensor(rng.standard_normal((3, H)))).sum().backward()
    optimizer.step()
    assert all(not np.array_equal(b, p.numpy()) for b, p in zip(before, pool))


def _recursive(table, W, b, extra=None):
    @mc.recursive(scatter_shape=(H,), pull_shape=(1,), pull_dtype="int64", dtype="float64")
    def tree(node):
        if node.is_leaf:
            return mc.reshape(mc.embedding(table, node.pull()), (H,))
        h = mc.concat([tree(c) for c in node.children]) @ W[node.arity - 1] + b
        return mc.tanh(h @ extra.weight) if extra is not None else mc.tanh(h)
    return tree


@settings(max_examples=15, deadline=None)
@given(arities=st.lists(st.integers(1, 2), min_size=1, max_size=3), named=st.booleans(),
       seed=st.integers(0, 9))
def test_a_recursive_function_s_weights_are_known_before_its_first_call(arities, named, seed):
    rng = np.random.default_rng(seed)
    table = mc.Parameter(rng.standard_normal((5, H)), name="table" if named else None)
    W = [mc.Parameter(rng.standard_normal((k * H, H))) for k in (1, 2)]  # one per arity
    b = mc.Parameter(np.zeros(H), name="b" if named else None)
    model = Holder(_recursive(table, W, b))
    before = list(model.named_parameters())
    assert {id(p) for _, p in before} == {id(table), id(b), *map(id, W)}
    assert sorted(n for n, _ in before) == ["function.W.0", "function.W.1", "function.b",
                                            "function.table"]  # the variables' names
    children = [[]]  # a chain of the drawn arities, leaves padding the rest
    for arity in arities:
        leaves = list(range(len(children), len(children) + arity - 1))
        children += [[] for _ in leaves]
        children.append([len(children) - len(leaves) - 1] + leaves)
    graph = mc.InputGraph(children)
    ids = mc.tensor(rng.integers(0, 5, (len(children), 1)))
    model.function(graph, pull=ids).sum().backward()
    after = list(model.named_parameters())
    assert [(n, id(p)) for n, p in after] == [(n, id(p)) for n, p in before]  # same names


def test_a_checkpoint_saved_before_the_first_call_loads_after_it(tmp_path):
    rng = np.random.default_rng(0)
    table, b = mc.Parameter(rng.standard_normal((5, H))), mc.Parameter(np.zeros(H))
    W = [mc.Parameter(rng.standard_normal((k * H, H))) for k in (1, 2)]
    model = Holder(_recursive(table, W, b))
    save_checkpoint(tmp_path / "fresh.npz", model)
    model.function(mc.InputGraph([[], [], [0, 1]]), pull=mc.tensor(np.zeros((3, 1), np.int64)))
    saved = table.numpy().copy()
    table.data[...] = 7
    load_checkpoint(tmp_path / "fresh.npz", model)
    np.testing.assert_array_equal(table.numpy(), saved)


def test_a_weight_reached_through_an_attribute_joins_once_traced():
    rng = np.random.default_rng(0)
    table, b = mc.Parameter(rng.standard_normal((5, H))), mc.Parameter(np.zeros(H))
    W = [mc.Parameter(rng.standard_normal((k * H, H))) for k in (1, 2)]
    extra = mc.nn.Linear(H, H, dtype="float64")  # read as extra.weight: an attribute

    model = Holder(_recursive(table, W, b, extra=extra))
    assert id(extra.weight) not in {id(p) for p in model.parameters()}  # not knowable yet
    model.function(mc.InputGraph([[], [], [0, 1]]), pull=mc.tensor(np.zeros((3, 1), np.int64)))
    names = dict((id(p), n) for n, p in model.named_parameters())
    assert names[id(extra.weight)] == "function.p3"  # after table, W.1 and b, in trace order
    held = dict(Holder(model.function, extra=extra).named_parameters())
    assert held["extra.weight"] is extra.weight  # held by the Module: its own name, once
    assert [id(p) for p in held.values()].count(id(extra.weight)) == 1


@pytest.mark.parametrize("named", [True, False])
def test_two_kinds_capturing_different_unnamed_weights_keep_both(named):
    rng = np.random.default_rng(0)
    A = mc.Parameter(rng.standard_normal((H, H)), name="A" if named else None)
    B = mc.Parameter(rng.standard_normal((H, H)), name="A" if named else None)  # same name
    F = mc.VertexFunction.by_kind({"leaf": lambda v: v.scatter(mc.tanh(v.pull() @ A)),
                                   "internal": lambda v: v.scatter(mc.tanh(v.gather(0) @ B))},
                                  by="leaf", pull_shape=(H,), scatter_shape=(H,), arity=1,
                                  dtype="float64")
    params = dict(Holder(F).named_parameters())
    assert [id(p) for p in params.values()] == [id(A), id(B)]
    assert list(params) == (["function.A", "function.A_1"] if named else
                            ["function.leaf.p0", "function.internal.p0"])
