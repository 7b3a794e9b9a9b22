"""Train an LRCN (Donahue et al. 2015; Cavs §3): a CNN over every frame of variable-length
sequences of images, its per-frame features pushed into a recurrent vertex function.

    python examples/lrcn.py                     # 15 epochs: 1.5-2.5 minutes on 2 busy cores
    python examples/lrcn.py --epochs 8 --sequences 6000

The data is generated here: digit glyphs (5×7 bitmaps) drawn into 12×12 frames at a random
place, with a random stroke strength and noise; a sequence of 2 to 8 such frames is labelled by
the sum of its digits mod 10, so the network must both read each frame and carry a running sum.
As in the LRCN paper, the network predicts at every frame: there the target is the running sum
so far (the first frame's is its own digit, which teaches the CNN to read); the sequence's
label is the prediction at its last frame, and the accuracy is measured on that alone.

The static network and the vertex function meet through pull and push (DESIGN.md,
"Integration"): the CNN runs once per mini-batch over *all* frames of all sequences at once
(one (frames, 1, 12, 12) batch, frames in the batch's vertex order), and its (frames, E)
features are the pulled input of an LSTM vertex function over one chain graph per sequence.
F's level loop runs as many levels as the longest sequence, each holding only the sequences
still going; the last vertex of each chain pushes its h to the classifier. ``loss.backward()``
runs ∂F over the levels in reverse and flows into the pulled features, so the CNN trains end to
end. The last line gives the held-out accuracy and the training throughput in frames/s.
"""

import argparse
import time

import numpy as np
from tqdm import tqdm

import minicavs as mc
from minicavs import training, validate

# 5×7 glyphs of the digits 0-9, a row a string
GLYPHS = [
    ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    ["11111", "00010", "00100", "00010", "00001", "10001", "01110"],
    ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
]
SIZE = 12  # frames are SIZE × SIZE
BITMAPS = np.array([[[c == "1" for c in row] for row in g] for g in GLYPHS], dtype=np.float32)


