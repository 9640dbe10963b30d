"""The console's JSON API: lists, one execution, its timeline, a summary, the lag, health, and
what the lists accept (``/api/lists``).

Every answer comes from the SQLite view (queries run in worker threads, each on its own
connection, never on the event loop) and says as of which offsets and event time it is, and
how far behind the topics the console is. A bad parameter answers 400 with the values that
would have been accepted; nothing a client sends makes it answer 500.

With ``VIGIL_CONSOLE_TOKEN`` set, every ``/api/`` path wants ``Authorization: Bearer <token>``
(the write token is accepted too), or the same token in the ``vigil_console_token`` cookie (a
page's ``EventSource`` cannot send a header). ``/healthz`` stays open for load balancers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from streams.console.service import ConsoleContext
from streams.console.view import LISTS, QueryError

log = logging.getLogger("vigil.console.api")
TOKEN_COOKIE = "vigil_console_token"
CTX_KEY: web.AppKey[ConsoleContext] = web.AppKey("console_ctx", ConsoleContext)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, "status": status, **extra}, status=status)


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape")
    )


def read_allowed(request: web.Request, ctx: ConsoleContext) -> bool:
    """Does the request carry the read (or write) token, when one is configured?"""
    if not ctx.read_token:
        return True
    tokens = [t for t in (ctx.read_token, ctx.write_token) if t]
    header = request.headers.get("Authorization", "")
    # the page sets the cookie with encodeURIComponent(token)
    cookie = unquote(request.cookies.get(TOKEN_COOKIE, ""))
    return any(_same(header, f"Bearer {t}") or (cookie and _same(cookie, t)) for t in tokens)


def _middlewares(ctx: ConsoleContext) -> list[Any]:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/api/") and not read_allowed(request, ctx):
            return error(401, "missing or wrong token (Authorization: Bearer <token>)")
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.content_type != "application/json":
                return error(exc.status, exc.reason)
            raise
        except QueryError as exc:
            return error(400, str(exc), allowed=exc.allowed)
        except Exception:
            log.exception("console request failed: %s", request.path_qs[:200])
            return error(500, "internal error (logged)")

    return [guard]


def _params(request: web.Request) -> dict[str, str]:
    """Query parameters, each given once."""
    out: dict[str, str] = {}
    for key in request.query:
        values = request.query.getall(key)
        if len(values) > 1:
            raise QueryError(f"{key!r} given {len(values)} times", {"repeat": "none"})
        out[key] = values[0]
    return out


def _with_lag(ctx: ConsoleContext, body: dict[str, Any]) -> dict[str, Any]:
    """``as_of`` with the lag and the view's freshness: ``fresh_at``, when the view last held
    every record the topics held (wall clock; None while catching up), and ``now``, the
    server's wall clock that ages are measured from."""
    as_of = body.get("as_of")
    if isinstance(as_of, dict):
        as_of["lag"] = ctx.total_lag()
        as_of["fresh_at"] = ctx.fresh_at()
    return body


def create_app(ctx: ConsoleContext) -> web.Application:
    """The console's aiohttp application: this module's routes, then the page's and the
    review's when those modules are installed."""
    app = web.Application(middlewares=_middlewares(ctx), client_max_size=64 * 1024)
    app[CTX_KEY] = ctx
    view = ctx.view

    def list_handler(name: str) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            params = _params(request)
            page = await asyncio.to_thread(view.query, name, params)
            return web.json_response(_with_lag(ctx, page.to_json()))

        return handle

    for name in LISTS:
        app.router.add_get(f"/api/{name}", list_handler(name))

    def _execution_id(request: web.Request) -> str:
        ex = request.match_info["execution_id"]
        if not ex or len(ex) > 256:
            raise QueryError("execution id: 1 to 256 characters", {"execution_id": "1..256"})
        return ex

    async def execution(request: web.Request) -> web.Response:
        ex = _execution_id(request)
        body = await asyncio.to_thread(view.execution, ex)
        if body is None:
            return error(404, f"no execution {ex!r} in the console's view")
        return web.json_response(_with_lag(ctx, body))

    async def timeline(request: web.Request) -> web.Response:
        ex = _execution_id(request)
        body = await asyncio.to_thread(view.timeline, ex)
        if body is None:
            return error(404, f"no execution {ex!r} in the console's view")
        return web.json_response(_with_lag(ctx, body))

    async def summary(request: web.Request) -> web.Response:
        if request.query:
            raise QueryError("the summary takes no parameters", {"params": []})
        return web.json_response(_with_lag(ctx, await asyncio.to_thread(view.summary)))

    async def lag(request: web.Request) -> web.Response:
        rows = await asyncio.to_thread(ctx.lag)
        total = ctx.total_lag()
        return web.json_response(
            {
                "partitions": rows,
                "lag": total,
                "caught_up": total == 0,
                "consumer_alive": ctx.status.alive(),
                "as_of": _with_lag(ctx, {"as_of": await asyncio.to_thread(view.as_of)})["as_of"],
            }
        )

    async def lists(request: web.Request) -> web.Response:
        """Every list with its filters (and their allowed values), defaults and sorts: what a
        client needs to build its controls without a copy of them."""
        if request.query:
            raise QueryError("/api/lists takes no parameters", {"params": []})
        return web.json_response({name: spec.describe() for name, spec in LISTS.items()})

    async def healthz(request: web.Request) -> web.Response:
        if ctx.status.alive():
            return web.json_response({"status": "ok", "lag": ctx.total_lag()})
        return error(503, "the consumer thread is not running", detail=ctx.status.error)

    app.router.add_get("/api/executions/{execution_id}", execution)
    app.router.add_get("/api/executions/{execution_id}/timeline", timeline)
    app.router.add_get("/api/summary", summary)
    app.router.add_get("/api/lists", lists)
    app.router.add_get("/api/lag", lag)
    app.router.add_get("/healthz", healthz)

    try:
        from streams.console.page import register_page
    except ImportError:
        log.info("console page not installed")
    else:
        register_page(app, ctx)
    try:
        from streams.console.review import register_review
    except ImportError:
        log.info("console review not installed")
    else:
        register_review(app, ctx)
    return app
