"""The fetch pace on the real broker: a worker that meets a backlog fetches eagerly, and goes
back to patient fetches once it has caught up, with every output computed."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import by_id, deployment, play, worker
from tests.test_pipeline_kafka import offline
from tests.test_processor import sent

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def test_a_backlog_is_read_eagerly_then_the_worker_goes_back_to_patient_fetches(
    cluster, tmp_path: Path
) -> None:
    import httpx

    from streams.local.scenario import Tick

    dep = deployment(cluster, tmp_path, partitions=1)
    steps = [
        sent(f"op-{i}", ex=f"ex-{i}", minutes=i / 100, reply_due_at=T0 + timedelta(hours=1))
        for i in range(1200)
    ]
    steps.append(Tick(T0 + timedelta(minutes=13)))
    expected = offline(steps, dep.settings)
    play(dep, steps)
    env = {"VIGIL_BATCH_SIZE": "100", "VIGIL_FETCH_MIN_BYTES": "8192"}
    with worker(dep, env=env) as w:
        got = dep.read_until(
            [t.name for t in dep.topics.outputs()],
            lambda rs: len(by_id(rs)) >= len(expected),
            timeout=90,
        )
        log = w.log_path.read_text(errors="replace")
        eager = log.find("fetches now ask for 1 byte(s)")
        assert eager >= 0, log[-3000:]
        # caught up: only the re-sent ticks come, one small batch at a time
        deadline = time.monotonic() + 30
        while "fetches now ask for 8192 byte(s)" not in log[eager:]:
            assert time.monotonic() < deadline, f"never patient again:\n{log[-3000:]}"
            time.sleep(0.5)
            log = w.log_path.read_text(errors="replace")
        metrics = httpx.get(f"http://127.0.0.1:{w.web_port}/metrics", timeout=10).text
    assert "vigil_fetch_eager 0.0" in metrics
    live = by_id(got)
    assert sorted(r.model_dump_json() for r in live.values()) == sorted(expected)
