"""Configuration: interpolation, environment overrides, validation messages, masking."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compaction_proxy.compaction import FactsOverride
from compaction_proxy.config import (
    CONFIG_ENV_VAR,
    ConfigError,
    Settings,
    effective_config,
    interpolate,
    load_settings,
    parse_duration,
    read_config_file,
)

WriteConfig = Callable[[str], Path]

MINIMAL_UPSTREAM = "upstreams: [{name: up, base_url: 'http://upstream.test/v1'}]\n"


def load_error(write_config: WriteConfig, text: str, **environ: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(write_config(text), environ=environ)
    return str(info.value)


# --- interpolation --------------------------------------------------------------------------


class TestInterpolate:
    def test_plain_variable(self) -> None:
        assert interpolate("key=${A}", {"A": "x1"}) == "key=x1"

    def test_several_variables_in_one_value(self) -> None:
        assert interpolate("${A}-${B}", {"A": "1", "B": "2"}) == "1-2"

    def test_default_used_when_unset(self) -> None:
        assert interpolate("${A:-fallback}", {}) == "fallback"

    def test_default_used_when_empty(self) -> None:
        assert interpolate("${A:-fallback}", {"A": ""}) == "fallback"

    def test_set_value_beats_default(self) -> None:
        assert interpolate("${A:-fallback}", {"A": "real"}) == "real"

    def test_empty_default(self) -> None:
        assert interpolate("${A:-}", {}) == ""

    def test_empty_variable_without_default_is_allowed(self) -> None:
        # Set-but-empty is a deliberate choice by the operator, not a missing variable.
        assert interpolate("[${A}]", {"A": ""}) == "[]"

    def test_missing_variable_names_it(self) -> None:
        with pytest.raises(ConfigError) as info:
            interpolate("${MISSING_ONE} ${OK} ${MISSING_TWO}", {"OK": "1"})
        message = str(info.value)
        assert "MISSING_ONE" in message
        assert "MISSING_TWO" in message
        assert "OK" not in message.replace("MISSING", "")

    def test_default_may_contain_colons_and_slashes(self) -> None:
        assert interpolate("${URL:-http://h:1/v1}", {}) == "http://h:1/v1"

    def test_text_without_placeholders_untouched(self) -> None:
        assert interpolate("$HOME and $ {A} and ${1BAD}", {}) == "$HOME and $ {A} and ${1BAD}"

    def test_uses_os_environ_by_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CP_TEST_VAR", "from-os")
        assert interpolate("${CP_TEST_VAR}") == "from-os"

    @given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=50))
    def test_text_without_dollar_is_identity(self, text: str) -> None:
        assert interpolate(text, {}) == text


class TestInterpolationInFile:
    def test_values_are_interpolated(self, write_config: WriteConfig) -> None:
        path = write_config("server: {host: '${HOST}', port: '${PORT:-9100}'}\n" + MINIMAL_UPSTREAM)
        settings = load_settings(path, environ={"HOST": "0.0.0.0"})
        assert settings.server.host == "0.0.0.0"
        assert settings.server.port == 9100

    def test_nested_lists_are_interpolated(self, write_config: WriteConfig) -> None:
        path = write_config(
            "upstreams:\n  - name: up\n    base_url: ${BASE}\n    models: ['${FAMILY}-*', 'o1']\n"
        )
        settings = load_settings(path, environ={"BASE": "http://b.test/v1", "FAMILY": "gpt"})
        assert settings.upstreams[0].url == "http://b.test/v1"
        assert settings.upstreams[0].models == ["gpt-*", "o1"]

    def test_value_with_yaml_syntax_does_not_break_structure(
        self, write_config: WriteConfig
    ) -> None:
        # A value that would be YAML structure if substituted into the raw text.
        tricky = "a: b\n# not a comment\n- [x"
        path = write_config("server: {host: '${TRICKY}'}\n" + MINIMAL_UPSTREAM)
        settings = load_settings(path, environ={"TRICKY": tricky})
        assert settings.server.host == tricky

    def test_keys_are_not_interpolated(self, write_config: WriteConfig) -> None:
        path = write_config("models:\n  '${NAME}': {context_window: 1000}\n" + MINIMAL_UPSTREAM)
        settings = load_settings(path, environ={"NAME": "gpt-x"})
        assert list(settings.models) == ["${NAME}"]

    def test_non_string_scalars_kept(self, write_config: WriteConfig) -> None:
        path = write_config("server: {port: 8123}\n" + MINIMAL_UPSTREAM)
        assert read_config_file(path, {})["server"]["port"] == 8123

    def test_missing_variable_in_file_is_config_error(self, write_config: WriteConfig) -> None:
        message = load_error(
            write_config,
            "upstreams: [{name: up, base_url: 'http://u.test', api_key: '${UP_KEY}'}]\n",
        )
        assert "UP_KEY" in message
        assert "not set" in message

    def test_empty_key_variable_with_default_means_passthrough(
        self, write_config: WriteConfig
    ) -> None:
        path = write_config(
            "upstreams: [{name: up, base_url: 'http://u.test', api_key: '${K:-}'}]\n"
        )
        assert load_settings(path, environ={"K": ""}).upstreams[0].api_key is None
        assert load_settings(path, environ={}).upstreams[0].api_key is None
        key = load_settings(path, environ={"K": "sk-1"}).upstreams[0].api_key
        assert key is not None
        assert key.get_secret_value() == "sk-1"


# --- environment overrides -----------------------------------------------------------------


class TestEnvOverrides:
    def test_env_beats_file(
        self, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = write_config("server: {port: 8000, host: 10.0.0.1}\n" + MINIMAL_UPSTREAM)
        monkeypatch.setenv("COMPACTION_PROXY_SERVER__PORT", "9000")
        settings = load_settings(path)
        assert settings.server.port == 9000
        # Sibling keys from the file survive the nested override.
        assert settings.server.host == "10.0.0.1"

    def test_nested_two_levels(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("COMPACTION_PROXY_STORE__BACKEND", "memory")
        monkeypatch.setenv("COMPACTION_PROXY_DASHBOARD__SHOW_CONTENT", "true")
        settings = load_settings(environ={})
        assert settings.store.backend == "memory"
        assert settings.dashboard.show_content is True

    def test_top_level_scalar(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("COMPACTION_PROXY_DEFAULT_CONTEXT_WINDOW", "32000")
        assert load_settings(environ={}).default_context_window == 32000

    def test_upstreams_as_json(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(
            "COMPACTION_PROXY_UPSTREAMS",
            '[{"name": "env", "base_url": "http://env.test/v1", "models": ["x-*"]}]',
        )
        settings = load_settings(environ={})
        assert [u.name for u in settings.upstreams] == ["env"]

    def test_bad_env_value_is_config_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("COMPACTION_PROXY_SERVER__PORT", "99999")
        with pytest.raises(ConfigError) as info:
            load_settings(environ={})
        assert "server.port" in str(info.value)

    def test_config_path_from_env(
        self, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = write_config("server: {port: 8444}\n" + MINIMAL_UPSTREAM)
        settings = load_settings(environ={CONFIG_ENV_VAR: str(path)})
        assert settings.server.port == 8444

    def test_explicit_path_beats_env_path(self, write_config: WriteConfig) -> None:
        chosen = write_config("server: {port: 8001}\n" + MINIMAL_UPSTREAM)
        other = write_config("server: {port: 8002}\n" + MINIMAL_UPSTREAM)
        settings = load_settings(chosen, environ={CONFIG_ENV_VAR: str(other)})
        assert settings.server.port == 8001


# --- defaults --------------------------------------------------------------------------------


class TestDefaults:
    def test_no_file_gives_openai_upstream(self) -> None:
        settings = load_settings(environ={})
        assert len(settings.upstreams) == 1
        upstream = settings.upstreams[0]
        assert upstream.name == "openai"
        assert upstream.url == "https://api.openai.com/v1"
        assert upstream.models == ["*"]
        assert upstream.api_key is None
        assert settings.server.port == 8080
        assert settings.server.host == "127.0.0.1"
        assert settings.server.max_body_bytes == 32 * 1024 * 1024
        assert settings.server.api_keys == []
        assert settings.store.ttl_seconds == 7 * 86400

    def test_default_upstream_ignores_an_openai_key_in_the_environment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Nobody spends the operator's key unasked: the embedded defaults used to take the proxy's
        OPENAI_API_KEY as the upstream's key, so anyone who could reach the proxy spent it (and
        `serve` now refuses an operator key without server.api_keys). Each client's own key
        passes through; a config file sets an operator key on purpose."""
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
        assert load_settings(environ={}).upstreams[0].api_key is None

    def test_empty_file_is_defaults(self, write_config: WriteConfig) -> None:
        settings = load_settings(write_config(""), environ={})
        assert settings.upstreams[0].name == "openai"

    @pytest.mark.parametrize("value", ["", "   ", None])
    def test_empty_api_key_is_none(self, write_config: WriteConfig, value: str | None) -> None:
        shown = "null" if value is None else f"'{value}'"
        path = write_config(
            f"upstreams: [{{name: up, base_url: 'http://u.test', api_key: {shown}}}]\n"
        )
        assert load_settings(path, environ={}).upstreams[0].api_key is None

    def test_url_strips_trailing_slash(self, write_config: WriteConfig) -> None:
        path = write_config("upstreams: [{name: up, base_url: 'http://u.test/v1/'}]\n")
        assert load_settings(path, environ={}).upstreams[0].url == "http://u.test/v1"


