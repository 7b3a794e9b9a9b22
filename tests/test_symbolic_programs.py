"""Symbolic graphs compute what eager Tensors compute: random programs and a Fixed-LSTM.

Every way of running a traced graph — ``graph.evaluate``, ``GraphExecutor`` fused and unfused,
``mc.symbolic`` as a differentiable op, and the backward graph from ``grad_graph`` — must give the
values and gradients of the same code run eagerly. So must the graphs rewritten by common
subexpression merging and dead-node elimination.
"""

import threading

import numpy as np
from hypothesis import given, strategies as st

import minicavs as mc
from minicavs.runtime import analysis
from graph_executor import GraphExecutor

from symbolic_programs import arrays_for, interpret, programs
from threads import run_in_threads

RTOL, ATOL = 1e-9, 1e-10


def close(actual, expected, what):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=RTOL, atol=ATOL,
                               err_msg=what)


def eager_run(program, input_arrays, param_arrays, cotangents):
    """Values and gradients (inputs, then params; zeros where no gradient) of the eager run."""
    inputs = [mc.tensor(a, requires_grad=True) for a in input_arrays]
    params = [mc.Parameter(p) for p in param_arrays]
    outs = interpret(program, inputs, params)
    loss = sum((o * c).sum() for o, c in zip(outs, cotangents))
    loss.backward()
    grads = [t.grad.numpy() if t.grad is not None else np.zeros(t.shape) for t in inputs + params]
    return [o.numpy() for o in outs], grads


def grads_from_backward_graph(graph, bw, executor_env, cotangents, fuse, params):
    """Gradients of the inputs, then of ``params`` (the Tensors the program closes over; zeros
    for one the graph does not use), from ∂graph run on the forward environment."""
    refs = [executor_env[f.key] for f in bw.forward_refs]
    values = GraphExecutor(bw, fuse=fuse).run(*cotangents, *refs) if fuse is not None \
        else bw.evaluate(*cotangents, *refs)
    by_symbol = {id(s): v for s, v in zip(bw.grad_of, values)}
    by_tensor = {id(s.value): by_symbol[id(s)] for s in graph.params}
    return ([by_symbol[id(s)] for s in graph.inputs]
            + [by_tensor.get(id(p), np.zeros(p.shape)) for p in params])


@given(program=programs(), data=st.data())
def test_random_program_values_and_gradients_match_eager(program, data):
    input_shapes, param_shapes, _, _ = program
    input_arrays = arrays_for(data, input_shapes)
    param_arrays = arrays_for(data, param_shapes)
    params = [mc.Parameter(p) for p in param_arrays]

    def fn(*xs):
        outs = interpret(program, xs, params)
        return outs[0] if len(outs) == 1 else tuple(outs)

    specs = [mc.spec(s, "float64") for s in input_shapes]
    graph = mc.trace(fn, *specs)
    out_shapes = [o.shape for o in graph.outputs]
    cotangents = arrays_for(data, out_shapes, bound=1.0)
    expected_values, expected_grads = eager_run(program, input_arrays, param_arrays, cotangents)

    # Forward values: evaluate, executor fused and unfused.
    for how, values in [("evaluate", graph.evaluate(*input_arrays)),
                        ("fused", GraphExecutor(graph, fuse=True).run(*input_arrays)),
                        ("unfused", GraphExecutor(graph, fuse=False).run(*input_arrays))]:
        for k, (v, e) in enumerate(zip(values, expected_values)):
            close(v, e, f"{how}: output {k}\n{graph.summary()}")

    # Gradients through ∂graph, plain and run by the executor.
    bw = mc.grad_graph(graph)
    env = graph.run(input_arrays)
    for fuse in (None, True, False):
        grads = grads_from_backward_graph(graph, bw, env, cotangents, fuse, params)
        for k, (g, e) in enumerate(zip(grads, expected_grads)):
            close(g, e, f"∂graph (fuse={fuse}): gradient {k}\n{bw.summary()}")

    # The rewritten graphs compute the same.
    for rewrite in (analysis.merge_common_subexpressions, analysis.eliminate_dead):
        values = GraphExecutor(rewrite(graph)).run(*input_arrays)
        for k, (v, e) in enumerate(zip(values, expected_values)):
            close(v, e, f"{rewrite.__name__}: output {k}")
    merged_bw = analysis.merge_common_subexpressions(bw)
    grads = grads_from_backward_graph(graph, merged_bw, env, cotangents, True, params)
    for k, (g, e) in enumerate(zip(grads, expected_grads)):
        close(g, e, f"CSE(∂graph): gradient {k}")


