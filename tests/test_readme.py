"""Every ```python block of the README runs on its own, in a fresh interpreter (so each block
must import what it uses), and the Program dump the README prints is the one its Tree-LSTM
block really produces."""

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


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_on_its_own(index, tmp_path):
    result = run(PYTHON_BLOCKS[index], tmp_path)
    assert result.returncode == 0, (f"README python block {index} failed:\n"
                                    f"{PYTHON_BLOCKS[index]}\n--- stderr ---\n{result.stderr}")


def test_the_readme_program_dump_is_what_its_tree_lstm_prints(tmp_path):
    (block,) = [b for b in PYTHON_BLOCKS if "def tree_lstm(v):" in b]
    (dump,) = [b for b in TEXT_BLOCKS if b.startswith("program tree_lstm:")]
    result = run(block + "\nprint(F.program.dump())\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == dump.strip()