# --- validation errors -----------------------------------------------------------------------


class TestValidationErrors:
    def test_unknown_top_level_key(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "sevrer: {port: 1}\n")
        assert "sevrer: unknown key" in message
        for allowed in ("server", "upstreams", "store", "summarization", "compaction"):
            assert allowed in message

    def test_unknown_nested_key_names_path_and_allowed(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "server: {prot: 1}\n")
        assert "server.prot: unknown key" in message
        allowed_line = next(line for line in message.splitlines() if "server.prot" in line)
        for allowed in ("host", "port", "api_keys", "max_body_bytes"):
            assert allowed in allowed_line
        # Keys of other sections are not offered here.
        assert "upstreams" not in allowed_line

    def test_unknown_key_inside_list_item(self, write_config: WriteConfig) -> None:
        message = load_error(
            write_config, "upstreams: [{name: a, base_url: 'http://a.test', modles: [x]}]\n"
        )
        assert "upstreams.0.modles: unknown key" in message
        assert "base_url" in message
        assert "models" in message

    def test_unknown_key_three_levels_deep(self, write_config: WriteConfig) -> None:
        message = load_error(
            write_config,
            "upstreams: [{name: a, base_url: 'http://a.test', timeouts: {reed: 5}}]\n",
        )
        assert "upstreams.0.timeouts.reed: unknown key" in message
        assert "connect, pool, read, write" in message

    def test_unknown_key_in_model_entry(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "models: {gpt-4o: {context: 1}}\n")
        assert "models.gpt-4o.context: unknown key" in message
        assert "context_window" in message

    def test_wrong_type(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "server: {port: eighty}\n")
        assert "server.port" in message
        assert "integer" in message
        assert "'eighty'" in message

    def test_section_wrong_type(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "server: 8080\n")
        assert "server:" in message
        assert "(got 8080)" in message

    @pytest.mark.parametrize("port", [0, 65536, -1])
    def test_port_out_of_range(self, write_config: WriteConfig, port: int) -> None:
        message = load_error(write_config, f"server: {{port: {port}}}\n")
        assert "server.port" in message
        assert f"(got {port})" in message

    @pytest.mark.parametrize("port", [1, 65535])
    def test_port_bounds_accepted(self, write_config: WriteConfig, port: int) -> None:
        path = write_config(f"server: {{port: {port}}}\n")
        assert load_settings(path, environ={}).server.port == port

    @pytest.mark.parametrize("url", ["not a url", "ftp://host/v1", "//host"])
    def test_bad_url(self, write_config: WriteConfig, url: str) -> None:
        message = load_error(write_config, f"upstreams: [{{name: a, base_url: '{url}'}}]\n")
        assert "upstreams.0.base_url" in message
        assert "URL" in message

    def test_duplicate_upstream_names(self, write_config: WriteConfig) -> None:
        message = load_error(
            write_config,
            "upstreams:\n"
            "  - {name: a, base_url: 'http://a.test'}\n"
            "  - {name: b, base_url: 'http://b.test'}\n"
            "  - {name: a, base_url: 'http://c.test'}\n",
        )
        assert "unique" in message
        assert "repeated: a" in message

    def test_bad_upstream_name(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "upstreams: [{name: 'a b', base_url: 'http://a'}]\n")
        assert "upstreams.0.name" in message

    @pytest.mark.parametrize("ttl", ["7x", "d7", "seven days", "1.5h"])
    def test_bad_ttl(self, write_config: WriteConfig, ttl: str) -> None:
        message = load_error(write_config, f"store: {{ttl: '{ttl}'}}\n")
        assert "store.ttl" in message
        assert "duration" in message
        assert "7d" in message  # says what is allowed

    def test_negative_ttl(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "store: {ttl: -5}\n")
        assert "store.ttl" in message
        assert "negative" in message

    def test_empty_upstream_list(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "upstreams: []\n")
        assert "upstreams:" in message
        assert "at least 1" in message

    def test_bad_literal_lists_choices(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "store: {backend: postgres}\n")
        assert "store.backend" in message
        assert "'memory', 'sqlite' or 'redis'" in message
        assert "'postgres'" in message

    def test_several_errors_all_reported(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "server: {port: 0, workers: 0}\nstore: {ttl: x}\n")
        assert "server.port" in message
        assert "server.workers" in message
        assert "store.ttl" in message

    def test_source_is_named(self, write_config: WriteConfig) -> None:
        path = write_config("server: {port: 0}\n")
        with pytest.raises(ConfigError) as info:
            load_settings(path, environ={})
        assert str(info.value).startswith(f"invalid configuration ({path}):")

    @pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
    def test_top_level_not_mapping(self, write_config: WriteConfig, text: str) -> None:
        message = load_error(write_config, text)
        assert "top level must be a mapping" in message

    def test_invalid_yaml(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "server: [\n  port: 1\n")
        assert "not valid YAML" in message
        assert "line" in message

    def test_missing_file(self, tmp_path: Path) -> None:
        missing = tmp_path / "nope.yaml"
        with pytest.raises(ConfigError) as info:
            load_settings(missing, environ={})
        assert "cannot read config file" in str(info.value)
        assert str(missing) in str(info.value)

    def test_unreadable_file(
        self, write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = write_config("server: {}\n")

        def denied(self: Path, *args: object, **kwargs: object) -> str:
            raise PermissionError(13, "Permission denied", str(self))

        # chmod 0 does not stop root, so refuse the read the way the OS would.
        monkeypatch.setattr(Path, "read_text", denied)
        with pytest.raises(ConfigError) as info:
            load_settings(path, environ={})
        assert f"cannot read config file {path}: Permission denied" in str(info.value)

    def test_directory_is_unreadable(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError) as info:
            load_settings(tmp_path, environ={})
        assert "cannot read config file" in str(info.value)

    def test_not_utf8(self, tmp_path: Path) -> None:
        path = tmp_path / "latin1.yaml"
        path.write_bytes(b"server: {host: '\xff\xfe'}\n")
        with pytest.raises(ConfigError) as info:
            load_settings(path, environ={})
        assert "not UTF-8" in str(info.value)


# --- compaction blocks -----------------------------------------------------------------------


class TestCompactionErrors:
    """The `compaction` and `summarization` blocks (top level and per model) are validated by the
    core's models at start-up; every error names the full key path the user wrote."""

    @pytest.mark.parametrize(
        ("text", "path"),
        [
            (
                "pipeline: [{strategy: tool_result_compaction, keep_last_tool_call_groups: -1}]",
                "models.gpt-4o.compaction.pipeline.0.keep_last_tool_call_groups",
            ),
            (
                "pipeline: [{strategy: pipeline, strategies: "
                "[{strategy: context_pruning, softTrim: {maxChars: -1}}]}]",
                "models.gpt-4o.compaction.pipeline.0.strategies.0.softTrim.maxChars",
            ),
            (
                "pipeline: [{strategy: truncation}, "
                "{strategy: summarization, target_count: 2, retain_recent: {turns: 1}}]",
                "models.gpt-4o.compaction.pipeline.1",
            ),
            (
                "pipeline: [{strategy: truncation, trigger: {tokens_exceed: x}}]",
                "models.gpt-4o.compaction.pipeline.0.trigger.tokens_exceed",
            ),
            ("bogus: 1", "models.gpt-4o.compaction.bogus"),
        ],
    )
    def test_model_override_errors_name_the_key_path(
        self, write_config: WriteConfig, text: str, path: str
    ) -> None:
        message = load_error(write_config, f"models:\n  gpt-4o:\n    compaction: {{{text}}}\n")
        assert message.splitlines()[1].startswith(f"  {path}: "), message

    def test_messages_read_as_the_problem(self, write_config: WriteConfig) -> None:
        text = "compaction: {pipeline: [{strategy: sliding_window}]}\n"
        line = load_error(write_config, text).splitlines()[1]
        assert line.startswith("  compaction.pipeline.0: sliding_window needs keep_last_groups")
        assert "Value error" not in line

    def test_summarization_errors_name_the_camel_case_key(self, write_config: WriteConfig) -> None:
        message = load_error(write_config, "summarization: {reserveRatio: 2, placement: tool}\n")
        assert "  summarization.reserveRatio: " in message
        assert "  summarization.placement: " in message

    def test_model_facts(self, write_config: WriteConfig) -> None:
        text = "models: {gpt-4o: {context_window: 1000}, 'gpt-5*': {encoding: cl100k_base}}\n"
        models = load_settings(write_config(text), environ={}).models
        assert models["gpt-4o"].facts_override() == FactsOverride(1000, None, None)
        assert models["gpt-5*"].facts_override() == FactsOverride(None, None, "cl100k_base")
        message = load_error(write_config, "models: {gpt-4o: {context_window: 0}}\n")
        assert "  models.gpt-4o.context_window: " in message
        message = load_error(write_config, "models: {gpt-4o: {window: 10}}\n")
        assert "  models.gpt-4o.window: unknown key" in message


# --- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("45s", 45),
        ("30m", 1800),
        ("12h", 43200),
        ("7d", 604800),
        ("2w", 1209600),
        ("90", 90),
        (" 5 m ", 300),
        (0, 0),
        (3600, 3600),
    ],
)
def test_parse_duration(value: str | int, seconds: int) -> None:
    assert parse_duration(value) == seconds


