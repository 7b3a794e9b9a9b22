"""Try it yourself: one exercise per chapter of the documentation site (docs/path/).

    python -m minicavs.exercises list              # the exercises
    python -m minicavs.exercises start tensors     # copy the template to ./exercises/tensors.py
    python -m minicavs.exercises check tensors     # import your file and check it

Each exercise is a small file you edit in a scratch copy (the templates live in
``minicavs/exercises/templates/``). The checker imports your file and verifies it with the
library's own tools — ``gradcheck`` for a VJP, the per-sample reference for a cell or a
batching rule, the Programs and ``explain()`` for a prediction. Nothing you write replaces the
library's code: an op you define is a private ``Op`` that is never registered.
"""

import argparse
import importlib.util
import pathlib
import shutil
import sys

from .checks import CHECKS, ExerciseFailed

TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"


def names():
    """The exercises, in the order of the chapters."""
    return list(CHECKS)


def template_path(name):
    _known(name)
    return TEMPLATES / f"{name}.py"


class UnknownExercise(ExerciseFailed):
    """A name that is no exercise's (a mistake in the command, not in the reader's file)."""


def _known(name):
    if name not in CHECKS:
        raise UnknownExercise(f"there is no exercise {name!r}; the exercises are: "
                              f"{', '.join(CHECKS)}")


def load(path):
    """Import the Python file at ``path`` as a fresh module."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ExerciseFailed(f"{path} does not exist; run `python -m minicavs.exercises start "
                             f"{path.stem}` first")
    spec = importlib.util.spec_from_file_location(f"minicavs_exercise_{path.stem}_{id(path)}",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as stop:
        raise ExerciseFailed(f"importing {path} called sys.exit({stop.code!r}); a file that "
                             f"stops the checker cannot pass it") from None
    except Exception as error:
        raise ExerciseFailed(f"importing {path} failed: {type(error).__name__}: {error}") \
            from error
    return module


def check(name, path):
    """Check the reader's file ``path`` for exercise ``name``: returns a message, or raises
    :class:`ExerciseFailed` saying what is wrong — also where the file lacks a name the
    check needs, or stops the checker with ``sys.exit`` (which would exit with status 0)."""
    _known(name)
    module = load(path)
    try:
        return CHECKS[name][1](module)
    except SystemExit as stop:
        raise ExerciseFailed(f"your code called sys.exit({stop.code!r}) while it was checked; "
                             f"a file that stops the checker cannot pass it") from None
    except AttributeError as error:
        if error.obj is not module:
            raise
        raise ExerciseFailed(f"your file {path} defines no function named {error.name!r} (the "
                             f"template's; start again from it with --force)") from None


def start(name, folder="exercises", force=False):
    """Copy the template of ``name`` into ``folder``; return the new file's path."""
    source = template_path(name)
    target = pathlib.Path(folder) / f"{name}.py"
    if target.exists() and not force:
        raise ExerciseFailed(f"{target} exists already (edit it, or pass --force to start over)")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minicavs.exercises",
                                     description="The exercises of the documentation site.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the exercises, one per chapter")
    p_start = sub.add_parser("start", help="copy an exercise's template into ./exercises/")
    p_start.add_argument("name")
    p_start.add_argument("--folder", default="exercises")
    p_start.add_argument("--force", action="store_true")
    p_check = sub.add_parser("check", help="check your solution")
    p_check.add_argument("name")
    p_check.add_argument("--file", help="default: exercises/NAME.py")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name, (title, _) in CHECKS.items():
                print(f"{name:<12} {title}")
        elif args.command == "start":
            target = start(args.name, args.folder, args.force)
            print(f"wrote {target}: edit it, then run python -m minicavs.exercises check "
                  f"{args.name}")
        else:
            path = args.file or f"exercises/{args.name}.py"
            print(f"{args.name}: passed. {check(args.name, path)}")
    except UnknownExercise as failure:
        print(f"{parser.prog}: {failure}", file=sys.stderr)
        return 2
    except ExerciseFailed as failure:
        print(f"{args.name}: not yet. {failure}", file=sys.stderr)
        return 1
    return 0
