"""docs/architecture.md against the code: its layer table is the import-linter contract of
pyproject.toml (which `lint-imports` in .ci/run checks against the imports), it and the
packages' READMEs name every module of the package, and the layout it describes holds (modules
named apart from the packages, the strategies apart from what they are built from)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from compaction_proxy.compaction.strategies import default_registry
from tests.deploy.files import REPO_ROOT

PACKAGE = REPO_ROOT / "proxy" / "compaction_proxy"
ARCHITECTURE = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
CONTRACTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "importlinter"
]["contracts"]
_TOP_LEVEL = re.compile(r"`proxy/compaction_proxy/(\w+)(?:/|\.py)`")


def doc_rows() -> list[tuple[str, set[str]]]:
    """The layer table's rows, top down: (layer, the package's top-level parts it names)."""
    section = ARCHITECTURE.split("## Layers and what each may import", 1)[1]
    table = section.split("| layer | where | may import |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:
        layer, where, _ = (cell.strip() for cell in line.strip("|").split("|", 2))
        rows.append((layer, set(_TOP_LEVEL.findall(where))))
    return rows


def contract_layers() -> list[set[str]]:
    """The layers contract's layers, top down, as the top-level parts each holds."""
    [layers] = [c["layers"] for c in CONTRACTS if c["type"] == "layers"]
    return [{name.strip().split(".")[1] for name in layer.split("|")} for layer in layers]


def package_parts() -> set[str]:
    """The package's top level: its subpackages and modules (the table of contents)."""
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return folders | modules


def test_the_layer_table_is_the_layers_contract_in_the_same_order() -> None:
    rows, layers = doc_rows(), contract_layers()
    assert rows[0][0] == "shell" and rows[-1][0] == "core"
    # Each row is a run of consecutive contract layers (the contract may split a row finer).
    row = 0
    for layer in layers:
        while not layer <= rows[row][1]:
            row += 1
            assert row < len(rows), f"{layer} is in no row of the table at or below the last"
    assert row == len(rows) - 1
    named = set().union(*(parts for _, parts in rows))
    assert named == set().union(*layers) == package_parts()


def test_the_top_level_is_a_table_of_contents() -> None:
    modules = {p.name for p in PACKAGE.glob("*.py")}
    assert modules == {"__init__.py", "__main__.py", "app.py", "cli.py"}


def test_no_module_has_the_name_of_a_package() -> None:
    # compaction/messages.py (OpenAI chat messages) beside wire/messages/ (Anthropic's API), or
    # compaction/summarizer.py beside summarizer/, sends a reader to the wrong place.
    packages = {p.parent.name for p in PACKAGE.rglob("__init__.py")}
    clashes = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.stem in packages
    )
    assert clashes == []


def test_the_strategies_folder_holds_the_strategies_and_their_interface() -> None:
    # A module at the top of compaction/strategies/ is a strategy a pipeline entry names, or
    # the interface a strategy is written against; what they are built from is in _support/.
    folder = PACKAGE / "compaction" / "strategies"
    registry = default_registry()
    registered = {registry.spec(name).strategy.__module__ for name in registry.names}
    strategies = {module.rsplit(".", 1)[1] for module in registered}
    interface = {"__init__", "base", "params", "registry", "builtin"}
    assert {p.stem for p in folder.glob("*.py")} == strategies | interface
    assert (folder / "_support" / "__init__.py").is_file()


def test_the_transport_is_plumbing_in_the_table_and_the_contracts() -> None:
    plumbing = next(line for line in ARCHITECTURE.splitlines() if line.startswith("| plumbing |"))
    assert "`proxy/compaction_proxy/upstream/_transport.py`" in plumbing
    held = [
        c for c in CONTRACTS if c.get("source_modules") == ["compaction_proxy.upstream._transport"]
    ]
    assert len(held) == 1 and held[0]["type"] == "forbidden"
    siblings = {p.stem for p in (PACKAGE / "upstream").glob("_*.py")} - {"_transport", "__init__"}
    assert {f"compaction_proxy.upstream.{s}" for s in siblings} <= set(held[0]["forbidden_modules"])


def _map_of(path: Path) -> str:
    """Where a module is named: a top-level one in docs/architecture.md, every other one in its
    top-level package's README (``proxy/compaction_proxy/<package>/README.md``)."""
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return ARCHITECTURE
    readme = PACKAGE / parts[0] / "README.md"
    return readme.read_text(encoding="utf-8") if readme.is_file() else ""


def test_every_module_of_the_package_is_named() -> None:
    unnamed = sorted(
        str(path.relative_to(REPO_ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
        and f"`{path.name}`" not in _map_of(path)
        and f"/{path.name}`" not in _map_of(path)
    )
    assert unnamed == []


def test_every_package_has_a_readme_the_map_links() -> None:
    """Each part's rules live beside it, and the one-page map points at every one."""
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert len(packages) >= 10
    for name in packages:
        assert (PACKAGE / name / "README.md").is_file(), name
        assert f"../proxy/compaction_proxy/{name}/README.md" in ARCHITECTURE, name
