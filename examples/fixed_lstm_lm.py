"""Train the Fixed-LSTM language model of Cavs §5: a 64-step LSTM declared as a static graph.

    python examples/fixed_lstm_lm.py                           # synthetic sentences
    python examples/fixed_lstm_lm.py --data /path/to/ptb       # PTB (dir or one file)
    python examples/fixed_lstm_lm.py --data /path/to/ptb --embed-dim 256 --hidden 256 \
        --dropout 0.5 --epochs 8                               # docs/results.md's setting

The corpus is one stream of tokens cut into rows of 64 (+1 for the targets). The model
(minicavs.models.FixedLSTMLanguageModel) is written as an ordinary Python function of a
(B, 64) batch — embedding, 64 LSTM steps, softmax layer, loss — and traced once with
``mc.symbolic`` into a static graph (one per batch size), whose backward graph is derived
once: the static-declaration end of the spectrum (Cavs Fig. 2a), for comparison with the
vertex-centric Var-LSTM. The last line gives the held-out perplexity — exp of the mean
cross-entropy per predicted word, each sentence's <eos> counted as a word — the data it
trained on, and words per second. Each row starts from a zero state (the model's design), and
the held-out tail too short for a row is not scored; the line says how many words were.
"""

import argparse
import time

import minicavs as mc
from minicavs import training, validate
from minicavs.models import FixedLSTMLanguageModel, stream_rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=16, lr=0.005,
                                  data_help="a PTB directory (ptb.train/valid/test.txt) or "
                                            "one text file, a sentence a line; default: "
                                            "the synthetic treebank's sentences")
    training.add_model_arguments(parser, embed_dim=64, hidden=64, clip=5.0)
    parser.add_argument("--steps", type=validate.count(minimum=1), default=64,
                        help="unrolled steps (default 64)")
    training.add_language_model_arguments(parser)
    parser.add_argument("--sentences", type=validate.count(minimum=10), default=3000,
                        help="synthetic sentences (a tenth held out)")
    return training.check_language_model_arguments(parser, parser.parse_args(argv))


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    train, held_out, vocab, source = training.language_model_corpus(
        args.data, seed=args.seed, num_sentences=args.sentences)
    train_rows = list(stream_rows(train, args.steps))
    held_out_rows = list(stream_rows(held_out, args.steps))
    comm.log(f"fixed_lstm_lm: {len(train_rows)} training / {len(held_out_rows)} held-out rows "
             f"of {args.steps} words from {source}, vocabulary {len(vocab)}")

    model = FixedLSTMLanguageModel(len(vocab), args.embed_dim, args.hidden, steps=args.steps,
                                   dtype=args.dtype, dropout=args.dropout,
                                   tie_weights=args.tie_weights)
    started = time.perf_counter()
    masks = args.dropout > 0  # training runs the graph that takes the dropout masks
    model.static_function(args.batch_size, masks=masks)  # trace now, to report what it costs
    comm.log(f"fixed_lstm_lm: traced the {args.steps}-step network once in "
             f"{time.perf_counter() - started:.2f} s: "
             f"{len(model.static_function(args.batch_size, masks=masks).graph.op_nodes())} ops")
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, train_rows, held_out_rows, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, clip=args.clip or None,
                           unit="row", progress=args.progress, eval_batch_size=args.batch_size,
                           comm=comm)
    if args.plot and comm.is_root:
        training.plot_history({f"seed {args.seed}": history}, args.plot, "perplexity",
                              title=f"fixed_lstm_lm, {source}", log=comm.log, held_out="held-out")

    result = model.evaluate(training.prepare_all(model, held_out_rows, args.batch_size))
    rate = training.throughput(history)
    scored = len(held_out_rows) * args.steps
    comm.log(f"fixed_lstm_lm: held-out loss {result['loss']:.4f}  perplexity "
             f"{result['perplexity']:.2f} (unigram baseline "
             f"{training.unigram_perplexity(train, held_out, len(vocab)):.2f}; per word, <eos> "
             f"counted: {scored} of "
             f"{sum(len(s) for s in held_out)} words; trained on {source})  {rate:.1f} rows/s "
             f"({rate * args.steps:.0f} words/s)")
    return {"held_out": result, "rows_per_second": rate}


if __name__ == "__main__":
    training.command_line(main)
