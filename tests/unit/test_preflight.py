"""Start-up checks beyond the schema (compaction_proxy/config/preflight.py), and the CLI
overrides' validation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compaction_proxy.checkpoints import make_backend
from compaction_proxy.cli import main
from compaction_proxy.config import ConfigError, Settings, load_settings, override_server, preflight

WriteConfig = Callable[[str], Path]
KEYED = {"name": "openai", "base_url": "https://api.openai.com/v1", "api_key": "sk-up-SECRET"}


def settings(**sections: Any) -> Settings:
    sections.setdefault("upstreams", [KEYED])
    return Settings(**sections)


# --- encodings -------------------------------------------------------------------------------


def test_a_misspelt_encoding_is_refused_naming_the_known_ones() -> None:
    found = preflight.problems(settings(models={"gpt-4o": {"encoding": "o200k_bsae"}}))
    assert len(found) == 1
    message = found[0]
    assert message.startswith("models.gpt-4o.encoding: unknown encoding 'o200k_bsae'")
    assert "did you mean 'o200k_base'?" in message
    for known in ("o200k_base", "cl100k_base", "p50k_base", "r50k_base"):
        assert known in message


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        ({"compaction": {"tokenizer": {"default_encoding": "cl100k"}}}, "compaction.tokenizer"),
        (
            {"models": {"m*": {"compaction": {"tokenizer": {"default_encoding": "nope"}}}}},
            "models.m*.compaction.tokenizer.default_encoding",
        ),
    ],
    ids=["default-encoding", "per-model-block"],
)
def test_every_place_an_encoding_is_named_is_checked(sections: dict[str, Any], path: str) -> None:
    found = preflight.problems(settings(**sections))
    assert [line for line in found if line.startswith(path)], found


def test_the_builtin_encodings_pass() -> None:
    models = {name: {"encoding": name} for name in ("o200k_base", "cl100k_base", "p50k_base")}
    assert preflight.problems(settings(models=models)) == []


def test_an_encodings_dir_file_makes_its_name_known(tmp_path: Path) -> None:
    (tmp_path / "house_base.tiktoken").write_bytes(b"")
    config = {
        "models": {"m": {"encoding": "house_base"}},
        "compaction": {"tokenizer": {"encodings_dir": str(tmp_path)}},
    }
    assert preflight.problems(settings(**config)) == []
    assert "house_base" in preflight.known_encodings(str(tmp_path))
    assert "house_base" not in preflight.known_encodings(None)


def test_a_missing_encodings_dir_is_refused(tmp_path: Path) -> None:
    found = preflight.problems(
        settings(compaction={"tokenizer": {"encodings_dir": str(tmp_path / "absent")}})
    )
    assert found and found[0].startswith("compaction.tokenizer.encodings_dir:")


# --- stores and workers ----------------------------------------------------------------------


def test_memory_store_with_several_workers_is_refused() -> None:
    found = preflight.problems(settings(server={"workers": 2}, store={"backend": "memory"}))
    assert len(found) == 1
    assert found[0].startswith("store.backend: memory")
    assert "server.workers: 2" in found[0] and "sqlite" in found[0]


@pytest.mark.parametrize(
    ("workers", "store"),
    [
        (1, {"backend": "memory"}),
        (4, {"backend": "sqlite"}),
        (4, {"backend": "redis", "url": "redis://r:6379/0"}),
    ],
)
def test_shared_stores_and_single_workers_pass(workers: int, store: dict[str, Any]) -> None:
    assert preflight.problems(settings(server={"workers": workers}, store=store)) == []


def test_redis_without_url_is_refused_before_start() -> None:
    found = preflight.problems(settings(store={"backend": "redis"}))
    assert found == [
        "store.url: required when store.backend is redis (e.g. redis://127.0.0.1:6379/0)"
    ]


def test_a_url_that_is_no_redis_url_is_refused_as_the_store_would_without_repeating_it() -> None:
    """Preflight and the store factory give the one answer, and neither quotes the URL (it may
    carry a password)."""
    store = {"backend": "redis", "url": "http://user:SECRET@r:6379/0"}
    found = preflight.problems(settings(store=store))
    assert found == [
        "store.url: not a valid Redis URL (expected redis://[user:password@]host:port/db)"
    ]
    with pytest.raises(ConfigError) as refused:
        make_backend(settings(store=store).store)
    assert str(refused.value) == found[0]
    assert "SECRET" not in str(refused.value)


# --- inbound keys and upstream credentials ---------------------------------------------------


def test_inbound_keys_with_a_keyless_upstream_are_refused() -> None:
    bare = {"name": "local", "base_url": "http://127.0.0.1:9/v1", "models": ["llama*"]}
    found = preflight.problems(settings(server={"api_keys": ["pk-1"]}, upstreams=[KEYED, bare]))
    assert len(found) == 1
    assert found[0].startswith("upstreams.1.api_key: required while server.api_keys is set")
    assert "'local'" in found[0] and "keyless: true" in found[0]


def test_keyless_true_allows_an_upstream_without_key_behind_inbound_keys() -> None:
    local = {"name": "local", "base_url": "http://127.0.0.1:9/v1", "keyless": True}
    assert preflight.problems(settings(server={"api_keys": ["pk-1"]}, upstreams=[local])) == []


def test_without_inbound_keys_an_upstream_needs_no_key() -> None:
    bare = {"name": "openai", "base_url": "https://api.openai.com/v1"}
    assert preflight.problems(settings(upstreams=[bare])) == []


def test_keyless_and_api_key_together_are_refused(write_config: WriteConfig) -> None:
    path = write_config(
        "upstreams: [{name: a, base_url: 'http://x/v1', api_key: sk-SECRET, keyless: true}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "upstreams.0: set api_key or keyless: true, not both" in str(info.value)
    assert "sk-SECRET" not in str(info.value)


# --- all at once, through the command line ---------------------------------------------------


def test_check_config_lists_every_problem_and_exits_2(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        "server: {api_keys: [pk-SECRET], workers: 3}\n"
        "store: {backend: memory}\n"
        "upstreams: [{name: openai, base_url: 'https://api.openai.com/v1'}]\n"
        "models: {gpt-4o: {encoding: o200k_bsae}}\n"
    )
    assert main(["check-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"compaction-proxy: invalid configuration ({path}):")
    for key in ("models.gpt-4o.encoding", "store.backend", "upstreams.0.api_key"):
        assert f"\n  {key}: " in err
    assert "SECRET" not in err


def test_override_server_validates_like_the_file() -> None:
    base = settings()
    assert override_server(base, {"port": 9001}, {"port": "--port"}).server.port == 9001
    assert override_server(base, {}, {}) is base
    with pytest.raises(ConfigError) as info:
        override_server(base, {"port": 99999, "workers": 0}, {"port": "--port"})
    message = str(info.value)
    assert message.startswith("invalid command line:")
    assert "--port: Input should be less than or equal to 65535 (got 99999)" in message
    assert "server.workers: Input should be greater than or equal to 1 (got 0)" in message
