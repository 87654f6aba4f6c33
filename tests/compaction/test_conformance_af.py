"""Conformance with the Agent Framework's Python implementation (agent-framework-core 1.23).

Where a strategy carries the anchor's name and parameters its output must match the anchor's
on the same messages (DESIGN section 10), except where DESIGN's invariants say otherwise: the
Agent Framework may drop the newest user message or the newest step, we never do.  So: when
the oracle's output keeps both, ours must be identical; otherwise ours must keep them and
nothing else the oracle dropped.  Older steps of the newest turn are compacted on both sides.

Tool-result compaction, selective tool calls and the token-budget composition are compared the
same way; a ``[Tool results: ...]`` summary is compared by its text.  Where the Agent Framework
collapses the newest step's group, ours keeps the group's messages instead, and where its
strict budget fallback drops the system message, ours keeps it (DESIGN invariants 1 and 4).
The generated results stay within the 4,096-character cap of a summary, so there the texts are
the Agent Framework's exactly; where a result is cut, ours keeps its tail too and differs on
purpose (tool_result_compaction's docstring), which the tests of the cap state explicitly.

Token counts: the token-budget test counts every message on both sides exactly as the Agent
Framework does (``CharacterEstimatorTokenizer`` -- 4 characters a token -- over its JSON
serialization of the message), with the ``message_id`` left out of the serialization because a
proxy-written summary carries no id.  Our side reaches that count through a test tokenizer that
converts each OpenAI message to the Agent Framework's ``Message`` first.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

# The oracle is in the test extra: a missing install fails here, never skips.
import agent_framework as af
import agent_framework._compaction as afc
from hypothesis import event, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    CompactionRequest,
    CompactionSettings,
    ModelFacts,
    Pipeline,
    SummarizationSettings,
    build_pipeline,
    build_view,
    compact,
)
from compaction_proxy.compaction.strategies import (
    PipelineStrategy,
    SelectiveToolCallsStrategy,
    SlidingWindowStrategy,
    Strategy,
    ToolResultCompactionStrategy,
    TruncationStrategy,
)
from compaction_proxy.compaction.strategies.tool_result_compaction import (
    MIDDLE_MARKER,
)
from tests.support.trust_session import LIBRECHAT_BLOCK

Msg = dict[str, Any]


@st.composite
def conversations(draw: st.DrawFn) -> list[Msg]:
    msgs: list[Msg] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "S"})
    counter = 0
    for _ in range(draw(st.integers(1, 6))):
        msgs.append({"role": "user", "content": ""})
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                msgs.append({"role": "assistant", "content": ""})
            else:
                ids = [f"c{counter + k}" for k in range(draw(st.integers(1, 2)))]
                counter += len(ids)
                msgs.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {"name": "t", "arguments": "{}"},
                            }
                            for i in ids
                        ],
                    }
                )
                msgs.extend({"role": "tool", "tool_call_id": i, "content": ""} for i in ids)
    for index, message in enumerate(msgs):  # a unique label per message
        if message["content"] is not None:
            message["content"] = f"m{index}"
        message["label"] = f"m{index}"
    return msgs


def to_af(msgs: list[Msg]) -> list[Any]:
    out = []
    for m in msgs:
        if m.get("tool_calls"):
            contents = [
                afc.Content.from_function_call(call_id=c["id"], name="t", arguments="{}")
                for c in m["tool_calls"]
            ]
        elif m["role"] == "tool":
            contents = [
                afc.Content.from_function_result(call_id=m["tool_call_id"], result=m["content"])
            ]
        else:
            contents = [m["content"]]
        out.append(af.Message(role=m["role"], contents=contents, message_id=m["label"]))
    return out


def oracle(msgs: list[Msg], strategy: Any) -> list[str]:
    result = asyncio.run(afc.apply_compaction(to_af(msgs), strategy=strategy))
    return [m.message_id for m in result]


def ours(msgs: list[Msg], strategy: Strategy) -> list[str]:
    result = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=Pipeline((strategy,), fallback=False),
            tokenizer=CharacterEstimatorTokenizer(),
            facts=ModelFacts(1_000_000, 0),
            reserve_ratio=0,
        )
    )
    return [m["label"] for m in result.messages]


def protected_labels(msgs: list[Msg]) -> set[str]:
    """System messages, the newest user message and the newest step (invariant 4)."""
    view = build_view(msgs, CharacterEstimatorTokenizer())
    return {
        msgs[i]["label"] for group in view.groups if view.is_protected(group) for i in group.members
    }


def assert_conforms(msgs: list[Msg], expected: list[str], actual: list[str]) -> None:
    protected = protected_labels(msgs)
    if protected <= set(expected):
        assert actual == expected
    else:
        # The anchor dropped the task or the newest step; we keep them (invariant 4) and may
        # drop more of the rest to meet the same target, but never keep what it dropped.
        assert protected <= set(actual)
        assert set(actual) - protected <= set(expected)
        order = {m["label"]: i for i, m in enumerate(msgs)}
        assert actual == sorted(actual, key=order.__getitem__)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(1, 20), st.integers(1, 20), st.booleans())
def test_truncation_matches_the_agent_framework(
    msgs: list[Msg], max_n: int, compact_to: int, first_user: bool
) -> None:
    compact_to = min(compact_to, max_n)
    expected = oracle(
        msgs,
        afc.TruncationStrategy(
            max_n=max_n, compact_to=compact_to, preserve_first_user_group=first_user
        ),
    )
    actual = ours(
        msgs,
        TruncationStrategy(
            max_n=max_n,
            compact_to=compact_to,
            metric="messages",
            preserve_first_user_group=first_user,
        ),
    )
    assert_conforms(msgs, expected, actual)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(1, 8))
def test_sliding_window_matches_the_agent_framework(msgs: list[Msg], keep: int) -> None:
    expected = oracle(msgs, afc.SlidingWindowStrategy(keep_last_groups=keep))
    actual = ours(msgs, SlidingWindowStrategy(keep_last_groups=keep))
    assert_conforms(msgs, expected, actual)


# ------------------------------------------------------------ tool-call strategies and budget

TOOL_NAMES = ("get_weather", "search", "")


@st.composite
def tool_conversations(draw: st.DrawFn, *, end_with_user: bool = False) -> list[Msg]:
    """Like :func:`conversations`, with tool names, result texts and interleaved replies."""
    msgs: list[Msg] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "S"})
    counter = 0
    for _ in range(draw(st.integers(1, 6))):
        msgs.append({"role": "user", "content": ""})
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                msgs.append({"role": "assistant", "content": ""})
                continue
            ids = [f"c{counter + k}" for k in range(draw(st.integers(1, 3)))]
            counter += len(ids)
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {
                                "name": draw(st.sampled_from(TOOL_NAMES)),
                                "arguments": draw(st.sampled_from(["{}", '{"q": "x"}'])),
                            },
                        }
                        for i in ids
                    ],
                }
            )
            if draw(st.integers(0, 4)) == 0:  # a reply between the call and its results
                msgs.append({"role": "assistant", "content": ""})
            answered = ids if draw(st.integers(0, 5)) else ids[:-1]  # sometimes unanswered
            msgs.extend(
                {
                    "role": "tool",
                    "tool_call_id": i,
                    "content": draw(st.text("abcdé ;:", max_size=300)),
                }
                for i in answered
            )
    if end_with_user:
        msgs.append({"role": "user", "content": ""})
    for index, message in enumerate(msgs):
        if message["role"] != "tool" and message["content"] is not None:
            message["content"] = f"m{index}"
        message["label"] = f"m{index}"
    return msgs


def to_af_message(m: Mapping[str, Any], message_id: str | None = None) -> Any:
    if m.get("tool_calls"):
        contents = [
            afc.Content.from_function_call(
                call_id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]
            )
            for c in m["tool_calls"]
        ]
    elif m["role"] == "tool":
        contents = [
            afc.Content.from_function_result(call_id=m["tool_call_id"], result=m["content"])
        ]
    else:
        contents = [m["content"]]
    return af.Message(role=m["role"], contents=contents, message_id=message_id)


def af_count(serialized: str) -> int:
    payload = json.loads(serialized)
    payload.pop("message_id", None)
    text = json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str)
    return afc.CharacterEstimatorTokenizer().count_tokens(text)


class AFSideTokenizer:
    """The Agent Framework's counting, message id left out (see the module docstring)."""

    def count_tokens(self, text: str) -> int:
        return af_count(text)


