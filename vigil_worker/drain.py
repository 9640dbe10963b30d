"""Faust's fetch loop, handing the input topics over in whole batches.

Why: faust-streaming moves every record through its own machinery one at a time. For each
record the fetcher runs ``Service.wait_first`` (three asyncio tasks created and cancelled),
the conductor takes a lock, decodes and puts an event on a channel queue, and the stream
pulls it out again and builds an ``Event``. On this machine that is about 0.4 ms per record,
several times what vigil's own work costs (BENCHMARKS.md, "Where Faust itself is the wall").
``stream.take`` batches only after all of that has happened.

``BatchDrain`` replaces ``Consumer._drain_messages`` on the worker's consumer. It keeps
everything Faust's loop does per record (the read offsets, the gaps of a partition that Faust
must acknowledge, the commit cadence) and routes the records of the input topics, whole
``getmany`` batches at a time, to a bounded queue that the pipeline task reads. Records of
every other topic (table changelogs during recovery, standbys) still go through Faust's
callback one by one, as Faust does. Each batch carries the rebalance generation it was
fetched in, so that the pipeline drops a batch fetched before a rebalance.

The claims topic (``side``) is routed the same way, to a queue of its own that the claims join
reads (``vigil_worker/claims.py``): one record at a time through Faust, the join could not keep
up with the claims a busy pipeline publishes.

Everything else of Faust stays: the consumer and its thread, rebalancing, offset commits,
tables and their changelogs, recovery, the web server.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, cast

from faust.transport.consumer import CONSUMER_FETCHING
from faust.types import Message
from mode import Service

log = logging.getLogger("vigil.drain")

Batch = tuple[int, list[Message]]


class BatchDrain:
    """Hands the input topics' records over in batches; see the module docstring."""

    def __init__(
        self,
        topics: Collection[str],
        generation: Callable[[], int],
        batch_size: int = 500,
        batch_wait: float = 0.02,
        depth: int = 2,
        side: Collection[str] = (),
    ) -> None:
        self.topics = frozenset(topics)
        #: topics whose batches go to ``side_queue`` (the claims join's)
        self.side = frozenset(side)
        self._side_queue: asyncio.Queue[Batch] | None = None
        self._generation = generation
        # A batch closes at ``batch_size`` records or ``batch_wait`` seconds after its first
        # record, whichever comes first: larger batches mean fewer state writes and producer
        # flushes per record; the wait bounds what that costs in latency.
        self.batch_size = max(1, batch_size)
        self.batch_wait = max(0.0, batch_wait)
        # A small queue: the fetcher runs at most ``depth`` batches ahead of the pipeline, so
        # back-pressure reaches the consumer (and Kafka) instead of memory.
        self._depth = depth
        self._queue: asyncio.Queue[Batch] | None = None
        #: when a record of each input partition was last fetched (``time.monotonic``): the
        #: watchdog must not take a partition starved by a backlog for one that stalled
        self.fetched_at: dict[tuple[str, int], float] = {}
        #: a batch is queued or being processed
        self.processing = False
        #: the fetch loop waits for room in a queue (which one): the watchdog's warning says so
        self.waiting_for_room: str | None = None

    @property
    def queue(self) -> asyncio.Queue[Batch]:
        if self._queue is None:
            self._queue = asyncio.Queue(maxsize=self._depth)
        return self._queue

    @property
    def side_queue(self) -> asyncio.Queue[Batch]:
        if self._side_queue is None:
            self._side_queue = asyncio.Queue(maxsize=self._depth)
        return self._side_queue

    async def side_batches(self) -> AsyncIterator[Batch]:
        q = self.side_queue
        while True:
            yield await q.get()

    def install(self, consumer: Any) -> None:
        """Take over ``consumer._drain_messages`` (called once per fetcher start)."""
        drain = self

        async def _drain_messages(consumer: Any, fetcher: Any) -> None:
            await drain.run(consumer, fetcher)

        consumer._drain_messages = types.MethodType(_drain_messages, consumer)

    def clear(self) -> None:
        """Drop the batches not yet taken (a rebalance: they come again to the owner)."""
        for q in (self.queue, self.side_queue):
            while not q.empty():
                q.get_nowait()

    async def batches(self) -> AsyncIterator[Batch]:
        q = self.queue
        while True:
            self.processing = False
            batch = await q.get()
            self.processing = True
            yield batch

    def busy(self) -> bool:
        """Records fetched and not yet processed: a batch queued or in progress."""
        return self.processing or not self.queue.empty()

    async def run(self, consumer: Any, fetcher: Any) -> None:  # pragma: no cover - Faust's
        """Faust's ``Consumer._drain_messages`` (faust-streaming 0.15.3), batched."""
        callback = consumer.callback
        getmany = consumer.getmany
        consumer_should_stop = cast(Service, consumer)._stopped.is_set
        fetcher_should_stop = cast(Service, fetcher)._stopped.is_set
        get_read_offset = consumer._read_offset.__getitem__
        set_read_offset = consumer._read_offset.__setitem__
        set_flag = consumer.diag.set_flag
        unset_flag = consumer.diag.unset_flag
        commit_every = consumer._commit_every
        acks_enabled_for = consumer.app.topics.acks_enabled_for
        inputs, side = self.topics, self.side
        queue, side_queue = self.queue, self.side_queue
        fetched_at = self.fetched_at
        size, wait = self.batch_size, self.batch_wait
        loop = asyncio.get_running_loop()
        batch: list[Message] = []
        side_batch: list[Message] = []
        generation = self._generation()
        closes_at = 0.0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                if self._generation() != generation:
                    batch = []  # fetched before a rebalance: the owner reads it again
                    side_batch = []
                    generation = self._generation()
                timeout = max(0.0, closes_at - loop.time()) if batch or side_batch else 1.0
                ait = cast(AsyncIterator, getmany(timeout=timeout))
                # getmany can return at once, batch after batch: let the loop breathe
                await consumer.sleep(0)
                if not consumer.should_stop:
                    now = time.monotonic()
                    async for tp, message in ait:
                        offset = message.offset
                        r_offset = get_read_offset(tp)
                        if r_offset is not None and offset < r_offset:
                            log.debug("dropped %s[%s]@%s below read offset", *tp, offset)
                            continue
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):
                            await consumer._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and consumer._n_acked >= commit_every:
                            consumer._n_acked = 0
                            await consumer.commit()
                        if tp.topic in inputs or tp.topic in side:
                            if not batch and not side_batch:
                                closes_at = loop.time() + wait
                            if tp.topic in inputs:
                                batch.append(message)
                                fetched_at[tp] = now
                            else:
                                side_batch.append(message)
                        else:
                            await consumer.wait_first(
                                callback(message), consumer.suspend_flow.wait()
                            )
                        set_read_offset(tp, offset)
                    unset_flag(CONSUMER_FETCHING)
                closing = loop.time() >= closes_at
                if side_batch and (len(side_batch) >= size or closing):
                    self.waiting_for_room = "claims"
                    await _hand_over(side_queue, generation, side_batch, size)
                    side_batch = []
                if batch and (len(batch) >= size or closing):
                    self.waiting_for_room = "pipeline"
                    await _hand_over(queue, generation, batch, size)
                    batch = []
                self.waiting_for_room = None
        except consumer.consumer_stopped_errors:
            if consumer.transport.app.should_stop:
                log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if consumer.transport.app.should_stop:
                log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)


async def _hand_over(
    queue: asyncio.Queue[Batch], generation: int, records: list[Message], size: int
) -> None:
    """``records`` into ``queue`` in batches of at most ``size``, in order (waiting for room:
    back-pressure reaches the fetch)."""
    for i in range(0, len(records), size):
        await queue.put((generation, records[i : i + size]))
