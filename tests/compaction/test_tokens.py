from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import shutil
import struct
from pathlib import Path

import pytest
import tiktoken.load

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    EncodingLoader,
    ImagePricing,
    TiktokenTokenizer,
    TokenizerProvider,
    encodings,
)
from compaction_proxy.compaction.encodings import (
    BLOB_URL,
    EncodingUnavailable,
    cache_key,
    check_bundled,
)
from compaction_proxy.compaction.images import image_size, image_size_from_url
from compaction_proxy.compaction.tool_schema import render_functions

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


def test_loader_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: object, **_k: object) -> bytes:
        raise AssertionError("network path reached")

    monkeypatch.setattr(tiktoken.load, "read_file", boom)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", boom)
    loader = EncodingLoader(include_env=False, include_default=False)
    enc = loader.load("cl100k_base")
    assert enc.encode("hello world") == [15339, 1917]
    with pytest.raises(EncodingUnavailable):
        loader.load("gpt2")  # needs data-gym files: refused, never fetched
    with pytest.raises(EncodingUnavailable):
        loader.load("no_such_encoding")


def test_builtin_encodings_come_from_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encodings_dir: Path
) -> None:
    """A fresh machine: no tiktoken cache anywhere, no network; counts are still exact."""

    def boom(*_a: object, **_k: object) -> bytes:
        raise AssertionError("network path reached")

    monkeypatch.setattr(tiktoken.load, "read_file", boom)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", boom)
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    loader = EncodingLoader(environ={"TIKTOKEN_CACHE_DIR": str(empty)}, include_default=False)
    assert loader.search_dirs()[0] == encodings_dir
    o200k = loader.load("o200k_base")
    cl100k = loader.load("cl100k_base")
    assert o200k.encode("hello world") == [24912, 2375]
    assert cl100k.encode("hello world") == [15339, 1917]
    assert (o200k.n_vocab, cl100k.n_vocab) == (200_019, 100_277)
    assert loader.sources == {
        "o200k_base": encodings_dir / "o200k_base.tiktoken.gz",
        "cl100k_base": encodings_dir / "cl100k_base.tiktoken.gz",
    }


def test_check_bundled_is_the_build_steps_verdict(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert check_bundled() == 0
    printed = capsys.readouterr().out
    assert "o200k_base: ok, 200019 tokens, sha256-verified" in printed
    assert "cl100k_base: ok, 100277 tokens" in printed
    # A broken install (the package's data directory gone) is a failed build, named.
    monkeypatch.setattr(encodings, "BUNDLED_PACKAGE", "no_such_package_for_encodings")
    assert check_bundled() == 1
    printed = capsys.readouterr().out
    assert "o200k_base: no verified local file" in printed
    assert "cl100k_base: no verified local file" in printed


def test_loader_accepts_plain_gzipped_and_cache_key_names_and_rejects_bad_hashes(
    tmp_path: Path, tiktoken_cache: Path
) -> None:
    raw = (tiktoken_cache / cache_key(BLOB_URL.format(name="cl100k_base"))).read_bytes()
    plain, zipped = tmp_path / "plain", tmp_path / "zipped"
    plain.mkdir()
    zipped.mkdir()
    (plain / "cl100k_base.tiktoken").write_bytes(raw)
    (zipped / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(raw))
    for directory in (plain, zipped, tiktoken_cache):
        loader = EncodingLoader(
            directories=[directory],
            include_bundled=False,
            include_env=False,
            include_default=False,
        )
        assert loader.load("cl100k_base").encode("hello world") == [15339, 1917]
        assert loader.sources["cl100k_base"].parent == directory

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / cache_key(BLOB_URL.format(name="o200k_base"))).write_bytes(b"aGk= 0\n")
    (bad / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(b"aGk= 0\n"))
    (bad / "cl100k_base.tiktoken.gz").write_bytes(b"not gzip at all")
    mangled = bytearray(gzip.compress(raw))
    mangled[20:40] = b"\xff" * 20  # a corrupt deflate stream: zlib.error, refused like the rest
    truncated = tmp_path / "mangled"
    truncated.mkdir()
    (truncated / "cl100k_base.tiktoken.gz").write_bytes(bytes(mangled))
    (truncated / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(raw)[:100])  # cut short
    for name in ("cl100k_base", "o200k_base"):
        with pytest.raises(EncodingUnavailable):
            EncodingLoader(
                directories=[truncated],
                include_bundled=False,
                include_env=False,
                include_default=False,
            ).load(name)
    bad_loader = EncodingLoader(
        directories=[bad], include_bundled=False, include_env=False, include_default=False
    )
    with pytest.raises(EncodingUnavailable):
        bad_loader.load("o200k_base")
    with pytest.raises(EncodingUnavailable):
        bad_loader.load("cl100k_base")


