"""A TCP proxy in front of a one-broker Kafka cluster that a test can cut and heal.

A plain TCP proxy only fronts the bootstrap connection: the broker's metadata names its own
address, and the client connects there directly. This one reads the Kafka protocol's framing,
remembers the API key and version of every request, and rewrites the broker list of every
Metadata response to name the proxy, so every connection of the client goes through it. Then
``cut()`` closes them all and refuses new ones (the broker is down, as the client sees it),
and ``heal()`` forwards again. The shared broker keeps serving everyone else.

Only what a producer needs is rewritten (Metadata, API key 3, any version); a consumer group's
coordinator (FindCoordinator) would still be reached directly.
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import suppress

METADATA = 3
#: the first flexible version of Metadata (compact arrays and strings, tagged fields)
METADATA_FLEXIBLE = 9


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _put_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def rewrite_metadata(body: bytes, version: int, host: str, port: int) -> bytes:
    """A Metadata response (after its correlation id) with every broker at ``host:port``."""
    pos = 0
    out = bytearray()
    flexible = version >= METADATA_FLEXIBLE
    if flexible:  # response header v1: tagged fields
        end = _skip_tags(body, pos)
        out += body[pos:end]
        pos = end
    if version >= 3:
        out += body[pos : pos + 4]  # throttle_time_ms
        pos += 4
    if flexible:
        n, pos = _uvarint(body, pos)
        brokers = n - 1
        out += _put_uvarint(n)
    else:
        (brokers,) = struct.unpack_from(">i", body, pos)
        out += body[pos : pos + 4]
        pos += 4
    for _ in range(brokers):
        out += body[pos : pos + 4]  # node_id
        pos += 4
        if flexible:
            length, pos = _uvarint(body, pos)
            pos += length - 1
            encoded = host.encode()
            out += _put_uvarint(len(encoded) + 1) + encoded
        else:
            (length,) = struct.unpack_from(">h", body, pos)
            pos += 2 + length
            encoded = host.encode()
            out += struct.pack(">h", len(encoded)) + encoded
        pos += 4
        out += struct.pack(">i", port)
        if version >= 1:  # rack
            start = pos
            if flexible:
                length, pos = _uvarint(body, pos)
                pos += max(length - 1, 0)
            else:
                (length,) = struct.unpack_from(">h", body, pos)
                pos += 2 + max(length, 0)
            out += body[start:pos]
        if flexible:
            end = _skip_tags(body, pos)
            out += body[pos:end]
            pos = end
    out += body[pos:]
    return bytes(out)


def _skip_tags(data: bytes, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    return pos


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return _read_exact(sock, size)


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class KafkaProxy:
    """Listens on 127.0.0.1 (a free port), forwards to ``broker`` (``host:port``) and names
    itself as the broker in Metadata responses."""

    def __init__(self, broker: str) -> None:
        host, port = broker.split(",")[0].rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.forwarding = True
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="kafka-proxy", daemon=True).start()

    def cut(self) -> None:
        """Close every connection and refuse new ones."""
        with self._lock:
            self.forwarding = False
            open_now, self._open = self._open, set()
        for s in open_now:
            _close(s)

    def heal(self) -> None:
        with self._lock:
            self.forwarding = True

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        self.cut()

    def __enter__(self) -> KafkaProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                forwarding = self.forwarding
                if forwarding:
                    self._open.add(client)
            if not forwarding:
                _close(client)
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target, timeout=10)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        requests: dict[int, tuple[int, int]] = {}
        threading.Thread(
            target=self._responses, args=(upstream, client, requests), daemon=True
        ).start()
        with suppress(OSError, struct.error):
            while (frame := _read_frame(client)) is not None:
                api_key, version, correlation = struct.unpack_from(">hhi", frame, 0)
                requests[correlation] = (api_key, version)
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
        _close(client)
        _close(upstream)

    def _responses(
        self, upstream: socket.socket, client: socket.socket, requests: dict[int, tuple[int, int]]
    ) -> None:
        with suppress(OSError, struct.error, IndexError):
            while (frame := _read_frame(upstream)) is not None:
                (correlation,) = struct.unpack_from(">i", frame, 0)
                api_key, version = requests.pop(correlation, (-1, -1))
                if api_key == METADATA:
                    body = rewrite_metadata(frame[4:], version, "127.0.0.1", self.port)
                    frame = frame[:4] + body
                client.sendall(struct.pack(">i", len(frame)) + frame)
        _close(client)
        _close(upstream)


def _close(s: socket.socket) -> None:
    with suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        s.close()
