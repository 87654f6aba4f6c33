"""An optional faster exact token counter, trusted only once it agrees with tiktoken.

Counting is the core's largest cost on a conversation it has not seen (a new session, a
restarted proxy): tiktoken's BPE is ~40 % of a cold 100k-token compaction, and it is quadratic
on long runs of one character (a 20,000-``a`` string costs ~2 ms). ``bpe-openai`` (bindings to
GitHub's ``bpe`` crate, which ships the same o200k/cl100k vocabularies) counts the same tokens
2-3x faster on agent text and in linear time, without building a token list.

tiktoken remains the reference: this module hands out a counter only when the package is
installed, knows the encoding, and agrees with the loaded tiktoken encoding on every string of
:data:`SELF_CHECK` (prose, code, JSON, whitespace runs, numbers, CJK, emoji, combining marks,
special-token text, long runs). Otherwise the caller counts with tiktoken as before. A string
the fast counter refuses (lone surrogates) is left to the caller's tiktoken path.

Known limits, why it is optional: the wheels are ~41 MB (the vocabularies are compiled in),
there are none for musl (Alpine) or Intel macOS, and the counter holds the GIL for much of its
work where tiktoken releases it, so a cold count on the edge's worker thread slows the event
loop more than tiktoken's would.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

Counter = Callable[[str], int]
"""Exact tokens of a plain string (special-token text counted as ordinary text)."""


class _Encoding(Protocol):
    @property
    def name(self) -> str: ...

    def encode_ordinary(self, text: str) -> list[int]: ...


SELF_CHECK: tuple[str, ...] = (
    "",
    "hello world",
    "The quick brown fox jumps over the lazy dog. It's 3:14pm; we'll see.",
    "  leading and trailing spaces   ",
    "line one\nline two\r\nline three\n\n\n\tindented\ttabs",
    "def count(x: int) -> int:\n    return x ** 2  # squared\n",
    '{"query": "SELECT * FROM users WHERE id = 42", "limit": 50, "ok": true, "v": null}',
    "1234567890 3.14159 1,000,000 0x1F -42 1e-9",
    "don't won't I'm you're they've she'll he'd 'quoted' ''",
    "DON'T WON'T I'M YOU'RE THEY'VE SHE'LL HE'D",
    "日本語のテキストと中文文本\uff0c还有한국어 텍스트\u3002",
    "emoji 🙂🙃 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 and ❤️",
    "combining: e\u0301 a\u0308 n\u0303; arabic: \u0627\u0644\u0633\u0644\u0627\u0645",
    "nbsp\u00a0and\u2028separators\u2029and\u200bzero\u3000width",
    "<|endoftext|> <|endofprompt|> <|fim_prefix|><|fim_middle|><|fim_suffix|>",
    "\x00\x01\x02\x1f control \x7f chars",
    "a" * 3000,
    " " * 1000,
    "\n" * 500,
    "ab" * 1500,
    "🙂" * 300,
    "9" * 2000,
    "https://example.com/path/to/file.py?x=1&y=two#frag user@example.org",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
    "2025-03-14T15:09:26.535Z INFO handler.request: took=900ms id=0a1b2c3d4e5f",
    "Ünïcødé lätin-1 façade naïve coöperate résumé",
    "mixed\tWHITE space \n \n  \t\t end",
)


def exact_counter(encoding: _Encoding) -> Counter | None:
    """A faster counter that gives ``len(encoding.encode_ordinary(text))`` for every text,
    or ``None`` (not installed, another encoding, or it disagreed on the self-check)."""
    try:
        bindings = importlib.import_module("bpe_openai._bindings")
    except ImportError:
        return None
    name = encoding.name
    try:
        if name not in bindings.supported_encodings():
            return None
        count: Counter = bindings.tokenizer_for_encoding(name).count
    except Exception as exc:  # an unexpected build of the package: count with tiktoken
        log.warning("bpe-openai unusable for %s (%s); counting with tiktoken", name, exc)
        return None
    for text in SELF_CHECK:
        if count(text) != len(encoding.encode_ordinary(text)):
            log.warning("bpe-openai disagrees with tiktoken on %s; counting with tiktoken", name)
            return None
    return count