class OurSideTokenizer:
    """Our :class:`~compaction_proxy.compaction.Tokenizer` protocol over the same counting."""

    name = "af-char-estimator"
    reply_priming = 0

    def count_text(self, text: str) -> int:
        return max(1, len(text) // 4)

    def count_message(self, message: Mapping[str, Any], canonical: bytes | None = None) -> int:
        return af_count(afc._serialize_message(to_af_message(message)))

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None) -> int:
        return 0


def oracle_items(msgs: list[Msg], strategy: Any, tokenizer: Any = None) -> list[Any]:
    """The oracle's output as labels and ``(summary text, covered labels)`` pairs."""
    af_msgs = [to_af_message(m, m["label"]) for m in msgs]
    result = asyncio.run(afc.apply_compaction(af_msgs, strategy=strategy, tokenizer=tokenizer))
    items: list[Any] = []
    for m in result:
        if m.message_id.startswith("tool_summary_"):
            covered = m.additional_properties[afc.GROUP_ANNOTATION_KEY][
                afc.SUMMARY_OF_MESSAGE_IDS_KEY
            ]
            items.append((m.text, tuple(covered)))
        else:
            items.append(m.message_id)
    return items


def expected_items(msgs: list[Msg], items: list[Any], *, stats: bool = True) -> list[Any]:
    """The oracle's output mapped through our documented differences (module docstring)."""
    record = event if stats else (lambda _: None)
    record(f"oracle changed={len(items) != len(msgs) or any(isinstance(i, tuple) for i in items)}")
    order = {m["label"]: i for i, m in enumerate(msgs)}
    keep_always = protected_labels(msgs)
    keyed: list[tuple[float, Any]] = []
    for item in items:
        if isinstance(item, tuple):
            text, covered = item
            if any(label in keep_always for label in covered):
                keyed.extend((order[label], label) for label in covered)
            else:
                keyed.append((order[covered[0]] - 0.5, text))
        else:
            keyed.append((order[item], item))
    present = {value for _, value in keyed}
    record(f"deviation={any(label not in present for label in keep_always)}")
    keyed.extend((order[label], label) for label in keep_always if label not in present)
    return [value for _, value in sorted(keyed, key=lambda kv: kv[0])]


