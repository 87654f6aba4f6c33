"""The wire: request bodies as bytes and as the routes read them, before anything is sent.

* ``_bodies``: a body read as a JSON object or a chat-completions request (400s that say
  what is wrong, in OpenAI's shape);
* ``_jsonspans``: where the members of a JSON object and the elements of one array sit in the
  client's bytes (a lexical scan, which also reads ``model`` from JSON orjson refuses);
* ``_forwarded``: :class:`ClientBody`, the client's bytes with one array spliced, which is
  what a compacted request goes upstream as;
* ``_multipart``: the ``model`` field of a multipart upload, read as the body arrives;
* :mod:`.responses`: the Responses API's ``input`` items shown to the core as chat messages
  and mapped back (a package of its own; docs/responses.md).
"""

from ._bodies import parse_chat_body, parse_json_object, validate_chat
from ._forwarded import ClientBody
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

__all__ = [
    "BOM",
    "ClientBody",
    "Field",
    "FieldReader",
    "ObjectSpans",
    "ScanError",
    "Unreadable",
    "boundary_of",
    "decode_string",
    "lenient_member",
    "parse_chat_body",
    "parse_json_object",
    "scan_array",
    "scan_object",
    "validate_chat",
]
