"""Claude Code itself, headless, as a test client: find or install it, run a session, read it.

What Claude Code 2.1.332 does against a server at ``ANTHROPIC_BASE_URL`` (observed against the
fake Messages upstream, ``tests/fakes/messages``, on this machine):

Install and run. ``npm install @anthropic-ai/claude-code@2.1.332`` into a prefix brings two
packages (the wrapper and ``@anthropic-ai/claude-code-linux-x64``, a 400 MB native build; no
Node needed to run it) and links ``node_modules/.bin/claude``. Headless:
``claude -p "<task>" --dangerously-skip-permissions --output-format stream-json --verbose
--max-turns N`` with ``ANTHROPIC_BASE_URL`` at the server root (no ``/v1``), a dummy
``ANTHROPIC_API_KEY``, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` and, as root,
``IS_SANDBOX=1``. It writes its state under ``$HOME`` (``.claude.json``, ``.claude/projects/``),
and its scratch files under ``$TMPDIR`` (``claude-<uid>/``, ``cc-socks/``), so each session
gets a HOME and a TMPDIR of its own. ``stream-json`` prints one JSON event a line: ``init``,
the assistant/user messages, ``status`` (``compacting``), ``compact_boundary`` (with
``compact_metadata.trigger``, ``pre_tokens``, ``post_tokens``) and a final ``result``
(``terminal_reason``, ``num_turns``, ``api_error_status``, ``modelUsage.<model>.contextWindow``).

What it sends. Only ``POST /v1/messages?beta=true``: no ``count_tokens``, no ``/v1/models``,
nothing else, with nonessential traffic off (without that setting it also probes ``HEAD
/api/hello`` on the base URL, and carries on after a 404). Always ``stream: true``. Headers:
``x-api-key``, ``anthropic-version: 2023-06-01``, ``anthropic-beta``, ``x-app: cli``, ``user-agent:
claude-cli/2.1.332 (external, sdk-cli)``, ``x-claude-code-session-id``,
``anthropic-dangerous-direct-browser-access: true`` and the SDK's ``x-stainless-*``. A body
(for a model name it does not know, e.g. ``local-model``; redacted)::

    {"model": "local-model", "max_tokens": 32000, "stream": true,
     "thinking": {"type": "adaptive", "display": "omitted"},
     "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
     "output_config": {"effort": "high"},
     "metadata": {"user_id": "{\"device_id\":\"<hex>\",\"account_uuid\":\"\",
                              \"session_id\":\"<uuid>\"}"},
     "system": [
       {"type": "text",
        "text": "x-anthropic-billing-header: cc_version=2.1.332.<3 hex>; cc_entrypoint=sdk-cli;"},
       {"type": "text", "text": "You are a Claude agent, built on ...",
        "cache_control": {"type": "ephemeral"}},
       {"type": "text", "text": "<6.7k chars of instructions>",
        "cache_control": {"type": "ephemeral"}}],
     "tools": [<12 tools, 31.6k chars: Agent, Bash, Edit, ListAgents, Read, ReportFindings,
               ScheduleWakeup, Skill, ToolSearch, Workflow, Write, and DeferredToolPlaceholder
               with "defer_loading": true>],
     "messages": [
       {"role": "user", "content": [
         {"type": "text", "text": "<system-reminder>attribution ...</system-reminder>"},
         {"type": "text", "text": "<the task>"}]},
       {"role": "system", "content": "# Environment\n... working directory, date, skills ..."},
       {"role": "assistant", "content": [
         {"type": "thinking", "thinking": "", "signature": "<as received>"},
         {"type": "text", "text": "..."},
         {"type": "tool_use", "id": "...", "name": "Bash", "input": {...}}]},
       {"role": "user", "content": [
         {"type": "tool_result", "tool_use_id": "...", "content": "...", "is_error": false,
          "cache_control": {"type": "ephemeral"}}]}]}

So: three breakpoints, two on system blocks and one on the newest ``tool_result`` (on the very
first request the third sits on the ``role: "system"`` message instead, which is a list of one
text block with ``cache_control`` then and a plain string on every later request). The
``anthropic-beta`` list has seven items: ``claude-code-20250219``,
``interleaved-thinking-2025-05-14``, ``context-management-2025-06-27``,
``mid-conversation-tool-changes-2026-07-01``, ``thinking-token-count-2026-05-13``,
``advanced-tool-use-2025-11-20``, ``effort-2025-11-24``. Thinking blocks come back byte for byte
(empty text, the signature as sent). System block 0's ``cc_version`` suffix changes when the
conversation's start changes (after a compaction). The issue's description holds, with these
corrections: the ``role: "system"`` messages (the environment, later "Today's date is ...",
deferred-tool notices, even after the newest user message) come with the
``mid-conversation-tool-changes`` beta and only for some models. For ``claude-sonnet-4-5`` there
is none (the environment is in a 28k-char system block), thinking is ``{"type": "enabled",
"budget_tokens": 31999, "display": "omitted"}``, there are five betas, and the window is 200,000;
``claude-sonnet-4-5[1m]`` adds ``context-1m-2025-08-07`` and assumes 1,000,000. With no
``--model`` it asks for ``claude-opus-5-5`` with ``max_tokens: 128000`` (an eighth beta,
``per-turn-control-2026-07-01``).

Windows. An unknown model name gets ``contextWindow: 1000000`` and ``maxOutputTokens: 32000``.
It cannot be told a 64k window: ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` and ``--autocompact`` have a
floor of 100k (smaller values read as 100k), ``CLAUDE_CODE_MAX_CONTEXT_TOKENS`` applies only with
``DISABLE_COMPACT`` (compaction off altogether). So against a 64k server its own auto-compact
never fires before the server refuses.

Refusals (80-step Bash session, ``fake-loop: steps=80 lines=120``, about 2.1k tokens a step, 64k
window, ``max_tokens`` 32000; ``python -m tests.support.claude_code baseline`` reruns it). With
Anthropic's "prompt is too long: N tokens > M maximum" it compacts *reactively*: it sends the
conversation minus its newest turn with a summary instruction ("CRITICAL: Respond with TEXT
ONLY. ... Your task is to create a detailed summary of the conversation so far ..."), then
restarts from ``[user: "This session is being continued ..." + the summary, system: date, the
newest assistant turn kept verbatim (thinking and signature included), its tool_result]``;
``compact_boundary.trigger`` says ``auto`` all the same. 3 refusals and 3 compactions in 80
steps, and it finishes: 87 requests in 8-10 s on two shared cores. With
``DISABLE_AUTO_COMPACT=1`` the first refusal ends it: the request carrying step 26's result is
refused, ``terminal_reason: "prompt_too_long"``, exit code 1. llama.cpp's
``exceed_context_size_error`` (7 refusals: its summary request is refused too, and trimmed),
vLLM's older "maximum context length" wording (25 refusals, 9 compactions: vLLM counts the
32000 output tokens against the window) and a 413 (Anthropic's ``request_too_large``, 5
refusals) are recognised the same way, but *not* vLLM's current renderer text ("You passed N
input tokens ... the model's context length is only W tokens"): it sends the request three
times, drops a feature it suspects (the deferred-tool search), three more times, and stops at
step 11 with ``terminal_reason: "api_error"``. A preserved-thinking rejection ("The block is
bound to a different conversation", the fake's ``thinking_binding: enforce``) of the kept turn
after its own compaction is retried without the thinking; the session still finishes.

Installing reaches the npm registry, so it is part of the set-up, never of a test:
``scripts/test-deps`` runs ``python -m tests.support.claude_code install`` once, into
:func:`cache_dir`; a test that needs Claude Code and does not find it fails, saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "2.1.332"
PACKAGE = "@anthropic-ai/claude-code"
BINARY_ENV = "CLAUDE_CODE_BIN"
"""An explicit ``claude`` to use (any version; the tests were written against :data:`VERSION`)."""
CACHE_ENV = "COMPACTION_PROXY_TEST_CACHE"
"""Where tests keep programs they install (default ``~/.cache/compaction-proxy-tests``)."""
INSTALL_TIMEOUT = 600.0
DEFAULT_MODEL = "local-model"
STEP_ID = re.compile(r"^toolu_fake_(\d+)_\d+_\d+$")
NATIVE_BUILDS = frozenset(
    {("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "x86_64"), ("darwin", "arm64")}
)
"""(system, machine) pairs :data:`PACKAGE` ships a native build for that these tests can run on
(it also has Windows builds; the test helpers are POSIX-only)."""


class Unavailable(RuntimeError):
    """Claude Code cannot be found or installed here; the message says why."""


def cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    base = Path(explicit) if explicit else Path.home() / ".cache" / "compaction-proxy-tests"
    return base / "claude-code"


def _cached_binary() -> Path:
    return cache_dir() / "node_modules" / ".bin" / "claude"


def version_of(binary: Path) -> str | None:
    """``claude --version``'s number, or None when it does not run."""
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cache_dir())},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.match(r"\s*(\S+)", done.stdout) if done.returncode == 0 else None
    return found.group(1) if found else None


