"""config.example.yaml: valid, complete, and every value in it is the real default.

The file's contract (its header): every key is present, set to its default, with a one-line
comment; commented-out blocks are examples. These tests hold it to that, so a default changed
in compaction_proxy/ without the example (or the other way round) fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from compaction_proxy.compaction.budget import ModelCatalog
from compaction_proxy.compaction.factory import (
    DEFAULT_TARGET_RATIO,
    DEFAULT_TRIGGER_RATIO,
    build_pipeline,
    default_pipeline_entries,
    default_target,
)
from compaction_proxy.compaction.settings import (
    CompactionSettings,
    SummarizationSettings,
    entry_to_config,
)
from compaction_proxy.config import ConfigError, Settings, effective_config, load_settings
from compaction_proxy.summarizer import DEFAULT_MAX_SUMMARY_TOKENS
from tests.deploy.files import CONFIG_EXAMPLE, REPO_ROOT, dockerfile

EXAMPLE_ONLY = ("models",)  # sections whose content is an example, not the default ({})


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment overrides and the key would change what the file loads to."""
    for name in list(os.environ):
        if name.upper().startswith("COMPACTION_PROXY_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name)


def _example() -> Settings:
    return load_settings(CONFIG_EXAMPLE, environ={})


def _defaults() -> dict[str, Any]:
    return effective_config(Settings())


# ----------------------------------------------------------------------------- reading the file


def _comment(line: str) -> str | None:
    """The comment of a YAML line (a `#` outside quotes, after whitespace), or None."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[index + 1 :].strip()
    return None


def _key_lines(
    node: yaml.Node, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], int]]:
    """(key path, 0-based line of the key) for every key in the composed document."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, key.value)
            yield child, key.start_mark.line
            yield from _key_lines(value, child)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _key_lines(item, (*path, index))


def _leaves(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, value) of every leaf; empty containers and lists of scalars are leaves."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        for index, value in enumerate(data):
            yield from _leaves(value, (*path, index))
    else:
        yield path, data


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return CONFIG_EXAMPLE.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def key_lines() -> dict[tuple[Any, ...], int]:
    node = yaml.compose(CONFIG_EXAMPLE.read_text(encoding="utf-8"))
    return dict(_key_lines(node))


def _comment_at(
    path: tuple[Any, ...], key_lines: dict[tuple[Any, ...], int], lines: list[str]
) -> str:
    assert path in key_lines, f"{'.'.join(map(str, path))} is not in config.example.yaml"
    comment = _comment(lines[key_lines[path]])
    assert comment, f"{'.'.join(map(str, path))} (line {key_lines[path] + 1}) has no comment"
    return comment


# ----------------------------------------------------------------------------- valid


def test_example_loads() -> None:
    settings = _example()
    assert settings.upstreams[0].api_key is None  # ${OPENAI_API_KEY:-} with no key set


def test_example_key_interpolates_from_the_environment() -> None:
    settings = load_settings(CONFIG_EXAMPLE, environ={"OPENAI_API_KEY": "sk-example-123"})
    key = settings.upstreams[0].api_key
    assert key is not None and key.get_secret_value() == "sk-example-123"


def test_a_key_in_the_example_needs_inbound_keys_to_serve() -> None:
    """What the image and compose.yaml run: with OPENAI_API_KEY in the proxy, `serve` needs
    server.api_keys (COMPACTION_PROXY_SERVER__API_KEYS), or the explicit opt-in; without a
    key in the proxy, clients' keys pass through and nothing more is needed."""
    from compaction_proxy.config import preflight

    keyed = load_settings(CONFIG_EXAMPLE, environ={"OPENAI_API_KEY": "sk-example-123"})
    (problem,) = preflight.serving_problems(keyed)
    assert problem.startswith("upstreams.0.api_key: anonymous callers could spend this key")
    assert "sk-example-123" not in problem
    server = keyed.server.model_copy(update={"api_keys": [SecretStr("pk-app")]})
    assert preflight.serving_problems(keyed.model_copy(update={"server": server})) == []
    assert preflight.serving_problems(_example()) == []


@pytest.mark.e2e
def test_check_config_accepts_it_and_prints_the_defaults() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("COMPACTION_PROXY_")}
    env.pop("OPENAI_API_KEY", None)
    result = subprocess.run(
        [sys.executable, "-m", "compaction_proxy", "check-config", "config.example.yaml"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    defaults = _defaults()
    for section in defaults:
        if section in EXAMPLE_ONLY:
            continue
        assert printed[section] == defaults[section], f"{section}: not the default"
    assert "configuration is valid" in result.stderr


# ----------------------------------------------------------------------------- complete, defaults


@pytest.mark.parametrize(
    "section",
    [s for s in Settings.model_fields if s not in EXAMPLE_ONLY],
)
def test_every_value_is_the_default(section: str) -> None:
    example = effective_config(_example())[section]
    assert example == _defaults()[section], f"config.example.yaml `{section}` differs from defaults"


def test_every_key_is_present_with_a_comment(
    lines: list[str], key_lines: dict[tuple[Any, ...], int]
) -> None:
    missing, uncommented = [], []
    for path, _ in _leaves(_defaults()):
        if path[0] in EXAMPLE_ONLY:
            continue
        dotted = ".".join(map(str, path))
        if path not in key_lines:
            missing.append(dotted)
        elif not _comment(lines[key_lines[path]]):
            uncommented.append(f"{dotted} (line {key_lines[path] + 1})")
    assert not missing, f"keys missing from config.example.yaml: {missing}"
    assert not uncommented, f"keys without a comment: {uncommented}"


def test_the_whole_librechat_block_is_there(key_lines: dict[tuple[Any, ...], int]) -> None:
    # Every key of LibreChat's documented `summarization` block (the seed), camelCase as pasted.
    librechat = [
        "provider", "model", "parameters", "prompt", "updatePrompt", "maxSummaryTokens",
        "reserveRatio", "trigger", "contextPruning.enabled", "contextPruning.keepLastAssistants",
        "contextPruning.softTrimRatio", "contextPruning.hardClearRatio",
        "contextPruning.minPrunableToolChars", "contextPruning.softTrim.maxChars",
        "contextPruning.softTrim.headChars", "contextPruning.softTrim.tailChars",
        "contextPruning.hardClear.enabled", "contextPruning.hardClear.placeholder",
        # LibreChat's retainRecent, and our additions
        "retainRecent.turns", "placement", "timeout",
    ]  # fmt: skip
    for key in librechat:
        path = ("summarization", *key.split("."))
        assert path in key_lines, f"summarization.{key} missing"


def test_model_example_states_the_built_in_facts() -> None:
    example = _example().models
    builtin = ModelCatalog().facts_for("gpt-4o")
    entry = example["gpt-4o"]
    assert (entry.context_window, entry.max_output_tokens, entry.encoding) == (
        builtin.context_window,
        builtin.max_output_tokens,
        builtin.encoding,
    ), "the comment says these equal the built-in facts"


# ----------------------------------------------------------------------------- what comments say


def test_comments_that_name_a_value_tell_the_truth(
    lines: list[str], key_lines: dict[tuple[Any, ...], int]
) -> None:
    def says(path: tuple[Any, ...], pattern: str) -> None:
        comment = _comment_at(path, key_lines, lines)
        assert re.search(pattern, comment), f"{'.'.join(map(str, path))}: {comment!r}"

    # null maxSummaryTokens means the summarizer's own default limit.
    says(("summarization", "maxSummaryTokens"), rf"null: {DEFAULT_MAX_SUMMARY_TOKENS}\b")
    # null trigger means the default pipeline's token_ratio trigger.
    says(("summarization", "trigger"), rf"type: token_ratio, value: {DEFAULT_TRIGGER_RATIO}\b")
    says(("compaction", "stop_when"), r"null: over_budget")
    assert CompactionSettings().stop_when is None
    # What the container image changes: the comments name the Dockerfile's values.
    env = dockerfile().final.env()
    says(("server", "host"), re.escape(env["COMPACTION_PROXY_SERVER__HOST"]))
    says(("store", "path"), re.escape(env["COMPACTION_PROXY_STORE__PATH"]))


def _with(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    copy = yaml.safe_load(yaml.safe_dump(data))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return copy


def test_ranges_in_comments_are_the_validators_ranges(
    tmp_path: Path, lines: list[str], key_lines: dict[tuple[Any, ...], int]
) -> None:
    """A comment saying `(A-B)` promises A and B load and A-1 and B+1 are refused."""
    data = yaml.safe_load(CONFIG_EXAMPLE.read_text(encoding="utf-8"))
    checked = []
    for path, line in key_lines.items():
        comment = _comment(lines[line]) or ""
        match = re.search(r"\((\d+)-(\d+)\)", comment)
        if not match:
            continue
        low, high = int(match.group(1)), int(match.group(2))
        for value, ok in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
            file = tmp_path / "range.yaml"
            file.write_text(yaml.safe_dump(_with(data, path, value)), encoding="utf-8")
            if ok:
                load_settings(file, environ={})
            else:
                with pytest.raises(ConfigError, match=re.escape(".".join(map(str, path)))):
                    load_settings(file, environ={})
        checked.append(path)
    assert len(checked) >= 4, checked  # port, workers, retainRecent.turns, keepLastAssistants


# ----------------------------------------------------------------------------- commented examples


def _examples() -> dict[str, dict[str, Any]]:
    """`# --- example: NAME (prose)` ... `# --- end` blocks, uncommented and parsed."""
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    for line in CONFIG_EXAMPLE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        start = re.match(r"# --- example: (\S+)", stripped)
        if start:
            current = start.group(1)
            blocks[current] = []
        elif stripped == "# --- end":
            current = None
        elif current is not None:
            body = stripped[2:] if stripped.startswith("# ") else stripped.lstrip("#")
            blocks[current].append(body)
    parsed = {}
    for name, body in blocks.items():
        data = yaml.safe_load("\n".join(body))
        assert isinstance(data, dict), f"example {name} is not a mapping"
        parsed[name] = data
    return parsed


def test_commented_pipeline_examples_are_valid() -> None:
    examples = _examples()
    assert {"default-pipeline", "agent-framework"} <= set(examples)
    for name, block in examples.items():
        settings = CompactionSettings(**block)
        build_pipeline(settings, SummarizationSettings())  # every strategy is registered
        assert settings.pipeline, name


def test_the_written_out_default_pipeline_is_the_default() -> None:
    block = _examples()["default-pipeline"]
    written = CompactionSettings(**block)
    derived = default_pipeline_entries(SummarizationSettings())
    assert [entry_to_config(e) for e in written.pipeline or []] == [
        entry_to_config(e) for e in derived
    ]
    assert written.stop_when == default_target()
    # the same composition: token-budget, with hysteresis (tests/compaction/test_compositions.py)
    built, default = build_pipeline(written), build_pipeline(CompactionSettings())
    assert (built.early_stop, built.hysteresis, built.stop_when) == (
        default.early_stop,
        default.hysteresis,
        default.stop_when,
    )
    # and the default pipeline's own additions, which an explicit pipeline has only when written
    assert (
        (built.carry_user_share, built.min_saving, built.ledger_share)
        == (
            default.carry_user_share,
            default.min_saving,
            default.ledger_share,
        )
        == (0.15, 0.02, 0.5)
    )
    assert DEFAULT_TRIGGER_RATIO == 0.8 and DEFAULT_TARGET_RATIO == 0.5  # "80% ... towards 50%"


def test_no_pipeline_is_active_in_the_example() -> None:
    # A present pipeline replaces the derived one: the example keeps the default behaviour.
    assert _example().compaction.pipeline is None


def test_example_file_is_the_one_the_image_ships(tmp_path: Path) -> None:
    env = dockerfile().final.env()
    target = env["COMPACTION_PROXY_CONFIG"]
    copies = [c.flags_and_rest()[1].split() for c in dockerfile().final.all("COPY")]
    assert [CONFIG_EXAMPLE.name, target] in copies