def our_items(msgs: list[Msg], strategy: Strategy, tokenizer: Any = None) -> list[Any]:
    result = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=Pipeline((strategy,), fallback=False),
            tokenizer=tokenizer or CharacterEstimatorTokenizer(),
            facts=ModelFacts(10**9, 0),
            reserve_ratio=0,
        )
    )
    return [m["label"] if "label" in m else m["content"] for m in result.messages]


@settings(max_examples=200, deadline=None)
@given(tool_conversations(), st.integers(0, 3))
def test_tool_result_compaction_matches_the_agent_framework(msgs: list[Msg], keep: int) -> None:
    expected = oracle_items(msgs, afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=keep))
    assert not any(isinstance(i, tuple) and "[truncated]" in i[0] for i in expected)  # uncut
    actual = our_items(msgs, ToolResultCompactionStrategy(keep_last_tool_call_groups=keep))
    assert actual == expected_items(msgs, expected)


@settings(max_examples=200, deadline=None)
@given(tool_conversations(), st.integers(0, 3))
def test_selective_tool_calls_matches_the_agent_framework(msgs: list[Msg], keep: int) -> None:
    expected = oracle_items(
        msgs, afc.SelectiveToolCallCompactionStrategy(keep_last_tool_call_groups=keep)
    )
    actual = our_items(msgs, SelectiveToolCallsStrategy(keep_last_tool_call_groups=keep))
    assert actual == expected_items(msgs, expected)


@settings(max_examples=200, deadline=None)
@given(
    tool_conversations(end_with_user=True),
    st.integers(0, 2),
    st.floats(0.02, 1.2),
    st.floats(0.1, 1.5),
    st.floats(0.1, 1.0),
    st.booleans(),
)
def test_token_budget_composition_matches_the_agent_framework(
    msgs: list[Msg],
    keep: int,
    budget_ratio: float,
    max_ratio: float,
    compact_ratio: float,
    early_stop: bool,
) -> None:
    ours_tok = OurSideTokenizer()
    total = sum(ours_tok.count_message(m) for m in msgs)
    budget = int(total * budget_ratio)
    max_n = max(1, int(total * max_ratio))
    compact_to = max(1, int(max_n * compact_ratio))
    af_tok = AFSideTokenizer()
    expected = oracle_items(
        msgs,
        afc.TokenBudgetComposedStrategy(
            token_budget=budget,
            tokenizer=af_tok,
            strategies=[
                afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=keep),
                afc.TruncationStrategy(max_n=max_n, compact_to=compact_to, tokenizer=af_tok),
            ],
            early_stop=early_stop,
        ),
        tokenizer=af_tok,
    )
    ours = PipelineStrategy(
        [
            ToolResultCompactionStrategy(keep_last_tool_call_groups=keep),
            TruncationStrategy(max_n=max_n, compact_to=compact_to),
        ],
        token_budget=budget,
        early_stop=early_stop,
    )
    actual = our_items(msgs, ours, ours_tok)
    assert actual == expected_items(msgs, expected)


