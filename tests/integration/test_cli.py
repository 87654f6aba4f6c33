"""The command line: ``check-config`` masking and validation errors, ``serve`` start-up."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.assertions import CHAT_PATH
from tests.support.processes import free_port, run_python_module
from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)

pytestmark = pytest.mark.e2e  # starts real processes (tests/support/process_guard.py)

UPSTREAM_SECRET = "sk-upstream-secret-31f7c2"
INBOUND_SECRETS = ["pk-inbound-a-77e0d1", "pk-inbound-b-0a9b4f"]
# Words an error uses to say what would have been accepted.
ALLOWED_WORDING = re.compile(
    r"should|must|allowed|expected|valid|permitted|one of|between|greater|less|at least|"
    r"at most|unknown|not a",
    re.IGNORECASE,
)


def check_config(
    path: Path | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    args = ["check-config"] if path is None else ["check-config", str(path)]
    return run_python_module("compaction_proxy", *args, env=env)


def valid_config() -> dict[str, Any]:
    return proxy_config(
        upstream_entry("http://127.0.0.1:9/v1", name="main", api_key=UPSTREAM_SECRET),
        {
            **upstream_entry("http://127.0.0.1:10/v1", name="other", models=["claude-*"]),
            "keyless": True,
        },
        api_keys=INBOUND_SECRETS,
        max_body_bytes=1_000_000,
    )


def test_check_config_prints_effective_config_masked(tmp_path: Path) -> None:
    result = check_config(write_config(tmp_path / "ok.yaml", valid_config()))
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["server"]["api_keys"] == ["***", "***"]
    assert effective["server"]["max_body_bytes"] == 1_000_000
    main, other = effective["upstreams"]
    assert main["name"] == "main" and main["api_key"] == "***"
    assert main["base_url"].startswith("http://127.0.0.1:9/v1")
    assert other["models"] == ["claude-*"]
    assert other["keyless"] is True and other["api_key"] is None
    # Defaults are filled in: the effective config, not an echo of the file.
    assert set(main["timeouts"]) >= {"connect", "read", "write", "pool"}
    for secret in [UPSTREAM_SECRET, *INBOUND_SECRETS]:
        assert secret not in result.stdout + result.stderr


def test_check_config_interpolates_environment(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        server:
          host: 127.0.0.1
          port: ${CP_TEST_PORT}
          allow_anonymous_spend: true  # an operator key without server.api_keys, meant
        upstreams:
          - name: fromenv
            base_url: ${CP_TEST_UNSET_URL:-http://127.0.0.1:4321/v1}
            api_key: ${CP_TEST_KEY}
            models: ["${CP_TEST_MODEL:-gpt-*}"]
        """
    )
    env = {"CP_TEST_PORT": "8123", "CP_TEST_KEY": "sk-from-env-e4d2a8"}
    result = check_config(write_config(tmp_path / "env.yaml", text), env=env)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["server"]["port"] == 8123
    upstream = effective["upstreams"][0]
    assert upstream["base_url"].startswith("http://127.0.0.1:4321/v1")
    assert upstream["models"] == ["gpt-*"]
    assert upstream["api_key"] == "***"
    assert "sk-from-env-e4d2a8" not in result.stdout + result.stderr


def test_check_config_reads_env_var_path(tmp_path: Path) -> None:
    path = write_config(tmp_path / "via-env.yaml", valid_config())
    result = check_config(None, env={"COMPACTION_PROXY_CONFIG": str(path)})
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["upstreams"][0]["name"] == "main"


def _with(path: str, value: Any) -> dict[str, Any]:
    """valid_config() with one value replaced (dotted path, list indexes as numbers)."""
    config = valid_config()
    node: Any = config
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[parts[-1]] = value
    return config


