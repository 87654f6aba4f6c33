"""What a folded group leaves in the ledger: exact strings, without a model.

:func:`extract` reads one group's messages (their current forms) as they are folded: a user
message's rules and statements (:mod:`.statements`); an assistant's tool calls (the paths and
commands of their arguments, a call left without a result as open work) and the results
answering them (the command's exit status or verdict line, error lines, URLs, paths,
identifiers, numbers with their units); an assistant's text the same, plus its TODO / next-step
lines as open work and its "done: ..." lines as what closes one.  The proxy's own summaries and
ledgers are not read.  Deterministic, and bounded per message (:data:`~.patterns.SCAN_CHARS`
read at each end, :data:`~.patterns.PER_KIND` items per kind).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..chat_messages import Message, role_of, text_only
from ..marks import strip_mark
from . import patterns as p
from .items import COMMAND_ARROW, Item, Section, item_key
from .statements import user_items

RecallOf = Callable[[Message], str | None]
"""The recall id of a folded message (``None``: recall off)."""

_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "target_file", "notebook_path")
_COMMAND_KEYS = ("command", "cmd", "script", "shell", "commands")
_USER_UNITS = 40
"""At most this many rules and statements from one user message."""


MADE_MARKS = ("[Tool results: ", "[soft-trimmed: ", "[Old tool result content cleared]")
"""What the proxy's own stand-ins hold (a collapsed group, strategies/tool_result_compaction.py;
a trimmed result, strategies/context_pruning.py and strategies/_support/last_resort.py; a
cleared one): the original each stands for was read when it was made, so a stand-in folded later is
not read again (its older values would supersede newer ones)."""


def made_by_proxy(message: Message) -> bool:
    """True for one of the proxy's stand-ins (:data:`MADE_MARKS`, or a recall mark)."""
    text = text_only(message)
    return strip_mark(text) != text or any(mark in text for mark in MADE_MARKS)


def bounded(text: str) -> str:
    """The part of ``text`` extraction reads: all of it, or both ends of a long one."""
    if len(text) <= 2 * p.SCAN_CHARS:
        return text
    return text[: p.SCAN_CHARS] + "\n" + text[-p.SCAN_CHARS :]


def _line(text: str) -> str:
    one = text.strip() if "\n" not in text.strip() else " ".join(text.split())
    return one if len(one) <= p.ITEM_CHARS else one[: p.ITEM_CHARS - 1] + "…"


