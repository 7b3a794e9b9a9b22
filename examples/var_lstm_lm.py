"""Train the Var-LSTM language model of Cavs §5: an LSTM over sentences of any length, each
sentence one chain graph.

    python examples/var_lstm_lm.py                                  # synthetic sentences
    python examples/var_lstm_lm.py --data /path/to/ptb --embed-dim 256 --hidden 256 \
        --dropout 0.65 --epochs 11                                   # PTB (dir or one file)

The vertex function (minicavs.models.VarLSTMLanguageModel) pulls the embedding of the
previous token, gathers the previous step's [h, c] and pushes h; the softmax layer runs
outside F as one product over all words of the batch. A batch runs as many levels as its
longest sentence, and each level holds only the sentences still going: no padding is computed.
The last line gives the held-out perplexity the standard way — exp of the mean cross-entropy
per word, the <eos> ending each sentence counted as a word — the data it trained on, and the
throughput in words per second.
"""

import argparse

import minicavs as mc
from minicavs import training, validate
from minicavs.models import VarLSTMLanguageModel


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    training.add_common_arguments(parser, epochs=3, batch_size=32, lr=0.005,
                                  data_help="a PTB directory (ptb.train/valid/test.txt) or "
                                            "one text file, a sentence a line; default: "
                                            "the synthetic treebank's sentences")
    training.add_model_arguments(parser, embed_dim=64, hidden=64, clip=5.0)
    training.add_language_model_arguments(parser)
    parser.add_argument("--sentences", type=validate.count(minimum=10), default=3000,
                        help="synthetic sentences (a tenth held out)")
    return training.check_language_model_arguments(parser, parser.parse_args(argv))


def main(argv=None):
    args = parse_args(argv)
    comm = training.setup(args)  # the ranks: one process unless --distributed
    train, held_out, vocab, source = training.language_model_corpus(
        args.data, seed=args.seed, num_sentences=args.sentences)
    comm.log(f"var_lstm_lm: {len(train)} training / {len(held_out)} held-out sentences from "
             f"{source}, vocabulary {len(vocab)}")

    model = VarLSTMLanguageModel(len(vocab), args.embed_dim, args.hidden, dtype=args.dtype,
                                 bos_id=vocab.lookup("<eos>"), dropout=args.dropout,
                                 tie_weights=args.tie_weights)
    optimizer = mc.nn.Adam(model.parameters(), lr=args.lr)
    history = training.fit(model, optimizer, train, held_out, epochs=args.epochs,
                           batch_size=args.batch_size, seed=args.seed, clip=args.clip or None,
                           unit="sentence", progress=args.progress, comm=comm)
    if args.plot and comm.is_root:
        training.plot_history({f"seed {args.seed}": history}, args.plot, "perplexity",
                              title=f"var_lstm_lm, {source}", log=comm.log, held_out="held-out")

    result = model.evaluate(training.prepare_all(model, held_out, 256))
    words = sum(len(s) for s in train) * len(history)
    seconds = sum(stats.seconds for stats, _ in history)
    targets = sum(len(s) for s in held_out)
    comm.log(f"var_lstm_lm: held-out loss {result['loss']:.4f}  perplexity "
             f"{result['perplexity']:.2f} (unigram baseline "
             f"{training.unigram_perplexity(train, held_out, len(vocab)):.2f}; per word, <eos> "
             f"counted: {targets} words of {len(held_out)} sentences; trained on {source})  "
             f"{training.throughput(history):.0f} sentences/s "
             f"({words / seconds if seconds else float('nan'):.0f} words/s)")
    return {"held_out": result, "sentences_per_second": training.throughput(history)}


if __name__ == "__main__":
    training.command_line(main)
