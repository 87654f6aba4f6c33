"""GET /v1/compaction/archive/{id}: an archived original, for people (docs/http-api.md).

The placeholders and summaries compaction forwards name recall ids (``[recall id
rq72amlvh4xx]``); with ``compaction.recall`` on, the originals behind them are kept in the
checkpoint store (compaction_proxy/checkpoints/_archive.py). This route reads one back as
JSON: an original's message as the pipeline saw it, or a span's member ids.

It is authenticated like every ``/v1`` path (``server.api_keys``, in the app) and reads only
the caller's own end user's archive: the namespace its credential (``Authorization`` or
``x-api-key``, as the compacted routes read it), its ``X-Compaction-Tenant`` and the per-user
fields it names as query parameters (``?user=...``, ``?safety_identifier=...``: the body fields
of those names; a Messages request's ``metadata.user_id`` is ``user``) make, exactly as the
requests that archived it made it. An id of another key, tenant or end user is answered
exactly like one that was never archived, a 404, so the route tells nobody what others have
archived. A store that cannot answer is a 503; with recall off everywhere the route is a 404.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import orjson

from compaction_proxy.checkpoints import (
    SCOPE_FIELDS,
    ArchivedOriginal,
    StoreBudget,
    StoreUnavailable,
    archive_namespace,
)
from compaction_proxy.compaction.archive import ID_PATTERN
from compaction_proxy.http import ProxyError, Scope, send_bytes

from ._context import RequestContext
from ._outcome import RouteOutcome
from ._requests import credential, tenant

ARCHIVE_PATH = "/v1/compaction/archive/"
_SHOWN_ID = 40


async def archive_entry(ctx: RequestContext) -> RouteOutcome:
    """The archived entry the path names, as JSON (see the module docstring)."""
    scope, send = ctx.scope, ctx.send
    if scope["method"] != "GET":
        raise ProxyError(
            405, f"use GET for {ARCHIVE_PATH}{{id}}", "invalid_request_error", "method_not_allowed"
        )
    archive = ctx.state.archive
    recall_id = scope["path"][len(ARCHIVE_PATH) :]
    if archive is None:
        raise ProxyError(
            404,
            "the archive is off: set compaction.recall.enabled to keep what compaction removes",
            "invalid_request_error",
            "not_found",
        )
    if ID_PATTERN.fullmatch(recall_id) is None:
        raise _not_found(recall_id)
    namespace = archive_namespace(credential(ctx), tenant(scope), end_user(scope))
    try:
        with StoreBudget(ctx.state.settings.store.request_budget):
            found = await archive.fetch(namespace, [recall_id])
    except StoreUnavailable:
        # What failed (a host, a path) is the store's log line; the caller learns only that.
        raise ProxyError(
            503, "archive not available right now", "server_error", "archive_unavailable"
        ) from None
    entry = found.get(recall_id)
    if entry is None:
        raise _not_found(recall_id)
    payload: dict[str, Any] = {"id": recall_id, "kind": entry.kind}
    if isinstance(entry, ArchivedOriginal):
        payload["message"] = entry.message
        if entry.tool is not None:
            payload["tool"] = entry.tool
    else:
        payload["members"] = list(entry.members)
    payload["created_at"] = entry.created_at
    await send_bytes(send, 200, orjson.dumps(payload), ctx.response_headers)
    return RouteOutcome(None, 200)


def end_user(scope: Scope) -> dict[str, str]:
    """The per-user fields the query names (``user``, ``safety_identifier``; the first value
    of each), as a request body would carry them."""
    query = scope.get("query_string", b"").decode("latin-1")
    found = parse_qs(query, keep_blank_values=True)
    return {name: found[name][0] for name in SCOPE_FIELDS if name in found}


def _not_found(recall_id: str) -> ProxyError:
    shown = recall_id if len(recall_id) <= _SHOWN_ID else recall_id[:_SHOWN_ID] + "…"
    return ProxyError(
        404,
        f"no archived content for id {shown!r} (ids are per API key, X-Compaction-Tenant and "
        "end user, named by the user and safety_identifier query parameters as the requests "
        "named it; they expire after compaction.recall.ttl)",
        "invalid_request_error",
        "not_found",
    )
