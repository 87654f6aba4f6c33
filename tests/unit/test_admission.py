"""Who may make the proxy spend an operator key (compaction_proxy/http/_admission.py, auth.py's side
routes), without a server."""

from __future__ import annotations

import pytest

from compaction_proxy.config import ConfigError, Settings, preflight
from compaction_proxy.http import Access, KnownCallers, Presented, side_access


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_accepted_key_is_known_until_its_deadline_and_renewed_by_each_acceptance() -> None:
    clock = Clock()
    known = KnownCallers(ttl_seconds=60, clock=clock)
    assert not known.known("Bearer sk-a")
    known.accepted("Bearer sk-a")
    clock.now += 59
    assert known.known("Bearer sk-a") and not known.known("Bearer sk-b")
    known.accepted("Bearer sk-a")  # renewed
    clock.now += 59
    assert known.known("Bearer sk-a")
    clock.now += 2
    assert not known.known("Bearer sk-a")
    assert len(known) == 0  # an expired entry is dropped when met


def test_no_key_is_never_known_and_never_stored() -> None:
    known = KnownCallers()
    known.accepted(None)
    known.accepted("")
    assert len(known) == 0 and not known.known(None) and not known.known("")


def test_the_table_is_bounded_least_recent_first_and_holds_no_key() -> None:
    known = KnownCallers(max_entries=3)
    for name in ("a", "b", "c"):
        known.accepted(f"Bearer sk-{name}")
    known.accepted("Bearer sk-a")  # a is now the most recent
    known.accepted("Bearer sk-d")
    assert len(known) == 3
    assert not known.known("Bearer sk-b")
    assert all(known.known(f"Bearer sk-{name}") for name in ("a", "c", "d"))
    stored = b"".join(known._expires)
    assert b"sk-" not in stored and all(len(key) == 16 for key in known._expires)
    # Another process (another secret) hashes the same key differently.
    other = KnownCallers()
    other.accepted("Bearer sk-a")
    assert set(other._expires).isdisjoint(known._expires)


API = [b"pk-api"]
SCRAPE = [b"mk-scrape"]


@pytest.mark.parametrize(
    ("path", "presented", "api", "metrics", "access"),
    [
        ("/metrics", b"", [], [], Access.FULL),  # no keys: everything as before
        ("/nope", b"", [], [], Access.FULL),
        ("/metrics", b"", API, [], Access.DENIED),
        ("/metrics", b"pk-api", API, SCRAPE, Access.FULL),
        ("/metrics", b"mk-scrape", API, SCRAPE, Access.FULL),
        ("/metrics", b"mk-scrape", [], SCRAPE, Access.FULL),
        ("/metrics", b"", [], SCRAPE, Access.DENIED),
        ("/dashboard/data", b"mk-scrape", API, SCRAPE, Access.DENIED),
        ("/dashboard/data", b"pk-api", API, SCRAPE, Access.FULL),
        ("/dashboard/data", b"", [], SCRAPE, Access.FULL),  # the dashboard follows api_keys
        ("/nope", b"", API, [], Access.DENIED),
        ("/healthz", b"", API, [], Access.STATUS_ONLY),
        ("/readyz", b"wrong", API, SCRAPE, Access.STATUS_ONLY),
        ("/readyz", b"mk-scrape", API, SCRAPE, Access.FULL),
        ("/readyz", b"", [], SCRAPE, Access.STATUS_ONLY),
    ],
)
def test_side_access(
    path: str, presented: bytes, api: list[bytes], metrics: list[bytes], access: Access
) -> None:
    keys = [Presented(presented, presented)] if presented else []
    assert side_access(path, keys, api, metrics) is access


KEYED = {"name": "openai", "base_url": "https://api.openai.com/v1", "api_key": "sk-op-SECRET"}
PLAIN = {"name": "local", "base_url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(
    ("sections", "refused"),
    [
        ({"upstreams": [KEYED]}, ["upstreams.0.api_key"]),
        ({"upstreams": [PLAIN, {**KEYED, "models": ["gpt-*"]}]}, ["upstreams.1.api_key"]),
        ({"upstreams": [{**KEYED, "models": []}, PLAIN]}, ["upstreams.0.api_key"]),  # the default
        ({"upstreams": [PLAIN, {**KEYED, "models": []}]}, []),  # only the summarizer reaches it
        ({"upstreams": [KEYED], "server": {"api_keys": ["pk-1"]}}, []),
        ({"upstreams": [KEYED], "server": {"allow_anonymous_spend": True}}, []),
        ({"upstreams": [PLAIN]}, []),
    ],
    ids=["keyed", "keyed-routed", "keyed-first", "summarizer-only", "api-keys", "opt-in", "plain"],
)
def test_serving_problems_name_each_key_anonymous_callers_could_spend(
    sections: dict[str, object], refused: list[str]
) -> None:
    found = preflight.serving_problems(Settings(**sections))  # type: ignore[arg-type]
    assert [line.split(":", 1)[0] for line in found] == refused
    for line in found:
        assert "server.api_keys" in line and "server.allow_anonymous_spend: true" in line
        assert "sk-op-SECRET" not in line


def test_the_compact_command_is_not_refused_for_it() -> None:
    settings = Settings(upstreams=[KEYED])  # type: ignore[list-item]
    assert preflight.problems(settings) == []
    preflight.check(settings, source="x")  # compact's check: no serving problems
    with pytest.raises(ConfigError, match="anonymous callers could spend"):
        preflight.check(settings, source="x", serving=True)
