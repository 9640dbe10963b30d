"""``vigil reconcile`` measured against the bundled local payments provider.

Two sections, each on a deployment of its own (bench/harness.py: output topics stamped with
LogAppendTime, so record timestamps are when the broker appended them):

- **rate**: ``--items`` work items written to ``<p>.reconciliation-work`` first (a backlog, as
  the pipeline would publish them), every payment present at the provider; then one
  reconciler starts. Rate = items / (last outcome's progress record - first progress record),
  both broker append times.
- **latency**: a real worker, a real ``vigil ticker`` (1 s, the default) and one reconciler;
  ``--ops`` operations sent at ``--offered`` per second, each with its reply due 1 s later and
  its payment at the provider. Per work item, the time from the work item's append to its
  resolution's append (the pipeline applying the reconciler's VERIFIED): p50, p99, max.

    python -m bench.reconcile [--items 2000] [--ops 300] [--offered 20] [--sections rate,latency]

Prints a JSON summary. The machine is shared: figures move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.harness import (
    Deployment,
    cpu_seconds,
    delete_deployment,
    deployment,
    read_all,
    ticker,
    workers,
)
from streams.contracts.models.base import to_millis
from streams.contracts.models.enums import OperationEventKind, WorkItemKind
from streams.contracts.models.events import OperationEvent
from streams.contracts.models.outputs import (
    ReconciliationCheck,
    ReconciliationWorkItem,
    WorkItemResolution,
)
from streams.kafka.clients import RecordProducer
from streams.local.provider import Provider, reconcilers_toml
from streams.settings import Settings

TOKEN = "bench-token"


@contextmanager
def reconciler(
    dep: Deployment, provider: Provider, **policy: Any
) -> Iterator[tuple[float, subprocess.Popen[bytes]]]:
    """One ``vigil reconcile`` on ``dep``; yields the time it was assigned its partitions and
    the process."""
    conf = dep.workdir / "reconcilers.toml"
    conf.write_text(reconcilers_toml(provider.url, "payments", **policy))
    log_path = dep.workdir / "reconcile.log"
    env = dep.env(
        VIGIL_RECONCILERS_FILE=str(conf),
        VIGIL_DEMO_PROVIDER_TOKEN=TOKEN,
        VIGIL_RECONCILER_PORT="0",
    )
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "reconcile"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while "assigned" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(log_path.read_text()[-3000:])
            time.sleep(0.05)
        yield time.time(), proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


def records_on(dep: Deployment, topic: str) -> int:
    """How many records ``topic`` holds (cheap: end offsets, nothing decoded), so that the
    waiting costs the machine nothing beside what is measured."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(dep.settings.confluent_conf() | {"group.id": "bench-count"})
    try:
        return sum(
            high - low
            for low, high in (
                c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                for p in range(dep.settings.partitions)
            )
        )
    finally:
        c.close()


def decoded(dep: Deployment, topic: str) -> list[tuple[int, Any]]:
    """(append time in ms, record) of every record of ``topic``."""
    return [
        (r.append_ms, dep.codec.decode(topic, r.value))
        for r in read_all(dep.settings, [topic])
        if r.value is not None
    ]


