"""Chat completions (``POST /v1/chat/completions``) as a wire format: the core's own form, so
lifting is the identity and lowering splices the pipeline's messages back into ``messages``."""

from ._format import CHAT, ChatFormat

__all__ = ["CHAT", "ChatFormat"]
