"""Late events through the real broker, registry and worker, and the replay path: the same
answers whatever the interleaving of topics the reader happens to see (docs/rules.md#time).

One deployment holds two copies of the cases of ``tests/test_lateness.py`` (issue 26's ACK
written after the ticks past its deadline, seq 3 written after seq 4, a late accept), each
copy's executions on a partition of its own, each with the same per-topic logs:

- the **live** copy is written as it happened, the worker reading along: the ticks of 09:03:00
  reach every input and the worker decides the deadlines before the late records are written;
- the **apart** copy has its execution-status and operation-events partitions written whole
  first, while the worker holds them (the other two inputs of that partition have not been
  seen, so there is no watermark), then the other two: the way a replay reading one topic far
  ahead of the others sees the log.

Before the rule, the live copy said UNKNOWN + ``late_acknowledgement_ignored`` and
AFTER_TERMINAL, the apart copy ACKNOWLEDGED then VERIFICATION_TIMEOUT and no anomaly. Now
both copies publish the same records (up to the execution ids), and ``vigil replay`` of the
topics publishes exactly what the live worker did.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from streams.contracts.keys import scoped_key
from streams.contracts.models.events import ClockTick
from streams.contracts.models.outputs import ExecutionState, OperationState
from streams.kafka.clients import consume
from streams.kafka.partitioning import partition_of
from streams.replay import run_replay
from tests.support import Deployment, deployment, worker
from tests.test_lateness import LATE_FROM, Tick, at, topic_of, written

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _suffix_on(partition: int, avoid: str | None = None) -> str:
    """A suffix whose three executions all hash to ``partition``."""
    for n in range(10_000):
        suffix = f"-{n}"
        if suffix != avoid and all(
            partition_of(f"{name}{suffix}", PARTITIONS) == partition
            for name in ("ex-ack", "ex-seq", "ex-apr")
        ):
            return suffix
    raise AssertionError(f"no suffix hashes to partition {partition}")


LIVE, APART = 0, 1
LIVE_SUFFIX, APART_SUFFIX = _suffix_on(LIVE), _suffix_on(APART)


def produce(dep: Deployment, items: list[Any], partition: int, topics: set[str] | None = None):
    """``items`` in order, ticks into ``partition`` of every input topic (of ``topics`` only,
    when given), records to their topic (only those of ``topics``)."""
    p = dep.producer()
    for item in items:
        if isinstance(item, Tick):
            for spec in dep.topics.inputs():
                if topics is None or spec.name in topics:
                    tick = ClockTick(ticker_id="test", partition=partition, occurred_at=item.at)
                    p.send(spec.name, tick, key=None, partition=partition)
        else:
            topic = _topic(dep, item)
            if topics is None or topic in topics:
                p.send(topic, item)
    p.flush()


def _topic(dep: Deployment, record: Any) -> str:
    base = topic_of(record).split(".", 1)[1]
    return f"{dep.settings.topic_prefix}.{base}"


def held(port: int, topic: str, partition: int) -> int:
    """Events the worker holds for the watermark on one input topic partition (/metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if (
            name.startswith("vigil_events_held_by_input{")
            and f'topic="{topic}"' in name
            and f'partition="{partition}"' in name
        ):
            return int(float(value))
    return 0


def _plain(text: str) -> str:
    """Input coordinates (``topic/partition@offset``) and the digests of derived ids quoted
    in evidence (``wi-<hex>``), which name the copy's partition and executions, made alike."""
    text = re.sub(r"/\d+@\d+", "/P@O", text)
    return re.sub(r"\b([a-z]{1,6})-[0-9a-f]{12,}\b", r"\1-<digest>", text)


def _copy_ids(suffix: str) -> re.Pattern[str]:
    """The ids a copy's cases carry (its executions and its request), each with the copy's
    suffix and no further digit: a suffix alone (``-10``) also occurs inside other text, in
    another copy's ids (``ex-seq-101``) or in a hex digest (``anomaly-10f3...``)."""
    names = "|".join(re.escape(n) for n in ("ex-ack", "ex-seq", "ex-apr", "req-1"))
    return re.compile(f"({names}){re.escape(suffix)}(?![0-9])")


def normalized(dep: Deployment, topics: list[str], suffix: str) -> dict:
    """The outputs about one copy, per (output topic, key) in log order, with the copy's
    suffix taken out of every id and text and the derived ids (digests of those) left out."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    own = _copy_ids(suffix)
    for r in consume(dep.settings, dep.codec, topics, idle_timeout=2.0):
        assert r.record is not None, r.error
        text = r.record.model_dump_json()
        if not own.search(text):
            continue
        fields = {
            k: v
            for k, v in json.loads(_plain(own.sub(r"\1", text))).items()
            if (not k.endswith("_id") or k in ("operation_id", "request_id", "execution_id"))
            and k != "source_partition"  # the copies' partitions differ
        }
        seq = groups[(r.topic.rsplit(".", 1)[-1], own.sub(r"\1", r.key or ""))]
        item = json.dumps(fields, sort_keys=True)
        if item not in seq:
            seq.append(item)
    return dict(groups)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def per_key(dep: Deployment, topics: list[str]) -> dict:
    groups: dict[tuple[str, str | None], list[str]] = defaultdict(list)
    for r in consume(dep.settings, dep.codec, topics, idle_timeout=2.0):
        assert r.record is not None, r.error
        base = r.topic.rsplit(".", 1)[-1].split("-replay")[0]
        text = r.record.model_dump_json()
        if text not in groups[(base, r.key)]:
            groups[(base, r.key)].append(text)
    return dict(groups)


def test_late_records_are_judged_alike_live_apart_and_in_replay(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=PARTITIONS)
    live, apart = written(LIVE_SUFFIX), written(APART_SUFFIX)
    outputs = [t.name for t in dep.topics.outputs()]
    status_topic, ops_topic = dep.topics.execution_status.name, dep.topics.operation_events.name
    first_two = {status_topic, ops_topic}
    with worker(dep, reticks=False) as proc:
        # the live copy up to the ticks of 09:03:00; the apart copy's first two topics whole
        produce(dep, live[:LATE_FROM], LIVE)
        produce(dep, apart, APART, first_two)
        expected_held = sum(
            1 for item in apart if not isinstance(item, Tick) and _topic(dep, item) in first_two
        )

        def decided(records: list) -> bool:
            ops = [
                r.record
                for r in records
                if isinstance(r.record, OperationState) and LIVE_SUFFIX in r.record.execution_id
            ]
            ended = [
                r.record
                for r in records
                if isinstance(r.record, ExecutionState)
                and r.record.execution_id == f"ex-seq{LIVE_SUFFIX}"
                and r.record.status == "FAILED"
            ]
            return any(o.status == "UNKNOWN" for o in ops) and bool(ended)

        dep.read_until(outputs, decided, timeout=60)
        deadline = time.monotonic() + 60
        port = proc.web_port  # type: ignore[attr-defined]
        while time.monotonic() < deadline:
            if held(port, status_topic, APART) + held(port, ops_topic, APART) >= expected_held:
                break
            time.sleep(0.3)
        else:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            lines = [x for x in text.decode().splitlines() if "held" in x]
            raise AssertionError(f"the worker never held the apart copy's first two: {lines}")
        # now the late records of the live copy, and the other two topics of the apart copy
        produce(dep, live[LATE_FROM:], LIVE)
        produce(dep, apart, APART, {t.name for t in dep.topics.inputs()} - first_two)

        def stuck(records: list, suffix: str) -> bool:
            return any(
                getattr(r.record, "verdict", None) == "STUCK_AFTER_DECISION"
                and getattr(r.record, "execution_id", None) == f"ex-apr{suffix}"
                for r in records
            )

        dep.read_until(outputs, lambda rs: stuck(rs, LIVE_SUFFIX) and stuck(rs, APART_SUFFIX))
        time.sleep(1.0)  # the last outputs of the batch that published those
    one, other = normalized(dep, outputs, LIVE_SUFFIX), normalized(dep, outputs, APART_SUFFIX)
    ops = [json.loads(x) for x in one[("operation-state", scoped_key("ex-ack", "charge-1"))]]
    assert [(o["status"], o["reason"]) for o in ops][-2:] == [
        ("UNKNOWN", "reply_timeout"),
        ("UNKNOWN", "late_acknowledgement_ignored"),
    ]
    assert all(o["status"] != "ACKNOWLEDGED" for o in ops)
    anomalies = [
        json.loads(x)["kind"] for (topic, _), xs in one.items() if topic == "anomalies" for x in xs
    ]
    assert anomalies == ["AFTER_TERMINAL"]
    work = [json.loads(x) for x in one[("reconciliation-work", scoped_key("ex-ack", "charge-1"))]]
    assert [(w["kind"], _time(w["created_at"])) for w in work] == [("REPLY_TIMEOUT", at(35))]
    for key in sorted(set(one) | set(other)):
        assert one.get(key) == other.get(key), key

    replay = run_replay(
        dep.settings, dep.codec, at(0), output_suffix="-replay", show_progress=False
    )
    assert per_key(dep, list(replay.output_topics)) == per_key(dep, outputs)
