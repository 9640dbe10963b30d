"""A failed changelog write, on the real broker: the worker's state survives it and a restart.

The worker runs with ``tests/sites/changelog_fail`` on its ``PYTHONPATH``: its first sends of
execution entries to the changelog each get one record to the broker and the others refused
(see there). The batch fails and its records come again. Were the entries kept in memory
anyway, the records would be judged applied, acknowledged, and their effect lost at the next
restart, which recovers the table from the changelog. So the test waits until every input of
the first part of the stream is committed, restarts the worker without the fault, produces the
rest, and compares everything published with what the pure Processor computes for the whole
stream (``tests/test_faults_kafka.py`` has the helpers): the rest depends on the state (replies
to operations sent before the restart, their deadlines, the executions' next statuses).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from streams.local.scenario import Tick
from tests.support import ROOT, Deployment, deployment, play, worker
from tests.test_faults_kafka import (
    T0,
    _time,
    assert_same_as_offline,
    final_states,
    steady_stream,
    until_complete,
    worker_logs,
)
from tests.test_pipeline_kafka import offline

pytestmark = pytest.mark.kafka

SITE = ROOT / "tests" / "sites" / "changelog_fail"
MESSAGE = "injected changelog failure"  # as in the site hook's refusals


def first_part(steps: list[Any], after: float) -> int:
    """Where the stream is cut: just after the first tick at or past ``after`` seconds that no
    event shares its time with, so that no input of the first part waits for a later tick
    (all of it is acknowledged before the restart)."""
    events = {_time(s) for s in steps if not isinstance(s, Tick)}
    for i, s in enumerate(steps):
        if isinstance(s, Tick) and s.at >= T0 + timedelta(seconds=after) and s.at not in events:
            return i + 1
    raise AssertionError("no tick to cut the stream at")


def committed_to_the_end(dep: Deployment) -> bool:
    """Whether the group's committed offset is the end of every input topic partition."""
    c = Consumer(dep.settings.confluent_conf() | {"group.id": dep.settings.app_id})
    try:
        tps = [
            TopicPartition(spec.name, p)
            for spec in dep.topics.inputs()
            for p in range(spec.partitions)
        ]
        committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(tps, timeout=10)}
        for tp in tps:
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if high > low and committed[(tp.topic, tp.partition)] != high:
                return False
        return True
    finally:
        c.close()


def wait_committed_to_the_end(
    dep: Deployment, timeout: float = 40, also: Callable[[], bool] = lambda: True
) -> None:
    """Until ``committed_to_the_end`` (and ``also``) holds; fails with the workers' logs."""
    deadline = time.monotonic() + timeout
    while not (also() and committed_to_the_end(dep)):
        assert time.monotonic() < deadline, f"first part never committed\n{worker_logs(dep)}"
        time.sleep(0.5)


@dataclass
class SplitStream:
    """A deployment of its own, the steady stream of 10 executions with its first part (up
    to ``cut``) already played, and what the pure Processor publishes for the whole of it."""

    dep: Deployment
    steps: list[Any]
    cut: int
    expected: dict[str, Any]

    @classmethod
    def played(cls, cluster: Any, tmp_path: Path) -> SplitStream:
        dep = deployment(cluster, tmp_path, partitions=3)
        steps = steady_stream(10)
        cut = first_part(steps, 10)
        play(dep, steps[:cut])
        return cls(dep, steps, cut, offline(steps, dep.settings))

    def finish(self, timeout: float) -> None:
        """The rest played (a worker runs); everything published, within ``timeout`` s,
        checked against the pure Processor."""
        play(self.dep, self.steps[self.cut :])
        got = until_complete(self.dep, self.expected, quiet=10, timeout=timeout)
        final_states(got, self.expected)
        assert_same_as_offline(got, self.expected)


def test_a_failed_changelog_write_loses_no_state_across_a_restart(
    cluster: Any, tmp_path: Path
) -> None:
    stream = SplitStream.played(cluster, tmp_path)
    fault = {
        "VIGIL_TEST_CHANGELOG_FAILS": "2",
        "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}",
    }
    with worker(stream.dep, env=fault, reticks=False, ready_timeout=40) as w:
        wait_committed_to_the_end(
            stream.dep, also=lambda: MESSAGE in w.log_path.read_text(errors="replace")
        )
    log = w.log_path.read_text(errors="replace")
    assert log.count(f"{MESSAGE}:") >= 1 and "it will be read again" in log  # the fault was hit

    with worker(stream.dep, reticks=False, ready_timeout=40):
        stream.finish(timeout=60)
