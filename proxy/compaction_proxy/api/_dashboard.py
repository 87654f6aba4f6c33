"""GET /dashboard (one self-contained HTML page) and GET /dashboard/data (its JSON).

The page polls the data every 2 s. When `server.api_keys` is set both need one of the keys:
`Authorization: Bearer <key>` or `X-Api-Key`, and for the page alone also `?key=<key>` so a
browser can open it; the page then drops the key from the address bar and sends it as a
header. The check is the one every side route passes (compaction_proxy/app.py,
compaction_proxy/http/_auth.py); a page refused gets :func:`send_unauthorized_page`. The key is
never written into the page, and the access log prints the path without the query string.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from compaction_proxy.http import Send, send_bytes

router = APIRouter()

# The page loads nothing from elsewhere: its script and styles are inline, its charts SVG.
_PAGE_HEADERS = {
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
}
_DATA_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}

_UNAUTHORIZED_PAGE = b"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>compaction-proxy: key required</title></head>
<body style="font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;line-height:1.5">
<h1>A key is required</h1>
<p>This proxy has <code>server.api_keys</code> set. Open the dashboard as
<code>/dashboard?key=&lt;one of the keys&gt;</code>, or send
<code>Authorization: Bearer &lt;key&gt;</code>.</p></body></html>"""


@cache
def page() -> bytes:
    return resources.files("compaction_proxy.api").joinpath("static/dashboard.html").read_bytes()


async def send_unauthorized_page(send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    """The 401 a browser gets for the page: a short HTML note on how to open it."""
    page_headers = [(k.encode(), v.encode()) for k, v in _PAGE_HEADERS.items()]
    await send_bytes(
        send,
        401,
        _UNAUTHORIZED_PAGE,
        [*page_headers, (b"www-authenticate", b"Bearer"), *headers],
        content_type=b"text/html; charset=utf-8",
    )


@router.get("/dashboard", include_in_schema=False)
async def dashboard(request: Request) -> Response:
    return Response(page(), media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


@router.get("/dashboard/data", include_in_schema=False)
async def dashboard_data(request: Request) -> Response:
    telemetry = request.app.state.proxy.telemetry
    return Response(
        orjson.dumps(telemetry.snapshot()), media_type="application/json", headers=_DATA_HEADERS
    )
