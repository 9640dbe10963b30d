"""The pipeline: every input topic in, every output topic out.

One processor reads all input topics of a partition so that it sees every fact of an execution
in one place, and keeps its tables (execution entries, partition clocks) co-partitioned with
them: a table's changelog partition is the partition of the record being processed. It is a
Faust task fed whole batches by the consumer's batch drain (``agents/drain.py``) rather than a
per-event Faust agent (see there why). Per batch it only decodes (``open_envelope``), calls
``Processor.handle`` and sends what it returns, each output with the timestamp of its event
time, never the send time; then it writes the state and acknowledges.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import faust
from faust.streams import _current_event
from faust.types import TP

from agents.changelog import DirectTable
from agents.drain import BatchDrain
from agents.fetch_pace import FetchPace, FetchSizes, apply_sizes, running_fetcher
from agents.lease import MembershipLease
from streams import flow
from streams.admin import admin_client
from streams.clients import DeliveryFailed, RecordProducer
from streams.codec import AvroCodec, RegistryUnavailable
from streams.envelope import SafeAvroSchema, open_envelope
from streams.feed import Feed
from streams.metrics import Metrics
from streams.offsets import AckOrder, Check, OffsetGuard
from streams.processor import Emission, Processor, Stores
from streams.settings import Settings
from streams.topics import Topics
from streams.web import register_web

log = logging.getLogger("vigil.pipeline")


def _table(app: faust.App, name: str, partitions: int, *, packed: bool = False) -> Any:
    """Keys are JSON strings, which survive changelog recovery as ``str``.

    A table's changelog takes the table's own value serializer, chosen from ``value_type``
    (whatever the schema says). The clocks table's values are text (a clock's JSON): JSON on
    the changelog, recovered as ``str``. The executions table's values are packed entries
    (``streams/compact.py``), bytes: ``value_type=bytes`` makes them raw on the changelog and
    in RocksDB. An entry an earlier version wrote as a JSON string is recovered as the bytes
    of that string, which ``Entry.decode`` still reads."""
    return app.Table(
        name,
        default=None,
        partitions=partitions,
        value_type=bytes if packed else None,
        schema=faust.Schema(
            key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
        ),
    )


async def seek_in_consumer_thread(
    consumer: Any, tp: Any, offset: int, still: Callable[[], bool] = lambda: True
) -> bool:
    """``Consumer.seek``, with aiokafka's part run on the consumer's own thread, and only if
    the partition is still assigned there. Returns whether it sought.

    Why the thread: Faust's ``Consumer.seek`` calls aiokafka's ``seek`` from the caller's
    thread, and that drops the partition's prefetched records from the fetcher while the
    consumer thread may be iterating over them in ``fetched_records``. Under load that raced:
    the fetcher died of a ``KeyError`` and took the worker with it (two workers, 100,000
    executions, BENCHMARKS.md step 5). Queued on the consumer thread, the seek runs between
    two fetches.

    Why the check: the caller decided to seek before an ``await``; a rebalance may have taken
    the partition away since, and aiokafka raises ``IllegalStateError`` for a partition it no
    longer holds. Checked on the consumer thread, where the rebalance runs, the check and the
    seek cannot be split by one. A partition that moved is its new owner's to read.
    """
    thread = getattr(consumer, "_thread", None)
    if thread is None or not hasattr(thread, "call_thread"):
        if tp not in consumer.assignment():
            return False
        await consumer.seek(tp, offset)
        return True

    def seek_if_assigned() -> bool:
        # ``still``: no rebalance since the seek was decided (a stale offset sought after one
        # would hand over records the new generation's owner may have committed since)
        if not still() or tp not in thread.assignment():
            return False
        thread.seek(tp, offset)
        return True

    if not await thread.call_thread(seek_if_assigned):
        return False
    # what ``Consumer.seek`` does after its ``_seek``: the records come again from ``offset``
    consumer._read_offset[TP(tp.topic, tp.partition)] = offset if offset else None
    return True


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


def register(app: faust.App, settings: Settings, codec: AvroCodec) -> Processor:
    topics = Topics.from_settings(settings)
    schema = SafeAvroSchema(codec, {t.name: t.value_types for t in topics.inputs()})
    source = app.topic(*(t.name for t in topics.inputs()), schema=schema)
    n = settings.partitions
    executions = DirectTable(_table(app, "executions", n, packed=True))
    clocks = DirectTable(_table(app, "partition-clocks", n))
    stores = Stores(executions=executions, clocks=clocks)

    # The group's committed offsets the broker confirmed (``guard.confirmed``), as of the
    # start of the batch being processed: the processor asks for them for every position an
    # entry holds, so they are read once per batch. An older value is a lower one, which only
    # keeps a position longer. Confirmed: read from the broker when a partition is first seen
    # (``start_guard``), then every commit Faust reports as done; not Faust's own
    # ``_committed_offset``, which it advances even when a commit failed (a rebalance in
    # progress). Below a confirmed offset entries forget positions, and the guard skips every
    # record handed over again (``OffsetGuard.confirm``): processed again, such an input would
    # be judged a DUPLICATE or AFTER_TERMINAL anomaly.
    committed_now: dict[tuple[str, int], int | None] = {}

    def start_guard(tp: tuple[str, int], committed_offset: int) -> None:
        """Where the guard starts a partition: the group's committed offset, or further where
        the partition's stored clock says every record before was processed and its effect
        stored (``Processor.acknowledged``), or where a commit this worker saw confirmed
        stands: the group's offset can be behind those (a commit that failed in a rebalance),
        and those records, read again, would find entries that may have forgotten their
        positions."""
        guard.confirm(tp, committed_offset)
        through = processor.processed_through(*tp) or 0
        guard.start(tp, max(committed_offset, through))

    def committed(topic: str, partition: int) -> int | None:
        return committed_now.get((topic, partition))

    processor = Processor.from_settings(
        settings, topics, stores, write_behind=True, committed=committed
    )
    feed = Feed(codec.decode)
    guard = OffsetGuard()
    ack_order = AckOrder()
    metrics = Metrics(processor, lambda: _lag(app), guard)
    approval_index = register_web(app, processor, feed, settings, metrics)
    lease = MembershipLease(float(app.conf.broker_session_timeout))
    #: input position -> (failed batches it was part of the cause of, the last error): a
    #: record that fails ``VIGIL_MAX_RECORD_FAILURES`` times is quarantined (``quarantine``)
    failures: dict[tuple[str, int, int], tuple[int, str]] = {}

    def failed_on(position: tuple[str, int, int], exc: BaseException) -> None:
        count = failures.get(position, (0, ""))[0] + 1
        failures[position] = (count, f"{type(exc).__name__}: {exc}"[:500])
        if len(failures) > 10_000:  # a memo of recent failures, not state
            failures.pop(next(iter(failures)))
        log.warning(
            "%s[%s]@%s caused a failed batch (%s of %s before it is quarantined): %s",
            *position,
            count,
            settings.max_record_failures,
            failures[position][1],
        )

    async def still_owner(generation: int) -> bool:
        """Whether this worker may still write for the batch fetched in ``generation``: no
        rebalance since, and a membership lease that has not run out (``agents/lease.py``).
        A worker that was stopped past its session waits here until a heartbeat proves it a
        member again, or the rebalance that took its partitions arrives."""
        if lease.valid():
            return rebalances[0] == generation
        metrics.lease_waits.inc()
        log.warning(
            "membership unproven for %.1f s: holding the batch",
            lease.clock() - (lease.proven_at or 0),
        )
        while not lease.valid():
            if rebalances[0] != generation:
                return False
            await asyncio.sleep(0.05)
        return rebalances[0] == generation

    app.vigil_processor = processor  # type: ignore[attr-defined]
    rebalances = [0]
    last_seek: dict[tuple[str, int], float] = {}
    arrived: dict[tuple[str, int], float] = {}
    input_names = {t.name for t in topics.inputs()}

    # Outputs go through librdkafka (confluent-kafka): a produce call costs a few
    # microseconds, where aiokafka's send is a coroutine, a future and a callback per record.
    # Idempotent, acks=all, murmur2 on the key as Java clients and Faust partition.
    outputs = RecordProducer(settings, codec, acks="all")

    send = outputs.send_emission

    async def delivered() -> None:
        """Wait until the broker has every output sent so far (raises if one failed)."""
        await asyncio.to_thread(outputs.flush, 60.0)

    async def admit(msg: Any, generation: int) -> bool:
        """The offset guard: whether to process ``msg`` (see ``streams/offsets.py``)."""
        tp = (msg.topic, msg.partition)
        arrived[tp] = time.monotonic()
        if not guard.knows(tp):
            start = await asyncio.to_thread(_committed_offsets, settings, [tp])
            if not guard.knows(tp):
                start_guard(tp, start[tp])
        check = guard.check(tp, msg.offset, retry=time.monotonic() - last_seek.get(tp, 0) > 1)
        if check in (Check.NEXT, Check.AGAIN):
            return True
        if check is Check.COMMITTED:
            # acknowledged in offset order with the rest, so that Faust, which commits only a
            # run of acknowledged offsets from its committed one, goes on committing
            ack_order.admit(tp, msg.offset, msg)
            ack_order.finish(msg)
            return False
        if check is Check.HOLE:
            log.error("offsets %s..%s of %s were never delivered: accepted", *tp, msg.offset)
            return True
        if check is Check.SEEK:
            earliest = await asyncio.to_thread(_earliest_offset, settings, tp)
            if guard.give_up(tp, earliest):
                log.error("%s[%s]: offsets below %s were deleted before processing", *tp, earliest)
                if guard.check(tp, msg.offset, retry=True) in (Check.NEXT, Check.AGAIN):
                    return True
            want = guard.expected[tp]
            log.warning(
                "%s[%s]: handed offset %s while %s was next; seeking back", *tp, msg.offset, want
            )
            await seek(msg.tp, want, generation)
        return False

    async def seek(tp: Any, offset: int, generation: int) -> bool:
        last_seek[(tp.topic, tp.partition)] = time.monotonic()
        gaps = getattr(app.consumer, "_gap", None)
        if gaps is not None and tp in gaps:
            gaps[tp].clear()  # the skipped offsets are not acknowledged: they come again
        return await seek_in_consumer_thread(
            app.consumer, tp, offset, lambda: rebalances[0] == generation
        )

    @app.timer(interval=2.0)
    async def watchdog() -> None:
        """``look_for_stalls``, never raising: an exception in a Faust timer crashes the app,
        and a worker must not die of a rebalance or a broker hiccup met on the way. The next
        round, two seconds later, looks again."""
        await survive_round("the watchdog", look_for_stalls, metrics.watchdog_failures.inc)

    async def look_for_stalls() -> None:
        """Records that are on the log but never come. The guard only sees a skip when a later
        record arrives; at the end of a stream, or when a rebalance made the worker drop a batch
        it had not acknowledged, nothing later may come. Every 2 s, a partition with nothing
        fetched or handed over for 3 s whose log ends past the next expected offset is sought
        back, but only while no batch is queued or in progress: under a backlog a partition can
        wait its turn longer than that, and seeking it back would read it twice."""
        consumer = getattr(app, "consumer", None)
        if consumer is None:
            return
        if drain.busy():
            return  # records are on their way: a backlog, not a stall
        generation = rebalances[0]
        now = time.monotonic()
        fetched = drain.fetched_at
        idle = [
            tp
            for tp in consumer.assignment()
            if tp.topic in input_names
            and tp not in paused  # not fetched on purpose (hold_back)
            and now
            - max(
                arrived.get(tp, 0.0),
                fetched.get((tp.topic, tp.partition), 0.0),
                last_seek.get(tp, 0.0),
            )
            > 3.0
        ]
        if not idle:
            return
        ends = await consumer.highwaters(*idle)
        unknown = [(tp.topic, tp.partition) for tp in idle if not guard.knows(tp)]
        starts = await asyncio.to_thread(_committed_offsets, settings, unknown) if unknown else {}
        if rebalances[0] != generation:
            return
        for key, offset in starts.items():
            if not guard.knows(key):
                start_guard(key, offset)
        for tp in idle:
            if rebalances[0] != generation:
                return  # the seeks below would be for partitions that may have moved
            want = guard.expected.get((tp.topic, tp.partition))
            end = ends.get(tp)
            if want is not None and end is not None and end > want:
                log.warning(
                    "%s[%s]: records %s..%s wait on the log, none came; seeking back",
                    tp.topic,
                    tp.partition,
                    want,
                    end - 1,
                )
                if await seek(tp, want, generation):
                    guard.seeks += 1

    @app.timer(interval=settings.state_gauges_interval.total_seconds())
    async def count_state() -> None:
        """The open-work gauges, counted in a worker thread (``streams/state_gauges.py``)."""
        await survive_round(
            "the state gauges",
            lambda: metrics.gauges.refresh(executions),
            metrics.watchdog_failures.inc,
        )

    @contextlib.contextmanager
    def in_partition(message: Any) -> Iterator[None]:
        # A Faust table writes to the changelog partition of the event being processed.
        at = _At(message)
        token = _current_event.set(weakref.ref(at))
        try:
            yield
        finally:
            _current_event.reset(token)

    allowed = {t.name: t.value_types for t in topics.inputs()}

    async def process(generation: int, batch: list[Any]) -> None:
        if generation != rebalances[0]:
            return  # fetched before a rebalance: it comes again to the partition's owner
        consumer = app.consumer
        committed_now.clear()
        committed_now.update(guard.confirmed)
        watch_commits(consumer, guard.confirm)
        assignment = consumer.assignment()
        # where the guard starts: the committed offsets of the partitions it has not seen yet,
        # asked in one request (one request per partition cost seconds after a rebalance)
        unknown = [
            key
            for key in {(m.topic, m.partition) for m in batch if m.tp in assignment}
            if not guard.knows(key)
        ]
        if unknown:
            starts = await asyncio.to_thread(_committed_offsets, settings, unknown)
            if rebalances[0] != generation:
                return
            for key, offset in starts.items():
                if not guard.knows(key):
                    start_guard(key, offset)
        # schemas not seen yet are asked of the registry in a thread, not on the event loop
        unseen = codec.unseen_schema_ids(m.value for m in batch)
        if unseen:
            await asyncio.to_thread(codec.look_up, unseen)
            if rebalances[0] != generation:
                return
        emissions: list[Emission] = []
        #: (index of its first emission, input record): to tell which input an output came from
        origins: list[tuple[int, Any]] = []
        last: dict[int, Any] = {}
        handle = processor.handle
        limit = settings.max_record_failures
        for msg in batch:
            if msg.tp not in assignment or not await admit(msg, generation):
                continue
            if rebalances[0] != generation:
                return  # forget_partitions dropped this batch's state: it comes again
            ack_order.admit((msg.topic, msg.partition), msg.offset, msg)
            last[msg.partition] = msg
            ts = msg.timestamp
            env = open_envelope(
                codec,
                allowed,
                msg.topic,
                msg.partition,
                msg.offset,
                int(ts * 1000) if ts else None,
                msg.key,
                msg.value,
            )
            position = (msg.topic, msg.partition, msg.offset)
            origins.append((len(emissions), position))
            failed = failures.get(position) if failures else None
            if failed is not None and failed[0] >= limit:
                log.error("%s[%s]@%s quarantined after %s failed batches", *position, failed[0])
                emissions.extend(
                    processor.quarantine(
                        env, f"{failed[0]} batches failed on it; last: {failed[1]}", token=msg
                    )
                )
                del failures[position]
                continue
            try:
                emissions.extend(handle(env, token=msg))
            except Exception as exc:
                culprit = processor.applying  # the input being applied when it raised
                if culprit is not None:
                    position = (culprit.topic, culprit.partition, culprit.offset)
                failed_on(position, exc)
                raise

        def origin(index: int) -> tuple[str, int, int]:
            return origins[bisect.bisect_right(origins, index, key=lambda o: o[0]) - 1][1]

        # 1. the outputs, delivered
        sent: list[bytes] = []
        if emissions:
            if not await still_owner(generation):
                return
            for i, em in enumerate(emissions):
                try:
                    sent.append(send(em))
                except Exception as exc:  # refused before it left (too large, unencodable)
                    failed_on(origin(i), exc)
                    raise
            try:
                await delivered()
            except DeliveryFailed as exc:
                index = {
                    (em.topic, value): i
                    for i, (em, value) in enumerate(zip(emissions, sent, strict=True))
                }
                for topic, value, error in exc.failed:
                    i = index.get((topic, value))
                    if i is not None:
                        failed_on(origin(i), RuntimeError(error))
                raise
            approval_index.note(em.record for em in emissions)  # ahead of the table: harmless
        if not await still_owner(generation):
            return
        # 2. then the state that says they were published, delivered
        for p in processor.state.dirty_partitions():
            with in_partition(last[p]):
                processor.flush(p)
        await executions.send(app.producer)
        if not await still_owner(generation):
            return
        # 3. then the clocks, with how far each input is processed, and the inputs may be
        # committed
        for done in processor.drain_done():
            ack_order.finish(done)
        ready = ack_order.release()
        for msg in ready:  # in offset order per partition: the last one is the furthest
            processor.acknowledged(msg.topic, msg.partition, msg.offset + 1)
        for p in list(processor.dirty_partitions()):
            if p in last:
                with in_partition(last[p]):
                    processor.flush_clocks(p)
        await clocks.send(app.producer)
        if rebalances[0] == generation:
            # (else a rebalance came during the send: its forget() dropped what would be
            # acknowledged, and pausing now could pause a partition this worker lost; the
            # records come again, and the clock, if stored, says they are processed)
            for msg in ready:
                consumer.ack(msg)
            hold_back(consumer)
        if emissions:
            feed.publish(
                (em.record, em.topic, value) for em, value in zip(emissions, sent, strict=True)
            )
            now = time.time()
            for msg in batch:
                if msg.timestamp:
                    metrics.latency.observe(max(0.0, now - msg.timestamp))

    # The input topics are subscribed like an agent's, but their records come from the
    # batch drain (agents/drain.py), not through Faust's per-event stream.
    app.topics.add(source)
    drain = BatchDrain(
        input_names,
        lambda: rebalances[0],
        batch_size=settings.batch_size,
        batch_wait=settings.batch_wait.total_seconds(),
    )
    _install_drain(
        app,
        drain,
        settings.fetch_min_bytes,
        int(settings.fetch_max_wait.total_seconds() * 1000),
        lease,
    )

    #: input topic partitions this worker paused because they ran ahead (``hold_back``)
    paused: set[Any] = set()

    def hold_back(consumer: Any) -> None:
        """Stop reading input topic partitions that run ahead in event time, read them again
        when their waiting events drain (``streams/flow.py``)."""
        pause, resume = flow.hold_back(
            processor.held_by,
            ((tp.topic, tp.partition) for tp in paused),
            processor.held_ahead,
            settings.max_held,
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

    def forget() -> None:
        """Drop everything a batch in progress did that is not yet on the broker."""
        processor.forget_partitions()
        executions.discard()
        clocks.discard()
        guard.reset()
        ack_order.reset()
        consumer = getattr(app, "consumer", None)
        if paused and consumer is not None:
            # nothing is held any more; aiokafka raises for a partition no longer assigned
            held = [tp for tp in paused if tp in consumer.assignment()]
            if held:
                consumer.resume_partitions(held)
        paused.clear()

    pace = FetchPace(
        FetchSizes(settings.fetch_min_bytes, int(settings.fetch_max_wait.total_seconds() * 1000)),
        full=settings.batch_size,
    )
    paced: list[Any] = [None]  # the fetcher the current sizes were set on

    def pace_fetch(records: int) -> None:
        """Eager fetches under a backlog, patient ones once caught up (agents/fetch_pace.py).
        Never raises: it runs in the pipeline task, whose exception would stop the worker."""
        try:
            change = pace.after_batch(records)
            fetcher = running_fetcher(app.consumer)
            if fetcher is not paced[0]:
                change = pace.sizes  # a new fetcher starts patient (tune_fetch)
            if change is not None and apply_sizes(fetcher, change):
                paced[0] = fetcher
                metrics.fetch_eager.set(1 if pace.eager else 0)
        except Exception:  # the sizes are an optimisation: the worker goes on without them
            log.warning("could not set the fetch sizes", exc_info=True)

    @app.task
    async def pipeline() -> None:
        # Manual acknowledgement: a record held until the watermark passes its time is not
        # acknowledged, so its offset is not committed, and after a crash or a rebalance
        # Kafka delivers it again. Acknowledged only once processed, its outputs delivered
        # and the state that reflects it written.
        async for generation, batch in drain.batches():
            pace_fetch(len(batch))
            counted = processor.counters.snapshot()
            try:
                await process(generation, batch)
            except asyncio.CancelledError:
                raise
            except RegistryUnavailable as exc:
                # Not the records' fault: the registry could not be asked, while decoding
                # (before anything of the batch is published or acknowledged) or registering
                # an output schema. Forget the batch, wait (capped exponential backoff; warned,
                # counted, an error if it lasts), and its records are read again.
                forget()
                processor.counters = counted
                metrics.registry_unavailable.inc()
                await asyncio.sleep(
                    codec.outage.pause(
                        exc, settings.registry_outage_alert, settings.registry_retry_max
                    )
                )
            except Exception:
                # Never silently: the batch is not acknowledged, so forget what it did to the
                # state; the watchdog seeks back to the first unacknowledged record.
                log.exception("batch of %s records failed; it will be read again", len(batch))
                metrics.batch_failures.inc()
                forget()
                processor.counters = counted
            del batch  # not kept, decoded, while the next batch is awaited

    @app.on_partitions_revoked.connect
    async def _revoked(app: faust.App, revoked: Any, **_: Any) -> None:
        rebalances[0] += 1
        drain.clear()
        forget()

    @app.on_partitions_assigned.connect
    async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
        rebalances[0] += 1
        lease.renew()  # the group has just been joined: membership is proven now
        drain.clear()
        forget()

    return processor


class _At:
    """What a Faust table asks of "the event being processed": its message's partition."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, message: Any) -> None:
        self.message = message


