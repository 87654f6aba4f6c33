"""One recall call answered (compaction_proxy/engine/_recall_desk.py), over a real SQLite file."""

from __future__ import annotations

import socket
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction_proxy.checkpoints import (
    Archive,
    RedisStore,
    SqliteStore,
    StoreBreaker,
    archive_namespace,
)
from compaction_proxy.compaction.archive import Archived, RecallIds
from compaction_proxy.compaction.settings import RecallSettings
from compaction_proxy.compaction.tokens import CharacterEstimatorTokenizer
from compaction_proxy.engine import RecallDesk
from compaction_proxy.engine._recall_desk import UNAVAILABLE
from compaction_proxy.wire.recall import RecallCall

IDS = RecallIds(b"test-archive-namespace-key")
original_id = IDS.original
span_id = IDS.span
COUNT = CharacterEstimatorTokenizer().count_text
SETTINGS = RecallSettings(enabled=True, max_tokens=400)
NS = archive_namespace("Bearer sk-test", None)


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def ask(**arguments: Any) -> RecallCall:
    return RecallCall("call_1", orjson.dumps(arguments).decode())


@pytest.fixture
async def archive(tmp_path: Path) -> AsyncIterator[Archive]:
    store = SqliteStore(tmp_path / "data" / "checkpoints.db")
    yield Archive(store, SETTINGS)
    await store.close()


@pytest.fixture
def desk(archive: Archive) -> RecallDesk:
    return RecallDesk(archive, SETTINGS, COUNT)


async def keep(
    archive: Archive, *messages: dict[str, Any], span_text: str | None = None
) -> list[str]:
    """Archives ``messages`` (and a span over them); their ids, the span's last."""
    originals = {original_id(m): m for m in messages}
    ids = tuple(originals)
    spans = {span_id(ids, span_text): ids} if span_text is not None else {}
    assert await archive.keep(NS, Archived(originals, spans, (*ids, *spans))) is None
    return [*ids, *spans]


# ------------------------------------------------------------------ ids


async def test_an_allowed_id_is_answered_with_its_original(
    archive: Archive, desk: RecallDesk
) -> None:
    (rid,) = await keep(archive, result("c1", "FACT-TEAL: the port is 8443"))
    recalled = await desk.answer(NS, frozenset({rid}), ask(ids=[rid]), names={"c1": "read_config"})
    assert not recalled.answer.is_error
    assert recalled.answer.call_id == "call_1"
    assert recalled.answer.text == (
        f"[recall id {rid}: tool, tool read_config]\nFACT-TEAL: the port is 8443"
    )
    assert recalled.ids == 1 and recalled.shown == (rid,)
    assert recalled.tokens == COUNT(recalled.answer.text)
    assert not recalled.unavailable


async def test_an_id_the_conversation_may_not_recall_reads_as_unknown(
    archive: Archive, desk: RecallDesk
) -> None:
    """Archived, in this tenant's archive, but another conversation's: no content leaks, and
    the answer is the one for an id never archived."""
    (theirs,) = await keep(archive, result("c1", "FACT-OTHER-CONVERSATION"))
    (ours,) = await keep(archive, result("c2", "ours"))
    recalled = await desk.answer(NS, frozenset({ours}), ask(ids=[theirs, "rzzzzzzzzzzz"]))
    assert "FACT-OTHER-CONVERSATION" not in recalled.answer.text
    assert recalled.answer.text.splitlines() == [
        f"no archived content for id {theirs}",
        "",
        "no archived content for id rzzzzzzzzzzz",
    ]
    assert recalled.ids == 0


async def test_a_span_expands_to_its_members_and_a_member_is_allowed_by_its_own_id(
    archive: Archive, desk: RecallDesk
) -> None:
    first, second = result("c1", "step one: FACT-AMBER"), result("c2", "step two")
    *members, span = await keep(archive, first, second, span_text="summary")
    allowed = frozenset({span})
    whole = await desk.answer(NS, allowed, ask(ids=[span]))
    lines = whole.answer.text.split("\n\n")
    assert lines[0] == f"[recall id {span}: 2 archived messages]"
    assert lines[1].startswith(f"[recall id {members[0]}: tool]") and "FACT-AMBER" in lines[1]
    assert lines[2].startswith(f"[recall id {members[1]}: tool]")
    assert whole.ids == 2
    one = await desk.answer(NS, allowed, ask(ids=[members[1]]))
    assert one.answer.text == f"[recall id {members[1]}: tool]\nstep two"


