from __future__ import annotations

import pytest

from compaction_proxy.compaction.triggers import (
    AllOf,
    Always,
    AnyOf,
    ConditionError,
    GroupsExceed,
    HasToolCalls,
    MessagesExceed,
    MessagesToRefine,
    Metrics,
    Never,
    OverBudget,
    RemainingTokens,
    TokenRatio,
    TokensBelow,
    TokensExceed,
    TurnsExceed,
    parse_condition,
    parse_target,
)


def metrics(
    tokens: int = 500,
    messages: int = 10,
    groups: int = 8,
    turns: int = 3,
    tool_call_groups: int = 1,
    budget: int = 1000,
    overflow: int = 0,
) -> Metrics:
    return Metrics(
        tokens,
        messages,
        groups,
        turns,
        tool_call_groups,
        budget,
        overflow_messages=lambda: overflow,
    )


CASES = [
    # (our form, LibreChat form, condition, fires on default metrics)
    ("always", {"type": "always"}, Always(), True),
    ("never", {"type": "never"}, Never(), False),
    ({"tokens_exceed": 499}, {"type": "tokens_exceed", "value": 499}, TokensExceed(499), True),
    ({"tokens_exceed": 500}, {"type": "tokens_exceed", "value": 500}, TokensExceed(500), False),
    ({"tokens_below": 501}, {"type": "tokens_below", "value": 501}, TokensBelow(501), True),
    ({"tokens_below": 500}, {"type": "tokens_below", "value": 500}, TokensBelow(500), False),
    ({"messages_exceed": 9}, {"type": "messages_exceed", "value": 9}, MessagesExceed(9), True),
    ({"messages_exceed": 10}, {"type": "messages_exceed", "value": 10}, MessagesExceed(10), False),
    ({"turns_exceed": 2}, {"type": "turns_exceed", "value": 2}, TurnsExceed(2), True),
    ({"turns_exceed": 3}, {"type": "turns_exceed", "value": 3}, TurnsExceed(3), False),
    ({"groups_exceed": 7}, {"type": "groups_exceed", "value": 7}, GroupsExceed(7), True),
    ({"groups_exceed": 8}, {"type": "groups_exceed", "value": 8}, GroupsExceed(8), False),
    ({"has_tool_calls": True}, {"type": "has_tool_calls", "value": True}, HasToolCalls(True), True),
    (
        {"has_tool_calls": False},
        {"type": "has_tool_calls", "value": False},
        HasToolCalls(False),
        False,
    ),
    ({"token_ratio": 0.5}, {"type": "token_ratio", "value": 0.5}, TokenRatio(0.5), True),
    ({"token_ratio": 0.8}, {"type": "token_ratio", "value": 0.8}, TokenRatio(0.8), False),
    (
        {"remaining_tokens": 500},
        {"type": "remaining_tokens", "value": 500},
        RemainingTokens(500),
        True,
    ),
    (
        {"remaining_tokens": 499},
        {"type": "remaining_tokens", "value": 499},
        RemainingTokens(499),
        False,
    ),
    ("over_budget", {"type": "over_budget"}, OverBudget(), False),
    (
        {"messages_to_refine": 1},
        {"type": "messages_to_refine", "value": 1},
        MessagesToRefine(1),
        False,
    ),
]


@pytest.mark.parametrize(("ours", "librechat", "expected", "fires"), CASES)
def test_both_forms_parse_to_the_same_condition(
    ours: object, librechat: object, expected: object, fires: bool
) -> None:
    assert parse_condition(ours) == expected
    assert parse_condition(librechat) == expected
    condition = parse_condition(ours)
    assert condition.fires(metrics()) is fires
    assert parse_condition(condition.to_config()) == condition


def test_all_and_any() -> None:
    cond = parse_condition({"all": [{"has_tool_calls": True}, {"tokens_exceed": 2000}]})
    assert cond == AllOf((HasToolCalls(), TokensExceed(2000)))
    assert not cond.fires(metrics())
    assert cond.fires(metrics(tokens=2001))
    either = parse_condition({"type": "any", "value": [{"turns_exceed": 5}, "has_tool_calls"]})
    assert either == AnyOf((TurnsExceed(5), HasToolCalls()))
    assert either.fires(metrics())
    assert parse_condition({"all": []}).fires(metrics())
    assert not parse_condition({"any": []}).fires(metrics())


def test_token_ratio_and_remaining_at_boundaries() -> None:
    assert TokenRatio(0.8).fires(metrics(tokens=800))
    assert not TokenRatio(0.8).fires(metrics(tokens=799))
    assert RemainingTokens(200).fires(metrics(tokens=800))
    assert OverBudget().fires(metrics(tokens=1001))


def test_messages_to_refine_only_fires_over_budget() -> None:
    cond = MessagesToRefine(3)
    assert not cond.fires(metrics(tokens=900, overflow=5))
    assert cond.fires(metrics(tokens=1200, overflow=3))
    assert not cond.fires(metrics(tokens=1200, overflow=2))


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"tokens_exceed": -1}, "trigger.tokens_exceed: expected a non-negative integer"),
        ({"tokens_exceed": 1.5}, "expected an integer"),
        ({"tokens_exceed": True}, "expected an integer"),
        ({"token_ratio": 1.5}, "between 0 and 1"),
        ({"type": "remaining_tokens", "value": 0}, "trigger.value: expected a positive integer"),
        ({"type": "token_count", "value": 100}, "no longer supported"),
        ({"type": "token_ratio"}, "trigger.value: required"),
        ({"type": "token_ratio", "value": 0.8, "extra": 1}, "unexpected key"),
        ({"tokens_exceed": 1, "turns_exceed": 2}, "one condition per mapping"),
        ({"bogus": 1}, "unknown condition 'bogus'"),
        ({"all": [{"tokens_exceed": "x"}]}, "trigger.all[0].tokens_exceed"),
        ({"always": False}, "expected true"),
        (42, "expected a mapping"),
    ],
)
def test_errors_name_the_path(raw: object, fragment: str) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(raw)
    assert fragment in str(info.value)


def test_target_rejects_tokens_below() -> None:
    assert parse_target({"token_ratio": 0.5}) == TokenRatio(0.5)
    with pytest.raises(ConditionError, match="tokens_below cannot be a target"):
        parse_target({"any": [{"tokens_below": 10}]})


def test_integral_floats_are_accepted() -> None:
    assert parse_condition({"tokens_exceed": 8000.0}) == TokensExceed(8000)
