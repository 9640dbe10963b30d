"""Replays for backfills on the real broker: the same outputs as the live run, and as a second
replay — same ids, same contents, same order per key."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from streams.kafka.clients import consume
from streams.local.scenario import REFERENCE_AT, demo_scenario
from streams.replay import run_replay
from tests.support import deployment, play, worker

pytestmark = pytest.mark.kafka


def per_key(dep, topics: list[str]) -> dict[tuple[str, str | None], list[str]]:
    """Records of each output topic grouped by key, in log order; a redelivered duplicate
    (the same record again) counted once."""
    groups: dict[tuple[str, str | None], list[str]] = defaultdict(list)
    for r in consume(dep.settings, dep.codec, topics, idle_timeout=3.0):
        assert r.record is not None, r.error
        base = r.topic.rsplit(".", 1)[-1].split("-replay")[0]
        text = r.record.model_dump_json()
        seq = groups[(base, r.key)]
        if text not in seq:
            seq.append(text)
    return dict(groups)


def test_replay_equals_live_and_itself(cluster, tmp_path: Path) -> None:
    """The second replay shares the partitions among three processes: same outputs."""
    dep = deployment(cluster, tmp_path)
    steps = demo_scenario()
    play(dep, steps)
    live_topics = [t.name for t in dep.topics.outputs()]
    with worker(dep):
        dep.read_until(
            live_topics,
            lambda rs: any(
                r.record is not None
                and getattr(r.record, "evaluated_at", None) is not None
                and r.record.evaluated_at >= REFERENCE_AT - timedelta(minutes=5)
                for r in rs
            ),
        )
        # let the last releases land
        settled = len(dep.read(live_topics, idle=2))
        dep.read_until(live_topics, lambda rs: len(rs) >= settled)
    live = per_key(dep, live_topics)

    start = min(getattr(s, "occurred_at", None) or s.at for s in steps)
    first = run_replay(
        dep.settings, dep.codec, start, output_suffix="-replay1", show_progress=False
    )
    second = run_replay(
        dep.settings,
        dep.codec,
        start,
        output_suffix="-replay2",
        show_progress=False,
        processes=3,
    )
    assert (first.processes, second.processes) == (1, 3)
    assert first.records_read == second.records_read > 0
    assert {t.removesuffix("-replay1"): n for t, n in first.outputs_by_topic.items()} == {
        t.removesuffix("-replay2"): n for t, n in second.outputs_by_topic.items()
    }
    assert first.outputs_written == second.outputs_written == sum(map(len, live.values()))
    one = per_key(dep, list(first.output_topics))
    two = per_key(dep, list(second.output_topics))
    assert one == two
    assert one == live


def test_replay_to_a_time_decides_everything_before_it(cluster, tmp_path: Path) -> None:
    """With --to, decisions due before the end are taken even if no tick passed them."""
    from streams.contracts.models.outputs import ReconciliationWorkItem
    from tests.test_processor import T0, sent

    dep = deployment(cluster, tmp_path)
    play(dep, [sent("op-1", reply_due_at=T0 + timedelta(seconds=30))])  # no ticks at all
    summary = run_replay(
        dep.settings,
        dep.codec,
        T0,
        T0 + timedelta(minutes=1),
        output_suffix="-bf",
        show_progress=False,
    )
    got = [
        r.record
        for r in consume(dep.settings, dep.codec, list(summary.output_topics), idle_timeout=3.0)
    ]
    items = [r for r in got if isinstance(r, ReconciliationWorkItem)]
    assert len(items) == 1 and items[0].deadline == T0 + timedelta(seconds=30)
    assert summary.records_read == 1 and summary.held == 0


@pytest.mark.parametrize("processes", [1, 2])
def test_replay_reaches_the_end_time_in_every_partition(
    cluster, tmp_path: Path, processes: int
) -> None:
    """Operations in several partitions, no ticks, a replay to a time: every partition's
    deadlines are taken, whichever process holds the partition."""
    from streams.contracts.models.outputs import ReconciliationWorkItem
    from streams.kafka.partitioning import partition_of
    from tests.test_processor import T0, sent

    dep = deployment(cluster, tmp_path)
    events = [
        sent(f"op-{i}", ex=f"exec-{i}", reply_due_at=T0 + timedelta(seconds=30)) for i in range(12)
    ]
    assert len({partition_of(e.execution_id, dep.settings.partitions) for e in events}) > 2
    play(dep, events)
    summary = run_replay(
        dep.settings,
        dep.codec,
        T0,
        T0 + timedelta(minutes=1),
        output_suffix=f"-bf{processes}",
        show_progress=False,
        processes=processes,
    )
    assert summary.processes == processes
    got = [
        r.record
        for r in consume(dep.settings, dep.codec, list(summary.output_topics), idle_timeout=3.0)
    ]
    items = [r for r in got if isinstance(r, ReconciliationWorkItem)]
    assert sorted(i.execution_id for i in items) == sorted(e.execution_id for e in events)
    assert summary.records_read == len(events) and summary.held == 0


def test_a_failing_replay_process_fails_the_replay(cluster, tmp_path: Path) -> None:
    """A child that cannot reach the registry fails the whole replay, with its reason."""
    from dataclasses import replace

    from tests.test_processor import T0, sent

    dep = deployment(cluster, tmp_path)
    play(dep, [sent("op-1", reply_due_at=T0 + timedelta(seconds=30))])
    broken = replace(dep.settings, schema_registry_url="http://127.0.0.1:9/apis/ccompat/v7")
    with pytest.raises(RuntimeError, match=r"replay process \d failed"):
        run_replay(broken, dep.codec, T0, output_suffix="-broken", show_progress=False, processes=2)


def test_other_interleaving_and_tick_phase_same_outputs(cluster, tmp_path: Path) -> None:
    """The scenario produced twice: once as is; once topic by topic (another interleaving
    across the input topics) with ticks at another phase. Same outputs."""
    from streams.local.scenario import Tick

    steps = demo_scenario()
    events = [s for s in steps if not isinstance(s, Tick)]
    ticks = [s for s in steps if isinstance(s, Tick)]
    shifted = [Tick(t.at + timedelta(seconds=20)) for t in ticks[:-1]] + [ticks[-1]]
    a = deployment(cluster, tmp_path / "a")
    b = deployment(cluster, tmp_path / "b")
    play(a, steps)
    by_topic = sorted(events, key=lambda e: type(e).__name__ not in ("ExecutionStatusChanged",))
    play(b, by_topic + shifted)  # each topic still in time order; ticks after everything

    start = min(e.occurred_at for e in events)
    ra = run_replay(a.settings, a.codec, start, output_suffix="-r", show_progress=False)
    rb = run_replay(b.settings, b.codec, start, output_suffix="-r", show_progress=False)

    def outputs(dep, summary) -> dict:
        got = per_key(dep, list(summary.output_topics))
        return {k: v for k, v in got.items() if k[0] not in ("anomalies",)}

    assert outputs(a, ra) == outputs(b, rb)


def test_vigil_replay_command_shares_partitions_among_processes(cluster, tmp_path: Path) -> None:
    """``vigil replay --processes 2`` as an operator runs it: the children start from the
    command's own module, and the summary counts what both read and wrote."""
    import subprocess
    import sys

    from tests.test_processor import T0, sent

    dep = deployment(cluster, tmp_path)
    events = [
        sent(f"op-{i}", ex=f"exec-{i}", reply_due_at=T0 + timedelta(seconds=30)) for i in range(8)
    ]
    play(dep, events)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "streams.cli.main",
            "replay",
            "--from",
            T0.isoformat(),
            "--to",
            (T0 + timedelta(minutes=1)).isoformat(),
            "--output-suffix",
            "-cli",
            "--processes",
            "2",
            "--no-progress",
        ],
        env=dep.env() | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        line.strip("│ ").split("│")[0].strip(): line.strip("│ ").split("│")[-1].strip()
        for line in done.stdout.splitlines()
        if "│" in line
    }
    assert rows["processes"] == "2"
    assert rows["records read"] == str(len(events))
    work = [t for t in rows if t.endswith("reconciliation-work-cli")]
    assert len(work) == 1 and rows[work[0]] == str(len(events))


