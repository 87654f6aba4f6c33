from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import struct
from pathlib import Path

import pytest
import tiktoken.load

from proxy.compaction import (
    CharacterEstimatorTokenizer,
    EncodingLoader,
    ImagePricing,
    TiktokenTokenizer,
    TokenizerProvider,
)
from proxy.compaction.encodings import BLOB_URL, EncodingUnavailable, cache_key
from proxy.compaction.images import image_size, image_size_from_url
from proxy.compaction.tool_schema import render_functions

from .helpers import call, tool

COOKBOOK = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that "
        "translates corporate jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more "
        "bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean "
        "for the client deliverable.",
    },
]


def test_cookbook_counts_match_openai_usage(
    o200k: TiktokenTokenizer, cl100k: TiktokenTokenizer
) -> None:
    # OpenAI's cookbook reports these prompt_tokens for this example from the API itself:
    # 124 for gpt-4o / gpt-4o-mini (o200k_base), 129 for gpt-4 / gpt-3.5-turbo (cl100k_base).
    assert o200k.count_messages(COOKBOOK) == 124
    assert cl100k.count_messages(COOKBOOK) == 129


def test_message_envelope_by_hand(o200k: TiktokenTokenizer) -> None:
    enc = o200k.encoding
    n = lambda text: len(enc.encode(text))  # noqa: E731
    assert o200k.count_message({"role": "user", "content": "hello world"}) == 3 + n("user") + n(
        "hello world"
    )
    assert o200k.count_message({"role": "user", "name": "bob", "content": "hi"}) == 3 + n(
        "user"
    ) + n("bob") + 1 + n("hi")
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}],
    }
    assert o200k.count_message(parts) == 3 + n("user") + n("a b") + n("c")
    msg = call("c1", name="get_weather", args='{"city":"Paris"}')
    assert (
        o200k.count_message(msg)
        == 3 + n("assistant") + n("get_weather") + n('{"city":"Paris"}') + 3
    )
    assert o200k.count_message(tool("call_abc", "sunny")) == 3 + n("tool") + n("sunny")
    assert o200k.count_messages([]) == 3  # reply priming


def test_unknown_fields_are_counted_conservatively(o200k: TiktokenTokenizer) -> None:
    base = {"role": "assistant", "content": "x"}
    with_extra = {**base, "reasoning_content": "thinking hard"}
    assert o200k.count_message(with_extra) == o200k.count_message(base) + o200k.count_text(
        "thinking hard"
    )


def test_estimator_is_four_chars_a_token(estimator: CharacterEstimatorTokenizer) -> None:
    assert estimator.count_text("") == 0
    assert estimator.count_text("abcd") == 1
    assert estimator.count_text("abcde") == 2
    assert estimator.count_message({"role": "user", "content": "a" * 40}) == 3 + 1 + 10
    assert estimator.name == "char-estimator"


# ------------------------------------------------------------------ images


def png(width: int, height: int) -> bytes:
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + b"IHDR"
        + struct.pack(">II", width, height)
        + b"\x08\x02\x00\x00\x00"
        + b"\x00" * 8
    )


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x00" * 9
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00" * 6


