"""Message builders shared by the compaction tests."""

from __future__ import annotations

from typing import Any

import orjson

Msg = dict[str, Any]


def s(text: str = "sys") -> Msg:
    return {"role": "system", "content": text}


def dev(text: str = "dev") -> Msg:
    return {"role": "developer", "content": text}


def u(text: str = "hi") -> Msg:
    return {"role": "user", "content": text}


def a(text: str = "ok") -> Msg:
    return {"role": "assistant", "content": text}


def call(*ids: str, name: str = "get_weather", args: str = "{}") -> Msg:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
            for i in ids
        ],
    }


def tool(call_id: str, content: str = "sunny") -> Msg:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def fcall(name: str, args: str = "{}") -> Msg:
    return {
        "role": "assistant",
        "content": None,
        "function_call": {"name": name, "arguments": args},
    }


def fresult(name: str, content: str = "done") -> Msg:
    return {"role": "function", "name": name, "content": content}


def dumps(messages: list[Msg]) -> bytes:
    return orjson.dumps(messages)


def contents(messages: list[Any]) -> list[Any]:
    return [m.get("content") for m in messages]
