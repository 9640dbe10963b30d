"""Placing clock ticks by hand on the real broker: ``vigil produce`` writes a tick line to the
partition the line names, and ``vigil tick TIME`` writes one tick at TIME into every partition
of every input topic (how an operator closes a backfill without the wall-clock ticker)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streams.contracts.models.events import ClockTick
from tests.support import Deployment, deployment

T = datetime(2026, 7, 26, 16, 30, tzinfo=UTC)


def vigil(dep: Deployment | None, *args: str) -> Any:
    """``vigil ARGS`` in this process, with the deployment's settings in the environment."""
    from streams.cli.main import _mount_optional, app

    _mount_optional()
    env = {"COLUMNS": "200"}
    if dep is not None:
        env |= {
            k: v
            for k, v in dep.env().items()
            if k.startswith(("KAFKA_", "SCHEMA_", "VIGIL_TOPIC_PREFIX", "VIGIL_PARTITIONS"))
        }
    return CliRunner(env=env).invoke(app, list(args))


@pytest.mark.kafka
def test_produce_writes_a_tick_line_to_the_partition_it_names(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=4)
    topic = next(t.name for t in dep.topics.inputs() if t.name.endswith("approval-events"))
    lines = [
        {"type": "ClockTick", "ticker_id": "backfill", "partition": p, "occurred_at": f"{at}Z"}
        for p, at in [
            (3, "2026-07-26T16:00:03"),
            (1, "2026-07-26T16:00:01"),
            (0, "2026-07-26T16:00:00"),
            (2, "2026-07-26T16:00:02"),
        ]
    ]
    bad = {
        "type": "ClockTick",
        "ticker_id": "backfill",
        "partition": 4,
        "occurred_at": T.isoformat(),
    }
    path = tmp_path / "ticks.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in [*lines, bad]))

    res = vigil(dep, "produce", topic, str(path))

    # the out-of-range line is refused by number, and then nothing is written
    assert res.exit_code == 4, res.output
    assert "line 5" in res.output and "partition 4" in res.output and "0..3" in res.output
    assert dep.read([topic], idle=2.0) == []

    # --skip-bad writes the others
    res = vigil(dep, "produce", topic, str(path), "--skip-bad")
    assert res.exit_code == 0, res.output
    assert "line 5" in res.output and "1 bad lines skipped" in res.output
    got = dep.read([topic], idle=2.0)
    assert len(got) == len(lines)
    for r in got:
        assert isinstance(r.record, ClockTick)
        assert r.partition == r.record.partition
        assert r.timestamp_ms == int(r.record.occurred_at.timestamp() * 1000)
    assert sorted(r.partition for r in got) == [0, 1, 2, 3]


@pytest.mark.kafka
def test_tick_command_writes_one_tick_into_every_input_partition(cluster, tmp_path: Path) -> None:
    dep = deployment(cluster, tmp_path, partitions=3)

    res = vigil(dep, "tick", "2026-07-26T16:30:00Z")

    assert res.exit_code == 0, res.output
    inputs = dep.topics.inputs()
    got = dep.read([t.name for t in inputs], idle=2.0)
    assert all(isinstance(r.record, ClockTick) for r in got)
    placed = Counter((r.topic, r.partition) for r in got)
    assert placed == Counter({(t.name, p): 1 for t in inputs for p in range(t.partitions)})
    for r in got:
        assert r.record.partition == r.partition and r.record.occurred_at == T
        assert r.timestamp_ms == int(T.timestamp() * 1000)
    assert str(sum(placed.values())) in res.output


@pytest.mark.parametrize(
    ("when", "complaint"),
    [("yesterday", "not an ISO-8601 time"), ("2026-07-26T16:30:00", "timezone")],
)
def test_tick_command_needs_a_time_with_a_timezone(when: str, complaint: str) -> None:
    res = vigil(None, "tick", when)
    assert res.exit_code == 2 and complaint in res.output


def test_tick_command_is_documented() -> None:
    res = vigil(None, "tick", "--help")
    assert res.exit_code == 0 and "every partition of every input topic" in res.output
