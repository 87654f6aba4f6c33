"""The benchmark's variants: each a name and a config overlay (a YAML file in
`bench/quality/variants/`), merged over the bench's base configuration.

Adding a variant is adding a file: `order`, `description` and `overlay` (the keys to merge),
and `quick: false` to leave it out of `--quick` runs.
Before a variant runs, the merged configuration goes through the proxy's own `check-config`;
a key this checkout does not know (the ledger switch, before the ledger exists) makes the
variant "not available on this checkout" in the report, with the proxy's own message, rather
than run as something it is not.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent / "variants"
UNCOMPACTED = "uncompacted"
"""The reference: the client's request as sent, scored without a proxy (it does not fit the
window, which is why the others exist)."""


@dataclass(frozen=True)
class Variant:
    name: str
    order: int
    description: str
    overlay: dict[str, Any]
    quick: bool = True
    """False: left out of `--quick` runs (a variant that costs model time but is not one of
    the headline comparisons)."""


def load(folder: Path = HERE) -> list[Variant]:
    variants = []
    for path in sorted(folder.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        variants.append(
            Variant(
                name=path.stem,
                order=int(data.get("order", 100)),
                description=str(data.get("description", "")).strip(),
                overlay=dict(data.get("overlay") or {}),
                quick=bool(data.get("quick", True)),
            )
        )
    return sorted(variants, key=lambda v: (v.order, v.name))


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` merged into a copy of ``base``: mappings merge key by key, anything else
    (lists included: a pipeline replaces a pipeline) replaces."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def unavailable(config_path: Path) -> str | None:
    """None when this checkout's proxy accepts the configuration, else its own message."""
    checked = subprocess.run(
        [sys.executable, "-m", "compaction_proxy", "check-config", str(config_path)],
        capture_output=True,
        text=True,
    )
    if checked.returncode == 0:
        return None
    lines = [line.strip() for line in (checked.stderr or checked.stdout).splitlines()]
    return " ".join(line for line in lines if line and "invalid configuration" not in line)


def needs_summarizer(config: dict[str, Any]) -> bool:
    """Whether the variant's pipeline can call the summarizer (the default pipeline with
    summarization on, or an explicit pipeline naming `summarization`)."""
    compaction = config.get("compaction") or {}
    pipeline = compaction.get("pipeline")
    if pipeline is None:
        return bool((config.get("summarization") or {}).get("enabled", True))
    return "summarization" in yaml.safe_dump(pipeline)
