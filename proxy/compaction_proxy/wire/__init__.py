"""The wire: request bodies as bytes and as the routes read them, before anything is sent.

* ``_bodies``: a body read as a JSON object or a chat-completions request (400s that say
  what is wrong, in OpenAI's shape);
* ``_jsonspans``: where the members of a JSON object and the elements of one array sit in the
  client's bytes (a lexical scan, which also reads ``model`` from JSON orjson refuses);
* ``_forwarded``: :class:`ClientBody`, the client's bytes with one array (and a lowered
  output limit) spliced, which is what a compacted request goes upstream as;
* ``_multipart``: the ``model`` field of a multipart upload, read as the body arrives;
* :mod:`.format`: :class:`WireFormat`, what the edge needs to know about one API it compacts;
  :mod:`.registry`: the formats, listed once; :mod:`.chat` and :mod:`.responses`: the two
  formats (the Responses API's ``input`` items shown to the core as chat messages and mapped
  back; docs/responses.md); ``_openai``: what those two share;
* :mod:`.sse`: the one reader of server-sent events (the recall loop's held replies, the relay's
  event boundaries, the usage probe's kept bytes).
"""

from ._bodies import parse_chat_body, parse_json_object, validate_chat
from ._forwarded import ClientBody, lowered_limits
from ._jsonspans import (
    BOM,
    ObjectSpans,
    ScanError,
    decode_string,
    lenient_member,
    scan_array,
    scan_object,
)
from ._multipart import Field, FieldReader, Unreadable, boundary_of
from .format import (
    BEARER,
    Amendment,
    CallerKey,
    ContextEdits,
    EditedView,
    Headers,
    Lowered,
    LowerError,
    NativeRequest,
    PrefixCall,
    RefusalText,
    SummaryCall,
    SummaryReply,
    UpstreamAuth,
    UpstreamTraits,
    View,
    WindowOption,
    WireFormat,
)
from .registry import DEFAULT as DEFAULT_FORMAT
from .registry import api_names
from .registry import for_api as format_for_api
from .registry import for_body as format_for_body
from .registry import for_count_path as format_for_count_path
from .registry import for_path as format_for_path
from .registry import owner_of as format_owner_of
from .registry import under as format_under

__all__ = [
    "BEARER",
    "BOM",
    "DEFAULT_FORMAT",
    "Amendment",
    "CallerKey",
    "ClientBody",
    "ContextEdits",
    "EditedView",
    "Field",
    "FieldReader",
    "Headers",
    "LowerError",
    "Lowered",
    "NativeRequest",
    "ObjectSpans",
    "PrefixCall",
    "RefusalText",
    "ScanError",
    "SummaryCall",
    "SummaryReply",
    "Unreadable",
    "UpstreamAuth",
    "UpstreamTraits",
    "View",
    "WindowOption",
    "WireFormat",
    "api_names",
    "boundary_of",
    "decode_string",
    "format_for_api",
    "format_for_body",
    "format_for_count_path",
    "format_for_path",
    "format_owner_of",
    "format_under",
    "lenient_member",
    "lowered_limits",
    "parse_chat_body",
    "parse_json_object",
    "scan_array",
    "scan_object",
    "validate_chat",
]
