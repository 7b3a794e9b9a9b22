"""How fast can a fused elementwise group run on the CPU? (the measurement behind
``minicavs/runtime/executor.py``'s choice of :class:`NumpyFusedKernel`).

The groups are the real ones the fusion pass finds in the binary Tree-LSTM cell (Cavs Fig. 4):
``F``: σ/tanh/⊙/+ on the five gate slices and c_l, c_r (12 ops, 7 inputs, 2 outputs);
``dF``: the core elementwise chain of ∂F (gradients through the gates; 20-odd ops). They are
run on (N, H) float32 rows, N in {16, 64, 512}, H in {128, 256}, with the inputs laid out as the
graph produces them (the gate slices are strided views). Every strategy implements the executor's
``FusedKernel`` interface, so each is a drop-in:

  op-by-op        each op's own forward, allocating every result (sigmoid: scipy expit)
  alloc-fastsig   the same but sigmoid as 1/(1+exp(-x)) ufuncs (separates the two effects)
  out=/exp        NumpyFusedKernel: ufuncs with out= into reused buffers, sigmoid via exp [chosen]
  out=/tanh       the same, sigmoid as (tanh(x/2)+1)/2
  out=/expit      the same, sigmoid by scipy.special.expit
  out=/blocked    out=/exp run on row blocks of ~16K elements (cache locality)
  numexpr-1t/2t   numexpr.evaluate per output, 1 and 2 threads (if numexpr is installed)
  numba           a generated @njit(fastmath) double loop (if numba is installed)

Run ``python benchmarks/fusion_cpu.py`` (``--quick`` for fewer repeats; ``--json FILE`` to save).
Times are the best of several repeats, in µs per call; the machine's other load adds noise, so
compare within a row. One run on the 2-core development machine (numpy 2.4.6, scipy 1.17.1,
numexpr 2.14.2, numba 0.68.1), µs per call:

  grp ops   N    H   op-by-op  alloc-fastsig  out=/exp  out=/tanh  out=/expit  blocked  numexpr-1t  numba
  F    12   16  128      46.0       35.1        34.3      34.8       49.8       72.2     159.9     146.1
  dF   16   16  128      22.6       23.9        18.3      18.1       18.3       52.9      93.0      46.9
  F    12   64  256     267.0      146.7       115.2     101.2      266.4      261.1    1346.0    1105.1
  dF   16   64  256      81.5       83.0        55.8      66.7       73.4       97.5     299.9      97.1
  F    12  512  256    2171.8     1031.6      1089.8     810.2     2130.5     1091.6    6946.0    8660.9
  dF   16  512  256     835.1      847.0       640.8     645.6      626.6      718.1    2305.7     627.8

The executor keeps out=/exp: out=/tanh is up to ~15-25% faster on F at the largest size but
rounds σ(x) to 0 for x < -17 in float32 (so log σ(x) becomes -inf), and the exp form is the op's
own C expression, which the CUDA kernels compute too.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minicavs as mc  # noqa: E402
from minicavs.runtime.analysis import (backward_sources_and_sinks, dependency_classes,  # noqa: E402
                                        fusion_groups)
from minicavs.runtime.executor import (FusedKernel, NumpyFusedKernel,  # noqa: E402
                                        OpByOpKernel, make_fused_kernel, sigmoid_expit_into,
                                        sigmoid_tanh_into)
from minicavs.ops.elementwise import SIGMOID  # noqa: E402


# --- the groups -----------------------------------------------------------------------------------

def tree_lstm_groups(n, h, dtype=np.float32, seed=0):
    """The fused groups of the Tree-LSTM F and ∂F for a task of n vertices, with input arrays."""
    rng = np.random.default_rng(seed)
    W = mc.Parameter((rng.standard_normal((h, 5 * h)) / np.sqrt(h)).astype(dtype))
    U = mc.Parameter((rng.standard_normal((2 * h, 5 * h)) / np.sqrt(2 * h)).astype(dtype))
    b = mc.Parameter(np.zeros(5 * h, dtype))

    def cell(x, h_l, c_l, h_r, c_r):
        gates = mc.matmul(x, W) + mc.matmul(mc.concat([h_l, h_r]), U) + b
        i, f_l, f_r, o, u = mc.split(gates, 5)
        c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f_l) * c_l + mc.sigmoid(f_r) * c_r
        return mc.concat([mc.sigmoid(o) * mc.tanh(c), c])

    specs = [mc.spec((n, h), dtype)] * 5
    graph = mc.trace(cell, *specs)
    bw = mc.grad_graph(graph)
    inputs = [rng.standard_normal((n, h)).astype(dtype) for _ in range(5)]
    env = graph.run(inputs)
    f_group = max(fusion_groups(graph, keep=bw.forward_refs), key=len)
    classes = dependency_classes(bw, *backward_sources_and_sinks(bw, graph.inputs[1:], [0]))
    cot = rng.standard_normal(graph.outputs[0].shape).astype(dtype)
    bw_env = bw.run([cot] + [env[id(r)] for r in bw.forward_refs])
    core = [g for g in fusion_groups(bw, classes=classes) if classes[g.members[0]] == "core"]
    b_group = max(core, key=len)
    return {"F": (f_group, [env[id(x)] for x in f_group.inputs]),
            "dF": (b_group, [bw_env[id(x)] for x in b_group.inputs])}


# --- the contenders (all FusedKernel objects) ----------------------------------------------------

class AllocFastSigmoidKernel(FusedKernel):
    """Op by op, allocating, but with the fast sigmoid: isolates the effect of out=."""

    def __call__(self, *inputs, outs=None):
        values = list(inputs)
        with np.errstate(over="ignore"):
            for op, attrs, args in self.body:
                a = [values[k] for k in args]
                if op is SIGMOID:
                    one = a[0].dtype.type(1)
                    values.append(one / (one + np.exp(-a[0])))
                else:
                    values.append(op.forward(np, *a, **attrs))
        return tuple(values[s] for s in self.output_slots)


class BlockedKernel(FusedKernel):
    """NumpyFusedKernel on blocks of rows: inputs with the full leading axis are sliced, the
    rest (broadcast) passed whole, and each block writes into its rows of the outputs."""

    def __init__(self, group, xp, dtype, block_elements=16384):
        super().__init__(group, xp, dtype)
        self.inner = NumpyFusedKernel(group, xp, dtype)
        self.block_elements = block_elements
        self.output_ndims = [len(group.members[s - self.n_inputs].shape)
                             for s in self.output_slots]

    def __call__(self, *inputs, outs=None):
        full = self.inner(*[a[:1] if np.ndim(a) == 2 else a for a in inputs])  # shapes, dtypes
        n = max(a.shape[0] for a in inputs if np.ndim(a) == 2)
        results = [np.empty((n,) + f.shape[1:], f.dtype) for f in full]
        width = int(np.prod(results[0].shape[1:]))
        rows = max(1, self.block_elements // max(width, 1))
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            self.inner(*[a[r0:r1] if np.ndim(a) == 2 and a.shape[0] == n else a
                         for a in inputs], outs=[r[r0:r1] for r in results])
        return tuple(results)


_NUMEXPR = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
            "div": "({0} / {1})", "neg": "(-{0})", "exp": "exp({0})", "log": "log({0})",
            "tanh": "tanh({0})", "sigmoid": "(one / (one + exp(-{0})))"}


class NumexprKernel(FusedKernel):
    """One numexpr.evaluate per group output; intermediates are inlined into the expression,
    earlier outputs are referred to by name."""

    def __init__(self, group, xp, dtype, threads=1):
        super().__init__(group, xp, dtype)
        import numexpr

        self.numexpr = numexpr
        self.threads = threads
        n = self.n_inputs
        text = {k: f"in{k}" for k in range(n)}
        outputs = set(self.output_slots)
        self.programs = []  # (expression, output position)
        for j, (op, attrs, args) in enumerate(self.body):
            if op.name not in _NUMEXPR:
                raise NotImplementedError(f"numexpr kernel: no template for {op.name}")
            expr = _NUMEXPR[op.name].format(*[text[a] for a in args])
            slot = n + j
            if slot in outputs:
                position = self.output_slots.index(slot)
                self.programs.append((expr, position))
                text[slot] = f"out{position}"
            else:
                text[slot] = expr

    def __call__(self, *inputs, outs=None):
        self.numexpr.set_num_threads(self.threads)
        local = {f"in{k}": a for k, a in enumerate(inputs)}
        local["one"] = self.dtype.type(1)
        results = [None] * len(self.output_slots)
        for expr, position in self.programs:
            results[position] = self.numexpr.evaluate(expr, local_dict=local)
            local[f"out{position}"] = results[position]
        return tuple(results)


_C_LIKE = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
           "div": "({0} / {1})", "neg": "(-{0})", "exp": "np.exp({0})", "log": "np.log({0})",
           "tanh": "np.tanh({0})", "sigmoid": "(one / (one + np.exp(-{0})))"}


class NumbaKernel(FusedKernel):
    """A generated @njit(fastmath=True) loop over the rows and columns of 2-D outputs; 0-d
    inputs (the constant 1 of ∂σ) come in as scalars."""

    def __init__(self, group, xp, dtype):
        super().__init__(group, xp, dtype)
        import numba

        n = self.n_inputs
        self.scalar = [len(x.shape) == 0 for x in group.inputs]
        params = [f"in{k}" for k in range(n)] + [f"out{p}" for p in range(len(self.output_slots))]
        lines = [f"def kernel({', '.join(params)}, one):",
                 "    rows, cols = out0.shape",
                 "    for r in range(rows):",
                 "        for c in range(cols):"]
        name = {k: (f"in{k}" if self.scalar[k] else f"in{k}[r, c]") for k in range(n)}
        for j, (op, attrs, args) in enumerate(self.body):
            lines.append(f"            v{j} = " + _C_LIKE[op.name].format(*[name[a] for a in args]))
            name[n + j] = f"v{j}"
        for p, slot in enumerate(self.output_slots):
            lines.append(f"            out{p}[r, c] = {name[slot]}")
        scope = {"np": np}
        exec("\n".join(lines), scope)  # noqa: S102 (generated from the group's own ops)
        self.compiled = numba.njit(fastmath=True)(scope["kernel"])
        self.output_shapes = None

    def __call__(self, *inputs, outs=None):
        shape = np.broadcast_shapes(*[np.shape(a) for a in inputs])
        results = [np.empty(shape, self.dtype) for _ in self.output_slots]
        args = [a.reshape(()).item() if s else np.broadcast_to(a, shape)
                for a, s in zip(inputs, self.scalar)]
        self.compiled(*[self.dtype.type(a) if s else a for a, s in zip(args, self.scalar)],
                      *results, self.dtype.type(1))
        return tuple(results)


def contenders():
    found = {
        "op-by-op": OpByOpKernel,
        "alloc-fastsig": AllocFastSigmoidKernel,
        "out=/exp": NumpyFusedKernel,
        "out=/tanh": lambda g, xp, d: NumpyFusedKernel(
            g, xp, d, writers={SIGMOID: (sigmoid_tanh_into, True)}),
        "out=/expit": lambda g, xp, d: NumpyFusedKernel(
            g, xp, d, writers={SIGMOID: (sigmoid_expit_into, True)}),
        "out=/blocked": BlockedKernel,
    }
    try:
        import numexpr  # noqa: F401

        found["numexpr-1t"] = lambda g, xp, d: NumexprKernel(g, xp, d, threads=1)
        found["numexpr-2t"] = lambda g, xp, d: NumexprKernel(g, xp, d, threads=2)
    except ImportError:
        pass
    try:
        import numba  # noqa: F401

        found["numba"] = NumbaKernel
    except ImportError:
        pass
    return found


# --- timing -------------------------------------------------------------------------------------

def best_time(fn, repeats, budget=0.05):
    """Best seconds per call over ``repeats`` rounds of about ``budget`` seconds each."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(budget / once))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def measure(sizes, repeats):
    names = list(contenders())
    rows = []
    for n, h in sizes:
        groups = tree_lstm_groups(n, h)
        for label, (group, args) in groups.items():
            reference = OpByOpKernel(group, np, np.float32)(*args)
            row = {"group": label, "ops": len(group), "N": n, "H": h, "us": {}}
            for name, factory in contenders().items():
                kernel = make_fused_kernel(group, np, np.float32, factory=factory)
                got = kernel(*args)
                for g, r in zip(got, reference):
                    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5,
                                               err_msg=f"{name} on {label} {n}x{h}")
                row["us"][name] = best_time(lambda: kernel(*args), repeats) * 1e6
            rows.append(row)
            print(format_row(row, names), flush=True)
    return names, rows


def format_row(row, names):
    cells = " ".join(f"{row['us'].get(name, float('nan')):>13.1f}" for name in names)
    best = min(row["us"], key=row["us"].get)
    speedup = row["us"]["op-by-op"] / row["us"][best]
    return (f"{row['group']:<3} {row['ops']:>3} {row['N']:>4} {row['H']:>4} {cells}   "
            f"{best} ({speedup:.1f}x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, two sizes")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    sizes = [(16, 128), (512, 256)] if args.quick else [
        (n, h) for n in (16, 64, 512) for h in (128, 256)]
    repeats = 3 if args.quick else 7
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count()}
    for module in ("scipy", "numexpr", "numba"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "not installed"
    print("fused elementwise groups of the Tree-LSTM cell, float32, µs per call (best of "
          f"{repeats}); " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    names = list(contenders())
    print(f"{'grp':<3} {'ops':>3} {'N':>4} {'H':>4} "
          + " ".join(f"{name:>13}" for name in names) + "   fastest (vs op-by-op)")
    names, rows = measure(sizes, repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"versions": versions, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
