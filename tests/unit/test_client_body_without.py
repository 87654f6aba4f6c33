"""``ClientBody.without``: a member the proxy applied itself (Anthropic's ``context_management``
for a server that refuses it) leaves the forwarded body, and every other byte stays the
client's (compaction_proxy/wire/_forwarded.py)."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from compaction_proxy.wire import ClientBody

CLIENT = (
    b'{"model": "claude-sonnet-4-5", "seed": 1180591620717411303424, "temperature": 1.10,\n'
    b'  "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},\n'
    b'  "messages": [{"role": "user", "content": "caf\\u00e9"}], "max_tokens": 32000}'
)


def body(raw: bytes) -> ClientBody:
    return ClientBody(raw, orjson.loads(raw), "messages")


def test_the_member_goes_and_every_other_byte_stays() -> None:
    out = body(CLIENT).without(("context_management",))
    assert out.raw == (
        b'{"model": "claude-sonnet-4-5", "seed": 1180591620717411303424, "temperature": 1.10,\n'
        b'  "messages": [{"role": "user", "content": "caf\\u00e9"}], "max_tokens": 32000}'
    )
    assert "context_management" not in out.data
    assert out.key == "messages"


def test_absent_members_change_nothing() -> None:
    client = body(CLIENT)
    assert client.without(("thinking",)) is client
    assert client.without(()) is client


def test_the_stripped_body_still_splices_its_messages() -> None:
    out = body(CLIENT).without(("context_management",))
    spliced = out.with_elements([{"role": "user", "content": "short"}])
    assert spliced == (
        b'{"model": "claude-sonnet-4-5", "seed": 1180591620717411303424, "temperature": 1.10,\n'
        b'  "messages": [{"role":"user","content":"short"}], "max_tokens": 32000}'
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"context_management": null, "messages": []}', b'{"messages": []}'),
        (b'{"messages": [], "context_management": {}}', b'{"messages": []}'),
        (b'{ "context_management" : 1 }', b"{  }"),
        (
            b'{"context_management": 1, "context_management": 2, "messages": []}',
            b'{"messages": []}',
        ),
        (b'{"a": 1,"context_management": 2 ,"b": 3}', b'{"a": 1 ,"b": 3}'),
    ],
)
def test_first_last_only_and_repeated(raw: bytes, expected: bytes) -> None:
    assert body(raw).without(("context_management",)).raw == expected


def test_any_members_in_any_spacing_leave_a_body_that_parses_to_the_rest() -> None:
    rng = random.Random(21)
    values = [1, "text", [1, {"x": None}], {"edits": []}, 1.5, True, None]
    for _ in range(2000):
        keys = rng.sample(["a", "b", "c", "messages", "context_management", "d"], rng.randint(1, 6))

        def space() -> str:
            return rng.choice(["", " ", "\n  ", "\t"])

        members = ",".join(
            f'{space()}"{k}"{space()}:{space()}{json.dumps(rng.choice(values))}{space()}'
            for k in keys
        )
        raw = ("{" + members + space() + "}").encode()
        gone = set(rng.sample(keys, rng.randint(0, len(keys))))
        out = body(raw).without(gone)
        expected = {k: v for k, v in orjson.loads(raw).items() if k not in gone}
        assert orjson.loads(out.raw) == expected, raw
        assert out.data == expected
