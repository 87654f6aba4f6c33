"""The provider's exact tokenizers count with bpe-openai where it is installed (the ``fast``
extra) and agrees with tiktoken, and with tiktoken otherwise: the same counts either way."""

from __future__ import annotations

import sys

import pytest

import compaction_proxy.compaction.tokenizer_provider as provider_module
from compaction_proxy.compaction import EncodingLoader, TiktokenTokenizer, TokenizerProvider
from tests.support.optional import require_or_skip

TEXTS = (
    "hello world",
    "def f(x):\n    return x ** 2  # squared\n",
    '{"path": "src/main.py", "lines": [1, 2, 3]}',
    "日本語のテキスト 🙂 👨‍👩‍👧 e\u0301",
    "a" * 5000,
)


@pytest.fixture
def fresh_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the counters other tests' providers settled on."""
    monkeypatch.setattr(provider_module, "_counters", {})


def _exact(provider: TokenizerProvider, encoding: str) -> TiktokenTokenizer:
    tokenizer = provider.get(encoding)
    assert isinstance(tokenizer, TiktokenTokenizer)
    return tokenizer


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_installed_bpe_openai_counts_for_the_provider(fresh_counters: None, encoding: str) -> None:
    require_or_skip("bpe-openai", "bpe_openai")  # the optional `fast` extra
    loader = EncodingLoader()
    tokenizer = _exact(TokenizerProvider(loader), encoding)
    assert tokenizer.counter is not None
    for text in TEXTS:
        assert tokenizer.count_text(text) == len(tokenizer.encoding.encode_ordinary(text))
    # Settled once per loaded encoding: a second provider over it reuses the same counter.
    again = _exact(TokenizerProvider(loader), encoding)
    assert again.counter is tokenizer.counter


def test_without_the_package_tiktoken_counts(
    fresh_counters: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bpe_openai._bindings", None)  # import fails
    provider = TokenizerProvider(EncodingLoader())
    tokenizer = _exact(provider, "o200k_base")
    assert tokenizer.counter is None
    for text in TEXTS:
        assert tokenizer.count_text(text) == len(tokenizer.encoding.encode_ordinary(text))


def test_a_refreshed_encoding_gets_the_same_choice(fresh_counters: None) -> None:
    provider = TokenizerProvider(EncodingLoader())
    before = _exact(provider, "o200k_base")
    assert provider.refresh("o200k_base")
    after = _exact(provider, "o200k_base")
    assert after is not before
    assert after.counter is before.counter
