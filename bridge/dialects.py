"""The header sets a delay topic may speak (``topics.dialect``), each read into this bridge's own
contract before :func:`bridge.message.parse` validates it.

``delay-bridge`` (the default) is the contract's own headers. ``etf1`` is that of
etf1/kafka-message-scheduler, so its producers work unchanged: ``scheduler-epoch`` (unix seconds)
is the due time, ``scheduler-target-topic`` and ``scheduler-target-key`` the target and its key,
the record key is the delay-id, and a tombstone (no value) with that key cancels the schedule.
Pure, like :mod:`bridge.message`.
"""

from __future__ import annotations

from bridge.message import (
    H_DELIVER_AT,
    H_ID,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    MAX_ID_BYTES,
    MIN_EPOCH_MS,
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    parse,
)

ETF1 = "etf1"
ETF1_EPOCH = "scheduler-epoch"
ETF1_TARGET_TOPIC = "scheduler-target-topic"
ETF1_TARGET_KEY = "scheduler-target-key"
# etf1 header -> the contract's header it becomes (the due time is converted on the way).
_ETF1_AS = {ETF1_EPOCH: H_DELIVER_AT, ETF1_TARGET_TOPIC: H_TARGET_TOPIC,
            ETF1_TARGET_KEY: H_TARGET_KEY}  # fmt: skip


def parse_record(
    rules: Rules,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    now_ms: int,
) -> Scheduled | Cancel:
    """:func:`bridge.message.parse` for a record of ``topic``, in the dialect it speaks."""
    if rules.dialects.get(topic) == ETF1:
        translated = from_etf1(offset, key, value, headers)
        if isinstance(translated, Cancel):
            return translated
        headers = translated
    return parse(rules, topic=topic, partition=partition, offset=offset,
                 timestamp_ms=timestamp_ms, key=key, value=value, headers=headers,
                 now_ms=now_ms)  # fmt: skip


def from_etf1(
    offset: int, key: bytes | None, value: bytes | None, headers: Headers
) -> Headers | Cancel:
    """An etf1 record as this contract's headers (scheduler-* replaced by their delay-*
    counterparts, the key as delay-id), or the :class:`Cancel` a tombstone is; raises
    :class:`Rejected` for a record etf1 would not take either."""
    if not key:
        raise Rejected(Reason.BAD_HEADER, "an etf1 record needs a key: it is the schedule's id")
    if len(key) > MAX_ID_BYTES:
        raise Rejected(
            Reason.BAD_HEADER, f"an etf1 key is the delay-id: at most {MAX_ID_BYTES} bytes"
        )
    try:
        delay_id = key.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(Reason.BAD_HEADER, "an etf1 key is the delay-id: it must be UTF-8") from None
    if value is None:
        return Cancel(offset, delay_id)
    theirs: dict[str, bytes] = {}
    kept: Headers = []
    for name, hvalue in headers:
        if name not in _ETF1_AS:
            kept.append((name, hvalue))
        elif name in theirs:
            raise Rejected(Reason.BAD_HEADER, f"header {name} appears more than once")
        else:
            theirs[name] = hvalue or b""
    if ETF1_EPOCH not in theirs:
        raise Rejected(Reason.MISSING_DUE_TIME, f"no {ETF1_EPOCH} header (unix seconds)")
    text = theirs[ETF1_EPOCH].decode("utf-8", errors="replace").strip()
    if not text.isdigit():
        raise Rejected(Reason.BAD_DUE_TIME, f"{ETF1_EPOCH} {text[:40]!r} is not unix seconds")
    # An epoch in the past is due at once; the contract's floor for epoch ms is 2000-01-01.
    theirs[ETF1_EPOCH] = str(max(int(text) * 1000, MIN_EPOCH_MS)).encode()
    return [*kept, *((_ETF1_AS[name], v) for name, v in theirs.items()), (H_ID, key)]
