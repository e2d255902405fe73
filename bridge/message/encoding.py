"""The stored encoding: a scheduled record packed as Redis holds it, and read back."""

from __future__ import annotations

import struct

from bridge.message.headers import (
    H_AFTER,
    H_CONTINUES,
    H_CRON,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_MAX_LATENESS,
    H_PRODUCED,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    Headers,
    Priority,
    Scheduled,
    origin,
)

# Version 2 (the only one; the byte leaves room for another): >B version, B flags, q due ms,
# H header count; then, with flag STORED_AT, q the moment the bridge stored a record that was
# already due; then length-prefixed
# fields — the target unless flag TARGET_IN_HEADER (it is the delay-target-topic header's
# value), the delay-id unless flag DEFAULT_ID (it is <topic>:<partition>:<offset>) or flag
# ID_IN_HEADER (it is the delay-id header's value), key, value,
# and per header a name byte (the code of a known name, or 0 and the name length-prefixed) and
# the value. Lengths are >H with 0xFFFF for None, or >I with 0xFFFFFFFF for None when flag WIDE
# says a field is 65535 bytes or longer. With flag MANY_HEADERS (65536 headers or more: Kafka sets
# no limit) the head's count is 0 and the count follows it as >I, before the stored moment. The
# offset is the Redis member's; topic and partition are the shard's. Every byte saved here is
# saved on every record Redis holds.


_HEAD = struct.Struct(">BBqH")
_NARROW, _NARROW_NONE = struct.Struct(">H"), 0xFFFF
_WIDE, _WIDE_NONE = struct.Struct(">I"), 0xFFFFFFFF
# Stored flags: never renumber (claim.lua reads the version byte and DEFAULT_ID too). HIGH and LOW
# give the priority (neither: normal, as every record stored before priorities existed).
_TARGET_IN_HEADER, _DEFAULT_ID, _WIDE_LENGTHS, _STORED_AT, _ID_IN_HEADER = 1, 2, 4, 8, 16
_HIGH, _LOW, _MANY_HEADERS = 32, 64, 128
_PRIORITY_FLAGS = {Priority.HIGH: _HIGH, Priority.NORMAL: 0, Priority.LOW: _LOW}
# A record's priority from its flags, one lookup per record decoded (not a call: this runs per
# record); both bits set is not written, and reads as high.
_PRIORITY_OF = {
    0: Priority.NORMAL,
    _HIGH: Priority.HIGH,
    _LOW: Priority.LOW,
    _HIGH | _LOW: Priority.HIGH,
}
_STORED = struct.Struct(">q")
_COUNT = struct.Struct(">I")
# Codes are stored: append only, never reorder. A record with a delay-cron or delay-every header,
# or one only a recurring schedule's records carry (codes from _RECURRING_CODE on), is a recurring
# schedule: decode says so without a name compared.
_KNOWN_NAMES = (
    H_TARGET_TOPIC,
    H_DELIVER_AT,
    H_AFTER,
    H_TARGET_KEY,
    H_ID,
    H_MAX_LATENESS,
    H_CRON,
    H_EVERY,
    H_PRODUCED,
    H_CONTINUES,
)
_NAME_CODES = {name: code for code, name in enumerate(_KNOWN_NAMES, start=1)}
_TARGET_CODE, _ID_CODE = _NAME_CODES[H_TARGET_TOPIC], _NAME_CODES[H_ID]
_RECURRING_CODE = _NAME_CODES[H_CRON]
_CODE_BYTES = [bytes((code,)) for code in range(len(_KNOWN_NAMES) + 1)]
_ABSENT = object()  # a header not present (None is a header present without a value)


