"""What a long agent loop keeps of its exact strings, with a summarizer that keeps none of them.

Real processes: the fake upstream enforces a 16k window and answers every summary call with
prose that copies no path, command, error line or number (`summarizer: prose`); the proxy runs
the default pipeline with recall on. 150 tool steps (tests/support/artifact_loop.py), each with
its own path, command, verdict line, error line and measured number. A summary alone carries
none of them; the ledger beside it must: at the end, >= 95% of the strings of the folded steps
are in the forwarded request, or the ones missing are those the ledger's share bound dropped
(oldest first) and recall still finds them.

On checkpoint hits (nothing new folded) the forwarded prefix, the ledger message included, is
byte-identical to the previous request's: the upstream's prompt cache keeps serving it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.compaction import EncodingLoader, TokenizerProvider
from tests.support.agent_session import CHAT, assert_valid_pairing
from tests.support.artifact_loop import (
    KINDS,
    TOOLS,
    ArtifactLoop,
    ArtifactStep,
    is_ledger,
    make_step,
    run_artifact_loop,
)
from tests.support.in_thread import InThreadProxy, InThreadServers
from tests.support.processes import tiktoken_cache_dir
from tests.support.servers import UpstreamControl, session_config

TOKENIZER = TokenizerProvider(EncodingLoader(directories=[tiktoken_cache_dir()])).get("o200k_base")

WINDOW = 16_000
MODEL = "agent-16k"
STEPS = 150
NEWEST_KEPT = 5
"""The folded steps whose strings any ledger keeps, however small its share: the newest ones
(the bound drops the oldest first)."""
LEDGER_FLOOR = WINDOW // 20
"""Tokens the ledger holds at least before its bound drops anything (a twentieth of the window,
well under any share of the budget: a ledger that drops while nearly empty is no bound)."""
DROPPED = (
    re.compile(r"(?:dropped|left out|omitted)\W{0,3}(\d+)", re.I),
    re.compile(r"(\d+)\s+(?:[\w()]+\s+){0,2}(?:dropped|left out|omitted)", re.I),
)
"""How a report states that its bound left items out: "dropped=12", "omitted: 12", then
"12 older items left out"."""
PROBES = 8
"""Missing strings asked for through the recall tool (spread from the oldest to the newest)."""


def loop_config(upstream: UpstreamControl, db: Path) -> dict[str, Any]:
    recall = {"recall": {"enabled": True, "max_rounds": 2}}
    return session_config(upstream, db, MODEL, WINDOW, compaction=recall)


@pytest.fixture(scope="module")
def prose_upstream(in_thread: InThreadServers) -> UpstreamControl:
    return in_thread.upstream(WINDOW)


@pytest.fixture(scope="module")
def loop_proxy(
    prose_upstream: UpstreamControl,
    in_thread: InThreadServers,
    tmp_path_factory: pytest.TempPathFactory,
) -> InThreadProxy:
    db = tmp_path_factory.mktemp("ledger-loop") / "checkpoints.db"
    return in_thread.proxy(loop_config(prose_upstream, db))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def loop(prose_upstream: UpstreamControl, loop_proxy: InThreadProxy) -> ArtifactLoop:
    prose_upstream.reset()
    prose_upstream.control(summarizer="prose")
    with loop_proxy.openai_client() as client:
        return run_artifact_loop(client, prose_upstream, model=MODEL, steps=STEPS, make=make_step)


def test_the_loop_folds_many_times_and_every_request_succeeds(loop: ArtifactLoop) -> None:
    assert len(loop.steps) == STEPS  # the SDK raises on any non-2xx
    assert all(0 < step.prompt_tokens <= WINDOW for step in loop.steps)
    events = [s for s in loop.steps if s.checkpoint == "new"]
    assert len(events) >= 5, f"only {len(events)} compaction events"
    assert len(loop.folded()) >= 100, f"only {len(loop.folded())} steps folded"
    assert any("summarization" in s.strategies for s in events), "no summary was ever made"
    for step in loop.steps:
        assert_valid_pairing(step.forwarded)


def _figure(loop: ArtifactLoop) -> str:
    survival = loop.survival()
    kept = sum(k for k, _ in survival.values())
    total = sum(t for _, t in survival.values())
    per_kind = ", ".join(f"{kind} {k}/{t}" for kind, (k, t) in survival.items())
    return f"{kept} of {total} strings of {len(loop.folded())} folded steps forwarded ({per_kind})"


def _older_first(loop: ArtifactLoop) -> list[str]:
    """Breaches of "oldest dropped first": within one kind of one step shape (alike in size and
    references), a string missing while an older one of the same kind and shape is kept."""
    text_missing = {(s.index, kind) for s, kind in loop.missing()}
    breaches = []
    for kind, shape in itertools.product(KINDS, range(4)):
        steps = [s for s in loop.folded() if s.index % 4 == shape and kind in s.strings]
        kept = [s.index for s in steps if (s.index, kind) not in text_missing]
        gone = [s.index for s in steps if (s.index, kind) in text_missing]
        if kept and gone and max(gone) > min(kept):
            breaches.append(f"{kind}/shape {shape}: step {max(gone)} gone, {min(kept)} kept")
    return breaches


def _reported_drops(loop: ArtifactLoop, ledger: dict[str, Any]) -> int:
    """How many items the ledger's own text, or else the newest response whose `X-Compaction-*`
    headers say it, says were left out (0: none said).  A checkpoint hit repeats no warning:
    the response of the run that left them out says it."""
    for texts in (
        [str(ledger.get("content"))],
        *([*step.headers.values()] for step in reversed(loop.steps)),
    ):
        for pattern in DROPPED:
            found = [int(n) for text in texts for n in pattern.findall(text)]
            if found:
                return max(found)
    return 0


def _probe(proxy: InThreadProxy, upstream: UpstreamControl, loop: ArtifactLoop, wanted: str) -> str:
    """Asks the scripted model for ``wanted`` after the loop's last request; it looks in its
    prompt and else recalls by a query of the string (tests/fakes/upstream.py ``FIND:``)."""
    messages = [*loop.conversation[:-2], {"role": "user", "content": f"FIND: {wanted}"}]
    with proxy.openai_client() as client:
        completion = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    upstream.take(CHAT)
    return completion.choices[0].message.content or ""


def _spread(items: list[tuple[ArtifactStep, str]], count: int) -> list[tuple[ArtifactStep, str]]:
    if len(items) <= count:
        return items
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def test_the_exact_strings_of_folded_steps_are_still_forwarded(
    loop: ArtifactLoop, loop_proxy: InThreadProxy, prose_upstream: UpstreamControl
) -> None:
    figure = _figure(loop)
    survival = loop.survival()
    kept = sum(k for k, _ in survival.values())
    total = sum(t for _, t in survival.values())
    assert total >= 400, figure
    if kept >= 0.95 * total:
        return
    # Below 95%: only the ledger's share bound may explain it, and nothing it dropped is lost.
    ledgers = [m for m in loop.last.forwarded if is_ledger(m)]
    assert len(ledgers) == 1, f"{len(ledgers)} <ledger> messages forwarded; {figure}"
    size = TOKENIZER.count_messages(ledgers)
    assert size >= LEDGER_FLOOR, f"the ledger drops strings at {size} tokens; {figure}"
    reported = _reported_drops(loop, ledgers[0])
    assert reported > 0, (
        "strings are missing but neither the X-Compaction-* headers nor the ledger say how many "
        f"items its bound left out (e.g. dropped=N, N items left out); {figure}"
    )
    newest = loop.folded()[-NEWEST_KEPT:]
    lost_new = [s.strings[k] for s, k in loop.missing() if s in newest]
    assert not lost_new, f"strings of the newest folded steps missing: {lost_new[:5]}; {figure}"
    breaches = _older_first(loop)
    assert not breaches, f"newer strings dropped before older ones: {breaches}; {figure}"
    answers = [
        _probe(loop_proxy, prose_upstream, loop, step.strings[kind])
        for step, kind in _spread(loop.missing(), PROBES)
    ]
    unreachable = [a for a in answers if not a.startswith(("RECALLED", "IN PROMPT"))]
    assert not unreachable, f"dropped and not found by recall: {unreachable}; {figure}"


def test_the_task_rules_are_forwarded_verbatim(loop: ArtifactLoop) -> None:
    kept, total = loop.rules_kept()
    assert kept == total, f"{kept} of {total} of the task's rules forwarded"


def test_checkpoint_hits_forward_a_byte_identical_prefix_and_ledger(loop: ArtifactLoop) -> None:
    first_fold = next(s.index for s in loop.steps if s.checkpoint == "new")
    hits = [
        (before, after)
        for before, after in itertools.pairwise(loop.steps)
        if after.checkpoint == "hit" and before.index >= first_fold
    ]
    assert len(hits) >= 50, f"only {len(hits)} checkpoint hits after the first fold"
    moved = [a.index for b, a in hits if a.spans[: len(b.spans)] != b.spans]
    assert not moved, f"the forwarded prefix changed on checkpoint hits at steps {moved[:10]}"
    without = [a.index for b, a in hits if len(a.ledgers) != 1 or len(b.ledgers) != 1]
    assert not without, (
        f"{len(without)} of {len(hits)} checkpoint hits forwarded no single <ledger> message "
        f"(steps {without[:5]}...)"
    )
    changed = [a.index for b, a in hits if a.ledgers != b.ledgers]
    assert not changed, f"the ledger changed on checkpoint hits at steps {changed[:10]}"
