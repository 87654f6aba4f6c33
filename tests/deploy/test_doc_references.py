"""Every section the code, the tests, the benchmarks or the docs name exists.

A docstring says ``see "The ledger" in docs/compaction.md``; a comment says
``docs/deploy.md#keys-and-tenants``. Markdown links are checked where they are rendered
(tests/deploy/test_docs.py); these plain-text references are checked here, so renaming a heading
fails the suite instead of leaving a pointer to nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.files import REPO_ROOT
from tests.deploy.test_docs import _headings, anchors

SOURCES = [
    *sorted(
        path
        for folder in ("proxy", "tests", "bench", "docs", "scripts")
        for pattern in ("*.py", "*.md")
        for path in (REPO_ROOT / folder).rglob(pattern)
        if "__pycache__" not in path.parts
        and "results" not in path.parts
        and path != Path(__file__)  # its own examples
    ),
    REPO_ROOT / "README.md",
    REPO_ROOT / "config.example.yaml",
]
"""Where a section may be named."""

PAGE = r"((?:docs/|bench/|tests/|compaction_proxy/[a-z_]+/)?[A-Za-z_-]+\.md)"
TITLED = [
    re.compile(r"\"([A-Z][^\"\n]{1,80})\"\s+in\s+(?:the\s+)?" + PAGE),  # "Title" in docs/x.md
    re.compile(PAGE + r",?\s+\"([A-Z][^\"\n]{1,80})\""),  # docs/x.md, "Title"
    re.compile(PAGE + r"\s+\(\"([A-Z][^\"\n]{1,80})\"\)"),  # docs/x.md ("Title")
]
ANCHORED = re.compile(PAGE + r"#([a-z0-9_-]+)")


def _page(name: str) -> Path | None:
    """The page a reference names: as a path from the repository's root, else under docs/ (a
    package's README, ``compaction_proxy/<package>/README.md``, under the source root)."""
    for candidate in (REPO_ROOT / name, REPO_ROOT / "docs" / name, REPO_ROOT / "proxy" / name):
        if candidate.is_file():
            return candidate
    return None


def _has_section(page: Path, title: str) -> bool:
    """A heading that is ``title``, or starts with it and goes on after a colon or a bracket
    (``The ledger`` names "The ledger: exact strings beside the summary")."""
    titles = [text.replace("`", "") for _, text in _headings(page.read_text(encoding="utf-8"))]
    wanted = title.replace("`", "")
    return any(t == wanted or t.startswith((f"{wanted}:", f"{wanted} (")) for t in titles)


def _references(path: Path) -> list[tuple[str, str, str]]:
    """(page, "title" or "#anchor", where) for every reference in ``path``'s text."""
    text = path.read_text(encoding="utf-8")
    found = []
    for pattern in TITLED:
        for match in pattern.finditer(text):
            first, second = match.group(1), match.group(2)
            page, title = (second, first) if first[0].isupper() else (first, second)
            found.append((page, title, f"{path.relative_to(REPO_ROOT)}"))
    for match in ANCHORED.finditer(text):
        found.append((match.group(1), "#" + match.group(2), f"{path.relative_to(REPO_ROOT)}"))
    return found


def test_the_sources_do_name_sections() -> None:
    """The scan finds what it is meant to (a pattern that matches nothing checks nothing)."""
    named = [ref for path in SOURCES for ref in _references(path)]
    assert len(named) >= 50
    assert any(title == "The ledger" for _, title, _ in named)
    assert any(title.startswith("#") for _, title, _ in named)
    assert any(page.startswith("compaction_proxy/") for page, _, _ in named)  # a package README


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_named_section_exists(path: Path) -> None:
    missing = []
    for name, title, where in _references(path):
        page = _page(name)
        if page is None:
            missing.append(f"{where}: no page {name}")
        elif title.startswith("#"):
            if title[1:] not in anchors(page.read_text(encoding="utf-8")):
                missing.append(f"{where}: no heading {title} in {name}")
        elif not _has_section(page, title):
            missing.append(f'{where}: no section "{title}" in {name}')
    assert not missing, missing
