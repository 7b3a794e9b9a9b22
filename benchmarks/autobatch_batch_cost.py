"""What an autobatched batch costs beyond its arithmetic on the CPU (issue 40's next step).

    python benchmarks/autobatch_batch_cost.py [--rows 1,4,16,64] [--hidden 256]

An LSTM step's batch (``lstm_step``: x·W and h·U on the weights' packed panels, then the summed
cell, as the tagger runs it) timed two ways, each call repeated in a loop: through the
interpreter, as a segment runs it (``BatchedKernel.run``: the Program's steps, the ops'
wrappers, the product routes), and as the same native calls made directly with their arguments
worked out once — what a batch would cost issued from C, as a GPU's batches are
(``minicavs/autobatch/launches.py``). The difference is the host's time a batch that such an
issuer would save. Both use this process's team of threads; the products' route is the
panels' wherever the library's calibration takes them (else the direct side calls the same
route as the interpreter, and the difference is the Python around it).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import minicavs as mc  # noqa: E402
from minicavs.autodiff import Parameter, tensor  # noqa: E402
from minicavs.cpu import calibrate, kernels, products  # noqa: E402
from minicavs.ops.cells import LSTM_STEP  # noqa: E402


def one_batch(rows, inputs, hidden, rng):
    """An autobatched block of ``rows`` LSTM steps, forced: its segment and the step's batch."""
    W = Parameter((rng.standard_normal((inputs, 4 * hidden)) * 0.1).astype(np.float32))
    U = Parameter((rng.standard_normal((hidden, 4 * hidden)) * 0.1).astype(np.float32))
    b = Parameter((rng.standard_normal(4 * hidden) * 0.1).astype(np.float32))
    state = tensor(rng.standard_normal(2 * hidden).astype(np.float32))
    xs = [tensor(rng.standard_normal(inputs).astype(np.float32)) for _ in range(rows)]
    with mc.autobatch("agenda+") as ab:
        steps = [mc.lstm_step(x, state, W, U, b) for x in xs]
        mc.add_n([s.sum() for s in steps])
    segment = ab.segments[-1]
    batch = next(p for p in segment.plan if p.sig.op is LSTM_STEP)
    return segment, batch, (W, U, b)


def timed(call, repeats):
    call()
    began = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - began) / repeats


def direct_calls(batch, env, weights, out, hidden):
    """The batch's native calls with their arguments made once: x·W and h·U (the panels, or the
    route the library takes) into two blocks, then the summed cell into the output rows."""
    kernel = batch.sig.forward
    x, state = (env[s.key] for s in kernel.inputs[:2])
    W, U, b = (w._array for w in weights)
    h, c = state[:, :hidden], state[:, hidden:]
    n, width = batch.n, 4 * hidden
    xw, hu, pre = (np.empty((n, width), np.float32) for _ in range(3))
    cell = kernels._function("lstm_cell", "f32")
    address = kernels.data_address
    terms, strides = kernels._term_arrays()
    calls = []
    for a, w, into in ((x, W, xw), (h, U, hu)):
        panels = products._applicable_panels(a, w)
        if panels and panels.faster(n):
            packed = panels.packed()
            calls.append(lambda p=panels, a=a, w=w, into=into, packed=packed: p.gemm(
                address(a), a.strides[0] // 4, address(packed), n, w.shape[1], w.shape[0],
                address(into), w.shape[1], p.threads))
        else:
            calls.append(lambda a=a, w=w, into=into: products.matmul(a, w, into) is not None
                         or np.matmul(a, w, out=into))
    threads = calibrate.threads_for(n * width)
    ldc = c.strides[0] // 4

    def run():
        for call in calls:
            call()
        terms[0], terms[1], terms[2] = address(xw), address(hu), address(b)
        strides[0], strides[1], strides[2] = width, width, 0
        cell(address(pre), terms, strides, 3, address(c), None, ldc, ldc, 1, n, hidden,
             address(out), threads)
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,16,64")
    parser.add_argument("--inputs", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args(argv)
    if kernels.library() is None:
        raise SystemExit("autobatch_batch_cost.py: no native code here (the direct calls are "
                         "the native kernels')")
    rng = np.random.default_rng(0)
    print(f"LSTM step batches, x {args.inputs}, h {args.hidden}, float32; µs a batch's forward")
    print(f"{'rows':>5}{'interpreter':>13}{'direct':>9}{'difference':>12}")
    for rows in (int(r) for r in args.rows.split(",")):
        segment, batch, weights = one_batch(rows, args.inputs, args.hidden, rng)
        out = segment.slabs[batch.out_slab][batch.out_row:batch.out_row + batch.n]
        want = out.copy()
        with segment._one_pool():  # (the team and the weights' panels, as a segment runs)
            through = timed(lambda: batch.sig.forward.run(dict(batch.env), batch.n, np, out),
                            args.repeats)
            run = direct_calls(batch, batch.env, weights, out, args.hidden)
            run()
            np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)  # (the same values)
            direct = timed(run, args.repeats)
        print(f"{rows:>5}{through * 1e6:>13.1f}{direct * 1e6:>9.1f}"
              f"{(through - direct) * 1e6:>12.1f}")


if __name__ == "__main__":
    main()
