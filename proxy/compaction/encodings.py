"""Offline-safe loading of tiktoken encodings.

``tiktoken.get_encoding`` downloads its BPE file on first use; with no network that would fail
(or hang) inside a request.  This module never lets tiktoken fetch anything: it finds the file
itself, verifies its sha256, parses the ranks, and borrows only the regex and special tokens
from ``tiktoken_ext.openai_public``.  It does so by calling a *copy* of the registered
constructor whose globals point every loading function at local-only code, so the original
module is never patched and no code path can reach the network.

Search order for ``<name>``: configured directories, ``$TIKTOKEN_CACHE_DIR``,
``$DATA_GYM_CACHE_DIR``, then tiktoken's default cache (``<tempdir>/data-gym-cache``).  In each
directory a file named ``<name>.tiktoken`` or named by tiktoken's cache key (the sha1 of the
blob URL) is accepted if its sha256 matches.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tiktoken

BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"

KNOWN_SHA256: Mapping[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
"""Fallback hashes, used only if the installed tiktoken_ext does not state one."""


class EncodingUnavailable(LookupError):
    """No verified local file for an encoding (or the encoding is unknown)."""


def cache_key(url: str) -> str:
    """The file name tiktoken's cache uses for ``url``."""
    return hashlib.sha1(url.encode()).hexdigest()


@dataclass
class EncodingLoader:
    """Finds, verifies and builds encodings from local files; caches what it built.

    ``include_env`` / ``include_default`` exist so tests (and operators who want a single
    baked-in directory) can restrict the search to ``directories``.
    """

    directories: Sequence[Path | str] = ()
    include_env: bool = True
    include_default: bool = True
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    _built: dict[str, tiktoken.Encoding] = field(default_factory=dict, init=False, repr=False)

    def search_dirs(self) -> list[Path]:
        """Directories searched, in order."""
        dirs = [Path(d) for d in self.directories]
        if self.include_env:
            for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
                value = self.environ.get(var)
                if value:
                    dirs.append(Path(value))
        if self.include_default:
            dirs.append(Path(tempfile.gettempdir()) / "data-gym-cache")
        return dirs

    def locate(self, name: str, url: str, expected_sha256: str | None) -> bytes:
        """Bytes of the first candidate file whose hash matches; raises if none does."""
        for directory in self.search_dirs():
            for candidate in (directory / f"{name}.tiktoken", directory / cache_key(url)):
                try:
                    data = candidate.read_bytes()
                except OSError:
                    continue
                if expected_sha256 is None or hashlib.sha256(data).hexdigest() == expected_sha256:
                    return data
        raise EncodingUnavailable(f"no verified local file for encoding {name!r}")

    def load(self, name: str) -> tiktoken.Encoding:
        """Build (once) and return encoding ``name``; raises :class:`EncodingUnavailable`."""
        built = self._built.get(name)
        if built is None:
            built = tiktoken.Encoding(**self._constructor_params(name))
            self._built[name] = built
        return built

    def _constructor_params(self, name: str) -> dict[str, Any]:
        try:
            from tiktoken_ext import openai_public  # type: ignore[import-untyped]
        except ImportError as exc:  # pragma: no cover - ships with tiktoken
            raise EncodingUnavailable("tiktoken_ext.openai_public is not installed") from exc
        constructors = getattr(openai_public, "ENCODING_CONSTRUCTORS", {})
        if name not in constructors:
            raise EncodingUnavailable(f"unknown encoding {name!r}")

        def load_local(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
            file_name = url.rsplit("/", 1)[-1].removesuffix(".tiktoken")
            expected = expected_hash or KNOWN_SHA256.get(file_name)
            return parse_ranks(self.locate(file_name, url, expected))

        def refuse(*_args: object, **_kwargs: object) -> Any:
            raise EncodingUnavailable(f"encoding {name!r} needs files this loader cannot read")

        safe_globals = _offline_globals(openai_public, load_local, refuse)
        constructor = safe_globals.get(constructors[name].__name__)
        if not isinstance(constructor, types.FunctionType):
            raise EncodingUnavailable(f"cannot build encoding {name!r} offline")
        params: dict[str, Any] = constructor()
        return params


def _offline_globals(
    module: types.ModuleType,
    load_local: Callable[..., dict[bytes, int]],
    refuse: Callable[..., Any],
) -> dict[str, Any]:
    """A copy of ``module``'s globals where every loader is local-only.

    ``load_tiktoken_bpe`` becomes ``load_local``; every other function imported from
    ``tiktoken.load`` (URL readers, the GPT-2 data-gym loader) refuses; the module's own
    functions are re-bound to these globals, so a constructor calling another constructor
    (``o200k_harmony`` calls ``o200k_base``) stays offline too.
    """
    safe: dict[str, Any] = dict(vars(module))
    for key, value in list(safe.items()):
        if getattr(value, "__module__", None) == "tiktoken.load" and callable(value):
            safe[key] = refuse
    safe["load_tiktoken_bpe"] = load_local
    for key, value in list(safe.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            safe[key] = types.FunctionType(
                value.__code__, safe, value.__name__, value.__defaults__, value.__closure__
            )
    return safe


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``<base64 token> <rank>`` pair per line."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks
