"""Issue 17, defect 1: faults while a worker drains a backlog, on the real broker.

The kill tests of ``test_faults_kafka.py`` feed records slowly, so little waits for the
watermark when the worker dies. Here the whole workload is on the log before the first worker
starts. The execution-status topic carries most of the records of each second of event time;
the other input topics carry a few events and their ticks, so the consumer, which reads every
partition at the same pace in bytes, is soon far ahead in event time on them and their events
are held (thousands, up to ``VIGIL_MAX_HELD`` per topic partition) until the execution-status
topic catches up. A worker killed then has read and kept, unacknowledged, many records that
Kafka delivers again after a restart: the state it stored (the partition clocks among it) must
not already be past them.

Every test compares the complete output set with what the pure Processor computes for the
same input records (``offline``): nothing missing, nothing else, a repeated id only an
identical record. The points of the faults are random; the seed is printed (a failed test
shows it) and ``VIGIL_FAULT_SEED`` replays a run.

The workers' consumer group session is 6 s here (the broker's minimum, ``VIGIL_SESSION_TIMEOUT``)
with a heartbeat every second (Faust's own ``BROKER_HEARTBEAT_INTERVAL``): a killed member holds
its partitions until its session expires, and ten restarts must fit in a few minutes.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from agents.pipeline import _committed_offsets
from streams.clients import ConsumedRecord
from streams.models.base import Record
from tests.support import Deployment, deployment, kill_hard, play, worker
from tests.test_faults_kafka import (
    Feeder,
    assert_same_as_offline,
    final_states,
    settled,
    steady_stream,
    until_complete,
)
from tests.test_pipeline_kafka import offline

pytestmark = pytest.mark.kafka

#: executions in the backlog: one worker alone needs over 20 s to drain it on a 2-core machine
EXECUTIONS = 5000
KILLS = 10
#: 6 s is the broker's group.min.session.timeout.ms; the heartbeat has no vigil setting, Faust
#: reads its own from the environment
SESSION = {"VIGIL_SESSION_TIMEOUT": "6s", "BROKER_HEARTBEAT_INTERVAL": "1"}


def seeded(name: str) -> random.Random:
    """A random source whose seed is printed: ``VIGIL_FAULT_SEED`` replays a failed run."""
    seed = int(os.environ.get("VIGIL_FAULT_SEED") or random.SystemRandom().randrange(2**31))
    print(f"{name}: seed {seed} (VIGIL_FAULT_SEED={seed} replays it)")
    return random.Random(seed)


@dataclass
class Backlog:
    dep: Deployment
    expected: dict[str, Record]
    records: int


class Backfill(Feeder):
    """All the steps at once, before any worker runs; ``finish`` checks that the input topics
    hold exactly them (the offsets ``offline`` assumes)."""

    def run(self) -> None:
        try:
            play(self.dep, self.steps)
            self.sent = len(self.steps)
        except BaseException as exc:  # reported by finish()
            self.error = exc


def backlog(cluster: Any, tmp_path: Path, partitions: int) -> Backlog:
    dep = deployment(cluster, tmp_path, partitions=partitions)
    steps = steady_stream(EXECUTIONS)
    feeder = Backfill(dep, steps)
    feeder.start()
    expected = offline(steps, dep.settings)
    feeder.finish()
    return Backlog(dep, expected, sum(input_ends(dep).values()))


def input_ends(dep: Deployment) -> dict[tuple[str, int], int]:
    tps = [(t.name, p) for t in dep.topics.inputs() for p in range(t.partitions)]
    c = Consumer(dep.settings.confluent_conf() | {"group.id": f"{dep.settings.app_id}-ends"})
    try:
        return {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1] for tp in tps}
    finally:
        c.close()


def unacknowledged(dep: Deployment) -> int:
    """Input records past the group's committed offsets: what is left to drain."""
    ends = input_ends(dep)
    committed = _committed_offsets(dep.settings, list(ends))
    return sum(end - committed[tp] for tp, end in ends.items())


class HeldProbe:
    """The largest ``vigil_events_held`` any watched worker reported: that the backlog did
    hold events for the watermark, which is what the faults are about. Asked from a thread,
    so that asking never delays a kill."""

    def __init__(self) -> None:
        self.max_held = 0.0
        self._stop = threading.Event()

    def watch(self, proc: subprocess.Popen[bytes]) -> None:
        threading.Thread(target=self._poll, args=(proc,), daemon=True).start()

    def _poll(self, proc: Any) -> None:
        url = f"http://127.0.0.1:{proc.web_port}/metrics"
        while proc.poll() is None and not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                text = urllib.request.urlopen(url, timeout=3).read().decode()
                found = re.search(r"^vigil_events_held ([0-9.e+]+)$", text, re.M)
                if found:
                    self.max_held = max(self.max_held, float(found.group(1)))

    def stop(self) -> None:
        self._stop.set()


def start(dep: Deployment, name: str, stack: contextlib.ExitStack) -> subprocess.Popen[bytes]:
    """A worker with its own data dir (``name``), the short session, stopped with ``stack``
    (a killed one is left as it is)."""
    data = ["--data-dir", str(dep.workdir / name)]
    return stack.enter_context(worker(dep, reticks=False, env=SESSION, extra_args=data))


def check(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    final_states(got, expected)
    assert_same_as_offline(got, expected)


def test_one_worker_killed_at_random_points_while_draining(cluster, tmp_path: Path) -> None:
    """kill -9 of the only worker at ten random points of the drain (0.05 to 5 s after it is
    ready: before its first batch, in the middle of one, between its state write and its
    acknowledgement), each time restarted on the same data dir; the last one drains the rest."""
    rng = seeded("one worker")
    b = backlog(cluster, tmp_path, partitions=3)
    probe = HeldProbe()
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        for n in range(KILLS):
            w = start(b.dep, "data", stack)
            probe.watch(w)
            delay = rng.uniform(0.05, 5.0)
            time.sleep(delay)
            kill_hard(w)
            print(f"kill {n + 1} {delay:.2f}s after ready, at {time.monotonic() - began:.0f}s")
        left = unacknowledged(b.dep)
        print(f"{left} of {b.records} input records left after the kills")
        assert left > 0, "the backlog was drained before the last kill: make it longer"
        w = start(b.dep, "data", stack)
        probe.watch(w)
        got = until_complete(b.dep, b.expected)
        assert w.poll() is None
    probe.stop()
    print(f"at most {probe.max_held:.0f} events held; {time.monotonic() - began:.0f}s")
    assert probe.max_held >= 1000, "too few events were held for the watermark to test this"
    check(got, b.expected)


def test_either_of_two_workers_killed_at_random_points(cluster, tmp_path: Path) -> None:
    """Two workers share the backlog; ten times one of them, chosen at random, is killed -9 at
    a random point (0.3 to 3 s after the group settled) and restarted on its own data dir,
    while the other goes on."""
    rng = seeded("two workers")
    b = backlog(cluster, tmp_path, partitions=4)
    probe = HeldProbe()
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        workers = {name: start(b.dep, name, stack) for name in ("a", "b")}
        for w in workers.values():
            probe.watch(w)
        for n in range(KILLS):
            delay = rng.uniform(0.3, 3.0)
            time.sleep(delay)
            name = rng.choice(sorted(workers))
            kill_hard(workers[name])
            at = time.monotonic() - began
            print(f"kill {n + 1}: {name} {delay:.2f}s after ready, at {at:.0f}s")
            workers[name] = start(b.dep, name, stack)
            probe.watch(workers[name])
        left = unacknowledged(b.dep)
        print(f"{left} of {b.records} input records left after the kills")
        assert left > 0, "the backlog was drained before the last kill: make it longer"
        got = until_complete(b.dep, b.expected)
        assert all(w.poll() is None for w in workers.values())
    probe.stop()
    print(f"at most {probe.max_held:.0f} events held; {time.monotonic() - began:.0f}s")
    assert probe.max_held >= 1000, "too few events were held for the watermark to test this"
    check(got, b.expected)


def test_worker_paused_past_its_session_publishes_nothing_extra(cluster, tmp_path: Path) -> None:
    """b is stopped (SIGSTOP) in the middle of the drain for longer than its session, a takes
    over all its partitions and processes them on, then b continues (SIGCONT): a zombie that
    must not publish what it computed from partitions it no longer owns."""
    rng = seeded("zombie")
    b = backlog(cluster, tmp_path, partitions=4)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        first = start(b.dep, "a", stack)
        zombie = start(b.dep, "b", stack)
        settled([first, zombie], b.dep)
        time.sleep(rng.uniform(0.3, 2.0))
        os.killpg(zombie.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            settled([first], b.dep)  # the session expired: a holds every partition
            time.sleep(rng.uniform(2.0, 5.0))  # and is past where b stood
            print(f"b stopped for {time.monotonic() - stopped:.1f}s")
        finally:
            os.killpg(zombie.pid, signal.SIGCONT)
        assert unacknowledged(b.dep) > 0, "the backlog was drained before b continued"
        got = until_complete(b.dep, b.expected)
        assert first.poll() is None and zombie.poll() is None
    print(f"{time.monotonic() - began:.0f}s")
    check(got, b.expected)