def encode(record: Scheduled, topic: str, partition: int) -> bytes:
    """Pack a :class:`Scheduled` of delay-topic partition ``topic``/``partition`` into the
    compact binary form kept in Redis."""
    # Per record, twice a record's life (here and decode): written as plain loops for speed.
    flags = _PRIORITY_FLAGS[record.priority]
    target_header = id_header = _ABSENT
    heads: list[tuple[int, bytes | None, bytes | None]] = []
    longest = 0  # the longest header name or value
    for name, value in record.headers:
        code = _NAME_CODES.get(name, 0)
        if code == _TARGET_CODE and target_header is _ABSENT:
            target_header = value
        elif code == _ID_CODE and id_header is _ABSENT:
            id_header = value
        encoded_name = None if code else name.encode()
        heads.append((code, encoded_name, value))
        if encoded_name is not None and len(encoded_name) > longest:
            longest = len(encoded_name)
        if value is not None and len(value) > longest:
            longest = len(value)
    fields: list[bytes | None] = []
    target = record.target.encode()
    if target_header == target:
        flags |= _TARGET_IN_HEADER
    else:
        fields.append(target)
    if record.given_id(topic, partition) is None:
        flags |= _DEFAULT_ID
    else:
        delay_id = record.delay_id.encode()
        if id_header == delay_id:
            flags |= _ID_IN_HEADER
        else:
            fields.append(delay_id)
    fields.append(record.key)
    fields.append(record.value)
    for data in fields:
        if data is not None and len(data) > longest:
            longest = len(data)
    length, none = _NARROW, _NARROW_NONE
    if longest >= _NARROW_NONE:
        length, none = _WIDE, _WIDE_NONE
        flags |= _WIDE_LENGTHS
    if record.stored_ms is not None:
        flags |= _STORED_AT
    count = len(heads)
    if count > _NARROW_NONE:
        out = [_HEAD.pack(2, flags | _MANY_HEADERS, record.due_ms, 0), _COUNT.pack(count)]
    else:
        out = [_HEAD.pack(2, flags, record.due_ms, count)]
    if record.stored_ms is not None:
        out.append(_STORED.pack(record.stored_ms))
    pack = length.pack
    absent = pack(none)
    for field_data in fields:
        if field_data is None:
            out.append(absent)
        else:
            out.append(pack(len(field_data)))
            out.append(field_data)
    for code, name_bytes, data in heads:
        out.append(_CODE_BYTES[code])
        if name_bytes is not None:
            out.append(pack(len(name_bytes)))
            out.append(name_bytes)
        if data is None:
            out.append(absent)
        else:
            out.append(pack(len(data)))
            out.append(data)
    return b"".join(out)


def decode(blob: bytes, topic: str, partition: int, offset: int) -> Scheduled:
    """Inverse of :func:`encode`; raises ValueError on a blob it does not understand."""
    # Per record claimed (the mover's largest cost): the narrow form — every length in two
    # bytes, as all but the rarest records are — read with its lengths inline; the rest, and
    # whatever does not decode (to say why), by _decode_any.
    try:
        version, flags, due_ms, count = _HEAD.unpack_from(blob, 0)
        if version != 2 or flags & (_WIDE_LENGTHS | _MANY_HEADERS):
            return _decode_any(blob, topic, partition, offset)
        pos, stored_ms, target, delay_id = 12, None, None, None
        if flags & _STORED_AT:
            (stored_ms,) = _STORED.unpack_from(blob, 12)
            pos = 20
        if not flags & _TARGET_IN_HEADER:
            size = blob[pos] << 8 | blob[pos + 1]
            end = pos + 2 + (size if size != _NARROW_NONE else 0)
            target = blob[pos + 2 : end].decode()
            pos = end
        if flags & _DEFAULT_ID:
            delay_id = f"{topic}:{partition}:{offset}"  # origin(), inline
        elif not flags & _ID_IN_HEADER:
            size = blob[pos] << 8 | blob[pos + 1]
            end = pos + 2 + (size if size != _NARROW_NONE else 0)
            delay_id = blob[pos + 2 : end].decode()
            pos = end
        key = value = None
        size = blob[pos] << 8 | blob[pos + 1]
        pos += 2
        if size != _NARROW_NONE:
            key = blob[pos : pos + size]
            pos += size
        size = blob[pos] << 8 | blob[pos + 1]
        pos += 2
        if size != _NARROW_NONE:
            value = blob[pos : pos + size]
            pos += size
        headers: Headers = []
        recurring = False
        for _ in range(count):
            code = blob[pos]
            if code:
                name = _KNOWN_NAMES[code - 1]
                pos += 1
            else:
                size = blob[pos + 1] << 8 | blob[pos + 2]
                end = pos + 3 + (size if size != _NARROW_NONE else 0)
                name = blob[pos + 3 : end].decode()
                pos = end
            size = blob[pos] << 8 | blob[pos + 1]
            pos += 2
            data = None
            if size != _NARROW_NONE:
                data = blob[pos : pos + size]
                pos += size
            headers.append((name, data))
            if code == _TARGET_CODE and target is None:
                target = (data or b"").decode()
            elif code == _ID_CODE and delay_id is None:
                delay_id = (data or b"").decode()
            elif code >= _RECURRING_CODE:
                recurring = True
    except (struct.error, IndexError, UnicodeDecodeError):
        return _decode_any(blob, topic, partition, offset)  # raises, saying why
    if pos != len(blob) or target is None or delay_id is None:
        return _decode_any(blob, topic, partition, offset)  # raises, saying why
    return Scheduled(
        offset,
        due_ms,
        target,
        key,
        value,
        headers,
        delay_id,
        stored_ms,
        (topic, partition) if flags & _DEFAULT_ID else None,
        _PRIORITY_OF[flags & (_HIGH | _LOW)],
        0,
        recurring,
    )


