"""The page's routes over real HTTP (aiohttp test server, no Kafka): what ``/`` and
``/static/*`` serve, and ``/api/stream``: the read token, the change frames the hub publishes,
keep-alive comments, and a subscriber the hub drops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from streams.console import page
from streams.console.service import ChangeHub

TOKEN = "s3cret/with+chars="


@dataclass
class Ctx:
    hub: ChangeHub
    read_token: str | None
    write_token: str | None = "the-write-token"


def serve(read_token: str | None, body: Callable[[str, ChangeHub], Awaitable[None]]) -> None:
    async def main() -> None:
        hub = ChangeHub()
        app = web.Application()
        page.register_page(app, Ctx(hub, read_token))
        server = TestServer(app)
        await server.start_server()
        try:
            await asyncio.wait_for(body(str(server.make_url("")).rstrip("/"), hub), 20)
        finally:
            await server.close()

    asyncio.run(main())


async def frames(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """SSE messages and comments, one string each."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            yield frame.decode()


def test_index_and_static_files() -> None:
    async def body(base: str, _: ChangeHub) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/") as r:
                assert r.status == 200 and r.content_type == "text/html"
                text = await r.text()
                assert '<script src="/static/app.js"' in text
                assert "script-src 'self'" in r.headers["Content-Security-Policy"]
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css")):
                async with s.get(f"{base}/static/{name}") as r:
                    assert r.status == 200 and r.content_type == ctype
                    assert r.headers["X-Content-Type-Options"] == "nosniff"
            for name in ("nothing.js", "..%2Fpage.py", "%2e%2e%2fpage.py", "page.py"):
                async with s.get(f"{base}/static/{name}") as r:
                    assert r.status == 404, name

    # the page and its files hold no data: served even when a read token is configured
    serve(TOKEN, body)


def test_page_script_puts_data_in_the_dom_as_text_only() -> None:
    """The page escapes by construction: no markup is ever built from a string."""
    files = page.load_static()
    script = files["app.js"][0].decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    # and the read token never goes into a URL (the stream takes it as a cookie)
    assert "token=" not in script.replace("vigil_console_token=", "")


@pytest.mark.parametrize(
    ("headers", "cookies", "status"),
    [
        ({}, {}, 401),
        ({"Authorization": "Bearer wrong"}, {}, 401),
        ({}, {page.TOKEN_COOKIE: "wrong"}, 401),
        ({"Authorization": f"Bearer {TOKEN}"}, {}, 200),
        ({"Authorization": "Bearer the-write-token"}, {}, 200),
        ({}, {page.TOKEN_COOKIE: "s3cret%2Fwith%2Bchars%3D"}, 200),  # as the page encodes it
    ],
)
def test_stream_wants_the_read_token(
    headers: dict[str, str], cookies: dict[str, str], status: int
) -> None:
    async def body(base: str, _: ChangeHub) -> None:
        async with (
            aiohttp.ClientSession(cookies=cookies) as s,
            s.get(f"{base}/api/stream", headers=headers) as r,
        ):
            assert r.status == status
            if status == 200:
                assert r.content_type == "text/event-stream"
                first = await anext(frames(r))
                assert first == "event: hello\ndata: {}"
            else:
                assert "token" in (await r.json())["error"]

    serve(TOKEN, body)


def test_stream_sends_each_change_and_keeps_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page, "KEEPALIVE_SECONDS", 0.3)
    change = [{"kind": "operation", "id": "op-1", "execution_id": "ex-1"}]

    async def body(base: str, hub: ChangeHub) -> None:
        async with aiohttp.ClientSession() as s, s.get(f"{base}/api/stream") as r:
            it = frames(r)
            assert (await anext(it)).startswith("event: hello")
            assert await anext(it) == ": keep-alive"  # nothing published for 0.3 s
            hub.publish(change)
            got = await anext(it)
            while got == ": keep-alive":
                got = await anext(it)
            event, data = got.split("\n")
            assert event == "event: change"
            assert json.loads(data.removeprefix("data: ")) == change

    serve(None, body)


def test_stream_ends_when_the_hub_drops_the_subscriber() -> None:
    """A subscriber that falls behind is dropped by the hub; its response ends (the page's
    EventSource reconnects and refetches) and the service goes on serving others."""

    async def body(base: str, hub: ChangeHub) -> None:
        async with aiohttp.ClientSession() as s, s.get(f"{base}/api/stream") as r:
            it = frames(r)
            assert (await anext(it)).startswith("event: hello")
            # flood without reading: the bounded queue overflows and the hub drops us
            for n in range(100_000):
                hub.publish([{"kind": "execution", "id": f"ex-{n}", "execution_id": f"ex-{n}"}])
                if n % 1000 == 0:
                    await asyncio.sleep(0)
            seen = [f async for f in it]
            assert 0 < len(seen) < 100_000
        async with aiohttp.ClientSession() as s, s.get(f"{base}/api/stream") as r:
            assert (await anext(frames(r))).startswith("event: hello")

    serve(None, body)


def test_an_open_stream_ends_when_the_application_shuts_down() -> None:
    """A stopping console ends the pages' streams at once (``on_shutdown``) rather than
    waiting out its shutdown timeout for a page that never hangs up."""

    async def main() -> None:
        hub = ChangeHub()
        app = web.Application()
        page.register_page(app, Ctx(hub, None))
        server = TestServer(app)
        await server.start_server()
        try:
            base = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession() as s, s.get(f"{base}/api/stream") as r:
                it = frames(r)
                assert (await anext(it)).startswith("event: hello")
                await app.shutdown()
                rest = await asyncio.wait_for(_drain(it), 5)  # the stream ends, no hang
                assert rest == []
        finally:
            await server.close()

    asyncio.run(main())


async def _drain(it: AsyncIterator[str]) -> list[str]:
    return [f async for f in it if f != ": keep-alive"]