def _arguments(function: Mapping[str, Any]) -> dict[str, Any]:
    raw = function.get("arguments", function.get("input"))
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        try:
            value = json.loads(raw[: 2 * p.SCAN_CHARS])
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _calls(message: Message) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(call id, name, arguments) of each call ``message`` makes."""
    out: list[tuple[str | None, str, dict[str, Any]]] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, Mapping):
            continue
        function = call.get("function") or call.get("custom")
        if isinstance(function, Mapping):
            call_id = call.get("id")
            name = function.get("name")
            out.append(
                (
                    call_id if isinstance(call_id, str) else None,
                    name if isinstance(name, str) else "?",
                    _arguments(function),
                )
            )
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        name = legacy.get("name")
        out.append((None, name if isinstance(name, str) else "?", _arguments(legacy)))
    return out


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def verdict(text: str) -> str | None:
    """The lines that say how a command ended: the last test/build verdict and the last exit
    status, both when the output has both ("2 failed, 156 passed in 3.4s; exit code 1"),
    else the last error line."""
    lines = text.splitlines()
    said: dict[bool, str] = {}  # is an exit status -> its line
    for line in reversed(lines[-200:]):
        found = p.VERDICT.search(line)
        if found is not None:
            said.setdefault(p.EXIT_STATUS.match(found.group(0)) is not None, _line(_bare(line)))
            if len(said) == 2:
                break
    if said:
        return "; ".join(said[k] for k in (False, True) if k in said)
    for line in reversed(lines[-200:]):
        if p.ERROR_LINE.match(line):
            return _line(line)
    return None


_RULER = re.compile(r"^[\s=*#-]{3,}|[\s=*#-]{3,}$")


def _bare(line: str) -> str:
    """``line`` without the ruler a test runner draws around its verdict
    (``===== 2 failed, 13 passed in 1.42s =====``): the words are the verdict."""
    return _RULER.sub("", line) or line


def text_items(text: str, recall: str | None) -> list[Item]:
    """The artifacts of a tool result's or an assistant's ``text`` (already bounded)."""
    found: list[Item] = []

    def take(section: Section, values: Iterable[str]) -> None:
        # Over PER_KIND of a kind, the first and the last ones: an output's head says what
        # ran, its tail how it ended (a benchmark's results, a test run's verdict).
        distinct = list(dict.fromkeys(values))
        if len(distinct) > p.PER_KIND:
            head = p.PER_KIND // 2
            distinct = distinct[:head] + distinct[head - p.PER_KIND :]
        found.extend(Item(section, value, recall) for value in distinct)

    lines = text.splitlines()
    take(Section.ERRORS, (_line(line) for line in lines if p.ERROR_LINE.match(line)))
    prompts = (p.SHELL_PROMPT.match(line) for line in lines)
    take(Section.COMMANDS, (_line(m.group(1)) for m in prompts if m is not None))
    take(Section.URLS, (m.group(0) for m in p.URL.finditer(text)))
    take(Section.FILES, (m.group(0) for m in p.PATH.finditer(text) if "://" not in m.group(0)))
    ids = (
        m.group(0)
        for pattern in (p.ASSIGNMENT, p.UUID, p.HASH, p.VERSION, p.TICKET)
        for m in pattern.finditer(text)
    )
    take(Section.IDENTIFIERS, (*ids, *(f"`{m.group(1)}`" for m in p.BACKTICK.finditer(text))))
    take(Section.NUMBERS, (_measured(text, m) for m in p.NUMBER.finditer(text)))
    take(Section.OPEN, (_line(line) for line in lines if p.OPEN_LINE.match(line)))
    return found


def _measured(text: str, number: re.Match[str]) -> str:
    """``number`` with the words before it that say what it measures (on its line)."""
    start = number.start()
    before = text[max(0, start - 48) : start].rpartition("\n")[2]
    what = p.WHAT.search(before)
    return _line((what.group(0) if what else "") + number.group(0))


def done_keys(text: str) -> list[str]:
    """The open-work keys a "done: ..." / "Fixed ..." line of ``text`` closes."""
    return [
        item_key(Section.OPEN, m.group(1))
        for line in text.splitlines()
        if (m := p.DONE_LINE.match(line))
    ]


def extract(members: Sequence[Message], recall_of: RecallOf) -> tuple[list[Item], list[str]]:
    """The items of one folded group (``members``, their current forms) and the open-work keys
    it closes (see the module docstring)."""
    items: list[Item] = []
    closed: list[str] = []
    results: dict[str, tuple[str, str | None]] = {}
    for message in members:
        call_id = message.get("tool_call_id")
        if role_of(message) in ("tool", "function") and isinstance(call_id, str):
            results[call_id] = (bounded(strip_mark(text_only(message))), recall_of(message))
    for message in members:
        if made_by_proxy(message):
            continue
        role = role_of(message)
        recall = recall_of(message)
        text = bounded(strip_mark(text_only(message)))
        if role == "user":
            items.extend(user_items(text, recall)[:_USER_UNITS])
            continue
        if role in ("tool", "function"):
            items.extend(text_items(text, recall))
            continue
        if role != "assistant":
            continue
        items.extend(_call_items(message, results, recall))
        items.extend(text_items(text, recall))
        closed.extend(done_keys(text))
    return _without_repeats(items), closed


_ATOMS = frozenset({Section.FILES, Section.URLS, Section.IDENTIFIERS})
_LINES = frozenset({Section.COMMANDS, Section.ERRORS, Section.NUMBERS})
_SAYING = frozenset({Section.COMMANDS, Section.ERRORS})
"""The lines a number of the same group may already be part of (a verdict's duration)."""


def _without_repeats(items: list[Item]) -> list[Item]:
    """``items`` less a path, URL or identifier a command, error or number line of the same
    group already holds verbatim (the line carries it, with its context), less a number a
    command's verdict or an error line already holds, less a path said
    again (the first, a call's ``path (tool)``, is kept), and less a file name another path of
    the group ends with (``db.py`` beside ``src/app/db.py``)."""
    lines = [i.text for i in items if i.section in _LINES]
    said = [i.text for i in items if i.section in _SAYING]
    paths = {i.key for i in items if i.section is Section.FILES}
    tails = {path.rsplit("/", 1)[1] for path in paths if "/" in path}
    seen: set[str] = set()
    kept = []
    for i in items:
        if i.section in _ATOMS and any(i.key in line for line in lines):
            continue
        if i.section is Section.NUMBERS and any(i.text in line for line in said):
            continue
        if i.section is Section.FILES:
            if i.key in seen or ("/" not in i.key and i.key in tails):
                continue
            seen.add(i.key)
        kept.append(i)
    return kept


def _call_items(
    message: Message, results: Mapping[str, tuple[str, str | None]], recall: str | None
) -> list[Item]:
    """Paths and commands of the calls ``message`` makes, each command with the verdict of its
    result, and the URLs of their other arguments (a page fetched); a call without a result as
    open work."""
    items: list[Item] = []
    for call_id, name, arguments in _calls(message):
        result = results.get(call_id) if call_id is not None else None
        for key in _PATH_KEYS:
            for path in _strings(arguments.get(key))[: p.PER_KIND]:
                items.append(Item(Section.FILES, f"{_line(path)} ({name})", recall))
        for key in _COMMAND_KEYS:
            for command in _strings(arguments.get(key))[:1]:
                said = verdict(result[0]) if result is not None else None
                text = _line(command) + (COMMAND_ARROW + said if said else "")
                items.append(Item(Section.COMMANDS, _line(text), recall))
        others = (
            value
            for key, value in arguments.items()
            if key not in _PATH_KEYS and key not in _COMMAND_KEYS and isinstance(value, str)
        )
        urls = (m.group(0) for value in others for m in p.URL.finditer(value[: p.SCAN_CHARS]))
        for url in list(dict.fromkeys(urls))[: p.PER_KIND]:
            items.append(Item(Section.URLS, url, recall))
        if call_id is not None and result is None:
            summary = _line(json.dumps(arguments, sort_keys=True, ensure_ascii=False))
            items.append(Item(Section.OPEN, f"{name} {summary} (no result yet)", recall))
    return items