INVALID = {
    "bad-url": (_with("upstreams.0.base_url", "not a url"), "upstreams.0.base_url", "not a url"),
    "bad-scheme": (
        _with("upstreams.1.base_url", "ftp://127.0.0.1/v1"),
        "upstreams.1.base_url",
        "ftp://127.0.0.1/v1",
    ),
    "negative-port": (_with("server.port", -1), "server.port", "-1"),
    "huge-port": (_with("server.port", 70000), "server.port", "70000"),
    "unknown-key": (_with("server.bogus_setting", 1), "server.bogus_setting", None),
    "unknown-upstream-key": (
        _with("upstreams.0.base_ur1", "http://x/v1"),
        "upstreams.0.base_ur1",
        None,
    ),
    "unknown-top-level": (_with("upstreamz", []), "upstreamz", None),
    "wrong-type": (_with("server.max_body_bytes", "lots"), "server.max_body_bytes", "lots"),
    "wrong-type-nested": (
        _with("upstreams.0.timeouts", {"read": "soon"}),
        "upstreams.0.timeouts.read",
        "soon",
    ),
    "wrong-type-list": (_with("server.api_keys", "just-one-key"), "server.api_keys", None),
    "models-not-list": (_with("upstreams.1.models", 5), "upstreams.1.models", "5"),
}


@pytest.mark.parametrize(("config", "key_path", "bad_value"), INVALID.values(), ids=list(INVALID))
def test_check_config_rejects_invalid(
    tmp_path: Path, config: dict[str, Any], key_path: str, bad_value: str | None
) -> None:
    result = check_config(write_config(tmp_path / "bad.yaml", config))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert key_path in output, output
    if bad_value is not None:
        assert bad_value in output, output
    assert ALLOWED_WORDING.search(output), output
    for secret in [UPSTREAM_SECRET, *INBOUND_SECRETS]:
        assert secret not in output


@pytest.mark.parametrize(
    "text",
    ["server: [unclosed\n", "server:\n  port: 1\n    host: x\n", "- just\n- a list\n"],
    ids=["syntax", "indentation", "not-a-mapping"],
)
def test_check_config_rejects_broken_yaml(tmp_path: Path, text: str) -> None:
    result = check_config(write_config(tmp_path / "broken.yaml", text))
    assert result.returncode != 0
    assert "broken.yaml" in result.stdout + result.stderr


def test_check_config_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = check_config(missing)
    assert result.returncode != 0
    assert "nope.yaml" in result.stdout + result.stderr


def test_check_config_unset_variable_without_default(tmp_path: Path) -> None:
    text = "upstreams:\n  - name: a\n    base_url: ${CP_TEST_DEFINITELY_UNSET_VAR}\n"
    result = check_config(write_config(tmp_path / "unset.yaml", text))
    assert result.returncode != 0
    assert "CP_TEST_DEFINITELY_UNSET_VAR" in result.stdout + result.stderr


def test_serve_refuses_invalid_config(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bad.yaml", _with("server.port", -1))
    result = run_python_module(
        "compaction_proxy",
        "serve",
        "--config",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        timeout=60,
    )
    assert result.returncode != 0
    assert "server.port" in result.stdout + result.stderr


def test_serve_reads_config_from_env_var(proxy_factory: Any, upstream: UpstreamServer) -> None:
    proxy: ProxyServer = proxy_factory(
        proxy_config(upstream_entry(upstream, name="envcfg")), via_env=True
    )
    with proxy.http_client() as client:
        response = client.post(
            CHAT_PATH,
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "via env"}]},
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "echo: via env"
    assert upstream.last_request(CHAT_PATH).headers["host"] == f"127.0.0.1:{upstream.port}"


def test_serve_interpolates_environment(proxy_factory: Any, upstream: UpstreamServer) -> None:
    text = textwrap.dedent(
        """\
        # allow_anonymous_spend: an operator key without server.api_keys, meant
        server: {host: 127.0.0.1, port: 8080, allow_anonymous_spend: true}
        upstreams:
          - name: interp
            base_url: ${CP_TEST_UPSTREAM_URL}
            api_key: ${CP_TEST_UPSTREAM_KEY:-}
            models: ["*"]
        """
    )
    proxy: ProxyServer = proxy_factory(
        text, env={"CP_TEST_UPSTREAM_URL": upstream.base_url, "CP_TEST_UPSTREAM_KEY": "sk-i-1"}
    )
    with proxy.http_client() as client:
        client.get("/v1/models").raise_for_status()
    assert upstream.last_request("/v1/models").headers["authorization"] == "Bearer sk-i-1"


# --- what a valid-looking file would trip on at run time ------------------------------------


