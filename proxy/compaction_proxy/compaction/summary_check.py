"""What a summary kept on its own: the folded span's exact strings and rules checked against it.

A summary is a model's prose; what an agent needs next is mostly exact strings (paths,
commands, error lines, numbers) and the rules it was given.  The ledger carries those whatever
the summary says; this check only *measures* the summarizer, so operators see how good their
model is, and flags a summary that seems to turn a prohibition around (see "Summaries checked"
in docs/compaction.md).  Deterministic, no model, bounded by the sizes it is given.

The rules it applies:

* An artifact (a ``(section, string)`` pair) is **kept** when its exact string is a
  case-sensitive substring of the summary.  Duplicate pairs count once; empty strings are not
  counted.
* A rule is **kept** when it is in the summary verbatim, or when one sentence of the summary
  holds all its key words (below) and, for a prohibition, a negation too: a summary that writes
  "The user said never to force-push to main" keeps "Never force-push to main!".
* **Key words** of a text: its words (letters, digits, ``_``, with ``.`` and ``/`` inside
  them: ``config.yaml`` is one word, ``force-push`` two), lower-cased, without stop words,
  force words (``always``, ``must``, ``make sure``...) and negations, each folded by one light
  suffix (``-ing``, ``-ed``, ``-es``, ``-s``, ``-e``), so "pushed" matches "push".
* A **prohibition** is a rule with ``never``, ``do not``/``don't``, ``must not``/``mustn't``,
  ``should not``, ``may not``, ``cannot``/``can't``, ``not allowed``/``not permitted``, or one
  that starts with ``No``.  Its *acts* are the key words after its first marker, up to the end
  of that sentence (all its key words when that leaves none).
* A **contradiction**: a sentence of the summary holds every act of a prohibition and no
  negation at all.  "Near" is the sentence: the summary is cut at line breaks and at ``.``,
  ``!``, ``?``, ``;`` followed by a space.  Negations in the summary are read broadly (``not``,
  ``no``, ``never``, any ``n't``, ``without``, ``avoid``, ``forbid``, ``refuse``, ``against``,
  ``instead``...), so a summary restating the rule, or saying it kept to it, is never one;
  the price is that a sentence mixing a negation with a real violation goes unreported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

RULES_SECTION = "rules"
"""The section rules are counted under."""

SECTIONS = (
    "files",
    "commands",
    "errors",
    "urls",
    "identifiers",
    "numbers",
    "open",
    "statements",
    RULES_SECTION,
)
"""The sections the ledger names, in the order reports list them (others follow, as given)."""

_WORD = re.compile(r"[\w']+(?:[./][\w']+)*")
_SENTENCE_END = re.compile(r"[.!?;](?:\s+|$)|\n+")
_SUFFIXES = ("ing", "ed", "es", "s", "e")
_APOSTROPHE = "\u2019"  # a typographic apostrophe reads as "'"


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_STOP = _set(
    """a an the and or but if then than so as at by for from in into of off on onto out over
    to up with within via per is are was were be been being am it its this that these those
    there here i me my we our us you your he she they them their his her any all each every
    some such other own same very just also too when while where which who whom what how
    please will would shall can could may might should ought do does did done has have had
    having let lets get gets got"""
)
_FORCE = _set("always must only make sure ensure need needs required require requires ever")
_NEGATIONS = _set(
    """not no never none nothing nobody nowhere neither nor cannot without avoid avoids
    avoided avoiding forbid forbids forbade forbidden prohibit prohibits prohibited refuse
    refused refuses refusing against instead skip skipped declined decline"""
)
_PROHIBITION = re.compile(
    r"\b(?:never|do\s+not|does\s+not|don't|doesn't|must\s+not|mustn't|should\s+not|"
    r"shouldn't|may\s+not|cannot|can\s+not|can't|not\s+allowed|not\s+permitted)\b|"
    r"^\W*(?:\d+[.)]\s*)?no\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class SectionCount:
    """How many of one section's strings a summary kept."""

    section: str
    kept: int
    total: int

    @property
    def missing(self) -> int:
        """The strings the summary left out (the ledger carries them)."""
        return self.total - self.kept


@dataclass(frozen=True, slots=True)
class SummaryCheck:
    """One summary's check (or several merged, :func:`merge_checks`): kept/total per section,
    rules under :data:`RULES_SECTION`, and the prohibitions it may contradict, verbatim.

    Counts only, never the strings themselves: reports, headers and metrics carry it."""

    sections: tuple[SectionCount, ...] = ()
    contradictions: tuple[str, ...] = ()

    @property
    def kept(self) -> int:
        """Strings and rules kept, every section."""
        return sum(s.kept for s in self.sections)

    @property
    def total(self) -> int:
        """Strings and rules checked, every section."""
        return sum(s.total for s in self.sections)

    def section(self, name: str) -> SectionCount | None:
        """One section's count (``None``: the span had nothing of it)."""
        return next((s for s in self.sections if s.section == name), None)

    def figure(self) -> str:
        """``kept/total (section kept/total, ...)``: ``X-Compaction-Summary-Kept`` and the
        command line's report."""
        parts = ", ".join(f"{s.section} {s.kept}/{s.total}" for s in self.sections)
        return f"{self.kept}/{self.total} ({parts})" if parts else "0/0"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the preview's report)."""
        return {
            "kept": self.kept,
            "total": self.total,
            "sections": {s.section: {"kept": s.kept, "total": s.total} for s in self.sections},
            "contradictions": list(self.contradictions),
        }


