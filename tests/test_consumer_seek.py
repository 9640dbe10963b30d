"""The offset guard's seeks run on the consumer's own thread. No Kafka.

Faust's ``Consumer.seek`` calls aiokafka from the caller's thread. That drops prefetched
records while the consumer thread iterates over them, and under load it killed the fetcher
(BENCHMARKS.md, step 5). These tests stand in for Faust's consumer thread with a real thread
that runs queued calls one at a time, as ``mode``'s ``QueueServiceThread`` does."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from faust.types import TP

from agents.pipeline import seek_in_consumer_thread


class ConsumerThread:
    """Runs queued calls on one thread of its own, like Faust's consumer thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="consumer")
        self.seeks: list[tuple[TP, int, str]] = []

    async def call_thread(self, fun: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(self._pool.submit(fun, *args))

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset, threading.current_thread().name))


class Consumer:
    def __init__(self) -> None:
        self._thread = ConsumerThread()
        self._read_offset: dict[TP, int | None] = {}
        self.direct: list[tuple[TP, int]] = []

    async def seek(self, tp: TP, offset: int) -> None:  # Faust's path: the caller's thread
        self.direct.append((tp, offset))


def test_the_seek_runs_on_the_consumer_thread_and_sets_the_read_offset() -> None:
    consumer = Consumer()
    tp = TP("in.execution-status", 1)
    asyncio.run(seek_in_consumer_thread(consumer, tp, 71_800))
    assert consumer.direct == []
    assert [(t, o) for t, o, _ in consumer._thread.seeks] == [(tp, 71_800)]
    assert consumer._thread.seeks[0][2].startswith("consumer")
    assert consumer._read_offset == {tp: 71_800}


def test_a_consumer_without_a_thread_seeks_as_faust_does() -> None:
    consumer = Consumer()
    del consumer._thread
    tp = TP("in.execution-status", 0)
    asyncio.run(seek_in_consumer_thread(consumer, tp, 5))
    assert consumer.direct == [(tp, 5)]
