"""The one SSE reader (compaction_proxy/wire/sse.py): a body cut into events as the SDKs cut
it, each keeping its bytes, and an event written again with new data."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from compaction_proxy.wire.sse import events, last_event

LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
DATA = st.dictionaries(
    st.sampled_from(["type", "index", "text"]), st.integers(-(2**40), 2**40), max_size=3
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bytes]:
    """Events written with any line end (one per event), some named, some after a stray blank
    line; and the data each one holds."""
    written = draw(st.lists(DATA, max_size=6))
    parts = []
    for data in written:
        end = draw(LINE_ENDS)
        if draw(st.booleans()):
            parts.append(end)  # a blank line with nothing before it
        lines = [b"event: e"] if draw(st.booleans()) else []
        lines.append(b"data: " + orjson.dumps(data))
        parts.append(b"".join(line + end for line in lines) + end)
    return written, b"".join(parts)


@given(bodies())
def test_the_events_joined_are_the_body_and_hold_what_was_written(
    case: tuple[list[dict[str, Any]], bytes],
) -> None:
    written, body = case
    read = events(body)
    assert b"".join(event.raw for event in read) == body
    assert [event.data for event in read if event.text is not None] == written
    assert all(event.complete for event in read)
    assert all(event.raw.strip(b"\r\n") == b"" for event in read if event.text is None)


@given(bodies(), DATA)
def test_an_event_written_again_changes_its_data_line_alone(
    case: tuple[list[dict[str, Any]], bytes], new: dict[str, Any]
) -> None:
    for event in events(case[1]):
        if event.text is None:
            continue
        again = event.with_data(new)
        (read,) = events(again)
        assert read.data == new and read.complete
        before = [line for line in event.lines if not line.startswith(b"data:")]
        assert [line for line in read.lines if not line.startswith(b"data:")] == before
        data_line = next(line for line in event.lines if line.startswith(b"data:"))
        assert again.replace(b"data: " + orjson.dumps(new), data_line.rstrip(b"\r\n"), 1) == (
            event.raw
        )


def test_every_line_keeps_its_own_end_when_the_data_is_rewritten() -> None:
    # A data line ending in CR before a CRLF blank line: written with another end, the CR and
    # the blank line's CRLF would make one line end, and the event would run into the next.
    (event,) = events(b'event: x\ndata: {"a":1}\r\r\n')
    assert event.with_data({"a": 2}) == b'event: x\ndata: {"a":2}\r\r\n'
    assert len(events(event.with_data({"a": 2}) + b"data: 3\n\n")) == 2


def test_data_lines_are_joined_and_the_name_and_type_read() -> None:
    (event,) = events(b'event:  done \r\ndata: {"type":\r\ndata:"stop"}\r\n: note\r\n\r\n')
    assert event.text == b'{"type":\n"stop"}'
    assert event.data == {"type": "stop"} and event.kind == "stop"
    assert event.name == "done"
    assert events(b"data: [DONE]\n\n")[0].data is None  # not JSON: its text alone
    assert events(b": ping\n\n")[0].text is None  # a comment has no data


def test_bytes_after_the_last_blank_line_are_an_event_not_complete() -> None:
    *whole, cut = events(b"data: 1\n\ndata: 2\nda")
    assert [e.data for e in whole] == [1] and whole[0].complete
    assert cut.raw == b"data: 2\nda" and not cut.complete
    (unterminated,) = events(b'data: {"type":"message_stop"}')
    assert unterminated.kind == "message_stop" and not unterminated.complete


def test_the_last_event_of_a_piece() -> None:
    piece = b"data: 1\n\nevent: e\r\ndata: 2\r\n\r\n"
    last = last_event(piece)
    assert last is not None and last.data == 2 and last.name == "e"
    assert last_event(b"") is None
