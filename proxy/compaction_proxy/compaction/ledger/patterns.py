"""The patterns the ledger's extraction reads text with (:mod:`.extract`, :mod:`.statements`).

Each is a plain regular expression over one line or one bounded text, with no nested
quantifiers over the same characters, so a scan costs time linear in the text it reads (the
text per message is capped: :data:`SCAN_CHARS`).
"""

from __future__ import annotations

import re

SCAN_CHARS = 16 * 1024
"""Of a longer text, the first and the last this many characters are read (a 1 MiB tool
result costs what 32 KiB do)."""

ITEM_CHARS = 240
"""An artifact line (an error, a command, a TODO) is cut to this many characters."""

UNIT_CHARS = 600
"""A rule or statement longer than this is cut (with an ellipsis) rather than dropped."""

USER_UNITS = 64
"""At most this many rules and statements from one user message (the first half and the last
half of them): a user states a handful; hundreds are a pasted log, not the user's rules."""

PER_KIND = 6
"""At most this many items of one kind from one message."""

ERROR_LINE = re.compile(
    r"^\s*(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$|"
    r"(?:error|fatal|panic|FATAL|ERROR|Error)(?:\[[\w-]+\])?:\s.*$|"
    r"(?:FAILED|FAIL):?\s.*$|"
    r"[\w./-]+:\d+(?::\d+)?:\s*(?:error|fatal error)\b.*$|"
    r"E\s{2,}\S.*$)"
)
VERDICT = re.compile(
    r"(?i:exit(?:ed)?(?: with)? (?:code|status)[:= ]*-?\d+|returned (?:exit status )?-?\d+|"
    r"return code[:= ]*-?\d+|\d+ (?:passed|failed|errors?)\b[^\n]{0,80}|"
    r"build (?:succeeded|failed|successful)|BUILD (?:SUCCESS|FAILURE)|"
    r"all tests passed|tests? (?:passed|failed)|no tests ran[^\n]{0,40})"
)
EXIT_STATUS = re.compile(r"(?i:exit|returned|return code)")
"""Of a :data:`VERDICT` match: an exit status (kept beside a test or build verdict)."""
URL = re.compile(r"\bhttps?://[^\s<>()\[\]{}'\"`]+[^\s<>()\[\]{}'\"`.,;:!?]")
PATH = re.compile(
    r"(?<![\w/.:-])(?:~/|\.{1,2}/|/)?(?:[\w@.+-]+/)+[\w@+-][\w@.+-]*\.[A-Za-z0-9]{1,10}\b"
    r"|(?<![\w/.-])[\w-]+\.(?:py|pyi|js|mjs|ts|tsx|jsx|go|rs|rb|java|kt|c|h|cc|cpp|hpp|cs|"
    r"md|rst|txt|json|ya?ml|toml|ini|cfg|sh|sql|html|css|lock|env|proto)\b"
)
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
VERSION = re.compile(r"(?<![\w.-])v?\d+\.\d+(?:\.\d+)+(?:[-+][\w.]+)?\b|(?<![\w.-])v\d+\.\d+\b")
"""A version on its own (``v2.4.1``, ``Python 3.11.7``); not the tail of a package pin
(``pytest-8.3.2``, ``asyncio-0.24.0``): a bare number without its package says nothing, and a
pip or pytest header's pins would crowd a message's real versions out of its per-kind cap."""
TICKET = re.compile(r"\b[A-Z][A-Z0-9]{1,9}-\d{1,7}\b")
ASSIGNMENT = re.compile(r"(?<![\w-])[A-Z][A-Z0-9_]*(?:-\d+)? ?= ?[^\s,;'\"`=]+")
"""A constant, a setting or an id given a value (``DATABASE_URL=postgres://...``,
``KEY-7 = VALUE-k3x9``): the name upper-case, so code's ``x = y`` is not taken."""
BACKTICK = re.compile(r"`([^`\n]{1,80})`")
NUMBER = re.compile(
    r"(?<![\w.])-?\d+(?:[.,]\d+)?\s?"
    r"(?:ms|µs|us|ns|s|sec|secs|seconds|min|minutes|h|hours|KiB|MiB|GiB|TiB|KB|MB|GB|TB|kB|"
    r"bytes|B|%|percent|tokens|req/s|rps|qps|ops/s|it/s|MB/s|GB/s|x|MHz|GHz|files|tests|"
    r"lines|rows|items|requests|errors|warnings|retries|workers|cores|threads|USD|EUR|"
    r"[A-Za-z]{1,12}/(?:s|sec|min|h))"
    r"(?![\w/])"
)
"""A number with its unit; what it measures is read before it (:data:`WHAT`)."""
WHAT = re.compile(r"(?:[A-Za-z][\w/()-]*[ :=]+){1,3}$")
"""Up to three words right before a number: what it measures (matched on a short slice)."""
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
MONEY = re.compile(r"[$€£]\d[\d,.]*")
SHELL_PROMPT = re.compile(r"^\s*\$ (\S.*)$")
OPEN_LINE = re.compile(
    r"^\s*(?:[-*]\s*)?(?:TODO|FIXME|Next steps?|Still need to|Remaining)\b[:\s-]+\S.*$",
    re.IGNORECASE,
)
DONE_LINE = re.compile(
    r"^\s*(?:[-*]\s*)?(?:DONE|Done|Fixed|Completed|Finished)\b[:\s-]+(\S.*)$",
)
LABEL = re.compile(r"^\s*(?:[-*]\s*)?([A-Z][A-Z0-9]*(?:[ _/-][A-Z0-9]+){0,3}):\s+\S")
LOG_LEVELS = frozenset(
    {"INFO", "DEBUG", "TRACE", "WARN", "WARNING", "ERROR", "FATAL", "CRITICAL", "NOTICE"}
    | {"LOG", "OK"}
)
"""Labels a log line starts with: not a line the user flagged."""
RULE_LABEL = re.compile(
    r"RULE|CONSTRAINT|REQUIREMENT|REQUIRED|IMPORTANT|POLICY|NOTE|WARNING|MUST|NEVER|ALWAYS|"
    r"DO NOT|DON'T|FORBIDDEN|LIMIT|RESTRICTION|SECURITY|SAFETY|CRITICAL"
)
RULE_WORDS = re.compile(
    r"\b(?:never|always|must|mustn't|do not|don't|make sure|ensure|required?|"
    r"forbidden|prohibited|not allowed|under no circumstances|should not|shouldn't|"
    r"avoid|no more than|at most)\b"
    r"|\bkeep\b[^.;]{0,60}\b(?:as it is|as is|unchanged|intact)\b"
    r"|^only\b|\bonly (?:use|run|call|edit|change|touch|modify|write|read|answer|respond|reply|"
    r"return|do|work|commit|push|deploy|install)\b",
    re.IGNORECASE,
)
"""Words with the force of a rule.  "only" counts where it commands (a unit that starts with
it, "only use ..."), not where it describes ("the TTL is only a backstop")."""
PREFERENCE = re.compile(
    r"\b(?:I prefer|I'd prefer|I want|I'd like|I would like|please always|please use|"
    r"answer in|respond in|reply in|write in|use (?:only )?\w+ (?:style|format|units?))\b",
    re.IGNORECASE,
)
LIST_ITEM = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•])\s+\S")
NUMBERED_ITEM = re.compile(r"^\s*\d{1,2}[.)]\s+\S")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'`(\[])")
