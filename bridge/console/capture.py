"""What a command prints, captured per thread: the API runs the CLI's own commands in the bridge.

:func:`captured` points this thread's ``sys.stdout`` and ``sys.stderr`` at buffers while a command
runs; every other thread (the bridge's loops, other requests) still writes where it did. The
streams are swapped for thread-aware ones once, on first use.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_local = threading.local()
_install = threading.Lock()


class _PerThread(io.TextIOBase):
    """A text stream that writes to this thread's buffer when one is set, else to ``real``."""

    def __init__(self, real: TextIO, name: str) -> None:
        self.real = real
        self.name = name

    def _target(self) -> TextIO:
        buffer: TextIO | None = getattr(_local, self.name, None)
        return buffer if buffer is not None else self.real

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return self._target().isatty()

    def fileno(self) -> int:
        return self._target().fileno()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.real, attr)


def _installed() -> None:
    with _install:
        if not isinstance(sys.stdout, _PerThread):
            sys.stdout = _PerThread(sys.stdout, "stdout")
        if not isinstance(sys.stderr, _PerThread):
            sys.stderr = _PerThread(sys.stderr, "stderr")


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """(stdout, stderr) of what this thread prints inside the block."""
    _installed()
    out, err = io.StringIO(), io.StringIO()
    _local.stdout, _local.stderr = out, err
    try:
        yield out, err
    finally:
        _local.stdout = _local.stderr = None
