"""Sphinx configuration of the fl_lightning documentation (built by ``bash scripts/docs.sh``)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

project = "fl_lightning"
author = "fl_lightning contributors"
copyright = "fl_lightning contributors"  # noqa: A001 (Sphinx's setting name)

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx-mathjax-offline",  # MathJax copied into the site: equations render offline
    "fl_docs",  # docs/source/_ext/fl_docs.py: the API and results pages, generated at each build
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path: list[str] = []

# Markdown: $...$ math, ``{ref}`` targets for every heading down to H3, definition lists and fenced directives.
myst_enable_extensions = ["dollarmath", "deflist", "colon_fence", "attrs_inline"]
myst_heading_anchors = 4

# Google-style docstrings.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
autoclass_content = "class"  # the classes document their arguments; an inherited __init__ is Lightning's
# Docstrings inherited from Lightning or torch carry their own projects' cross-references.
autodoc_inherit_docstrings = False

# Every cross-reference must resolve (-n). The machine that builds the docs is offline, so there is no intersphinx:
# names of other projects (torch, Lightning, numpy, the standard library) are left as plain text.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|lightning|lightning_utilities|numpy|np|pandas|matplotlib|jsonargparse|yaml|wandb|sklearn|flwr"
        r"|torchvision|typing_extensions|collections|typing|pathlib|os|io|argparse|enum|dataclasses|abc|subprocess"
        r"|concurrent|contextlib|functools|logging|random|re|signal|threading|types|builtins|_io)(\..*)?",
    ),
    (r"py:.*", r"[A-Za-z_]+"),  # a bare name (int, Tensor, Path, ...) in a signature or a docstring's type
    (r"py:.*", r".*\._[A-Za-z][\w.]*"),  # a private base class, shown under "Bases"
]

html_theme = "furo"
html_title = "fl_lightning"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
