"""Which requests' context edits the proxy applies itself: those of a format whose API has them
(Anthropic's ``context_management``), routed to an upstream that does not apply them
(``upstreams[].context_management``, docs/context-management.md)."""

from __future__ import annotations

from compaction_proxy.config import UpstreamSettings
from compaction_proxy.wire import ContextEdits, EditedView, View

from ._context import RequestContext


def context_edits(
    ctx: RequestContext, upstream: UpstreamSettings, view: View
) -> ContextEdits | None:
    """The edits of ``view``'s request for the proxy to apply before forwarding it to
    ``upstream``, or None: the request has none, or the upstream applies them (the body then
    goes with them as sent). Raises a 400 naming a malformed edit."""
    # hasattr first: a runtime protocol's isinstance walks the protocol on every call, and
    # every chat request (whose view has no edits) would pay that.
    if upstream.applies_context_management or not hasattr(view, "context_edits"):
        return None
    if not isinstance(view, EditedView):
        return None
    return view.context_edits(summarizer=ctx.state.flow.summarizer is not None)
