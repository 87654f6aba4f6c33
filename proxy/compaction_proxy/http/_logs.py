"""Structured logs: one JSON object per line, so a log pipeline needs no parser of ours.

Nothing here ever formats a request body or a header value: credentials and conversation
content cannot reach the log through this module.
"""

from __future__ import annotations

import logging
import logging.config
import os
import time
from typing import Any

import orjson

ACCESS = logging.getLogger("compaction_proxy.access")
DECISIONS = logging.getLogger("compaction_proxy.compaction")
"""The per-request decision log (the compactor writes it), on when :func:`debug_enabled`."""


def debug_enabled() -> bool:
    """``COMPACTION_DEBUG`` is set to a true value: the decision log is on."""
    return os.environ.get("COMPACTION_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


_RESERVED = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "color_message"}


_ACCESS_NAME = "compaction_proxy.access"
_last_second = -1
_last_stamp = ""


def _timestamp(now: float) -> str:
    """ISO-8601 UTC with milliseconds; the seconds part is formatted once per second."""
    global _last_second, _last_stamp
    second = int(now)
    if second != _last_second:
        _last_second = second
        _last_stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_last_stamp}.{int((now - second) * 1000):03d}Z"


def access_line(fields: dict[str, Any]) -> str:
    """One access-log line, already JSON: the hot path pays for one orjson call, no more."""
    head = {
        "ts": _timestamp(time.time()),
        "level": "info",
        "logger": _ACCESS_NAME,
        "msg": "request",
    }
    return orjson.dumps({**head, **fields}).decode()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.name == _ACCESS_NAME and not record.args:
            return record.getMessage()
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def logging_config(level: str = "info") -> dict[str, Any]:
    """The whole logging set-up as a `logging.config.dictConfig` mapping.

    A mapping rather than calls, because uvicorn's worker processes are spawned, not forked:
    handed to `uvicorn.run(log_config=...)`, every worker applies the same set-up, where
    calls made in the parent would leave workers with no handler at all.

    `COMPACTION_DEBUG=true` turns on the per-request decision log by itself: its logger gets
    its own DEBUG level, so it does not also need `server.log_level: debug` (which would make
    every other logger verbose too).
    """
    loggers: dict[str, dict[str, Any]] = {
        "uvicorn": {"handlers": [], "propagate": True},
        "uvicorn.error": {"handlers": [], "propagate": True},
        # Our access line replaces uvicorn's, which would print paths with query strings.
        "uvicorn.access": {"handlers": [], "propagate": False, "level": "CRITICAL"},
        # httpx logs every request URL at INFO, query string (and any key in it) included.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    }
    if debug_enabled():
        loggers[DECISIONS.name] = {"level": "DEBUG"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": loggers,
    }


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr for this process (see :func:`logging_config`)."""
    logging.config.dictConfig(logging_config(level))
