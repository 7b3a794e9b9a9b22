"""Sphinx configuration of the minicavs site: `python -m sphinx -W -b html docs docs/_build/html`.

Sphinx with MyST-Parser: the pages stay markdown (the reference pages under docs/ were written
for GitHub and render unchanged), autodoc and napoleon make the API reference from the
docstrings, and -W turns every warning (a broken cross-reference, a bad docstring) into an
error. The figures are made at build time by the library's own code (_ext/minicavs_figures.py),
and what each python block prints is run and shown under it (_ext/minicavs_outputs.py).
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
              "sphinx.ext.viewcode", "minicavs_figures", "minicavs_outputs"]
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

# Furo (the docs extra): a theme made for reading, light and dark, a sidebar that folds away on
# a phone. Where it is not installed the build falls back on Sphinx's own alabaster.
try:
    import furo  # noqa: F401
    html_theme = "furo"
    html_theme_options = {}
except ImportError:
    html_theme = "alabaster"
    html_theme_options = {"description": "a dynamic-network framework, built to be read",
                          "fixed_sidebar": True, "page_width": "1100px",
                          "sidebar_width": "240px"}
html_title = f"minicavs {release}"
html_static_path = ["_static"]
html_css_files = ["minicavs.css"]  # code wraps; what a block printed is shown under it
nitpicky = False
