"""The worker's side of Faust's consumer and of the broker's admin API.

What the pipeline needs of the consumer beyond Faust's own loop: the batch drain and fetch sizes
installed on every consumer Faust creates (``install_drain``), seeks run on the consumer's own
thread (``seek_in_consumer_thread``), the commits and heartbeats Faust reports
(``watch_commits``, ``watch_membership``), what Faust and aiokafka say of a partition that gets
no records (``consumer_state``), and the offsets asked of the broker directly, in a thread
(``committed_offsets``, ``earliest_offsets``, ``max_message_bytes``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import faust
from faust.types import TP

from streams.kafka.admin import admin_client
from streams.settings import Settings
from vigil_worker.drain import BatchDrain
from vigil_worker.lease import MembershipLease

log = logging.getLogger("vigil.pipeline")


async def seek_in_consumer_thread(
    consumer: Any, tp: Any, offset: int, still: Callable[[], bool] = lambda: True
) -> bool:
    """``Consumer.seek``, with aiokafka's part run on the consumer's own thread, and only if
    the partition is still assigned there. Returns whether it sought.

    Why the thread: Faust's ``Consumer.seek`` calls aiokafka's ``seek`` from the caller's
    thread, and that drops the partition's prefetched records from the fetcher while the
    consumer thread may be iterating over them in ``fetched_records``: the fetcher can die of
    a ``KeyError`` and take the worker with it. Queued on the consumer thread, the seek runs
    between two fetches.

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


def consumer_state(app: Any, tp: Any, drain: BatchDrain) -> str:
    """What Faust and aiokafka say of a partition that gets no records, and where the batch
    drain is: the watchdogs' warnings carry it, for a stall that seeking back does not end."""
    consumer = app.consumer
    parts = [
        f"drain_waits_for_room={drain.waiting_for_room} queued={drain.queue.qsize()} "
        f"claims_queued={drain.side_queue.qsize()} processing={drain.processing}",
        f"flow_active={getattr(consumer, 'flow_active', '?')}",
        f"faust_paused={tp in getattr(consumer, '_paused_partitions', ())}",
        f"faust_active={tp in (getattr(consumer, '_active_partitions', None) or ())}",
        f"buffered={tp in getattr(consumer, '_buffered_partitions', ())}",
        f"in_recovery={getattr(app, 'in_recovery', '?')}",
        f"rebalancing={getattr(app, 'rebalancing', '?')}",
    ]
    try:
        recovery = app.tables.recovery
        parts.append(f"recovery_completed={recovery.completed.is_set()}")
        parts.append(f"recovery_remaining={recovery.active_remaining_total()}")
        parts.append(f"changelog_queue={app.tables.changelog_queue.qsize()}")
    except Exception as exc:
        parts.append(f"recovery=?({exc!r})")
    parts.append(f"read_offset={getattr(consumer, '_read_offset', {}).get(tp)}")
    thread = getattr(consumer, "_thread", None)
    kafka_consumer = getattr(thread, "_consumer", None)
    subscription = getattr(kafka_consumer, "_subscription", None)
    try:
        state = subscription.subscription.assignment.state_value(tp)
        parts.append(
            f"aiokafka_paused={state.paused} has_position={state.has_valid_position} "
            f"position={state._position if state.has_valid_position else None} "
            f"awaiting_reset={state.awaiting_reset}"
        )
    except Exception as exc:
        parts.append(f"aiokafka=?({exc!r})")
    fetcher = getattr(kafka_consumer, "_fetcher", None)
    records = getattr(fetcher, "_records", None)
    if records is not None:
        parts.append(f"prefetched={tp in records}")
    in_flight = getattr(fetcher, "_in_flight", None)
    if in_flight is not None:
        parts.append(f"fetches_in_flight={len(in_flight)}")
    return " ".join(parts)


def install_drain(
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

    def sized(kafka_consumer: Any) -> None:
        kafka_consumer._fetch_min_bytes = min_bytes
        kafka_consumer._fetch_max_wait_ms = max_wait_ms

    on_new_kafka_consumer(consumer, sized)


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

    def watched(kafka_consumer: Any) -> None:
        start = kafka_consumer.start

        async def start_and_watch() -> None:
            await start()
            coordinator = getattr(kafka_consumer, "_coordinator", None)
            if coordinator is not None:
                lease.watch(coordinator)

        kafka_consumer.start = start_and_watch

    on_new_kafka_consumer(consumer, watched)


def on_new_kafka_consumer(consumer: Any, adjust: Callable[[Any], None]) -> None:
    """Call ``adjust`` on every aiokafka consumer Faust's consumer thread creates for
    ``consumer``, between its creation (``_create_worker_consumer``) and its start. Nothing
    when Faust's consumer has no such thread (a stand-in)."""
    thread = getattr(consumer, "_thread", None)
    create = getattr(thread, "_create_worker_consumer", None)
    if create is None:
        return

    def _create_worker_consumer(transport: Any) -> Any:
        kafka_consumer = create(transport)
        adjust(kafka_consumer)
        return kafka_consumer

    thread._create_worker_consumer = _create_worker_consumer


def committed_offsets(settings: Settings, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The group's committed offsets from the broker (the log start where none is).

    Asked through a consumer of the group that never subscribes (so it never joins), not an
    admin client: librdkafka answers an OffsetFetch that meets a coordinator still loading
    its groups (NOT_COORDINATOR, as just after a broker restart) by asking the client's
    consumer group to look for the coordinator again, and an admin client has none: the
    process died of a segfault (confluentinc/librdkafka#5315, open in 2.16)."""
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka import TopicPartition as CTP

    consumer = Consumer(
        settings.confluent_conf() | {"group.id": settings.app_id, "enable.auto.commit": False}
    )
    try:
        committed = consumer.committed([CTP(t, p) for t, p in tps], timeout=30)
    finally:
        consumer.close()
    failed = [tp for tp in committed if tp.error is not None]
    if failed:  # never taken for "nothing committed": that would read the partition again
        raise KafkaException(failed[0].error)
    out = {(tp.topic, tp.partition): tp.offset for tp in committed}
    never = [key for key, offset in out.items() if offset < 0]
    if never:
        out.update(earliest_offsets(settings, never))
    return out


def max_message_bytes(settings: Settings, topic: str) -> int | None:
    """The topic's ``max.message.bytes``, as the broker reports it (None: not set)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = admin_client(settings)  # held until the answer: a dropped client cancels it
    entry = admin.describe_configs([resource])[resource].result(timeout=30).get("max.message.bytes")
    return int(entry.value) if entry is not None and entry.value else None


def earliest_offset(settings: Settings, tp: tuple[str, int]) -> int:
    return earliest_offsets(settings, [tp])[tp]


def earliest_offsets(settings: Settings, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The log start offsets (where a group with no committed offset begins)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP

    c = Consumer(settings.confluent_conf() | {"group.id": f"{settings.app_id}-offsets"})
    try:
        return {tp: c.get_watermark_offsets(CTP(*tp), timeout=30)[0] for tp in tps}
    finally:
        c.close()


def consumer_lag(app: faust.App) -> dict[tuple[str, int], int]:
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
