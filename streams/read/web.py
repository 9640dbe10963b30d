"""The worker's HTTP API: read one execution or approval, follow an execution live (SSE),
and Prometheus metrics.

Safe by default: it binds 127.0.0.1 unless told otherwise, Faust's own unauthenticated
``/table`` and ``/router`` endpoints are off, and with ``VIGIL_API_TOKEN`` set every path the
server answers, ``/`` and unknown ones included, wants ``Authorization: Bearer <token>``: one
aiohttp middleware checks it before any view runs, so no view (Faust's own index page among
them) can forget to. A request for an execution owned by another worker is redirected there
(307), SSE included.

No handler does work proportional to the table on the event loop: an approval is found
through ``streams/read/approval_index.py``, never by reading every entry.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from typing import Any

import faust
from aiohttp import web as aioweb
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from yarl import URL

from streams.core.approvals import ApprovalBook
from streams.engine.processor import Processor
from streams.read.approval_index import ApprovalIndex
from streams.read.feed import Feed
from streams.read.metrics import Metrics
from streams.read.readmodel import approval_view, execution_view
from streams.settings import Settings

ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+\-]{0,255}$")
#: How long an approval lookup the index cannot answer yet (a rebuild after a rebalance is
#: reading the table) waits for it before answering 503.
INDEX_WAIT = 5.0


def _error(
    status: int, message: str, headers: dict[str, str] | None = None, **extra: Any
) -> aioweb.Response:
    return aioweb.json_response(
        {"error": message, "status": status, **extra}, status=status, headers=headers
    )


def _require_token(app: faust.App, token: str | None) -> None:
    """With a token configured, every request must carry it, whatever its path: checked by a
    middleware of the aiohttp application (Faust serves its own views, such as the index page
    at ``/``, from the same application). Compared in constant time; never logged."""
    if not token:
        return
    expected = f"Bearer {token}".encode()

    @aioweb.middleware
    async def bearer_token(request: Any, handler: Any) -> Any:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, expected):
            return await handler(request)
        return _error(401, "missing or wrong bearer token")

    app.web.web_app.middlewares.append(bearer_token)


def _owned(app: faust.App, changelog: str) -> set[int]:
    """The partitions of the executions table this worker is active for."""
    return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == changelog}


class _IndexCollector:
    """The approval index on ``/metrics``: its size, and the table rows its rebuilds read
    (a lookup never reads any: the count moves only after a rebalance or a refresh)."""

    def __init__(self, index: ApprovalIndex) -> None:
        self.index = index

    def collect(self) -> Any:
        stats = self.index.stats()
        g = GaugeMetricFamily("vigil_approval_index_entries", "Approval requests indexed")
        g.add_metric([], stats["entries"])
        yield g
        c = CounterMetricFamily(
            "vigil_approval_index_rows_read",
            "Table rows read to build the approval index (in a worker thread, after a "
            "rebalance or a refresh; never by a lookup)",
        )
        c.add_metric([], stats["rows_read"])
        yield c
        g = GaugeMetricFamily(
            "vigil_approval_index_complete",
            "1 when every owned partition is indexed, 0 while a rebuild reads the table",
        )
        g.add_metric([], stats["complete"])
        yield g


def register_web(
    app: faust.App, processor: Processor, feed: Feed, settings: Settings, metrics: Metrics
) -> ApprovalIndex:
    """Mount the API on the worker's web server. Returns the approval index, which the
    pipeline feeds with the outputs of each batch (``ApprovalIndex.note``)."""
    token = settings.api_token
    changelog = f"{settings.app_id}-executions-changelog"
    _require_token(app, token)
    index = ApprovalIndex(processor.stores.executions, processor.partitions)
    metrics.registry.register(_IndexCollector(index))  # type: ignore[arg-type]

    @app.on_partitions_revoked.connect
    async def _index_revoked(app: faust.App, revoked: Any, **_: Any) -> None:
        index.revoke()

    @app.on_rebalance_complete.connect
    async def _index_assigned(app: faust.App, **_: Any) -> None:
        """Sent once the tables of the new assignment are recovered from their changelogs."""
        index.assign(_owned(app, changelog))

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
            processor.links.get(execution_id),
        )

    @app.page("/v1/executions/{execution_id}")
    class ExecutionResource(faust.web.View):
        async def get(self, request: Any, execution_id: str) -> Any:
            if r := _valid(execution_id):
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
            if r := _valid(execution_id):
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
                        await asyncio.wait_for(
                            waiter.wait(), settings.sse_keepalive.total_seconds()
                        )
                    except TimeoutError:
                        await resp.write(b": keep-alive\n\n")
            except (ConnectionResetError, asyncio.CancelledError):
                pass
            finally:
                feed.unsubscribe(execution_id, waiter)
            return resp

    def approval_here(request_id: str) -> dict[str, Any] | None:
        """The request's view from the execution the index names: one table read."""
        execution_id = index.find(request_id)
        if execution_id is None:
            return None
        value = processor.approvals.get(execution_id)
        book = ApprovalBook.model_validate_json(value) if value else None
        if book is None or request_id not in book.requests:
            index.forget(request_id, execution_id)  # purged after the retention
            return None
        return approval_view(book, request_id, processor.thresholds_for)

    @app.page("/v1/approvals/{request_id}")
    class ApprovalResource(faust.web.View):
        async def get(self, request: Any, request_id: str) -> Any:
            if r := _valid(request_id):
                return r
            view = approval_here(request_id)
            if view is None and not index.complete():
                await index.wait_complete(INDEX_WAIT)
                view = approval_here(request_id)
            if view is not None:
                return aioweb.json_response(view)
            rebuilding = not index.complete()
            if request.query.get("local") != "1":
                found, others_rebuilding = await _ask_others(app, request_id, token)
                if found is not None:
                    return found
                rebuilding = rebuilding or others_rebuilding
            if rebuilding:
                return _error(
                    503,
                    "approval index rebuilding after a rebalance; try again",
                    headers={"Retry-After": "1"},
                )
            return _error(404, f"no approval request {request_id!r}")

    @app.page("/v1/executions/{execution_id}/approvals/{request_id}")
    class ExecutionApprovalResource(faust.web.View):
        """One approval request of one execution: request ids repeat across executions, so
        this path names both (docs/rules.md#ids-and-keys), and needs no index: one read of
        the execution's entry, on the worker that owns it."""

        async def get(self, request: Any, execution_id: str, request_id: str) -> Any:
            if r := _valid(execution_id) or _valid(request_id):
                return r
            if r := redirect(request, execution_id):
                return r
            value = processor.approvals.get(execution_id)
            book = ApprovalBook.model_validate_json(value) if value else None
            if book is None or request_id not in book.requests:
                return _error(404, f"no approval request {request_id!r} in {execution_id!r}")
            return aioweb.json_response(approval_view(book, request_id, processor.thresholds_for))

    @app.page("/metrics")
    class MetricsResource(faust.web.View):
        async def get(self, request: Any) -> Any:
            return aioweb.Response(
                body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"}
            )

    return index


def _valid(identifier: str) -> aioweb.Response | None:
    if ID.match(identifier):
        return None
    return _error(400, "malformed id: 1-256 characters of letters, digits and ._:@/+-")


async def _ask_others(
    app: faust.App, request_id: str, token: str | None
) -> tuple[aioweb.Response | None, bool]:
    """Approval ids do not say their partition: ask the other workers (local lookups only).
    Returns the view one of them holds, and whether one answered that its index is still
    being rebuilt (then "not found" is not known yet)."""
    me = str(app.conf.canonical_url).rstrip("/")
    try:
        hosts = [h for h in app.router.tables_metadata() if h.rstrip("/") != me]
    except Exception:
        return None, False
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    rebuilding = False
    for host in hosts:
        url = URL(host).with_path(f"/v1/approvals/{request_id}").with_query(local="1")
        try:
            async with app.http_client.get(url, headers=headers) as resp:
                if resp.status == 200:
                    return aioweb.json_response(await resp.json()), False
                rebuilding = rebuilding or resp.status == 503
        except Exception:  # a worker that does not answer is not an error for the caller
            continue
    return None, rebuilding