def test_ttl_seconds_from_file(write_config: WriteConfig) -> None:
    path = write_config("store: {ttl: 12h}\n")
    assert load_settings(path, environ={}).store.ttl_seconds == 43200


# --- secrets ----------------------------------------------------------------------------------


SECRET_CONFIG = """
server:
  api_keys: [proxy-key-AAA, proxy-key-BBB]
upstreams:
  - name: up
    base_url: http://upstream.test/v1
    api_key: sk-upstream-CCC
  - name: open
    base_url: http://open.test/v1
store:
  backend: redis
  url: redis://user:redis-pass-DDD@redis.test:6379/0
"""
SECRETS = ["proxy-key-AAA", "proxy-key-BBB", "sk-upstream-CCC", "redis-pass-DDD"]


class TestMasking:
    def test_effective_config_masks_every_secret(self, write_config: WriteConfig) -> None:
        data = effective_config(load_settings(write_config(SECRET_CONFIG), environ={}))
        text = repr(data)
        for secret in SECRETS:
            assert secret not in text
        assert data["server"]["api_keys"] == ["***", "***"]
        assert data["upstreams"][0]["api_key"] == "***"
        assert data["upstreams"][1]["api_key"] is None  # absence is not hidden
        assert data["store"]["url"] == "redis://***@redis.test:6379/0"

    def test_effective_config_keeps_ordinary_values(self, write_config: WriteConfig) -> None:
        data = effective_config(load_settings(write_config(SECRET_CONFIG), environ={}))
        assert data["upstreams"][0]["base_url"] == "http://upstream.test/v1"
        assert data["store"]["backend"] == "redis"
        assert data["server"]["port"] == 8080

    def test_url_without_credentials_unchanged(self, write_config: WriteConfig) -> None:
        path = write_config("store: {backend: redis, url: 'redis://redis.test:6379/0'}\n")
        data = effective_config(load_settings(path, environ={}))
        assert data["store"]["url"] == "redis://redis.test:6379/0"

    def test_effective_config_masks_interpolated_secrets(self, write_config: WriteConfig) -> None:
        path = write_config(
            "upstreams: [{name: up, base_url: 'http://u.test', api_key: '${KEY}'}]\n"
        )
        data = effective_config(load_settings(path, environ={"KEY": "sk-interp-EEE"}))
        assert "sk-interp-EEE" not in repr(data)

    @pytest.mark.parametrize(
        "text",
        [
            # wrong type for the key itself
            "upstreams: [{name: up, base_url: 'http://u.test', api_key: [sk-leak-1]}]\n",
            # a misspelt key holding a secret
            "upstreams: [{name: up, base_url: 'http://u.test', apikey: sk-leak-1}]\n",
            # a whole-document check whose input is every value
            "upstreams:\n  - {name: a, base_url: 'http://a.test', api_key: sk-leak-1}\n"
            "  - {name: a, base_url: 'http://b.test'}\n",
            # a section of the wrong shape, holding a key
            "upstreams: {name: a, base_url: 'http://a.test', api_key: sk-leak-1}\n",
            # proxy keys of the wrong type
            "server: {api_keys: sk-leak-1}\n",
            "server: {api_keys: [sk-leak-1, 5]}\n",
            # a credentialed URL next to a bad sibling, and as a bad value itself
            "store: {url: 'redis://u:sk-leak-1@h', ttl: nope}\n",
            "store: {url: ['redis://u:sk-leak-1@h']}\n",
            # broken YAML on the line that holds the key
            'upstreams:\n  - name: a\n    api_key: "sk-leak-1\n',
            "upstreams:\n  - name: a\n    api_key: sk-leak-1: x\n",
        ],
    )
    def test_no_secret_in_error_messages(self, write_config: WriteConfig, text: str) -> None:
        message = load_error(write_config, text)
        assert "sk-leak-1" not in message

    def test_no_secret_in_env_override_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(
            "COMPACTION_PROXY_UPSTREAMS",
            '[{"name": "a", "base_url": "nope", "api_key": "sk-leak-2"}]',
        )
        with pytest.raises(ConfigError) as info:
            load_settings(environ={})
        assert "upstreams.0.base_url" in str(info.value)
        assert "sk-leak-2" not in str(info.value)

    def test_secrets_are_secretstr(self, write_config: WriteConfig) -> None:
        settings = load_settings(write_config(SECRET_CONFIG), environ={})
        for secret in SECRETS[:3]:
            assert secret not in repr(settings)
            assert secret not in str(settings)


def test_settings_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match="unique"):
        Settings(
            upstreams=[
                {"name": "a", "base_url": "http://a.test"},
                {"name": "a", "base_url": "http://b.test"},
            ]
        )


def test_an_env_override_that_is_not_json_is_a_config_error_without_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_SERVER__API_KEYS", "sk-not-json-secret")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "not valid JSON" in str(caught.value)
    assert "sk-not-json-secret" not in str(caught.value)


def test_an_empty_inbound_key_is_refused(write_config: Callable[[str], Path]) -> None:
    """`api_keys: ["${PROXY_KEY:-}"]` with the variable unset must not open the proxy."""
    path = write_config('server:\n  api_keys: ["${PROXY_KEY_UNSET_FOR_TEST:-}"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert "server.api_keys" in str(caught.value) and "must not be empty" in str(caught.value)


def test_display_url_drops_credentials_and_query() -> None:
    from compaction_proxy.config import UpstreamSettings

    up = UpstreamSettings(name="a", base_url="https://user:tok3n@api.x.com:8443/v1?sig=abc")
    assert up.display_url == "https://api.x.com:8443/v1"
    assert "tok3n" not in up.display_url and "sig" not in up.display_url
