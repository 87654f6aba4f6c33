"""The pieces a large body travels in from the parse worker, and the worker's verdicts."""

from __future__ import annotations

import pickle
from typing import Any

import orjson
import pytest

from compaction_proxy.compaction.validation import SizeLimits
from compaction_proxy.engine._body_codec import PIECE_BYTES, decode, encode
from compaction_proxy.engine._offload import THREAD_PARSE_VALUES, Offload, parse_in_worker
from compaction_proxy.http import ProxyError
from compaction_proxy.wire import parse_chat_body

pytestmark = pytest.mark.e2e  # its worker is a real process (a process pool)

BODIES: dict[str, Any] = {
    "many messages": {
        "model": "m",
        "messages": [{"role": "user", "content": f"m{i}", "n": i} for i in range(80_000)],
    },
    "nested lists": {"model": "m", "x": [[list(range(50)) for _ in range(50)] for _ in range(50)]},
    "deep and wide": {"model": "m", "a": {"b": {"c": [[1.5, None, True, "s"]] * 40_000}}},
    "small": {"b": 1, "a": [1, {"z": [], "y": {}}], "c": None},
    "empty": {},
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_pieces_rebuild_the_same_value_with_the_same_key_order(name: str) -> None:
    data = orjson.loads(orjson.dumps(BODIES[name]))
    rebuilt = decode(encode(data))
    assert rebuilt == data
    assert orjson.dumps(rebuilt) == orjson.dumps(data)  # key order too


def test_no_piece_holds_a_large_subtree() -> None:
    data = orjson.loads(orjson.dumps(BODIES["deep and wide"]))
    for piece in encode(data):
        for event in pickle.loads(piece):
            # one event: a leaf of at most PIECE_BYTES of JSON, or an open/close marker
            assert len(event) < 2 * PIECE_BYTES


def test_the_worker_refuses_a_body_over_the_limits_without_sending_it_back() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}] * 11})
    status, payload = parse_in_worker(body, parse_chat_body, ("messages",), SizeLimits(10, 100))
    assert status == "limit"
    (code, message, _kind, error_code, param), model = payload
    assert (code, error_code, param, model) == (413, "too_many_messages", "messages", "m")
    assert "server.max_messages" in message


def test_the_worker_reports_a_bad_body_as_the_parser_does() -> None:
    status, payload = parse_in_worker(b"{nope", parse_chat_body, ("messages",), None)
    assert status == "error"
    assert ProxyError(*payload).status == 400


async def test_a_large_body_parsed_in_the_worker_process_is_the_parsers_own() -> None:
    data = BODIES["many messages"]
    raw = orjson.dumps(data)
    assert raw.count(b",") > THREAD_PARSE_VALUES  # too many values to parse on the thread
    offload = Offload()
    try:
        parsed = await offload.parse(
            raw, parse_chat_body, params=("messages",), limits=None, applies=lambda _: True
        )
        assert parsed == data
        with pytest.raises(ProxyError) as refused:
            await offload.parse(
                raw,
                parse_chat_body,
                params=("messages",),
                limits=SizeLimits(1000, 1000),
                applies=lambda _: True,
            )
        assert refused.value.status == 413
        # A model that is not compacted: the limits do not apply.
        parsed = await offload.parse(
            raw,
            parse_chat_body,
            params=("messages",),
            limits=SizeLimits(1000, 1000),
            applies=lambda _: False,
        )
        assert len(parsed["messages"]) == 80_000
    finally:
        offload.close()
