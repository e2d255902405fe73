"""A loop on a daemon thread of its own until it is stopped: the checker, the /readyz sampler,
the soak's tally."""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """Subclasses implement :meth:`_run`, looping until :attr:`_stop` is set."""

    thread_name = "background"
    _thread: threading.Thread | None = None

    def start(self) -> Self:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop the loop and wait up to ``timeout`` s for it (nothing if it never started)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError
