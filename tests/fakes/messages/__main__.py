"""``python -m tests.fakes.messages``: the fake Messages upstream under uvicorn."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.fakes.messages.app import Settings, create_app
from tests.fakes.messages.errors import REFUSAL_STYLES
from tests.fakes.messages.signing import BINDING_MODES


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.messages")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8003)
    parser.add_argument("--context-window", type=int, default=None)
    parser.add_argument("--refusal-style", choices=REFUSAL_STYLES, default="anthropic")
    parser.add_argument("--thinking-binding", choices=BINDING_MODES, default="off")
    parser.add_argument("--cache-min-tokens", type=int, default=None)
    parser.add_argument("--loop-steps", type=int, default=None, help="script a loop for all")
    parser.add_argument("--loop-lines", type=int, default=120)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    settings = Settings(
        context_window=args.context_window,
        refusal_style=args.refusal_style,
        thinking_binding=args.thinking_binding,
        loop_steps=args.loop_steps,
        loop_lines=args.loop_lines,
        record=not args.no_record,
    )
    if args.cache_min_tokens is not None:
        settings.cache_min_tokens = args.cache_min_tokens
    uvicorn.run(
        create_app(settings=settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
