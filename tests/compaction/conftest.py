"""Offline test setup: real tiktoken encoding files from the litellm package.

litellm ships cl100k_base and o200k_base named by tiktoken's cache key; pointing
``TIKTOKEN_CACHE_DIR`` there means nothing ever downloads.  The directory is located without
importing litellm (its import tries the network).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from proxy.compaction import (
    CharacterEstimatorTokenizer,
    EncodingLoader,
    TiktokenTokenizer,
    TokenizerProvider,
)


def _litellm_tokenizers_dir() -> Path:
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations, "litellm is a test dependency"
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


ENCODINGS_DIR = _litellm_tokenizers_dir()
os.environ["TIKTOKEN_CACHE_DIR"] = str(ENCODINGS_DIR)


@pytest.fixture(scope="session")
def encodings_dir() -> Path:
    return ENCODINGS_DIR


@pytest.fixture(scope="session")
def loader(encodings_dir: Path) -> EncodingLoader:
    return EncodingLoader(directories=[encodings_dir], include_env=False, include_default=False)


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
