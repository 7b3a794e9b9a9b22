"""Convolutions against PyTorch on the CPU: a LeNet-size conv2d forward + backward, and the
LRCN of ``examples/lrcn.py`` trained by minicavs and by the same model in PyTorch.

    python benchmarks/lrcn.py                  # both parts (about three minutes)
    python benchmarks/lrcn.py --part conv      # the conv2d rows only (seconds)
    python benchmarks/run.py --lrcn            # the same, from the benchmark driver

Each (part, system) runs in its own process, as in ``benchmarks/run.py``: PyTorch's OpenMP
threads keep spinning after its kernels return, and measured 2-15× slowdowns of minicavs'
loops when both ran in one process.

conv2d: LeNet's two convolutions on a batch of 64 — 1×28×28 → 6 maps 5×5 (the input needs no
gradient) and 6×12×12 → 16 maps 5×5 (it does) — forward, then the backward of
``sum(y * g)``; float32, median ms over 50 runs.

LRCN: the model and data of ``examples/lrcn.py`` (CNN per frame, LSTM over 2-8 frames, running
sum mod 10 at every frame), the same hyperparameters and batch order; PyTorch's LSTM runs over
a ``PackedSequence``. Training frames/s and the held-out accuracy on the last frame.
"""

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LENET = [(64, 1, 28, 6, 5, False), (64, 6, 12, 16, 5, True)]  # N, C, H, O, K, input grad


