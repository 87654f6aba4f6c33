"""How many connections a slow client can hold, and for how long.

Not a test: it asserts nothing and writes a report. The proxy (``python -m compaction_proxy
serve``, default timeouts) runs with its open-file limit lowered to ``--nofile`` (1024, as
under ``ulimit -n 1024``) in front of the fake upstream; one client opens ``--connections``
(1,100) connections and sends nothing on them, or trickles a header a byte every 2 s. The
report gives how many of them the proxy keeps open, its open descriptors, whether a
legitimate request still succeeds, and when the held connections are closed (each is
watched until the proxy closes it, for at most ``--watch`` seconds).

    python -m bench.slow_clients [--connections 1100] [--nofile 1024] [--watch 90]
                                 [--out bench/results/slow-clients.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import resource
import selectors
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.support.servers import (
    ProxyServer,
    UpstreamServer,
    proxy_config,
    upstream_entry,
    write_config,
)


def hold(port: int, count: int, trickle: bool, watch: float) -> tuple[int, list[float], int]:
    """Opens ``count`` connections; returns how many were still open after all were made,
    the seconds each lived (closed by the proxy), and how many outlived ``watch``."""
    selector = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
        opened[sock] = time.monotonic()
        selector.register(sock, selectors.EVENT_READ)
    lived: list[float] = []
    header = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
    sent = 0
    last_trickle = 0.0
    deadline = time.monotonic() + watch
    still_open_after_opening = -1
    while opened and time.monotonic() < deadline:
        if still_open_after_opening < 0:
            still_open_after_opening = sum(1 for _ in _alive(selector, opened, lived, 0.0))
        for _ in _alive(selector, opened, lived, 0.5):
            pass
        if trickle and time.monotonic() - last_trickle >= 2.0 and sent < len(header):
            for sock in list(opened):
                with contextlib.suppress(OSError):
                    sock.send(header[sent : sent + 1])
            sent += 1
            last_trickle = time.monotonic()
    outlived = len(opened)
    for sock in opened:
        sock.close()
    return still_open_after_opening, lived, outlived


def _alive(
    selector: selectors.BaseSelector,
    opened: dict[socket.socket, float],
    lived: list[float],
    timeout: float,
) -> list[socket.socket]:
    """Reaps the connections the proxy closed; returns those still open."""
    for key, _ in selector.select(timeout):
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            data = b""
        if not data or b"HTTP/1.1" in data:
            lived.append(time.monotonic() - opened.pop(sock))
            selector.unregister(sock)
            sock.close()
    return list(opened)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=1100)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--watch", type=float, default=90.0)
    parser.add_argument("--out", default="bench/results/slow-clients.md")
    parser.add_argument(
        "--timeout-seen",
        type=float,
        default=30.0,
        help="a connection closed after this many seconds counts as timed out, before as evicted",
    )
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.connections + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections + 256), hard))

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    rows = []
    with tempfile.TemporaryDirectory(prefix="slow-clients-") as tmp:
        directory = Path(tmp)
        upstream = UpstreamServer(directory / "upstream.log").start()
        try:
            config = proxy_config(upstream_entry(upstream))
            config["store"] = {"backend": "memory"}
            path = write_config(directory / "proxy.yaml", config)
            for trickle in (False, True):
                proxy = ProxyServer(path, directory / "proxy.log", preexec_fn=lower).start()
                try:
                    assert proxy.proc is not None
                    rows.append(_run(proxy, args, trickle, proxy.proc.pid))
                finally:
                    proxy.stop()
        finally:
            upstream.stop()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Slow clients: connections held, and for how long",
        "",
        f"Run {when}, {os.cpu_count()} CPUs. `python -m bench.slow_clients "
        f"--connections {args.connections} --nofile {args.nofile}`: the proxy with default "
        f"timeouts and its open-file limit lowered to {args.nofile}; one client opens "
        f"{args.connections} connections.",
        "",
        "| client | connections held until a timeout | held for (s): min / median / max "
        "| closed at once to make room | proxy's open descriptors | a legitimate request "
        "| still open after the watch |",
        "|---|---:|---|---:|---:|---|---:|",
        *rows,
        "",
        "Before the client timeouts and the connection limit, all of them stayed open "
        "indefinitely and, past the open-file "
        "limit, a legitimate request failed with nothing logged.",
        "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)


def _run(proxy: ProxyServer, args: argparse.Namespace, trickle: bool, pid: int) -> str:
    """One table row: the slow client's connections held and closed, a legitimate request."""
    result: dict[str, tuple[int, list[float], int]] = {}

    def slow() -> None:
        result["held"] = hold(proxy.port, args.connections, trickle, args.watch)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(5)  # the slow client has opened its connections
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as http:
        try:
            status = str(http.get("/v1/models").status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
    thread.join()
    held, lived, outlived = result["held"]
    del held
    evicted = [t for t in lived if t < args.timeout_seen]
    timed_out = [t for t in lived if t >= args.timeout_seen]
    spread = (
        f"{min(timed_out):.1f} / {statistics.median(timed_out):.1f} / {max(timed_out):.1f}"
        if timed_out
        else "-"
    )
    client = "trickles a header byte every 2 s" if trickle else "sends nothing"
    return (
        f"| {client} | {len(timed_out)} | {spread} | {len(evicted)} | {fds} | {status} | "
        f"{outlived} |"
    )


if __name__ == "__main__":
    main()
