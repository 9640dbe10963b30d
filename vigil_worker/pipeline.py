"""The pipeline: every input topic in, every output topic out.

One processor reads all input topics of a partition so that it sees every fact of an execution
in one place, and keeps its tables (execution entries, partition clocks) co-partitioned with
them: a table's changelog partition is the partition of the record that changed it. The
``Worker`` is fed whole batches by the consumer's batch drain (``vigil_worker/drain.py``) rather
than by a per-event Faust agent (see there why). Per batch it admits each record through the offset
guard, decodes it (``open_envelope``) and calls ``Processor.handle``; then its ``Checkpoint``
(``vigil_worker/checkpoint.py``) sends the outputs, each with the timestamp of its event time,
never the send time, writes the state and the clocks, and acknowledges the inputs, in that
order. The claims join runs beside it (``vigil_worker/claims.py``), fed by the same drain; the
consumer plumbing (seeks, fetch sizes, offsets asked of the broker) is in
``vigil_worker/consumer.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.types import TP

from streams.contracts.codec import AvroCodec, RegistryUnavailable
from streams.contracts.envelope import SafeAvroSchema, open_envelope
from streams.engine import flow
from streams.engine.processor import Processor, Stores
from streams.kafka.clients import RecordProducer
from streams.kafka.offsets import AckOrder, Check, OffsetGuard
from streams.kafka.topics import Topics
from streams.read.feed import Feed
from streams.read.metrics import Metrics
from streams.read.web import register_web
from streams.settings import Settings
from vigil_worker.changelog import ChangelogProducer, DirectTable
from vigil_worker.checkpoint import Checkpoint, Failure, Origin, Position
from vigil_worker.claims import ClaimsStage
from vigil_worker.consumer import (
    committed_offsets,
    consumer_lag,
    consumer_state,
    earliest_offset,
    install_drain,
    max_message_bytes,
    seek_in_consumer_thread,
    watch_commits,
)
from vigil_worker.drain import BatchDrain
from vigil_worker.fetch_pace import FetchPace, FetchSizes, apply_sizes, running_fetcher
from vigil_worker.lease import MembershipLease
from vigil_worker.recovery_watch import RecoveryWatch

log = logging.getLogger("vigil.pipeline")

#: What a changelog record needs besides its value: its key (an execution id of at most 1,024
#: characters, JSON) and the record batch's framing.
ENTRY_RECORD_OVERHEAD = 8192


def entry_bound(max_entry_bytes: int, record_limit: int) -> int:
    """The bound the processor keeps execution entries within: ``VIGIL_MAX_ENTRY_BYTES``, or
    nine tenths of the largest entry a changelog record carries when that is less, so that
    what deadlines add after an entry's last input still fits."""
    return min(max_entry_bytes, record_limit * 9 // 10)


def _table(
    app: faust.App,
    name: str,
    partitions: int,
    *,
    packed: bool = False,
    topic_config: dict[str, str] | None = None,
) -> Any:
    """Keys are JSON strings, which survive changelog recovery as ``str``.

    A table's changelog takes the table's own value serializer, chosen from ``value_type``
    (whatever the schema says). The clocks table's values are text (a clock's JSON): JSON on
    the changelog, recovered as ``str``. The executions table's values are packed entries
    (``streams/engine/compact.py``), bytes: ``value_type=bytes`` makes them raw on the changelog and
    in RocksDB. An entry an earlier version wrote as a JSON string is recovered as the bytes
    of that string, which ``Entry.decode`` still reads. ``topic_config`` goes to the
    changelog topic when Faust creates it (its ``min.insync.replicas``)."""
    return app.Table(
        name,
        default=None,
        partitions=partitions,
        extra_topic_configs=topic_config,
        value_type=bytes if packed else None,
        schema=faust.Schema(
            key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
        ),
    )


async def survive_round(
    what: str, round_: Callable[[], Awaitable[None]], failed: Callable[[], None]
) -> None:
    """One round of a periodic task that must outlive its failures: an exception is logged
    and counted, and the next round runs as usual (a Faust timer that raises crashes the app:
    mode's ``Service._execute_task`` calls ``crash``)."""
    try:
        await round_()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.warning("%s: a round failed; the next one runs as usual", what, exc_info=True)
        failed()


class Worker:
    """The live pipeline of one worker process: its tables, processor, offset guard and
    producer, the batch steps (``process``: admit, apply, checkpoint) and the rebalance steps
    (``forget``). Faust's timers, task and signals call into it (``_wire``)."""

    def __init__(self, app: faust.App, settings: Settings, codec: AvroCodec) -> None:
        self.app = app
        self.settings = settings
        self.codec = codec
        topics = Topics.from_settings(settings)
        # The inputs, and the retry links the claims join sends back (vigil_worker/claims.py):
        # keyed by execution id like the inputs, applied at once (no watermark: decided).
        read = (*topics.inputs(), topics.retry_links)
        schema = SafeAvroSchema(codec, {t.name: t.value_types for t in read})
        self.source = app.topic(*(t.name for t in read), schema=schema)
        n = settings.partitions
        # Changelogs are replicated like the outputs (app.py decided the factor, topic-wide
        # for Faust; the in-sync minimum is per topic)
        changelog = {}
        if settings.min_insync_replicas is not None:
            changelog["min.insync.replicas"] = str(settings.min_insync_replicas)
        self.executions = DirectTable(
            _table(app, "executions", n, packed=True, topic_config=changelog)
        )
        self.clocks = DirectTable(_table(app, "partition-clocks", n, topic_config=changelog))
        stores = Stores(executions=self.executions, clocks=self.clocks)
        # The group's committed offsets the broker confirmed (``guard.confirmed``), as of the
        # start of the batch being processed: the processor asks for them for every position
        # an entry holds, so they are read once per batch. An older value is a lower one,
        # which only keeps a position longer. Confirmed: read from the broker when a partition
        # is first seen (``start_guard``), then every commit Faust reports as done; not Faust's
        # own ``_committed_offset``, which it advances even when a commit failed (a rebalance
        # in progress). Below a confirmed offset entries forget positions, and the guard skips
        # every record handed over again (``OffsetGuard.confirm``): processed again, such an
        # input would be judged a DUPLICATE or AFTER_TERMINAL anomaly.
        self.committed_now: dict[tuple[str, int], int | None] = {}
        self.processor = Processor.from_settings(
            settings,
            topics,
            stores,
            write_behind=True,
            committed=self.committed,
            cross_execution=True,
        )
        self.feed = Feed(codec.decode)
        self.guard = OffsetGuard()
        self.ack_order = AckOrder()
        self.metrics = Metrics(self.processor, lambda: consumer_lag(app), self.guard)
        self.approval_index = register_web(app, self.processor, self.feed, settings, self.metrics)
        self.lease = MembershipLease(float(app.conf.broker_session_timeout))
        #: the inputs that caused failed batches: one that fails ``VIGIL_MAX_RECORD_FAILURES``
        #: times is quarantined
        self.failures: dict[Position, Failure] = {}
        #: bumped by every rebalance: a batch, a seek or a write decided in an older
        #: generation is dropped
        self.generation = 0
        self.last_seek: dict[tuple[str, int], float] = {}
        self.arrived: dict[tuple[str, int], float] = {}
        self.input_names = {t.name for t in read}
        self.allowed = {t.name: t.value_types for t in read}
        #: the claims join running beside the pipeline (``vigil_worker/claims.py``), set by
        #: ``register``
        self.claims: Any = None
        # Outputs go through librdkafka (confluent-kafka): a produce call costs a few
        # microseconds, where aiokafka's send is a coroutine, a future and a callback per
        # record. Idempotent, acks=all, murmur2 on the key as Java clients and Faust partition.
        self.outputs = RecordProducer(settings, codec, acks="all")
        #: the tables' changelog records, through librdkafka too (``vigil_worker/changelog.py``)
        self.changelog = ChangelogProducer(settings, int(app.conf.producer_max_request_size))
        #: the largest packed entry a changelog record can carry: the least of what Faust's
        #: producer sends in one request and what the changelog topic takes
        #: (``max.message.bytes``, read before the first batch), less room for the record's
        #: key and framing
        self.entry_limit = int(app.conf.producer_max_request_size) - ENTRY_RECORD_OVERHEAD
        self.entry_limit_read = False
        #: input topic partitions this worker paused because they ran ahead (``hold_back``)
        self.paused: set[Any] = set()
        #: Faust's table recovery, for changelog partitions that stop coming
        self.recovery_watch = RecoveryWatch()
        self.recovery_watcher: asyncio.Future[Any] | None = None
        self.pace = FetchPace(
            FetchSizes(
                settings.fetch_min_bytes, int(settings.fetch_max_wait.total_seconds() * 1000)
            ),
            full=settings.batch_size,
        )
        #: the fetcher the current fetch sizes were set on
        self.paced: Any = None
        self.drain = BatchDrain(
            self.input_names,
            lambda: self.generation,
            batch_size=settings.batch_size,
            batch_wait=settings.batch_wait.total_seconds(),
            side=(topics.idempotency_claims.name,),
        )
        self._wire()

    def _wire(self) -> None:
        """Faust's side: the input topics subscribed (their records come from the batch drain,
        ``vigil_worker/drain.py``, not through Faust's per-event stream), the timers, the task and
        the rebalance signals."""
        app, settings, metrics = self.app, self.settings, self.metrics
        app.topics.add(self.source)
        install_drain(
            app,
            self.drain,
            settings.fetch_min_bytes,
            int(settings.fetch_max_wait.total_seconds() * 1000),
            self.lease,
        )

        @app.timer(interval=2.0)
        async def watchdog() -> None:
            """``look_for_stalls``, never raising: an exception in a Faust timer crashes the
            app, and a worker must not die of a rebalance or a broker hiccup met on the way.
            The next round, two seconds later, looks again."""
            await survive_round("the watchdog", self.look_for_stalls, metrics.watchdog_failures.inc)

        @app.timer(interval=settings.state_gauges_interval.total_seconds())
        async def count_state() -> None:
            """The open-work gauges, counted in a worker thread
            (``streams/read/state_gauges.py``)."""
            await survive_round(
                "the state gauges",
                lambda: metrics.gauges.refresh(self.executions),
                metrics.watchdog_failures.inc,
            )

        @app.task
        async def pipeline() -> None:
            await self.run()

        @app.on_partitions_revoked.connect
        async def _revoked(app: faust.App, revoked: Any, **_: Any) -> None:
            self.rebalanced()

        @app.on_partitions_assigned.connect
        async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
            self.lease.renew()  # the group has just been joined: membership is proven now
            self.rebalanced()
            if self.recovery_watcher is None:
                # Not a Faust timer: those start only once the first recovery is complete.
                self.recovery_watcher = app.add_future(self.keep_watching_recovery())

    # -- rebalance steps ------------------------------------------------------------------
    def rebalanced(self) -> None:
        """A new generation: whatever was fetched, held or written for the old one is
        dropped; its records come again to the partitions' owners."""
        self.generation += 1
        self.drain.clear()
        self.forget()

    def forget(self) -> None:
        """Drop everything a batch in progress did that is not yet on the broker."""
        self.processor.forget_partitions()
        self.executions.discard()
        self.clocks.discard()
        self.guard.reset()
        self.ack_order.reset()
        consumer = getattr(self.app, "consumer", None)
        if self.paused and consumer is not None:
            # nothing is held any more; aiokafka raises for a partition no longer assigned
            held = [tp for tp in self.paused if tp in consumer.assignment()]
            if held:
                consumer.resume_partitions(held)
        self.paused.clear()

    async def still_owner(self, generation: int) -> bool:
        """Whether this worker may still write for the batch fetched in ``generation``: no
        rebalance since, and a membership lease that has not run out (``vigil_worker/lease.py``).
        A worker that was stopped past its session waits here until a heartbeat proves it a
        member again, or the rebalance that took its partitions arrives."""
        lease = self.lease
        if lease.valid():
            return self.generation == generation
        self.metrics.lease_waits.inc()
        log.warning(
            "membership unproven for %.1f s: holding the batch",
            lease.clock() - (lease.proven_at or 0),
        )
        while not lease.valid():
            if self.generation != generation:
                return False
            await asyncio.sleep(0.05)
        return self.generation == generation

    # -- batch steps ----------------------------------------------------------------------
    async def run(self) -> None:
        """Every batch the drain hands over, processed; a failed batch is forgotten and read
        again. Acknowledgement is manual: a record held until the watermark passes its time is
        not acknowledged, so its offset is not committed, and after a crash or a rebalance
        Kafka delivers it again. A record is acknowledged only once processed, its outputs
        delivered and the state that reflects it written."""
        settings = self.settings
        async for generation, batch in self.drain.batches():
            self.pace_fetch(len(batch))
            counted = self.processor.counters.snapshot()
            try:
                await self.process(generation, batch)
            except asyncio.CancelledError:
                raise
            except RegistryUnavailable as exc:
                # Not the records' fault: the registry could not be asked, while decoding
                # (before anything of the batch is published or acknowledged) or registering
                # an output schema. Forget the batch, wait (capped exponential backoff; warned,
                # counted, an error if it lasts), and its records are read again.
                self.forget()
                self.processor.counters = counted
                self.metrics.registry_unavailable.inc()
                await asyncio.sleep(
                    self.codec.outage.pause(
                        exc, settings.registry_outage_alert, settings.registry_retry_max
                    )
                )
            except Exception:
                # Never silently: the batch is not acknowledged, so forget what it did to the
                # state; the watchdog seeks back to the first unacknowledged record.
                log.exception("batch of %s records failed; it will be read again", len(batch))
                self.metrics.batch_failures.inc()
                self.forget()
                self.processor.counters = counted
            del batch  # not kept, decoded, while the next batch is awaited

    async def process(self, generation: int, batch: list[Any]) -> None:
        """One batch: its guard starts and schemas looked up, its records applied, then its
        checkpoint committed."""
        if generation != self.generation:
            return  # fetched before a rebalance: it comes again to the partition's owner
        consumer = self.app.consumer
        self.committed_now.clear()
        self.committed_now.update(self.guard.confirmed)
        watch_commits(consumer, self.guard.confirm)
        assignment = consumer.assignment()
        if not await self.prepare(generation, batch, assignment):
            return
        checkpoint = Checkpoint(self, generation)
        if not await self.apply(checkpoint, batch, assignment):
            return
        if not await checkpoint.commit(consumer):
            return
        if checkpoint.emissions:
            self.feed.publish(
                (em.record, em.topic, value)
                for em, value in zip(checkpoint.emissions, checkpoint.sent, strict=True)
                if em.topic != self.processor.claims_topic  # the workers' own, not a change
            )
            now = time.time()
            for msg in batch:
                if msg.timestamp:
                    self.metrics.latency.observe(max(0.0, now - msg.timestamp))

    async def prepare(self, generation: int, batch: list[Any], assignment: Any) -> bool:
        """What the batch needs from the broker and the registry, asked in threads, not on the
        event loop: the committed offsets of the partitions the guard has not seen yet (in
        one request: one per partition takes seconds after a rebalance) and the schemas not
        seen yet. False if a rebalance came meanwhile."""
        guard = self.guard
        unknown = [
            key
            for key in {(m.topic, m.partition) for m in batch if m.tp in assignment}
            if not guard.knows(key)
        ]
        if unknown:
            starts = await asyncio.to_thread(committed_offsets, self.settings, unknown)
            if self.generation != generation:
                return False
            for key, offset in starts.items():
                if not guard.knows(key):
                    self.start_guard(key, offset)
        if not self.entry_limit_read:
            self.entry_limit_read = True
            topic = self.executions.table.changelog_topic.get_topic_name()
            try:
                taken = await asyncio.to_thread(max_message_bytes, self.settings, topic)
            except Exception:  # the producer's own limit still holds
                log.warning("could not read max.message.bytes of %s", topic, exc_info=True)
                taken = None
            self.use_record_limit(taken)
        unseen = self.codec.unseen_schema_ids(m.value for m in batch)
        if unseen:
            await asyncio.to_thread(self.codec.look_up, unseen)
            if self.generation != generation:
                return False
        return True

    def use_record_limit(self, topic_max_bytes: int | None) -> None:
        """The changelog topic takes records of at most ``topic_max_bytes`` (None: not
        known): an entry must fit in one. When ``VIGIL_MAX_ENTRY_BYTES`` leaves too little
        room below that (``entry_bound``), the processor keeps entries within what fits, and
        says so: an input is then set aside rather than failing its batch for ever, but a
        replay, which knows only the setting, sets aside fewer."""
        limit = int(self.app.conf.producer_max_request_size)
        if topic_max_bytes is not None:
            limit = min(limit, topic_max_bytes)
        self.entry_limit = limit - ENTRY_RECORD_OVERHEAD
        bound = entry_bound(self.settings.max_entry_bytes, self.entry_limit)
        if bound < self.processor.max_entry_bytes:
            log.error(
                "VIGIL_MAX_ENTRY_BYTES=%s leaves too little room below the %s bytes a "
                "changelog record of an execution entry carries here: entries are kept "
                "within %s bytes instead; set VIGIL_MAX_ENTRY_BYTES to at most that, or a "
                "replay sets aside fewer inputs than this worker",
                self.settings.max_entry_bytes,
                self.entry_limit,
                bound,
            )
            self.processor.max_entry_bytes = bound

    async def apply(self, checkpoint: Checkpoint, batch: list[Any], assignment: Any) -> bool:
        """Every admitted record of the batch decoded and handed to the processor, its outputs
        gathered in ``checkpoint``; a record that failed too many batches is quarantined
        instead. False if a rebalance came meanwhile (this batch's state was dropped)."""
        processor, failures, generation = self.processor, self.failures, checkpoint.generation
        emissions, origins = checkpoint.emissions, checkpoint.origins
        handle, guard = processor.handle, self.guard
        limit = self.settings.max_record_failures
        for msg in batch:
            if msg.tp not in assignment:
                continue
            if guard.knows((msg.topic, msg.partition)):
                # the common case, decided without an await (a coroutine per record costs)
                check = self.offset_check(msg)
                if (
                    check is not Check.NEXT
                    and check is not Check.AGAIN
                    and not await self.admitted(msg, check, generation)
                ):
                    continue
            elif not await self.admit(msg, generation):
                continue
            if self.generation != generation:
                return False  # forget_partitions dropped this batch's state: it comes again
            self.ack_order.admit((msg.topic, msg.partition), msg.offset, msg)
            checkpoint.partitions.add(msg.partition)
            ts = msg.timestamp
            env = open_envelope(
                self.codec,
                self.allowed,
                msg.topic,
                msg.partition,
                msg.offset,
                int(ts * 1000) if ts else None,
                msg.key,
                msg.value,
            )
            position = Position(msg.topic, msg.partition, msg.offset)
            origins.append(Origin(len(emissions), position))
            failed = failures.get(position) if failures else None
            if failed is not None and failed.count >= limit:
                log.error("%s[%s]@%s quarantined after %s failed batches", *position, failed.count)
                emissions.extend(
                    processor.quarantine(
                        env, f"{failed.count} batches failed on it; last: {failed.error}", token=msg
                    )
                )
                del failures[position]
                continue
            try:
                emissions.extend(handle(env, token=msg))
            except Exception as exc:
                culprit = processor.applying  # the input being applied when it raised
                if culprit is not None:
                    position = Position(culprit.topic, culprit.partition, culprit.offset)
                self.failed_on(position, exc)
                raise
        return True

    def failed_on(self, position: Position, exc: BaseException) -> None:
        failures = self.failures
        count = failures[position].count + 1 if position in failures else 1
        failures[position] = Failure(count, f"{type(exc).__name__}: {exc}"[:500])
        if len(failures) > 10_000:  # a memo of recent failures, not state
            failures.pop(next(iter(failures)))
        log.warning(
            "%s[%s]@%s caused a failed batch (%s of %s before it is quarantined): %s",
            *position,
            count,
            self.settings.max_record_failures,
            failures[position].error,
        )

    # -- flow -----------------------------------------------------------------------------
    def hold_back(self, consumer: Any) -> None:
        """Stop reading input topic partitions that run ahead in event time, read them again
        when their waiting events drain (``streams/engine/flow.py``)."""
        processor, paused, metrics = self.processor, self.paused, self.metrics
        pause, resume = flow.hold_back(
            processor.held_by,
            ((tp.topic, tp.partition) for tp in paused),
            processor.held_ahead,
            self.settings.max_held,
        )
        if pause:
            tps = [TP(topic, partition) for topic, partition in pause]
            consumer.pause_partitions(tps)
            paused.update(tps)
            metrics.paused.inc(len(tps))
        if resume:
            tps = [TP(topic, partition) for topic, partition in resume]
            consumer.resume_partitions(tps)
            paused.difference_update(tps)
        metrics.held.set(processor.held())

    def pace_fetch(self, records: int) -> None:
        """Eager fetches under a backlog, patient ones once caught up (vigil_worker/fetch_pace.py).
        Never raises: it runs in the pipeline task, whose exception would stop the worker."""
        try:
            change = self.pace.after_batch(records)
            fetcher = running_fetcher(self.app.consumer)
            if fetcher is not self.paced:
                change = self.pace.sizes  # a new fetcher starts patient (tune_fetch)
            if change is not None and apply_sizes(fetcher, change):
                self.paced = fetcher
                self.metrics.fetch_eager.set(1 if self.pace.eager else 0)
        except Exception:  # the sizes are an optimisation: the worker goes on without them
            log.warning("could not set the fetch sizes", exc_info=True)

    # -- offsets --------------------------------------------------------------------------
    def committed(self, topic: str, partition: int) -> int | None:
        return self.committed_now.get((topic, partition))

    def start_guard(self, tp: tuple[str, int], committed_offset: int) -> None:
        """Where the guard starts a partition: the group's committed offset, or further where
        the partition's stored clock says every record before was processed and its effect
        stored (``Processor.acknowledged``), or where a commit this worker saw confirmed
        stands: the group's offset can be behind those (a commit that failed in a rebalance),
        and those records, read again, would find entries that may have forgotten their
        positions."""
        self.guard.confirm(tp, committed_offset)
        through = self.processor.processed_through(*tp) or 0
        self.guard.start(tp, max(committed_offset, through))

    async def admit(self, msg: Any, generation: int) -> bool:
        """The offset guard: whether to process ``msg`` (see ``streams/kafka/offsets.py``)."""
        guard = self.guard
        tp = (msg.topic, msg.partition)
        self.arrived[tp] = time.monotonic()
        if not guard.knows(tp):
            start = await asyncio.to_thread(committed_offsets, self.settings, [tp])
            if not guard.knows(tp):
                self.start_guard(tp, start[tp])
        return await self.admitted(msg, self.offset_check(msg), generation)

    def offset_check(self, msg: Any) -> Check:
        """The guard's check of ``msg``, its partition known to the guard."""
        tp = (msg.topic, msg.partition)
        now = self.arrived[tp] = time.monotonic()
        return self.guard.check(tp, msg.offset, retry=now - self.last_seek.get(tp, 0) > 1)

    async def admitted(self, msg: Any, check: Check, generation: int) -> bool:
        """Whether to process ``msg`` after the guard's ``check``: what a skip, a hole or a
        record already committed asks for (a seek back, an acknowledgement in order)."""
        settings, guard = self.settings, self.guard
        tp = (msg.topic, msg.partition)
        if check in (Check.NEXT, Check.AGAIN):
            return True
        if check is Check.COMMITTED:
            # acknowledged in offset order with the rest, so that Faust, which commits only a
            # run of acknowledged offsets from its committed one, goes on committing
            self.ack_order.admit(tp, msg.offset, msg)
            self.ack_order.finish(msg)
            return False
        if check is Check.HOLE:
            log.error("offsets %s..%s of %s were never delivered: accepted", *tp, msg.offset)
            return True
        if check is Check.SEEK:
            earliest = await asyncio.to_thread(earliest_offset, settings, tp)
            if guard.give_up(tp, earliest):
                log.error("%s[%s]: offsets below %s were deleted before processing", *tp, earliest)
                if guard.check(tp, msg.offset, retry=True) in (Check.NEXT, Check.AGAIN):
                    return True
            want = guard.expected[tp]
            log.warning(
                "%s[%s]: handed offset %s while %s was next; seeking back", *tp, msg.offset, want
            )
            await self.seek(msg.tp, want, generation)
        return False

    async def seek(self, tp: Any, offset: int, generation: int) -> bool:
        self.last_seek[(tp.topic, tp.partition)] = time.monotonic()
        gaps = getattr(self.app.consumer, "_gap", None)
        if gaps is not None and tp in gaps:
            gaps[tp].clear()  # the skipped offsets are not acknowledged: they come again
        return await seek_in_consumer_thread(
            self.app.consumer, tp, offset, lambda: self.generation == generation
        )

    async def look_for_stalls(self) -> None:
        """Records that are on the log but never come. The guard only sees a skip when a later
        record arrives; at the end of a stream, or when a rebalance made the worker drop a batch
        it had not acknowledged, nothing later may come. Every 2 s, a partition with nothing
        fetched or handed over for 3 s whose log ends past the next expected offset is sought
        back, but only while no batch is queued or in progress: under a backlog a partition can
        wait its turn longer than that, and seeking it back would read it twice."""
        consumer = getattr(self.app, "consumer", None)
        if consumer is None:
            return
        if getattr(self.app, "in_recovery", False):
            return  # Faust holds the inputs back on purpose: ``watch_recovery`` looks then
        if self.drain.busy():
            return  # records are on their way: a backlog, not a stall
        guard = self.guard
        generation = self.generation
        now = time.monotonic()
        fetched = self.drain.fetched_at
        idle = [
            tp
            for tp in consumer.assignment()
            if tp.topic in self.input_names
            and tp not in self.paused  # not fetched on purpose (hold_back)
            and now
            - max(
                self.arrived.get(tp, 0.0),
                fetched.get((tp.topic, tp.partition), 0.0),
                self.last_seek.get(tp, 0.0),
            )
            > 3.0
        ]
        if not idle:
            return
        ends = await consumer.highwaters(*idle)
        unknown = [(tp.topic, tp.partition) for tp in idle if not guard.knows(tp)]
        starts = (
            await asyncio.to_thread(committed_offsets, self.settings, unknown) if unknown else {}
        )
        if self.generation != generation:
            return
        for key, offset in starts.items():
            if not guard.knows(key):
                self.start_guard(key, offset)
        for tp in idle:
            if self.generation != generation:
                return  # the seeks below would be for partitions that may have moved
            want = guard.expected.get((tp.topic, tp.partition))
            end = ends.get(tp)
            if want is not None and end is not None and end > want:
                log.warning(
                    "%s[%s]: records %s..%s wait on the log, none came; seeking back (%s)",
                    tp.topic,
                    tp.partition,
                    want,
                    end - 1,
                    consumer_state(self.app, tp, self.drain),
                )
                if await self.seek(tp, want, generation):
                    guard.seeks += 1

    async def keep_watching_recovery(self) -> None:
        """``watch_recovery`` every 2 s while Faust restores the tables, for the app's life."""
        while True:
            await asyncio.sleep(2.0)
            if getattr(self.app, "in_recovery", False):
                await survive_round(
                    "the recovery watch", self.watch_recovery, self.metrics.watchdog_failures.inc
                )
            else:
                self.recovery_watch.reset()

    async def watch_recovery(self) -> None:
        """Faust restores the tables: the inputs wait, paused by Faust on purpose (seeking them
        back would only have them read twice). A changelog partition whose records stopped
        coming is sought back to the offset recovery last applied
        (``vigil_worker/recovery_watch.py``)."""
        recovery = self.app.tables.recovery
        consumer = self.app.consumer
        generation = self.generation
        watch = self.recovery_watch
        for tp in watch.stalled(recovery.active_remaining(), time.monotonic()):
            if self.generation != generation:
                return
            offset = max(recovery.active_offsets.get(tp) or 0, 0)
            log.warning(
                "%s[%s]: table recovery waited %.0f s for records up to %s, none came; "
                "seeking back to %s (%s)",
                tp.topic,
                tp.partition,
                watch.stall_after,
                recovery.active_highwaters.get(tp),
                offset,
                consumer_state(self.app, tp, self.drain),
            )
            if await seek_in_consumer_thread(
                consumer, tp, offset, lambda: self.generation == generation
            ):
                self.metrics.recovery_seeks.inc()


def register(app: faust.App, settings: Settings, codec: AvroCodec) -> Processor:
    """The worker's pipeline on ``app``; returns its processor."""
    worker = Worker(app, settings, codec)
    worker.claims = ClaimsStage(
        app, settings, codec, settings.claims_grace, lambda: worker.generation
    )
    worker.claims.run_on(worker.drain.side_batches)
    return worker.processor