async def test_nested_spans_are_expanded_and_shown_once(archive: Archive, desk: RecallDesk) -> None:
    old = result("c1", "the oldest FACT-PLUM")
    (old_id, inner) = await keep(archive, old, span_text="first summary")
    new = result("c2", "newer")
    new_id = original_id(new)
    outer_members = (inner, new_id)
    outer = span_id(outer_members, "second summary")
    run = Archived({new_id: new}, {outer: outer_members}, (*outer_members, outer))
    assert await archive.keep(NS, run) is None
    recalled = await desk.answer(NS, frozenset({outer}), ask(ids=[outer, old_id]))
    assert recalled.shown == (old_id, new_id)  # old_id asked for again: not repeated
    assert recalled.answer.text.count("FACT-PLUM") == 1


async def test_a_span_whose_members_expired(archive: Archive, desk: RecallDesk) -> None:
    members = ("rabcdefghijk",)
    span = span_id(members, "gone")
    assert await archive.keep(NS, Archived({}, {span: members}, (span,))) is None
    recalled = await desk.answer(NS, frozenset({span}), ask(ids=[span]))
    assert recalled.answer.text == f"no archived content left for id {span}"


async def test_an_expired_original_is_answered_as_gone(
    archive: Archive, desk: RecallDesk, tmp_path: Path
) -> None:
    """recall.ttl over: the row is past its expiry (aged in the file, no waiting), and the
    answer is the one for an id never archived; a query no longer finds it either."""
    (rid,) = await keep(archive, result("c1", "FACT-EXPIRING"))
    allowed = frozenset({rid})
    assert "FACT-EXPIRING" in (await desk.answer(NS, allowed, ask(ids=[rid]))).answer.text
    with sqlite3.connect(tmp_path / "data" / "checkpoints.db") as conn:
        conn.execute(
            "UPDATE checkpoints SET expires_at = expires_at - ? WHERE namespace = ?",
            (SETTINGS.ttl_seconds + 1, NS),
        )
    conn.close()
    gone = await desk.answer(NS, allowed, ask(ids=[rid]))
    assert gone.answer.text == f"no archived content for id {rid}" and gone.ids == 0
    searched = await desk.answer(NS, allowed, ask(query="fact-expiring"))
    assert "FACT-EXPIRING" not in searched.answer.text


# ------------------------------------------------------------------ query


async def test_a_query_searches_only_what_the_conversation_may_recall(
    archive: Archive, desk: RecallDesk
) -> None:
    ours = await keep(
        archive,
        result("c1", "deploy log: rollout of build 77 finished"),
        result("c2", "the staging database password is FACT-CORAL"),
        result("c3", "unrelated output"),
    )
    (foreign,) = await keep(archive, result("c9", "the staging database password is FACT-LEAK"))
    recalled = await desk.answer(NS, frozenset(ours), ask(query="staging database password"))
    assert "FACT-CORAL" in recalled.answer.text
    assert "FACT-LEAK" not in recalled.answer.text
    assert recalled.shown[0] == ours[1]
    assert foreign not in recalled.shown
    none = await desk.answer(NS, frozenset(ours), ask(query="kubernetes"))
    assert none.answer.text == "no archived content matches the query 'kubernetes'"
    assert not none.answer.is_error and none.ids == 0


async def test_a_query_reaches_into_allowed_spans(archive: Archive, desk: RecallDesk) -> None:
    *_, span = await keep(archive, result("c1", "FACT-JADE lives here"), span_text="s")
    recalled = await desk.answer(NS, frozenset({span}), ask(query="fact-jade"))
    assert "FACT-JADE" in recalled.answer.text


async def test_ids_and_query_together_do_not_repeat(archive: Archive, desk: RecallDesk) -> None:
    ids = await keep(archive, result("c1", "alpha FACT"), result("c2", "beta FACT"))
    recalled = await desk.answer(NS, frozenset(ids), ask(ids=[ids[0]], query="fact"))
    assert recalled.shown == (ids[0], ids[1])


# ------------------------------------------------------------------ pages


async def test_a_long_original_is_paged(archive: Archive, desk: RecallDesk) -> None:
    log_lines = [f"{i:04d} INFO request handled in {i % 97} ms" for i in range(400)]
    (rid,) = await keep(archive, result("c1", "\n".join(log_lines)))
    allowed = frozenset({rid})
    first = await desk.answer(NS, allowed, ask(ids=[rid]))
    assert first.tokens <= SETTINGS.max_tokens
    footer = first.answer.text.rsplit("\n\n", 1)[1]
    assert footer.startswith("(page 1 of ") and footer.endswith("again with page=2)")
    pages = int(footer.split(" of ")[1].split(":")[0])
    seen: list[str] = []
    for number in range(1, pages + 1):
        answer = await desk.answer(NS, allowed, ask(ids=[rid], page=number))
        assert not answer.answer.is_error
        seen.extend(answer.answer.text.rsplit("\n\n", 1)[0].splitlines())
    assert seen == [f"[recall id {rid}: tool]", *log_lines]
    past = await desk.answer(NS, allowed, ask(ids=[rid], page=pages + 1))
    assert past.answer.is_error
    assert f"page {pages + 1} is past the last page ({pages})" in past.answer.text
    # The loop's own limit (a quarter of a small window) wins over the setting.
    small = await desk.answer(NS, allowed, ask(ids=[rid]), 150)
    assert small.tokens <= 150


