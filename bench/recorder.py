"""What recording a fact costs the agent, and what the recorder sustains, against a broker.

Two figures (BENCHMARKS.md, "The recorder"):

- **the agent's cost**: the wall time of one recorder call on the agent's thread (validation,
  the fact's id, the queue), per call, p50 and p99, over ``--calls`` calls of a realistic mix
  (status changes, operation events, heartbeats, approval facts), recorded one at a time
  with a short pause between them, as an agent does;
- **the sustained rate**: ``--facts`` facts recorded as fast as one thread can, then
  ``flush``: facts per second from the first call until the last delivery report, and the
  calls' rate alone (what the agent's thread could record if it did nothing else).

It makes its own topics (``bench-recorder-<random>``) on the broker of the environment
(KAFKA_BOOTSTRAP_SERVERS, SCHEMA_REGISTRY_URL), registers the schemas, and deletes the topics
at the end.

    python -m bench.recorder --calls 20000 --facts 200000
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from streams.contracts.codec import AvroCodec
from streams.kafka.admin import create_topics, prepare_registry
from streams.recorder import Recorder, RecorderSettings
from streams.settings import Settings

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def mix(recorder: Recorder, i: int) -> Any:
    """The ``i``-th call of the mix: one execution per 8 calls, cycling through its facts."""
    run = recorder.execution(f"ex-{i // 8}")
    step = i % 8
    if step == 0:
        return run.status("running")
    if step == 1:
        return run.operation("op-1", connector="payments", idempotency_key=f"k-{i}").sent(
            reply_due=timedelta(seconds=30)
        )
    if step == 2:
        return run.operation("op-1", connector="payments").acknowledged()
    if step == 3:
        return run.heartbeat(resume_handle="h")
    if step == 4:
        return run.approval(
            "req-1",
            action="deploy",
            arguments={"service": "api", "version": i},
            approver="role:release-owner",
            resume_handle="h",
            risk="high",
        )
    if step == 5:
        return run.request("req-1").delivered()
    if step == 6:
        return run.request("req-1").decided("accept")
    return run.resumed("req-1")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def outage(settings: Settings, codec: AvroCodec, facts: int) -> None:
    """``facts`` recorded while the broker cannot be reached (a port nobody listens on):
    how fast they reach the spool file; then a recorder on the real broker started on that
    spool: how fast it replays them."""
    spool = Path(tempfile.mkdtemp())
    options = replace(
        RecorderSettings(),
        spool_dir=str(spool),
        spool_after=timedelta(milliseconds=200),
        queue_max=10_000,
    )
    down = Recorder(
        replace(settings, bootstrap_servers="127.0.0.1:9"),
        recorder_settings=options,
        codec=codec,
        exit_hook=False,
    )
    start = time.perf_counter()
    for i in range(facts):
        mix(down, 30_000_000 + i)
    while down.counts.spooled < facts:
        time.sleep(0.01)
    spooled = time.perf_counter() - start
    down.close(0)
    up = Recorder(settings, recorder_settings=options, codec=codec, exit_hook=False)
    start = time.perf_counter()
    left = up.flush(600)
    replayed = time.perf_counter() - start
    counts = up.counts
    up.close()
    print(
        f"outage: {facts} facts spooled at {facts / spooled:,.0f}/s "
        f"({(spool / 'recorder.spool').stat().st_size if left else 0} bytes left); "
        f"replayed by the next recorder at {counts.replayed / replayed:,.0f}/s, {left} left"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--facts", type=int, default=200_000)
    parser.add_argument("--pause-us", type=float, default=50.0)
    parser.add_argument(
        "--outage", type=int, default=0, help="also spool this many facts, then replay them"
    )
    args = parser.parse_args()

    name = f"bench-recorder-{uuid.uuid4().hex[:6]}"
    settings = replace(Settings.from_env(), topic_prefix=name, partitions=6)
    codec = AvroCodec.connect(settings.registry_config())
    create_topics(settings)
    prepare_registry(settings, codec)
    spool = Path(tempfile.mkdtemp())
    clock_base = time.time()
    try:
        recorder = Recorder(
            settings,
            recorder_settings=replace(RecorderSettings(), spool_dir=str(spool)),
            codec=codec,
            exit_hook=False,
        )
        for i in range(2000):  # warm up: the registry lookups and the first batches
            mix(recorder, 10_000_000 + i)
        recorder.flush(60)

        costs: list[float] = []
        for i in range(args.calls):
            start = time.perf_counter_ns()
            mix(recorder, i)
            costs.append((time.perf_counter_ns() - start) / 1000)
            if args.pause_us:
                until = time.perf_counter() + args.pause_us / 1e6
                while time.perf_counter() < until:
                    pass
        recorder.flush(120)

        start = time.perf_counter()
        for i in range(args.facts):
            mix(recorder, 20_000_000 + i)
        called = time.perf_counter() - start
        left = recorder.flush(600)
        total = time.perf_counter() - start
        counts = recorder.counts
        recorder.close()
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(
            f"agent's cost per call: p50 {statistics.median(costs):.1f} us, "
            f"p99 {percentile(costs, 0.99):.1f} us, max {max(costs):.0f} us "
            f"({args.calls} calls, {args.pause_us:.0f} us apart)"
        )
        print(
            f"sustained: {args.facts / total:,.0f} facts/s delivered "
            f"({args.facts} facts in {total:.2f} s; the calls alone {args.facts / called:,.0f}"
            f"/s; {left} left undelivered, {counts.spooled} spooled)"
        )
        print(f"counts: {counts}; wall clock {time.time() - clock_base:.0f} s")
        if args.outage:
            outage(settings, codec, args.outage)
    finally:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(settings.confluent_conf())
        names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(name)]
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=60)


if __name__ == "__main__":
    main()
