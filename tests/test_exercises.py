"""The exercises of the documentation site (minicavs/exercises): for each, the checker fails on
the untouched template and passes on a reference solution (tests/exercise_solutions/), so the
checker itself is tested; and the command line starts, lists and checks."""

import os
import pathlib
import subprocess
import sys

import pytest

from minicavs import exercises
from minicavs.exercises import ExerciseFailed

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "tests" / "exercise_solutions"


def test_one_exercise_per_chapter():
    chapters = sorted(p.stem for p in (ROOT / "docs" / "path").glob("*.md"))
    assert sorted(exercises.names()) == chapters
    for name in exercises.names():
        assert f"python -m minicavs.exercises start {name}" in (
            ROOT / "docs" / "path" / f"{name}.md").read_text()


@pytest.mark.parametrize("name", exercises.names())
def test_the_template_fails_and_the_solution_passes(name):
    with pytest.raises(ExerciseFailed):
        exercises.check(name, exercises.template_path(name))
    message = exercises.check(name, SOLUTIONS / f"{name}.py")
    assert isinstance(message, str) and message


def test_the_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINICAVS_DEVICE="cpu")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "minicavs.exercises", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)

    listed = run("list")
    assert listed.returncode == 0 and "schedule" in listed.stdout
    started = run("start", "schedule")
    assert started.returncode == 0 and (tmp_path / "exercises" / "schedule.py").is_file()
    assert run("start", "schedule").returncode == 1          # no silent overwrite
    failed = run("check", "schedule")
    assert failed.returncode == 1 and "not yet" in failed.stderr
    (tmp_path / "exercises" / "schedule.py").write_text((SOLUTIONS / "schedule.py").read_text())
    passed = run("check", "schedule")
    assert passed.returncode == 0 and "passed" in passed.stdout
    unknown = run("check", "no-such-chapter")
    assert unknown.returncode == 2 and "not yet" not in unknown.stderr
    assert "there is no exercise 'no-such-chapter'; the exercises are: tensors, " in unknown.stderr


def test_a_file_that_exits_does_not_pass(tmp_path):
    """sys.exit(0) ended the checker with status 0, which the command line reads as a pass."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINICAVS_DEVICE="cpu")
    exiting = tmp_path / "tensors.py"
    for body in ("import sys\nsys.exit(0)\n",
                 "import sys\n\ndef softsign(x):\n    sys.exit(0)\n"):
        exiting.write_text(body)
        with pytest.raises(ExerciseFailed, match=r"sys.exit\(0\).*cannot pass it"):
            exercises.check("tensors", exiting)
        done = subprocess.run([sys.executable, "-m", "minicavs.exercises", "check", "tensors",
                               "--file", str(exiting)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 1 and "tensors: not yet. " in done.stderr, done.stderr


def test_a_file_without_the_function_gets_a_verdict_not_a_traceback(tmp_path):
    empty = tmp_path / "tensors.py"
    empty.write_text("# nothing written yet\n")
    with pytest.raises(ExerciseFailed, match=r"your file .*tensors.py defines no function named "
                                             r"'softsign'"):
        exercises.check("tensors", empty)
