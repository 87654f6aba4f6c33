"""What a recall answer says: an archived original as text, keyword search, pages (docs/recall.md).

The model calls ``compaction_recall`` with ids its placeholders named, or with a ``query``;
the proxy answers with plain text (a tool result), built here from the originals the archive
returned:

* :func:`render`: one original as a header line ``[recall id rX: role, tool name]`` and its
  content as text, everything of it (no elision: a long original is paged instead), in the
  words of :mod:`.message_text`: tool calls as ``name(arguments)``, parts that are not text
  named (``[image]``), the text riding in a format's ``blocks`` / ``items`` fields shown.
* :func:`search`: a plain keyword ranking over the conversation's originals (no model, no
  index on disk: a conversation's archive is at most a few thousand messages). An exact id or
  the query's words as a phrase rank first, then the idf-weighted frequency of the query's
  words; ties go to the newest.
* :func:`page`: an answer longer than ``recall.max_tokens`` cut at line boundaries into pages,
  each closing with how to ask for the next.

Pure: the edge fetches the originals (``compaction_proxy/checkpoints/_archive.py``) and
counts tokens with the tokenizer it passes in.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .archive import ID_PATTERN
from .errors import CompactionProxyError
from .message_text import call_text, content_text, part_text, riding_parts, scrub_text, tool_calls

__all__ = [
    "PageOutOfRange",
    "message_text",
    "page",
    "render",
    "search",
]

Message = Mapping[str, Any]
CountText = Callable[[str], int]

REASONING_PLACEHOLDER = "[reasoning]"
_WORD = re.compile(r"\w+")


class PageOutOfRange(CompactionProxyError, ValueError):
    """A page past the answer's last: ``pages`` says how many there are."""

    def __init__(self, number: int, pages: int) -> None:
        super().__init__(f"page {number} is past the last page ({pages})")
        self.number = number
        self.pages = pages


# ------------------------------------------------------------------ one original as text


def header(recall_id: str, message: Message, tool: str | None = None) -> str:
    """``[recall id rX: role]``, with ``, tool name`` for a tool's result when its name is
    known (``tool``, or the message's own ``name`` on a legacy ``function`` result)."""
    role = message.get("role")
    role = role if isinstance(role, str) and role else "unknown"
    if tool is None and role == "function":
        name = message.get("name")
        tool = name if isinstance(name, str) and name else None
    suffix = f", tool {tool}" if tool and role in ("tool", "function") else ""
    return f"[recall id {recall_id}: {role}{suffix}]"


def message_text(message: Message) -> str:
    """Everything of ``message`` a model read, as text (the body of :func:`render`)."""
    lines: list[str] = []
    text = content_text(message.get("content"), reasoning=REASONING_PLACEHOLDER)
    if text:
        lines.append(text)
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        lines.append(f"[refusal] {scrub_text(refusal)}")
    if message.get("audio"):
        lines.append("[audio]")
    lines.extend(call_text(function) for function in tool_calls(message))
    for part in riding_parts(message):
        riding = part_text(part, reasoning=REASONING_PLACEHOLDER)
        if riding and riding.strip():
            lines.append(riding)
    return "\n".join(lines)


def render(recall_id: str, message: Message, tool: str | None = None) -> str:
    """The answer text of one original: its :func:`header` line, then its text."""
    body = message_text(message)
    head = header(recall_id, message, tool)
    return f"{head}\n{body}" if body else head


