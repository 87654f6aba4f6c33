"""The faster counting paths give tiktoken's counts, the prompt bound never undercounts, and
shared serializations give every pass the same bytes.

tiktoken stays the reference: every fast count here is compared with the loaded tiktoken
encoding (``encode_ordinary``) on generated text.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_proxy.compaction import TiktokenTokenizer
from compaction_proxy.compaction.canonical import canonical_bytes
from compaction_proxy.compaction.fast_bpe import SELF_CHECK, exact_counter
from compaction_proxy.compaction.prompt_bound import message_bound, prompt_bound
from tests.support.optional import require_or_skip

from .helpers import a, call, s, tool, u

# Text that exercises the pre-tokenizer: letters of many scripts, digits, whitespace runs,
# contractions, punctuation, emoji (with joiners and variation selectors), combining marks.
_PIECES = st.sampled_from(
    [
        "'s",
        "'LL",
        "'re",
        "'t",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        " \n ",
        "123",
        "4567",
        "abc",
        "ABC",
        "Hello",
        "wörld",
        "日本語",
        "中文",
        "한국어",
        "🙂",
        "👨‍👩‍👧",
        "❤️",
        "e\u0301",
        "\u0627\u0644",
        "\u00a0",
        "\u2028",
        "\u200b",
        "\u3000",
        "...",
        "->",
        "__init__",
        "{",
        '"',
        "\\",
        "<|endoftext|>",
        "0x1F",
        "3.14",
        "-",
        "_",
        "#",
        "@",
        "$",
        "%",
    ]
)
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(_PIECES, max_size=60).map("".join),
    st.tuples(st.sampled_from("a 9\n.🙂"), st.integers(0, 3000)).map(lambda p: p[0] * p[1]),
)


@pytest.fixture(scope="module")
def counters(o200k: TiktokenTokenizer, cl100k: TiktokenTokenizer) -> list[tuple[Any, Any]]:
    require_or_skip("bpe-openai", "bpe_openai")  # an optional accelerator
    pairs = []
    for tokenizer in (o200k, cl100k):
        counter = exact_counter(tokenizer.encoding)
        assert counter is not None, f"the self-check refused {tokenizer.name}"
        pairs.append((tokenizer.encoding, counter))
    return pairs


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_fast_counts_equal_tiktoken(counters: list[tuple[Any, Any]], text: str) -> None:
    for encoding, counter in counters:
        try:
            fast = counter(text)
        except UnicodeEncodeError:  # lone surrogates: the tokenizer falls back to tiktoken
            continue
        assert fast == len(encoding.encode_ordinary(text)), (encoding.name, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200))
def test_tokenizer_with_a_fast_counter_counts_like_without(
    counters: list[tuple[Any, Any]], text: str
) -> None:
    for encoding, counter in counters:
        plain = TiktokenTokenizer(encoding, cache_size=0)
        fast = TiktokenTokenizer(encoding, cache_size=0, counter=counter)
        message = {"role": "user", "name": "bob", "content": text}
        assert fast.count_text(text) == plain.count_text(text)
        assert fast.count_message(message) == plain.count_message(message)


def test_lone_surrogates_fall_back_to_tiktoken(counters: list[tuple[Any, Any]]) -> None:
    for encoding, counter in counters:
        plain = TiktokenTokenizer(encoding, cache_size=0)
        fast = TiktokenTokenizer(encoding, cache_size=0, counter=counter)
        text = "broken \ud800 surrogate \udfff end"
        with pytest.raises(UnicodeEncodeError):
            counter(text)
        assert fast.count_text(text) == plain.count_text(text) > 0


def _fake_bindings(monkeypatch: pytest.MonkeyPatch, count: Any, names: list[str]) -> None:
    package = types.ModuleType("bpe_openai")
    bindings = types.ModuleType("bpe_openai._bindings")
    bindings.supported_encodings = lambda: names  # type: ignore[attr-defined]
    bindings.tokenizer_for_encoding = lambda name: types.SimpleNamespace(count=count)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bpe_openai", package)
    monkeypatch.setitem(sys.modules, "bpe_openai._bindings", bindings)


def test_a_counter_that_disagrees_is_refused(
    monkeypatch: pytest.MonkeyPatch, o200k: TiktokenTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    reference = o200k.encoding
    # Right on everything but one string of the self-check: never handed out.
    odd = SELF_CHECK[-1]
    _fake_bindings(
        monkeypatch,
        lambda text: len(reference.encode_ordinary(text)) + (text == odd),
        ["o200k_base"],
    )
    assert exact_counter(reference) is None
    assert "disagrees with tiktoken" in caplog.text


def test_no_counter_without_the_package_or_the_encoding(
    monkeypatch: pytest.MonkeyPatch, o200k: TiktokenTokenizer
) -> None:
    _fake_bindings(monkeypatch, lambda text: len(o200k.encoding.encode_ordinary(text)), [])
    assert exact_counter(o200k.encoding) is None  # the package does not know the encoding
    monkeypatch.setitem(sys.modules, "bpe_openai", None)  # import fails: not installed
    monkeypatch.setitem(sys.modules, "bpe_openai._bindings", None)
    assert exact_counter(o200k.encoding) is None


# ------------------------------------------------------------------ the prompt bound

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # what orjson (the canonical form) can hold
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("refusal"), "refusal": TEXT}),
    st.fixed_dictionaries({"type": st.just("input_audio"), "input_audio": _JSON}),
    _JSON,
)
_CALL = st.fixed_dictionaries(
    {
        "id": st.text(max_size=12),
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.text(max_size=20), "arguments": TEXT}),
    }
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system", "x"])},
    optional={
        "content": st.one_of(st.none(), TEXT, st.lists(_PART, max_size=4)),
        "name": st.text(max_size=20),
        "tool_calls": st.lists(_CALL, max_size=3),
        "function_call": st.fixed_dictionaries({"name": st.text(max_size=10), "arguments": TEXT}),
        "tool_call_id": st.text(max_size=12),
        "extra": _JSON,
    },
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(message=MESSAGE | st.dictionaries(st.text(max_size=6), _JSON, max_size=3))
def test_the_byte_bound_never_undercounts(
    o200k: TiktokenTokenizer, cl100k: TiktokenTokenizer, message: dict[str, Any]
) -> None:
    data = canonical_bytes(message)
    bound = message_bound(data)
    # ``None`` (count exactly) is the answer for anything that reads as an image part, even a
    # generated string ``"image_url"``: never a bound that could undercount.
    assert (bound is None) == (b'"image_url"' in data)
    if bound is None:
        return
    for tokenizer in (o200k, cl100k):
        assert tokenizer.count_message(message) <= bound


def test_an_image_is_counted_not_bounded(o200k: TiktokenTokenizer) -> None:
    image = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}],
    }
    assert message_bound(canonical_bytes(image)) is None
    # Its count (765 tokens for an image of unknown size) is far above its ~80 bytes.
    tokenizer = TiktokenTokenizer(o200k.encoding)
    result = prompt_bound([image], None, tokenizer)
    assert result.exact and result.bounded == 0
    assert result.tokens == tokenizer.count_messages([image]) > 765
    mixed = prompt_bound([u("look"), image], None, TiktokenTokenizer(o200k.encoding))
    assert mixed.bounded == 1 and mixed.tokens >= tokenizer.count_messages([u("look"), image])


def test_the_bound_is_exact_once_every_message_is_cached(o200k: TiktokenTokenizer) -> None:
    tokenizer = TiktokenTokenizer(o200k.encoding)
    history = [s("be brief"), u("what is the weather?"), call("c1"), tool("c1", "sunny " * 50)]
    step = [a("It is sunny."), u("and tomorrow? " * 20)]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    exact = tokenizer.count_messages(history + step) + tokenizer.count_tools(tools)

    cold = prompt_bound(history + step, tools, TiktokenTokenizer(o200k.encoding))
    assert not cold.exact and cold.bounded == len(history + step)
    assert cold.tokens >= exact

    fresh = TiktokenTokenizer(o200k.encoding)
    fresh.count_messages(history)  # the previous request
    bounded = prompt_bound(history + step, tools, fresh)
    assert bounded.bounded == 2 and exact <= bounded.tokens < cold.tokens
    counted = prompt_bound(history + step, tools, fresh, count_bytes=10_000)
    assert counted.exact and counted.tokens == exact
    assert prompt_bound(history + step, tools, fresh) == counted  # the step is cached now
