"""The native CPU backend's part of ``python -m minicavs doctor``: which backend runs vertex
functions here and why, the compiler, the BLAS the generated code calls, and one real check —
a small Tree-LSTM-like cell compiled, run on both backends and compared (values and every
gradient, float64, within 1e-9)."""

import numpy as np


def probe(report):
    """Append (label, value, hint-or-None, failed) rows to ``report``."""
    from ..errors import MinicavsError
    from . import blas, build

    try:
        reason = build.native_unavailable()
    except MinicavsError as exc:  # a bad MINICAVS_NATIVE: reported, as vertex functions would
        report.append(("cpu backend", f"FAILED: {exc}", None, True))
        return
    try:
        report.append(("c++ (native)", build.compiler()[1], None, False))
    except Exception:  # noqa: BLE001 (ToolchainError, reported as a row)
        report.append(("c++ (native)", "not found", build.INSTALL_HINT, False))
    if reason is not None:
        report.append(("cpu backend", f"NumPy interpreter ({reason})",
                       None if "MINICAVS_NATIVE" in reason else build.INSTALL_HINT, False))
        return
    address, interface = blas.gemm("float32")
    where = "NumPy's BLAS" if interface.startswith("cblas") else "SciPy's cython_blas"
    report.append(("blas (native)", f"{interface} gemm from {where}", None, False))
    report.append(("native cache", build.cache_dir(), None, False))
    try:
        error, backends = _compare()
    except Exception as exc:  # noqa: BLE001 (a doctor reports; it does not crash)
        report.append(("cpu backend", f"FAILED: {type(exc).__name__}: {exc}", None, True))
        return
    ok = error <= 1e-9 and backends == ("native", "native")
    report.append(("cpu backend", f"native C++ level loops ({'ok' if ok else 'WRONG RESULT'}: "
                   f"a test cell ran {'/'.join(backends)}, relative error {error:.1e} "
                   f"against the NumPy interpreter)", None, not ok))


def _compare():
    """Run a small cell natively and on the interpreter; (largest relative error, the
    backends F and ∂F ran on natively)."""
    import minicavs as mc

    from .native import interpreter_only

    rng = np.random.default_rng(0)
    H = 6
    W = mc.Parameter(rng.standard_normal((3, 4 * H)), name="W")
    U = mc.Parameter(rng.standard_normal((2 * H, 4 * H)), name="U")

    def cell(v):
        h_l, h_r = v.gather(0), v.gather(1)
        i, f, o, u = mc.split(v.pull() @ W + mc.concat([h_l, h_r]) @ U, 4)
        c = mc.sigmoid(i) * mc.tanh(u) + mc.sigmoid(f) * (h_l + h_r)
        h = mc.sigmoid(o) * mc.tanh(c)
        v.scatter(h)
        v.push(h)

    F = mc.VertexFunction(cell, pull_shape=(3,), scatter_shape=(H,), push_shape=(H,), arity=2,
                          dtype="float64", name="doctor_cell")
    batch = mc.GraphBatch([mc.InputGraph([[], [], [0, 1], [], [2, 3]]),
                           mc.InputGraph([[], [], [0, 1]])])
    x = rng.standard_normal((batch.num_vertices, 3))

    def run():
        X = mc.tensor(x, requires_grad=True)
        out = F(batch, pull=X)
        (out * out).sum().backward()
        results = [out.numpy(), X.grad.numpy(), W.grad.numpy(), U.grad.numpy()]
        W.grad = U.grad = None
        stats = F.explain()
        return results, (stats["forward_backend"], stats["backward_backend"])

    got, backends = run()
    with interpreter_only():
        want, _ = run()
    error = max(float(np.max(np.abs(g - w) / np.maximum(1.0, np.abs(w))))
                for g, w in zip(got, want))
    return error, backends
