"""The README a newcomer reads, and the docs it links to, stay short, whole and inside the repo.

The README is the front page: at most 15,000 characters, a table of contents that matches its
headings, and links for everything else. Every relative link in it and in the pages it leads to
(docs/, bench/, tests/README.md) must reach a file of this repository, and an anchor a heading of
that file, as GitHub renders them; no page may point outside the repository or name an outside
tracker. docs/configuration.md is the configuration reference, so it names every key the
settings models accept, each with its real default, and the README's short example must load.
"""

from __future__ import annotations

import re
import types
import typing
from collections import deque
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from compaction_proxy.compaction.strategies import StrategyParams, default_registry
from compaction_proxy.compaction.triggers import CONDITION_NAMES, Condition
from compaction_proxy.config import Settings, effective_config, load_settings, preflight
from tests.deploy.files import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
README_LIMIT = 15_000

PAGES = sorted(
    [
        README,
        *DOCS.glob("*.md"),
        REPO_ROOT / "bench" / "README.md",
        *(REPO_ROOT / "bench" / "results").glob("*.md"),
        REPO_ROOT / "tests" / "README.md",
    ]
)
"""Every page a reader can reach from the README."""

PROSE = [*PAGES, *sorted((REPO_ROOT / "bench").glob("*.py"))]
"""Pages and the benchmarks' printed text: where an outside tracker must not be named."""

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


