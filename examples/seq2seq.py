"""Train an encoder-decoder on a toy task: reverse a random sequence of tokens.

    python examples/seq2seq.py
    python examples/seq2seq.py --max-length 12 --hidden 128 --epochs 10

Two vertex functions joined by push and pull (minicavs.models.Seq2Seq): the encoder runs over
each source sequence as a chain and pushes its states; the last state of each sequence is
taken out (an ordinary op on the pushed rows) and pulled, with the previous target token's
embedding, by every step of the decoder chain. Gradients flow back the same way. Greedy
decoding grows each decoder chain one vertex per step (mc.grow): linear in the output length.
With --beam-size k > 1 it also decodes with beam search (Seq2Seq.beam_search, the same
mechanism). The last line gives the held-out token accuracy (teacher-forced), the exact-match
accuracy of greedy decoding, the training throughput and the decoding throughput.
"""

import argparse
import time

import numpy as np

import minicavs as mc
from minicavs import training, validate
from minicavs.models import Seq2Seq, reversal_task


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=5, batch_size=32, lr=0.01,
                                  data_help="unused: the task is generated")
    training.add_model_arguments(parser, embed_dim=16, hidden=64, clip=5.0)
    parser.add_argument("--vocab-size", type=validate.count(minimum=4), default=10,
                        help="tokens, including the 3 special ones (default 10)")
    parser.add_argument("--max-length", type=validate.count(minimum=1), default=6,
                        help="longest source sequence")
    parser.add_argument("--train-size", type=validate.count(minimum=1), default=4000,
                        help="training pairs (held out: 1/10 of that)")
    parser.add_argument("--beam-size", type=validate.count(minimum=1), default=1,
                        help="also decode with beam search of this width (default 1: greedy "
                             "only)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    if args.data:
        comm.log("seq2seq: --data is ignored, the reversal task is generated")
    task = dict(vocab_size=args.vocab_size, max_length=args.max_length)
    train = reversal_task(args.train_size, rng=[args.seed, 0], **task)
    held_out = reversal_task(max(args.train_size // 10, 1), rng=[args.seed, 1], **task)

    model = Seq2Seq(args.vocab_size, args.embed_dim, args.hidden, dtype=args.dtype)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, train, held_out, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, clip=args.clip or None,
                           unit="pair", progress=args.progress, comm=comm)

    batches = training.prepare_all(model, held_out, 256)
    result = model.evaluate(batches, held_out)
    started = time.perf_counter()  # greedy decoding alone: mc.grow, one decoder row per token
    decoded = [model.generate(batch, args.max_length + 1) for batch in batches]
    decode_rate = len(held_out) / (time.perf_counter() - started)
    steps = sum(min(len(d) + 1, args.max_length + 1) for chunk in decoded for d in chunk)
    if args.beam_size > 1:
        exact, start = [], 0
        for batch in batches:
            chunk = held_out[start:start + batch.num_samples]
            start += batch.num_samples
            for (_, target), (found, _) in zip(chunk, model.beam_search(
                    batch, args.beam_size, args.max_length + 1)):
                exact.append(np.array_equal(found, target[:-1]))
        result["beam_sequence_accuracy"] = float(np.mean(exact))
        comm.log(f"seq2seq: beam search (width {args.beam_size}) exact match "
                 f"{result['beam_sequence_accuracy']:.3f}")
    targets = np.concatenate([np.asarray(target) for _, target in held_out])
    chance = float(np.bincount(targets).max() / targets.size)  # always the most frequent token
    comm.log(f"seq2seq: held-out loss {result['loss']:.4f}  token accuracy "
             f"{result['token_accuracy']:.3f} (chance {chance:.3f})  greedy exact match "
             f"{result['sequence_accuracy']:.3f}  {training.throughput(history):.0f} pairs/s; "
             f"greedy decoding {decode_rate:.0f} pairs/s ({steps} decoder steps)")
    return {"held_out": result, "pairs_per_second": training.throughput(history),
            "decoded_pairs_per_second": decode_rate}


if __name__ == "__main__":
    training.command_line(main)
