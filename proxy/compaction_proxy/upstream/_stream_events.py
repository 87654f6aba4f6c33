"""Server-sent events as the forwarder relays them: whole events only, so a stream the proxy
must end (a shutdown) ends on an event boundary with an error event the SDKs read.

An upstream writes each event at once, but TCP may split it, so a chunk can end in the middle
of one. The relay sends every chunk up to its last event boundary at once and holds the rest
(a part of one event, which no client can act on before its end anyway) until the next chunk
completes it. Bytes are never changed, only where a chunk is cut: the client gets exactly the
upstream's bytes, and at any moment has received whole events only. That is what makes a
clean end possible: after the last whole event, one error event in the route's own format
(``WireFormat.stream_error``): chat completions (and any passthrough stream) ``data:
{"error": {...}}``, which the SDKs raise as an ``APIError``; the Responses API its own
``event: error`` numbered after the last event relayed; the Messages API ``event: error``
in Anthropic's shape.

The relay also knows whether the last event it sent ends the reply (the event any format's
streams end with, ``WireFormat.ends_stream``: ``data: [DONE]``, ``response.completed``,
``response.failed``, ``response.incomplete``, Anthropic's ``message_stop``): a client that
closes right after it has been answered in full (compaction_proxy/upstream/_relay.py). Events are
cut and read by the one SSE reader (compaction_proxy/wire/sse.py).
"""

from __future__ import annotations

import re

from compaction_proxy.http import ProxyError
from compaction_proxy.wire import WireFormat
from compaction_proxy.wire.registry import ends_stream
from compaction_proxy.wire.sse import WHOLE, last_boundary, last_event

MAX_HELD = 1 << 20
"""Bytes of one unfinished event held at most; a longer event is relayed as it comes."""
_HEAD = 256
"""Bytes of the last event's start where a ``sequence_number`` is looked for when its data is
not one JSON object."""
_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d+)')


class EventRelay:
    """Cuts a relayed SSE body at event boundaries and remembers its last event."""

    __slots__ = ("_held", "_last", "mid_event")

    def __init__(self) -> None:
        self._held = b""
        # The last piece sent: it starts and ends at event boundaries, so it holds the last
        # event whole (read only when asked, never per chunk).
        self._last = b""
        self.mid_event = False
        """Part of an unfinished event went out (one longer than :data:`MAX_HELD`)."""

    def take(self, chunk: bytes) -> bytes:
        """What of ``chunk`` (after anything held) to send now: up to the last boundary."""
        if not self._held and chunk.endswith(WHOLE):
            # The common case: the upstream wrote whole events. Sent as it is.
            self._last = chunk
            self.mid_event = False
            return chunk
        data = self._held + chunk if self._held else chunk
        cut = last_boundary(data)
        if cut < 0:
            if len(data) <= MAX_HELD:
                self._held = data
                return b""
            cut = len(data)
            self.mid_event = True
        elif cut < len(data) and len(data) - cut > MAX_HELD:
            cut = len(data)
            self.mid_event = True
        else:
            self.mid_event = False
        sent, self._held = data[:cut], data[cut:]
        self._last = sent
        return sent

    def rest(self) -> bytes:
        """What is held: the upstream ended (or broke) in the middle of an event; relayed as
        it came, exactly as without the relay."""
        data, self._held = self._held, b""
        if data:
            self.mid_event = True
        return data

    @property
    def terminal(self) -> bool:
        """Whether the last event sent ends the reply: nothing the client needs is left."""
        if self.mid_event:
            return False
        event = last_event(self._last)
        return event is not None and ends_stream(event)

    def error_event(self, error: ProxyError, wire: WireFormat | None) -> bytes:
        """The event that ends the stream, in the route's format (``wire.stream_error``;
        OpenAI's chat shape without one); preceded by a blank line if an unfinished event
        went out, so it stands alone."""
        lead = b"\n\n" if self.mid_event else b""
        if wire is None:
            return lead + b"data: " + error.body() + b"\n\n"
        event = wire.stream_error(
            error.message,
            type=error.type,
            code=error.code,
            param=error.param,
            sequence=self._next_sequence(),
        )
        return lead + event

    def _next_sequence(self) -> int:
        """One past the last whole event's ``sequence_number`` (0 when it has none)."""
        if self.mid_event:
            return 0
        event = last_event(self._last)
        if event is None:
            return 0
        if isinstance(event.data, dict):
            number = event.data.get("sequence_number")
        else:
            found = _SEQUENCE.search(event.raw[:_HEAD])  # not one JSON object: its first field
            number = int(found.group(1)) if found else None
        return number + 1 if isinstance(number, int) and not isinstance(number, bool) else 0
