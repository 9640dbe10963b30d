"""The pipeline agent: every input topic in, every output topic out.

One agent reads all input topics of a partition so that it sees every fact of an execution in
one place, and keeps the tables (in-flight executions, closed executions, operations,
approvals) co-partitioned with them: a table's changelog partition is the partition of the
record being processed. The agent only decodes (via ``SafeAvroSchema``), calls
``Processor.handle`` and sends what it returns, each output with the timestamp of its event
time, never the send time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from streams.codec import AvroCodec
from streams.envelope import SafeAvroSchema
from streams.feed import Feed
from streams.metrics import Metrics
from streams.processor import Emission, Processor, Stores
from streams.settings import Settings
from streams.topics import Topics
from streams.web import register_web

log = logging.getLogger("vigil.pipeline")


def _table(app: faust.App, name: str, partitions: int) -> Any:
    return app.Table(
        name,
        default=None,
        partitions=partitions,
        # Keys as JSON strings survive changelog recovery as ``str``; values are the JSON
        # text of core state models (``raw``: recovered as bytes, which pydantic reads too).
        schema=faust.Schema(
            key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
        ),
    )


def register(app: faust.App, settings: Settings, codec: AvroCodec) -> Processor:
    topics = Topics.from_settings(settings)
    schema = SafeAvroSchema(codec, {t.name: t.value_types for t in topics.inputs()})
    source = app.topic(*(t.name for t in topics.inputs()), schema=schema)
    n = settings.partitions
    stores = Stores(
        inflight=_table(app, "inflight-executions", n),
        closed=_table(app, "closed-executions", n),
        operations=_table(app, "operations", n),
        approvals=_table(app, "approvals", n),
        clocks=_table(app, "partition-clocks", n),
    )
    processor = Processor.from_settings(settings, topics, stores)
    sinks = {
        spec.name: app.topic(
            spec.name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        for spec in topics.outputs()
    }
    feed = Feed()
    metrics = Metrics(processor, lambda: _lag(app))
    register_web(app, processor, feed, settings, metrics)
    app.vigil_processor = processor  # type: ignore[attr-defined]

    async def send(em: Emission) -> None:
        ts = em.timestamp_ms
        await sinks[em.topic].send(
            key=em.key.encode() if em.key is not None else None,
            value=codec.encode(em.topic, em.record),
            timestamp=ts / 1000.0 if ts is not None else None,
            headers=list((k, v.encode()) for k, v in em.headers) or None,
        )

    @app.agent(source, name="vigil-pipeline", concurrency=1)
    async def pipeline(stream: faust.StreamT) -> None:
        # Manual acknowledgement: an event held until the watermark passes its time is not
        # acknowledged, so its offset is not committed, and after a crash or a rebalance
        # Kafka delivers it again. Acknowledged only once processed and its outputs are in
        # the producer (Faust flushes the producer before it commits).
        async for event in stream.noack().events():
            emissions = processor.handle(event.value, token=event)
            for em in emissions:
                await send(em)
            for done in processor.drain_done():
                done.ack()
            if emissions:
                feed.publish(em.record for em in emissions)
                ts = event.message.timestamp
                if ts:
                    metrics.latency.observe(max(0.0, time.time() - ts))

    @app.on_partitions_revoked.connect
    async def _revoked(app: faust.App, revoked: Any, **_: Any) -> None:
        processor.forget_partitions()

    @app.on_partitions_assigned.connect
    async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
        processor.forget_partitions()

    return processor


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