def _lrcn_module():
    spec = importlib.util.spec_from_file_location("lrcn_example", REPO / "examples" / "lrcn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_ms(step, repeats=50):
    for _ in range(5):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def conv_minicavs():
    import minicavs as mc

    rows = []
    for n, c, h, o, k, input_grad in LENET:
        rng = np.random.default_rng(0)
        x = mc.tensor(rng.standard_normal((n, c, h, h)).astype(np.float32),
                      requires_grad=input_grad)
        w = mc.Parameter((rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32))
        b = mc.Parameter(np.zeros(o, np.float32))
        g = mc.tensor(rng.standard_normal((n, o, h - k + 1, h - k + 1)).astype(np.float32))

        def step():
            x.grad = w.grad = b.grad = None
            (mc.conv2d(x, w, b) * g).sum().backward()

        rows.append(_median_ms(step))
    return rows


def conv_torch():
    import torch

    rows = []
    for n, c, h, o, k, input_grad in LENET:
        rng = np.random.default_rng(0)
        x = torch.tensor(rng.standard_normal((n, c, h, h)).astype(np.float32),
                         requires_grad=input_grad)
        w = torch.tensor((rng.standard_normal((o, c, k, k)) * 0.1).astype(np.float32),
                         requires_grad=True)
        b = torch.zeros(o, requires_grad=True)
        g = torch.tensor(rng.standard_normal((n, o, h - k + 1, h - k + 1)).astype(np.float32))

        def step():
            x.grad = w.grad = b.grad = None
            (torch.nn.functional.conv2d(x, w, b) * g).sum().backward()

        rows.append(_median_ms(step))
    return rows


def lrcn_minicavs(args):
    result = _lrcn_module().main(["--epochs", str(args.epochs), "--sequences",
                                  str(args.sequences), "--threads", str(args.threads),
                                  "--no-progress"])
    return {"accuracy": result["accuracy"], "frames_per_second": result["frames_per_second"]}


def lrcn_torch(args):
    """The LRCN of examples/lrcn.py in PyTorch: same layers, initial forget bias 1, Adam,
    gradient clipping, data and batch order."""
    import torch
    from torch import nn

    torch.manual_seed(args.seed)
    example = _lrcn_module()
    size, E, H = example.SIZE, 64, 64
    train, train_targets = example.digit_sequences(args.sequences, [args.seed, 0])
    test, test_targets = example.digit_sequences(max(args.sequences // 6, 100), [args.seed, 1])
    cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * (size // 4) ** 2, E), nn.ReLU())
    lstm, out = nn.LSTM(E, H), nn.Linear(H, 10)
    with torch.no_grad():
        lstm.bias_ih_l0[H:2 * H] = 1.0  # PyTorch's gate order: i, f, g, o
        lstm.bias_hh_l0[H:2 * H] = 0.0
    params = list(cnn.parameters()) + list(lstm.parameters()) + list(out.parameters())
    optimizer = torch.optim.Adam(params, lr=args.lr)

    def logits(sequences):
        lengths = [len(s) for s in sequences]
        features = cnn(torch.from_numpy(np.concatenate(sequences)))  # every frame at once
        packed = nn.utils.rnn.pack_sequence(list(torch.split(features, lengths)),
                                            enforce_sorted=False)
        h, _ = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0])  # (T, B, H)
        steps = torch.cat([torch.arange(n) for n in lengths])
        rows = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        return out(h[steps, rows])  # the frames in the order of ``sequences``

    def accuracy():
        right = 0
        with torch.no_grad():
            for i in range(0, len(test), 256):
                chunk = test[i:i + 256]
                last = np.cumsum([len(s) for s in chunk]) - 1
                predicted = logits(chunk)[last].argmax(1).numpy()
                right += int((predicted == [t[-1] for t in test_targets[i:i + 256]]).sum())
        return right / len(test)

    rng = np.random.default_rng([args.seed, 2])
    seconds, frames = 0.0, sum(len(s) for s in train)
    for _ in range(args.epochs):
        order = rng.permutation(len(train))
        start = time.perf_counter()
        for i in range(0, len(order), 32):
            chosen = order[i:i + 32]
            target = torch.from_numpy(np.concatenate([train_targets[j] for j in chosen]))
            loss = nn.functional.cross_entropy(logits([train[j] for j in chosen]), target)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 5.0)
            optimizer.step()
        seconds += time.perf_counter() - start
    return {"accuracy": accuracy(), "frames_per_second": frames * args.epochs / seconds}


def worker(args):
    if args.system == "torch":
        import torch

        torch.set_num_threads(args.threads)
    else:
        from minicavs.training import set_blas_threads

        set_blas_threads(args.threads)
    if args.part == "conv":
        result = conv_torch() if args.system == "torch" else conv_minicavs()
    else:
        result = lrcn_torch(args) if args.system == "torch" else lrcn_minicavs(args)
    print(json.dumps(result))


def _run(part, system, args):
    command = [sys.executable, __file__, "--worker", "--part", part, "--system", system,
               "--threads", str(args.threads), "--epochs", str(args.epochs), "--sequences",
               str(args.sequences)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                          env=dict(__import__("os").environ, PYTHONPATH=str(REPO)))
    if done.returncode:
        raise SystemExit(f"{system} {part} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["conv", "lrcn", "both"], default="both")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS / torch threads of each system (default 1)")
    parser.add_argument("--epochs", type=int, default=15, help="LRCN epochs (default 15)")
    parser.add_argument("--sequences", type=int, default=5000,
                        help="LRCN training sequences (default 5000)")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--system", choices=["minicavs", "torch"], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    parts = ["conv", "lrcn"] if args.part == "both" else [args.part]
    if "conv" in parts:
        ours, theirs = _run("conv", "minicavs", args), _run("conv", "torch", args)
        print(f"conv2d forward + backward, float32, {args.threads} thread(s), median ms")
        print(f"{'layer':34s} {'minicavs':>9s} {'PyTorch':>9s} {'ratio':>6s}")
        for (n, c, h, o, k, grad), a, b in zip(LENET, ours, theirs):
            name = f"{n}×{c}×{h}×{h} → {o}×{k}×{k}" + (" (+dx)" if grad else "")
            print(f"{name:34s} {a:9.2f} {b:9.2f} {a / b:6.2f}")
        print(f"{'both layers':34s} {sum(ours):9.2f} {sum(theirs):9.2f} "
              f"{sum(ours) / sum(theirs):6.2f}")
    if "lrcn" in parts:
        rows = {system: _run("lrcn", system, args) for system in ("minicavs", "torch")}
        print(f"LRCN ({args.sequences} sequences × {args.epochs} epochs, {args.threads} "
              f"thread(s))")
        print(f"{'system':10s} {'frames/s':>9s} {'accuracy':>9s}")
        for system, row in rows.items():
            print(f"{system:10s} {row['frames_per_second']:9.0f} {row['accuracy']:9.3f}")
        print(f"minicavs ÷ PyTorch: "
              f"{rows['minicavs']['frames_per_second'] / rows['torch']['frames_per_second']:.2f}")


if __name__ == "__main__":
    main()
