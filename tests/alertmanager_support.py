"""A real Alertmanager (Debian's ``prometheus-alertmanager``) on a free port, routed by
docker/alertmanager/alertmanager.yml with its webhook receivers pointed at ``Hooks``, which
records every notification; shared by the alert bridge's tests and the routing tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support import ROOT, free_port

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
EXAMPLE_CONFIG = ROOT / "docker" / "alertmanager" / "alertmanager.yml"
HOOKS_BASE = "http://alert-hooks:9000/"
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


class Hooks:
    """Webhook receivers: every notification Alertmanager posts, with the path it posted to."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hooks.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notified(self, path: str, alert_id: str, status: str) -> dict[str, Any] | None:
        for p, body in list(self.received):
            for a in body.get("alerts", []):
                if p == path and a["labels"].get("alert_id") == alert_id and a["status"] == status:
                    return a
        return None


class Alertmanager:
    """A real Alertmanager on a free port, with the example routing pointed at ``hooks``."""

    def __init__(self, tmp: Path, hooks: Hooks) -> None:
        text = EXAMPLE_CONFIG.read_text()
        assert text.count(f"url: {HOOKS_BASE}") == 6 and "group_wait: 30s" in text
        text = text.replace(HOOKS_BASE, hooks.url)
        text = text.replace("group_wait: 30s", "group_wait: 1s")
        text = text.replace("group_interval: 5m", "group_interval: 1s")
        self.config = tmp / "alertmanager.yml"
        self.config.write_text(text)
        self.storage = tmp / "am-data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "alertmanager.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert BINARY is not None
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={self.config}",
                    f"--storage.path={self.storage}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",  # no gossip port: a single instance
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(f"Alertmanager ready ({self.log.read_text()[-500:]})", ready, 20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        self.proc = None

    def alert(self, alert_id: str) -> dict[str, Any] | None:
        """The active alert labelled ``alert_id`` (Alertmanager lists no resolved alerts)."""
        r = httpx.get(
            f"{self.url}/api/v2/alerts", params={"filter": f'alert_id="{alert_id}"'}, timeout=5
        )
        r.raise_for_status()
        found = r.json()
        assert len(found) <= 1, found
        return found[0] if found else None
