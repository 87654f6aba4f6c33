"""What a summary call's answer is read as: the summary text, or the failure it is.

The reply's text with an echoed ``<summary>`` wrapper taken off; ``empty`` when nothing is
left; ``oversized`` (:class:`SummaryCut`) when the model ran past the limit, cut or over by its
own usage (a truncated checkpoint silently loses its last sections); ``error`` when the body is
not the call's completion.  An error body's short ``code`` may be named, never its text.

A reply cut at the limit may be *salvaged* instead (:func:`salvage`): its complete lines, then
:data:`~compaction_proxy.compaction.summarizer_contract.CUT_MARK`, so neither the model that
reads it nor the report takes it for whole. A small local model often writes on until cut even
when told the limit; all of its summary lost (and a back-off started) costs more than its
unfinished last line, the more so as the ledger carries the exact strings beside it.  Such a
model often loops, too: the same lines over and over until the cut.  A line said again is
dropped (:func:`without_repeats`): it adds nothing, and every later request would pay for it.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from compaction_proxy.compaction.summarizer_contract import CUT_MARK, SummaryError
from compaction_proxy.wire import SummaryCall


class SummaryCut(SummaryError):
    """The summary ran past its limit (``oversized``): cut, or over by its usage."""


def error_code(content: bytes) -> str:
    """`` (code)`` from an OpenAI-shaped error body, when it has a short one; never its text."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        if isinstance(code, str) and len(code) <= 64 and code.replace("_", "").isalnum():
            return f" ({code})"
    return ""


def read_completion(
    content: bytes,
    call: SummaryCall,
    source: str,
    limit: int,
    count: Callable[[str], int],
    usage: dict[str, int] | None = None,
    *,
    salvaged: bool = False,
) -> str:
    """The summary in ``content`` (``source``: who answered, for the error messages, e.g.
    ``summarizer upstream 'openai' (gpt-4o)``); with ``salvaged``, a reply cut at ``limit`` is
    kept as its complete lines and :data:`CUT_MARK` when it has any (:func:`salvage`)."""
    try:
        reply = call.read(orjson.loads(content))
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise SummaryError("error", f"{source}: the response is not {call.what}") from exc
    if usage is not None and reply.cached_tokens:
        usage["cached_tokens"] = reply.cached_tokens
    text = strip_echoed_wrapper(reply.text)
    if not text:
        raise SummaryError("empty", f"{source} returned an empty summary")
    if reply.cut:
        kept = salvage(text, limit, count) if salvaged else None
        if kept is not None:
            return kept
        raise SummaryCut(
            "oversized", f"{source}: the summary was cut at the limit of {limit} tokens"
        )
    used = reply.completion_tokens
    if used is None:
        used = count(text)
    if used > limit:
        raise SummaryCut(
            "oversized",
            f"{source}: the summary has {used} tokens, over the limit of {limit}",
        )
    return text


def strip_echoed_wrapper(text: str) -> str:
    """The summary without surrounding whitespace or a ``<summary>`` wrapper the model may echo
    (the proxy adds its own when it places the checkpoint); otherwise verbatim."""
    stripped = text.strip()
    if stripped.startswith("<summary>") and stripped.endswith("</summary>"):
        return stripped[len("<summary>") : -len("</summary>")].strip()
    return stripped


REPEAT_MIN_CHARS = 8
"""A line this long or longer (stripped) is dropped when said again (:func:`without_repeats`);
shorter ones (``---``, ``- ok``) may repeat by design."""


def without_repeats(lines: list[str]) -> list[str]:
    """``lines`` without the ones said before (the same text, stripped, at least
    :data:`REPEAT_MIN_CHARS` long), code fences left as they are: a model looping until the
    cut writes the same lines over and over, and the first of each says all of them do."""
    out: list[str] = []
    seen: set[str] = set()
    fenced = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced and len(stripped) >= REPEAT_MIN_CHARS:
            if stripped in seen:
                continue
            seen.add(stripped)
        out.append(line)
    return out


def salvage(text: str, limit: int, count: Callable[[str], int]) -> str | None:
    """The complete lines of ``text``, a reply cut mid-way, then :data:`CUT_MARK`, within
    ``limit`` tokens; ``None`` when no line of content is complete.

    The last line is the one the cut ended; lines said again go (:func:`without_repeats`), and
    so do headings left without a line under them and an unclosed code fence (a fence left open
    would swallow what follows it).
    """
    lines = without_repeats(text.split("\n")[:-1])  # the last line is unfinished
    while lines:
        if sum(1 for line in lines if line.lstrip().startswith("```")) % 2:
            del lines[max(i for i, line in enumerate(lines) if line.lstrip().startswith("```")) :]
            continue
        last = lines[-1].strip()
        if not last or last.startswith("#"):
            lines.pop()
            continue
        kept = "\n".join(lines) + "\n\n" + CUT_MARK
        if count(kept) <= limit:
            return kept
        lines.pop()
    return None
