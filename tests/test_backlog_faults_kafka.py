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
its partitions until its session expires, and every restart must fit in a few minutes.
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
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.contracts.models.base import Record
from streams.contracts.models.outputs import ExecutionState, OperationState
from streams.kafka.clients import ConsumedRecord
from tests.support import Deployment, deployment, kill_hard, play, worker
from tests.test_faults_kafka import (
    Feeder,
    MissingOutputs,
    assert_same_as_offline,
    final_states,
    settled,
    steady_stream,
    until_complete,
)
from tests.test_pipeline_kafka import offline

pytestmark = pytest.mark.kafka

#: kills per test (``VIGIL_FAULT_KILLS``, default 4: the suite's run; 10 or more for a longer
#: search, which the backlogs below are large enough for)
KILLS = int(os.environ.get("VIGIL_FAULT_KILLS") or 4)
#: executions in the backlog: enough for every kill to fall before one worker has drained it.
#: A kill lands up to a second and a commit interval past its target, which a worker draining
#: several thousand records a second turns into thousands of records; the targets share the
#: first ``SPAN`` of the backlog (``KillPlan``) and the rest is the margin for those overshoots.
#: Two workers drain more while a killed one restarts: they get more.
EXECUTIONS = 2000 + 500 * KILLS
EXECUTIONS_FOR_TWO = 3000 + 750 * KILLS
#: the share of the backlog the kill targets are drawn from
SPAN = 0.6
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


class Backfill(Feeder):
    """All the steps at once, before any worker runs; ``finish`` checks that the input topics
    hold exactly them (the offsets ``offline`` assumes)."""

    def run(self) -> None:
        try:
            play(self.dep, self.steps)
            self.sent = len(self.steps)
        except BaseException as exc:  # reported by finish()
            self.error = exc


def backlog(cluster: Any, tmp_path: Path, partitions: int, executions: int = EXECUTIONS) -> Backlog:
    dep = deployment(cluster, tmp_path, partitions=partitions)
    steps = steady_stream(executions)
    feeder = Backfill(dep, steps)
    feeder.start()
    expected = offline(steps, dep.settings)
    feeder.finish()
    return Backlog(dep, expected)


class Progress:
    """How far the drain is: records of the execution-status topic the group has acknowledged
    (committed). That topic sets the watermark (the others are read ahead of it and wait), so
    its committed offsets move with the drain; the others' jump when held events are released."""

    def __init__(self, dep: Deployment) -> None:
        self.app_id = dep.settings.app_id
        topic = dep.topics.execution_status.name
        c = Consumer(dep.settings.confluent_conf() | {"group.id": f"{self.app_id}-ends"})
        try:
            self.ends = {
                (topic, p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(dep.settings.partitions)
            }
        finally:
            c.close()
        self.records = sum(self.ends.values())
        self.admin = AdminClient(dep.settings.confluent_conf())

    def acknowledged(self) -> int:
        tps = [TopicPartition(*tp) for tp in self.ends]
        request = ConsumerGroupTopicPartitions(self.app_id, tps)
        result = self.admin.list_consumer_group_offsets([request])[self.app_id].result(30)
        return sum(max(tp.offset, 0) for tp in result.topic_partitions)

    def reach(self, n: int, procs: list[subprocess.Popen[bytes]], timeout: float = 25) -> int:
        """Wait until ``n`` records are acknowledged (or ``timeout``, or a worker died)."""
        deadline = time.monotonic() + timeout
        while (done := self.acknowledged()) < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.2)
        return done


