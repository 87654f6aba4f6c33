from __future__ import annotations

import pytest

from compaction_proxy.http import UnsafePath, normalize


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1/../../etc/passwd",
        b"/v1/%2e%2e/%2e%2e/admin",
        b"/v1/%2E%2E/admin",
        b"/v1/models/../../admin",
        b"/v1/chat/completions/../../../x",
        b"/v1/./../admin",
        b"/v1/..",
        b"/v1/..%2f..%2fadmin",
        b"/v1/models%5c..%5c..%5cadmin",
        b"/v1\\..\\admin",
        b"v1/models",
    ],
)
def test_paths_that_leave_the_api_are_refused(raw: bytes) -> None:
    with pytest.raises(UnsafePath):
        normalize(raw)


@pytest.mark.parametrize(
    ("raw", "path", "forwarded"),
    [
        (b"/v1/chat/completions", "/v1/chat/completions", b"/v1/chat/completions"),
        (b"/v1//chat///completions", "/v1/chat/completions", b"/v1/chat/completions"),
        (b"/v1/models/./gpt-4o", "/v1/models/gpt-4o", b"/v1/models/gpt-4o"),
        (b"/v1/models/x/../gpt-4o", "/v1/models/gpt-4o", b"/v1/models/gpt-4o"),
        (b"/v1/models/", "/v1/models/", b"/v1/models/"),
        (b"/v1/files/file%20one", "/v1/files/file one", b"/v1/files/file%20one"),
        (b"//v1/models", "/v1/models", b"/v1/models"),
        (b"/healthz", "/healthz", b"/healthz"),
        (b"/dashboard/../healthz", "/healthz", b"/healthz"),
        (
            b"/v1/models/meta-llama%2FLlama-3.1-8B",
            "/v1/models/meta-llama/Llama-3.1-8B",
            b"/v1/models/meta-llama%2FLlama-3.1-8B",
        ),
        (b"/v1/files/file%2Fabc", "/v1/files/file/abc", b"/v1/files/file%2Fabc"),
    ],
)
def test_safe_paths_are_normalised_keeping_their_encoding(
    raw: bytes, path: str, forwarded: bytes
) -> None:
    safe = normalize(raw)
    assert safe.path == path
    assert safe.raw == forwarded
    assert b".." not in safe.raw
