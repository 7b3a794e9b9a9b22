"""Figures made by minicavs itself when the site is built: nothing drawn by hand that can drift.

A page writes

    ```{mc-figure}
    :caption: F of the cell above, coloured eager / core / lazy
    import minicavs as mc
    ...
    figure = F.program.graph.to_dot(F.program.classes, F.program.groups)
    ```

The body is ordinary Python, self-contained (it runs in a fresh namespace, in a scratch
directory), shown on the page as a code block and run again by tests/test_docs.py like every
``python`` block. Whatever it leaves in ``figure`` becomes the figure:

* DOT text (``digraph ...``, from ``Graph.to_dot()`` or ``GraphBatch.to_dot()``): rendered to
  SVG with Graphviz ``dot`` when it is installed; otherwise the DOT text itself is shown, with a
  note saying so (never a picture made some other way);
* a dict ``{"bars": {label: value}, "ylabel": ..., "title": ...}``: a bar chart drawn with
  matplotlib when it is installed (the ``plot`` extra), otherwise the same numbers as text bars;
* any other string (``explain()`` output, an autobatch picture): shown as text;
* a list of these: each in turn.
"""

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

GENERATED = "_generated"  # under the source folder; git-ignored, copied into _images by Sphinx


@contextlib.contextmanager
def _scratch_directory():
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield tmp
        finally:
            os.chdir(old)


def _dot_to_svg(text):
    """SVG text from Graphviz, or None where ``dot`` is not installed."""
    if shutil.which("dot") is None:
        return None
    result = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"dot -Tsvg failed: {result.stderr}")
    return result.stdout


def _bar_chart_png(spec, path):
    """Draw ``spec`` with matplotlib into ``path``; False where matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels, values = list(spec["bars"]), list(spec["bars"].values())
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.45 * len(labels)), dpi=100)
    ax.barh(labels[::-1], values[::-1], color="#4c72b0")
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=9)
    ax.set_xlabel(spec.get("ylabel", ""))
    ax.set_title(spec.get("title", ""), fontsize=10)
    ax.set_xlim(0, max(values) * 1.2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _text_bars(spec):
    top = max(spec["bars"].values()) or 1
    width = max(len(k) for k in spec["bars"])
    lines = [spec.get("title", ""), spec.get("ylabel", "")]
    lines += [f"{k:<{width}} {'#' * max(1, round(40 * v / top))} {v:.3g}"
              for k, v in spec["bars"].items()]
    return "\n".join(line for line in lines if line)


class MinicavsFigure(SphinxDirective):
    """The ``mc-figure`` directive (see the module docstring)."""

    has_content = True
    option_spec = {"caption": directives.unchanged, "name": directives.unchanged,
                   "hide-code": directives.flag}

    def run(self):
        code = "\n".join(self.content)
        namespace = {"__name__": "__mc_figure__"}
        try:
            with _scratch_directory():
                exec(compile(code, f"<{self.env.docname}: mc-figure>", "exec"), namespace)
        except Exception as error:  # the page's code is broken: fail the build, say where
            raise self.error(f"mc-figure code failed: {type(error).__name__}: {error}")
        if "figure" not in namespace:
            raise self.error("mc-figure code must leave the figure in a variable `figure`")
        shown = [] if "hide-code" in self.options else [self._code_block(code)]
        figures = namespace["figure"]
        figures = figures if isinstance(figures, list) else [figures]
        key = hashlib.sha1(f"{self.env.docname}\n{code}".encode()).hexdigest()[:12]
        made = []
        for i, figure in enumerate(figures):
            made += self._render(figure, f"{self.env.docname.replace('/', '-')}-{key}-{i}")
        return shown + made

    def _code_block(self, code):
        block = nodes.literal_block(code, code)
        block["language"] = "python"
        return block

    def _image(self, filename, data, mode):
        folder = os.path.join(self.env.srcdir, GENERATED)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, filename)
        if data is not None:
            with open(path, mode) as f:
                f.write(data)
        figure = nodes.figure(classes=["mc-figure"])
        figure += nodes.image(uri=f"/{GENERATED}/{filename}",
                              alt=self.options.get("caption", filename))
        return figure, path

    def _caption(self, figure):
        if "caption" in self.options:
            text = self.options["caption"]
            figure += nodes.caption(text, text)
        if "name" in self.options:
            self.add_name(figure)
        return figure

    def _note(self, text):
        return nodes.note("", nodes.paragraph(text, text))

    def _text(self, text, language="text"):
        block = nodes.literal_block(text, text)
        block["language"] = language
        return block

    def _render(self, figure, stem):
        if isinstance(figure, str) and figure.lstrip().startswith(("digraph", "graph")):
            svg = _dot_to_svg(figure)
            if svg is None:
                return [self._note("Graphviz `dot` was not installed when this site was built, "
                                   "so here is the DOT text the code produced (render it with "
                                   "`dot -Tsvg`):"), self._text(figure, "text")]
            node, _ = self._image(f"{stem}.svg", svg, "w")
            return [self._caption(node)]
        if isinstance(figure, dict) and "bars" in figure:
            node, path = self._image(f"{stem}.png", None, "wb")
            if _bar_chart_png(figure, path):
                return [self._caption(node)]
            return [self._note("matplotlib was not installed when this site was built "
                               "(pip install -e '.[plot]'); the same numbers as text:"),
                    self._text(_text_bars(figure))]
        if isinstance(figure, str):
            return [self._text(figure)]
        raise self.error(f"mc-figure: do not know how to show a {type(figure).__name__}")


def setup(app):
    app.add_directive("mc-figure", MinicavsFigure)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
