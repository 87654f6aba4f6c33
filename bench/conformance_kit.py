"""An outside yardstick: the compaction-conformance-kit's fixed-budget benchmark (10/20/30% of
the original transcript, in characters, fixed across 5 rounds; typed canaries: safety rules,
hard constraints, facts, goal state, user preferences) with the proxy's presets beside the
kit's own baselines.

    python -m bench.conformance_kit [--out bench/results/conformance-kit.md]
                                    [--budgets 0.1,0.2,0.3] [--seeds 1-4] [--rounds 5]

The kit runs in its own virtualenv, never the project's (like LiteLLM in `.venv-litellm`):

    python3 -m venv .venv-ckit && .venv-ckit/bin/pip install 'compaction-conformance-kit==0.8.0'

This module starts one compaction-proxy process whose `models:` declare, for each preset, a
ladder of windows (a model name per preset and window, its `compaction` block the preset's),
then runs bench/conformance_kit_runner.py with the kit's interpreter; the runner calls the
proxy's preview route and picks, per session, the largest window whose output fits the kit's
cap (see its docstring). No summarizer anywhere: every preset here is deterministic, like the
kit's baselines. About a minute.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.conformance_kit_runner import WINDOWS, model_name
from bench.harness import REPO, cpu_model, stamp
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import ProxyServer

KIT_VENV = REPO / ".venv-ckit"
KIT_VERSION = "0.8.0"
TRUNCATION = {
    "strategy": "truncation",
    "trigger": {"type": "token_ratio", "value": 0.8},
    "target": {"type": "token_ratio", "value": 0.5},
}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": (
        "the default pipeline without a summarizer (`summarization.enabled: false`: pruning, "
        "tool-result collapse, truncation; the user messages of folded turns carried within "
        "15% of the budget; the ledger: the folded turns' rules and labelled statements kept "
        "verbatim, its other items within half the budget)",
        {},
    ),
    "no-ledger": (
        "the default pipeline with `compaction.ledger.enabled: false`: what the ledger adds",
        {"ledger": {"enabled": False}},
    ),
    "truncation": (
        "truncation only (past 80% of the budget, oldest groups dropped until 50% holds; the "
        "carried user messages as in every pipeline; an explicit pipeline, so no ledger)",
        {"pipeline": [TRUNCATION]},
    ),
    "truncation-ledger": (
        "truncation only, with `compaction.ledger.enabled: true`",
        {"pipeline": [TRUNCATION], "ledger": {"enabled": True}},
    ),
    "carry-0.5": (
        "the default pipeline with `compaction.carry_user_messages: 0.5` (the most it takes): "
        "folded turns' user messages carried within half the budget",
        {"carry_user_messages": 0.5},
    ),
    "no-carry": (
        "the default pipeline with `compaction.carry_user_messages: 0` (nothing carried): "
        "what the carried user messages add",
        {"carry_user_messages": 0},
    ),
}
CANARY_TYPES = ("safety_rule", "hard_constraint", "fact", "goal_state", "user_preference")


def proxy_config() -> dict[str, Any]:
    models: dict[str, Any] = {}
    for preset, (_, block) in PRESETS.items():
        for window in WINDOWS:
            entry: dict[str, Any] = {"context_window": window, "max_output_tokens": 1}
            entry["compaction"] = {"calibration": {"enabled": False}, **block}
            models[model_name(preset, window)] = entry
    return {
        "server": {"host": "127.0.0.1", "port": 8080, "log_level": "warning"},
        "upstreams": [
            # Never called: the preview forwards nothing and no preset has a summarizer.
            {"name": "none", "base_url": "http://127.0.0.1:9/v1", "keyless": True}
        ],
        "models": models,
        "store": {"backend": "memory"},
        "summarization": {"enabled": False},
        "compaction": {"calibration": {"enabled": False}},
        "windows": {"discover": False},
    }


def kit_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"no {python}: install the kit into its own virtualenv first, from the repository "
            f"root: python3 -m venv .venv-ckit && .venv-ckit/bin/pip install "
            f"'compaction-conformance-kit=={KIT_VERSION}'"
        )
    return python


def installed_version(python: Path) -> str:
    got = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m; print(m.version('compaction-conformance-kit'))",
        ],
        capture_output=True,
        text=True,
    )
    return got.stdout.strip() or "unknown"


def render(payload: dict[str, Any], args: argparse.Namespace, version: str, seconds: float) -> str:
    kit_names = [
        e["compactor"] for e in payload["entries"] if not e["compactor"].startswith("proxy:")
    ]
    lines = [
        "# compaction-conformance-kit: the budget benchmark with the proxy's presets",
        "",
        f"Run {stamp()}, `python -m bench.conformance_kit` ({seconds:.0f} s; {cpu_model()}). "
        f"compaction-conformance-kit {version} in its own virtualenv (`.venv-ckit`); seeds "
        f"{args.seeds}, {payload['rounds']} rounds; budgets in {payload['budget_unit']}.",
        "",
        "Survival is the kit's: a canary survives the final round only if every probe of it "
        "passes on the compacted text (its exact tokens, and for rules the blocking behaviour), "
        "over the randomized corpus (20 canaries per session); semantic resolution and distinct "
        "pairs come from the kit's two paraphrased-update corpora. Ranked by the kit (budget "
        "compliance first, then survival, resolution, distinct pairs, size).",
        "",
        "The proxy's presets (no summarizer in any), each reached through "
        "`POST /v1/compaction/preview` at the largest window of a ladder "
        f"({payload['windows'][0]}-{payload['windows'][-1]} tokens, steps of 2%) whose output "
        "fits the cap (bench/conformance_kit_runner.py):",
        "",
    ]
    lines += [f"- `proxy:{name}`: {desc}" for name, (desc, _) in PRESETS.items()]
    lines += [
        "",
        f"The kit's baselines: {', '.join(f'`{n}`' for n in dict.fromkeys(kit_names))}.",
        "",
    ]
    verdicts = []
    for budget in payload["budgets"]:
        group = sorted(
            (e for e in payload["entries"] if e["budget_fraction"] == budget),
            key=lambda e: e["rank"],
        )
        lines += [
            f"## Budget {budget:.0%}",
            "",
            "| rank | compactor | compliant | survival | "
            + " | ".join(CANARY_TYPES)
            + " | semantic resolved | distinct pairs | final output |",
            "|---:|---|---|---:|" + "---:|" * len(CANARY_TYPES) + "---:|---:|---:|",
        ]
        for e in group:
            types = e["randomized"]["final_median_by_type"]
            name = e["compactor"]
            shown = f"**{name}**" if name.startswith("proxy:") else name
            lines.append(
                f"| {e['rank']} | {shown} | {'yes' if e['budget_compliant'] else 'NO'} | "
                f"{e['randomized']['overall_final_survival']:.0%} | "
                + " | ".join(f"{types.get(t, 0):.0%}" for t in CANARY_TYPES)
                + f" | {e['semantic']['resolved_rate']:.0%} | "
                f"{e['semantic']['distinct_pair_rate']:.0%} | {e['mean_final_output_ratio']:.0%} |"
            )
        lines.append("")
        kit = [
            e for e in group if not e["compactor"].startswith("proxy:") and e["budget_compliant"]
        ]
        best = max(kit, key=lambda e: e["randomized"]["overall_final_survival"], default=None)
        ours = next((e for e in group if e["compactor"] == "proxy:default"), None)
        if best is not None and ours is not None:
            mine = ours["randomized"]["overall_final_survival"]
            theirs = best["randomized"]["overall_final_survival"]
            met = ours["budget_compliant"] and mine >= theirs
            verdicts.append(
                f"| {budget:.0%} | {mine:.0%} | {best['compactor']} {theirs:.0%} | "
                f"{'met' if met else 'not met'} |"
            )
    lines += [
        "## The target",
        "",
        "The proxy's default preset (no summarizer) at or above the kit's best budget-compliant "
        "baseline, asked at the 20% and 30% budgets:",
        "",
        "| budget | proxy:default | best kit baseline | |",
        "|---:|---:|---|---|",
        *verdicts,
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conformance_kit", description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--budgets", default="0.1,0.2,0.3")
    parser.add_argument("--seeds", default="1-4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--venv", type=Path, default=KIT_VENV, help="the kit's virtualenv")
    args = parser.parse_args(argv)
    python = kit_python(args.venv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-ckit-") as tmp:
        work = Path(tmp)
        config = work / "proxy.yaml"
        config.write_text(yaml.safe_dump(proxy_config(), sort_keys=False), encoding="utf-8")
        env = {"TIKTOKEN_CACHE_DIR": tiktoken_cache_dir()}
        proxy = ProxyServer(config, work / "proxy.log", env=env).start()
        try:
            ran = subprocess.run(
                [
                    str(python),
                    "-m",
                    "bench.conformance_kit_runner",
                    "--proxy",
                    proxy.url,
                    "--presets",
                    ",".join(PRESETS),
                    "--budgets",
                    args.budgets,
                    "--seeds",
                    args.seeds,
                    "--rounds",
                    str(args.rounds),
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
        finally:
            proxy.stop()
    if ran.returncode != 0:
        raise SystemExit(f"the kit's run failed ({ran.returncode}):\n{ran.stderr[-4000:]}")
    payload = json.loads(ran.stdout)
    text = render(payload, args, installed_version(python), time.monotonic() - began)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
