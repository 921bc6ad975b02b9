"""The documentation's links: every relative link in README.md and docs/*.md points to a file that exists
(and, with an anchor, to a heading of that file), the README stays a front page of at most 250 lines, and
it links to every page in docs/. References in prose and comments hold too: every `labkit/…`, `tests/…`, `docs/…`,
`bench/…` or `notebooks/…` file path named in the repository's text files exists, and every `labkit.<package>.…`
module path names a module (and a name it defines)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import top_level_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked (a `# comment` in a shell block is not a heading)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (a link written in code is not a link)."""
    return INLINE_CODE.sub("code", without_fences(text))


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link in a file, outside code."""
    text = prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = text.replace("`", "").replace("*", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (repeated headings get -1, -2, …)."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(without_fences(path.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def shown(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of a file whose target file, or heading, does not exist."""
    problems = []
    for line, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{shown(path, root)}:{line}: ({target})"
        if not resolved.exists():
            problems.append(f"{where} no such file: {resolved}")
        elif anchor and resolved.suffix == ".md" and unquote(anchor).lower() not in anchors(resolved):
            problems.append(f"{where} no heading with anchor #{anchor} in {shown(resolved, root)}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_a_front_page() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {MAX_README_LINES})"


def test_readme_links_every_docs_page() -> None:
    pages = {p.resolve() for p in DOCS.iterdir() if p.is_file()}
    assert pages, "docs/ holds no pages"
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve() for _, t in links(README) if not EXTERNAL.match(t)}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked)
    assert not missing, f"README.md does not link to: {', '.join(missing)}"


@pytest.mark.parametrize("heading, anchor", [
    ("The five stages", "the-five-stages"),
    ("`labkit compare EXPERIMENT`: every variant, under one protocol",
     "labkit-compare-experiment-every-variant-under-one-protocol"),
    ("Early stopping on the card's metric", "early-stopping-on-the-cards-metric"),
    ("04 · Training", "04--training"),
    ("Variants and `parent:`", "variants-and-parent"),
    ("snake_case and [a link](x.md)", "snake_case-and-a-link"),
])
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Present heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](other.md#present-heading) [same](#top) [gone](missing.md) [bad](other.md#absent)\n"
                    "[ext](https://example.org/x) [mail](mailto:a@b.c) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n", encoding="utf-8")
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 2, problems
    assert "missing.md" in problems[0] and "#absent" in problems[1]


# ------------------------------------------------------------------ file and module references in text
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".ipynb", ".cfg", ".txt"}
SKIP_PARTS = {".git", ".venv", ".venv-sky", "venv", "__pycache__", ".pytest_cache", "build", "dist", "runs",
              "node_modules"}
FILE_REF = re.compile(r"(?<![\w./-])((?:labkit|tests|docs|bench|notebooks)/[\w./-]*\w\.(?:py|md|ipynb|yaml|json|toml))\b")
MODULE_REF = re.compile(r"\blabkit(?:\.[A-Za-z_]\w*)+")


def text_files(root: Path = ROOT) -> list[Path]:
    """The repository's text files (sources, docs, cards, notebooks, Makefile), outside caches and virtual envs."""
    return sorted(p for p in root.rglob("*") if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts)
                  and not any(part.endswith(".egg-info") for part in p.parts)
                  and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile"))


def stale_paths(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file:line: path` for every repository path a text names that does not exist (a pattern such as `tests/*.py`
    or `docs/<page>.md` is not a path)."""
    problems = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in FILE_REF.finditer(line):
                if not (root / match.group(1)).exists():
                    problems.append(f"{shown(path, root)}:{number}: {match.group(1)}")
    return problems


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in (root / "labkit").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def stale_modules(files: list[Path], root: Path = ROOT) -> list[str]:
    """`file:line: labkit.x.y` for every dotted reference into a labkit package (`labkit.<package>.…`) that names no
    module, or a name its module does not define (`labkit.run_id`, an MLflow tag, is no package reference)."""
    modules = _modules(root)
    packages = {name.split(".")[1] for name in modules if name.count(".") >= 1}
    names: dict[str, set[str]] = {}
    problems = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in MODULE_REF.finditer(line):
                parts = match.group(0).split(".")
                if parts[1] not in packages:
                    continue
                k = max(k for k in range(1, len(parts) + 1) if ".".join(parts[:k]) in modules or k == 1)
                module = ".".join(parts[:k])
                if module not in modules:
                    problems.append(f"{shown(path, root)}:{number}: {match.group(0)} (no such module)")
                    continue
                if k < len(parts):
                    defined = names.setdefault(module, top_level_names(modules[module]))
                    if parts[k] not in defined and parts[k] != "py":
                        problems.append(f"{shown(path, root)}:{number}: {match.group(0)} ({module} defines no {parts[k]})")
    return problems


def test_named_paths_exist() -> None:
    files = text_files()
    assert ROOT / "pyproject.toml" in files and ROOT / "labkit" / "cli" / "main.py" in files
    problems = stale_paths(files)
    assert not problems, "paths named in text that do not exist:\n" + "\n".join(problems)


def test_named_modules_exist() -> None:
    problems = stale_modules(text_files())
    assert not problems, "module references that do not resolve:\n" + "\n".join(problems)


def test_a_stale_reference_is_found(tmp_path: Path) -> None:
    (tmp_path / "labkit" / "core").mkdir(parents=True)
    (tmp_path / "labkit" / "__init__.py").write_text("")
    (tmp_path / "labkit" / "core" / "__init__.py").write_text("")
    (tmp_path / "labkit" / "core" / "io.py").write_text("def read_json():\n    pass\n")
    gone = "labkit" + "/core/resources.py"  # split so that this file names no missing path itself
    (tmp_path / "pyproject.toml").write_text(f"# {gone} finds them; labkit/core/io.py reads them\n")
    (tmp_path / "notes.md").write_text("labkit.core.io.read_json and labkit.core.io.write_json; " + "labkit" +
                                       ".core.gone; labkit.run_id is a tag; `tests/unit/*.py` is a pattern\n")
    files = text_files(tmp_path)
    assert stale_paths(files, tmp_path) == [f"pyproject.toml:1: {gone}"]
    assert stale_modules(files, tmp_path) == ["notes.md:1: labkit.core.io.write_json (labkit.core.io defines no "
                                              "write_json)", "notes.md:1: " + "labkit" + ".core.gone (labkit.core defines no gone)"]