def check_from_dict(raw: object) -> SummaryCheck | None:
    """The check :meth:`SummaryCheck.to_dict` wrote (a prepared checkpoint's meta carries it to
    the request that forwards its summary); ``None`` for anything else."""
    if not isinstance(raw, dict):
        return None
    sections, contradictions = raw.get("sections"), raw.get("contradictions", [])
    if not isinstance(sections, dict) or not isinstance(contradictions, list):
        return None
    counts = []
    for name, count in sections.items():
        kept = count.get("kept") if isinstance(count, dict) else None
        total = count.get("total") if isinstance(count, dict) else None
        if not (isinstance(kept, int) and isinstance(total, int) and 0 <= kept <= total):
            return None
        counts.append(SectionCount(str(name), kept, total))
    if not all(isinstance(rule, str) for rule in contradictions):
        return None
    return SummaryCheck(tuple(counts), tuple(contradictions))


def check_summary(
    summary: str, strings: Sequence[tuple[str, str]], rules: Sequence[str]
) -> SummaryCheck:
    """Check ``summary`` against the folded span's ``strings`` ((section, exact string) pairs)
    and ``rules`` (verbatim): see the module docstring for what counts as kept and as a
    contradiction."""
    counts: dict[str, list[int]] = {}
    for section, text in dict.fromkeys(strings):
        if not text:
            continue
        count = counts.setdefault(section, [0, 0])
        count[1] += 1
        count[0] += text in summary
    sentences = _sentences(summary)
    contradictions: list[str] = []
    for rule in dict.fromkeys(r for r in rules if r.strip()):
        count = counts.setdefault(RULES_SECTION, [0, 0])
        count[1] += 1
        count[0] += _rule_kept(rule, summary, sentences)
        if _contradicted(rule, sentences):
            contradictions.append(rule)
    return SummaryCheck(_ordered(counts), tuple(contradictions))


def merge_checks(checks: Iterable[SummaryCheck]) -> SummaryCheck:
    """Several summaries' checks as one: counts added per section, contradictions in order
    (each rule once)."""
    counts: dict[str, list[int]] = {}
    contradictions: dict[str, None] = {}
    for check in checks:
        for s in check.sections:
            count = counts.setdefault(s.section, [0, 0])
            count[0] += s.kept
            count[1] += s.total
        contradictions.update(dict.fromkeys(check.contradictions))
    return SummaryCheck(_ordered(counts), tuple(contradictions))


def key_words(text: str) -> frozenset[str]:
    """The folded key words of ``text`` (module docstring)."""
    return frozenset(
        _fold(w) for w in _words(text) if w not in _STOP and w not in _FORCE and not _negation(w)
    )


def _ordered(counts: dict[str, list[int]]) -> tuple[SectionCount, ...]:
    known = [s for s in SECTIONS if s in counts]
    others = [s for s in counts if s not in SECTIONS]
    return tuple(SectionCount(s, *counts[s]) for s in (*known, *others))


@dataclass(frozen=True, slots=True)
class _Sentence:
    words: frozenset[str]
    negated: bool


def _sentences(summary: str) -> list[_Sentence]:
    out = []
    for part in _SENTENCE_END.split(summary):
        raw = _words(part)
        if raw:
            out.append(_Sentence(key_words(part), any(_negation(w) for w in raw)))
    return out


def _rule_kept(rule: str, summary: str, sentences: Sequence[_Sentence]) -> bool:
    if rule in summary:
        return True
    words = key_words(rule)
    if not words:
        return False
    prohibition = _PROHIBITION.search(rule.replace(_APOSTROPHE, "'")) is not None
    return any(words <= s.words and (s.negated or not prohibition) for s in sentences)


def _contradicted(rule: str, sentences: Sequence[_Sentence]) -> bool:
    acts = _acts(rule)
    return bool(acts) and any(acts <= s.words and not s.negated for s in sentences)


def _acts(rule: str) -> frozenset[str]:
    """The key words a prohibition forbids (empty: ``rule`` is not one)."""
    rule = rule.replace(_APOSTROPHE, "'")
    marker = _PROHIBITION.search(rule)
    if marker is None:
        return frozenset()
    rest = _SENTENCE_END.split(rule[marker.end() :], maxsplit=1)[0]
    return key_words(rest) or key_words(rule)


def _words(text: str) -> list[str]:
    return [w.lower().strip("'") for w in _WORD.findall(text.replace(_APOSTROPHE, "'"))]


def _negation(word: str) -> bool:
    return word in _NEGATIONS or word.endswith("n't")


def _fold(word: str) -> str:
    """One light suffix off (``pushed``, ``pushes``, ``pushing`` -> ``push``; ``modified`` ->
    ``modify``; ``committing`` -> ``commit``); never ``-s`` after ``s`` (``pass``), never below
    two letters."""
    if word.endswith(("ies", "ied")) and len(word) > 4:
        return word[:-3] + "y"
    for suffix in _SUFFIXES:
        if not word.endswith(suffix) or len(word) - len(suffix) < 2:
            continue
        if suffix == "s" and word.endswith("ss"):
            continue
        stem = word[: -len(suffix)]
        if suffix in ("ing", "ed") and len(stem) > 2 and stem[-1] == stem[-2] not in "lsz":
            stem = stem[:-1]  # a doubled consonant: ``stopped`` -> ``stop``
        return stem
    return word