def test_offsets_lookups_retry_transient_errors_only() -> None:
    """A partition whose leader is moving (just created) is asked again; a real fault is not."""
    from confluent_kafka import KafkaError, KafkaException

    from streams.replay import _retrying

    calls = []

    def moving() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return 42

    assert _retrying(moving) == 42 and len(calls) == 3

    def denied() -> int:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException):
        _retrying(denied)


def test_replay_pauses_a_topic_far_ahead_and_still_reads_everything(
    cluster, tmp_path: Path
) -> None:
    """600 operation events, then ticks, replayed with VIGIL_MAX_HELD at 50: the operation
    topic is paused whenever it runs ahead of inputs that have not moved (how far depends on
    the order librdkafka hands the partitions over), and once only paused partitions have
    records left they are read anyway. Every event is processed, nothing is left held, the
    replay ends."""
    from dataclasses import replace

    from streams.contracts.models.outputs import OperationState
    from streams.local.scenario import Tick
    from tests.test_processor import T0, sent

    dep = deployment(cluster, tmp_path, partitions=1)
    events = [
        sent(f"op-{i}", ex=f"ex-{i}", minutes=i / 600, reply_due_at=T0 + timedelta(hours=1))
        for i in range(600)
    ]
    play(dep, [*events, Tick(T0 + timedelta(minutes=5))])
    summary = run_replay(
        replace(dep.settings, max_held=50),
        dep.codec,
        T0,
        output_suffix="-held",
        show_progress=False,
    )
    assert summary.records_read == len(events) + len(dep.topics.inputs())
    assert summary.held == 0
    got = [
        r.record
        for r in consume(dep.settings, dep.codec, list(summary.output_topics), idle_timeout=3.0)
    ]
    states = {r.operation_id for r in got if isinstance(r, OperationState)}
    assert len(states) == len(events)


def test_a_replay_to_t_agrees_with_the_audit_at_t(cluster, tmp_path: Path) -> None:
    """``--to T`` includes T: an answer stamped T counts and a deadline due at T is reached
    (the answer first), as ``vigil audit --at T`` judges; facts after T are not read. The
    log runs past T, and two processes share the partitions."""
    from streams.contracts.models.outputs import ApprovalVerdict
    from tests.test_replay_bounds import START, T, audit_at, boundary_scenario, last_verdicts

    dep = deployment(cluster, tmp_path)
    steps, lines = boundary_scenario()
    play(dep, steps)
    summary = run_replay(
        dep.settings, dep.codec, START, T, output_suffix="-to", show_progress=False, processes=2
    )
    verdicts = [
        r.record
        for r in consume(dep.settings, dep.codec, list(summary.output_topics), idle_timeout=3.0)
        if isinstance(r.record, ApprovalVerdict)
    ]
    assert last_verdicts(verdicts) == audit_at(lines, T)
    assert all(v.evaluated_at <= T for v in verdicts)
    assert summary.held == 0
