"""Prometheus metrics of a worker, collected at scrape time.

Counters live in ``Processor.counters`` (plain integers, no locking on the hot path); gauges
of open work are counted off the event loop (``streams/read/state_gauges.py``), so neither
processing nor a scrape pays for decoding the tables. The latency histogram is observed as
outputs are sent.

The clock gauges (watermark delay, newest tick age, UNKNOWN operations' age) are the one
place the worker reads the wall clock: here, at scrape time, to say how far stream time is
behind it; the processor only keeps the event times it has seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from streams.engine.processor import Processor
from streams.kafka.offsets import OffsetGuard
from streams.read.state_gauges import StateGauges


class VigilCollector:
    def __init__(
        self,
        processor: Processor,
        lag: Callable[[], dict[tuple[str, int], int]],
        guard: OffsetGuard | None = None,
        gauges: StateGauges | None = None,
    ):
        self.processor = processor
        self.lag = lag
        self.guard = guard
        self.gauges = gauges or StateGauges()

    def collect(self) -> Iterator[Any]:
        c = self.processor.counters
        events = CounterMetricFamily("vigil_events_in", "Input records by kind", labels=["kind"])
        for kind, n in sorted(c.inputs.items()):
            events.add_metric([kind], n)
        yield events
        outs = CounterMetricFamily("vigil_outputs", "Output records by kind", labels=["kind"])
        for kind, n in sorted(c.outputs.items()):
            outs.add_metric([kind], n)
        yield outs
        verdicts = CounterMetricFamily(
            "vigil_verdicts", "Verdict transitions by verdict", labels=["verdict"]
        )
        for v, n in sorted(c.verdicts.items()):
            verdicts.add_metric([v], n)
        yield verdicts
        dl = CounterMetricFamily("vigil_dead_letters", "Records sent to the dead-letter topic")
        dl.add_metric([], c.dead_letters)
        yield dl
        quarantined = CounterMetricFamily(
            "vigil_quarantined",
            "Input records set aside as dead letters after VIGIL_MAX_RECORD_FAILURES failed "
            "batches (each also raises a CRITICAL alert)",
        )
        quarantined.add_metric([], c.quarantined)
        yield quarantined
        late = CounterMetricFamily(
            "vigil_events_late",
            "Events written more than VIGIL_ALLOWED_LATENESS behind their own topic "
            "partition's time (the newest event time before them there, ticks included), "
            "judged at that time: a producer writing late, or ticks ahead of its clock",
        )
        late.add_metric([], c.late)
        yield late
        again = CounterMetricFamily(
            "vigil_inputs_redelivered",
            "Inputs Kafka delivered again whose effect the state already held (skipped)",
        )
        again.add_metric([], c.redelivered)
        yield again
        dropped = CounterMetricFamily(
            "vigil_traceparents_dropped",
            "Inputs whose traceparent was not a valid W3C traceparent: applied without it",
        )
        dropped.add_metric([], c.traceparents_dropped)
        yield dropped
        if self.guard is not None:
            seeks = CounterMetricFamily(
                "vigil_offset_seeks", "Seeks back after the consumer skipped input offsets"
            )
            seeks.add_metric([], self.guard.seeks)
            yield seeks
            lost = CounterMetricFamily(
                "vigil_offsets_never_delivered",
                "Input offsets accepted as missing (deleted by retention, or transaction markers)",
            )
            lost.add_metric([], self.guard.skipped_records)
            yield lost
            below = CounterMetricFamily(
                "vigil_inputs_below_committed",
                "Input records handed over below the offset the group had committed (a stale "
                "fetch position after a rebalance): skipped, their effect is already stored",
            )
            below.add_metric([], self.guard.below_committed)
            yield below
        anomalies = CounterMetricFamily("vigil_anomalies", "Anomalies by kind", labels=["kind"])
        for kind, n in sorted(c.anomalies.items()):
            anomalies.add_metric([str(kind)], n)
        yield anomalies
        alerts = CounterMetricFamily(
            "vigil_alerts",
            "Alerts published on the alerts topic, by kind, severity and status (FIRING, or "
            "RESOLVED when the condition left)",
            labels=["kind", "severity", "status"],
        )
        for (kind, severity, status), n in sorted(c.alerts.items()):
            alerts.add_metric([kind, severity, status], n)
        yield alerts
        yield from self._clock_metrics(time.time())

        counts = self.gauges.counts
        inflight = GaugeMetricFamily("vigil_executions_in_flight", "Executions in flight")
        inflight.add_metric([], counts.in_flight)
        yield inflight
        g = GaugeMetricFamily("vigil_operations_unknown", "Operations whose outcome is UNKNOWN")
        g.add_metric([], counts.operations_unknown)
        yield g
        g = GaugeMetricFamily(
            "vigil_operations_unknown_oldest_since",
            "When the longest-standing UNKNOWN operation became UNKNOWN (event time, Unix "
            "seconds; absent when none is): time() minus it is how long it has been left",
        )
        if counts.unknown_oldest_since is not None:
            g.add_metric([], counts.unknown_oldest_since)
        yield g
        g = GaugeMetricFamily("vigil_work_items_open", "Open reconciliation work items")
        g.add_metric([], counts.work_items_open)
        yield g
        g = GaugeMetricFamily(
            "vigil_approvals_open", "Open approval requests by verdict", labels=["verdict"]
        )
        for v, n in counts.approvals_open:
            g.add_metric([v], n)
        yield g
        age = self.gauges.age()
        g = GaugeMetricFamily(
            "vigil_state_gauges_age_seconds",
            "Age of the open-work gauges above (counted off the event loop every "
            "VIGIL_STATE_GAUGES_INTERVAL; -1 before the first count)",
        )
        g.add_metric([], -1.0 if age is None else age)
        yield g
        lag = GaugeMetricFamily(
            "vigil_consumer_lag", "Records behind the log end", labels=["topic", "partition"]
        )
        for (topic, partition), n in sorted(self.lag().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag

    def _clock_metrics(self, now: float) -> Iterator[Any]:
        """Per input partition, stream time against the wall clock ``now`` (Unix seconds).
        Reads the processor's clocks as they are (a dict per partition, on the event loop
        like the batches that change them): no table, no decoding."""
        p = self.processor
        delay = GaugeMetricFamily(
            "vigil_watermark_delay_seconds",
            "Wall-clock time minus the partition's watermark (the oldest of its input topics' "
            "newest event times, less VIGIL_ALLOWED_LATENESS): how far behind decisions due "
            "now are taken. Absent until every input topic of the partition has been read",
            labels=["partition"],
        )
        lateness = p.allowed_lateness.total_seconds()
        for partition, clock in sorted(p.clocks.items()):
            watermark = clock.watermark
            if watermark is not None:
                delay.add_metric([str(partition)], now - watermark.timestamp() + lateness)
        yield delay
        age = GaugeMetricFamily(
            "vigil_tick_age_seconds",
            "Wall-clock time minus the event time of the newest clock tick read on the input "
            "topic partition: grows when the ticker stops or the worker falls behind",
            labels=["topic", "partition"],
        )
        for (topic, partition), t in sorted(p.last_tick.items()):
            age.add_metric([topic, str(partition)], now - t.timestamp())
        yield age
        held = GaugeMetricFamily(
            "vigil_events_held_by_input",
            "Input events waiting for their partition's watermark, per input topic partition",
            labels=["topic", "partition"],
        )
        for (topic, partition), n in sorted(p.held_by.items()):
            held.add_metric([topic, str(partition)], n)
        yield held


def register_process_collectors(registry: CollectorRegistry) -> None:
    """The standard ``process_*`` (CPU, memory, open files, start time), ``python_info`` and
    ``python_gc_*`` metrics, as prometheus_client's default registry has them."""
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)  # type: ignore[arg-type]


