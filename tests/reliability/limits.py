"""A proxy process whose disk can be made full for it: a file-size limit set on the running
process (``prlimit``), its output through a pipe so the limit never touches its log.

``RLIMIT_FSIZE`` makes every ``write()`` at an offset past the limit fail with ``EFBIG`` (CPython
ignores ``SIGXFSZ`` at start-up, so the process gets the error instead of dying), whoever the
user is: unlike a read-only directory, which root writes into anyway, it stops the proxy as
root. Files already written stay readable; nothing can grow. That is a full disk, for this
process only, with no mount and no privileged setup.
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import threading
from pathlib import Path
from typing import IO

from tests.support.processes import REPO_ROOT
from tests.support.servers import ProxyServer


class PipedProxy(ProxyServer):
    """A :class:`ProxyServer` whose output goes through a pipe, copied to its log by a thread
    (a pipe is not a file: the process's file-size limit does not apply to it)."""

    def __init__(self, config_path: Path, log_path: Path, name: str = "proxy") -> None:
        super().__init__(config_path, log_path, name=name)
        self._copier: threading.Thread | None = None

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file = log_file
        log_file.write(f"$ {' '.join(self.argv)}\n".encode())
        log_file.flush()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO_ROOT,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        self._copier = threading.Thread(
            target=_copy, args=(self.proc.stdout, log_file), name=f"{self.name}-log", daemon=True
        )
        self._copier.start()

    def fill_disk(self, max_file_bytes: int) -> None:
        """From now on no file of the proxy can be written past ``max_file_bytes``."""
        assert self.proc is not None
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    def stop(self) -> int | None:
        proc, copier, log_file = self.proc, self._copier, self._log_file
        self._log_file = None  # closed here, once the copier has written everything
        code = super().stop()
        if copier is not None:
            copier.join(timeout=10)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if log_file is not None:
            log_file.close()
        return code


def _copy(source: IO[bytes], target: IO[bytes]) -> None:
    with contextlib.suppress(ValueError, OSError):
        for chunk in iter(lambda: source.read1(65536), b""):  # type: ignore[attr-defined]
            target.write(chunk)
            target.flush()
