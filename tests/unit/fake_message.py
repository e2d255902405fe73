"""A consumed Kafka record for pure-logic tests (what confluent_kafka.Message answers), built
from plain values."""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from bridge.message import Headers


class _Record:
    def __init__(self, at: tuple[str, int, int], stamp: int, value: bytes, headers: Headers):
        self._at, self._stamp, self._value, self._headers = at, stamp, value, headers

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]

    def timestamp(self) -> tuple[int, int]:
        return 1, self._stamp  # CreateTime

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._value

    def headers(self) -> Headers:
        return self._headers


def message(
    topic: str, partition: int, offset: int, stamp: int, value: bytes, headers: Headers
) -> Message:
    """A record of ``topic`` at (``partition``, ``offset``), stamped ``stamp`` (CreateTime), with
    key ``b"k"``, ``value`` and ``headers``."""
    return cast(Message, _Record((topic, partition, offset), stamp, value, headers))
