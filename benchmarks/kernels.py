"""Each hand-written product kernel against NumPy's BLAS on the shapes the benchmarks give it.

    python benchmarks/kernels.py               # the table (about a minute on 2 cores)
    python benchmarks/kernels.py --quick       # fewer shapes

Kernels (``minicavs/cpu/kernels.py``): ``panels`` — a product with few rows and a weight packed
once (every instruction-set variant this CPU runs, ``minicavs/cpu/isa.py``) — and ``team`` —
a team of threads, each running a one-thread gemm of NumPy's BLAS; and the convolution's own
loops (``minicavs/cpu/conv.py``) against its gemms, on LeNet's layers; and the native level
loop's products on the panels over a weight packed for the call (``minicavs/runtime/codegen.py``)
against the gemm it calls otherwise. Against: NumPy's ``a @ b``
on one BLAS thread (what runs inside a native call when the library declines) and on the
BLAS's own threads. ``chosen`` is what the library runs after its calibration
(``minicavs/cpu/calibrate.py``) and ``BLAS ÷ chosen`` its speed against NumPy's one-thread
call (≥ 1: at least as fast; the calibration's promise is that it never picks its own kernel
where that is slower than the BLAS). Times are µs, the best of rounds: the choice and NumPy's
call in turns of a few calls each, each own kernel on its own.

Shapes: rows m = 1..128 (a recurrent step's few rows; a deep tree level's) against the weights
of the workloads — the tagger's LSTM (256 -> 4 x 256, and backward its transpose), its
character LSTM (64 -> 4 x 64), the Tree-LSTM's U (2H -> 5H, H = 128 and 256) and a wide one
(512 -> 2048) — and level-sized products (m = 512..2048) for the team.
"""

import argparse
import contextlib
import os
import pathlib
import platform
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from minicavs.cpu import blas, calibrate, isa, kernels, products, team  # noqa: E402

WEIGHTS = [("tagger LSTM", 256, 1024), ("tagger LSTM ∂ (Wᵀ)", 1024, 256),
           ("char LSTM", 64, 256), ("Tree-LSTM 128 U", 256, 640),
           ("Tree-LSTM 256 U", 512, 1280), ("wide", 512, 2048)]
ROWS = [1, 2, 4, 8, 16, 32, 64, 128]
LEVELS = [("Tree-LSTM 256 level", 512, 512, 1280), ("Tree-LSTM 256 level", 2048, 512, 1280),
          ("tagger batch", 1024, 256, 1024), ("∂W = Xᵀ G", 256, 2048, 1024)]


def best(calls, rounds):
    for call in calls:
        call()
    times = [float("inf")] * len(calls)
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[i] = min(times[i], time.perf_counter() - start)
    return times


