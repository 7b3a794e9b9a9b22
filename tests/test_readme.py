"""Every ```python block of the README runs on its own, in a fresh interpreter (so each block
must import what it uses); what a ``# → ...`` comment says a line prints is what it prints
(``...`` standing for figures that vary); and the Program dump the README prints is the one its
Tree-LSTM block really produces."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
TEXT_BLOCKS = re.findall(r"```text\n(.*?)```", README, re.S)


def run(code, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINICAVS_DEVICE="cpu",
               OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 4


def expected_outputs(block):
    """The ``# → text`` comments of a block, in order: what its lines say they print."""
    return [m.group(1).strip() for m in re.finditer(r"#\s*→\s*(.*)$", block, re.M)]


def check_outputs(expected, stdout):
    """Each expectation matches a whole line of ``stdout``, in order (``...``: anything)."""
    lines, at = stdout.splitlines(), 0
    for text in expected:
        pattern = re.compile(".*?".join(re.escape(part) for part in text.split("...")))
        found = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i].strip())),
                     None)
        assert found is not None, (f"the README says a line prints {text!r}; the block printed:"
                                   f"\n{stdout}")
        at = found + 1


def test_output_comments_are_checked_strictly():
    check_outputs(["(..., 3) [5, 3, 1]", "done"], "(2, 3) [5, 3, 1]\nx\ndone\n")
    with pytest.raises(AssertionError, match="says a line prints"):
        check_outputs(["VertexFunction(33 ops)"], "VertexFunction(31 ops)\n")
    with pytest.raises(AssertionError):  # order matters
        check_outputs(["b", "a"], "a\nb\n")


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_on_its_own(index, tmp_path):
    result = run(PYTHON_BLOCKS[index], tmp_path)
    assert result.returncode == 0, (f"README python block {index} failed:\n"
                                    f"{PYTHON_BLOCKS[index]}\n--- stderr ---\n{result.stderr}")
    check_outputs(expected_outputs(PYTHON_BLOCKS[index]), result.stdout)
    if "to_dot()" in PYTHON_BLOCKS[index]:  # the DOT file it says it writes, for Graphviz
        assert (tmp_path / "F.dot").read_text().startswith("digraph")


def test_the_readme_shows_what_its_blocks_print():
    assert sum(len(expected_outputs(b)) for b in PYTHON_BLOCKS) >= 8


def test_the_readme_program_dump_is_what_its_tree_lstm_prints(tmp_path):
    (block,) = [b for b in PYTHON_BLOCKS if "def tree_lstm(v):" in b]
    (dump,) = [b for b in TEXT_BLOCKS if b.startswith("program tree_lstm:")]
    result = run(block + "\nprint(F.program.dump())\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == dump.strip()