def _decode_any(blob: bytes, topic: str, partition: int, offset: int) -> Scheduled:
    """:func:`decode` of any blob: wide lengths and many headers too; ValueError saying what is
    wrong with one that does not decode."""
    try:
        if blob[0] != 2:
            raise ValueError(f"unknown stored record version {blob[0]}")
        _, flags, due_ms, count = _HEAD.unpack_from(blob, 0)
        pos, stored_ms = _HEAD.size, None
        if flags & _MANY_HEADERS:
            (count,) = _COUNT.unpack_from(blob, pos)
            pos += _COUNT.size
        if flags & _STORED_AT:
            (stored_ms,) = _STORED.unpack_from(blob, pos)
            pos += _STORED.size
        if flags & _WIDE_LENGTHS:
            unpack, step, none = _WIDE.unpack_from, _WIDE.size, _WIDE_NONE
        else:
            unpack, step, none = _NARROW.unpack_from, _NARROW.size, _NARROW_NONE
        # The length-prefixed fields in order — [target], [delay-id], key, value — each None or
        # its bytes; then the headers, each a name code (0: the name follows) and a value.
        fields: list[bytes | None] = []
        wanted = 2 + (not flags & _TARGET_IN_HEADER) + (not flags & (_DEFAULT_ID | _ID_IN_HEADER))
        for _ in range(wanted):
            (size,) = unpack(blob, pos)
            pos += step
            if size == none:
                fields.append(None)
            else:
                end = pos + size
                fields.append(blob[pos:end])
                pos = end
        value = fields.pop()
        key = fields.pop()
        target = delay_id = None
        if flags & _DEFAULT_ID:
            delay_id = origin(topic, partition, offset)
        elif not flags & _ID_IN_HEADER:
            delay_id = (fields.pop() or b"").decode()
        if not flags & _TARGET_IN_HEADER:
            target = (fields.pop() or b"").decode()
        headers: Headers = []
        recurring = False
        for _ in range(count):
            code = blob[pos]
            pos += 1
            if code:
                name = _KNOWN_NAMES[code - 1]
            else:
                (size,) = unpack(blob, pos)
                pos += step
                if size == none:
                    name = ""
                else:
                    end = pos + size
                    name = blob[pos:end].decode()
                    pos = end
            (size,) = unpack(blob, pos)
            pos += step
            data = None
            if size != none:
                end = pos + size
                data = blob[pos:end]
                pos = end
            headers.append((name, data))
            if code == _TARGET_CODE and target is None:
                target = (data or b"").decode()
            elif code == _ID_CODE and delay_id is None:
                delay_id = (data or b"").decode()
            elif code >= _RECURRING_CODE:
                recurring = True
        if pos != len(blob):
            raise ValueError("stored record is longer than its fields")
        if target is None or delay_id is None:
            raise ValueError("stored record lacks the header its flags point to")
        return Scheduled(
            offset,
            due_ms,
            target,
            key,
            value,
            headers,
            delay_id,
            stored_ms,
            default_of=(topic, partition) if flags & _DEFAULT_ID else None,
            priority=_PRIORITY_OF[flags & (_HIGH | _LOW)],
            recurring=recurring,
        )
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"stored record does not decode: {exc}") from None
