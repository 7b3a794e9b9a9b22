"""Every code block of the documentation site runs (docs/**/*.md), as the README's do.

The convention, checked here for every fence of every page:

* ```` ```python ```` runs. The blocks of one page run in order, in one interpreter and one
  namespace (a chapter builds on its earlier blocks, as a reader typing along does), in a
  scratch directory, on the CPU;
* ```` ```{mc-figure} ```` is a figure made at build time (docs/_ext/minicavs_figures.py): its
  body runs too, in a fresh namespace of its own (as the build runs it), and must set
  ``figure``;
* anything else is explicitly *not* run, and says so by its marker: a language other than
  python (```` ```bash ````, ```` ```text ````) or ```` ```{code-block} python ```` for Python
  shown but not run (the library's own lines, a sketch). A fence without a language fails the
  test: every block must say which of these it is.

The counts are printed at the end of the run (tests/conftest.py), e.g. "docs: 41 python blocks
and 6 figures ran on 23 pages; 30 blocks marked not to run".
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
COUNTS = {"python": 0, "figure": 0, "not_run": 0, "pages": 0}
sys.path.insert(0, str(DOCS / "_ext"))
from markdown_fences import fences  # noqa: E402  (the docs build reads pages the same way)


def figure_code(body):
    """The Python of an ``mc-figure`` body: its ``:option:`` lines removed."""
    lines = body.split("\n")
    while lines and re.match(r"^:[\w-]+:", lines[0]):
        lines.pop(0)
    return "\n".join(lines)


def classify(page):
    """(kind, code, line) for each block of ``page``: kind "python", "figure" or "not run"."""
    return classify_text(page.read_text(), str(page.relative_to(ROOT)))


def classify_text(text, name):
    out = []
    for info, body, line in fences(text):
        if not info:
            raise AssertionError(f"{name}:{line}: a fence without a language; "
                                 f"mark it python (runs), or text, bash, "
                                 f"{{code-block}} python (shown, not run)")
        if info == "python":
            out.append(("python", body, line))
        elif info.startswith("{mc-figure}"):
            out.append(("figure", figure_code(body), line))
        else:
            out.append(("not run", body, line))
    return out


RUNNER = r"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for kind, code, line in blocks:
    scope = namespace if kind == "python" else {"__name__": "__mc_figure__"}
    try:
        exec(compile(code, f"<{sys.argv[2]}:{line}>", "exec"), scope)
    except BaseException:
        print(f"BLOCK FAILED: {sys.argv[2]} line {line} ({kind})", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    if kind == "figure" and "figure" not in scope:
        print(f"BLOCK FAILED: {sys.argv[2]} line {line}: an mc-figure must set `figure`",
              file=sys.stderr)
        sys.exit(1)
"""


def test_the_docs_have_pages():
    assert any(p.parent.name == "path" for p in PAGES), "no chapters under docs/path/"
    assert (DOCS / "index.md") in PAGES


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_docs_page_blocks_run(page, tmp_path):
    blocks = classify(page)
    runnable = [b for b in blocks if b[0] != "not run"]
    COUNTS["pages"] += 1
    COUNTS["not_run"] += len(blocks) - len(runnable)
    if not runnable:
        return  # nothing to run: every block is marked (checked by classify above)
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps(runnable))
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINICAVS_DEVICE="cpu",
               OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", RUNNER, str(script),
                             str(page.relative_to(ROOT))], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{page.relative_to(ROOT)}:\n{result.stderr[-6000:]}"
    COUNTS["python"] += sum(kind == "python" for kind, _, _ in runnable)
    COUNTS["figure"] += sum(kind == "figure" for kind, _, _ in runnable)


def test_fences_are_read_as_the_site_reads_them():
    text = ("a\n```python\nx = 1\n```\n````{mc-figure}\n:caption: c\nfigure = 'f'\n````\n"
            "```{code-block} python\nshown()\n```\n```text\nout\n```\n")
    kinds = [(k, c) for k, c, _ in classify_text(text, "page.md")]
    assert kinds == [("python", "x = 1"), ("figure", "figure = 'f'"),
                     ("not run", "shown()"), ("not run", "out")]
    with pytest.raises(AssertionError, match="without a language"):
        classify_text("```\nbare\n```\n", "page.md")


def test_the_site_runs_the_blocks_this_test_runs():
    """docs/_ext/minicavs_outputs.py shows what each python block prints: it must run exactly
    the blocks this test runs, in the same order, with the same code."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import minicavs_outputs
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    for page in PAGES:
        ours = [(kind, code) for kind, code, _ in classify(page) if kind != "not run"]
        site = [(kind, code) for kind, code, _ in
                minicavs_outputs.runnable_blocks(page.read_text())]
        assert site == ours, page
    long = "\n".join(str(i) for i in range(minicavs_outputs.MAX_LINES + 5))
    assert minicavs_outputs.shown(long).endswith("... (5 more lines)")
    assert minicavs_outputs.shown("a\nb\n") == "a\nb"