# ------------------------------------------------------------------ search


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def search(query: str, entries: Mapping[str, Message], *, limit: int | None = None) -> list[str]:
    """The ids of ``entries`` (oldest first) that match ``query``, best first.

    Ranked by tier, then score, then recency: an entry whose id the query names, then entries
    holding the query's words (two or more) as a phrase, then the rest by the sum over the
    query's distinct words of ``(1 + log tf) * log(1 + N / df)`` (a word most entries hold
    counts little; a long log repeating a word does not drown a short answer naming it once).
    Entries that match nothing are left out; ties go to the newer entry.
    """
    named = {match.group(0) for match in ID_PATTERN.finditer(query)}
    query_words = _words(query)
    terms = list(dict.fromkeys(query_words))
    phrase = f" {' '.join(query_words)} " if len(query_words) >= 2 else None
    documents = {key: _words(message_text(message)) for key, message in entries.items()}
    frequencies = {key: Counter(words) for key, words in documents.items()}
    total = len(documents)
    wanted = set(terms)
    holding = Counter(term for counts in frequencies.values() for term in wanted & counts.keys())
    ranked: list[tuple[int, float, int, str]] = []
    for position, key in enumerate(documents):
        counts = frequencies[key]
        score = sum(
            (1.0 + math.log(counts[term])) * math.log(1.0 + total / holding[term])
            for term in terms
            if counts[term]
        )
        tier = 0
        if key in named:
            tier = 2
        elif phrase is not None and phrase in f" {' '.join(documents[key])} ":
            tier = 1
        if tier or score > 0:
            ranked.append((tier, score, position, key))
    ranked.sort(reverse=True)
    ids = [key for *_, key in ranked]
    return ids if limit is None else ids[:limit]


# ------------------------------------------------------------------ pages


def _footer(number: int, pages: int, name: str) -> str:
    if number < pages:
        return f"(page {number} of {pages}: call {name} again with page={number + 1})"
    return f"(page {number} of {pages})"


def _split_line(line: str, budget: int, count: CountText) -> list[str]:
    """A line too long for one page, cut into pieces that each fit ``budget`` tokens.

    The line is counted once, for its characters per token; each piece is then cut to that
    estimate and counted alone (shrunk while it is over), so a megabyte of minified JSON costs
    a count of itself and of each piece, not of every remainder (which was quadratic)."""
    total = count(line)
    if total <= budget:
        return [line]
    per_token = max(len(line) / max(total, 1), 0.25)
    step = max(1, int(budget * per_token * 0.9))
    pieces: list[str] = []
    start = 0
    while start < len(line):
        size = min(step, len(line) - start)
        while size > 1 and count(line[start : start + size]) > budget:
            size = max(1, int(size * 0.8))
        pieces.append(line[start : start + size])
        start += size
    return pieces


def _pages(
    lines: Sequence[str], counts: Sequence[int], newline: int, budget: int, count: CountText
) -> list[str]:
    """``lines`` (of ``counts`` tokens each) packed greedily into pages of ``budget`` tokens."""
    pages: list[str] = []
    current: list[str] = []
    used = 0
    for raw, tokens in zip(lines, counts, strict=True):
        if tokens <= budget:
            pieces = [(raw, tokens)]
        else:
            pieces = [(piece, count(piece)) for piece in _split_line(raw, budget, count)]
        for piece, cost in pieces:
            if current and used + newline + cost > budget:
                pages.append("\n".join(current))
                current, used = [], 0
            used += cost + (newline if current else 0)
            current.append(piece)
    if current or not pages:
        pages.append("\n".join(current))
    return pages


def page(
    text: str,
    max_tokens: int,
    number: int,
    count: CountText,
    *,
    tool: str = "compaction_recall",
) -> tuple[str, int]:
    """Page ``number`` (from 1) of ``text`` cut to pages of at most about ``max_tokens``
    tokens at line boundaries (a longer line is cut where it must be), and how many pages
    there are. A text of several pages closes each with ``(page 1 of 3: call
    compaction_recall again with page=2)``; one that fits is returned as it is.
    :class:`PageOutOfRange` for a page past the last.

    The pages are the same on every call for the same text and limit, so the model can walk
    them one call at a time.
    """
    if number < 1:
        raise PageOutOfRange(number, 0)
    # Each line is counted once (a line's count is the same in every page it could open),
    # and the whole text is their sum: a long answer is tokenized once, not twice.
    lines = text.split("\n")
    counts = [count(line) for line in lines]
    newline = max(1, count("\n"))
    if sum(counts) + newline * (len(lines) - 1) <= max_tokens:
        if number != 1:
            raise PageOutOfRange(number, 1)
        return text, 1
    reserve = count(_footer(99_999, 99_999, tool)) + count("\n\n")
    budget = max(1, max_tokens - reserve)
    pages = _pages(lines, counts, newline, budget, count)
    if number > len(pages):
        raise PageOutOfRange(number, len(pages))
    return f"{pages[number - 1]}\n\n{_footer(number, len(pages), tool)}", len(pages)
