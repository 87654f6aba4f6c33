"""The Dockerfile, checked statically (no Docker engine is needed, or assumed).

Each test names the property the image relies on; the parser in ``files.py`` refuses what it
does not understand, so a check cannot pass by skipping a line.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import PurePosixPath

import pytest

from proxy.cli import _parser
from proxy.config import Settings
from tests.deploy.files import (
    DOCKERFILE,
    REPO_ROOT,
    Dockerfile,
    Instruction,
    Stage,
    dockerfile,
    dockerignore_patterns,
    healthcheck_python,
    parse_dockerfile,
)

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def df() -> Dockerfile:
    return dockerfile()


def _runs(stage: Stage) -> list[Instruction]:
    return stage.all("RUN")


def _final_command(stage: Stage) -> list[Instruction]:
    return [i for i in stage.instructions if i.keyword in ("CMD", "ENTRYPOINT")]


# ----------------------------------------------------------------------------- parser sanity


def test_parser_reads_continuations_comments_and_args() -> None:
    parsed = parse_dockerfile(
        "ARG V=3.11\nFROM python:${V}-slim AS b\n# note\nRUN a \\\n  # inside\n  && b\n"
        'ENV A=1 B="two words"\nFROM python:${V}-slim\nUSER 10001\n'
    )
    assert [s.image for s in parsed.stages] == ["python:3.11-slim", "python:3.11-slim"]
    assert parsed.stages[0].name == "b"
    assert parsed.stages[0].all("RUN")[0].args == "a && b"
    assert parsed.stages[0].env() == {"A": "1", "B": "two words"}
    with pytest.raises(ValueError, match="unknown instruction"):
        parse_dockerfile("FROM x:1\nFRMO y\n")


# ----------------------------------------------------------------------------- stages and base


def test_multi_stage_on_one_pinned_slim_python_base(df: Dockerfile) -> None:
    assert len(df.stages) >= 2, "the image must be multi-stage (builder + runtime)"
    for stage in df.stages:
        name, _, tag = stage.image.partition(":")
        assert name == "python", f"official Python base expected, got {stage.image}"
        assert tag and tag != "latest", f"{stage.image}: pin a tag, never latest"
        assert re.fullmatch(r"3\.1[1-9]-slim(-[a-z]+)?", tag), (
            f"{stage.image}: pin the minor version on a slim variant (e.g. 3.11-slim-bookworm)"
        )
    # The venv is copied between stages: its interpreter path must exist in both.
    assert len({s.image for s in df.stages}) == 1, "builder and runtime must share one base"
    assert df.stages[0].name, "the builder stage needs a name for COPY --from"


def test_runtime_copies_the_venv_and_encodings_from_the_builder(df: Dockerfile) -> None:
    builder = df.stages[0]
    copies = {}
    for copy in df.final.all("COPY"):
        flags, rest = copy.flags_and_rest()
        if flags.get("from") == builder.name:
            source, target = rest.split()
            copies[source] = target
    assert copies.get("/opt/venv") == "/opt/venv", copies
    cache = df.final.env()["TIKTOKEN_CACHE_DIR"]
    assert copies.get(cache) == cache, f"the encodings ({cache}) must be copied from the builder"


# ----------------------------------------------------------------------------- installing


def _pip_installs(stage: Stage) -> list[list[str]]:
    found = []
    for run in _runs(stage):
        commands: list[list[str]] = [[]]
        for word in shlex.split(run.args):
            if word in ("&&", "||", ";", "|"):
                commands.append([])
            else:
                commands[-1].append(word)
        for words in commands:
            for index in range(len(words) - 1):
                # `pip install`, `/opt/venv/bin/pip install`, `python -m pip install`
                if words[index].endswith("pip") and words[index + 1] == "install":
                    found.append(words[index + 2 :])
    return found


def test_pip_installs_only_the_repository_files(df: Dockerfile) -> None:
    installs = [args for stage in df.stages for args in _pip_installs(stage)]
    assert installs, "no pip install found: how do the dependencies get in?"
    for args in installs:
        targets = []
        skip_next = False
        for word in args:
            if skip_next:
                skip_next = False
                continue
            if word in ("-r", "--requirement", "-c", "--constraint"):
                skip_next = True
                continue
            if word.startswith("-"):
                continue
            targets.append(word)
        for target in targets:
            assert target.startswith(("/", "./", ".")), (
                f"`pip install {' '.join(args)}` names a package ({target!r}) instead of the "
                "repository's own files (built wheel, pyproject.toml)"
            )
    wheel_installs = [a for a in installs if any(w.endswith(".whl") for w in a)]
    assert wheel_installs, "the project must be installed from the wheel built in the builder"


def test_builder_builds_the_wheel_from_pyproject(df: Dockerfile) -> None:
    builder = df.stages[0]
    runs = " ".join(r.args for r in _runs(builder))
    assert re.search(r"pip wheel\b.*\s\.(\s|$)", runs), "build the project's wheel: pip wheel ."
    copied = " ".join(c.args for c in builder.all("COPY"))
    assert "pyproject.toml" in copied
    # hatchling reads the readme named in pyproject.toml; without it the wheel build fails.
    assert PYPROJECT["project"]["readme"] in copied.split()
    package = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"][0]
    assert package in copied.split(), f"the package directory {package}/ must be copied"
    # Requirements come from pyproject.toml itself, not a hand-kept list.
    assert "tomllib" in runs and "pyproject.toml" in runs and "['dependencies']" in runs
    # A pip cache would only bloat the layer.
    env = builder.env()
    assert env.get("PIP_NO_CACHE_DIR") in ("1", "true", "on") or "--no-cache-dir" in runs


def test_the_console_script_is_the_entrypoint(df: Dockerfile) -> None:
    entry = df.final.all("ENTRYPOINT")
    cmd = df.final.all("CMD")
    assert entry and cmd
    entry_argv, cmd_argv = entry[-1].exec_form(), cmd[-1].exec_form()
    assert entry_argv is not None and cmd_argv is not None, (
        "ENTRYPOINT and CMD must be exec form (JSON arrays) so SIGTERM reaches the proxy"
    )
    assert entry_argv == ["compaction-proxy"]
    assert entry_argv[0] in PYPROJECT["project"]["scripts"]
    assert _parser().parse_args(cmd_argv).command == "serve"
    builder_runs = " ".join(r.args for r in _runs(df.stages[0]))
    assert "compaction-proxy --version" in builder_runs, "smoke-test the installed script"


# ----------------------------------------------------------------------------- tiktoken


def test_tiktoken_encodings_are_baked_in_at_build_time(df: Dockerfile) -> None:
    final_cache = df.final.env().get("TIKTOKEN_CACHE_DIR")
    assert final_cache and final_cache.startswith("/"), "runtime needs TIKTOKEN_CACHE_DIR"
    fetched = False
    for stage in df.stages:
        for run in _runs(stage):
            fetches = [f"get_encoding('{name}')" for name in ("o200k_base", "cl100k_base")]
            if all(fetch in run.args for fetch in fetches):
                cache = stage.env_before(run.line).get("TIKTOKEN_CACHE_DIR")
                assert cache == final_cache, (
                    f"line {run.line}: encodings are fetched into {cache!r} but the runtime "
                    f"reads {final_cache!r}"
                )
                # And the proxy's own offline loader must find them there (sha256-verified).
                assert "EncodingLoader" in run.args and "include_default=False" in run.args
                fetched = True
    assert fetched, "no RUN fetches o200k_base and cl100k_base into TIKTOKEN_CACHE_DIR"


# ----------------------------------------------------------------------------- runtime shape


def test_runs_as_a_fixed_non_root_user_before_the_command(df: Dockerfile) -> None:
    final = df.final
    users = final.all("USER")
    assert users, "the runtime stage must switch to a non-root USER"
    user = users[-1]
    uid, _, gid = user.args.partition(":")
    assert uid not in ("root", "0") and gid not in ("root", "0"), f"USER {user.args}"
    assert uid.isdigit() and int(uid) >= 1000, "a fixed numeric uid (runAsNonRoot can verify it)"
    for command in _final_command(final):
        assert user.line < command.line, "USER must come before CMD/ENTRYPOINT"
    created = " ".join(r.args for r in _runs(final))
    assert f"--uid {uid}" in created, f"uid {uid} must be created with useradd"
    if gid:
        assert f"--gid {gid}" in created


def test_environment_of_the_runtime(df: Dockerfile) -> None:
    env = df.final.env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["COMPACTION_PROXY_SERVER__HOST"] == "0.0.0.0"
    assert env["PATH"].startswith("/opt/venv/bin:")
    config_path = env["COMPACTION_PROXY_CONFIG"]
    assert config_path.startswith("/etc/") and config_path.endswith(".yaml")
    # The image ships a valid default at that path, so `docker run IMAGE` starts as it is.
    shipped = [c.flags_and_rest()[1].split() for c in df.final.all("COPY")]
    assert ["config.example.yaml", config_path] in shipped


def test_store_path_is_on_a_volume_owned_by_the_user(df: Dockerfile) -> None:
    final = df.final
    store_path = PurePosixPath(final.env()["COMPACTION_PROXY_STORE__PATH"])
    volumes = []
    for volume in final.all("VOLUME"):
        volumes += volume.exec_form() or volume.args.split()
    assert volumes, "declare a VOLUME for the checkpoints"
    assert any(store_path.is_relative_to(v) for v in volumes), (store_path, volumes)
    uid = final.all("USER")[-1].args.split(":")[0]
    volume_line = final.all("VOLUME")[0].line
    chowned = [
        run
        for run in _runs(final)
        if run.line < volume_line and re.search(rf"chown {uid}\S* /data", run.args)
    ]
    assert chowned, "chown the volume directory to the user before VOLUME (else it is root's)"


def test_exposes_the_default_port(df: Dockerfile) -> None:
    exposed = [p.split("/")[0] for e in df.final.all("EXPOSE") for p in e.args.split()]
    assert exposed == [str(Settings().server.port)] == ["8080"]


def test_healthcheck_hits_healthz_with_short_timeouts(df: Dockerfile) -> None:
    checks = df.final.all("HEALTHCHECK")
    assert len(checks) == 1
    flags, rest = checks[0].flags_and_rest()
    assert rest.startswith("CMD ")
    argv = Instruction("CMD", rest[4:], checks[0].line).exec_form()
    assert argv is not None, "HEALTHCHECK CMD must be exec form"
    code = healthcheck_python(argv)
    compile(code, "<healthcheck>", "exec")
    assert "/healthz" in code and "127.0.0.1" in code
    # The request's own timeout must be shorter than Docker's, or a hang is reported late.
    request_timeout = float(re.search(r"timeout=(\d+(?:\.\d+)?)", code).group(1))  # type: ignore[union-attr]
    docker_timeout = float(flags["timeout"].rstrip("s"))
    assert request_timeout < docker_timeout <= 10
    assert {"interval", "retries", "start-period"} <= set(flags)


def test_signals_reach_the_server(df: Dockerfile) -> None:
    stop = df.final.all("STOPSIGNAL")
    assert not stop or stop[-1].args == "SIGTERM", "uvicorn drains on SIGTERM"
    for command in _final_command(df.final):
        assert command.exec_form() is not None, f"line {command.line}: use exec form"
        assert "sh" not in (command.exec_form() or [""])[0], "no shell wrapper as PID 1"


def test_oci_labels(df: Dockerfile) -> None:
    labels = " ".join(label.args for label in df.final.all("LABEL"))
    for key in ("title", "description", "version", "licenses", "revision", "created"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert f'licenses="{PYPROJECT["project"]["license"]}"' in labels


# ----------------------------------------------------------------------------- lint basics


def test_hadolint_style_basics(df: Dockerfile) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert ":latest" not in text
    assert not re.search(r"(?m)^\s*ADD\s+https?://", text), "ADD <url>: use a verified download"
    for stage in df.stages:
        for workdir in stage.all("WORKDIR"):
            assert workdir.args.startswith("/"), "WORKDIR must be absolute (DL3000)"
        for run in _runs(stage):
            assert "sudo " not in run.args
            assert not re.search(r"(^|&&|;)\s*cd\s", run.args), "use WORKDIR, not cd (DL3003)"
            if re.search(r"apt-get\s+install", run.args):
                assert "--no-install-recommends" in run.args, f"line {run.line} (DL3015)"
                assert "rm -rf /var/lib/apt/lists" in run.args, f"line {run.line} (DL3009)"
            if "apk add" in run.args:
                assert "--no-cache" in run.args, f"line {run.line} (DL3019)"


# ----------------------------------------------------------------------------- build context


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        parts = PurePosixPath(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        bodies = (body, body.replace("**/", ""))
        if any(fnmatch.fnmatch(p, b) for p in prefixes for b in bodies):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_what_the_build_copies_and_drops_the_rest(df: Dockerfile) -> None:
    patterns = dockerignore_patterns()
    for stage in df.stages:
        for copy in stage.all("COPY"):
            flags, rest = copy.flags_and_rest()
            if "from" in flags:
                continue
            for source in rest.split()[:-1]:
                assert (REPO_ROOT / source).exists(), f"COPY {source}: no such file"
                assert not _ignored(source, patterns), f".dockerignore drops {source}"
    for unwanted in (".git", ".venv", ".venv-py312", "data/checkpoints.db", ".env", "tests",
                     "bench/results", ".pytest_cache", "proxy/__pycache__/x.pyc"):  # fmt: skip
        assert _ignored(unwanted, patterns), f".dockerignore must exclude {unwanted}"