class KillPlan:
    """Where to kill: after so many execution-status records are acknowledged, and a further
    0 to 1 s (a batch under a backlog takes about half a second), so that the kill falls
    anywhere in a batch: while it is read or processed, while its outputs or its state are
    sent, before its acknowledgement.

    Each target is drawn when the kill is due, from what is left of the first ``SPAN`` of the
    backlog, in an even share for each kill still to come: a kill that overshot its target
    (the delay, a commit that jumps, a restarted worker that catches up) moves the later ones
    on instead of leaving them behind it, where they would all fall at once at the end of the
    drain. The seed replays the draws; where they land depends on the drain's pace."""

    def __init__(self, rng: random.Random, records: int, kills: int = KILLS) -> None:
        self.rng = rng
        self.end = int(SPAN * records)
        self.left = kills

    def next(self, acknowledged: int) -> tuple[int, float]:
        share = max(self.end - acknowledged, 0) / max(self.left, 1)
        self.left -= 1
        return acknowledged + int(self.rng.uniform(0.0, share)), self.rng.uniform(0.0, 1.0)


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


def drained(
    dep: Deployment, expected: dict[str, Record], procs: list[subprocess.Popen[bytes]]
) -> list[ConsumedRecord]:
    """``until_complete``, with one known defect reported as such (an expected failure) rather
    than as this test's: a restarted worker, alive, whose fetches stall after the restart
    while the stall watchdog seeks its partitions back again and again ("none came; seeking
    back") and nothing is delivered (seen in about one full run in four on a 2-core machine;
    open, docs in topology.md "Known limits"). Anything else missing, and everything checked
    after a drain, stays a failure."""
    try:
        return until_complete(dep, expected)
    except MissingOutputs as exc:
        logs = [proc.log_path.read_text(errors="replace") for proc in procs]  # type: ignore[attr-defined]
        alive = all(proc.poll() is None for proc in procs)
        # the input watchdog's warning, or the recovery watch's when the stall is in Faust's
        # table recovery (the inputs are held back then)
        if alive and any(text.count("none came; seeking back") >= 5 for text in logs):
            seen = [line for text in logs for line in text.splitlines() if "none came" in line]
            pytest.xfail(
                f"known stall of a restarted worker's fetches: {str(exc)[:300]}; "
                f"the watchdog's last word: {seen[-1][-600:] if seen else '-'}"
            )
        raise


def check(got: list[ConsumedRecord], expected: dict[str, Record]) -> None:
    final_states(got, expected)
    assert_same_as_offline(got, expected)


def test_one_worker_killed_at_random_points_while_draining(cluster, tmp_path: Path) -> None:
    """kill -9 of the only worker at ``KILLS`` random points of the drain (``KillPlan``),
    each time restarted on the same data dir; the last one drains the rest."""
    rng = seeded("one worker")
    b = backlog(cluster, tmp_path, partitions=3)
    progress = Progress(b.dep)
    probe = HeldProbe()
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        plan = KillPlan(rng, progress.records)
        for n in range(1, KILLS + 1):
            w = start(b.dep, "data", stack)
            probe.watch(w)
            target, delay = plan.next(progress.acknowledged())
            done = progress.reach(target, [w])
            time.sleep(delay)
            kill_hard(w)
            left = progress.records - progress.acknowledged()
            print(f"kill {n}: {done} acknowledged + {delay:.2f}s, {left} left, {since(began)}")
        assert left > 0, "the backlog was drained before the last kill"
        w = start(b.dep, "data", stack)
        probe.watch(w)
        got = drained(b.dep, b.expected, [w])
        assert w.poll() is None
    probe.stop()
    print(f"at most {probe.max_held:.0f} events held; {since(began)}")
    assert probe.max_held >= 1000, "too few events were held for the watermark to test this"
    check(got, b.expected)


