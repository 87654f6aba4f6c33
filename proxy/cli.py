"""Command line: `serve` runs the proxy, `check-config` validates a file.

One core, several faces: the CLI calls the same configuration loader and (for `compact`)
the same pipeline as the HTTP edge, so what the command prints is what the server does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import yaml

from proxy import __version__
from proxy.config import CONFIG_ENV_VAR, ConfigError, effective_config, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="OpenAI-compatible proxy that compacts chat-completions requests in flight.",
    )
    parser.add_argument("--version", action="version", version=f"compaction-proxy {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the proxy (the default command)")
    _add_serve_args(serve)

    comp = sub.add_parser(
        "compact",
        help="compact a chat-completions request from a JSON file and print the report",
    )
    comp.add_argument("file", help="a chat-completions body, or a bare list of messages")
    comp.add_argument("--model", "-m", help="model to budget for (default: the body's model)")
    comp.add_argument("--config", "-c", help=f"YAML config file (default: ${CONFIG_ENV_VAR})")
    comp.add_argument("--out", "-o", help="write the compacted request here as JSON")
    comp.add_argument(
        "--force", action="store_true", help="run the pipeline as if every trigger fired"
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


def _check_config(file: str | None) -> int:
    from proxy.summaries.summarizer import validate_summarization_config

    settings = load_settings(file)
    if settings.summarization.enabled:
        validate_summarization_config(settings)
    print(yaml.safe_dump(effective_config(settings), sort_keys=False, allow_unicode=True), end="")
    print(
        f"# configuration is valid ({file or os.environ.get(CONFIG_ENV_VAR) or 'defaults'})",
        file=sys.stderr,
    )
    return 0


def _compact(args: argparse.Namespace) -> int:
    import orjson

    from proxy.compaction import Mode, build_view
    from proxy.engine.compactor import Compactor
    from proxy.report_text import render

    settings = load_settings(args.config)
    try:
        with open(args.file, "rb") as handle:
            data = orjson.loads(handle.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        print(f"compaction-proxy: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    body = {"messages": data} if isinstance(data, list) else data
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        print(
            f"compaction-proxy: {args.file} must hold a chat-completions body or a list of "
            "messages",
            file=sys.stderr,
        )
        return 2
    body = {**body, "model": args.model or body.get("model") or "gpt-4o"}
    from proxy.compaction import validate_messages

    issue = validate_messages(body["messages"])
    if issue is not None:
        print(f"compaction-proxy: {args.file}: {issue.message}", file=sys.stderr)
        return 2
    compactor = Compactor(settings)
    result = compactor.run_sync(body, Mode.FORCE if args.force else Mode.NORMAL)
    facts = compactor.catalog.facts_for(body["model"])
    view = build_view(body["messages"], compactor.tokenizers.get(facts.encoding))
    print(render(result.report, view))
    if args.out:
        compacted = {**body, "messages": result.messages}
        with open(args.out, "wb") as handle:
            handle.write(orjson.dumps(compacted, option=orjson.OPT_INDENT_2))
        print(f"\nwrote {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app
    from proxy.http_protocol import FIELD_LIMIT_ENV
    from proxy.logs import configure_logging

    settings = load_settings(args.config)
    server = settings.server
    overrides = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if v is not None
    }
    if overrides:
        settings = settings.model_copy(update={"server": server.model_copy(update=overrides)})
        server = settings.server
    configure_logging(server.log_level)
    common = {
        "host": server.host,
        "port": server.port,
        "loop": "uvloop",
        # httptools with bounded headers (431 past server.max_header_bytes / _field_bytes)
        "http": "proxy.http_protocol:BoundedHttpToolsProtocol",
        "h11_max_incomplete_event_size": server.max_header_bytes,
        "lifespan": "on",
        "access_log": False,
        "log_config": None,
        "server_header": False,
        "timeout_graceful_shutdown": server.graceful_shutdown_seconds,
        "timeout_keep_alive": 75,
        "backlog": 4096,
    }
    os.environ[FIELD_LIMIT_ENV] = str(server.max_header_field_bytes)
    if server.workers > 1:
        # Workers import the app themselves, so they must find the same config file.
        if args.config:
            os.environ[CONFIG_ENV_VAR] = os.path.abspath(args.config)
        uvicorn.run("proxy.app:create_app_from_env", factory=True, workers=server.workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
