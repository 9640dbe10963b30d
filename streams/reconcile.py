"""``vigil reconcile``: every open work item checked against its source of truth.

The pipeline opens a ``ReconciliationWorkItem`` when an attempt's reply or verification is
overdue. This service takes each one (consumer group ``<app_id>-reconciler`` on
``<p>.reconciliation-work``, scaled by partitions like the worker), asks the checker of the
item's connector (``streams/reconcilers.py``) what the source says, and hands the answer to
the pure rules (``streams/core/reconcile.py``). What they decide is published as an
``OperationEvent`` from the RECONCILER source on ``<p>.operation-events`` (keyed by
execution id, murmur2), and the pipeline applies it like any other fact: the operation's
state, the work item's resolution and the alerts follow from the log. It only reads from
sources; it never sends the operation again.

**Progress survives restarts.** Its progress on each item is a ``ReconciliationCheck`` record
on the compacted ``<p>.reconciliation-checks`` topic, keyed by work item id and written to the
partition number the item was read from, so the replica that owns partition p of the work
topic owns partition p of the checks topic. A work item's offset is committed only once its
first progress record is on the broker, and an outcome is published before the progress
record that says so. On each partition assignment the replica reads that partition of the
checks topic from its beginning: items in CHECKING are checked again when due (a check cut
short by a crash is simply made again; its outcome event has the same id), the others are
done. A ``WorkItemResolution`` read on the work topic (a person in the console, a late
connector reply) ends the item's checks: no check is made again, nothing is published for it.

**Bounded.** Per connector, at most ``concurrency`` checks in flight and ``rate`` started per
second, each within ``timeout``. A revoked partition's checks are cancelled, except those
publishing, which are awaited, so a second replica taking the partition over finds the record
of every outcome published.

Serves ``/metrics`` and ``/healthz`` on ``VIGIL_RECONCILER_HOST`` / ``VIGIL_RECONCILER_PORT``
(127.0.0.1:6070; port 0: none).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from streams.contracts.codec import AvroCodec, DecodeError, RegistryUnavailable
from streams.contracts.models.base import Record, to_millis
from streams.contracts.models.enums import CheckFinding, ReconciliationState
from streams.contracts.models.outputs import (
    ReconciliationCheck,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.core import reconcile as rules
from streams.engine.emission import record_time_ms
from streams.kafka.topics import Topics
from streams.read.status_http import listen_address, serve
from streams.reconcilers import (
    Checker,
    CheckRequest,
    ReconcilersFile,
    http_checker,
    python_checker,
)
from streams.settings import Settings

log = logging.getLogger("vigil.reconcile")

#: where /metrics and /healthz are served when VIGIL_RECONCILER_PORT is not set
DEFAULT_STATUS_PORT = 6070
#: how often the scheduler looks for checks due when nothing woke it
SCHEDULER_IDLE = 0.5


def status_address(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    return listen_address(
        "VIGIL_RECONCILER_HOST", "VIGIL_RECONCILER_PORT", DEFAULT_STATUS_PORT, host, port
    )


def _now() -> datetime:
    return to_millis(datetime.now(UTC))


class ReconcilerStatus:
    """The reconciler's metrics and health. Items waiting and the oldest one are read from
    the items at scrape time (``items``: a function the reconciler sets)."""

    def __init__(self) -> None:
        from streams.read.metrics import register_process_collectors

        self.registry = CollectorRegistry()
        register_process_collectors(self.registry)
        self.checks = Counter(
            "vigil_reconciler_checks",
            "Checks made at the source, by connector and finding (VERIFIED, ABSENT, PENDING, "
            "ERROR: unreachable, timed out, refused, malformed)",
            ["connector", "finding"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "vigil_reconciler_outcomes",
            "Work items finished, by connector and outcome (VERIFIED, FAILED, MANUAL_REVIEW "
            "published; RESOLVED elsewhere; UNCONFIGURED: no checker)",
            ["connector", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "vigil_reconciler_check_seconds",
            "Time one check took, by connector",
            ["connector"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.retries = Counter(
            "vigil_reconciler_retries",
            "Checks that found nothing final and were scheduled again, by connector",
            ["connector"],
            registry=self.registry,
        )
        self.publish_failures = Counter(
            "vigil_reconciler_publish_failures",
            "Records the broker did not take (the check is made again later)",
            registry=self.registry,
        )
        self.undecodable = Counter(
            "vigil_reconciler_undecodable",
            "Records of the work topic that could not be decoded (logged, skipped)",
            registry=self.registry,
        )
        self.items: Callable[[], list[ReconciliationCheck]] = list
        self.assigned: int | None = None
        self.registry.register(_ItemsCollector(self))

    def healthy(self) -> tuple[bool, str]:
        if self.assigned is None:
            return False, "the consumer holds no assignment of the work topic"
        return True, f"{self.assigned} partition(s) assigned"


class _ItemsCollector:
    def __init__(self, status: ReconcilerStatus) -> None:
        self.status = status

    def collect(self) -> Iterable[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "vigil_reconciler_items_waiting",
            "Work items with a check still to make, by connector",
            labels=["connector"],
        )
        oldest = GaugeMetricFamily(
            "vigil_reconciler_oldest_item_age_seconds",
            "Age of the oldest work item still being checked (since the reconciler took it)",
            labels=["connector"],
        )
        assigned = GaugeMetricFamily(
            "vigil_reconciler_partitions_assigned", "Partitions of the work topic assigned"
        )
        assigned.add_metric([], self.status.assigned or 0)
        counts: dict[str, int] = {}
        first: dict[str, datetime] = {}
        for p in self.status.items():
            counts[p.connector] = counts.get(p.connector, 0) + 1
            if p.connector not in first or p.first_seen_at < first[p.connector]:
                first[p.connector] = p.first_seen_at
        now = datetime.now(UTC)
        for c, n in sorted(counts.items()):
            waiting.add_metric([c], n)
            oldest.add_metric([c], max(0.0, (now - first[c]).total_seconds()))
        return [waiting, oldest, assigned]


class RateLimit:
    """A token bucket: ``rate`` checks per second, bursts of up to ``max(1, rate)``."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.clock = clock
        self.at = clock()
        self.lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self.lock:
            self._refill()
            if self.tokens < 1.0:
                await asyncio.sleep((1.0 - self.tokens) / self.rate)
                self._refill()
                # the wait earned the token, whatever rounding the clock's arithmetic did
                self.tokens = max(self.tokens, 1.0)
            self.tokens -= 1.0

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now


