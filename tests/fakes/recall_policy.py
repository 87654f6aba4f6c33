"""The scripted model's side of recall, shared by the three fakes (chat, Responses, Messages).

A session plants facts in tool results (``KEY-7 = VALUE-k3x9``) and later asks for them in
a user message (``QUESTION: what is KEY-7?``). The fake model answers from what its prompt
shows; when the fact is not there and the proxy offered ``compaction_recall``, it calls the
tool (a query for the key, or the ids its prompt's marks name) and answers from the tool's
result on the next round. A fact counts only when the final answer contains it, so a session
without recall (or with a recall that failed) loses it for real.

Modifiers in the question: ``(by id)`` recalls by the marks' ids instead of a query;
``(ids: a,b)`` recalls exactly those ids; ``(first id)`` / ``(last id)`` recall the first /
last id the prompt's marks name (a model following what one message points at: a summary, or
a tool result that says "see [recall id ...]"); ``(mixed)`` calls recall and the client's
first tool in one turn; ``(forever)`` calls recall
whatever it was told (the proxy's caps must end it); none of them applies when the request
forbids tools (``tool_choice`` none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

RECALL_TOOL = "compaction_recall"
QUESTION = re.compile(r"QUESTION: what is (KEY-\d+)\?")
FACT = re.compile(r"(KEY-\d+) = (VALUE-[a-z0-9]+)")
MARK = re.compile(r"recall id ([rs][a-z2-7]{11})")
NAMED = re.compile(r"\(ids: ([a-z0-9,]+)\)")


def planted(index: int) -> tuple[str, str]:
    """The fact planted at step ``index``: its key and value (deterministic)."""
    value = "".join("abcdefghjkmnpqrstuvwxyz23456789"[(index * 7 + i * 13) % 31] for i in range(6))
    return f"KEY-{index}", f"VALUE-{value}"


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class CallRecall:
    arguments: str
    with_client_tool: bool = False


Decision = Answer | CallRecall


def decide(
    question: str,
    visible: str,
    recalled: list[str] | None,
    *,
    offered: bool,
    may_call: bool,
) -> Decision | None:
    """What the model does for the turn whose latest user message is ``question``.

    ``visible``: the prompt's text other than recall results; ``recalled``: the texts of the
    recall results after the question (None: no recall round yet); ``offered``: the request
    declares the recall tool; ``may_call``: its ``tool_choice`` lets the model call one.
    None: ``question`` asks nothing (another responder decides).
    """
    asked = QUESTION.search(question)
    if asked is None:
        return None
    key = asked.group(1)
    can_recall = offered and may_call
    if "(forever)" in question and can_recall:
        return CallRecall(orjson.dumps({"query": key}).decode())
    named = NAMED.search(question)
    if named is not None and recalled is None and can_recall:
        return CallRecall(orjson.dumps({"ids": named.group(1).split(",")}).decode())
    pointed = "(first id)" in question or "(last id)" in question
    if pointed and recalled is None and can_recall:
        ids = _marks(visible)
        if ids:
            one = ids[0] if "(first id)" in question else ids[-1]
            return CallRecall(orjson.dumps({"ids": [one]}).decode())
    if recalled is not None:
        for text in recalled:
            value = _value(key, text)
            if value is not None:
                return Answer(f"{key} = {value}")
        if can_recall and "(by id)" in question and len(recalled) < 3:
            ids = _marks("\n".join(recalled))
            if ids:
                return CallRecall(orjson.dumps({"ids": ids}).decode())
        return Answer(f"{key} is not in what I can see")
    value = _value(key, visible)
    if value is not None:
        return Answer(f"{key} = {value}")
    if not can_recall:
        return Answer(f"{key} is not in what I can see")
    if "(by id)" in question:
        ids = _marks(visible)
        if ids:
            return CallRecall(orjson.dumps({"ids": ids[-40:]}).decode())
    return CallRecall(orjson.dumps({"query": key}).decode(), "(mixed)" in question)


def _value(key: str, text: str) -> str | None:
    for found, value in FACT.findall(text):
        if found == key:
            return str(value)
    return None


def _marks(text: str) -> list[str]:
    return list(dict.fromkeys(MARK.findall(text)))
