"""Errors the proxy itself raises, in OpenAI's shape so every SDK parses them.

Upstream errors never pass through here: they go back to the client byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from compaction_proxy.compaction.errors import CompactionProxyError


# Not frozen: Python sets `__traceback__` on exceptions passing through a @contextmanager
# (httpx wraps every send in one), and a frozen dataclass turns that into a TypeError.
# eq=False keeps exceptions hashable by identity.
@dataclass(slots=True, eq=False)
class ProxyError(CompactionProxyError):
    """An error the proxy answers itself: the HTTP status and the fields of OpenAI's body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None

    def body(self) -> bytes:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> bytes:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``: the one place
    it is built, for every error the proxy answers (routes, the app, the HTTP protocol's own
    431 and 400s, a stream's final error event on chat completions)."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(
    message: str, *, param: str | None = None, code: str = "invalid_request"
) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", code, param)
