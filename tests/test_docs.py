"""The documentation: no file names a document the repository lacks, every link resolves, and the site builds."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "source"
GENERATED = DOCS / "_generated"

#: A document named in text: a path or file name ending in a documentation suffix, not part of a URL.
DOCUMENT = re.compile(r"(?<![\w/.:-])([\w./-]*[\w-]\.(?:md|rst))(#[\w-]+)?\b")
#: A Markdown link or image, its text possibly wrapped over lines.
LINK = re.compile(r"!?\[(?:[^\]]|\n)*?\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _fl_docs():
    spec = importlib.util.spec_from_file_location("fl_docs", DOCS / "_ext" / "fl_docs.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def tracked(pattern: str) -> list[Path]:
    """Files of the working tree matching ``pattern`` (a glob from the root), outside generated and build folders."""
    return sorted(
        p
        for p in ROOT.glob(pattern)
        if p.is_file() and not {"_generated", "_build", ".venv", "unfinished"} & set(p.relative_to(ROOT).parts)
    )


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *tracked("docs/source/**/*.md"), *tracked("results/**/README.md")]


def generated_pages() -> set[Path]:
    """The pages ``docs/source/_ext/fl_docs.py`` writes at each build (without writing them)."""
    fl_docs = _fl_docs()
    pages = {GENERATED / "api.md", GENERATED / "results" / "claims.md"}
    pages |= {GENERATED / "api" / f"{m}.rst" for m in fl_docs.modules()}
    pages |= {GENERATED / "results" / f"{name}.md" for name in fl_docs.table_names()}
    return pages


def slug(heading: str) -> str:
    """GitHub's (and MyST's) anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower()) if "`" in heading else heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file defines: its headings' slugs and MyST's ``(label)=`` targets."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    found = {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}
    return found | set(re.findall(r"^\((\S+)\)=$", text, re.M))


def test_no_file_names_a_document_that_is_not_in_the_repository():
    files = [
        *tracked("fl_lightning/**/*.py"),
        *tracked("configs/**/*.yaml"),
        *tracked("scripts/*"),
        *markdown_files(),
        *tracked("results/claims/*"),
    ]
    documents = [p.relative_to(ROOT).as_posix() for p in [*tracked("**/*.md"), *tracked("**/*.rst")]]
    names = {d.rsplit("/", 1)[-1] for d in documents}
    generated = generated_pages()  # written by each docs build, so not in a fresh clone
    missing = []
    for path in files:
        if path.suffix not in {".py", ".yaml", ".md", ".sh", ".csv"} or path == Path(__file__):
            continue
        for m in DOCUMENT.finditer(path.read_text(encoding="utf-8")):
            name = m[1]
            if any(c in name for c in "<>{}*") or name.startswith("_generated/"):
                continue
            if "/" not in name:
                ok = name in names
            else:
                ok = (
                    any((base / name).exists() for base in (ROOT, path.parent, DOCS))
                    or (path.parent / name).resolve() in generated
                    or any(d.endswith("/" + name.lstrip("./")) for d in documents)
                )
            if not ok:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, "names of documents the repository does not hold:\n" + "\n".join(missing)


def test_markdown_links_and_anchors_resolve():
    generated = generated_pages()
    broken = []
    for path in markdown_files():
        text = FENCE.sub("", path.read_text(encoding="utf-8"))
        for m in LINK.finditer(text):
            target = m[1]
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not (dest.exists() or dest in generated):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and dest.exists() and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_generated_sections_and_summary_are_current():
    from fl_lightning.experiments import includes

    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_results.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for readme in tracked("results/**/README.md"):
        assert includes.stale_sections(readme) == [], f"{readme}: run includes.refresh on it"


def test_readme_is_short_and_starts_with_the_two_setup_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220
    commands = [line for line in lines if line.startswith("bash scripts/")]
    assert commands[:2] and commands[0].startswith("bash scripts/quickstart.sh")
    assert commands[1].startswith("bash scripts/test.sh")


def test_shipped_config_headers_are_a_few_lines():
    for path in tracked("configs/**/*.yaml"):
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line)
        assert len(header) <= 4, f"{path.relative_to(ROOT)}: a {len(header)}-line header (history goes to results/)"


@pytest.mark.slow
def test_docs_build_offline_with_no_warning(tmp_path):
    env = {**os.environ, "DOCS_OUT": str(tmp_path / "html"), "DOCS_DOCTREES": str(tmp_path / "doctrees")}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "docs.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    html = tmp_path / "html"
    assert "FedNTD" in (html / "searchindex.js").read_text(encoding="utf-8")
    assert (html / "_generated" / "api" / "fl_lightning.methods.html").is_file()
    assert (html / "_generated" / "results" / "claims.html").is_file()
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file()
    remote = []
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote += [
            f"{page.name}: {m}" for m in re.findall(r"<(?:script|link|img)[^>]*(?:src|href)=\"(https?:[^\"]*)", text)
        ]
    assert not remote, "pages that load from the network:\n" + "\n".join(sorted(set(remote))[:20])
