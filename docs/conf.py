"""Sphinx configuration of the minicavs site: `python -m sphinx -W -b html docs docs/_build/html`.

Sphinx with MyST-Parser: the pages stay markdown (the reference pages under docs/ were written
for GitHub and render unchanged), autodoc and napoleon make the API reference from the
docstrings, and -W turns every warning (a broken cross-reference, a bad docstring) into an
error. The figures are made at build time by the library's own code (_ext/minicavs_figures.py).
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)                                   # this checkout's minicavs, not another
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))
os.environ.setdefault("MINICAVS_DEVICE", "cpu")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import minicavs  # noqa: E402

project = "minicavs"
author = "the minicavs authors"
release = version = minicavs.__version__
copyright = "minicavs authors, MIT licence"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon",
              "sphinx.ext.viewcode", "minicavs_figures"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3            # '#how-it-works' links of the GitHub-era pages resolve

autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "alabaster"
html_title = f"minicavs {release}"
html_static_path = []
html_theme_options = {"description": "a dynamic-network framework, built to be read",
                      "fixed_sidebar": True, "page_width": "1100px", "sidebar_width": "240px"}
nitpicky = False
