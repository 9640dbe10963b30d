"""The operator's web page: ``/`` (one HTML file), ``/static/{name}`` (its script and style,
shipped as package data) and ``/api/stream`` (Server-Sent Events of what the view applied).

The page has no build step: plain HTML, CSS and JavaScript read the console's JSON API and
refetch what an SSE change names. ``/`` and ``/static/*`` hold no data, so they are served
without the read token (a browser's first navigation cannot send a header); every byte of
data comes from the API, which the page calls with the token the operator pasted.

``/api/stream`` wants the read token (or the write token) when one is set. ``EventSource``
cannot send headers, so besides ``Authorization: Bearer`` it accepts the cookie
``vigil_console_token`` that the page sets from the token the operator pasted (URL-encoded,
``SameSite=Strict``): the token never appears in a URL, so no access log records it. The API's
guard checks the same for every ``/api/`` path; the stream checks again so that it is never
open on an application without that guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import unquote

from aiohttp import web

#: an SSE comment this often keeps proxies and the browser from closing an idle stream
KEEPALIVE_SECONDS = 15.0
#: the cookie the page sets so that ``EventSource`` carries the token (the API's guard reads it too)
TOKEN_COOKIE = "vigil_console_token"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}

#: Defence in depth behind the page's own escaping: only this origin's script, style and
#: connections; no inline script, no framing (clickjacking of the review buttons).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def load_static() -> dict[str, tuple[bytes, str]]:
    """Every file of ``streams/console/static`` by name, with its content type: read once, so a
    request can only ever name one of them (no path is built from the URL)."""
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("streams.console") / "static"
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if entry.is_file() and suffix in _TYPES:
            out[name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def token_ok(request: web.Request, tokens: list[str]) -> bool:
    """With no read token configured the stream is open; otherwise the bearer header or the
    page's cookie must carry one of ``tokens`` (constant-time comparison)."""
    if not tokens:
        return True
    header = request.headers.get("Authorization", "")
    cookie = request.cookies.get(TOKEN_COOKIE)
    given = [header.removeprefix("Bearer ")] if header.startswith("Bearer ") else []
    if cookie:
        given.append(unquote(cookie))
    return any(hmac.compare_digest(g.encode(), t.encode()) for g in given for t in tokens)


def sse_frame(event: str, data: Any) -> bytes:
    """One SSE message; ``json.dumps`` keeps the data on one line."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def stream_changes(
    response: web.StreamResponse,
    changes: AsyncIterator[list[dict[str, Any]]],
    keepalive: float = KEEPALIVE_SECONDS,
    stop: asyncio.Event | None = None,
) -> None:
    """Write each published list of changes as one ``change`` event, and a keep-alive comment
    whenever ``keepalive`` seconds pass without one, until ``stop`` is set (the response then
    ends cleanly). The pending ``__anext__`` is awaited across keep-alives rather than
    cancelled, since cancelling it would close the subscription."""
    iterator = aiter(changes)
    pending: asyncio.Future[list[dict[str, Any]]] | None = None
    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            waits: set[asyncio.Future[Any]] = {pending} | ({stopped} if stopped else set())
            done, _ = await asyncio.wait(
                waits, timeout=keepalive, return_when=asyncio.FIRST_COMPLETED
            )
            if stopped is not None and stopped in done:
                return
            if not done:
                await response.write(b": keep-alive\n\n")
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:  # the hub dropped this subscriber: the page reconnects
                return
            pending = None
            await response.write(sse_frame("change", batch))
    finally:
        if stopped is not None and not stopped.done():
            stopped.cancel()
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        close = getattr(iterator, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


def register_page(app: web.Application, ctx: Any) -> None:
    """Add the page's routes to the console's application (called by ``create_app``)."""
    files = load_static()
    #: set when the application shuts down: every open event stream ends (cleanly), so that
    #: a stopping console does not wait out its shutdown timeout for pages that never hang up
    stopping = asyncio.Event()

    async def end_streams(_: web.Application) -> None:
        stopping.set()

    async def index(_: web.Request) -> web.Response:
        body, ctype = files["index.html"]
        return web.Response(body=body, headers={"Content-Type": ctype, **SECURITY_HEADERS})

    async def static(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            return web.json_response({"error": "no such file"}, status=404)
        body, ctype = found
        return web.Response(body=body, headers={"Content-Type": ctype, **SECURITY_HEADERS})

    async def stream(request: web.Request) -> web.StreamResponse:
        read = getattr(ctx, "read_token", None)
        tokens = [t for t in (read, getattr(ctx, "write_token", None)) if t] if read else []
        if not token_ok(request, tokens):
            return web.json_response({"error": "missing or wrong read token"}, status=401)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        try:
            await response.write(sse_frame("hello", {}))
            await stream_changes(response, ctx.hub.subscribe(), KEEPALIVE_SECONDS, stopping)
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    app.on_shutdown.append(end_streams)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/stream", stream)
