"""The worker's HTTP API: read one execution or approval, follow an execution live (SSE),
and Prometheus metrics.

Safe by default: it binds 127.0.0.1 unless told otherwise, Faust's own unauthenticated
``/table`` and ``/router`` endpoints are off, and with ``VIGIL_API_TOKEN`` set every endpoint
wants ``Authorization: Bearer <token>``. A request for an execution owned by another worker
is redirected there (307), SSE included.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from typing import Any

import faust
from aiohttp import web as aioweb
from yarl import URL

from streams.core.approvals import ApprovalBook
from streams.feed import Feed
from streams.metrics import Metrics
from streams.processor import Processor
from streams.readmodel import approval_view, execution_view
from streams.settings import Settings

ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+\-]{0,255}$")


def _error(status: int, message: str, **extra: Any) -> aioweb.Response:
    return aioweb.json_response({"error": message, "status": status, **extra}, status=status)


def register_web(
    app: faust.App, processor: Processor, feed: Feed, settings: Settings, metrics: Metrics
) -> None:
    token = settings.api_token
    changelog = f"{settings.app_id}-executions-changelog"

    def denied(request: Any) -> aioweb.Response | None:
        if not token:
            return None
        given = request.headers.get("Authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:], token):
            return None
        return _error(401, "missing or wrong bearer token")

    def owner_url(execution_id: str) -> URL | None:
        """The worker that owns the execution's partition, if it is not this one."""
        partition = processor.partition_of(execution_id)
        try:
            hosts = app.router.table_metadata("executions")
        except Exception:  # no assignment yet: serve what we hold
            return None
        me = str(app.conf.canonical_url).rstrip("/")
        for host, topics in hosts.items():
            if partition in topics.get(changelog, ()) and host.rstrip("/") != me:
                return URL(host)
        return None

    def redirect(request: Any, execution_id: str) -> aioweb.Response | None:
        owner = owner_url(execution_id)
        if owner is None:
            return None
        target = request.url.with_scheme(owner.scheme).with_host(owner.host).with_port(owner.port)
        return aioweb.Response(status=307, headers={"Location": str(target)})

    def lookup(execution_id: str) -> dict[str, Any] | None:
        return execution_view(
            processor.inflight.get(execution_id),
            processor.closed.get(execution_id),
            processor.operations.get(execution_id),
            processor.approvals.get(execution_id),
            processor.thresholds_for,
        )

    @app.page("/v1/executions/{execution_id}")
    class ExecutionResource(faust.web.View):
        async def get(self, request: Any, execution_id: str) -> Any:
            if (r := denied(request)) or (r := _valid(execution_id)):
                return r
            if r := redirect(request, execution_id):
                return r
            view = lookup(execution_id)
            if view is None:
                return _error(404, f"no execution {execution_id!r}")
            return aioweb.json_response(view)

    @app.page("/v1/executions/{execution_id}/stream")
    class ExecutionStream(faust.web.View):
        async def get(self, request: Any, execution_id: str) -> Any:
            if (r := denied(request)) or (r := _valid(execution_id)):
                return r
            if r := redirect(request, execution_id):
                return r
            if lookup(execution_id) is None and not feed.held(execution_id):
                return _error(404, f"no execution {execution_id!r}")
            resp = aioweb.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                }
            )
            await resp.prepare(request)
            last = request.headers.get("Last-Event-ID")
            waiter = feed.subscribe(execution_id)
            try:
                while True:
                    waiter.clear()
                    events = feed.held(execution_id, last)
                    for e in events:
                        await resp.write(e.sse())
                        last = e.id
                    if any(e.terminal for e in events):
                        break
                    try:
                        await asyncio.wait_for(waiter.wait(), settings.sse_keepalive)
                    except TimeoutError:
                        await resp.write(b": keep-alive\n\n")
            except (ConnectionResetError, asyncio.CancelledError):
                pass
            finally:
                feed.unsubscribe(execution_id, waiter)
            return resp

    @app.page("/v1/approvals/{request_id}")
    class ApprovalResource(faust.web.View):
        async def get(self, request: Any, request_id: str) -> Any:
            if (r := denied(request)) or (r := _valid(request_id)):
                return r
            for value in list(processor.approvals.values()):
                book = ApprovalBook.model_validate_json(value)
                if request_id in book.requests:
                    view = approval_view(book, request_id, processor.thresholds_for)
                    if view is not None:
                        return aioweb.json_response(view)
            if request.query.get("local") != "1":
                found = await _ask_others(app, request, request_id, token)
                if found is not None:
                    return found
            return _error(404, f"no approval request {request_id!r}")

    @app.page("/metrics")
    class MetricsResource(faust.web.View):
        async def get(self, request: Any) -> Any:
            if r := denied(request):
                return r
            return aioweb.Response(
                body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"}
            )


def _valid(identifier: str) -> aioweb.Response | None:
    if ID.match(identifier):
        return None
    return _error(400, "malformed id: 1-256 characters of letters, digits and ._:@/+-")


async def _ask_others(
    app: faust.App, request: Any, request_id: str, token: str | None
) -> aioweb.Response | None:
    """Approval ids do not say their partition: ask the other workers (local lookups only)."""
    me = str(app.conf.canonical_url).rstrip("/")
    try:
        hosts = [h for h in app.router.tables_metadata() if h.rstrip("/") != me]
    except Exception:
        return None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for host in hosts:
        url = URL(host).with_path(f"/v1/approvals/{request_id}").with_query(local="1")
        try:
            async with app.http_client.get(url, headers=headers) as resp:
                if resp.status == 200:
                    return aioweb.json_response(await resp.json())
        except Exception:  # a worker that does not answer is not an error for the caller
            continue
    return None
