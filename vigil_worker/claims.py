"""The claims join: blind retries across executions, a thin shell over ``streams.core.claims``.

A Faust agent on ``<p>.idempotency-claims`` (keyed by connector and idempotency key, so every
attempt of every execution under one key meets in one partition), with its table
``idempotency-claims`` co-partitioned with it (Faust writes a table's changelog to the partition
of the event being processed):

- per (connector, key), the key's book (``KeyBook``, JSON text);
- per claims partition, under ``WATERMARKS_KEY + partition``, how far each input partition's
  claims are complete and which keys wait for the watermark (``Watermarks``, JSON text).

For each record it calls the pure core and publishes what it found, the ``RetryLink`` records
keyed by execution id on ``<p>.retry-links``, which the pipeline applies to each execution's
aggregate (``Processor._on_link``). At-least-once: the links are delivered before the table is
written, and the offset is committed by Faust after both. A record Kafka delivers again finds
its claim in the book already (nothing new) or decides the same links again (same ids; the
receiving execution keeps what it has applied by id).

A record that cannot be decoded is dead-lettered; while the registry cannot be asked the agent
waits and retries, like the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import faust

from streams.contracts.codec import AvroCodec, RegistryUnavailable
from streams.contracts.envelope import Envelope, open_envelope
from streams.contracts.keys import split_key
from streams.contracts.models.outputs import ClaimsProgress, IdempotencyClaim
from streams.core import claims as cl
from streams.emission import Emission
from streams.emitter import Emitter
from streams.kafka.clients import RecordProducer
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings
from vigil_worker.changelog import DirectTable

log = logging.getLogger("vigil.claims")

#: The table key of a claims partition's watermarks (a scoped key never starts with NUL: it
#: is percent-encoded).
WATERMARKS_KEY = "\x00watermarks/"


class ClaimsStage:
    """The agent, its table and its producer (see the module docstring)."""

    def __init__(
        self, app: faust.App, settings: Settings, codec: AvroCodec, grace: timedelta
    ) -> None:
        topics = Topics.from_settings(settings)
        self.codec = codec
        self.partitions = settings.partitions
        self.grace_ms = grace // timedelta(milliseconds=1)
        spec = topics.idempotency_claims
        self.allowed = {spec.name: spec.value_types}
        self.links_topic = topics.retry_links.name
        # Keys JSON strings, values the UTF-8 bytes of the JSON texts, raw on the changelog.
        # Written like the pipeline's tables (``vigil_worker/changelog.py``): the changelog records
        # of one input sent and waited for, the store taking them once the broker has them.
        self.table = DirectTable(
            app.Table(
                "idempotency-claims",
                default=None,
                partitions=settings.partitions,
                value_type=bytes,
                # replicated like the pipeline's changelogs (the factor is app-wide for Faust)
                extra_topic_configs=(
                    {"min.insync.replicas": str(settings.min_insync_replicas)}
                    if settings.min_insync_replicas is not None
                    else None
                ),
                schema=faust.Schema(
                    key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
                ),
            )
        )
        self.app = app
        self.source = app.topic(
            spec.name, schema=faust.Schema(key_serializer="raw", value_serializer="raw")
        )
        self.producer = RecordProducer(settings, codec, acks="all")
        self.emitter = Emitter(
            topics,
            lambda _: None,
            lambda key: partition_of(key, settings.partitions),
            orphan_after=settings.orphan_after,
            max_kept_bytes=512 * 1024,
        )
        #: what the stage has done, for logs and tests
        self.links = 0
        self.late = 0
        self.dead_letters = 0

        @app.agent(self.source, name="vigil-claims")
        async def claims(stream: Any) -> None:
            async for event in stream.events():
                await self.handle(event.message)

    # -- one record -----------------------------------------------------------------------
    async def handle(self, msg: Any) -> None:
        env = await self._open(msg)
        if not env.ok:
            self.dead_letters += 1
            await self._deliver([self.emitter.dead_letter(env)])
            return
        record = env.record
        with self.table.writing_to(env.partition):
            if type(record) is IdempotencyClaim:
                await self._on_claim(env.partition, record)
            elif type(record) is ClaimsProgress:
                await self._on_progress(env.partition, record)
        await self.table.send(self.app.producer)

    async def _open(self, msg: Any) -> Envelope:
        """The record decoded; while the registry cannot be asked, wait and try again (the
        record may be fine)."""
        pause = 0.5
        ts = msg.timestamp
        while True:
            try:
                return open_envelope(
                    self.codec,
                    self.allowed,
                    msg.topic,
                    msg.partition,
                    msg.offset,
                    int(ts * 1000) if ts else None,
                    msg.key,
                    msg.value,
                )
            except RegistryUnavailable as exc:
                log.warning("claims: registry unavailable (%s); retrying in %.1fs", exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)

    async def _on_claim(self, partition: int, record: IdempotencyClaim) -> None:
        claim = cl.claim_of(record)
        key = cl.claims_key(claim.connector, claim.key)
        marks = self._marks(partition)
        new_marks, book, findings = cl.receive_claim(marks, self._book(key), claim, self.grace_ms)
        for f in findings:
            if isinstance(f, cl.Late):
                self.late += 1
                log.warning(
                    "claims: late claim %s (watermark %s): decided at once, against what is known",
                    record.claim_id,
                    f.watermark,
                )
        await self._deliver(self._emissions(cl.links_of(findings)))
        self.table[key] = cl.dump_book(book).encode()
        if new_marks is not marks:
            self.table[WATERMARKS_KEY + str(partition)] = cl.dump_watermarks(new_marks).encode()

    async def _on_progress(self, partition: int, record: ClaimsProgress) -> None:
        marks = self._marks(partition)
        new_marks, changed, links = cl.receive_progress(
            marks,
            record.source_partition,
            cl.to_ms(record.occurred_at),
            self._book_of,
            self.grace_ms,
        )
        await self._deliver(self._emissions(links))
        for key, book in changed.items():
            self.table[key] = cl.dump_book(book).encode()
        if new_marks is not marks:
            self.table[WATERMARKS_KEY + str(partition)] = cl.dump_watermarks(new_marks).encode()

    # -- state and outputs ----------------------------------------------------------------
    def _marks(self, partition: int) -> cl.Watermarks:
        text = _text(self.table.get(WATERMARKS_KEY + str(partition)))
        return cl.Watermarks(self.partitions) if text is None else cl.load_watermarks(text)

    def _book(self, key: str) -> cl.KeyBook | None:
        text = _text(self.table.get(key))
        return None if text is None else cl.load_book(text)

    def _book_of(self, key: str) -> cl.KeyBook:
        book = self._book(key)
        if book is None:  # a pending key always has a book; an empty one decides nothing
            connector, idempotency_key = split_key(key)
            return cl.KeyBook(connector, idempotency_key)
        return book

    def _emissions(self, links: list[cl.Link]) -> list[Emission]:
        out = []
        for link in links:
            record = cl.link_record(link)
            out.append(Emission(self.links_topic, record.execution_id, record))
        self.links += len(out)
        return out

    async def _deliver(self, emissions: list[Emission]) -> None:
        """Sent and waited for: the table is written only once the broker has them."""
        if not emissions:
            return
        for em in emissions:
            self.producer.send_emission(em)
        await asyncio.to_thread(self.producer.flush, 60.0)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