def webp_vp8x(width: int, height: int) -> bytes:
    body = (
        b"VP8X"
        + struct.pack("<I", 10)
        + b"\x00" * 4
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
    )
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def webp_vp8l(width: int, height: int) -> bytes:
    w, h = width - 1, height - 1
    bits = w | (h << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("maker", [png, jpeg, gif, webp_vp8x, webp_vp8l, webp_vp8])
def test_image_headers(maker) -> None:
    assert image_size(maker(1024, 768)) == (1024, 768)
    assert image_size_from_url(data_url(maker(300, 2000))) == (300, 2000)


def test_jpeg_with_large_exif_before_frame() -> None:
    exif = b"\xff\xe1" + struct.pack(">H", 60_002) + b"\x00" * 60_000
    data = b"\xff\xd8" + exif + jpeg(640, 480)[2:]
    assert image_size_from_url(data_url(data, "image/jpeg")) == (640, 480)


def test_unreadable_images() -> None:
    assert image_size(b"not an image") is None
    assert image_size_from_url("https://example.com/cat.png") is None
    assert image_size_from_url("data:image/png,notbase64") is None


@pytest.mark.parametrize(
    ("size", "detail", "expected"),
    [
        ((1024, 1024), "high", 765),  # 768x768 -> 2x2 tiles
        ((1024, 1024), "low", 85),
        ((2048, 4096), "high", 1105),  # -> 1024x2048 -> 768x1536 -> 2x3 tiles
        ((512, 512), "high", 255),
        ((100, 100), "high", 255),
        ((4096, 8192), "auto", 1105),
    ],
)
def test_image_tile_pricing(size: tuple[int, int], detail: str, expected: int) -> None:
    assert ImagePricing().tokens_for_size(*size, detail) == expected


def test_image_parts_in_messages(o200k: TiktokenTokenizer) -> None:
    text_only = {"role": "user", "content": [{"type": "text", "text": "what is this"}]}
    base = o200k.count_message(text_only)

    def with_image(url: str, detail: str | None = None) -> dict[str, object]:
        image: dict[str, str] = {"url": url}
        if detail:
            image["detail"] = detail
        return {
            "role": "user",
            "content": [
                *text_only["content"],  # type: ignore[misc]
                {"type": "image_url", "image_url": image},
            ],
        }

    assert o200k.count_message(with_image(data_url(png(1024, 1024)))) == base + 765
    assert o200k.count_message(with_image(data_url(png(1024, 1024)), "low")) == base + 85
    assert o200k.count_message(with_image("https://x/y.png")) == base + 765
    custom = TiktokenTokenizer(o200k.encoding, image_pricing=ImagePricing(unknown_size_tokens=1))
    assert custom.count_message(with_image("https://x/y.png")) == base + 1


# ------------------------------------------------------------------ tools schema

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "The city and state, e.g. San Francisco, CA",
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}


def test_tools_rendering_and_plausible_count(o200k: TiktokenTokenizer) -> None:
    text = render_functions([WEATHER_TOOL["function"]])  # type: ignore[list-item]
    assert "type get_current_weather = (_: {" in text
    assert 'unit?: "celsius" | "fahrenheit",' in text
    assert "location: string," in text
    count = o200k.count_tools([WEATHER_TOOL])
    assert count == o200k.count_text(text) + 9
    # OpenAI bills roughly 60-90 tokens for this definition; stay in that neighbourhood.
    assert 50 <= count <= 100
    assert o200k.count_tools(None) == 0
    assert o200k.count_tools([]) == 0
    legacy = o200k.count_tools([WEATHER_TOOL["function"]])  # type: ignore[list-item]
    assert legacy == count


def test_nested_schema_renders(o200k: TiktokenTokenizer) -> None:
    fn = {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"id": {"type": "integer"}},
                        "required": ["id"],
                    },
                },
                "mode": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        },
    }
    text = render_functions([fn])
    assert "items?: {\n  id: number,\n}[]," in text
    assert "mode?: string | null," in text


# ------------------------------------------------------------------ cache


def test_count_cache_hits_on_repeated_messages(o200k: TiktokenTokenizer) -> None:
    tok = TiktokenTokenizer(o200k.encoding, cache_size=2)
    m1, m2, m3 = ({"role": "user", "content": f"message {i}"} for i in range(3))
    tok.count_message(m1)
    tok.count_message(dict(reversed(list(m1.items()))))  # key order does not matter
    assert (tok.cache.hits, tok.cache.misses) == (1, 1)
    tok.count_message(m2)
    tok.count_message(m3)  # evicts m1 (bound 2)
    assert len(tok.cache) == 2
    tok.count_message(m1)
    assert tok.cache.misses == 4


# ------------------------------------------------------------------ offline loading