def test_either_of_two_workers_killed_at_random_points(cluster, tmp_path: Path) -> None:
    """Two workers share the backlog; ``KILLS`` times one of them, chosen at random, is killed
    -9 at a random point (``KillPlan``) and restarted on its own data dir, while the other
    goes on."""
    rng = seeded("two workers")
    b = backlog(cluster, tmp_path, partitions=4, executions=EXECUTIONS_FOR_TWO)
    progress = Progress(b.dep)
    probe = HeldProbe()
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        workers = {name: start(b.dep, name, stack) for name in ("a", "b")}
        for w in workers.values():
            probe.watch(w)
        plan = KillPlan(rng, progress.records)
        for n in range(1, KILLS + 1):
            target, delay = plan.next(progress.acknowledged())
            done = progress.reach(target, list(workers.values()))
            time.sleep(delay)
            name = rng.choice(sorted(workers))
            kill_hard(workers[name])
            left = progress.records - progress.acknowledged()
            print(f"kill {n}: {name}, {done} acknowledged + {delay:.2f}s, {left} left")
            workers[name] = start(b.dep, name, stack)
            probe.watch(workers[name])
        assert left > 0, "the backlog was drained before the last kill"
        got = drained(b.dep, b.expected, list(workers.values()))
        assert all(w.poll() is None for w in workers.values())
    probe.stop()
    print(f"at most {probe.max_held:.0f} events held; {since(began)}")
    assert probe.max_held >= 1000, "too few events were held for the watermark to test this"
    check(got, b.expected)


def test_worker_paused_past_its_session_publishes_nothing_extra(cluster, tmp_path: Path) -> None:
    """b is stopped (SIGSTOP) in the middle of the drain for longer than its session, a takes
    over all its partitions and processes them on, then b continues (SIGCONT): a zombie that
    must not publish what it computed from partitions it no longer owns."""
    rng = seeded("zombie")
    b = backlog(cluster, tmp_path, partitions=4)
    progress = Progress(b.dep)
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        first = start(b.dep, "a", stack)
        zombie = start(b.dep, "b", stack)
        settled([first, zombie], b.dep)
        progress.reach(int(rng.uniform(0.05, 0.3) * progress.records), [first, zombie])
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(zombie.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            settled([first], b.dep)  # b's session expired: a holds every partition
            time.sleep(rng.uniform(2.0, 5.0))  # and reads them past where b stood
            print(f"b stopped for {time.monotonic() - stopped:.1f}s")
        finally:
            os.killpg(zombie.pid, signal.SIGCONT)
        left = progress.records - progress.acknowledged()
        assert left > 0, "the backlog was drained before b continued"
        got = drained(b.dep, b.expected, [first, zombie])
        assert first.poll() is None and zombie.poll() is None
    print(f"{left} execution-status records left when b continued; {since(began)}")
    # nothing missing, nothing that should not exist, duplicates only identical
    assert_same_as_offline(got, b.expected)
    # The zombie's lease stops every batch it had not sent yet; what librdkafka held queued
    # at the instant of the stop still goes out when it continues (topology.md, "A worker
    # stopped past its session"): the same records the core published, which can land after
    # the new owner's newer ones. A compacted key may end on such a copy: never on a record
    # the core did not publish, and never on a later state than the core's.
    stale = final_states_or_stale_copies(got, b.expected)
    print(f"{len(stale)} keys end on a copy the zombie sent late: {sorted(stale)[:5]}")


def final_states_or_stale_copies(
    got: list[ConsumedRecord], expected: dict[str, Record]
) -> set[str]:
    """``final_states``, except that a key may end on an earlier record the core published
    for it; returns those keys."""
    try:
        final_states(got, expected)
        return set()
    except AssertionError:
        pass
    published = {r.model_dump_json() for r in expected.values()}
    stale: set[str] = set()
    in_log_order = sorted(got, key=lambda r: (r.topic, r.partition, r.offset))
    for cls, key in ((ExecutionState, "execution_id"), (OperationState, "operation_id")):
        live: dict[str, Record] = {}
        for r in in_log_order:
            if isinstance(r.record, cls):
                live[getattr(r.record, key)] = r.record
        core: dict[str, Record] = {}
        for r in expected.values():
            if isinstance(r, cls):
                core[getattr(r, key)] = r
        for k, want in core.items():
            have = live.get(k)
            assert have is not None, f"no final {cls.__name__} for {k}"
            if have != want:
                assert have.model_dump_json() in published, f"{k} ends on {have}"
                stale.add(k)
    return stale


def since(began: float) -> str:
    return f"at {time.monotonic() - began:.0f}s"