def _install_drain(
    app: faust.App,
    drain: BatchDrain,
    fetch_min_bytes: int,
    fetch_max_wait_ms: int,
    lease: MembershipLease | None = None,
) -> None:
    """Give the worker's consumer the batch drain, its fetch sizes and the membership lease,
    whenever Faust creates it."""

    def install(consumer: Any) -> None:
        drain.install(consumer)
        tune_fetch(consumer, fetch_min_bytes, fetch_max_wait_ms)
        if lease is not None:
            watch_membership(consumer, lease)

    if app._consumer is not None:
        install(app._consumer)
        return
    new_consumer = app._new_consumer

    def _new_consumer() -> Any:
        consumer = new_consumer()
        install(consumer)
        return consumer

    app._new_consumer = _new_consumer  # type: ignore[method-assign]


def tune_fetch(consumer: Any, min_bytes: int, max_wait_ms: int) -> None:
    """Set the fetch sizes of the aiokafka consumer that Faust's consumer thread will create.

    Why: Faust builds it with ``fetch_min_bytes=1`` and ``fetch_max_wait_ms=1500`` and has no
    setting for either (``VIGIL_FETCH_MIN_BYTES``, ``VIGIL_FETCH_MAX_WAIT``). The thread makes
    the consumer in ``_create_worker_consumer`` and starts it at once; the values are set in
    between, where aiokafka reads them to build its fetcher."""
    thread = getattr(consumer, "_thread", None)
    create = getattr(thread, "_create_worker_consumer", None)
    if create is None:
        return

    def _create_worker_consumer(transport: Any) -> Any:
        kafka_consumer = create(transport)
        kafka_consumer._fetch_min_bytes = min_bytes
        kafka_consumer._fetch_max_wait_ms = max_wait_ms
        return kafka_consumer

    thread._create_worker_consumer = _create_worker_consumer