def test_loader_never_touches_the_network(
    monkeypatch: pytest.MonkeyPatch, encodings_dir: Path
) -> None:
    def boom(*_a: object, **_k: object) -> bytes:
        raise AssertionError("network path reached")

    monkeypatch.setattr(tiktoken.load, "read_file", boom)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", boom)
    loader = EncodingLoader(directories=[encodings_dir], include_env=False, include_default=False)
    enc = loader.load("cl100k_base")
    assert enc.encode("hello world") == [15339, 1917]
    with pytest.raises(EncodingUnavailable):
        loader.load("gpt2")  # needs data-gym files: refused, never fetched
    with pytest.raises(EncodingUnavailable):
        loader.load("no_such_encoding")


def test_loader_accepts_plain_name_and_rejects_bad_hash(
    tmp_path: Path, encodings_dir: Path
) -> None:
    source = encodings_dir / cache_key(BLOB_URL.format(name="cl100k_base"))
    shutil.copy(source, tmp_path / "cl100k_base.tiktoken")
    loader = EncodingLoader(directories=[tmp_path], include_env=False, include_default=False)
    assert loader.load("cl100k_base").name == "cl100k_base"

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / cache_key(BLOB_URL.format(name="o200k_base"))).write_bytes(b"aGk= 0\n")
    bad_loader = EncodingLoader(directories=[bad], include_env=False, include_default=False)
    with pytest.raises(EncodingUnavailable):
        bad_loader.load("o200k_base")


def test_loader_search_order_uses_env(tmp_path: Path) -> None:
    loader = EncodingLoader(
        directories=[tmp_path / "a"],
        environ={"TIKTOKEN_CACHE_DIR": "/t", "DATA_GYM_CACHE_DIR": "/d"},
    )
    dirs = [str(d) for d in loader.search_dirs()]
    assert dirs[:3] == [str(tmp_path / "a"), "/t", "/d"]
    assert dirs[3].endswith("data-gym-cache")


def test_offline_fallback_uses_estimator_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loader = EncodingLoader(directories=[tmp_path], include_env=False, include_default=False)
    provider = TokenizerProvider(loader)
    with caplog.at_level(logging.WARNING, logger="proxy.compaction.tokenizer_provider"):
        first = provider.get("o200k_base")
        second = provider.get("o200k_base")
    assert isinstance(first, CharacterEstimatorTokenizer)
    assert first is second
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert provider.fallback_active
    assert provider.missing_encodings == frozenset({"o200k_base"})
    assert provider.fallback_uses == 2


def test_provider_builds_real_tokenizers(provider: TokenizerProvider) -> None:
    tok = provider.get("o200k_base")
    assert isinstance(tok, TiktokenTokenizer)
    assert provider.get("o200k_base") is tok
    assert not provider.fallback_active


def test_litellm_files_are_the_expected_ones(encodings_dir: Path) -> None:
    data = (encodings_dir / cache_key(BLOB_URL.format(name="o200k_base"))).read_bytes()
    assert (
        hashlib.sha256(data).hexdigest()
        == "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    )


def test_refresh_swaps_the_estimator_for_tiktoken_once_the_file_arrives(
    tmp_path: Path, encodings_dir: Path
) -> None:
    """The edge downloads missing encodings in the background, then calls refresh()."""
    from proxy.compaction import EncodingLoader, TokenizerProvider

    empty = tmp_path / "encodings"
    empty.mkdir()
    provider = TokenizerProvider(
        EncodingLoader(directories=[empty], include_env=False, include_default=False)
    )
    assert provider.get("o200k_base").name == "char-estimator"
    assert not provider.refresh("o200k_base")  # still nothing there
    for file in encodings_dir.iterdir():
        if file.is_file():
            shutil.copy(file, empty / file.name)
    assert provider.refresh("o200k_base")
    assert provider.get("o200k_base").name == "o200k_base"
    assert "o200k_base" not in provider.missing_encodings
