"""The multipart ``model`` field reader (compaction_proxy/wire/_multipart.py): whatever the order of
the parts, however the body is cut into chunks, it finds the field's first occurrence exactly, and
what httpx (the SDK's transport) writes it reads."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compaction_proxy.wire import Field, FieldReader, Unreadable, boundary_of

BOUNDARY = "b0undary-Xy"
names = st.sampled_from(["model", "file", "language", "prompt", "modelx", "MODEL"])
MARKER = b"\r\n--" + BOUNDARY.encode()
# Values that look like framing: line breaks, dashes, the boundary itself; never a whole
# delimiter (a line break, two dashes and the boundary), which no part may contain.
values = (
    st.lists(
        st.sampled_from([b"a", b"\r\n", b"-", b"--", b"\r", b"\n", b"x" * 40, BOUNDARY.encode()]),
        max_size=12,
    )
    .map(b"".join)
    .filter(lambda value: (value + MARKER).find(MARKER) == len(value))
)


def form(parts: list[tuple[str, bytes, bool]], preamble: bytes) -> bytes:
    out = preamble
    for name, value, is_file in parts:
        out += f"--{BOUNDARY}\r\n".encode()
        disposition = f'form-data; name="{name}"' + ('; filename="f.bin"' if is_file else "")
        out += f"Content-Disposition: {disposition}\r\n".encode()
        if is_file:
            out += b"content-type: application/octet-stream\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + f"--{BOUNDARY}--\r\nepilogue".encode()


def read_in_chunks(body: bytes, cuts: list[int]) -> Field:
    reader = FieldReader(BOUNDARY.encode(), "model")
    points = sorted({min(c, len(body)) for c in cuts} | {len(body)})
    start = 0
    for end in points:
        found = reader.feed(body[start:end], last=end == len(body))
        start = end
        if found is not None:
            return found
    raise AssertionError("the reader never decided")


@given(
    st.lists(st.tuples(names, values, st.booleans()), max_size=6),
    st.sampled_from([b"", b"preamble text\r\n", b"\r\n"]),
    st.lists(st.integers(0, 400), max_size=8),
)
@settings(max_examples=500, deadline=None)
def test_the_first_model_field_is_found_however_the_body_arrives(
    parts: list[tuple[str, bytes, bool]], preamble: bytes, cuts: list[int]
) -> None:
    body = form(parts, preamble)
    expected = next((value for name, value, _ in parts if name == "model"), None)
    assert read_in_chunks(body, cuts) == Field(expected)


def test_what_httpx_writes_is_read() -> None:
    request = httpx.Request(
        "POST",
        "http://up.test/v1/audio/transcriptions",
        data={"language": "en", "model": "whisper-1"},
        files={"file": ("a.wav", b"RIFF\r\n--" + bytes(range(256)) * 64, "audio/wav")},
    )
    boundary = boundary_of(request.headers["content-type"].encode())
    assert boundary is not None
    reader = FieldReader(boundary, "model")
    body = request.read()
    # Decided before the file: the rest of an upload can stream on.
    found = None
    for at in range(0, len(body), 50):
        found = reader.feed(body[at : at + 50], last=at + 50 >= len(body))
        if found is not None:
            assert at < 400
            break
    assert found == Field(b"whisper-1")


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        (b"multipart/form-data; boundary=abc", b"abc"),
        (b'Multipart/Form-Data; charset=utf-8; BOUNDARY="a b;c"', b"a b;c"),
        (b"multipart/mixed; boundary=abc", None),
        (b"application/json", None),
        (b"multipart/form-data", None),
    ],
)
def test_boundary_of(content_type: bytes, boundary: bytes | None) -> None:
    assert boundary_of(content_type) == boundary


@pytest.mark.parametrize(
    "body",
    [
        f"--{BOUNDARY}junk\r\n\r\n".encode() + b"x",
        f"--{BOUNDARY}\r\n".encode() + b"X-Long: " + b"h" * 20_000,
    ],
    ids=["text-after-delimiter", "endless-headers"],
)
def test_broken_framing_is_unreadable(body: bytes) -> None:
    with pytest.raises(Unreadable):
        FieldReader(BOUNDARY.encode(), "model").feed(body, last=False)


def test_a_body_without_the_field_or_cut_short_has_none() -> None:
    whole = form([("file", b"data", True)], b"")
    assert FieldReader(BOUNDARY.encode(), "model").feed(whole, last=True) == Field(None)
    cut = form([("model", b"whisper-1", False)], b"")[:20]
    reader = FieldReader(BOUNDARY.encode(), "model")
    assert reader.feed(cut, last=False) is None
    assert reader.feed(b"", last=True) == Field(None)
