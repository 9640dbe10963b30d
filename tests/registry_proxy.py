"""A TCP proxy in front of the real schema registry that a test can break and heal.

Tests of registry outages point a worker (or a codec) at the proxy instead of the registry, so
nothing real is stopped: the shared registry keeps serving everyone else.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from enum import StrEnum
from urllib.parse import urlsplit, urlunsplit


class Mode(StrEnum):
    #: bytes go both ways untouched
    FORWARD = "forward"
    #: the connection is accepted and closed at once (the client sees it reset or closed)
    REFUSE = "refuse"
    #: every request is answered ``503 Service Unavailable``
    UNAVAILABLE = "503"
    #: the connection is accepted and never answered (the client's timeout decides)
    SILENT = "silent"


_BODY_503 = b'{"error_code":50301,"message":"registry unavailable (test proxy)"}'
_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BODY_503), _BODY_503)
)


class RegistryProxy:
    """Listens on 127.0.0.1 (a free port) and treats each connection as ``mode`` says. Changing
    the mode closes the connections open so far, so a client's kept-alive connection cannot
    outlive an outage."""

    def __init__(self, registry_url: str) -> None:
        parts = urlsplit(registry_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))
        self.mode = Mode.FORWARD
        self.connections = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="registry-proxy", daemon=True).start()

    def set(self, mode: Mode) -> None:
        with self._lock:
            self.mode = mode
            open_now, self._open = self._open, set()
        for s in open_now:
            _close(s)

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        self.set(Mode.REFUSE)

    def __enter__(self) -> RegistryProxy:
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
                mode = self.mode
                self.connections += 1
                self._open.add(client)
            threading.Thread(target=self._serve, args=(client, mode), daemon=True).start()

    def _serve(self, client: socket.socket, mode: Mode) -> None:
        if mode is Mode.REFUSE:
            _close(client)
        elif mode is Mode.SILENT:
            with suppress(OSError):
                while client.recv(65536):
                    pass
            _close(client)
        elif mode is Mode.UNAVAILABLE:
            with suppress(OSError):
                _read_request(client)
                client.sendall(_503)
            _close(client)
        else:
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                _close(client)
                return
            upstream.settimeout(None)
            with self._lock:
                self._open.add(upstream)
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            _pump(client, upstream)


def _read_request(conn: socket.socket) -> None:
    """Read up to the end of one request's headers (the registry's GETs have no body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    _close(src)
    _close(dst)


def _close(s: socket.socket) -> None:
    with suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with suppress(OSError):
        s.close()