def find_binary() -> Path | None:
    """The ``CLAUDE_CODE_BIN`` binary, else the cache's install of :data:`VERSION`."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise Unavailable(f"{BINARY_ENV}={explicit} is not an executable file")
        return path
    cached = _cached_binary()
    if cached.exists() and version_of(cached) == VERSION:
        return cached
    return None


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes must not install at once
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(timeout: float = INSTALL_TIMEOUT) -> Path:
    """``npm install`` :data:`PACKAGE` at :data:`VERSION` into :func:`cache_dir`."""
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(
            f"Claude Code is not installed and npm is not on PATH to install it; install Node.js "
            f"and npm, or set {BINARY_ENV} to a claude binary"
        )
    with _install_lock():
        found = find_binary()
        if found is not None:
            return found
        directory = cache_dir()
        try:
            done = subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(directory),
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    f"{PACKAGE}@{VERSION}",
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(
                f"npm install {PACKAGE}@{VERSION} did not finish in {timeout:.0f}s"
            ) from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-600:]
            raise Unavailable(f"npm install {PACKAGE}@{VERSION} failed: {tail}")
        binary = _cached_binary()
        if version_of(binary) != VERSION:
            raise Unavailable(
                f"npm installed {PACKAGE}@{VERSION} but {binary} does not run here (no native "
                "build for this platform?)"
            )
        return binary


def ensure_binary() -> Path:
    """The binary to run, installing it when absent; :class:`Unavailable` says why not."""
    return find_binary() or install()


def not_installable() -> str | None:
    """Why Claude Code cannot be had on this machine at all, or None when it can.

    Only this is a reason to skip: a machine with no native build, or no npm to install one,
    can never run these tests. One that could install it but has not fails instead
    (:func:`require_binary`), so a run that tested nothing is never green by accident."""
    if os.environ.get(BINARY_ENV) or _cached_binary().exists():
        return None  # given or installed: run it (and fail if it does not work)
    system, machine = platform.system(), platform.machine()
    if (system.lower(), machine.lower()) not in NATIVE_BUILDS:
        return (
            f"Claude Code {VERSION} has no native build for {system} {machine} that these tests "
            f"run (Linux or macOS on x86_64 or arm64); set {BINARY_ENV} to a claude binary"
        )
    if shutil.which("npm") is None:
        return (
            "npm is not on PATH, so Claude Code cannot be installed here: install Node.js and "
            f"npm (scripts/test-deps does, with apt-get, as root) or set {BINARY_ENV}"
        )
    return None


def binary_or_skip() -> Path:
    """For tests: skipped (saying why) where Claude Code cannot be installed, else
    :func:`require_binary`."""
    import pytest

    reason = not_installable()
    if reason is not None:
        pytest.skip(reason)
    return require_binary()


def require_binary() -> Path:
    """For tests: the installed binary, or a failure saying how to install it.

    Never an install: nothing downloads at test time. ``scripts/test-deps`` (part of the
    README's test command) installs it ahead of the run."""
    import pytest

    try:
        found = find_binary()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    if found is None:
        pytest.fail(
            f"Claude Code {VERSION} is not installed in {cache_dir()}: run scripts/test-deps "
            "(or `python -m tests.support.claude_code install`), or set "
            f"{BINARY_ENV} to a claude binary",
            pytrace=False,
        )
    return found


# --------------------------------------------------------------------------- sessions


def loop_prompt(steps: int, lines: int = 120) -> str:
    """The task that makes the fake script an agent loop of ``steps`` Bash calls."""
    return (
        f"fake-loop: steps={steps} lines={lines}. Run each command the tool calls ask for, in "
        "this directory, until the task says it is done."
    )


@dataclass
class Session:
    """One ``claude -p`` run: its exit, its ``stream-json`` events, and what they add up to."""

    argv: list[str]
    returncode: int
    seconds: float
    events: list[dict[str, Any]]
    stderr: str
    workdir: Path
    home: Path
    timed_out: bool = False
    unparsed: list[str] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any]:
        """The final ``result`` event ({} when Claude Code died before printing it)."""
        found = [e for e in self.events if e.get("type") == "result"]
        return found[-1] if found else {}

    @property
    def terminal_reason(self) -> str | None:
        return self.result.get("terminal_reason")

    @property
    def compactions(self) -> list[dict[str, Any]]:
        """``compact_metadata`` of each of Claude Code's own compactions."""
        return [
            e.get("compact_metadata", {})
            for e in self.events
            if e.get("type") == "system" and e.get("subtype") == "compact_boundary"
        ]

    @property
    def context_window(self) -> int | None:
        """The window Claude Code assumed for the session's model."""
        usage = self.result.get("modelUsage") or {}
        windows = [v.get("contextWindow") for v in usage.values() if isinstance(v, dict)]
        return windows[0] if windows else None

    def tool_results(self) -> list[tuple[str, str]]:
        """(tool_use_id, content text) of every tool result Claude Code sent back."""
        out = []
        for event in self.events:
            message = event.get("message") if event.get("type") == "user" else None
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out.append((str(block.get("tool_use_id")), _text(block.get("content"))))
        return out

    @property
    def steps_completed(self) -> int:
        """The highest step of the fake's loop whose tool call Claude Code answered."""
        steps = [int(m.group(1)) for tid, _ in self.tool_results() if (m := STEP_ID.match(tid))]
        return max(steps, default=0)

    def describe(self) -> str:
        """A line for assertion messages."""
        return (
            f"exit {self.returncode}, {self.seconds:.1f}s, terminal_reason={self.terminal_reason}, "
            f"turns={self.result.get('num_turns')}, steps={self.steps_completed}, "
            f"compactions={len(self.compactions)}, result={str(self.result.get('result'))[:200]!r}"
            + (", TIMED OUT" if self.timed_out else "")
            + (f", stderr tail={self.stderr[-300:]!r}" if self.returncode and self.stderr else "")
        )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def session_env(
    base_url: str,
    home: Path,
    *,
    api_key: str = "sk-ant-test-dummy",
    disable_auto_compact: bool = False,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment: nothing of the caller's (no real key, no proxy) but PATH."""
    scratch = home / "tmp"  # its per-directory scratch and sockets, else under /tmp
    scratch.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "SHELL": shutil.which("bash") or "/bin/bash",
        "NO_PROXY": "127.0.0.1,localhost",
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_API_KEY": api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "IS_SANDBOX": "1",  # --dangerously-skip-permissions is refused as root without it
    }
    if disable_auto_compact:
        env["DISABLE_AUTO_COMPACT"] = "1"
    env.update(extra or {})
    return env