def watch_commits(consumer: Any, confirm: Callable[[tuple[str, int], int], None]) -> None:
    """Report every commit of Faust's ``consumer`` the broker accepted to ``confirm``
    (once per consumer: the wrapper marks itself). Faust's ``_commit_offsets`` calls
    ``_commit`` and records the offsets as committed whatever it returned."""
    original = getattr(consumer, "_commit", None)
    if original is None or getattr(original, "_vigil_confirms", False):
        return

    async def _commit(offsets: Any) -> bool:
        done = await original(offsets)
        if done:
            for tp, offset in offsets.items():
                confirm((tp.topic, tp.partition), offset)
        return bool(done)

    _commit._vigil_confirms = True  # type: ignore[attr-defined]
    consumer._commit = _commit


def watch_membership(consumer: Any, lease: MembershipLease) -> None:
    """Renew ``lease`` from the heartbeats of the aiokafka consumer Faust's consumer thread
    creates: its group coordinator exists once that consumer has started."""
    thread = getattr(consumer, "_thread", None)
    create = getattr(thread, "_create_worker_consumer", None)
    if create is None:
        return

    def _create_worker_consumer(transport: Any) -> Any:
        kafka_consumer = create(transport)
        start = kafka_consumer.start

        async def start_and_watch() -> None:
            await start()
            coordinator = getattr(kafka_consumer, "_coordinator", None)
            if coordinator is not None:
                lease.watch(coordinator)

        kafka_consumer.start = start_and_watch
        return kafka_consumer

    thread._create_worker_consumer = _create_worker_consumer