@dataclass
class Connector:
    name: str
    check: Checker
    policy: rules.Policy
    slots: asyncio.Semaphore
    rate: RateLimit
    close: Callable[[], Any] | None = None


@dataclass
class Tracked:
    """A work item this replica is checking."""

    partition: int
    progress: ReconciliationCheck
    task: asyncio.Task[None] | None = None
    #: set while its outcome is being published: a revocation or a resolution waits for it
    publishing: bool = False


@dataclass
class _Done:
    partition: int
    progress: ReconciliationCheck


class Publisher:
    """Records onto the broker, each awaited until delivered (or failed). The producer is
    idempotent with acks=all and the murmur2 partitioner, like every producer of the inputs;
    its delivery reports are served by a thread of its own."""

    def __init__(self, settings: Settings, codec: AvroCodec) -> None:
        self.codec = codec
        self.producer = Producer(
            settings.confluent_conf()
            | {"partitioner": "murmur2_random", "enable.idempotence": True, "linger.ms": 2}
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="reconcile-delivery", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            self.producer.poll(0.05)

    def submit(
        self, topic: str, record: Record, key: str, partition: int | None
    ) -> asyncio.Future[None]:
        """Hand ``record`` to the producer now (so records of one key keep the order they
        were submitted in) and return what settles when the broker has it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def report(err: KafkaError | None, _msg: Any) -> None:
            def settle() -> None:
                if done.done():
                    return
                if err is None:
                    done.set_result(None)
                else:
                    done.set_exception(KafkaException(err))

            loop.call_soon_threadsafe(settle)

        kwargs: dict[str, Any] = {"timestamp": record_time_ms(record) or 0}
        if partition is not None:
            kwargs["partition"] = partition
        value = self.codec.encode(topic, record)
        while True:
            try:
                self.producer.produce(
                    topic, key=key.encode(), value=value, on_delivery=report, **kwargs
                )
                return done
            except BufferError:  # librdkafka's queue is full: let deliveries drain it
                self.producer.poll(0.05)

    async def send(self, topic: str, record: Record, key: str, partition: int | None) -> None:
        await self.submit(topic, record, key, partition)

    def close(self) -> None:
        self.producer.flush(10)
        self.stop.set()
        self.thread.join(2)


class Reconciler:
    """The consume → check → publish → commit loop (asyncio, one consumer thread)."""

    def __init__(
        self,
        settings: Settings,
        codec: AvroCodec,
        reconcilers: ReconcilersFile,
        *,
        clock: Callable[[], datetime] = _now,
        status: ReconcilerStatus | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec
        self.reconcilers = reconcilers
        self.clock = clock
        topics = Topics.from_settings(settings)
        self.work_topic = topics.reconciliation_work.name
        self.checks_topic = topics.reconciliation_checks.name
        self.events_topic = topics.operation_events.name
        self.group_id = f"{settings.app_id}-reconciler"
        self.status = status or ReconcilerStatus()
        self.status.items = lambda: [t.progress for t in list(self.items.values())]
        self.items: dict[str, Tracked] = {}
        self.done: dict[str, _Done] = {}
        self.assigned: set[int] = set()
        self.connectors: dict[str, Connector] = {}
        self.stop = threading.Event()
        self._unconfigured_logged: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        #: (due, sequence, work item id) of every check scheduled; an entry whose item has
        #: moved on (another due time, resolved, revoked) is dropped when it comes up
        self._due: list[tuple[datetime, int, str]] = []
        self._seq = 0

    # ------------------------------------------------------------------ setup

    def _build_connectors(self) -> None:
        for name, conf in self.reconcilers.connectors.items():
            policy = conf.policy()
            close = None
            if conf.http is not None:
                check, close = http_checker(conf.http, policy.timeout)
            else:
                assert conf.python is not None
                check = python_checker(conf.python)
            self.connectors[name] = Connector(
                name,
                check,
                policy,
                asyncio.Semaphore(policy.concurrency),
                RateLimit(policy.rate),
                close,
            )

    # ------------------------------------------------------------------ decoding

    def _decode(
        self, topic: str, value: bytes | None, types: tuple[type[Record], ...]
    ) -> Record | None:
        delay = 0.5
        while True:
            try:
                return self.codec.decode(topic, value, types)
            except DecodeError as exc:
                self.status.undecodable.inc()
                log.error("skipping an undecodable record of %s: %s", topic, exc)
                return None
            except RegistryUnavailable as exc:
                log.warning("schema registry unavailable (%s); retrying in %.1fs", exc, delay)
                if self.stop.wait(delay):
                    raise
                delay = min(delay * 2, 30.0)

    # ------------------------------------------------------------------ assignment: consumer thread

    def _read_checks(self, partitions: list[int]) -> dict[str, tuple[int, ReconciliationCheck]]:
        """The latest progress record of every work item of ``partitions``, read from the
        beginning of the checks topic to its end."""
        reader = Consumer(
            self.settings.confluent_conf()
            | {"group.id": f"{self.group_id}-rebuild", "enable.auto.commit": False}
        )
        latest: dict[str, tuple[int, ReconciliationCheck]] = {}
        try:
            remaining = {}
            for p in partitions:
                low, high = reader.get_watermark_offsets(
                    TopicPartition(self.checks_topic, p), timeout=30
                )
                if high > low:
                    remaining[p] = high
            reader.assign(
                [TopicPartition(self.checks_topic, p, OFFSET_BEGINNING) for p in remaining]
            )
            while remaining and not self.stop.is_set():
                for msg in reader.consume(500, 1.0):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(msg.error())
                        continue
                    p = msg.partition()
                    if p in remaining and msg.offset() + 1 >= remaining[p]:
                        del remaining[p]
                    if msg.value() is None:
                        continue
                    rec = self._decode(msg.topic(), msg.value(), (ReconciliationCheck,))
                    if isinstance(rec, ReconciliationCheck):
                        latest[rec.work_item_id] = (p, rec)
        finally:
            reader.close()
        return latest

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        ps = sorted(tp.partition for tp in partitions)
        started = time.monotonic()
        latest = self._read_checks(ps)
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._adopt(ps, latest), self._loop).result()
        self.status.assigned = len(self.assigned)
        log.info(
            "assigned %s; %d items from the checks topic (%d still checking) in %.1fs",
            ps,
            len(latest),
            sum(1 for _, r in latest.values() if rules.is_open(r)),
            time.monotonic() - started,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        ps = [tp.partition for tp in partitions]
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._release(ps), self._loop).result(timeout=120)
        self.status.assigned = None
        log.info("revoked %s", sorted(ps))

    async def _adopt(
        self, partitions: list[int], latest: dict[str, tuple[int, ReconciliationCheck]]
    ) -> None:
        self.assigned.update(partitions)
        for work_item_id, (p, rec) in latest.items():
            if rules.is_open(rec):
                t = self.items[work_item_id] = Tracked(p, rec)
                self._poke(t, work_item_id)
            else:
                self.done[work_item_id] = _Done(p, rec)
        self._poke()

    async def _release(self, partitions: list[int]) -> None:
        gone = set(partitions)
        self.assigned -= gone
        waits = []
        for wid, t in list(self.items.items()):
            if t.partition not in gone:
                continue
            if t.task is not None and not t.task.done():
                if t.publishing:
                    waits.append(t.task)
                else:
                    t.task.cancel()
                    waits.append(t.task)
            del self.items[wid]
        for wid in [w for w, d in self.done.items() if d.partition in gone]:
            del self.done[wid]
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)

    # ------------------------------------------------------------------ the work topic

    async def _take(self, msg: Any) -> tuple[str | None, asyncio.Future[None] | None]:
        """One record of the work topic: the id of the item it brings (None: none new) and
        the publication of the progress record its commit waits for (None: nothing to
        write)."""
        rec = self._decode(msg.topic(), msg.value(), (ReconciliationWorkItem, WorkItemResolution))
        p = msg.partition()
        if isinstance(rec, ReconciliationWorkItem):
            if rec.work_item_id in self.items or rec.work_item_id in self.done:
                return None, None  # read again after a restart: its progress is known
            configured = rec.connector in self.connectors
            progress = rules.taken(
                work_item_id=rec.work_item_id,
                operation_id=rec.operation_id,
                execution_id=rec.execution_id,
                attempt=rec.attempt,
                connector=rec.connector,
                idempotency_key=rec.idempotency_key,
                effect_ref=rec.effect_ref,
                kind=rec.kind,
                deadline=rec.deadline,
                created_at=rec.created_at,
                traceparent=rec.traceparent,
                now=self.clock(),
                configured=configured,
            )
            sent = self._publisher_send_checks(progress, p)
            if configured:
                t = self.items[rec.work_item_id] = Tracked(p, progress)
                self._poke(t, rec.work_item_id)
            else:
                if rec.connector not in self._unconfigured_logged:
                    self._unconfigured_logged.add(rec.connector)
                    log.warning(
                        "no checker for connector %r: its work items are left to a person",
                        rec.connector,
                    )
                self.done[rec.work_item_id] = _Done(p, progress)
                self.status.outcomes.labels(rec.connector, "UNCONFIGURED").inc()
            return rec.work_item_id, sent
        if isinstance(rec, WorkItemResolution):
            return None, await self._resolve(rec, p)
        return None, None

    def _publisher_send_checks(
        self, progress: ReconciliationCheck, partition: int
    ) -> asyncio.Future[None]:
        """The item's progress record, handed to the producer at once: before any check of
        the item can produce a later one."""
        return self.publisher.submit(self.checks_topic, progress, progress.work_item_id, partition)

    async def _resolve(
        self, res: WorkItemResolution, partition: int
    ) -> asyncio.Future[None] | None:
        wid = res.work_item_id
        t = self.items.get(wid)
        if t is not None:
            if t.task is not None and not t.task.done():
                if t.publishing:
                    await asyncio.gather(t.task, return_exceptions=True)
                else:
                    t.task.cancel()
                    await asyncio.gather(t.task, return_exceptions=True)
            t = self.items.get(wid)
        if t is not None:
            del self.items[wid]
            progress = rules.resolved(
                t.progress,
                self.clock(),
                f"resolved {res.outcome} on evidence from {res.evidence_source}",
            )
            self.done[wid] = _Done(t.partition, progress)
            self.status.outcomes.labels(progress.connector, "RESOLVED").inc()
            return self._publisher_send_checks(progress, t.partition)
        d = self.done.get(wid)
        if d is not None and d.progress.state in (
            ReconciliationState.MANUAL_REVIEW,
            ReconciliationState.UNCONFIGURED,
        ):
            progress = rules.resolved(
                d.progress,
                self.clock(),
                f"resolved {res.outcome} on evidence from {res.evidence_source}",
            )
            self.done[wid] = _Done(d.partition, progress)
            return self._publisher_send_checks(progress, d.partition)
        return None

    # ------------------------------------------------------------------ checks

    def _poke(self, t: Tracked | None = None, wid: str | None = None) -> None:
        """Schedule ``t``'s next check (if any) and wake the scheduler."""
        if t is not None and wid is not None and t.progress.next_check_at is not None:
            self._seq += 1
            heapq.heappush(self._due, (t.progress.next_check_at, self._seq, wid))
        if self._wake is not None:
            self._wake.set()

    async def _schedule(self) -> None:
        """Start each check when it is due."""
        assert self._wake is not None
        while not self.stop.is_set():
            now = self.clock()
            soonest: float = SCHEDULER_IDLE
            while self._due:
                due, _, wid = self._due[0]
                wait = (due - now).total_seconds()
                if wait > 0:
                    soonest = min(soonest, wait)
                    break
                heapq.heappop(self._due)
                t = self.items.get(wid)
                if t is None or t.progress.next_check_at != due:
                    continue  # moved on since it was scheduled
                if t.task is not None and not t.task.done():
                    continue
                t.task = asyncio.create_task(self._check(wid, t), name=f"check-{wid}")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(soonest, 0.005))

    async def _check(self, wid: str, t: Tracked) -> None:
        conn = self.connectors[t.progress.connector]
        p = t.progress
        async with conn.slots:
            await conn.rate.acquire()
            if self.items.get(wid) is not t:
                return  # resolved or revoked while it waited for a slot
            request = CheckRequest(
                work_item_id=p.work_item_id,
                operation_id=p.operation_id,
                execution_id=p.execution_id,
                attempt=p.attempt,
                connector=p.connector,
                idempotency_key=p.idempotency_key,
                effect_ref=p.item_effect_ref,
            )
            started = self.clock()
            t0 = time.monotonic()
            try:
                result = await asyncio.wait_for(
                    conn.check(request), conn.policy.timeout.total_seconds()
                )
            except TimeoutError:
                result = rules.CheckResult(CheckFinding.ERROR, detail="timeout")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a checker's bug is a failed check, not a dead service
                log.warning("checker of %s raised %s", p.connector, type(exc).__name__)
                result = rules.CheckResult(
                    CheckFinding.ERROR, detail=f"checker_raised_{type(exc).__name__}"
                )
            self.status.latency.labels(p.connector).observe(time.monotonic() - t0)
            self.status.checks.labels(p.connector, result.finding.value).inc()
        if self.items.get(wid) is not t:
            return
        decision = rules.decide(p, result, conn.policy, started, self.clock())
        t.publishing = True
        try:
            if isinstance(decision, rules.Publish):
                await self.publisher.send(
                    self.events_topic, decision.event, decision.event.execution_id, None
                )
            await self.publisher.send(
                self.checks_topic, decision.progress, decision.progress.work_item_id, t.partition
            )
        except Exception as exc:
            self.status.publish_failures.inc()
            log.error("publishing the outcome of %s failed (%s); checking again later", wid, exc)
            retry_at = self.clock() + rules.backoff(conn.policy, len(p.checks) + 1, wid)
            t.progress = p.model_copy(update={"next_check_at": retry_at})
            self._poke(t, wid)
            return
        finally:
            t.publishing = False
        t.progress = decision.progress
        if isinstance(decision, rules.Publish):
            self.items.pop(wid, None)
            self.done[wid] = _Done(t.partition, decision.progress)
            self.status.outcomes.labels(p.connector, decision.progress.state.value).inc()
            log.info(
                "%s of %s: %s after %d check(s) (event %s)",
                decision.event.kind,
                p.operation_id,
                wid,
                len(decision.progress.checks),
                decision.event.event_id,
            )
        else:
            self.status.retries.labels(p.connector).inc()
            self._poke(t, wid)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._build_connectors()
        self.publisher = Publisher(self.settings, self.codec)
        consumer = Consumer(
            self.settings.confluent_conf()
            | {
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "max.poll.interval.ms": 900_000,
                # a replica that died hands its partitions over after this (VIGIL_SESSION_TIMEOUT)
                "session.timeout.ms": int(self.settings.session_timeout.total_seconds() * 1000),
            }
        )
        pool = ThreadPoolExecutor(1, thread_name_prefix="reconcile-consumer")
        loop = self._loop

        def call(fn: Callable[..., Any], *args: Any) -> Any:
            return loop.run_in_executor(pool, fn, *args)

        log.info(
            "reconcile: %s (group %s) → %s; checkers for %s",
            self.work_topic,
            self.group_id,
            self.events_topic,
            sorted(self.connectors) or "no connector",
        )
        await call(
            lambda: consumer.subscribe(
                [self.work_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        )
        scheduler = asyncio.create_task(self._schedule())
        try:
            while not self.stop.is_set():
                msgs = await call(consumer.consume, 500, 0.2)
                await self._batch(msgs, consumer, call)
        finally:
            scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scheduler
            tasks = [t.task for t in self.items.values() if t.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await call(consumer.close)
            pool.shutdown(wait=True)
            self.publisher.close()
            for c in self.connectors.values():
                if c.close is not None:
                    with contextlib.suppress(Exception):
                        await c.close()

    async def _batch(self, msgs: list[Any], consumer: Consumer, call: Callable[..., Any]) -> None:
        """One batch of the work topic: take its items and resolutions, wait until their
        progress records are on the broker, then commit the batch's offsets."""
        pending = []
        new: list[str] = []
        last: dict[int, int] = {}
        for msg in msgs:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer: %s", msg.error())
                continue
            if msg.partition() not in self.assigned:
                continue  # fetched before a revocation
            last[msg.partition()] = msg.offset()
            taken, sent = await self._take(msg)
            if taken is not None:
                new.append(taken)
            if sent is not None:
                pending.append(sent)
        if pending:
            try:
                await asyncio.gather(*pending)
            except Exception as exc:
                # nothing of the batch is committed: forget the items it brought and read it
                # again from the committed offsets, so no item is committed unsaved
                self.status.publish_failures.inc()
                log.error("progress records not delivered (%s); reading the batch again", exc)
                for wid in new:
                    t = self.items.pop(wid, None)
                    if t is not None and t.task is not None:
                        t.task.cancel()
                    self.done.pop(wid, None)
                await call(self._rewind, consumer)
                return
        if last:
            offsets = [TopicPartition(self.work_topic, p, o + 1) for p, o in last.items()]
            try:
                await call(partial(consumer.commit, offsets=offsets, asynchronous=False))
            except KafkaException as exc:  # a rebalance: the new owner reads them again
                log.warning("commit failed (%s)", exc)

    def _rewind(self, consumer: Consumer) -> None:
        parts = [TopicPartition(self.work_topic, p) for p in self.assigned]
        for tp in consumer.committed(parts, timeout=30):
            if tp.offset >= 0:
                consumer.seek(tp)


def run_reconcile(
    settings: Settings,
    codec: AvroCodec,
    reconcilers: ReconcilersFile,
    status_at: tuple[str, int] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT."""
    r = Reconciler(settings, codec, reconcilers)
    host, port = status_at or status_address()
    server = None
    if port:
        try:
            server = serve(
                r.status.registry,
                r.status.healthy,
                host,
                port,
                unhealthy_word="UNASSIGNED",
                thread_name="reconcile-http",
            )
            log.info("reconcile metrics and health on http://%s:%s", host, port)
        except OSError as exc:
            log.error(
                "cannot serve the reconciler's metrics and health on %s:%s: %s", host, port, exc
            )

    def _stop(*_: object) -> None:
        r.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        asyncio.run(r.run())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


__all__ = [
    "DEFAULT_STATUS_PORT",
    "RateLimit",
    "Reconciler",
    "ReconcilerStatus",
    "run_reconcile",
    "status_address",
]
