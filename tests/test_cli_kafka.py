"""``vigil produce`` and ``vigil consume`` against the real broker: the samples go in and come
back, consume starts where it is told and filters like the console tools, and a broker or
registry that cannot be reached is one line and its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streams.cli.errors import ExitCode
from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from tests.support import ROOT, Deployment, deployment

SAMPLES = ROOT / "streams" / "samples"
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def _env(dep: Deployment) -> dict[str, str]:
    return {
        k: v
        for k, v in dep.env().items()
        if k.startswith(("KAFKA_", "SCHEMA_", "VIGIL_TOPIC_PREFIX", "VIGIL_PARTITIONS"))
    }


def vigil(dep: Deployment, *args: str, **env: str) -> Any:
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    return CliRunner(env={"COLUMNS": "200", **_env(dep), **env}).invoke(app, list(args))


def lines(res: Any) -> list[dict[str, Any]]:
    return [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]


@pytest.mark.kafka
def test_every_sample_is_produced_and_read_back(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=2)
    expected: Counter[str] = Counter()
    for spec in dep.topics.inputs():
        sample = SAMPLES / f"{spec.name.split('.', 1)[1]}.jsonl"
        n = len(sample.read_text().splitlines())
        res = vigil(dep, "produce", spec.name, str(sample))
        assert res.exit_code == 0, res.output
        assert f"produced {n} records to {spec.name}" in res.output
        expected[spec.name] = n

    res = vigil(dep, "consume", *expected, "--from-beginning", "--idle", "2")

    assert res.exit_code == 0, res.output
    got = lines(res)
    assert Counter(x["topic"] for x in got) == expected
    assert all("error" not in x for x in got)
    sent = {
        json.loads(line)["event_id"]
        for spec in dep.topics.inputs()
        for line in (SAMPLES / f"{spec.name.split('.', 1)[1]}.jsonl").read_text().splitlines()
    }
    assert {x["value"]["event_id"] for x in got} == sent


@pytest.mark.kafka
def test_consume_starts_where_told_and_filters_like_the_console_tools(
    cluster, tmp_path: Path
) -> None:
    dep = deployment(cluster, tmp_path, partitions=3)
    topic = dep.topics.execution_status.name
    producer = dep.producer()
    for i in range(12):
        ex = f"exec-{'ab'[i % 2]}{i % 3}"
        record = ExecutionStatusChanged(
            event_id=f"e{i}",
            execution_id=ex,
            sequence=i,
            status=ExecutionStatus.RUNNING,
            occurred_at=T0 + timedelta(minutes=i),
        )
        producer.send(topic, record, headers={"owner": "AB"[i % 2], "n": str(i)})
    producer.flush()

    everything = lines(vigil(dep, "consume", topic, "--offset", "beginning", "--idle", "2"))
    assert sorted(int(x["value"]["event_id"][1:]) for x in everything) == list(range(12))

    by_key = lines(vigil(dep, "consume", topic, "--from-beginning", "--key", "exec-a0"))
    assert {x["key"] for x in by_key} == {"exec-a0"} and len(by_key) == 2

    by_headers = lines(
        vigil(dep, "consume", topic, "-o", "beginning", "-H", "owner=B", "-H", "n=5")
    )
    assert [x["value"]["event_id"] for x in by_headers] == ["e5"]
    assert by_headers[0]["headers"]["owner"] == "B"

    some = Counter(x["partition"] for x in everything)
    p = max(some, key=lambda k: some[k])
    one_partition = lines(vigil(dep, "consume", topic, "--from-beginning", "--partition", str(p)))
    assert {x["partition"] for x in one_partition} == {p} and len(one_partition) == some[p]

    last = lines(vigil(dep, "consume", topic, "--offset", "-1"))
    assert sorted(x["partition"] for x in last) == sorted(some)
    assert all(x["offset"] == some[x["partition"]] - 1 for x in last)

    from_offset = lines(vigil(dep, "consume", topic, "-p", str(p), "--offset", "1"))
    assert [x["offset"] for x in from_offset] == list(range(1, some[p]))

    since = T0 + timedelta(minutes=9)
    late = lines(vigil(dep, "consume", topic, "--from-time", since.isoformat()))
    assert sorted(x["value"]["event_id"] for x in late) == ["e10", "e11", "e9"]

    capped = lines(vigil(dep, "consume", topic, "--from-beginning", "--max", "4"))
    assert len(capped) == 4

    bad = vigil(dep, "consume", topic, "--partition", "3")
    assert bad.exit_code == ExitCode.USAGE and "has partitions 0..2" in bad.output


@pytest.mark.kafka
def test_follow_waits_past_the_idle_time_for_new_records(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    topic = dep.topics.execution_status.name
    later = T0 + timedelta(hours=1)
    env = {**os.environ, **_env(dep), "PYTHONPATH": str(ROOT)}
    args = ["consume", topic, "--follow", "--idle", "0.5", "--max", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", *args, "--from-time", later.isoformat()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(4)  # well past --idle: without --follow it would have ended
        assert proc.poll() is None, proc.communicate()
        producer = dep.producer()
        for i in range(2):
            producer.send(
                topic,
                ExecutionStatusChanged(
                    event_id=f"late{i}",
                    execution_id="exec-late",
                    sequence=i,
                    status=ExecutionStatus.RUNNING,
                    occurred_at=later + timedelta(seconds=i),
                ),
            )
        producer.flush()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    got = [json.loads(x)["value"]["event_id"] for x in out.splitlines()]
    assert got == ["late0", "late1"]


@pytest.mark.kafka
def test_unknown_topics_and_unreachable_services_are_one_line(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=1)
    prefix = dep.settings.topic_prefix

    res = vigil(dep, "consume", f"{prefix}.nope")
    assert res.exit_code == ExitCode.TOPIC, res.output
    assert f"unknown topic {prefix}.nope" in res.output and f"{prefix}.alerts" in res.output

    # a deployment whose topics were never created: tick says so before writing anything
    res = vigil(dep, "tick", "2026-07-26T16:00:00Z", VIGIL_TOPIC_PREFIX=f"{prefix}x")
    assert res.exit_code == ExitCode.TOPIC, res.output
    assert "`vigil topics create` creates" in res.output

    sample = SAMPLES / "execution-status.jsonl"
    topic = dep.topics.execution_status.name
    res = vigil(dep, "produce", topic, str(sample), "--registry", "http://127.0.0.1:9")
    assert res.exit_code == ExitCode.REGISTRY, res.output
    assert "schema registry unavailable" in res.output and "Traceback" not in res.output

    started = time.monotonic()
    res = vigil(dep, "consume", topic, "--bootstrap", "127.0.0.1:9")
    assert res.exit_code == ExitCode.KAFKA, res.output
    assert "cannot reach the Kafka broker at 127.0.0.1:9" in res.output
    assert len(res.output.strip().splitlines()) == 1  # librdkafka's own logs stay quiet
    assert time.monotonic() - started < 30