def _committed_offsets(
    settings: Settings, tps: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The group's committed offsets from the broker (the log start where none is)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka import TopicPartition as CTP

    admin = admin_client(settings)
    request = ConsumerGroupTopicPartitions(settings.app_id, [CTP(t, p) for t, p in tps])
    result = admin.list_consumer_group_offsets([request])[settings.app_id].result(timeout=30)
    out = {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}
    never = [key for key, offset in out.items() if offset < 0]
    if never:
        out.update(_earliest_offsets(settings, never))
    return out


def _earliest_offset(settings: Settings, tp: tuple[str, int]) -> int:
    return _earliest_offsets(settings, [tp])[tp]


def _earliest_offsets(settings: Settings, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The log start offsets (where a group with no committed offset begins)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP

    c = Consumer(settings.confluent_conf() | {"group.id": f"{settings.app_id}-offsets"})
    try:
        return {tp: c.get_watermark_offsets(CTP(*tp), timeout=30)[0] for tp in tps}
    finally:
        c.close()


def _lag(app: faust.App) -> dict[tuple[str, int], int]:
    """Records between the consumer's position and the log end, per input partition."""
    out: dict[tuple[str, int], int] = {}
    consumer = getattr(app, "consumer", None)
    if consumer is None:
        return out
    try:
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            last = consumer._committed_offset.get(tp)
            if high is not None and last is not None:
                out[(tp.topic, tp.partition)] = max(0, high - last)
    except Exception:  # metrics must never take the worker down
        log.debug("lag unavailable", exc_info=True)
    return out
