"""Just enough of the Kafka wire protocol to ask a broker what it is (ApiVersions v3).

The smoke test uses it to prove the broker is a real Apache Kafka of the expected generation:
the finalized ``metadata.version`` feature names the release line the cluster runs.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

API_VERSIONS = 18


@dataclass(frozen=True)
class BrokerApis:
    """What a broker's ApiVersions response says about it."""

    api_ranges: dict[int, tuple[int, int]]
    supported_features: dict[str, tuple[int, int]]
    finalized_features: dict[str, int]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def compact_string(self) -> str:
        length = self.uvarint() - 1
        text = self.data[self.pos : self.pos + length].decode()
        self.pos += length
        return text

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


def api_versions(host: str, port: int, timeout: float = 5.0) -> BrokerApis:
    """Send ApiVersions v3 and decode the answer."""
    client_id = b"delay-bridge-tests"
    header = struct.pack(">hhih", API_VERSIONS, 3, 1, len(client_id)) + client_id + b"\x00"
    body = _compact_string("delay-bridge-tests") + _compact_string("1") + b"\x00"
    payload = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        reader = _Reader(_recv_exact(sock, size))

    if reader.take(">i") != 1:
        raise ValueError("correlation id mismatch")
    if (error := reader.take(">h")) != 0:
        raise ValueError(f"ApiVersions error code {error}")
    ranges: dict[int, tuple[int, int]] = {}
    for _ in range(reader.uvarint() - 1):
        key, low, high = reader.take(">h"), reader.take(">h"), reader.take(">h")
        ranges[key] = (low, high)
        reader.skip_tags()
    reader.take(">i")  # throttle time
    supported: dict[str, tuple[int, int]] = {}
    finalized: dict[str, int] = {}
    for _ in range(reader.uvarint()):
        tag, size = reader.uvarint(), reader.uvarint()
        end = reader.pos + size
        if tag == 0:
            for _ in range(reader.uvarint() - 1):
                name = reader.compact_string()
                supported[name] = (reader.take(">h"), reader.take(">h"))
                reader.skip_tags()
        elif tag == 2:
            for _ in range(reader.uvarint() - 1):
                name = reader.compact_string()
                finalized[name] = reader.take(">h")
                reader.take(">h")
                reader.skip_tags()
        reader.pos = end
    return BrokerApis(ranges, supported, finalized)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)
