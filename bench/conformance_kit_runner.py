"""The compaction-conformance-kit's budget benchmark with the proxy's presets beside the kit's
own baselines. Runs in the kit's own virtualenv (`.venv-ckit`), started by
`python -m bench.conformance_kit`, which also starts the proxy; imports only the standard
library and the kit, and reaches the proxy over HTTP.

How the proxy joins the benchmark: the kit calls `compact(turns, round_num, budget_chars)`; the
adapter sends the turns as a chat-completions body to the proxy's `POST
/v1/compaction/preview` (the real compaction flow, nothing forwarded) and renders the compacted
messages the way the kit renders a transcript (`[role] text` lines). The proxy budgets tokens,
the kit characters, so the adapter asks for the largest of a fixed ladder of windows (one
model name per preset and window in the proxy's `models:`) whose rendered output fits
`budget_chars`: the proxy configured, per session, as tightly as the kit's cap allows. When
even the smallest window's output does not fit, that output is returned and the kit marks the
preset non-compliant: nothing is cut by the adapter.

    .venv-ckit/bin/python -m bench.conformance_kit_runner --proxy URL --presets a,b
        [--budgets 0.1,0.2,0.3] [--seeds 1-4] [--rounds 5]   (prints the payload as JSON)
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the kit exists only in its own virtualenv; bench.conformance_kit reads
    # the ladder below from the project's, so the kit is imported where it is used.
    from compaction_kit.compacted import CompactedContext
    from compaction_kit.session import Turn

WINDOWS = tuple(sorted({int(64 * 1.02**n) for n in range(230)}))
"""The window ladder, 64 to ~6,000 tokens in steps of 2% (the kit's sessions are ~2k tokens):
fine enough that the cap, not the ladder, decides what fits (at 8% a preset used ~93% of its
cap on average)."""


def model_name(preset: str, window: int) -> str:
    return f"{preset}-w{window}"


class ProxyPreset:
    """One proxy preset as a kit compactor."""

    def __init__(self, proxy: str, preset: str) -> None:
        self.proxy = proxy.rstrip("/")
        self.preset = preset
        self.name = f"proxy:{preset}"
        self.calls = 0

    def _preview(self, window: int, turns: list[Turn]) -> str:
        body = {
            "model": model_name(self.preset, window),
            "messages": [{"role": _role(t.role), "content": t.text} for t in turns],
        }
        request = urllib.request.Request(
            self.proxy + "/v1/compaction/preview",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer sk-kit"},
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            payload = json.load(reply)
        self.calls += 1
        return "\n".join(
            f"[{m['role']}] {_text(m.get('content'))}" for m in payload["request"]["messages"]
        )

    def compact(
        self, turns: list[Turn], round_num: int = 1, budget_chars: int | None = None
    ) -> CompactedContext:
        from compaction_kit.compacted import CompactedContext

        if all(t.role == "system" for t in turns):
            # A later round's input is the previous output as one system turn; the proxy never
            # compacts system text, so the agent would see that text unchanged.
            text = "\n".join(t.text for t in turns)
            return CompactedContext(text=text, compactor_name=self.name, round_num=round_num)
        if budget_chars is None:
            text = self._preview(WINDOWS[-1], turns)
            return CompactedContext(text=text, compactor_name=self.name, round_num=round_num)
        low, high = 0, len(WINDOWS) - 1
        best: str | None = None
        while low <= high:  # the largest window whose output fits the cap
            middle = (low + high) // 2
            text = self._preview(WINDOWS[middle], turns)
            if len(text) <= budget_chars:
                best, low = text, middle + 1
            else:
                high = middle - 1
        if best is None:
            best = self._preview(WINDOWS[0], turns)
        return CompactedContext(text=best, compactor_name=self.name, round_num=round_num)


def _role(role: str) -> str:
    return role if role in ("system", "user", "assistant") else "user"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _seeds(spec: str) -> list[int]:
    if "-" in spec:
        first, last = spec.split("-", 1)
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in spec.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.conformance_kit_runner")
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--presets", required=True)
    parser.add_argument("--budgets", default="0.1,0.2,0.3")
    parser.add_argument("--seeds", default="1-4")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from compaction_kit.benchmark import run_budget_benchmark
    from compaction_kit.cli import COMPACTORS

    factories: dict[str, Any] = dict(COMPACTORS)
    for preset in args.presets.split(","):
        factories[f"proxy:{preset}"] = lambda preset=preset: ProxyPreset(args.proxy, preset)
    payload = run_budget_benchmark(
        factories,
        budgets=[float(b) for b in args.budgets.split(",")],
        seeds=_seeds(args.seeds),
        rounds=args.rounds,
    )
    payload["windows"] = list(WINDOWS)
    json.dump(payload, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
