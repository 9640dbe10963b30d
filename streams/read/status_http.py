"""A process's own ``/metrics`` and ``/healthz`` on a small HTTP server of its own.

For the processes that have no web server (the ticker, the alert bridge): Prometheus scrapes
``/metrics`` and the container's health check (docker/healthcheck.py) asks ``/healthz``. The
server runs on a daemon thread, so neither a scrape nor a probe waits for the process's loop.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest


def listen_address(
    host_env: str,
    port_env: str,
    default_port: int,
    host: str | None = None,
    port: int | None = None,
) -> tuple[str, int]:
    """The arguments, else the environment variables, else 127.0.0.1 and ``default_port``.
    Port 0 means no server."""
    host = host or os.environ.get(host_env, "").strip() or "127.0.0.1"
    if port is None:
        port = int(os.environ.get(port_env, "").strip() or default_port)
    return host, port


def serve(
    registry: CollectorRegistry,
    healthy: Callable[[], tuple[bool, str]],
    host: str,
    port: int,
    *,
    unhealthy_word: str = "STALE",
    thread_name: str = "status-http",
) -> ThreadingHTTPServer:
    """``/metrics`` (the registry) and ``/healthz`` (200 ``{"status": "OK"}`` or 503 with
    ``unhealthy_word``, and ``healthy()``'s detail either way) on a daemon thread. Stop it
    with ``shutdown()`` and ``server_close()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif path == "/healthz":
                ok, detail = healthy()
                body = json.dumps({"status": "OK" if ok else unhealthy_word, "detail": detail})
                self._answer(200 if ok else 503, body.encode(), "application/json")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=thread_name, daemon=True).start()
    return server
