"""The architecture page is the one design reference, and every citation of it names a real section.

- No file under the code folders, and no Markdown file anywhere in the repository, cites the old design
  card (which is not part of the repository).
- Every ``docs/ARCHITECTURE.md §<heading>`` in those files names a heading of ``docs/ARCHITECTURE.md``,
  and so does every ``§<heading>`` inside that page. A citation is written on one line and ends at a
  ``,``, ``;``, ``:``, ``)``, backtick, quote, ``*``, a full stop or the end of the line; several sections
  are cited as ``docs/ARCHITECTURE.md §A, §B``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
CODE_FOLDERS = ("swarm", "a3r", "memory", "templates", "bench", "examples", "tests")
SKIPPED_PARTS = frozenset({".git", ".venv", "__pycache__", "node_modules", ".mypy_cache", ".ruff_cache"})
OLD_CARD = "DESIGN" + ".md"  # spelled apart so that this file does not cite it
CITED = "docs/ARCHITECTURE.md"
THIS_FILE = Path(__file__).resolve()

_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_SECTION = re.compile(r"§([^§,;:()`\"*\n]+?)(?=\s*[,;:()`\"*]|\.(?:\s|$)|\s*$)")


def headings(markdown: str) -> set[str]:
    """The text of every ATX heading of ``markdown`` (fenced code blocks skipped)."""
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match:
            found.add(match.group(1))
    return found


def cited_sections(text: str, *, everywhere: bool = False) -> list[tuple[int, str]]:
    """``(line number, heading)`` of each section cited in ``text``: on lines that name
    ``docs/ARCHITECTURE.md`` (the ``§`` after it), or on every line when ``everywhere``."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if everywhere:
            tail = line
        elif CITED in line:
            tail = line[line.index(CITED) + len(CITED) :]
        else:
            continue
        found.extend((number, m.group(1).strip()) for m in _SECTION.finditer(tail))
    return found


def _text_files() -> list[Path]:
    """Every text file under the code folders, and every Markdown file of the repository."""
    files: set[Path] = set()
    for folder in CODE_FOLDERS:
        files.update(p for p in (ROOT / folder).rglob("*") if p.is_file())
    files.update(ROOT.rglob("*.md"))
    kept = []
    for path in sorted(files):
        if SKIPPED_PARTS & set(path.relative_to(ROOT).parts) or path.suffix in (".pyc", ".db", ".png"):
            continue
        kept.append(path)
    return kept


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary data (model files, images)


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    return {path: text for path in _text_files() if (text := _read(path)) is not None}


def test_the_architecture_page_exists_and_has_its_sections() -> None:
    names = headings(ARCHITECTURE.read_text(encoding="utf-8"))
    assert {"Layers", "One request's path", "State machine", "The training step", "Engine protocol"} <= names


def test_nothing_cites_the_old_design_card(texts: dict[Path, str]) -> None:
    assert texts, "no file was read"
    citing = [
        f"{path.relative_to(ROOT)}:{number}"
        for path, text in texts.items()
        for number, line in enumerate(text.splitlines(), start=1)
        if OLD_CARD in line
    ]
    assert not citing, f"cite docs/ARCHITECTURE.md §<section> instead of {OLD_CARD}: {citing}"


def test_every_cited_section_is_a_heading(texts: dict[Path, str]) -> None:
    names = headings(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = []
    for path, text in texts.items():
        if path == THIS_FILE:
            continue  # its examples cite sections that do not exist on purpose
        inside = path == ARCHITECTURE
        for number, section in cited_sections(text, everywhere=inside):
            if section not in names:
                missing.append(f"{path.relative_to(ROOT)}:{number} §{section}")
    assert not missing, f"no such heading in docs/ARCHITECTURE.md: {missing}"


def test_code_cites_the_page_somewhere(texts: dict[Path, str]) -> None:
    """The citations exist (a broken pattern that finds none would pass the test above vacuously)."""
    cited = {
        section
        for path, text in texts.items()
        if path not in (ARCHITECTURE, THIS_FILE)
        for _, section in cited_sections(text)
    }
    assert {"State machine", "The training step"} <= cited


# ------------------------------------------------------------------------------------------ the parser


def test_headings_skip_code_blocks() -> None:
    page = "# Title\n\n## State machine\n\n```\n# not a heading\n```\n### Call record ##\n"
    assert headings(page) == {"Title", "State machine", "Call record"}


@pytest.mark.parametrize(
    ("line", "sections"),
    [
        ("(docs/ARCHITECTURE.md §State machine)", ["State machine"]),
        ("see docs/ARCHITECTURE.md §Call record, §Sample.", ["Call record", "Sample"]),
        ("docs/ARCHITECTURE.md §Batch policies and quotas: when to train", ["Batch policies and quotas"]),
        ("docs/ARCHITECTURE.md §One request's path", ["One request's path"]),
        (
            "docs/ARCHITECTURE.md §Sample, §One request's path (token splicing)",
            ["Sample", "One request's path"],
        ),
        ("eq. of §4.1.2 in a paper", []),  # no citation of the page on this line
    ],
)
def test_citations_are_parsed(line: str, sections: list[str]) -> None:
    assert [s for _, s in cited_sections(line)] == sections


def test_a_wrong_citation_is_reported() -> None:
    names = {"State machine"}
    text = "x (docs/ARCHITECTURE.md §State machines)\ny docs/ARCHITECTURE.md §State\n"
    bad = [s for _, s in cited_sections(text) if s not in names]
    assert bad == ["State machines", "State"]
