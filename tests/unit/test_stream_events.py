"""The SSE event relay (compaction_proxy/upstream/_stream_events.py): whole events only, the same
bytes, and the error event that ends a stream the proxy must end."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction_proxy.http import ProxyError
from compaction_proxy.upstream import _stream_events as stream_events
from compaction_proxy.upstream._stream_events import EventRelay
from compaction_proxy.wire.chat import CHAT as CHAT_FORMAT
from compaction_proxy.wire.messages import MESSAGES
from compaction_proxy.wire.responses import RESPONSES as RESPONSES_FORMAT
from tests.support.sse import sse_data

CHAT = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":9}}\n\n',
    b"data: [DONE]\n\n",
]
RESPONSES = [
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n',
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"sequence_number":1,"delta":"hi"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","sequence_number":2,'
    b'"response":{"usage":{"input_tokens":9}}}\r\n\r\n',
]
MESSAGES_EVENTS = [
    b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
    b'{"input_tokens":9,"output_tokens":1}}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]
ERROR = ProxyError(503, "going away", "server_error", "server_shutting_down")


def relay_all(relay: EventRelay, chunks: list[bytes]) -> list[bytes]:
    sent = [relay.take(chunk) for chunk in chunks]
    return [*sent, relay.rest()]


@given(st.lists(st.integers(min_value=1, max_value=400), max_size=12))
def test_the_same_bytes_go_out_cut_only_at_event_boundaries(cuts: list[int]) -> None:
    stream = b"".join(CHAT + RESPONSES)
    points = sorted({min(c, len(stream)) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    relay = EventRelay()
    sent = relay_all(relay, chunks)
    assert b"".join(sent) == stream
    for piece in sent[:-1]:
        assert piece == b"" or piece.endswith((b"\n\n", b"\r\n\r\n"))
    assert sent[-1] == b""


def test_a_whole_event_goes_out_at_once_and_a_split_one_when_complete() -> None:
    relay = EventRelay()
    assert relay.take(CHAT[0]) == CHAT[0]  # the common case: no copy, nothing held
    head, tail = CHAT[1][:10], CHAT[1][10:]
    assert relay.take(head) == b""
    assert relay.take(tail + CHAT[2][:4]) == CHAT[1]
    assert relay.rest() == CHAT[2][:4]
    assert relay.mid_event


@pytest.mark.parametrize(
    ("events", "terminal"),
    [
        (CHAT[:2], False),
        (CHAT, True),
        (RESPONSES[:2], False),
        (RESPONSES, True),
        (MESSAGES_EVENTS[:2], False),
        (MESSAGES_EVENTS, True),
    ],
)
def test_it_knows_whether_the_last_event_ends_the_reply(
    events: list[bytes], terminal: bool
) -> None:
    relay = EventRelay()
    relay.take(b"".join(events))
    assert relay.terminal is terminal


def test_the_chat_error_event_is_openais_error_object() -> None:
    relay = EventRelay()
    relay.take(CHAT[0])
    event = relay.error_event(ERROR, CHAT_FORMAT)
    assert event.endswith(b"\n\n") and not event.startswith(b"\n")
    (data,) = sse_data(event)
    assert orjson.loads(data) == {
        "error": {
            "message": "going away",
            "type": "server_error",
            "param": None,
            "code": "server_shutting_down",
        }
    }


def test_the_responses_error_event_is_numbered_after_the_last_one() -> None:
    relay = EventRelay()
    relay.take(b"".join(RESPONSES[:2]))
    event = relay.error_event(ERROR, RESPONSES_FORMAT)
    assert event.startswith(b"event: error\ndata: ")
    (data,) = sse_data(event)
    assert orjson.loads(data) == {
        "type": "error",
        "code": "server_shutting_down",
        "message": "going away",
        "param": None,
        "sequence_number": 2,
    }


def test_the_messages_error_event_is_anthropics() -> None:
    relay = EventRelay()
    relay.take(MESSAGES_EVENTS[0])
    event = relay.error_event(ERROR, MESSAGES)
    assert event.startswith(b"event: error\ndata: ")
    (data,) = sse_data(event)
    assert orjson.loads(data) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "going away"},
    }


def test_a_passthrough_stream_ends_with_openais_error_object() -> None:
    relay = EventRelay()
    assert relay.error_event(ERROR, None) == relay.error_event(ERROR, CHAT_FORMAT)


def test_an_event_longer_than_the_bound_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_events, "MAX_HELD", 16)
    relay = EventRelay()
    big = b"data: " + b"x" * 40
    assert relay.take(big) == big
    assert relay.mid_event and not relay.terminal
    # Its error event stands apart from the unfinished one.
    assert relay.error_event(ERROR, CHAT_FORMAT).startswith(b"\n\ndata: ")
    assert relay.take(b"\n\n" + CHAT[2]) == b"\n\n" + CHAT[2]
    assert relay.terminal
