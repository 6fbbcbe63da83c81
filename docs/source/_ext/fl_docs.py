"""Sphinx extension: writes the API reference's and the results' pages before each build.

The pages are generated into ``docs/source/_generated/`` (not in git), so that they follow the package and
``results/`` without anyone copying them:

- ``_generated/api/<module>.rst``: one page per module of the ``fl_lightning`` package (found on disk, so a module
  that is added or moved gets its page), each an ``automodule`` of its docstrings.
- ``_generated/results/<table>.md``: one page per folder of ``results/``: the folder's ``README.md`` (the prose:
  what was run, on which machine, what was found), then its comparison report (``report/results.md``, written by
  ``fl-lightning compare``) and its curves. ``results/claims/`` gives the claims page (``claims.md``,
  ``claims.png``, ``claims_settings.md``, written by ``fl-lightning claims``).

Links in the copied Markdown are rewritten for the page's new place: a link to another results folder's README or
report goes to that folder's page, a link to a file of the repository stays a link to it (a download), and a link
to a folder becomes its path in code, since a static site cannot list a folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent.parent
GENERATED = DOCS / "_generated"
PACKAGE = "fl_lightning"

#: Folders of ``results/`` that are no comparison (runs carried between sessions).
NOT_PAGES = frozenset({"unfinished"})

LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})(\s)", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LITERAL = re.compile(r"(``[^`]+``)([A-Za-z]?)")
SUBSTITUTION_START = re.compile(r"(?<!\\)\|(?=\S)")


def modules(root: Path = ROOT) -> list[str]:
    """Every public module of the package, packages first within their folder, in dotted form."""
    found: list[str] = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or "configs" in parts:
            continue
        found.append(".".join(parts))
    return sorted(found)


#: The API reference's sections: the package's three layers, each a prefix of module names.
LAYERS = (
    ("The package", "the names ``fl_lightning`` exports", lambda m: m == PACKAGE),
    (
        "Core (no Lightning)",
        "the Lightning-free units: a round's arithmetic, server optimizers, partitions, losses, evaluation, data",
        lambda m: m == f"{PACKAGE}.core" or m.startswith(f"{PACKAGE}.core."),
    ),
    (
        "Experiments",
        "comparisons, their reports and the claims table (nothing else imports them)",
        lambda m: m == f"{PACKAGE}.experiments" or m.startswith(f"{PACKAGE}.experiments."),
    ),
)


def api_index(names: list[str]) -> str:
    """The Markdown of the API reference's index: the modules by layer."""
    out = [
        "# API reference",
        "Generated from the docstrings at every build. The package has three layers, each importing only the ones "
        "before it: the Lightning-free core, the Lightning layer (the callback, the methods, the datamodule, the "
        "command line) and the experiments.",
    ]
    placed: set[str] = set()
    groups: list[tuple[str, str, list[str]]] = []
    for title, what, match in LAYERS:
        members = [m for m in names if match(m)]
        placed.update(members)
        groups.append((title, what, members))
    lightning = [m for m in names if m not in placed]
    groups.insert(
        2, ("Lightning layer", "the callback, the method modules, the datamodule, the executors, the CLI", lightning)
    )
    for title, what, members in groups:
        entries = "\n".join(f"api/{m}" for m in members)
        out.append(f"## {title}\n\n{what[0].upper() + what[1:]}.\n\n```{{toctree}}\n:maxdepth: 1\n\n{entries}\n```")
    return "\n\n".join(out) + "\n"


def api_page(module: str) -> str:
    """The reStructuredText of one module's API page."""
    is_package = (ROOT / module.replace(".", "/") / "__init__.py").is_file()
    title = f"``{module}``"
    options = "   :no-members:\n" if is_package else "   :members:\n   :show-inheritance:\n"
    return f"{title}\n{'=' * len(title)}\n\n.. automodule:: {module}\n{options}"


