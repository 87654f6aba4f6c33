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
        return _serve(args)
    except ConfigError as error:
        print(f"compaction-proxy: {error}", file=sys.stderr)
        return 2


def _check_config(file: str | None) -> int:
    settings = load_settings(file)
    print(yaml.safe_dump(effective_config(settings), sort_keys=False, allow_unicode=True), end="")
    print(
        f"# configuration is valid ({file or os.environ.get(CONFIG_ENV_VAR) or 'defaults'})",
        file=sys.stderr,
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app
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
        "http": "httptools",
        "lifespan": "on",
        "access_log": False,
        "log_config": None,
        "server_header": False,
        "timeout_graceful_shutdown": server.graceful_shutdown_seconds,
        "timeout_keep_alive": 75,
        "backlog": 4096,
    }
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
