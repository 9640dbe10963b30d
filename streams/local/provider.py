"""A tiny payments provider to reconcile against: the bundled source of truth of ``vigil demo``,
the tests and ``bench/reconcile.py``.

``GET /v1/payments/by-key/{idempotency_key}`` answers 200 ``{"id", "status",
"idempotency_key"}`` (status ``succeeded`` or ``processing``) or 404 ``{"error":
"not_found"}``; with a token set, a request without ``Authorization: Bearer <token>`` gets 401.
``mode`` makes it misbehave like real providers do: ``down`` (503), ``malformed`` (200 with a
body that is not JSON), ``unauthorized`` (401 whatever the token); ``delay`` slows every answer.
It runs on a thread of its own with its own event loop, so a test or the demo changes its
payments and mode directly.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

#: the reconcilers file (TOML) of a connector checked against this provider
RECONCILERS_TOML = """
[connectors.{connector}]
authoritative = true
settle_delay = "{settle_delay}"
max_attempts = {max_attempts}
give_up_after = "{give_up_after}"
backoff_initial = "{backoff_initial}"
backoff_max = "{backoff_max}"
timeout = "{timeout}"
concurrency = {concurrency}
rate = {rate}

[connectors.{connector}.http]
url = "{url}/v1/payments/by-key/{{idempotency_key}}"
headers = {{ Authorization = "Bearer ${{{token_env}}}" }}
effect_ref_field = "id"

[[connectors.{connector}.http.rules]]
status = 200
field = "status"
equals = "succeeded"
finding = "VERIFIED"

[[connectors.{connector}.http.rules]]
status = 200
field = "status"
equals = "processing"
finding = "PENDING"

[[connectors.{connector}.http.rules]]
status = 404
finding = "ABSENT"
"""


def reconcilers_toml(url: str, connector: str = "payments", **kw: Any) -> str:
    """The reconcilers file for ``connector`` against the provider at ``url``; ``kw``
    overrides the policy (durations as text) and ``token_env`` names the token's variable."""
    values: dict[str, Any] = {
        "connector": connector,
        "url": url.rstrip("/"),
        "settle_delay": "0s",
        "max_attempts": 8,
        "give_up_after": "1h",
        "backoff_initial": "1s",
        "backoff_max": "30s",
        "timeout": "5s",
        "concurrency": 4,
        "rate": 50,
        "token_env": "VIGIL_DEMO_PROVIDER_TOKEN",
    }
    values.update(kw)
    return RECONCILERS_TOML.format(**values)


@dataclass
class Provider:
    """The provider's state: payments by idempotency key, how it misbehaves, what it was
    asked (paths, in order)."""

    token: str | None = None
    payments: dict[str, dict[str, str]] = field(default_factory=dict)
    mode: str = "ok"
    delay: float = 0.0
    requests: list[str] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pay(self, key: str, payment_id: str, status: str = "succeeded") -> None:
        self.payments[key] = {"id": payment_id, "status": status, "idempotency_key": key}

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        self.requests.append(request.path)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.mode == "down":
            return web.json_response({"error": "unavailable"}, status=503)
        if self.mode == "unauthorized" or (
            self.token and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.mode == "malformed":
            return web.Response(status=200, text="<html>oops", content_type="text/html")
        payment = self.payments.get(request.match_info["key"])
        if payment is None:
            return web.json_response({"error": "not_found"}, status=404)
        return web.json_response(payment)

    def start(self) -> Provider:
        def run() -> None:
            from aiohttp import web

            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_get("/v1/payments/by-key/{key}", self._handle)
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            loop.run_until_complete(site.start())
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="payments-provider", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the payments provider did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)


__all__ = ["Provider", "reconcilers_toml"]