# ------------------------------------------------------------------ malformed calls


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("{not json", "not valid JSON"),
        ('["rabcdefghijk"]', "must be a JSON object"),
        ('{"ids": [1, 2]}', "ids must be an array of recall id strings"),
        ('{"ids": {"a": 1}}', "ids must be an array"),
        ('{"query": 7}', "query must be a string"),
        ('{"ids": ["rabcdefghijk"], "page": 0}', "page must be an integer"),
        ('{"ids": ["rabcdefghijk"], "page": "2"}', "page must be an integer"),
        ('{"ids": ["rabcdefghijk"], "page": true}', "page must be an integer"),
        ("{}", "give ids"),
        ('{"query": "   "}', "give ids"),
        ("", "give ids"),
        (orjson.dumps({"ids": [f"r{i:011d}" for i in range(60)]}).decode(), "at most 50 ids"),
    ],
)
async def test_a_malformed_call_gets_an_error_answer(
    desk: RecallDesk, arguments: str, says: str
) -> None:
    recalled = await desk.answer(NS, frozenset(), RecallCall("call_x", arguments))
    assert recalled.answer.is_error
    assert recalled.answer.call_id == "call_x"
    assert says in recalled.answer.text
    assert recalled.answer.text.startswith("compaction_recall: ")
    assert not recalled.unavailable


async def test_one_id_as_a_string_is_taken(archive: Archive, desk: RecallDesk) -> None:
    (rid,) = await keep(archive, result("c1", "x"))
    recalled = await desk.answer(NS, frozenset({rid}), RecallCall("c", f'{{"ids": "{rid}"}}'))
    assert recalled.shown == (rid,)


async def test_a_long_unknown_id_is_not_echoed_whole(desk: RecallDesk) -> None:
    recalled = await desk.answer(NS, frozenset(), ask(ids=["x" * 10_000]))
    assert len(recalled.answer.text) < 100


# ------------------------------------------------------------------ the store down


@pytest.fixture
def dead_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["ids", "query"])
async def test_a_store_that_is_down_answers_not_available(dead_port: int, kind: str) -> None:
    inner = RedisStore(
        f"redis://127.0.0.1:{dead_port}/0", socket_timeout=0.5, connect_timeout=0.5, op_timeout=1
    )
    store = StoreBreaker(inner)
    desk = RecallDesk(Archive(store, SETTINGS), SETTINGS, COUNT)
    call = ask(ids=["rabcdefghijk"]) if kind == "ids" else ask(query="anything")
    for _ in range(2):  # the failing call, then the store marked down (refused at once)
        recalled = await desk.answer(NS, frozenset({"rabcdefghijk"}), call)
        assert recalled.answer.is_error and recalled.unavailable
        assert recalled.answer.text == UNAVAILABLE
        assert recalled.ids == 0
    assert not store.readiness().reads.up
    await store.close()


# ------------------------------------------------------------------ before the keyed ids


async def test_what_an_older_version_archived_reads_as_never_archived(
    archive: Archive, desk: RecallDesk
) -> None:
    """Rows archived before issue 29 (one namespace per key and tenant, ids an unkeyed digest)
    stay in the store until their TTL, and a checkpoint made then still names their ids in its
    index. Read now, they are no end user's: "no archived content", for the user whose
    conversation it was as for any other."""
    import base64
    import hashlib

    from compaction_proxy.compaction.canonical import canonical_bytes, digest

    old = result("c1", "SECRET-ALICE-0 archived by the older version")
    raw = hashlib.blake2b(canonical_bytes(old), digest_size=8, person=b"cp-recall").digest()
    old_id = "r" + base64.b32encode(raw).decode().lower()[:11]
    hashed = digest(b"sk-test").hex()
    old_namespace = digest("\x1f".join(["archive1", hashed, ""]).encode()).hex()
    assert await archive.keep(old_namespace, Archived({old_id: old})) is None
    for user in ("alice", "bob", None):
        namespace = archive_namespace("Bearer sk-test", None, {"user": user})
        recalled = await desk.answer(namespace, frozenset({old_id}), ask(ids=[old_id]))
        assert recalled.answer.text == f"no archived content for id {old_id}"
        assert recalled.ids == 0
