"""Command line: `serve` runs the proxy, `check-config` validates a file, `compact` compacts one.

One core, several faces: the CLI calls the same configuration loader, the same start-up checks
(compaction_proxy/config/preflight.py) and, for `compact`, the same compaction flow as the HTTP
edge, summarizer included, so what the command prints is what the server does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from compaction_proxy import __version__
from compaction_proxy.config import (
    CONFIG_ENV_VAR,
    ConfigError,
    Settings,
    effective_config,
    load_settings,
    override_server,
)
from compaction_proxy.http import ProxyError

if TYPE_CHECKING:
    from compaction_proxy.compaction import CompactionResult, CompactionSettings, Mode
    from compaction_proxy.engine import Compactor
    from compaction_proxy.wire import View, WireFormat


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description=(
            "OpenAI-compatible proxy that compacts chat-completions, Responses and Anthropic "
            "Messages requests in flight."
        ),
    )
    parser.add_argument("--version", action="version", version=f"compaction-proxy {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the proxy (the default command)")
    _add_serve_args(serve)

    comp = sub.add_parser(
        "compact",
        help="compact a chat-completions, Responses or Messages request from a JSON file and "
        "print the report",
    )
    comp.add_argument(
        "file", help="a chat-completions, Responses or Messages body, or a bare list of messages"
    )
    comp.add_argument("--model", "-m", help="model to budget for (default: the body's model)")
    comp.add_argument("--config", "-c", help=f"YAML config file (default: ${CONFIG_ENV_VAR})")
    comp.add_argument("--out", "-o", help="write the compacted request here as JSON")
    comp.add_argument(
        "--force", action="store_true", help="run the pipeline as if every trigger fired"
    )
    comp.add_argument(
        "--no-summarize",
        action="store_true",
        help="do not call the summarizer (summarization is skipped, later strategies stand in)",
    )
    comp.add_argument(
        "--archive",
        action="store_true",
        help="archive what compaction removes, as compaction.recall.enabled does, and print "
        "it (printed anyway when the configuration turns recall on)",
    )

    check = sub.add_parser(
        "check-config", help="validate a config file and print it, secrets masked"
    )
    check.add_argument("file", nargs="?", help=f"config file (default: ${CONFIG_ENV_VAR})")
    return parser


def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help=f"YAML config file (default: ${CONFIG_ENV_VAR})")
    parser.add_argument("--host", help="listen address (overrides server.host)")
    parser.add_argument("--port", type=int, help="listen port (overrides server.port)")
    parser.add_argument("--workers", type=int, help="worker processes (overrides server.workers)")


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version")
    ):
        args_list.insert(0, "serve")
    args = _parser().parse_args(args_list)
    try:
        if args.command == "check-config":
            return _check_config(args.file)
        if args.command == "compact":
            return _compact(args)
        return _serve(args)
    except ConfigError as error:
        print(f"compaction-proxy: {error}", file=sys.stderr)
        return 2


def _source(file: str | None) -> str:
    return file or os.environ.get(CONFIG_ENV_VAR) or "defaults"


def _load_checked(file: str | None, *, serving: bool = False) -> Settings:
    """The settings, refused with every problem the run would trip on
    (compaction_proxy/config/preflight.py); `serving`: what `serve` would refuse too."""
    from compaction_proxy.config import preflight
    from compaction_proxy.wire import api_names

    settings = load_settings(file)
    preflight.check(settings, source=_source(file), serving=serving, apis=api_names())
    return settings


def _check_config(file: str | None) -> int:
    settings = _load_checked(file, serving=True)
    print(yaml.safe_dump(effective_config(settings), sort_keys=False, allow_unicode=True), end="")
    print(f"# configuration is valid ({_source(file)})", file=sys.stderr)
    return 0


def _compact(args: argparse.Namespace) -> int:
    import orjson

    from compaction_proxy.compaction import Mode, build_view
    from compaction_proxy.compaction.chat_messages import tool_call_names
    from compaction_proxy.engine import Compactor
    from compaction_proxy.observability.report_text import render, render_archived
    from compaction_proxy.wire import DEFAULT_FORMAT, format_for_body, lowered_limits

    settings = _load_checked(args.config)
    if args.archive:
        settings = _with_recall(settings)
    try:
        with open(args.file, "rb") as handle:
            raw = handle.read()
        data = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError) as exc:
        print(f"compaction-proxy: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    body: object = {"messages": data} if isinstance(data, list) else data
    wire = format_for_body(body) if isinstance(body, dict) else DEFAULT_FORMAT
    if not isinstance(body, dict) or (
        wire is DEFAULT_FORMAT and not isinstance(body.get("messages"), list)
    ):
        print(
            f"compaction-proxy: {args.file} must hold a chat-completions, Responses or Messages "
            "body, or a list of messages",
            file=sys.stderr,
        )
        return 2
    model = args.model or body.get("model")
    body = {**body, "model": model if isinstance(model, str) and model else "gpt-4o"}
    view, problem = _lift(wire, body)
    if view is None:
        print(f"compaction-proxy: {args.file}: {problem}", file=sys.stderr)
        return 2
    compactor = Compactor(settings)
    mode = Mode.FORCE if args.force else Mode.NORMAL
    try:
        result, notes = asyncio.run(
            _run_flow(settings, compactor, view.chat, mode, len(raw), not args.no_summarize, wire)
        )
    except ProxyError as error:  # a model no upstream serves
        print(f"compaction-proxy: {args.file}: {error.message}", file=sys.stderr)
        return 2
    finally:
        compactor.close()
    facts = compactor.catalog.facts_for(body["model"])
    tokenizer = compactor.tokenizers.get(facts.encoding)
    groups = build_view(view.chat["messages"], tokenizer)
    print(render(result.report, groups))
    if notes:
        print("\nsummarizer:", "; ".join(notes))
    if compactor.settings_for(body["model"])[0].recall.enabled:
        names = {
            call_id: name
            for message in view.chat["messages"]
            for call_id, name in tool_call_names(message).items()
        }
        print()
        print(render_archived(result.archived, tokenizer.count_message, names))
    if args.out:
        # The compacted member (and any output limit lowered to fit the window) in the body's
        # own format, every other field as it was.
        limits = lowered_limits(body, wire.output_limits, result.report.output_limit)
        compacted = {**body, **limits, wire.items: list(view.lower(result.messages).items)}
        with open(args.out, "wb") as handle:
            handle.write(orjson.dumps(compacted, option=orjson.OPT_INDENT_2))
        print(f"\nwrote {args.out}")
    return 0


def _with_recall(settings: Settings) -> Settings:
    """``settings`` with ``compaction.recall.enabled`` on, in every model's block too
    (`compact --archive`: see what recall would archive without editing the file)."""

    def on(block: CompactionSettings) -> CompactionSettings:
        return block.model_copy(
            update={"recall": block.recall.model_copy(update={"enabled": True})}
        )

    models = {
        pattern: model
        if model.compaction is None
        else model.model_copy(update={"compaction": on(model.compaction)})
        for pattern, model in settings.models.items()
    }
    return settings.model_copy(update={"compaction": on(settings.compaction), "models": models})


def _lift(wire: WireFormat, body: dict[str, Any]) -> tuple[View | None, str]:
    """The chat-shaped view the pipeline takes (compaction_proxy/wire/format.py), or None and
    why not."""
    held_by = wire.held_by(body)
    if held_by is not None:
        return None, f"{held_by}: the history is on the server, which the proxy cannot see"
    try:
        return wire.lift(body), ""
    except ProxyError as error:
        return None, error.message


async def _run_flow(
    settings: Settings,
    compactor: Compactor,
    body: dict[str, Any],
    mode: Mode,
    size_hint: int,
    summarize: bool,
    wire: WireFormat,
) -> tuple[CompactionResult, list[str]]:
    """One request's compaction by the server's own flow, without a checkpoint store.

    The summarizer is the server's (`summarization` block: provider, model, prompts, limits).
    The command is a client with no key of its own, so the summarizer's upstream must have an
    `api_key` (or be `keyless: true`); otherwise it is not called, as with `--no-summarize`,
    rather than sent a request that can only be refused. No store: the command reads and
    writes no checkpoints, so the same file always compacts the same way.

    Returns the result and what to say about the summarizer (its calls, or why there were none).
    """
    from compaction_proxy.engine import FlowRequest, build_flow
    from compaction_proxy.http import ALLOWED
    from compaction_proxy.upstream import Router, make_transport

    model: str = body["model"]
    upstream = Router(settings.upstreams).for_model(model)
    notes: list[str] = []
    transport = make_transport(settings.server)
    try:
        flow = build_flow(settings, compactor, None, transport)
        summarizer = flow.summarizer
        if summarizer is None:
            summarize = False
        elif not summarize:
            notes.append("not called (--no-summarize)")
        else:
            target = summarizer.upstream_for(model)
            if target.api_key is None and not target.keyless:
                notes.append(
                    f"not called: upstream {target.name!r} has no api_key (the command line "
                    "has no client key to pass on); set one, or keyless: true for a server "
                    "that needs none"
                )
                summarize = False
        done = await flow.run(
            FlowRequest(
                body,
                mode,
                size_hint=size_hint,
                credential=None,
                caller_key=None,
                upstream_name=upstream.name,
                persist=False,
                summarize=summarize,
                wire=wire,  # as the body's route: e.g. the transcript form for a Responses body
                spend=ALLOWED,  # the operator's own command: the key is theirs to spend
            )
        )
    finally:
        await transport.aclose()
    if summarize and summarizer is not None:
        for (name, called, outcome), count in sorted(summarizer.stats.calls.items()):
            notes.append(f"{name}/{called}: {outcome}" + (f" x{count}" if count > 1 else ""))
        if not notes:
            notes.append("no call needed")
    return done.result, notes


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from compaction_proxy.app import create_app
    from compaction_proxy.config import preflight
    from compaction_proxy.http import client_limits, configure_logging, logging_config
    from compaction_proxy.http.protocol import FIELD_LIMIT_ENV
    from compaction_proxy.wire import api_names

    settings = load_settings(args.config)
    overrides = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if v is not None
    }
    settings = override_server(
        settings, overrides, {"host": "--host", "port": "--port", "workers": "--workers"}
    )
    preflight.check(settings, source=_source(args.config), serving=True, apis=api_names())
    server = settings.server
    configure_logging(server.log_level)
    common: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "loop": "uvloop",
        # httptools with bounded headers (431 past server.max_header_bytes / _field_bytes)
        "http": "compaction_proxy.http.protocol:BoundedHttpToolsProtocol",
        "h11_max_incomplete_event_size": server.max_header_bytes,
        "lifespan": "on",
        "access_log": False,
        # Applied again by uvicorn in every worker process (spawned: they inherit no handlers).
        "log_config": logging_config(server.log_level),
        "server_header": False,
        # Nothing reads the client's address, so no middleware rewrites it from X-Forwarded-*.
        "proxy_headers": False,
        "timeout_graceful_shutdown": server.graceful_shutdown_seconds,
        "timeout_keep_alive": server.client_keepalive_timeout,
        "backlog": 4096,
    }
    # The protocol reads these in every worker (compaction_proxy/http/client_limits.py).
    os.environ[FIELD_LIMIT_ENV] = str(server.max_header_field_bytes)
    env = client_limits.ENV
    os.environ[env["header_timeout"]] = str(server.client_header_timeout)
    os.environ[env["body_timeout"]] = str(server.client_body_timeout)
    if server.max_client_connections is not None:
        os.environ[env["max_connections"]] = str(server.max_client_connections)
    connections = server.max_client_connections or client_limits.derived_max_connections()
    logging.getLogger("compaction_proxy.cli").info(
        "client connections: at most %d per worker%s",
        connections,
        "" if server.max_client_connections else " (derived from the open-file limit)",
    )
    if server.workers > 1:
        # Workers import the app themselves, so they must find the same config file.
        if args.config:
            os.environ[CONFIG_ENV_VAR] = os.path.abspath(args.config)
        uvicorn.run(
            "compaction_proxy.app:create_app_from_env",
            factory=True,
            workers=server.workers,
            **common,
        )
    else:
        uvicorn.run(create_app(settings), **common)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
