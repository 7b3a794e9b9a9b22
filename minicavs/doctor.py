"""``python -m minicavs doctor``: what this machine can run, and what to install.

The CUDA layer's rows (``cuda/doctor.py``: NVRTC, the CPU shim, a GPU) and then the native CPU
backend's: which backend runs vertex functions here and why, the compiler, the BLAS the
generated code calls, and one real check — a small Tree-LSTM-like cell compiled, run on both
backends and compared (values and every gradient, float64, within 1e-9). The exit status is 1
only when a piece that is present does not work.
"""

import platform
import sys

import numpy as np

from .cpu import blas, build, calibrate, malloc
from .cuda import doctor as cuda_doctor
from .errors import MinicavsError
from .runtime.backends import interpreter_only


def run_doctor(file=None, measure_again=False):
    """Print the report to ``file`` (stdout); return 0, or 1 if a present piece is broken.
    ``measure_again``: this machine's kernel choices are forgotten first, and measured anew."""
    file = file or sys.stdout
    report = []
    if measure_again:
        try:
            gone = calibrate.forget()
            report.append(("kernel choices", f"forgotten ({gone or 'none were kept'}): each is "
                           f"measured again at its first use", None, False))
        except OSError as exc:
            report.append(("kernel choices", f"could not be forgotten: {exc}",
                           f"remove {calibrate.path()} by hand", True))
    cuda_doctor.probe(report)
    _probe_native(report)
    from . import __version__

    print(f"minicavs {__version__} doctor", file=file)
    width = max(len(label) for label, *_ in report)
    for label, value, hint, failed in report:
        print(f"  {label:<{width}}  {value}", file=file)
        if hint:
            print(f"  {'':<{width}}  -> {hint}", file=file)
    broken = [label for label, _, _, failed in report if failed]
    print("  status: " + (f"BROKEN ({', '.join(broken)})" if broken else "ok"), file=file)
    return 1 if broken else 0


def _probe_native(report):
    """Append the native CPU backend's (label, value, hint-or-None, failed) rows to ``report``."""
    try:
        reason = build.unavailable()
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
    address, interface, name = calibrate.gemm("float32")
    where = name if interface.startswith("cblas") else "SciPy's cython_blas"
    mkl = blas.mkl_identity()
    why = "" if mkl is None else next(
        (f" (one thread: MKL {t[0] * 1e3:.2f} ms, NumPy's BLAS {t[1] * 1e3:.2f} ms)"
         for n, t in calibrate.measured().items() if n.startswith("gemm float32")), "")
    report.append(("blas (native)", f"{interface} gemm from {where}{why}",
                   None if mkl is not None or platform.machine() not in ("x86_64", "AMD64")
                   else "pip install mkl: measured here against NumPy's BLAS, used where faster",
                   False))
    report.append(("native flags", " ".join(build.cxx_flags()), None, False))
    report.append(("native cache", build.cache_dir(), None, False))
    report.append(("host memory", malloc.state, None, False))
    report.append(("blas threads", blas.idle_threads, None, False))
    from .autobatch import native as recorder

    why = recorder.unavailable()
    report.append(("autobatch recorder", "C fast path" if why is None else
                   f"Python ({why})", None, False))
    from .vertex import native as graphs

    why = graphs.unavailable()
    report.append(("input graphs", "child lists in one C pass" if why is None else
                   f"Python ({why})", None, False))
    _probe_kernels(report)
    try:
        error, backends = _compare()
    except Exception as exc:  # noqa: BLE001 (a doctor reports; it does not crash)
        report.append(("cpu backend", f"FAILED: {type(exc).__name__}: {exc}", None, True))
        return
    ok = error <= 1e-9 and backends == ("native", "native")
    report.append(("cpu backend", f"native C++ level loops ({'ok' if ok else 'WRONG RESULT'}: "
                   f"a test cell ran {'/'.join(backends)}, relative error {error:.1e} "
                   f"against the NumPy interpreter)", None, not ok))


def _probe_kernels(report):
    """The kernels' instruction set, and each own-kernel-or-BLAS choice with the times behind
    it (``cpu/calibrate.py``): the tagger's products measured now unless already."""
    from .cpu import calibrate, isa, products, team

    runs = [t for t in isa.TARGETS if isa.runs_here(t)]
    report.append(("cpu kernels", f"{isa.describe()}; variants compiled: "
                   f"{', '.join(isa.TARGETS)}; run here: {', '.join(runs)}", None, False))
    rng = np.random.default_rng(0)
    W = rng.standard_normal((256, 1024)).astype(np.float32)
    with products.team_products(), products.invariant_operands([W]):
        for m in (1, 4, 16, 64):
            products.matmul(rng.standard_normal((m, 256)).astype(np.float32), W)
            products.matmul(rng.standard_normal((m, 1024)).astype(np.float32), W.T)
        products.matmul(rng.standard_normal((1024, 256)).astype(np.float32), W)
    threads = team.team_size()
    split = calibrate.split_elements(threads)
    if split:
        team_line = f"{threads} thread(s); a loop splits between them from {split} elements"
    elif threads > 1 and not calibrate.split_measured(threads):
        team_line = (f"{threads} thread(s); not measured: other work held the cores (loops run "
                     f"on one thread until a quiet moment measures it)")
    else:
        team_line = f"{threads} thread(s); loops run on one thread (a team did not pay here)"
    report.append(("cpu team", team_line, None, False))
    forced = calibrate.forced()
    report.append(("kernel choices", f"forced: MINICAVS_KERNELS={forced}" if forced else
                   calibrate.path(), None, False))
    for name, (first, second) in sorted(calibrate.measured().items()):
        if name.startswith("team split:"):  # the costs that weigh a level's work
            line = f"{first * 1e6:.0f} us, {second * 1e6:.0f} us"
        else:
            names = ("team", "one thread") if name.startswith("team split") else ("own", "BLAS")
            choice = names[0] if calibrate.wins((first, second)) else names[1]
            line = (f"{choice} ({names[0]} {first * 1e6:.0f} us, {names[1]} "
                    f"{second * 1e6:.0f} us: {second / first:.2f}x)")
        report.append(("", f"{name}: {line}", None, False))


def _compare():
    """Run a small cell natively and on the interpreter; (largest relative error, the
    backends F and ∂F ran on natively)."""
    import minicavs as mc

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
