"""The ``minicavs`` command line: ``python -m minicavs <command>`` (or the ``minicavs`` script).

Each command is a (configure, run) pair in :data:`COMMANDS`: ``configure(parser)`` adds its
arguments, ``run(args)`` does the work and returns the exit status. To add one (``train``), write
the two functions and add an entry.
"""

import argparse
import sys


def _configure_doctor(parser):
    parser.description = ("Check this machine for minicavs, CPU and GPU: the versions of Python, "
                          "NumPy and CuPy; the native CPU backend (the C++ compiler, NumPy's "
                          "BLAS and its threads, the compile cache, glibc's allocator, the "
                          "autobatch recorder; a test cell run natively against the "
                          "interpreter); and the CUDA toolchain (driver, runtime, NVRTC, headers, "
                          "whether a GPU is visible; one kernel compiled with NVRTC and CuPy and "
                          "run through the g++ shim). Each line says what is missing and how to "
                          "get it; the last line is 'status: ok' or what is broken.")
    parser.add_argument("--measure-again", action="store_true",
                        help="forget this machine's measured kernel choices (own kernel or "
                             "BLAS, team or one thread) and measure them anew: after the "
                             "machine's load or its BLAS changed, or where benchmarks/kernels.py "
                             "shows a choice losing")


def _run_doctor(args):
    from .doctor import run_doctor

    return run_doctor(measure_again=args.measure_again)


def _configure_train(parser):
    from .train_command import configure

    configure(parser)


def _run_train(args):
    from .train_command import run

    return run(args)


COMMANDS = {
    "doctor": (_configure_doctor, _run_doctor,
               "check the native CPU backend and the CUDA toolchain (NVRTC, CPU shim, GPU) "
               "and say what is missing"),
    "train": (_configure_train, _run_train,
              "train an example model (tree-lstm: the main job) and save a checkpoint"),
}


def build_parser():
    parser = argparse.ArgumentParser(prog="minicavs",
                                     description="minicavs: dynamic neural networks (Cavs).")
    subparsers = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name, (configure, run, summary) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=summary)
        configure(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv=None):
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:  # one line, not a traceback (train says what its checkpoint holds)
        print(f"\nminicavs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
