"""Sections of a Markdown file (README) generated from result files, so that its tables are the files' numbers.

A section is written between two markers; ``refresh`` replaces what lies between them with the named file's text
(its headings moved three levels down, so that a report's ``# title`` becomes a ``####`` heading)::

    <!-- generated from results/claims/claims.md: `python cli.py claims` refreshes it -->
    ...
    <!-- end generated -->

The path is relative to the Markdown file's folder. ``stale_sections`` says which sections differ from their files
(a test keeps README's in step with ``results/``).
"""

from __future__ import annotations

import re
from pathlib import Path

from fl_lightning.files import write_text_atomic

SECTION = re.compile(r"(<!-- generated from (?P<path>\S+?):?\s[^>]*-->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
#: Heading levels added to an included file's headings.
DEMOTE = 3


def rendered(path: Path) -> str:
    """The text a section shows for the file at ``path``."""
    if not path.is_file():
        raise FileNotFoundError(f"generated section: no file {path}")
    lines = path.read_text().rstrip("\n").splitlines()
    return "\n".join("#" * DEMOTE + line if line.startswith("#") else line for line in lines) + "\n"


def _sections(markdown: Path) -> list[re.Match[str]]:
    return list(SECTION.finditer(markdown.read_text()))


def stale_sections(markdown: Path) -> list[str]:
    """The files whose generated section in ``markdown`` differs from what they render to now."""
    base = markdown.parent
    return [m["path"] for m in _sections(markdown) if m["body"] != rendered(base / m["path"])]


def refresh(markdown: Path) -> list[str]:
    """Rewrite every generated section of ``markdown`` from its file; the files whose section changed."""
    text = markdown.read_text()
    base = markdown.parent
    changed: list[str] = []

    def fill(m: re.Match[str]) -> str:
        body = rendered(base / m["path"])
        if body != m["body"]:
            changed.append(m["path"])
        return m.group(1) + body + m.group(4)

    new = SECTION.sub(fill, text)
    if new != text:
        write_text_atomic(markdown, new)
    return changed