def test_tiny_example_of_the_notes() -> None:
    """research/msaf.md section 6 (``tiny.py``), budgets 250 and 200."""

    def c(i: str, name: str) -> Msg:
        return {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}}

    msgs: list[Msg] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c("c1", "get_weather"), c("c2", "get_time")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "9am"},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": None, "tool_calls": [c("c3", "get_weather")]},
        {"role": "tool", "tool_call_id": "c3", "content": "rain"},
    ]
    for i, m in enumerate(msgs):
        m["label"] = f"m{i}"
    tok = OurSideTokenizer()
    outputs = {}
    for budget in (250, 200, 150, 100):
        strategy = PipelineStrategy(
            [
                ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
                TruncationStrategy(max_n=200, compact_to=150),
            ],
            token_budget=budget,
        )
        outputs[budget] = our_items(msgs, strategy, tok)
        af_tok = AFSideTokenizer()
        expected = oracle_items(
            msgs,
            afc.TokenBudgetComposedStrategy(
                token_budget=budget,
                tokenizer=af_tok,
                strategies=[
                    afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=1),
                    afc.TruncationStrategy(max_n=200, compact_to=150, tokenizer=af_tok),
                ],
            ),
            tokenizer=af_tok,
        )
        assert outputs[budget] == expected_items(msgs, expected, stats=False)
    # the notes' output at budget 250 (their counts include message ids, ours do not, so the
    # cut-off between "collapse" and "truncate" sits a little lower here)
    assert outputs[250] == [
        "m0",
        "m1",
        "[Tool results: get_weather: sunny; get_time: 9am]",
        "m5",
        "m6",
        "m7",
    ]
    assert outputs[100] == ["m0", "m5", "m6", "m7"]


# ------------------------------------------------------------- the collapse cap (4096 chars)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(TOOL_NAMES),
    st.integers(4100, 9000),
    st.text("abcdé ;:", min_size=1, max_size=20),
)
def test_one_oversized_result_keeps_the_tail_the_agent_framework_cuts_away(
    name: str, size: int, tail: str
) -> None:
    """The documented difference: the Agent Framework keeps the head of a result over the cap
    and ``... [truncated]``; ours keeps 3/5 of the room at the head and 2/5 at the tail around
    :data:`MIDDLE_MARKER`.  Everything else is the oracle's."""
    content = "r" * size + tail
    msgs: list[Msg] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": content},
        {"role": "user", "content": "last"},
    ]
    for i, m in enumerate(msgs):
        m["label"] = f"m{i}"
    strategy = afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=0)
    expected = expected_items(msgs, oracle_items(msgs, strategy), stats=False)
    actual = our_items(msgs, ToolResultCompactionStrategy(keep_last_tool_call_groups=0))
    assert [actual[0], *actual[2:]] == [expected[0], *expected[2:]]
    label = f"{name}: {content}".strip() if name else content.strip()
    prefix, suffix = "[Tool results: ", "]"
    # the Agent Framework's text: the head, right-stripped, and the end marker
    room = 4096 - len(prefix) - len(suffix)
    af_text = prefix + label[: room - len("... [truncated]")].rstrip() + "... [truncated]]"
    assert expected[1] == af_text
    # ours: the same start, the head cut at 3/5 of what is kept, and the result's end
    keep = room - len(MIDDLE_MARKER)
    head = keep * 3 // 5
    ours = prefix + label[:head].rstrip() + MIDDLE_MARKER + label[-(keep - head) :].lstrip() + "]"
    assert actual[1] == ours != expected[1] and len(actual[1]) <= 4096
    assert actual[1][: len(prefix) + head] == expected[1][: len(prefix) + head]
    assert actual[1].endswith(label[-20:] + "]")  # the generated tail, whole