# ----------------------------------------------------------------------------- reading markdown


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _headings(text: str) -> list[tuple[int, str]]:
    return [
        (len(m.group(1)), m.group(2)) for line in _prose_lines(text) if (m := HEADING.match(line))
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower-cased, without punctuation other than
    hyphens and underscores, spaces made hyphens."""
    text = LINK.sub(r"\1", heading).replace("`", "").strip().lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has; repeated headings get -1, -2, ... as on GitHub."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, heading in _headings(text):
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """Link targets in the prose (code blocks and code spans hold examples, not links)."""
    targets = []
    for line in _prose_lines(text):
        targets += [m.group(2) for m in LINK.finditer(CODE_SPAN.sub("", line))]
    return targets


def test_slug_follows_github() -> None:
    assert slug("Set-up: two commands") == "set-up-two-commands"
    assert slug("LibreChat's `summarization:` block") == "librechats-summarization-block"
    assert slug("Summaries made ahead of time (`summarization.prepare`)") == (
        "summaries-made-ahead-of-time-summarizationprepare"
    )
    assert slug("`models` and `default_context_window`") == "models-and-default_context_window"
    assert anchors("## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


# ----------------------------------------------------------------------------- the README


def test_readme_is_short() -> None:
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_LIMIT, f"README.md has {size} characters; move detail to docs/"


def test_readme_contents_list_its_headings() -> None:
    text = README.read_text(encoding="utf-8")
    headings = [(level, title) for level, title in _headings(text) if level in (2, 3)]
    assert headings[0] == (2, "Contents"), "the table of contents comes first"
    section = text[text.index("## Contents") :]
    section = section[len("## Contents") : section.index("\n## ")]
    entries = re.findall(r"^( *)- \[(.+)\]\(#([^)]+)\)\s*$", section, flags=re.M)
    listed = [(2 + len(indent) // 2, title, anchor) for indent, title, anchor in entries]
    wanted = [(level, title, slug(title)) for level, title in headings[1:]]
    assert listed == wanted


def test_readme_links_every_docs_page() -> None:
    targets = {t.split("#")[0] for t in links(README.read_text(encoding="utf-8"))}
    missing = [_rel(p) for p in sorted(DOCS.glob("*.md")) if _rel(p) not in targets]
    assert not missing, f"docs pages the README does not link: {missing}"


# ----------------------------------------------------------------------------- every page


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):
            assert target.startswith(("http://", "https://", "mailto:")), target
            continue
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):
            broken.append(f"{target}: an absolute path")
            continue
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(REPO_ROOT.resolve()):
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif (
            anchor
            and resolved.suffix == ".md"
            and anchor not in anchors(resolved.read_text(encoding="utf-8"))
        ):
            broken.append(f"{target}: no heading #{anchor} in {_rel(resolved)}")
    assert not broken, f"{_rel(page)}: {broken}"


MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users)/")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_page_names_a_path_of_the_machine_it_was_written_on(page: Path) -> None:
    """A command or path in a page works from a checkout: repository-relative, never the
    directories of the machine a benchmark or a note was made on."""
    found = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, f"{_rel(page)} names paths outside the repository: {found}"


TRACKER = re.compile(r"\bissues?[ _-]?#?\d+|\bissue\d+", flags=re.I)


@pytest.mark.parametrize("path", PROSE, ids=_rel)
def test_no_outside_tracker_is_named(path: Path) -> None:
    """A reader of the repository cannot open "issue 13": say what the thing is instead."""
    assert not TRACKER.search(_rel(path)), f"{_rel(path)}: name the file for what it holds"
    found = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, f"{_rel(path)} names an outside tracker: {found}"


# ----------------------------------------------------------------------------- configuration


def _parts(annotation: Any) -> list[Any]:
    """The types an annotation is made of, through Annotated, Optional and unions."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _parts(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [p for arg in typing.get_args(annotation) for p in _parts(arg)]
    return [] if annotation is type(None) else [annotation]


def _block(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """How a field nests a block of keys: (separator, model), or None for a value.

    Conditions and pipeline entries are values: their vocabulary is the strategies table."""

    def model(candidates: list[Any]) -> type[BaseModel] | None:
        if len(candidates) == 1 and isinstance(candidates[0], type):
            cls = candidates[0]
            if issubclass(cls, BaseModel) and not issubclass(cls, (Condition, StrategyParams)):
                return cls
        return None

    for part in _parts(annotation):
        origin = typing.get_origin(part)
        if origin in (list, tuple) and (found := model(_parts(typing.get_args(part)[0]))):
            return "[].", found
        if origin is dict and (found := model(_parts(typing.get_args(part)[1]))):
            return ".<name>.", found
        if found := model([part]):
            return ".", found
    return None


def settings_keys() -> list[str]:
    """Every key path the settings accept, breadth first, so a block reachable twice
    (`compaction` and `models.<name>.compaction`) is spelled out where it is shallowest."""
    keys: list[str] = []
    pending: deque[tuple[type[BaseModel], str]] = deque([(Settings, "")])
    expanded: set[type[BaseModel]] = {Settings}
    while pending:
        current, prefix = pending.popleft()
        for name, field in current.model_fields.items():
            key = prefix + (field.alias or name)
            block = _block(field.annotation)
            if block and block[1] not in expanded:
                expanded.add(block[1])
                pending.append((block[1], key + block[0]))
            else:
                keys.append(key)
    return keys


def _reference_rows() -> dict[str, str]:
    """docs/configuration.md's key tables: key -> its default cell."""
    rows: dict[str, str] = {}
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            rows[cells[0].strip("`")] = cells[1]
    return rows


_MISSING = object()


def _default(defaults: dict[str, Any], key: str) -> Any:
    """The embedded default of a key path (`upstreams[].name`: the first upstream's)."""
    value: Any = defaults
    for part in key.replace("[]", ".0").split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def test_configuration_reference_names_every_key_with_its_default() -> None:
    keys = settings_keys()
    assert "summarization.contextPruning.softTrim.headChars" in keys  # the walk goes deep
    rows = _reference_rows()
    missing = [k for k in keys if k not in rows]
    assert not missing, f"docs/configuration.md has no row for: {missing}"
    defaults = effective_config(Settings())
    wrong = []
    for key in keys:
        value = _default(defaults, key)
        if value is _MISSING:  # inside `models`, whose default is {}
            continue
        shown = re.match(r"`([^`]*)`", rows[key])
        if shown is None or yaml.safe_load(shown.group(1)) != value:
            wrong.append(f"{key}: documented {rows[key]!r}, default {value!r}")
    assert not wrong, wrong


def _readme_yaml() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Configuration at a glance") :]
    return str(re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0])


def test_readme_configuration_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(_readme_yaml(), encoding="utf-8")
    settings = load_settings(path, environ={})
    assert [u.name for u in settings.upstreams] == ["local", "openai"]
    assert settings.store.backend == "redis"
    # What `check-config` and `serve` refuse, the example must not trip (no key set here).
    assert preflight.problems(settings) == []
    assert preflight.serving_problems(settings) == []


def test_readme_key_table_names_real_keys() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Configuration at a glance") : text.index("## When things")]
    keys = set(settings_keys())
    named = re.findall(r"^\| `([a-z_.<>\[\]A-Z]+)`", section, flags=re.M)
    assert len(named) >= 5
    for key in named:
        assert key in keys, f"the README's table names {key}, which is no key"


def _strategy_rows() -> dict[str, str]:
    """docs/configuration.md's strategies table: name -> its row."""
    text = CONFIGURATION.read_text(encoding="utf-8")
    section = text[text.index("## Strategies") :]
    section = section[: section.index("\n## ", 1)]
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", section, re.M)}


def test_configuration_reference_names_every_strategy_parameter_and_trigger() -> None:
    registry = default_registry()
    rows = _strategy_rows()
    assert sorted(rows) == sorted(registry.names)
    common = {"strategy", "trigger", "target", "minimum_preserved"}  # "Every entry also takes"
    missing = []
    for name in registry.names:
        for field_name, field in registry.spec(name).params.model_fields.items():
            if field_name in common:
                continue
            spellings = {field_name, field.alias, _camel(field_name)} - {None}
            if not any(f"`{s}" in rows[name] for s in spellings):
                missing.append(f"{name}.{field_name}")
    assert not missing, f"the strategies table leaves out: {missing}"
    text = CONFIGURATION.read_text(encoding="utf-8")
    for key in common - {"strategy"}:
        assert f"`{key}`" in text
    assert not [c for c in CONDITION_NAMES if f"`{c}" not in text]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
