"""What each ``python`` block of a page prints, shown under it on the site: run at build time.

A page's ```` ```python ```` blocks run in order in one fresh interpreter and one namespace
(the convention tests/test_docs.py checks: a chapter builds on its earlier blocks), in a scratch
directory, on the CPU; ```` ```{mc-figure} ```` bodies run too, each in a namespace of its own,
because later blocks may rely on what they did on disk, but their output is the figure. What a
block writes to stdout appears right under it, as a text block marked "output" (long outputs
are cut after :data:`MAX_LINES` lines, saying how many were left out). A block that raises fails
the build with the page and line, as the test does.

The outputs are cached under ``docs/_generated/outputs`` by a digest of the page's blocks and
the library's source, so a rebuild runs only the pages whose code or library changed.
"""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from docutils import nodes
from markdown_fences import fences  # (docs/_ext: the test suite reads pages the same way)
from sphinx.util import logging

MAX_LINES = 60
ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(__file__).resolve().parents[1] / "_generated" / "outputs"
logger = logging.getLogger(__name__)

RUNNER = r"""
import contextlib, io, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
outputs = []
for kind, code, line in blocks:
    scope = namespace if kind == "python" else {"__name__": "__mc_figure__"}
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            exec(compile(code, f"<{sys.argv[2]}:{line}>", "exec"), scope)
    except BaseException:
        print(f"{sys.argv[2]} line {line}: the block failed", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    outputs.append(captured.getvalue() if kind == "python" else None)
json.dump(outputs, open(sys.argv[3], "w"))
"""


def runnable_blocks(text):
    """``(kind, code, line)`` of the blocks that run: ``python`` and ``{mc-figure}`` fences
    (a figure's ``:option:`` lines removed), in page order."""
    blocks = []
    for info, body, start in fences(text):
        if info == "python":
            blocks.append(("python", body, start))
        elif info.startswith("{mc-figure}"):
            code = body.split("\n")
            while code and re.match(r"^:[\w-]+:", code[0]):
                code.pop(0)
            blocks.append(("figure", "\n".join(code), start))
    return blocks


_DIGEST = None


def _library_digest():
    digest = hashlib.sha256()
    for path in sorted((ROOT / "minicavs").rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def run_page(blocks, name, library_digest):
    """The stdout of each block (None for figures), from the cache or a fresh run."""
    key = hashlib.sha256(json.dumps([blocks, library_digest]).encode()).hexdigest()[:24]
    cached = CACHE / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    with tempfile.TemporaryDirectory(prefix="mc-outputs-") as tmp:
        script, result = pathlib.Path(tmp) / "blocks.json", pathlib.Path(tmp) / "out.json"
        script.write_text(json.dumps(blocks))
        env = dict(os.environ, PYTHONPATH=str(ROOT), MINICAVS_DEVICE="cpu",
                   OPENBLAS_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-c", RUNNER, str(script), name, str(result)],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-4000:])
        outputs = json.loads(result.read_text())
    CACHE.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(outputs))
    return outputs


def shown(output):
    """The text shown for one block's stdout: cut after MAX_LINES lines."""
    lines = output.rstrip("\n").split("\n")
    if len(lines) > MAX_LINES:
        left = len(lines) - MAX_LINES
        lines = lines[:MAX_LINES] + [f"... ({left} more line{'s' if left > 1 else ''})"]
    return "\n".join(lines)


def add_outputs(app, doctree):
    docname = app.env.docname
    source = pathlib.Path(app.env.doc2path(docname))
    if source.suffix != ".md":
        return
    blocks = runnable_blocks(source.read_text(encoding="utf-8"))
    if not any(kind == "python" for kind, _, _ in blocks):
        return
    global _DIGEST
    if _DIGEST is None:  # once per build: the library does not change while it runs
        _DIGEST = _library_digest()
    digest = _DIGEST
    try:
        outputs = run_page(blocks, str(source.relative_to(ROOT)), digest)
    except RuntimeError as exc:
        logger.warning(f"a python block of {docname} fails:\n{exc}", location=docname)
        return
    pending = [(code.strip(), out) for (kind, code, _), out in zip(blocks, outputs)
               if kind == "python"]
    for block in list(doctree.findall(nodes.literal_block)):
        if not pending or block.get("language") != "python":
            continue
        if block.astext().strip() != pending[0][0]:
            continue  # shown, not run ({code-block} python)
        _, output = pending.pop(0)
        if output and output.strip():
            result = nodes.literal_block(shown(output), shown(output), language="text",
                                         classes=["mc-output"])
            block.parent.insert(block.parent.index(block) + 1, result)


def setup(app):
    app.connect("doctree-read", add_outputs)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
