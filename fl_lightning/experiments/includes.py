"""Sections of a Markdown file (README) generated from result files, so that its tables are the files' numbers.

A section is written between two markers, each on its own line; ``refresh`` replaces what lies between them with
the named file's text (its headings moved three levels down, so that a report's ``# title`` becomes a ``####``
heading)::

    <!-- generated from results/claims/claims.md: `python cli.py claims` refreshes it -->
    ...
    <!-- end generated -->

A file that is not Markdown (``.txt``: a script's printed output) is shown verbatim in a ``text`` code block. The
path is relative to the Markdown file's folder. ``stale_sections`` says which sections differ from their files
(a test keeps README's in step with ``results/``). Markers that do not pair up are an error, not a silent skip.
"""

from __future__ import annotations

import re
from pathlib import Path

from fl_lightning.core.files import write_text_atomic

START = "<!-- generated from "
END = "<!-- end generated -->"
SECTION = re.compile(
    r"^(?P<head><!-- generated from (?P<path>\S+?):?(?:[ \t][^\n]*)?-->\r?\n)"
    r"(?P<body>(?:(?!^<!-- generated from ).)*?)^(?P<end><!-- end generated -->)",
    re.S | re.M,
)
#: Heading levels added to an included file's headings.
DEMOTE = 3


def rendered(path: Path) -> str:
    """The text a section shows for the file at ``path``: a Markdown file's text, any other file's as a code block."""
    if not path.is_file():
        raise FileNotFoundError(f"generated section: no file {path}")
    text = path.read_text().rstrip("\n")
    if path.suffix != ".md":  # a script's printed output (e.g. a bench's table), shown verbatim
        return f"```text\n{text}\n```\n"
    return "\n".join("#" * DEMOTE + line if line.startswith("#") else line for line in text.splitlines()) + "\n"


def _sections(markdown: Path) -> tuple[str, list[re.Match[str]]]:
    text = markdown.read_text()
    found = list(SECTION.finditer(text))
    starts = len(re.findall(rf"^{re.escape(START)}", text, re.M))
    ends = len(re.findall(rf"^{re.escape(END)}", text, re.M))
    if not (starts == ends == len(found)):
        raise ValueError(
            f"{markdown}: {starts} '{START}...-->' and {ends} '{END}' markers make {len(found)} sections; each "
            "generated section needs both markers, on lines of their own"
        )
    return text, found


def stale_sections(markdown: Path) -> list[str]:
    """The files whose generated section in ``markdown`` differs from what they render to now."""
    _, found = _sections(markdown)
    return [m["path"] for m in found if m["body"] != rendered(markdown.parent / m["path"])]


def refresh(markdown: Path) -> list[str]:
    """Rewrite every generated section of ``markdown`` from its file; the files whose section changed."""
    text, _ = _sections(markdown)
    changed: list[str] = []

    def fill(m: re.Match[str]) -> str:
        body = rendered(markdown.parent / m["path"])
        if body != m["body"]:
            changed.append(m["path"])
        return m["head"] + body + m["end"]

    new = SECTION.sub(fill, text)
    if new != text:
        write_text_atomic(markdown, new)
    return changed
