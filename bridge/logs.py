"""Logging set-up: plain text for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any

# Attributes every LogRecord has; anything else was passed in ``extra=`` and is context.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "repeat_key"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then any ``extra`` context."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                event[key] = value
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


REPEAT_INTERVAL_S = 30.0
# Numbers that vary between repeats of one line ("after 12ms"); a partition ("topic[3]") is
# part of what a line is about, so it stays.
_NUMBERS = re.compile(r"(?<![\[\d.])\d+(\.\d+)?(?![\d\]])")


class RateLimit(logging.Filter):
    """Lets a warning or error through once per ``interval`` seconds: repeats of the same line
    (numbers aside, so "after 12ms" and "after 15ms" are one line, but "t[0]" and "t[1]" are
    two) are counted instead, and the next one let through says how many were held back. Lines
    below WARNING always pass. A line given ``extra={"repeat_key": k}`` is a repeat of every
    other line with that key, whatever its text (one line per id would never repeat)."""

    def __init__(self, interval: float = REPEAT_INTERVAL_S, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        repeat = getattr(record, "repeat_key", None)
        key = (record.name, record.levelno, repeat or _NUMBERS.sub("#", message))
        now = self._clock()
        with self._lock:
            if len(self._seen) > 10_000:
                self._seen.clear()
            since, held = self._seen.get(key, (None, 0))
            if since is not None and now - since < self.interval:
                self._seen[key] = (since, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{message} ({held} more like this in the last {now - since:.0f}s)"
            record.args = None
        return True


# librdkafka's lines when a newer producer with the same transactional id fenced this one.
_FENCED = re.compile(r"fenced by a newer instance|operation with an old epoch")


class KafkaNoise(logging.Filter):
    """Lowers librdkafka lines that are not the operator's concern: an idempotent producer's
    "Failed to acquire idempotence PID … retrying" while a (re)started broker loads its
    coordinator (librdkafka retries by itself: INFO); a refused connection once the bridge is
    stopping (a broker that was restarted has left a stale connection behind: DEBUG); and a
    transactional producer's fatal error when another replica fenced it (the bridge's own line
    says so, as an error: WARNING). A fault that lasts still shows: in /readyz, in the bridge's
    own lines, and in librdkafka's others."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        if text.startswith("GETPID") and "retrying" in text:
            record.levelno, record.levelname = logging.INFO, "INFO"
        elif self.stopping and "Connection refused" in text:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        elif record.levelno > logging.WARNING and _FENCED.search(text):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def setup(level: str, as_json: bool) -> None:
    """Configure the root logger once: level, and text or JSON lines on stdout."""
    handler = logging.StreamHandler(sys.stdout)
    if as_json:
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    handler.addFilter(RateLimit())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