def test_check_config_refuses_an_unknown_encoding(tmp_path: Path) -> None:
    config = _with("models", {"gpt-4o": {"encoding": "o200k_bsae"}})
    result = check_config(write_config(tmp_path / "enc.yaml", config))
    assert result.returncode == 2, result.stdout
    assert result.stdout == ""
    assert "models.gpt-4o.encoding: unknown encoding 'o200k_bsae'" in result.stderr
    assert "did you mean 'o200k_base'?" in result.stderr
    for known in ("o200k_base", "cl100k_base", "p50k_base", "r50k_base"):
        assert known in result.stderr


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`serve` as a subprocess that is expected to refuse to start (and so to exit at once)."""
    return run_python_module("compaction_proxy", "serve", *args, env=env, timeout=60)


def test_serve_refuses_a_port_flag_out_of_range(tmp_path: Path) -> None:
    path = write_config(tmp_path / "ok.yaml", valid_config())
    result = _serve("--config", str(path), "--host", "127.0.0.1", "--port", "99999")
    assert result.returncode == 2
    assert "--port: Input should be less than or equal to 65535 (got 99999)" in result.stderr
    assert "Uvicorn running" not in result.stdout + result.stderr


def test_serve_refuses_the_memory_store_with_several_workers(tmp_path: Path) -> None:
    path = write_config(tmp_path / "mem.yaml", {**valid_config(), "store": {"backend": "memory"}})
    args = ("--config", str(path), "--host", "127.0.0.1", "--port", str(free_port()))
    result = _serve(*args, "--workers", "2")
    assert result.returncode == 2
    assert "store.backend: memory" in result.stderr and "server.workers: 2" in result.stderr


def test_serve_refuses_inbound_keys_with_an_upstream_that_has_no_key(tmp_path: Path) -> None:
    config = proxy_config(upstream_entry("http://127.0.0.1:9/v1"), api_keys=INBOUND_SECRETS)
    path = write_config(tmp_path / "keys.yaml", config)
    result = _serve("--config", str(path), "--host", "127.0.0.1", "--port", str(free_port()))
    assert result.returncode == 2
    assert "upstreams.0.api_key: required while server.api_keys is set" in result.stderr
    for secret in INBOUND_SECRETS:
        assert secret not in result.stdout + result.stderr


# --- COMPACTION_DEBUG ------------------------------------------------------------------------


def _decisions(lines: list[str]) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in lines if line.startswith("{")]
    return [entry for entry in parsed if entry.get("msg") == "compaction decision"]


@pytest.mark.parametrize(
    ("debug", "workers"),
    [(True, 1), (False, 1), (True, 2)],
    ids=["debug", "no-debug", "debug-two-workers"],
)
def test_compaction_debug_alone_shows_the_decisions(
    proxy_factory: Any, upstream: UpstreamServer, tmp_path: Path, debug: bool, workers: int
) -> None:
    # Two workers: uvicorn spawns them, so each must set up the same JSON logging itself.
    config = proxy_config(
        upstream_entry(upstream),
        models={"gpt-4o": {"context_window": 2_000, "max_output_tokens": 200}},
        summarization={"enabled": False},
        store={"path": str(tmp_path / "checkpoints.db")},
    )
    config["server"]["workers"] = workers
    assert config["server"].get("log_level") is None  # the default, info: not debug
    env = {"COMPACTION_DEBUG": "true"} if debug else {}
    proxy: ProxyServer = proxy_factory(config, env=env)
    secret = "plum-zeppelin-4471"
    messages = [{"role": "system", "content": "Be brief."}]
    for turn in range(12):
        messages += [
            {"role": "user", "content": f"{secret} question {turn} " + "word " * 120},
            {"role": "assistant", "content": f"answer {turn}"},
        ]
    messages.append({"role": "user", "content": "newest question"})
    offset = proxy.log_size()
    with proxy.http_client() as client:
        response = client.post(CHAT_PATH, json={"model": "gpt-4o", "messages": messages})
    assert response.status_code == 200, response.text
    assert response.headers["x-compaction-strategies"] != "none"
    lines = proxy.log_lines_since(offset)
    decisions = _decisions(lines)
    if not debug:
        assert decisions == []
        return
    assert len(decisions) == 1, lines
    decision = decisions[0]
    assert decision["level"] == "debug"
    assert decision["report"]["budget"]["context_window"] == 2_000
    assert decision["report"]["tokens_after"] < decision["report"]["tokens_before"]
    assert len(decision["groups"]) == len(messages)
    assert all(isinstance(group["tokens"], int) for group in decision["groups"])
    text = "\n".join(lines)
    assert secret not in text and "newest question" not in text