def section_rate(base: Settings, workdir: Path, items: int) -> dict[str, Any]:
    dep = deployment(base, workdir, "reconcile-rate")
    provider = Provider(token=TOKEN).start()
    try:
        now = to_millis(datetime.now(UTC))
        producer = RecordProducer(dep.settings, dep.codec)
        work = dep.topics.reconciliation_work.name
        for i in range(items):
            op = f"op-{i}"
            provider.pay(f"key-{op}", f"pi-{i}")
            producer.send(
                work,
                ReconciliationWorkItem(
                    work_item_id=f"wi-{uuid.uuid4().hex[:12]}",
                    operation_id=op,
                    execution_id=f"exec-{i}",
                    attempt=1,
                    idempotency_key=f"key-{op}",
                    connector="payments",
                    kind=WorkItemKind.REPLY_TIMEOUT,
                    deadline=now,
                    created_at=now,
                ),
            )
        producer.flush()
        checks = dep.topics.reconciliation_checks.name
        with reconciler(dep, provider, rate=100_000, concurrency=32) as (started, proc):
            cpu_before = cpu_seconds(proc.pid)
            deadline = time.monotonic() + 600
            # two progress records per item: taken, then VERIFIED at the first check
            while records_on(dep, checks) < 2 * items and time.monotonic() < deadline:
                time.sleep(0.5)
            cpu = cpu_seconds(proc.pid) - cpu_before
        records = [(t, r) for t, r in decoded(dep, checks) if isinstance(r, ReconciliationCheck)]
        first = min(t for t, _ in records)
        last = max(t for t, r in records if r.state == "VERIFIED")
        assert len({r.work_item_id for _, r in records if r.state == "VERIFIED"}) == items
        return {
            "items": items,
            "seconds": round((last - first) / 1000, 2),
            "items_per_second": round(items / max((last - first) / 1000, 1e-3), 1),
            "start_to_first_record_s": round(first / 1000 - started, 2),
            "reconciler_cpu_seconds": round(cpu, 2),
            "reconciler_cpu_ms_per_item": round(1000 * cpu / items, 2),
            "provider_requests": len(provider.requests),
        }
    finally:
        provider.stop()
        delete_deployment(dep)


def section_latency(base: Settings, workdir: Path, ops: int, offered: float) -> dict[str, Any]:
    dep = deployment(base, workdir, "reconcile-latency")
    provider = Provider(token=TOKEN).start()
    try:
        with workers(dep, 1), ticker(dep, "1s"), reconciler(dep, provider):
            producer = RecordProducer(dep.settings, dep.codec)
            topic = dep.topics.operation_events.name
            began = time.monotonic()
            for i in range(ops):
                at = began + i / offered
                time.sleep(max(0.0, at - time.monotonic()))
                op = f"op-{i}"
                provider.pay(f"key-{op}", f"pi-{i}")
                now = to_millis(datetime.now(UTC))
                producer.send(
                    topic,
                    OperationEvent(
                        event_id=f"{op}-sent",
                        execution_id=f"exec-{i}",
                        operation_id=op,
                        attempt=1,
                        idempotency_key=f"key-{op}",
                        connector="payments",
                        kind=OperationEventKind.SENT,
                        occurred_at=now,
                        reply_due_at=now + timedelta(seconds=1),
                    ),
                )
            producer.flush()
            work = dep.topics.reconciliation_work.name
            deadline = time.monotonic() + 300
            # an item and its resolution per operation
            while records_on(dep, work) < 2 * ops and time.monotonic() < deadline:
                time.sleep(0.5)
        opened: dict[str, int] = {}
        resolved: dict[str, int] = {}
        for t, r in decoded(dep, work):
            if isinstance(r, ReconciliationWorkItem):
                opened.setdefault(r.work_item_id, t)
            elif isinstance(r, WorkItemResolution):
                resolved.setdefault(r.work_item_id, t)
        lat = sorted((resolved[w] - opened[w]) / 1000 for w in resolved if w in opened)
        q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else lat * 99
        return {
            "ops": ops,
            "offered_per_second": offered,
            "resolved": len(lat),
            "p50_s": round(q[49], 3),
            "p99_s": round(q[98], 3),
            "max_s": round(lat[-1], 3) if lat else None,
            "tick_interval": "1s",
        }
    finally:
        provider.stop()
        delete_deployment(dep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--offered", type=float, default=20.0)
    ap.add_argument("--sections", default="rate,latency")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    base = Settings.from_env()
    workdir = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    out: dict[str, Any] = {"load_average_before": os.getloadavg(), "cores": os.cpu_count()}
    if "rate" in sections:
        out["rate"] = section_rate(base, workdir, args.items)
    if "latency" in sections:
        out["latency"] = section_latency(base, workdir, args.ops, args.offered)
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
