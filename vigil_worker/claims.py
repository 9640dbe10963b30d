"""The claims join: blind retries across executions, a thin shell over ``streams.core.claims``.

A stage beside the pipeline, reading ``<p>.idempotency-claims`` (keyed by connector and
idempotency key, so every attempt of every execution under one key meets in one partition)
in batches, handed over by the worker's batch drain (``vigil_worker/drain.py``), with its
table ``idempotency-claims`` co-partitioned with it:

- per (connector, key), the key's book (``KeyBook``, JSON text);
- per claims partition, under ``WATERMARKS_KEY + partition``, how far each input partition's
  claims are complete and which keys wait for the watermark (``Watermarks``, JSON text).

Per batch it calls the pure core for each record in order, on the books and watermarks as the
records before it left them (read from the table once, kept decoded for the batch and, within
a budget, for the batches after it: ``_keep``), publishes
what it found (the ``RetryLink`` records keyed by execution id on ``<p>.retry-links``, which
the pipeline applies to each execution's aggregate, ``Processor._on_link``), then writes each
changed book and watermark once. At-least-once: the links are delivered before the table is
written, the records acknowledged (their offsets committed by Faust) after both. A record
Kafka delivers again finds its claim in the book already (nothing new) or decides the same
links again (same ids; the receiving execution keeps what it has applied by id). Why batches:
one record at a time, with a changelog round trip each, the join fell minutes behind the
claims of a busy pipeline, and a blind retry across executions was told that late.

A record that cannot be decoded is dead-lettered; while the registry cannot be asked the stage
waits and retries, like the pipeline. A batch that fails is forgotten and read again (sought
back); a rebalance drops the batch under way (its records come again to their owner).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any

import faust

from streams.contracts.codec import AvroCodec, RegistryUnavailable
from streams.contracts.envelope import Envelope, open_envelope
from streams.contracts.keys import split_key
from streams.contracts.models.enums import OperationStatus
from streams.contracts.models.outputs import ClaimsProgress, IdempotencyClaim
from streams.core import claims as cl
from streams.engine.emission import Emission
from streams.engine.emitter import Emitter
from streams.kafka.clients import RecordProducer
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings
from vigil_worker.changelog import ChangelogProducer, DirectTable
from vigil_worker.consumer import seek_in_consumer_thread

log = logging.getLogger("vigil.claims")

#: An operation status by its Avro symbol.
_STATUS = {s.value: s for s in OperationStatus}

#: What a key's book kept decoded between batches (``_keep``) is taken to weigh, from the
#: length of its JSON text: about twice what tracemalloc counts for a book decoded from it
#: (1.4 KiB at 195 characters: one attempt, three transitions), as for the executions' entries
#: (``streams.engine.state``), for what the allocator holds around the objects.
KEPT_BOOK_BASE_BYTES = 1024
KEPT_BOOK_BYTES_PER_CHAR = 8

#: The table key of a claims partition's watermarks (a scoped key never starts with NUL: it
#: is percent-encoded).
WATERMARKS_KEY = "\x00watermarks/"


class ClaimsStage:
    """The stage, its table and its producer (see the module docstring)."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        codec: AvroCodec,
        grace: timedelta,
        generation: Callable[[], int] = lambda: 0,
    ) -> None:
        topics = Topics.from_settings(settings)
        self.codec = codec
        self.partitions = settings.partitions
        self.grace_ms = grace // timedelta(milliseconds=1)
        spec = topics.idempotency_claims
        self.allowed = {spec.name: spec.value_types}
        self.links_topic = topics.retry_links.name
        #: the worker's rebalance generation: a batch fetched in an older one is dropped
        self.generation = generation
        # Keys JSON strings, values the UTF-8 bytes of the JSON texts, raw on the changelog.
        # Written like the pipeline's tables (``vigil_worker/changelog.py``): the changelog records
        # of one batch sent and waited for, the store taking them once the broker has them.
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
        # subscribed by the worker's consumer; its records come from the batch drain
        self.source = app.topic(
            spec.name, schema=faust.Schema(key_serializer="raw", value_serializer="raw")
        )
        app.topics.add(self.source)
        self.producer = RecordProducer(settings, codec, acks="all")
        self.changelog = ChangelogProducer(settings, int(app.conf.producer_max_request_size))
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
        self.batches = 0
        #: the batch under way: books and watermarks as its records left them, and the
        #: partition of each that changed (``handle_batch``)
        self._books: dict[str, cl.KeyBook | None] = {}
        self._marks: dict[int, cl.Watermarks] = {}
        self._changed: dict[str, int] = {}
        #: per claims partition, the books its claims changed since its watermarks' pending
        #: keys were last brought up to date (``_settle``: before a progress is read, and
        #: before the watermarks are written)
        self._unsettled: dict[int, dict[str, cl.KeyBook]] = {}
        #: the length of the JSON text of each book of the batch, read or written (its weight)
        self._lengths: dict[str, int] = {}
        #: kept decoded from one batch to the next (``_keep``): per claims partition its
        #: watermarks, and the books of the keys written or read last, with their texts'
        #: lengths, within ``kept_bytes`` (``VIGIL_STATE_CACHE_MB``, as much as the
        #: executions' entries may weigh); and the rebalance generation they belong to
        self.kept_bytes = settings.state_cache_mb * 1024 * 1024
        self._kept_marks: dict[int, cl.Watermarks] = {}
        self._kept_books: dict[str, tuple[cl.KeyBook, int]] = {}
        self.kept_weight = 0
        self._kept_generation: int | None = None

    def run_on(self, batches: Callable[[], AsyncIterator[tuple[int, list[Any]]]]) -> None:
        """The stage's task on the app: every batch of ``batches()`` handled, none raising
        out of it (a failed batch is logged, forgotten and read again)."""

        @self.app.task
        async def claims_join() -> None:
            async for generation, batch in batches():
                try:
                    await self.handle_batch(generation, batch)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("claims: a batch of %s records failed; read again", len(batch))
                    self.table.discard()
                    self._drop_kept()
                    await self._read_again(generation, batch)

    # -- one batch ------------------------------------------------------------------------
    async def handle_batch(self, generation: int, batch: list[Any]) -> bool:
        """The batch's records in order through the core, then its links delivered, its
        table writes sent, its records acknowledged. False if a rebalance dropped it."""
        if generation != self.generation():
            return False
        if generation != self._kept_generation:  # a rebalance: the table is the truth again
            self._drop_kept()
            self._kept_generation = generation
        self._books, self._marks, self._changed, self._unsettled = {}, {}, {}, {}
        self._lengths = {}
        out: list[Emission] = []
        for msg in batch:
            claim = await self._read_claim(msg)
            if claim is not None:
                out.extend(self._on_claim(msg.partition, claim))
                continue
            env = await self._open(msg)
            if not env.ok:
                self.dead_letters += 1
                out.append(self.emitter.dead_letter(env))
                continue
            record = env.record
            if type(record) is IdempotencyClaim:
                out.extend(self._on_claim(env.partition, cl.claim_of(record)))
            elif type(record) is ClaimsProgress:
                out.extend(self._on_progress(env.partition, record))
        for partition in list(self._unsettled):
            self._settle(partition)
        if generation != self.generation():
            return False
        await self._deliver(out)
        if generation != self.generation():
            return False
        for key, partition in self._changed.items():
            with self.table.writing_to(partition):
                if key.startswith(WATERMARKS_KEY):
                    self.table[key] = cl.dump_watermarks(self._marks[partition]).encode()
                else:
                    book = self._books[key]
                    assert book is not None
                    text = cl.dump_book(book)
                    self._lengths[key] = len(text)
                    self.table[key] = text.encode()
        marks, books, lengths = self._marks, self._books, self._lengths
        self._books, self._marks, self._changed, self._unsettled = {}, {}, {}, {}
        self._lengths = {}
        await self.table.send(self.changelog)
        if generation != self.generation():
            return False
        self._keep(generation, marks, books, lengths)
        consumer = self.app.consumer
        for msg in batch:
            consumer.ack(msg)
        self.batches += 1
        return True

    async def _read_again(self, generation: int, batch: list[Any]) -> None:
        """A failed batch's partitions sought back to its first record of each (records
        after it in the drain's queue are read again too: the join ignores what it has)."""
        firsts: dict[Any, int] = {}
        for msg in batch:
            firsts.setdefault(msg.tp, msg.offset)
        await asyncio.sleep(1.0)
        for tp, offset in firsts.items():
            if generation != self.generation():
                return
            await seek_in_consumer_thread(
                self.app.consumer, tp, offset, lambda: generation == self.generation()
            )

    async def _read_claim(self, msg: Any) -> cl.Claim | None:
        """A claim as the pipeline wrote it (this version's schema), read straight into the
        core's ``Claim``; None for anything else (a progress, another schema version, a
        record that is not a claim), which ``_open`` decodes and checks in full. Claims are
        nearly every record of the topic: this skips a model per claim."""
        pause = 0.5
        while True:
            try:
                fields = self.codec.read_fields(msg.value, IdempotencyClaim)
                break
            except RegistryUnavailable as exc:
                log.warning("claims: registry unavailable (%s); retrying in %.1fs", exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)
        if fields is None:
            return None
        status = _STATUS.get(fields["status"])
        occurred_at = fields["occurred_at"]
        if status is None or type(occurred_at) is not datetime or occurred_at.tzinfo is None:
            return None
        return cl.Claim(
            fields["connector"],
            fields["idempotency_key"],
            fields["execution_id"],
            fields["operation_id"],
            fields["attempt"],
            status,
            cl.to_ms(occurred_at),
        )

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

    def _on_claim(self, partition: int, claim: cl.Claim) -> list[Emission]:
        key = cl.claims_key(claim.connector, claim.key)
        marks = self._marks_of(partition)
        before = self._book(key)
        # ``cl.receive_claim``, with the watermarks' pending keys settled later (``_settle``)
        book, findings = cl.add_claim(before, claim, marks.watermark, self.grace_ms)
        for f in findings:
            if isinstance(f, cl.Late):
                self.late += 1
                log.warning(
                    "claims: late claim %s (watermark %s): decided at once, against what is known",
                    claim.claim_id,
                    f.watermark,
                )
        if book is not before:  # (a claim repeated is no change)
            self._books[key] = book
            self._changed[key] = partition
            unsettled = self._unsettled.get(partition)
            if unsettled is None:
                unsettled = self._unsettled[partition] = {}
            unsettled[key] = book
        return self._emissions(cl.links_of(findings))

    def _settle(self, partition: int) -> None:
        """The partition's pending keys brought up to date with the books its claims
        changed (``Watermarks.settled``)."""
        books = self._unsettled.pop(partition, None)
        if books:
            marks = self._marks_of(partition)
            settled = marks.settled(books)
            if settled is not marks:
                self._set_marks(partition, settled)

    def _on_progress(self, partition: int, record: ClaimsProgress) -> list[Emission]:
        self._settle(partition)
        marks = self._marks_of(partition)
        new_marks, changed, links = cl.receive_progress(
            marks,
            record.source_partition,
            cl.to_ms(record.occurred_at),
            self._book_of,
            self.grace_ms,
        )
        for key, book in changed.items():
            self._books[key] = book
            self._changed[key] = partition
        if new_marks is not marks:
            self._set_marks(partition, new_marks)
        return self._emissions(links)

    # -- state and outputs ----------------------------------------------------------------
    def _keep(
        self,
        generation: int,
        marks: dict[int, cl.Watermarks],
        books: dict[str, cl.KeyBook | None],
        lengths: dict[str, int],
    ) -> None:
        """What a batch read and wrote, kept decoded for the next batches once the table has
        it. Why the watermarks: their stored form keeps the pending keys but not their send
        times (``cl.dump_watermarks``), so watermarks read back from the table have every
        pending key due at once, and the next progress decoded and visited each of those
        books again only to find it could not decide yet: on the benchmark's operations log,
        24,654 visits for 13,058 sends, once per batch for every key waiting within the
        grace. Kept, a key is visited when the watermark passes its send. Why the books: the
        claims of one attempt (sent, acknowledged, verified) come in a few batches in a row,
        and each batch decoded the book from its text again. Either way the same decisions:
        a key visited before its send is due decides nothing (``cl.receive_progress``), and
        a kept book is the one the table holds. Dropped on a rebalance (``handle_batch``)
        and when a batch fails (``run_on``): the table is read again."""
        if generation != self._kept_generation or generation != self.generation():
            return
        self._kept_marks.update(marks)
        kept, budget = self._kept_books, self.kept_bytes
        for key, book in books.items():
            length = lengths.get(key)
            if book is None or length is None:
                continue
            weight = _book_weight(length)
            was = kept.pop(key, None)
            if was is not None:
                self.kept_weight -= _book_weight(was[1])
            if weight > budget:
                continue
            while self.kept_weight + weight > budget:
                self.kept_weight -= _book_weight(kept.pop(next(iter(kept)))[1])
            kept[key] = (book, length)
            self.kept_weight += weight

    def _drop_kept(self) -> None:
        self._kept_marks, self._kept_books, self.kept_weight = {}, {}, 0

    def _marks_of(self, partition: int) -> cl.Watermarks:
        marks = self._marks.get(partition)
        if marks is None:
            marks = self._kept_marks.get(partition)
            if marks is not None:
                self._marks[partition] = marks
                return marks
            text = _text(self.table.get(WATERMARKS_KEY + str(partition)))
            marks = cl.Watermarks(self.partitions) if text is None else cl.load_watermarks(text)
            self._marks[partition] = marks
        return marks

    def _set_marks(self, partition: int, marks: cl.Watermarks) -> None:
        self._marks[partition] = marks
        self._changed[WATERMARKS_KEY + str(partition)] = partition

    def _book(self, key: str) -> cl.KeyBook | None:
        if key in self._books:
            return self._books[key]
        kept = self._kept_books.get(key)
        if kept is not None:
            book, self._lengths[key] = kept
        else:
            text = _text(self.table.get(key))
            book = None
            if text is not None:
                book = cl.load_book(text)
                self._lengths[key] = len(text)
        self._books[key] = book
        return book

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


def _book_weight(length: int) -> int:
    """What a book decoded from a JSON text of ``length`` characters is taken to weigh."""
    return KEPT_BOOK_BASE_BYTES + KEPT_BOOK_BYTES_PER_CHAR * length


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