def run_session(
    binary: Path,
    base_url: str,
    prompt: str,
    *,
    workdir: Path,
    home: Path | None = None,
    model: str = DEFAULT_MODEL,
    max_turns: int = 400,
    timeout: float = 900.0,
    disable_auto_compact: bool = False,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Session:
    """``claude -p prompt`` against ``base_url`` (the server root), run in ``workdir``.

    The process runs in a session of its own, so a timeout kills it and the shells it started.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    home = home or workdir.parent / f"{workdir.name}-home"
    home.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "-p",
        prompt,
        "--model",
        model,
        "--dangerously-skip-permissions",
        "--output-format",
        "stream-json",
        "--verbose",
        "--max-turns",
        str(max_turns),
        *extra_args,
    ]
    environment = session_env(base_url, home, disable_auto_compact=disable_auto_compact, extra=env)
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=workdir,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    seconds = time.monotonic() - started
    events: list[dict[str, Any]] = []
    unparsed: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            unparsed.append(line)
    return Session(
        argv, process.returncode, seconds, events, stderr, workdir, home, timed_out, unparsed
    )


def baseline(
    binary: Path,
    *,
    steps: int,
    window: int,
    styles: Sequence[str],
    binding: str,
    disable_auto_compact: bool,
) -> list[str]:
    """One session per refusal style against a fresh fake: the lines :func:`main` prints."""
    import tempfile

    from tests.support.messages_upstream import MessagesUpstreamServer, cache_share

    lines = []
    with tempfile.TemporaryDirectory(prefix="claude-code-baseline-") as scratch:
        root = Path(scratch)
        for style in styles:
            server = MessagesUpstreamServer(root / f"{style}.log", context_window=window)
            server.start()
            try:
                server.control(refusal_style=style, thinking_binding=binding)
                session = run_session(
                    binary,
                    server.base_url,
                    loop_prompt(steps),
                    workdir=root / f"{style}-work",
                    disable_auto_compact=disable_auto_compact,
                )
                events = server.events()
                kinds = [e["type"] for e in events]
                share = cache_share([e["usage"] for e in events if e["type"] == "answered"])
                lines.append(
                    f"{style}: {session.describe()}, requests={len(server.requests())}, "
                    f"refused={kinds.count('refused')}, rejected={kinds.count('rejected')}, "
                    f"cache-read share={share.share:.1%}"
                )
            finally:
                server.stop()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``install`` prints the binary's path; ``baseline`` runs the 80-step session against the
    fake once per refusal style (no proxy) and prints what happened."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.support.claude_code")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install")
    run = commands.add_parser("baseline")
    run.add_argument("--steps", type=int, default=80)
    run.add_argument("--window", type=int, default=65_536)
    run.add_argument("--styles", nargs="+", default=["anthropic"])
    run.add_argument("--binding", default="off", choices=["off", "record", "enforce"])
    run.add_argument("--disable-auto-compact", action="store_true")
    args = parser.parse_args(argv)
    try:
        binary = ensure_binary()
    except Unavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 1
    if args.command == "install":
        print(binary)
        return 0
    for line in baseline(
        binary,
        steps=args.steps,
        window=args.window,
        styles=args.styles,
        binding=args.binding,
        disable_auto_compact=args.disable_auto_compact,
    ):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