class Metrics:
    def __init__(
        self,
        processor: Processor,
        lag: Callable[[], dict[tuple[str, int], int]],
        guard: OffsetGuard | None = None,
    ):
        self.registry = CollectorRegistry()
        self.gauges = StateGauges()
        self.registry.register(VigilCollector(processor, lag, guard, self.gauges))  # type: ignore[arg-type]
        register_process_collectors(self.registry)
        self.latency = Histogram(
            "vigil_processing_latency_seconds",
            "From an input record's timestamp to the send of its outputs (for live traffic, "
            "log append to output)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.lease_waits = Counter(
            "vigil_lease_waits",
            "Batches held because the worker's group membership was unproven (it was stopped "
            "past its session timeout): nothing is written until a heartbeat proves it again",
            registry=self.registry,
        )
        self.batch_failures = Counter(
            "vigil_batch_failures",
            "Batches whose processing raised; each is read again from its first "
            "unacknowledged record",
            registry=self.registry,
        )
        self.registry_unavailable = Counter(
            "vigil_registry_unavailable",
            "Batches given up because the schema registry could not be asked (unreachable, "
            "timed out, 5xx); their records are read again after a backoff, never dead-lettered",
            registry=self.registry,
        )
        self.watchdog_failures = Counter(
            "vigil_watchdog_failures",
            "Rounds of the stall watchdog that raised (logged; the next round looks again)",
            registry=self.registry,
        )
        self.recovery_seeks = Counter(
            "vigil_recovery_seeks",
            "Table changelog partitions sought back because Faust's recovery waited on them "
            "with nothing coming for 15 s",
            registry=self.registry,
        )
        self.paused = Counter(
            "vigil_partitions_paused",
            "Times an input topic partition was paused because its events waited for the "
            "watermark in numbers (VIGIL_MAX_HELD)",
            registry=self.registry,
        )
        self.fetch_eager = Gauge(
            "vigil_fetch_eager",
            "1 while batches come full (a backlog) and fetches ask for one byte, 0 while "
            "fetches wait for VIGIL_FETCH_MIN_BYTES up to VIGIL_FETCH_MAX_WAIT",
            registry=self.registry,
        )
        self.held = Gauge(
            "vigil_events_held",
            "Input events waiting for their partition's watermark",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