def best_in_blocks(calls, rounds, block=4):
    """:func:`best` in turns of ``block`` calls of each, the first of a turn not timed (it
    meets what the other call left running: a team's threads spinning, its cache lines)."""
    times = [float("inf")] * len(calls)
    for _ in range(max(1, rounds // block)):
        for i, call in enumerate(calls):
            call()
            for _ in range(block):
                start = time.perf_counter()
                call()
                times[i] = min(times[i], time.perf_counter() - start)
    return times


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def gemm_rate():
    """NumPy's float32 GEMM rate (GFLOP/s) at 1024³, on its own threads."""
    a = np.ones((1024, 1024), np.float32)
    (seconds,) = best([lambda: a @ a], 3)
    return 2 * 1024 ** 3 / seconds / 1e9


def header():
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    runs = [n for n in isa.TARGETS if isa.runs_here(n)]
    return "\n".join([
        f"machine: {cpu_model()}, {os.cpu_count()} cores (team {team.team_size()}), "
        f"load {load:.2f}",
        f"ISA: {isa.describe()}; variants that run here: {', '.join(runs)}",
        f"BLAS: {blas.identity()}",
        f"BLAS GEMM (1024³ float32, its own threads): {gemm_rate():.1f} GFLOP/s",
        f"gemm of the team and the level loops: {calibrate.gemm('float32')[2]}"
        + (f" ({blas.mkl_identity()})" if blas.mkl_identity() else ""),
        f"calibration: {calibrate.path()} ({calibrate.forced() or 'measured'})"])


def table(rounds, quick):
    variants = [n for n in isa.TARGETS if isa.runs_here(n)]
    rows = ROWS[::2] if quick else ROWS
    names = [f"panels {v}" for v in variants] + ["team", "BLAS 1 thr", "BLAS threads", "chosen"]
    lines = ["| product | m x k x n | " + " | ".join(names) + " | choice | BLAS ÷ chosen |",
             "|---|---" + "|---:" * len(names) + "|---|---:|"]
    worst = {"own": float("inf"), "BLAS": float("inf")}
    shapes = [(label, m, k, n) for label, k, n in WEIGHTS for m in rows]
    shapes += [(label, m, k, n) for label, m, k, n in (LEVELS[::2] if quick else LEVELS)]
    for label, m, k, n in shapes:
        rng = np.random.default_rng(k * n)
        W = rng.standard_normal((k, n)).astype(np.float32)
        if "Wᵀ" in label:
            W = np.ascontiguousarray(W.T).T  # a transposed view, as backward reads it
        x = rng.standard_normal((m, k)).astype(np.float32)
        times, choice = measure_shape(x, W, variants, rounds)
        blas1, chosen = times[-3], times[-1]
        speed = blas1 / chosen
        side = "BLAS" if choice == "BLAS" else "own"
        worst[side] = min(worst[side], speed)
        cells = ["-" if t is None else f"{t * 1e6:.0f}" for t in times]
        lines.append(f"| {label} | {m} x {k} x {n} | " + " | ".join(cells)
                     + f" | {choice} | {speed:.2f}× |")
    lines.append(f"\nworst BLAS ÷ chosen where an own kernel is chosen: {worst['own']:.2f}×; "
                 f"where the BLAS is (the cost of asking, a few µs of Python): "
                 f"{worst['BLAS']:.2f}× (BLAS: NumPy's call on one thread, what runs inside a "
                 f"native call when the library declines; '-': the team does not run, one "
                 f"core free)")
    if worst["own"] < LOSING:
        lines.append(MEASURE_AGAIN)
    return "\n".join(lines)


def measure_shape(x, W, variants, rounds):
    """Best µs of each variant's panels, the team, NumPy on one thread and on its threads, and
    the library's choice; and the name of that choice."""
    out = np.empty((len(x), W.shape[1]), np.float32)
    with products.team_products(), products.invariant_operands([W]):
        calls = []
        for v in variants:  # each variant's own panels, packed now
            with _environment(isa.ENVIRONMENT, v):
                calls.append(_panels(products._Panels.of(W), x, W, out))
        team = products.team_matmul(x, W, out, measured=False) is not None
        calls.append((lambda: products.team_matmul(x, W, out, measured=False)) if team else None)
        calls.append(lambda: np.matmul(x, W, out=out))
        products.matmul(x, W, out)  # calibrates this bucket if it is new
        if products.packed_matmul(x, W, out) is not None:
            choice = f"panels {isa.target()}"
        elif products.team_matmul(x, W, out) is not None:
            choice = "team"
        else:
            choice = "BLAS"

        def chosen():
            if products.matmul(x, W, out) is None:
                np.matmul(x, W, out=out)
        calls.append(chosen)
        # Each own kernel timed on its own (in use one variant's panels exist, not three
        # thrashing the cache); the choice and NumPy's call in turns of a few calls each: a
        # call right after the other's is not timed (a team's threads still spin after its
        # call: 1 x 256 x 1024 took 35 and 40 us timed call by call in turns, 22 and 25 apart).
        times = [best([c], rounds)[0] if c is not None else None for c in calls[:-2]]
        times += best_in_blocks(calls[-2:], rounds)
    times.insert(len(times) - 1, best([lambda: np.matmul(x, W, out=out)], rounds)[0])
    return times, choice


@contextlib.contextmanager
def _environment(name, value):
    """``name=value`` in the environment inside the block, then what it was (an AVX2 build's
    ``MINICAVS_CPU_TARGET=avx2`` is kept for the rest of the table)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


CONV = [("LeNet conv1", 64, 1, 28, 6, 5), ("LeNet conv2", 64, 6, 12, 16, 5),
        ("32 filters, 36 positions", 64, 16, 8, 32, 3)]


def conv_table(rounds):
    """The convolution's own loops (filter rows, dot products) against NumPy's gemm, one
    thread, batch 64 (``minicavs/cpu/conv.py``), and what the calibration picks."""
    from minicavs.cpu import conv

    lines = ["| layer (N, C, H -> O, k) | product | own loops | BLAS gemm | chosen | choice "
             "| BLAS ÷ chosen |", "|---|---|---:|---:|---:|---|---:|"]
    worst = float("inf")
    for label, n, c, h, o, k in CONV:
        rng = np.random.default_rng(o)
        p = h - k + 1
        cols = rng.standard_normal((n, c, k, k, p, p)).astype(np.float32)
        w = rng.standard_normal((o, c, k, k)).astype(np.float32)
        g = rng.standard_normal((n, o, p, p)).astype(np.float32)
        for kind, call in (("forward", lambda: conv.product(cols, w, None, 2)),
                           ("input grad", lambda: conv.input_grad(g, w, 2)),
                           ("weight grad", lambda: conv.weight_grad(cols, g, 2))):
            runs = []
            for force in ("own", "blas", None):
                def run(force=force, call=call):
                    with _environment(calibrate.ENVIRONMENT, force or "measure"):
                        call()
                runs.append(run)
            runs[2]()  # calibrates this bucket if it is new
            own, gemm, chosen = best(runs, rounds)
            key = (kind.replace(" ", "_"), "f", *((s - 1).bit_length() for s in
                                                    (o, c * k * k, p * p)), isa.target(), None)
            choice = "own" if conv._wins.get(key) else "BLAS"
            worst = min(worst, gemm / chosen)
            lines.append(f"| {label} ({n}, {c}, {h} -> {o}, {k}) | {kind} | {own * 1e6:.0f} | "
                         f"{gemm * 1e6:.0f} | {chosen * 1e6:.0f} | {choice} | "
                         f"{gemm / chosen:.2f}× |")
    lines.append(f"\nworst BLAS ÷ chosen (convolution): {worst:.2f}×")
    return "\n".join(lines)


def loop_table(rounds):
    """The native level loop's product on the panel kernel over its weight packed for the call
    (one thread: a team member's share) against the gemm it calls otherwise, on one thread, and
    the loop's choice (``runtime/native.py``)."""
    from minicavs.runtime import native

    gemm, gemv = calibrate.gemm(np.float32), calibrate.gemv(np.float32)
    lines = [f"| product | m x k x n | panels | BLAS 1 thr | the loop's BLAS ({gemm[2]}) | "
             f"choice | BLAS ÷ chosen |", "|---|---|---:|---:|---:|---|---:|"]
    worst = float("inf")
    for label, k, n in WEIGHTS:
        transposed = "Wᵀ" in label
        rng = np.random.default_rng(k * n)
        w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
        weight = w.T if transposed else w
        packed = products.pack_panels(weight)
        for m in ROWS:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            panels = products.panels_call(x, packed, out)
            # (what the loop calls where the panels lose: its library's gemm, the gemv at one
            # row — the other side of the choice, runtime/native.py)
            loop_blas = calibrate.one_thread_gemv(gemv[:2], x, weight, out) \
                if m == 1 and gemv[0] is not None else \
                calibrate.one_thread_gemm(gemm[:2], x, weight, out)
            with team.one_blas_thread():
                times = best([panels, lambda: np.matmul(x, weight, out=out),
                              loop_blas], rounds)
            wins = native._panels_win(np.float32, m, k, n, int(transposed))
            # (against what the loop runs otherwise, its BLAS called as the panels are: NumPy's
            # call costs a microsecond less on top, which the loop's C never pays)
            speed = times[2] / (times[0] if wins else times[2])
            worst = min(worst, speed)
            lines.append(f"| {label} | {m} x {k} x {n} | {times[0] * 1e6:.0f} | "
                         f"{times[1] * 1e6:.0f} | {times[2] * 1e6:.0f} | "
                         f"{'panels' if wins else 'BLAS'} | {speed:.2f}× |")
    lines.append(f"\nworst BLAS ÷ chosen (the level loop's products): {worst:.2f}× (against the "
                 f"loop's BLAS, its column: what the loop calls where the panels lose)")
    if worst < LOSING:
        lines.append(MEASURE_AGAIN)
    return "\n".join(lines)


# A choice below this in a table is worth measuring again: the choices are measured once per
# CPU, BLAS and build, and a shared machine's speeds move between sessions (seen: the AVX2
# panels of 16 x 512 x 2048 chosen at 456 us against 574, timed at 551 against 476 later).
LOSING = 0.9
MEASURE_AGAIN = ("a choice measured earlier loses here now (the machine's load or its BLAS "
                 "changed since?): `python -m minicavs doctor --measure-again` forgets the "
                 "measured choices, and each is measured anew at its next use")


def _panels(p, x, W, out):
    """A call of ``p``'s packed gemm (the kernel alone, no choosing)."""
    packed, item = p.packed(), W.itemsize
    return lambda: p.gemm(kernels.data_address(x), x.strides[0] // item,
                          kernels.data_address(packed), len(x), W.shape[1], W.shape[0],
                          kernels.data_address(out), W.shape[1], p.threads)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every other row count")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per shape")
    args = parser.parse_args(argv)
    print(header())
    print()
    print(table(args.rounds, args.quick))
    print()
    print(conv_table(args.rounds))
    print()
    print(loop_table(args.rounds))


if __name__ == "__main__":
    main()
