"""Sphinx configuration. Build: ``nox -s docs``, or ``python -m sphinx -W --keep-going -b html docs OUT``."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent

# The checkout's package first, so the docs describe this tree whether or not it is installed; then the
# local extensions (docs/_ext/), which generate content from the code at build time.
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(DOCS / "_ext"))

from spool_reporter import __version__  # noqa: E402

project = "spool_reporter"
author = "spool_reporter developers"
copyright = "spool_reporter developers"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "spool_generated",  # the {spool-generated} mechanism and the figures pages
    "cli_reference",  # the CLI reference from spool_reporter.cli.build_parser()
    "what_is_sent",  # the allowlist table, a real event, and the dry-run requests per destination
    "code_facts",  # constants quoted from the code (caps, timeouts, back-off)
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# Furo, the theme of the libraries this project follows (urllib3, filelock, platformdirs): readable from a
# phone to a wide screen; a wide table scrolls inside its own box instead of running off the page
# (scripts/docs_shots.py checks every page at 390 and 1280 px in headless Chromium).
html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["spool.css"]  # the field table of what-is-sent.md, stacked on a phone
html_title = f"spool_reporter {release}"