def table_names(root: Path = ROOT) -> list[str]:
    """The folders of ``results/`` that get a page: those with a README or a comparison report."""
    names = []
    for folder in sorted((root / "results").iterdir()):
        if not folder.is_dir() or folder.name in NOT_PAGES or folder.name == "claims":
            continue
        if (folder / "README.md").is_file() or (folder / "report" / "results.md").is_file():
            names.append(folder.name)
    return names


def _outside_fences(text: str, edit: Any) -> str:
    """``edit`` applied to the parts of ``text`` that are not fenced code blocks."""
    out, last = [], 0
    for m in FENCE.finditer(text):
        out.append(edit(text[last : m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(edit(text[last:]))
    return "".join(out)


def demote(text: str, levels: int) -> str:
    """Move every Markdown heading of ``text`` down by ``levels`` (``#`` becomes ``##`` for 1)."""
    return _outside_fences(text, lambda part: HEADING.sub(lambda m: "#" * levels + m.group(1) + m.group(2), part))


def relink(text: str, source: Path, page: Path, root: Path = ROOT) -> str:
    """Rewrite the relative links of Markdown read from ``source`` for a page written at ``page``."""

    def one(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path_part, _, anchor = target.partition("#")
        resolved = (source.parent / path_part).resolve()
        try:
            rel = resolved.relative_to(root.resolve())
        except ValueError:
            return m.group(0)
        parts = rel.parts
        if len(parts) >= 2 and parts[0] == "results" and (len(parts) == 2 and resolved.is_dir() or rel.suffix == ".md"):
            name = parts[1]
            if name == "claims" or name in table_names(root):
                return f"[{m['text']}]({name}.md)"
        if resolved.is_file():
            return f"{m['bang']}[{m['text']}]({_relative(resolved, page.parent)})"
        return f"{m['text']} (`{rel.as_posix()}{'/' if resolved.is_dir() else ''}`)"

    return _outside_fences(text, lambda part: LINK.sub(one, part))


def _relative(path: Path, start: Path) -> str:
    import os

    return Path(os.path.relpath(path, start)).as_posix()


def results_page(name: str, page: Path, root: Path = ROOT) -> str:
    """The Markdown of the page for ``results/<name>/``."""
    folder = root / "results" / name
    readme = folder / "README.md"
    report = folder / "report" / "results.md"
    parts: list[str] = []
    if readme.is_file():
        text = readme.read_text(encoding="utf-8").strip()
        if not text.startswith("# "):
            text = f"# {name}\n\n{text}"
        parts.append(relink(text, readme, page, root))
    else:
        parts.append(f"# {name}")
    parts.append(
        f"Files: `results/{name}/` (each run's `summary.json`, `metrics.csv`, `config.yaml`"
        + (", and the report's tables and plots under `report/`)." if report.is_file() else ").")
    )
    if report.is_file():
        body = report.read_text(encoding="utf-8").strip()
        body = re.sub(r"^# (.*)$", r"## Report: \1", body, count=1, flags=re.M)
        head, sep, rest = body.partition("\n")
        body = head + sep + demote(rest, 1)
        parts.append(
            "The report below is `report/results.md` as `fl-lightning compare --report-only` writes it from the "
            "runs in this folder."
        )
        parts.append(relink(body, report, page, root))
        curves = sorted((folder / "report").glob("curves_*.png"))
        if curves:
            parts.append("### Curves")
            for png in curves:
                setting = png.stem.removeprefix("curves_")
                parts.append(f"![learning curves, {name}, {setting}]({_relative(png, page.parent)})")
    return "\n\n".join(parts) + "\n"


def claims_page(page: Path, root: Path = ROOT) -> str:
    """The Markdown of the claims page, from ``results/claims/``."""
    folder = root / "results" / "claims"
    claims = relink((folder / "claims.md").read_text(encoding="utf-8").strip(), folder / "claims.md", page, root)
    settings = folder / "claims_settings.md"
    settings_text = relink(demote(settings.read_text(encoding="utf-8").strip(), 1), settings, page, root)
    parts = [
        "# The papers' claims",
        "Each claim of the five papers (`results/claims/paper_claims.yaml`) beside fl_lightning's paired result in "
        "the comparison that transposes its setting, with a verdict. `fl-lightning claims` writes "
        "`results/claims/claims.md`, `claims.csv`, `claims.png` and `claims_settings.md`; this page shows them.",
        claims,
        "## The claims as a figure",
        "fl_lightning's paired gain over FedAvg (mean ± std over seeds, coloured by verdict) beside the paper's gain "
        "(×), in accuracy points, or in forgetting F × 100 and mean drop, where lower is better. Speedups, claims "
        'with no paired gain and the papers\' "Failed" claims are in the table only.',
        f"![The papers' claims: the paper's gain over FedAvg and fl_lightning's]"
        f"({_relative(folder / 'claims.png', page.parent)})",
        settings_text,
    ]
    return "\n\n".join(parts) + "\n"


def generate(root: Path = ROOT, out: Path = GENERATED) -> list[Path]:
    """Write every generated page under ``out`` (replacing the folder); the pages written."""
    if out.exists():
        shutil.rmtree(out)
    written: list[Path] = []
    (out / "api").mkdir(parents=True)
    (out / "results").mkdir(parents=True)
    names = modules(root)
    for module in names:
        page = out / "api" / f"{module}.rst"
        page.write_text(api_page(module), encoding="utf-8")
        written.append(page)
    page = out / "api.md"
    page.write_text(api_index(names), encoding="utf-8")
    written.append(page)
    page = out / "results" / "claims.md"
    page.write_text(claims_page(page, root), encoding="utf-8")
    written.append(page)
    for name in table_names(root):
        page = out / "results" / f"{name}.md"
        page.write_text(results_page(name, page, root), encoding="utf-8")
        written.append(page)
    return written


def _on_builder_inited(app: Any) -> None:
    generate()


def _escape_literals(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Let an inline literal run into a word (````group````s) as Markdown-minded docstrings write it."""
    lines[:] = [_escape_line(line) for line in lines]


def _escape_line(line: str) -> str:
    """One docstring line with literals closed before a word and ``|x|`` (a norm, not a substitution) escaped."""
    out, last = [], 0
    for m in LITERAL.finditer(line):
        out.append(SUBSTITUTION_START.sub(r"\\|", line[last : m.start()]))
        out.append(m[1] + ("\\ " + m[2] if m[2] else ""))
        last = m.end()
    out.append(SUBSTITUTION_START.sub(r"\\|", line[last:]))
    return "".join(out)


def _attribute_prose_back(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Undo napoleon's reading of an attribute docstring's "Prose: more" as a type, "Prose", and "more".

    Napoleon takes the text before the first colon of an attribute's docstring as its type; the package's attribute
    docstrings are sentences ("How each upload key is reduced over clients: ..."), so a "type" with words is put
    back in front of the description.
    """
    if what not in ("attribute", "data", "property"):
        return
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*):type: (.*)$", line)
        if not m:
            continue
        kind = m[2].replace(", ", ",").replace(" | ", "|")
        if " " in kind:
            del lines[i]
            first = next((j for j, text in enumerate(lines) if text.strip()), None)
            if first is not None:
                lines[first] = f"{m[2]}: {lines[first]}"
            while lines and not lines[-1].strip():
                lines.pop()
        return


def _exported_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``fl_lightning.Name`` (a lazy export of the package) to the class in its defining module."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith(PACKAGE + "."):
        return None
    import importlib

    package = importlib.import_module(PACKAGE)
    head, _, rest = target[len(PACKAGE) + 1 :].partition(".")
    module = getattr(package, "_EXPORTS", {}).get(head)
    if module is None:
        return None
    canonical = f"{module}.{head}" + (f".{rest}" if rest else "")
    domain = env.get_domain("py")
    node["reftarget"] = canonical
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode)


def setup(app: Any) -> dict[str, Any]:
    """Register the page generator and the docstring fixes with Sphinx."""
    app.connect("builder-inited", _on_builder_inited)
    app.connect("autodoc-process-docstring", _escape_literals, priority=400)
    app.connect("autodoc-process-docstring", _attribute_prose_back, priority=600)
    app.connect("missing-reference", _exported_name)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
