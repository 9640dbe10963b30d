"""The worker's clock metrics (watermark delay, newest tick age, events held per input), the
alert counters, the UNKNOWN operations' age, the process metrics, and a scrape that stays
cheap with 100,000 executions in flight."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import streams.read.state_gauges as sg
from streams.contracts.models.enums import OperationStatus
from streams.engine.processor import Counters, Processor, Stores
from streams.engine.state import Entry
from streams.read.metrics import Metrics
from tests.test_processor import T0, TOPICS, env, sent, ticks
from tests.test_state_gauges import CountingTable, played


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, parsed as Prometheus parses it."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_snapshot_keeps_every_counter() -> None:
    """A failed batch puts the counters back to their snapshot: each one where it was."""
    c = Counters(
        inputs=Counter({"A": 1}),
        outputs=Counter({"B": 2}),
        dead_letters=3,
        verdicts=Counter({"C": 4}),
        anomalies=Counter({"D": 5}),
        quarantined=6,
        late=7,
        redelivered=8,
    )
    c.alerts[("OPERATION_UNKNOWN", "CRITICAL", "FIRING")] = 9
    assert c.snapshot() == c


def test_tick_age_watermark_delay_and_held_events_per_partition() -> None:
    proc = Processor(TOPICS, Stores())
    metrics = Metrics(proc, dict)
    before = samples(metrics)
    assert not [k for k in before if k[0] in {"vigil_watermark_delay_seconds"}]
    t0 = T0  # the event times of test_processor's records
    ticks(proc, t0)
    # an event ahead of the watermark waits for it
    proc.handle(env(sent("op-1", minutes=5, ex="ex-held")))
    held_at = (TOPICS.operation_events.name, proc.partition_of("ex-held"))
    now = time.time()
    got = samples(metrics)
    for p in range(3):
        delay = got[("vigil_watermark_delay_seconds", (("partition", str(p)),))]
        assert now - t0.timestamp() - 1 <= delay <= time.time() - t0.timestamp() + 1
        for spec in TOPICS.inputs():
            age = got[("vigil_tick_age_seconds", (("partition", str(p)), ("topic", spec.name)))]
            assert abs(age - delay) < 2
    held_key = (
        "vigil_events_held_by_input",
        (("partition", str(held_at[1])), ("topic", held_at[0])),
    )
    assert got[held_key] == 1
    ticks(proc, t0 + timedelta(minutes=6))  # the watermark passes it: released
    after = samples(metrics)
    assert after[held_key] == 0
    delay = after[("vigil_watermark_delay_seconds", (("partition", "0"),))]
    assert abs(delay - (time.time() - (t0 + timedelta(minutes=6)).timestamp())) < 2
    proc.forget_partitions()  # a rebalance: no stale partition keeps ageing
    gone = samples(metrics)
    assert not [k for k in gone if k[0] in {"vigil_tick_age_seconds", "vigil_events_held_by_input"}]


def test_alerts_counted_by_kind_severity_and_status() -> None:
    proc = played()
    got = samples(Metrics(proc, dict))
    alerts = {k: v for k, v in got.items() if k[0] == "vigil_alerts_total"}
    assert sum(alerts.values()) == proc.counters.outputs["Alert"] > 0
    labels = {dict(k[1])["kind"] for k in alerts}
    assert "OPERATION_UNKNOWN" in labels
    assert all(dict(k[1])["status"] in {"FIRING", "RESOLVED"} for k in alerts)


def test_oldest_unknown_operation_since() -> None:
    proc = played()
    counts = sg.count_state(proc.stores.executions.values())
    since = []
    for raw in proc.stores.executions.values():
        e = Entry.decode(raw)
        if e.operations:
            book = sg.ops.load_book(e.operations)
            since += [
                r.since / 1000
                for op in book.operations.values()
                for r in op.attempts.values()
                if r.status == OperationStatus.UNKNOWN
            ]
    assert since and counts.unknown_oldest_since == min(since)
    metrics = Metrics(proc, dict)
    assert ("vigil_operations_unknown_oldest_since", ()) not in samples(metrics)
    metrics.gauges.counts = counts
    assert samples(metrics)[("vigil_operations_unknown_oldest_since", ())] == min(since)
    assert sg.count_state([]).unknown_oldest_since is None


def test_process_and_platform_metrics() -> None:
    got = {name for name, _ in samples(Metrics(Processor(TOPICS, Stores()), dict))}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= got


@pytest.fixture
def hundred_thousand_in_flight(monkeypatch: pytest.MonkeyPatch) -> tuple[Processor, list[str]]:
    """A processor whose table holds 100,000 executions in flight (one demo entry copied
    under new keys), with every decode of an entry recorded."""
    proc = played()
    raw = next(v for v in proc.stores.executions.values() if Entry.decode(v).inflight)
    table = CountingTable({f"ex-{i}": raw for i in range(100_000)})
    proc.stores.executions = table
    proc.state.table = table
    decoded: list[str] = []
    original = sg.Entry.decode

    def spy(value: Any) -> Any:
        decoded.append("x")
        return original(value)

    monkeypatch.setattr(sg.Entry, "decode", spy)
    return proc, decoded


def test_a_scrape_with_100k_in_flight_decodes_nothing(
    hundred_thousand_in_flight: tuple[Processor, list[str]],
) -> None:
    proc, decoded = hundred_thousand_in_flight
    metrics = Metrics(proc, dict)
    ticks(proc, datetime.now(UTC))
    metrics.render()  # first render warms up the collectors
    started = time.perf_counter()
    for _ in range(10):
        body = metrics.render()
    per_scrape = (time.perf_counter() - started) / 10
    assert decoded == [] and proc.stores.executions.whole_reads == []
    assert b"vigil_tick_age_seconds" in body
    # the scrape reads counters and the last counts: well under a batch's time even on a
    # loaded machine (the count itself, off the loop, takes seconds here)
    assert per_scrape < 0.05, per_scrape


def test_the_watermark_delay_counts_the_allowed_lateness() -> None:
    """With a lateness the watermark trails the topics' times by it: decisions due now are
    taken that much later, and the gauge says so."""
    proc = Processor(TOPICS, Stores(), allowed_lateness=timedelta(minutes=2))
    ticks(proc, T0)
    delay = samples(Metrics(proc, dict))[("vigil_watermark_delay_seconds", (("partition", "0"),))]
    expected = time.time() - (T0 - timedelta(minutes=2)).timestamp()
    assert abs(delay - expected) < 2