def digit_sequences(count, rng, min_length=2, max_length=8):
    """``count`` sequences: a list of (length, 1, SIZE, SIZE) float32 frames and a list of
    per-frame targets, the running sums of the digits mod 10 (the last one is the label)."""
    rng = np.random.default_rng(rng)
    lengths = rng.integers(min_length, max_length + 1, size=count)
    digits = rng.integers(0, 10, size=int(lengths.sum()))
    frames = rng.normal(0.0, 0.2, size=(len(digits), 1, SIZE, SIZE)).astype(np.float32)
    rows = rng.integers(0, SIZE - 7 + 1, size=len(digits))
    cols = rng.integers(0, SIZE - 5 + 1, size=len(digits))
    strength = rng.uniform(0.6, 1.2, size=len(digits)).astype(np.float32)
    for i, (d, r, c) in enumerate(zip(digits, rows, cols)):
        frames[i, 0, r:r + 7, c:c + 5] += strength[i] * BITMAPS[d]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    sequences = [frames[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    targets = [np.cumsum(digits[a:b]) % 10 for a, b in zip(bounds[:-1], bounds[1:])]
    return sequences, targets


class LRCN(mc.nn.Module):
    """CNN (two 3×3 convolutions with ReLU and 2×2 max pooling, a linear layer to E) per
    frame, an LSTM vertex function over the frames of each sequence, a linear classifier on
    the last state."""

    def __init__(self, features=64, hidden=64, classes=10, dtype="float32"):
        E, H = int(features), int(hidden)
        self.cnn = mc.nn.Sequential(
            mc.nn.Conv2d(1, 16, 3, padding=1, dtype=dtype), mc.nn.ReLU(), mc.nn.MaxPool2d(2),
            mc.nn.Conv2d(16, 32, 3, padding=1, dtype=dtype), mc.nn.ReLU(), mc.nn.MaxPool2d(2),
            mc.nn.Flatten(), mc.nn.Linear(32 * (SIZE // 4) ** 2, E, dtype=dtype), mc.nn.ReLU())
        self.W = mc.Parameter(mc.nn.init.xavier_uniform((E, 4 * H), dtype=dtype))
        self.U = mc.Parameter(mc.nn.init.orthogonal((H, 4 * H), dtype=dtype))
        bias = np.zeros(4 * H, dtype)
        bias[H:2 * H] = 1.0  # forget gate open at first: the running sum is carried
        self.b = mc.Parameter(bias)
        self.out = mc.nn.Linear(H, classes, dtype=dtype)
        W, U, b = self.W, self.U, self.b

        def lstm_step(v):
            h_prev, c_prev = mc.split(v.gather(0), 2)  # zeros at the first frame
            h, c = mc.lstm_gates(v.pull() @ W + h_prev @ U + b, c_prev)
            v.scatter(mc.concat([h, c]))
            v.push(h)

        self.F = mc.VertexFunction(lstm_step, pull_shape=(E,), scatter_shape=(2 * H,),
                                   push_shape=(H,), arity=1, dtype=dtype)
        self._chains = {}

    def logits(self, sequences):
        """(frames, classes): a prediction at every frame, in the order of ``sequences``."""
        graphs = mc.GraphBatch([self._chains.setdefault(len(s), mc.InputGraph.chain(len(s)))
                                for s in sequences])
        frames = mc.tensor(np.concatenate(sequences))  # all frames, in the batch's vertex order
        features = self.cnn(frames)  # one CNN pass over every frame of the mini-batch
        h = self.F(graphs, pull=features)  # the LSTM over each sequence; h of every frame
        return self.out(h)


def accuracy(model, sequences, targets, batch_size=256):
    """The share of sequences whose last frame's prediction is the label."""
    right = 0
    with mc.no_grad():
        for i in range(0, len(sequences), batch_size):
            chunk = sequences[i:i + batch_size]
            last = np.cumsum([len(s) for s in chunk]) - 1  # each sequence's last frame
            predicted = model.logits(chunk).numpy()[last].argmax(axis=1)
            right += int((predicted == [t[-1] for t in targets[i:i + batch_size]]).sum())
    return right / len(sequences)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=15, batch_size=32, lr=0.003,
                                  data_help="unused: the example generates its sequences")
    training.add_model_arguments(parser, embed_dim=None, hidden=64, clip=5.0)
    parser.add_argument("--features", type=validate.count(minimum=1), default=64,
                        help="CNN features per frame, pulled by the LSTM (default 64)")
    parser.add_argument("--sequences", type=validate.count(minimum=10), default=5000,
                        help="training sequences (held out: a sixth of that, at least 100)")
    parser.add_argument("--max-length", type=validate.count(minimum=2), default=8,
                        help="frames per sequence: 2 to this (default 8)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)
    train, train_targets = digit_sequences(args.sequences, [args.seed, 0],
                                          max_length=args.max_length)
    test, test_targets = digit_sequences(max(args.sequences // 6, 100), [args.seed, 1],
                                        max_length=args.max_length)
    frames_per_epoch = sum(len(s) for s in train)
    comm.log(f"lrcn: {len(train)} training sequences ({frames_per_epoch} frames of "
             f"{SIZE}×{SIZE}), {len(test)} held out; label: the digits' sum mod 10")
    model = LRCN(args.features, args.hidden, dtype=args.dtype)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng([args.seed, 2])
    seconds, losses = 0.0, []
    for epoch in range(args.epochs):
        order = rng.permutation(len(train))
        total, start, steps = 0.0, time.perf_counter(), 0
        with tqdm(total=len(order), desc=f"epoch {epoch + 1}/{args.epochs}", unit="seq",
                  disable=not (args.progress and comm.is_root), leave=False,
                  dynamic_ncols=True) as bar:
            for i in range(0, len(order), args.batch_size):
                chosen = order[i:i + args.batch_size]
                loss = mc.softmax_cross_entropy(
                    model.logits([train[j] for j in chosen]),
                    np.concatenate([train_targets[j] for j in chosen]))
                optimizer.zero_grad()
                loss.backward()
                if args.clip:
                    mc.nn.clip_grad_norm(model.parameters(), args.clip)
                optimizer.step()
                total += loss.item()
                steps += 1
                bar.update(len(chosen))
                bar.set_postfix(loss=f"{total / steps:.4f}", refresh=False)
        seconds += time.perf_counter() - start
        losses.append(total / -(-len(order) // args.batch_size))  # per frame
        comm.log(f"lrcn: epoch {epoch + 1}  train loss {losses[-1]:.4f}  held-out accuracy "
                 f"{accuracy(model, test, test_targets):.3f}")
    result = accuracy(model, test, test_targets)
    rate = frames_per_epoch * args.epochs / seconds if seconds else float("nan")
    comm.log(f"lrcn: held-out accuracy {result:.3f} (chance 0.100)  {rate:.0f} frames/s "
             f"({len(train) * args.epochs / seconds if seconds else float('nan'):.0f} "
             f"sequences/s)")
    return {"accuracy": result, "losses": losses, "frames_per_second": rate}


if __name__ == "__main__":
    training.command_line(main)