def test_parallel_results_share_the_cap_where_the_agent_framework_cuts_the_later_ones() -> None:
    """The deliberate difference (tool_result_compaction's docstring): the Agent Framework
    cuts the joined labels once at the end, so a large first result leaves nothing of the
    second; ours shares the cap and keeps each result's head and tail."""
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
        for i, n in (("c1", "read_file"), ("c2", "grep"))
    ]
    msgs: list[Msg] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 6000 + "\nEOF"},
        {"role": "tool", "tool_call_id": "c2", "content": "FACT-P2 found in src/a.py"},
        {"role": "user", "content": "last"},
    ]
    for i, m in enumerate(msgs):
        m["label"] = f"m{i}"
    oracle_text = oracle_items(
        msgs, afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=0)
    )[1][0]
    assert "FACT-P2" not in oracle_text and len(oracle_text) <= 4096
    ours_text = our_items(msgs, ToolResultCompactionStrategy(keep_last_tool_call_groups=0))[1]
    assert ours_text.endswith("; grep: FACT-P2 found in src/a.py]") and len(ours_text) <= 4096
    assert ours_text.startswith("[Tool results: read_file: xxx")
    assert "xxx\nEOF; grep: " in ours_text and "EOF" not in oracle_text
    # what is within the cap is otherwise the same text: prefix, labels, separator, marker
    assert ours_text[: len(oracle_text) // 2] == oracle_text[: len(oracle_text) // 2]


# ------------------------------------------- one-strategy pipelines from the configuration


def seeded_session(seed: int, *, tools: bool) -> list[Msg]:
    """A conversation of the generators' shapes (:func:`conversations`,
    :func:`tool_conversations`), drawn from ``random.Random(seed)``: 3-8 user turns of up to 3
    replies and tool steps, results a few hundred characters long, labelled messages."""
    rng = random.Random(seed)
    msgs: list[Msg] = [{"role": "system", "content": "S"}] if rng.random() < 0.5 else []
    counter = 0
    for _ in range(rng.randint(3, 8)):
        msgs.append({"role": "user", "content": ""})
        for _ in range(rng.randint(0, 3)):
            if rng.random() < (0.3 if tools else 0.5):
                msgs.append({"role": "assistant", "content": ""})
                continue
            ids = [f"c{counter + k}" for k in range(rng.randint(1, 2))]
            counter += len(ids)
            names = [rng.choice(TOOL_NAMES) if tools else "t" for _ in ids]
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                        for i, n in zip(ids, names, strict=True)
                    ],
                }
            )
            msgs.extend(
                {
                    "role": "tool",
                    "tool_call_id": i,
                    "content": "".join(rng.choice("abcde ;:") for _ in range(rng.randint(0, 300))),
                }
                for i in ids
            )
    for index, message in enumerate(msgs):
        if message["role"] != "tool":
            message["content"] = f"m{index}" if message["content"] is not None else None
        message["label"] = f"m{index}"
    return msgs


CONFIGURED_WINDOW = ModelFacts(32_768, 4_096)
"""A 32k model: its budget holds every generated session, so no fallback runs on either side."""


def configured(entry: dict[str, Any]) -> Pipeline:
    """``compaction: {pipeline: [entry]}`` and nothing else: every other key at its default."""
    return build_pipeline(CompactionSettings.model_validate({"pipeline": [entry]}))


def configured_items(msgs: list[Msg], entry: dict[str, Any]) -> list[Any]:
    result = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=configured(entry),
            tokenizer=CharacterEstimatorTokenizer(),
            facts=CONFIGURED_WINDOW,
        )
    )
    assert not result.report.fallback, "the session must fit the budget: the anchor has no fallback"
    return [m["label"] if "label" in m else m["content"] for m in result.messages]


def _conforms(msgs: list[Msg], expected: list[Any], actual: list[Any]) -> bool:
    try:
        assert_conforms(msgs, expected, actual)
    except AssertionError:
        return False
    return True


