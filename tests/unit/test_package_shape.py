"""The package's shape, read from its code: one exception family with one root, and OpenAI's
error body built by one function (compaction_proxy/http/README.md, "Errors")."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import orjson

import compaction_proxy
from compaction_proxy.compaction.errors import CompactionProxyError
from compaction_proxy.http import error_body
from compaction_proxy.http.protocol import error_response, too_large_response

PACKAGE = Path(compaction_proxy.__file__).parent

# Exceptions that had a built-in base before the family had a root: they keep it, so code
# that catches them by that base still does.
KEPT_BASES = {
    "compaction_proxy.checkpoints._contract.ForeignValue": ValueError,
    "compaction_proxy.compaction.draft.ProtectedGroupError": RuntimeError,
    "compaction_proxy.compaction.encodings.EncodingUnavailable": LookupError,
    "compaction_proxy.compaction.triggers.ConditionError": ValueError,
    "compaction_proxy.http._paths.UnsafePath": ValueError,
    "compaction_proxy.upstream._transport.UpstreamTimeout": TimeoutError,
    "compaction_proxy.wire._jsonspans.ScanError": ValueError,
    "compaction_proxy.wire._multipart.Unreadable": ValueError,
    "compaction_proxy.wire.format.LowerError": ValueError,
}


def package_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in the package, by its qualified name."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="compaction_proxy."):
        if info.name == "compaction_proxy.__main__":  # runs the CLI when imported
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{value.__qualname__}"] = value
    return found


def test_every_exception_of_the_package_derives_from_one_root() -> None:
    exceptions = package_exceptions()
    assert len(exceptions) >= 15  # the walk found the package's exceptions, not nothing
    outside = sorted(
        name for name, cls in exceptions.items() if not issubclass(cls, CompactionProxyError)
    )
    assert outside == []
    for name, base in KEPT_BASES.items():
        assert issubclass(exceptions[name], base), name


def _error_literals(tree: ast.AST, *, anthropic: bool = False) -> list[int]:
    """Lines of dict literals shaped like OpenAI's error body: ``{"error": {"message": ...}}``
    (``anthropic``: like Anthropic's, the same with ``"type": "error"`` beside it)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        tagged = any(
            isinstance(k, ast.Constant)
            and k.value == "type"
            and isinstance(v, ast.Constant)
            and v.value == "error"
            for k, v in zip(node.keys, node.values, strict=True)
        )
        if tagged != anthropic:
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and key.value == "error"
                and isinstance(value, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "message" for k in value.keys)
            ):
                lines.append(node.lineno)
    return lines


def test_openai_error_body_is_built_in_one_place() -> None:
    built = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _error_literals(ast.parse(path.read_text())))
    }
    assert list(built) == ["compaction_proxy/http/_errors.py"]
    assert len(built["compaction_proxy/http/_errors.py"]) == 1


def test_anthropic_error_body_is_built_in_one_place() -> None:
    built = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _error_literals(ast.parse(path.read_text()), anthropic=True))
    }
    assert list(built) == ["compaction_proxy/wire/messages/_format.py"]
    assert len(built["compaction_proxy/wire/messages/_format.py"]) == 1


def test_the_protocols_own_errors_are_that_body() -> None:
    """The 431 and the 400s the HTTP protocol writes before any app runs carry the same body
    as every other error of the proxy."""
    head, _, body = too_large_response(1024, 256).partition(b"\r\n\r\n")
    assert b"431" in head.split(b"\r\n")[0]
    assert orjson.loads(body) == orjson.loads(
        error_body(
            "request headers are too large: at most 1024 bytes in all and 256 bytes per header",
            type="invalid_request_error",
            code="request_header_fields_too_large",
        )
    )
    _, _, body = error_response(400, "Bad Request", "the request is malformed", "bad").partition(
        b"\r\n\r\n"
    )
    assert orjson.loads(body) == {
        "error": {
            "message": "the request is malformed",
            "type": "invalid_request_error",
            "param": None,
            "code": "bad",
        }
    }
    _, _, body = error_response(500, "Internal Server Error", "broken", "oops").partition(
        b"\r\n\r\n"
    )
    assert orjson.loads(body)["error"]["type"] == "server_error"