def test_a_gzip_bomb_is_refused_before_it_is_inflated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(encodings, "MAX_FILE_BYTES", 1024)
    (tmp_path / "o200k_base.tiktoken.gz").write_bytes(gzip.compress(b"\0" * 4096))
    loader = EncodingLoader(
        directories=[tmp_path], include_bundled=False, include_env=False, include_default=False
    )
    with pytest.raises(EncodingUnavailable):
        loader.locate("o200k_base", BLOB_URL.format(name="o200k_base"), None)


def test_loader_search_order(tmp_path: Path, encodings_dir: Path) -> None:
    loader = EncodingLoader(
        directories=[tmp_path / "a"],
        environ={"TIKTOKEN_CACHE_DIR": "/t", "DATA_GYM_CACHE_DIR": "/d"},
    )
    dirs = [str(d) for d in loader.search_dirs()]
    assert dirs[:4] == [str(tmp_path / "a"), str(encodings_dir), "/t", "/d"]
    assert dirs[4].endswith("data-gym-cache")
    assert len(dirs) == 5


def _no_files(tmp_path: Path) -> EncodingLoader:
    """A loader with nothing to read: a broken install on a machine without a cache."""
    return EncodingLoader(
        directories=[tmp_path], include_bundled=False, include_env=False, include_default=False
    )


def test_offline_fallback_uses_estimator_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = TokenizerProvider(_no_files(tmp_path))
    with caplog.at_level(logging.WARNING, logger="compaction_proxy.compaction.tokenizer_provider"):
        first = provider.get("o200k_base")
        second = provider.get("o200k_base")
        provider.get("o200k_bsae")
    assert isinstance(first, CharacterEstimatorTokenizer)
    assert first is second
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    # Each warning says what to do: a builtin missing is a broken install, a custom name needs
    # a file (or is a typo of a builtin).
    assert "'o200k_base'" in warnings[0] and "reinstall compaction-proxy" in warnings[0]
    assert "'o200k_bsae'" in warnings[1] and "encodings_dir" in warnings[1]
    assert provider.fallback_active
    assert provider.missing_encodings == frozenset({"o200k_base", "o200k_bsae"})
    assert provider.fallback_uses == 3
    assert provider.states() == {"o200k_base": True, "o200k_bsae": True}


def test_prepare_builds_without_counting_estimator_use(tmp_path: Path) -> None:
    provider = TokenizerProvider(EncodingLoader(include_env=False, include_default=False))
    provider.prepare(["o200k_base", "cl100k_base", "o200k_bsae", "o200k_base"])
    assert provider.states() == {"o200k_base": False, "cl100k_base": False, "o200k_bsae": True}
    assert provider.fallback_uses == 0  # no request was counted yet
    assert provider.get("o200k_base").name == "o200k_base"
    assert provider.get("o200k_bsae").name == "char-estimator"
    assert provider.fallback_uses == 1


def test_provider_builds_real_tokenizers(provider: TokenizerProvider) -> None:
    tok = provider.get("o200k_base")
    assert isinstance(tok, TiktokenTokenizer)
    assert provider.get("o200k_base") is tok
    assert not provider.fallback_active


def test_bundled_files_are_the_expected_ones(tiktoken_cache: Path) -> None:
    for name, sha in (
        ("o200k_base", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"),
        ("cl100k_base", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"),
    ):
        data = (tiktoken_cache / cache_key(BLOB_URL.format(name=name))).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha


def test_refresh_swaps_the_estimator_for_tiktoken_once_the_file_arrives(
    tmp_path: Path, tiktoken_cache: Path
) -> None:
    """The edge downloads missing encodings in the background, then calls refresh()."""
    empty = tmp_path / "encodings"
    empty.mkdir()
    provider = TokenizerProvider(_no_files(empty))
    assert provider.get("o200k_base").name == "char-estimator"
    assert not provider.refresh("o200k_base")  # still nothing there
    for file in tiktoken_cache.iterdir():
        shutil.copy(file, empty / file.name)
    assert provider.refresh("o200k_base")
    assert provider.get("o200k_base").name == "o200k_base"
    assert "o200k_base" not in provider.missing_encodings
    assert provider.states()["o200k_base"] is False