def configured_sessions() -> list[tuple[str, bool]]:
    """32 sessions: 8 per strategy written in the Agent Framework's vocabulary, each against
    ``agent-framework-core``; ``(name, agrees)``."""
    outcomes: list[tuple[str, bool]] = []
    for seed in range(8):
        plain, with_tools = seeded_session(seed, tools=False), seeded_session(seed, tools=True)
        keep = seed % 3
        window = 1 + seed % 4
        cases: list[tuple[str, list[Msg], Any, dict[str, Any], bool]] = [
            (
                "truncation",
                plain,
                afc.TruncationStrategy(max_n=6 + seed, compact_to=3 + seed // 2),
                {
                    "strategy": "truncation",
                    "max_n": 6 + seed,
                    "compact_to": 3 + seed // 2,
                    "metric": "messages",
                },
                False,
            ),
            (
                "sliding_window",
                plain,
                afc.SlidingWindowStrategy(keep_last_groups=window),
                {"strategy": "sliding_window", "keep_last_groups": window},
                False,
            ),
            (
                "tool_result_compaction",
                with_tools,
                afc.ToolResultCompactionStrategy(keep_last_tool_call_groups=keep),
                {"strategy": "tool_result_compaction", "keep_last_tool_call_groups": keep},
                True,
            ),
            (
                "selective_tool_calls",
                with_tools,
                afc.SelectiveToolCallCompactionStrategy(keep_last_tool_call_groups=keep),
                {"strategy": "selective_tool_calls", "keep_last_tool_call_groups": keep},
                True,
            ),
        ]
        for name, msgs, anchor, entry, items in cases:
            actual = configured_items(msgs, entry)
            if items:
                expected = expected_items(msgs, oracle_items(msgs, anchor), stats=False)
                outcomes.append((name, actual == expected))
            else:
                outcomes.append((name, _conforms(msgs, oracle(msgs, anchor), actual)))
    return outcomes


def test_one_strategy_pipelines_configured_with_the_defaults_match_the_agent_framework() -> None:
    """``compaction.pipeline`` with one entry in the Agent Framework's vocabulary, and every other
    key at its default: the entry behaves as the Agent Framework's strategy on all 32 sessions.
    The proxy's own additions (carried user messages, the minimum saving) belong to its default
    pipeline; an explicit pipeline gets them only by writing them (docs/configuration.md).
    Before that rule 7 of these 32 agreed: the minimum saving undid the two tool-result
    strategies and the carried user messages stayed where the window and truncation dropped
    them."""
    outcomes = configured_sessions()
    assert len(outcomes) == 32
    failed = [name for name, agrees in outcomes if not agrees]
    assert not failed, f"{32 - len(failed)} of 32 agree; differ: {failed}"
    pipeline = configured({"strategy": "sliding_window", "keep_last_groups": 2})
    assert (pipeline.carry_user_share, pipeline.min_saving) == (0.0, 0.0)


def test_an_explicit_pipeline_has_the_proxys_additions_only_where_its_block_writes_them() -> None:
    written = CompactionSettings.model_validate(
        {
            "pipeline": [{"strategy": "sliding_window", "keep_last_groups": 2}],
            "carry_user_messages": 0.15,
            "min_saving": 0.02,
        }
    )
    pipeline = build_pipeline(written)
    assert (pipeline.carry_user_share, pipeline.min_saving) == (0.15, 0.02)
    default = build_pipeline(CompactionSettings())
    assert (default.carry_user_share, default.min_saving) == (0.15, 0.02)
    # LibreChat's block pasted is the default pipeline: both on
    block = SummarizationSettings.model_validate(LIBRECHAT_BLOCK)
    librechat = build_pipeline(CompactionSettings(), block)
    assert (librechat.carry_user_share, librechat.min_saving) == (0.15, 0.02)
    off = build_pipeline(CompactionSettings(carry_user_messages=0, min_saving=0))
    assert (off.carry_user_share, off.min_saving) == (0.0, 0.0)
    # a session where both additions would show: every user message would stay beside the window
    msgs = seeded_session(3, tools=False)
    entry = {"strategy": "sliding_window", "keep_last_groups": 2}
    anchor = oracle(msgs, afc.SlidingWindowStrategy(keep_last_groups=2))
    assert _conforms(msgs, anchor, configured_items(msgs, entry))
    with_carry = compact(
        CompactionRequest(
            msgs,
            model="m",
            pipeline=pipeline,
            tokenizer=CharacterEstimatorTokenizer(),
            facts=CONFIGURED_WINDOW,
        )
    )
    assert not _conforms(msgs, anchor, [m["label"] for m in with_carry.messages])
