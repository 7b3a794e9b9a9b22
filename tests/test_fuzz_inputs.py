"""Fuzzing the entry points of the vertex runtime with malformed graph specifications and
vertex-function arguments: each input must give a minicavs error or the right result (the
per-sample reference's), never a raw Python or NumPy error, a hang or a wrong answer.

Each example starts from a valid input and, half of the time, breaks one thing in it, so that
both the checks and the accepted inputs' results are exercised."""

import numpy as np
from hypothesis import event, given, strategies as st

import minicavs as mc
from minicavs.vertex import evaluate_per_sample

# --- graph specifications ----------------------------------------------------------------------

BAD_CHILDREN = [2**70, -2**70, -1, 99, 0.5, None, "0", True, [0], np.float32(1), np.int64(-5)]
BAD_CHILD_LISTS = [None, 3, "01", {0: 1}, np.array([0.5]), np.zeros((1, 1), np.int64)]
BAD_SPECS = [None, 7, "abc", {}, [], np.zeros((2, 2))]


@st.composite
def graph_spec(draw):
    """(children, what was broken): a DAG's child lists with at most one thing wrong."""
    n = draw(st.integers(1, 7))
    children = [sorted(draw(st.sets(st.integers(0, v - 1), max_size=min(v, 3)))) if v else []
                for v in range(n)]
    broken = draw(st.sampled_from(["nothing"] * 4 + ["child", "list", "spec", "cycle"]))
    v = draw(st.integers(0, n - 1))
    if broken == "child":
        children[v] = children[v] + [draw(st.sampled_from(BAD_CHILDREN))]
    elif broken == "list":
        children[v] = draw(st.sampled_from(BAD_CHILD_LISTS))
    elif broken == "cycle":
        children[v] = children[v] + [draw(st.integers(v, n - 1))]  # itself or a later vertex
    elif broken == "spec":
        children = draw(st.sampled_from(BAD_SPECS))
    if broken != "spec" and draw(st.booleans()):
        children = [tuple(c) if isinstance(c, list) else c for c in children]
    return children, broken


@given(graph_spec(), st.integers(0, 9))
def test_malformed_graph_specifications(spec_and_break, sample):
    spec, broken = spec_and_break
    try:
        graph = mc.InputGraph(spec, sample=sample)
    except mc.MinicavsError as exc:
        event(f"refused ({broken})")
        assert str(exc)
        return
    event(f"accepted ({broken})")
    # Accepted: a well-formed DAG numbered as given, whose levels the batch computes.
    children = [[int(c) for c in kids] for kids in spec]
    assert graph.num_vertices == len(children)
    assert [graph.children(v) for v in range(len(children))] == children
    batch = mc.GraphBatch([graph, graph])
    level = batch.level[:len(children)]
    for v, kids in enumerate(children):
        assert level[v] == (1 + max(level[c] for c in kids) if kids else 0)


# --- vertex-function arguments -------------------------------------------------------------------

BAD_ARGUMENTS = {
    "scatter_shape": [(0,), (-1,), (2, 0), "4", (2.5,), None, 2**40],
    "pull_shape": [(0,), (-3,), "x", (1.0,)],
    "arity": [-1, 1.5, "2", True, -2**70],
    "dtype": ["int64", "bool", "str", object, "nope", "complex64"],
    "pull_dtype": ["str", object, "nope", "complex128"],
    "options": [{"bogus": 1}, {"fuse": 1}, [], "x"],
    "pull": ["short", "dtype", "strings", "none", "ragged"],
}


@st.composite
def vertex_function_case(draw):
    """Arguments of a small cell (k-ary or child-sum, pushing or not) and a pulled input,
    with at most one of them wrong."""
    case = {"scatter_shape": (draw(st.integers(1, 3)),), "pull_shape": None,
            "arity": draw(st.integers(0, 3)), "dtype": draw(st.sampled_from(["float32",
                                                                               "float64"])),
            "pull_dtype": None, "options": draw(st.sampled_from([None, {"fuse": False},
                                                                 {"zero_rows": False}])),
            "pull": "right"}
    case["pull_shape"] = case["scatter_shape"]
    case["children"] = draw(st.sampled_from(["gather", "gather_sum"]))
    case["push"] = draw(st.booleans())
    broken = draw(st.sampled_from(["nothing"] * 7 + sorted(BAD_ARGUMENTS)))
    if broken != "nothing":
        case[broken] = draw(st.sampled_from(BAD_ARGUMENTS[broken]))
    return case, broken


def _pull(F, batch, kind, rng):
    shape = (batch.num_vertices,) + F.pull_shape
    if kind == "right":
        return mc.tensor(rng.standard_normal(shape).astype(F.pull_dtype), requires_grad=True)
    return {"short": lambda: np.zeros((shape[0] - 1,) + shape[1:], F.pull_dtype),
            "dtype": lambda: np.zeros(shape, np.float16),
            "strings": lambda: np.full(shape, "a"),
            "none": lambda: None,
            "ragged": lambda: [[0.0]] + [[0.0, 1.0]] * max(shape[0] - 1, 1)}[kind]()


def _gradients(result, leaves):
    for t in leaves:
        t.grad = None
    mc.sum(result * result).backward()
    return [t.grad.numpy() if t.grad is not None else np.zeros(t.shape) for t in leaves]


@given(st.lists(st.integers(1, 7), min_size=1, max_size=4), vertex_function_case(),
       st.integers(0, 2**16))
def test_vertex_function_arguments(sizes, case_and_break, seed):
    case, broken = case_and_break
    rng = np.random.default_rng(seed)
    arity = case["arity"] if isinstance(case["arity"], int) and case["arity"] >= 0 else 1
    graphs = [mc.InputGraph([list(range(max(0, v - arity), v)) for v in range(n)])
              for n in sizes]  # vertex v's children: the (up to) arity vertices before it
    H = case["scatter_shape"][0] if isinstance(case["scatter_shape"], tuple) and \
        len(case["scatter_shape"]) == 1 and isinstance(case["scatter_shape"][0], int) and \
        case["scatter_shape"][0] > 0 else 2
    dtype = case["dtype"] if case["dtype"] in ("float32", "float64") else "float32"
    W = mc.Parameter(rng.standard_normal((H, H)).astype(dtype) * 0.5, name="W")

    def cell(v):
        h = v.pull() @ W
        if case["children"] == "gather_sum":
            h = h + v.gather_sum(lambda c: c * c)
        else:
            for k in range(min(arity, 3)):
                h = h + v.gather(k)
        v.scatter(mc.tanh(h))
        if case["push"]:
            v.push(mc.tanh(h) @ W + h)

    try:
        F = mc.VertexFunction(cell, **{k: case[k] for k in ("scatter_shape", "pull_shape",
                                                            "arity", "dtype", "pull_dtype",
                                                            "options")})
        batch = mc.GraphBatch(graphs)
        pull = _pull(F, batch, case["pull"], rng)
        out = F(batch, pull=pull)
    except mc.MinicavsError as exc:
        event(f"refused ({broken})")
        assert str(exc)
        return
    event(f"accepted ({broken})")
    assert broken == "nothing", f"accepted a wrong {broken}: {case[broken]!r}"
    reference = evaluate_per_sample(F, batch, pull)
    tolerance = 1e-9 if F.dtype == np.float64 else 1e-4
    np.testing.assert_allclose(out.numpy(), reference.numpy(), rtol=tolerance, atol=tolerance)
    for got, want in zip(_gradients(out, [W, pull]), _gradients(reference, [W, pull])):
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
