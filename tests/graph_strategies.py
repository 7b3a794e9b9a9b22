"""Hypothesis strategies for input graphs: trees, chains and DAGs with bounded arity."""

from hypothesis import strategies as st

import minicavs as mc


@st.composite
def input_graph(draw, max_arity=2, max_vertices=24, kinds=("tree", "chain", "dag")):
    """An acyclic graph whose vertices have at most ``max_arity`` children.

    Children are numbered below their parents (so it is acyclic); for "dag", a vertex may be
    the child of several parents; the vertex ids are then shuffled so that the runtime cannot
    rely on any numbering.
    """
    kind = draw(st.sampled_from(kinds if max_arity > 0 else ("isolated",)))
    if kind == "chain" and max_arity >= 1:
        n = draw(st.integers(1, 40))  # depth up to 40
        children = [[]] + [[i - 1] for i in range(1, n)]
    elif kind == "isolated":
        children = [[] for _ in range(draw(st.integers(1, 6)))]
    else:
        n = draw(st.integers(1, max_vertices))
        children = [[] for _ in range(n)]
        has_parent = [False] * n
        for v in range(1, n):
            k = draw(st.integers(0, max_arity))
            pool = list(range(v)) if kind == "dag" else [u for u in range(v) if not has_parent[u]]
            if not pool or k == 0:
                continue
            picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=k, unique=True))
            children[v] = picked
            for u in picked:
                has_parent[u] = True
    perm = draw(st.permutations(range(len(children))))
    inverse = {old: new for new, old in enumerate(perm)}
    relabelled = [None] * len(children)
    for old, kids in enumerate(children):
        relabelled[inverse[old]] = [inverse[c] for c in kids]
    return mc.InputGraph(relabelled)


def forests(max_arity=2, max_graphs=32, **kwargs):
    return st.lists(input_graph(max_arity=max_arity, **kwargs), min_size=1, max_size=max_graphs)
