"""``vigil console`` as a process: the consumer thread (``streams/console/service.py``) and the
aiohttp server (``streams/console/api.py``) around one view, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from streams.console.api import create_app
from streams.console.service import ChangeHub, ConsoleConsumer, ConsoleContext, ConsumerStatus
from streams.console.settings import ConsoleSettings
from streams.console.view import ConsoleView
from streams.kafka.topics import Topics
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.contracts.codec import AvroCodec
    from streams.kafka.clients import RecordProducer

log = logging.getLogger("vigil.console")


def _producer_factory(settings: Settings, codec: AvroCodec) -> Callable[[], RecordProducer]:
    made: list[RecordProducer] = []
    lock = threading.Lock()

    def factory() -> RecordProducer:
        from streams.kafka.clients import RecordProducer

        with lock:
            if not made:
                made.append(RecordProducer(settings, codec))
            return made[0]

    return factory


async def serve(settings: Settings, console: ConsoleSettings, codec: AvroCodec) -> None:
    """Run until SIGTERM or SIGINT."""
    from aiohttp import web

    view = ConsoleView(console.db)
    hub = ChangeHub()
    hub.bind(asyncio.get_running_loop())
    status = ConsumerStatus()
    ctx = ConsoleContext(
        view=view,
        settings=settings,
        hub=hub,
        read_token=console.read_token,
        write_token=console.write_token,
        producer_factory=_producer_factory(settings, codec),
        console=console,
        status=status,
        topics=Topics.from_settings(settings),
    )
    consumer = ConsoleConsumer(settings, console, view, hub, codec, status)
    thread = threading.Thread(target=consumer.run, name="console-consumer", daemon=True)
    status.thread = thread
    thread.start()
    app = create_app(ctx)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, console.host, console.port)
    await site.start()
    print(
        f"vigil console listening on http://{console.host}:{console.port} (view {console.db})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    async def watch_consumer() -> None:
        # A console whose consumer died serves an ever older view: exit, so that the
        # orchestrator restarts it (it resumes from the stored positions).
        while not stop.is_set():
            await asyncio.sleep(1.0)
            if not thread.is_alive() and not consumer.stop.is_set():
                log.error("the consumer thread ended (%s); stopping", status.error)
                failed.append(status.error or "ended")
                stop.set()

    failed: list[str] = []
    watcher = asyncio.ensure_future(watch_consumer())
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        consumer.stop.set()
        await runner.cleanup()
        await asyncio.to_thread(thread.join, 15)
        view.close()
    if failed:
        raise SystemExit(1)


def run(settings: Settings, console: ConsoleSettings | None = None) -> None:
    """The ``vigil console`` process."""
    from streams.contracts.codec import AvroCodec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    console = console or ConsoleSettings.from_env(settings)
    codec = AvroCodec.connect(
        settings.registry_config(),
        auto_register=False,
    )
    asyncio.run(serve(settings, console, codec))