@given(program=programs(max_steps=5), data=st.data())
def test_static_function_backward_matches_eager(program, data):
    input_shapes, param_shapes, _, _ = program
    input_arrays = arrays_for(data, input_shapes)
    param_arrays = arrays_for(data, param_shapes)
    params = [mc.Parameter(p) for p in param_arrays]

    def fn(*xs):
        outs = interpret(program, xs, params)
        return outs[0] if len(outs) == 1 else tuple(outs)

    static = mc.symbolic(fn, *[mc.spec(s, "float64") for s in input_shapes])
    inputs = [mc.tensor(a, requires_grad=True) for a in input_arrays]
    outs = static(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    cotangents = arrays_for(data, [o.shape for o in outs], bound=1.0)
    sum((o * c).sum() for o, c in zip(outs, cotangents)).backward()
    expected_values, expected_grads = eager_run(program, input_arrays, param_arrays, cotangents)
    for k, (o, e) in enumerate(zip(outs, expected_values)):
        close(o.numpy(), e, f"static function: output {k}")
    for k, (t, e) in enumerate(zip(inputs + params, expected_grads)):
        got = t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
        close(got, e, f"static function: gradient {k}")


# --- a static Fixed-LSTM ------------------------------------------------------------------------

def _lstm_params(rng, E, H):
    return (mc.Parameter(rng.standard_normal((E, 4 * H)) * 0.5, name="Wx"),
            mc.Parameter(rng.standard_normal((H, 4 * H)) * 0.5, name="Wh"),
            mc.Parameter(rng.standard_normal(4 * H) * 0.1, name="b"))


def _lstm(xs, h, c, Wx, Wh, b):
    """A Fixed-LSTM over the steps ``xs``; returns every h (concatenated) and the last c."""
    hs = []
    for x in xs:
        h, c = mc.lstm_gates(mc.matmul(x, Wx) + mc.matmul(h, Wh) + b, c)
        hs.append(h)
    return mc.concat(hs, axis=-1), c


def test_fixed_lstm_symbolic_equals_eager():
    rng = np.random.default_rng(1)
    T, B, E, H = 3, 2, 3, 4
    Wx, Wh, b = _lstm_params(rng, E, H)
    x_arrays = [rng.standard_normal((B, E)) for _ in range(T)]
    h0, c0 = rng.standard_normal((B, H)), rng.standard_normal((B, H))
    g_hs, g_c = rng.standard_normal((B, T * H)), rng.standard_normal((B, H))

    def unrolled(x0, x1, x2, h, c):
        return _lstm([x0, x1, x2], h, c, Wx, Wh, b)

    # Eager.
    xs = [mc.tensor(a, requires_grad=True) for a in x_arrays]
    h, c = mc.tensor(h0, requires_grad=True), mc.tensor(c0, requires_grad=True)
    hs, c_last = _lstm(xs, h, c, Wx, Wh, b)
    ((hs * g_hs).sum() + (c_last * g_c).sum()).backward()
    expected = [t.grad.numpy() for t in xs + [h, c, Wx, Wh, b]]
    expected_values = [hs.numpy(), c_last.numpy()]
    for p in (Wx, Wh, b):
        p.zero_grad()

    # Static: the same code traced once.
    static = mc.symbolic(unrolled, *[mc.spec((B, E), "float64")] * T,
                         mc.spec((B, H), "float64"), mc.spec((B, H), "float64"))
    assert len(static.graph.params) == 3  # Wx, Wh, b captured by closure, each once
    xs2 = [mc.tensor(a, requires_grad=True) for a in x_arrays]
    h2, c2 = mc.tensor(h0, requires_grad=True), mc.tensor(c0, requires_grad=True)
    hs2, c_last2 = static(*xs2, h2, c2)
    ((hs2 * g_hs).sum() + (c_last2 * g_c).sum()).backward()
    close(hs2.numpy(), expected_values[0], "every h")
    close(c_last2.numpy(), expected_values[1], "last c")
    for k, (t, e) in enumerate(zip(xs2 + [h2, c2, Wx, Wh, b], expected)):
        close(t.grad.numpy(), e, f"gradient {k}")

    # The executor, fused, on the graph and on ∂graph; the T cells share one fused kernel.
    graph = static.graph
    inputs = x_arrays + [h0, c0]
    executor = GraphExecutor(graph)
    for v, e in zip(executor.run(*inputs), expected_values):
        close(v, e, "executor")
    cell_groups = [g for g in executor.groups if len(g) == 9]  # σ tanh ⊙ σ ⊙ + σ tanh ⊙
    assert len(cell_groups) == T
    assert len({g.signature() for g in cell_groups}) == 1
    bw = static.backward_graph  # derived from the compiled (rewritten) forward graph
    env = static.program.graph.run(inputs)
    grads = grads_from_backward_graph(graph, bw, env, [g_hs, g_c], True, [Wx, Wh, b])
    for k, (g, e) in enumerate(zip(grads, expected)):
        close(g, e, f"∂graph gradient {k}")


def test_static_function_runs_fused_on_the_interpreter_and_differentiates_twice():
    """mc.symbolic compiles its graph to a Program (fused groups, no levels); its gradient with
    create_graph=True is itself differentiable, equal to the eager second derivative."""
    rng = np.random.default_rng(5)
    W = mc.Parameter(rng.standard_normal((4, 4)) * 0.5)

    def cell(x):
        return mc.sigmoid(x @ W) * mc.tanh(x) + x * x

    static = mc.symbolic(cell, mc.spec((3, 4), "float64"))
    assert any(type(ins.step).__name__ == "GroupStep" for ins in static.program.eager)
    assert not static.program.core and not static.program.lazy
    x0 = rng.standard_normal((3, 4))
    results = []
    for f in (cell, static):
        x = mc.tensor(x0, requires_grad=True)
        f(x).sum().backward(create_graph=True)
        g = x.grad
        x.grad = None
        W.grad = None
        (g * g).sum().backward()  # d/dx of |∂f/∂x|²: needs the second derivative
        results.append((g.numpy(), x.grad.numpy(), W.grad.numpy()))
    for got, want, what in zip(results[1], results[0], ["gradient", "x second", "W second"]):
        close(got, want, what)


# --- tracing in one thread, other code in another ---------------------------------------------

def _cell_waiting_for(event_or_barrier, U):
    """A cell whose tracing stops in the middle until ``event_or_barrier`` lets it go on."""
    def cell(v):
        h = v.pull() @ U
        event_or_barrier.wait()  # (a Barrier: both traces are active together)
        v.scatter(mc.tanh(h))
    return cell


def _leaf_call(cell, x):
    F = mc.VertexFunction(cell, pull_shape=(2,), scatter_shape=(2,), arity=0, name="waits")
    return F(mc.GraphBatch([mc.InputGraph([[]])]), pull=mc.tensor(x)).numpy()


def test_a_trace_records_only_its_own_threads_ops():
    """While one thread traces a cell, another thread's eager code on parameters computes as
    it would alone: a single stack of tracers for the process recorded it into the other
    thread's graph, and handed it a Symbol."""
    W = mc.Parameter(np.array([[1.0, 2.0], [3.0, 4.0]]))
    U = mc.Parameter(np.array([[0.5, -1.0], [0.25, 2.0]]))
    x = np.array([[1.0, -1.0]])
    tracing, eager_done, seen = threading.Event(), threading.Event(), {}

    class Midway:  # the cell tells the eager thread it is tracing, then waits for it
        def wait(self):
            tracing.set()
            eager_done.wait(10)

    def trace():
        seen["F"] = _leaf_call(_cell_waiting_for(Midway(), U), x)

    def eager():
        tracing.wait(10)
        y = mc.tensor(x) @ W
        seen["eager"] = (type(y).__name__, y.numpy().tolist())
        eager_done.set()

    run_in_threads(lambda k: (trace, eager)[k](), 2)
    assert seen["eager"] == ("Tensor", (x @ W.numpy()).tolist())
    np.testing.assert_allclose(seen["F"], np.tanh(x @ U.numpy()), rtol=1e-12)


def test_two_threads_trace_at_once():
    """Two cells traced together, each in its thread, each becomes its own graph (the shared
    stack let the first trace to end remove the other's tracer: the other's next op failed)."""
    U = [mc.Parameter(np.array([[0.5, -1.0], [0.25, 2.0]]) * (k + 1)) for k in range(2)]
    x = np.array([[1.0, -1.0]])
    both, seen = threading.Barrier(2, timeout=10), {}

    def trace(k):
        seen[k] = _leaf_call(_cell_waiting_for(both, U[k]), x)

    run_in_threads(trace, 2)
    for k in range(2):
        np.testing.assert_allclose(seen[k], np.tanh(x @ U[k].numpy()), rtol=1e-12)
