"""A fake Anthropic Messages upstream (``/v1/messages``) that enforces what the real API does.

It is what the chat fake (:mod:`tests.fakes.upstream`) is for the OpenAI routes: a real server
on 127.0.0.1 that records every request byte for byte and refuses what a real server would
refuse, so a test learns on the wire whether what a client or the proxy sent would have been
accepted. One module a job: :mod:`.prompt` (units, token counts, digests), :mod:`.cache`
(prompt caching by breakpoints), :mod:`.rules` (structure and tool pairing), :mod:`.signing`
(signed thinking, preserved-thinking binding), :mod:`.errors` (error shapes and overflow
refusals), :mod:`.model` (the scripted policies), :mod:`.render` (JSON and SSE), :mod:`.app`
(routes and settings).

Run it alone with ``python -m tests.fakes.messages --port 8003 [--context-window 65536]``; the
process handle for tests is :class:`tests.support.messages_upstream.MessagesUpstreamServer`.
"""
