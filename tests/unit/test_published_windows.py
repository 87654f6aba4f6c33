"""Reading context windows from `GET /v1/models` listings of the servers the proxy fronts."""

from __future__ import annotations

import json

import pytest

from compaction_proxy.upstream import parse_models_listing


def listing(*entries: object, key: str = "data") -> bytes:
    return json.dumps({"object": "list", key: list(entries)}).encode()


VLLM = listing(
    {
        "id": "Qwen/Qwen2.5-7B-Instruct",
        "object": "model",
        "created": 1_700_000_000,
        "owned_by": "vllm",
        "root": "Qwen/Qwen2.5-7B-Instruct",
        "parent": None,
        "max_model_len": 32768,
        "permission": [],
    },
    {"id": "my-lora", "object": "model", "owned_by": "vllm", "max_model_len": 32768},
)

OPENROUTER = listing(
    {
        "id": "qwen/qwen3-coder",
        "name": "Qwen: Qwen3 Coder",
        "context_length": 1048576,
        "top_provider": {
            "context_length": 262000,
            "max_completion_tokens": 65536,
            "is_moderated": False,
        },
    },
    {
        "id": "anthropic/claude-sonnet-4",
        "context_length": 200000,
        "top_provider": {"context_length": 1000000, "max_completion_tokens": 64000},
    },
    {"id": "only/top", "top_provider": {"context_length": 8192}},
    {"id": "top/null", "context_length": 131072, "top_provider": {"context_length": None}},
)

LMSTUDIO_V0 = listing(
    {
        "id": "qwen2.5-7b-instruct",
        "object": "model",
        "type": "llm",
        "state": "loaded",
        "max_context_length": 32768,
        "loaded_context_length": 8192,
    },
    {"id": "not-loaded", "type": "llm", "state": "not-loaded", "max_context_length": 131072},
)

LMSTUDIO_V1 = json.dumps(
    {
        "models": [
            {
                "type": "llm",
                "key": "google/gemma-3-12b",
                "display_name": "Gemma 3 12B",
                "max_context_length": 131072,
                "loaded_instances": [
                    {"id": "google/gemma-3-12b", "config": {"context_length": 16384}},
                    {"id": "google/gemma-3-12b:2", "config": {"context_length": 4096}},
                ],
            },
            {
                "type": "llm",
                "key": "idle-model",
                "max_context_length": 65536,
                "loaded_instances": [],
            },
        ]
    }
).encode()

LLAMA_CPP = json.dumps(
    {
        "models": [
            {
                "name": "gemma-3-4b-it-Q4_K_M.gguf",
                "model": "gemma-3-4b-it-Q4_K_M.gguf",
                "type": "model",
            }
        ],
        "object": "list",
        "data": [
            {
                "id": "gemma-3-4b-it-Q4_K_M.gguf",
                "object": "model",
                "owned_by": "llamacpp",
                "meta": {"vocab_type": 1, "n_vocab": 262144, "n_ctx_train": 131072, "n_embd": 2560},
            }
        ],
    }
).encode()

CASES: dict[str, tuple[bytes, dict[str, int]]] = {
    "vllm": (VLLM, {"Qwen/Qwen2.5-7B-Instruct": 32768, "my-lora": 32768}),
    "sglang": (
        listing(
            {
                "id": "meta-llama/Llama-3.1-8B-Instruct",
                "owned_by": "sglang",
                "max_model_len": 131072,
            }
        ),
        {"meta-llama/Llama-3.1-8B-Instruct": 131072},
    ),
    "openrouter-smaller-of-two": (
        OPENROUTER,
        {
            "qwen/qwen3-coder": 262000,
            "anthropic/claude-sonnet-4": 200000,
            "only/top": 8192,
            "top/null": 131072,
        },
    ),
    "lmstudio-loaded-beats-max": (LMSTUDIO_V0, {"qwen2.5-7b-instruct": 8192, "not-loaded": 131072}),
    "lmstudio-loaded-instances": (
        LMSTUDIO_V1,
        {"google/gemma-3-12b": 4096, "idle-model": 65536},
    ),
    "llama.cpp-training-length": (LLAMA_CPP, {"gemma-3-4b-it-Q4_K_M.gguf": 131072}),
    "llama.cpp-meta-null-while-loading": (
        listing({"id": "loading.gguf", "object": "model", "meta": None}),
        {},
    ),
    "generic-context-window": (
        listing({"id": "m1", "context_window": 128000}, {"id": "m2", "context_length": 64000}),
        {"m1": 128000, "m2": 64000},
    ),
    "models-array-by-name": (
        listing({"name": "by-name", "context_length": 4096}, key="models"),
        {"by-name": 4096},
    ),
    "models-array-by-model": (
        listing({"model": "by-model", "max_model_len": 2048}, key="models"),
        {"by-model": 2048},
    ),
    "bare-array": (json.dumps([{"id": "bare", "max_model_len": 1024}]).encode(), {"bare": 1024}),
    "serving-limit-beats-training-length": (
        listing({"id": "both", "max_model_len": 8192, "meta": {"n_ctx_train": 131072}}),
        {"both": 8192},
    ),
    "duplicate-id-keeps-smaller": (
        json.dumps(
            {
                "data": [{"id": "dup", "max_model_len": 32768}],
                "models": [{"model": "dup", "context_length": 16384}],
            }
        ).encode(),
        {"dup": 16384},
    ),
    "openai-no-window": (
        listing({"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "system"}),
        {},
    ),
}


@pytest.mark.parametrize(("body", "expected"), list(CASES.values()), ids=list(CASES))
def test_listing_shapes(body: bytes, expected: dict[str, int]) -> None:
    assert parse_models_listing(body) == expected


BAD_VALUES: dict[str, object] = {
    "zero": 0,
    "negative": -4096,
    "float": 4096.0,
    "string": "4096",
    "bool": True,
    "null": None,
    "object": {"value": 4096},
}


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_non_positive_int_windows_are_skipped(value: object) -> None:
    body = listing({"id": "bad", "max_model_len": value}, {"id": "good", "max_model_len": 4096})
    assert parse_models_listing(body) == {"good": 4096}


def test_bad_value_falls_through_to_next_field() -> None:
    body = listing({"id": "m", "max_model_len": "n/a", "meta": {"n_ctx_train": 8192}})
    assert parse_models_listing(body) == {"m": 8192}


GARBAGE: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"<html>502 Bad Gateway</html>",
    "truncated": VLLM[: len(VLLM) // 2],
    "invalid-utf8": b"\xff\xfe\x00garbage",
    "json-string": b'"hello"',
    "json-number": b"42",
    "json-null": b"null",
    "data-not-list": b'{"data": {"id": "x", "max_model_len": 4096}}',
    "entries-not-objects": b'{"data": ["x", 1, null, [2]]}',
    "no-id": b'{"data": [{"max_model_len": 4096}]}',
    "blank-id": b'{"data": [{"id": "  ", "max_model_len": 4096}]}',
    "id-not-string": b'{"data": [{"id": 7, "max_model_len": 4096}]}',
    "deep-nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge-int": b'{"data": [{"id": "x", "max_model_len": ' + b"9" * 5000 + b"}]}",
}


@pytest.mark.parametrize("body", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_gives_empty_mapping(body: bytes) -> None:
    assert parse_models_listing(body) == {}
