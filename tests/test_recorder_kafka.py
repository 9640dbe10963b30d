"""The recorder against the real broker, registry and worker: the facts it records are the
facts the worker judges, and a broker outage spools them and delivers them later, in order,
nothing lost, nothing duplicated."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streams.contracts.models.enums import (
    AnomalyKind,
    ApprovalVerdictCode,
    OperationStatus,
    WorkItemKind,
)
from streams.contracts.models.outputs import (
    Anomaly,
    ApprovalVerdict,
    ExecutionState,
    OperationState,
    ReconciliationWorkItem,
)
from streams.kafka.partitioning import partition_of
from streams.recorder import Recorder, RecorderSettings
from tests.registry_proxy import Mode, RegistryProxy
from tests.support import Deployment, deployment, worker

pytestmark = pytest.mark.kafka
T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


class Clock:
    """The caller's clock, moved by the test."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **kw: float) -> None:
        self.at += timedelta(**kw)


def recorder_for(dep: Deployment, tmp: Path, clock: Any = None, **options: Any) -> Recorder:
    rs = replace(RecorderSettings(), spool_dir=str(tmp / "spool"), **options)
    return Recorder(
        dep.settings,
        recorder_settings=rs,
        codec=dep.codec,
        clock=clock or (lambda: T0),
        exit_hook=False,
    )


def test_recorded_facts_are_judged_by_the_worker(cluster: Any, tmp_path: Path) -> None:
    """An operation whose reply never comes becomes UNKNOWN with a work item; a fact sent
    twice is one fact (the second a DUPLICATE anomaly, one SENT state); a verified operation
    carries its effect reference; an approval delivered, acknowledged, accepted and resumed
    is RESUMED; one accepted and never resumed is STUCK_AFTER_DECISION after its grace."""
    dep = deployment(cluster, tmp_path)
    clock = Clock(T0)
    recorder = recorder_for(dep, tmp_path, clock)

    timeout = recorder.execution("ex-timeout")
    timeout.status("running")
    timeout.operation("op-timeout", connector="payments", idempotency_key="k-1").sent(
        reply_due=timedelta(seconds=30)
    )

    twice = recorder.execution("ex-twice")
    twice.status("running")
    op = twice.operation("op-twice", connector="payments", idempotency_key="k-2")
    op.sent(reply_due=timedelta(minutes=5))
    clock.advance(seconds=1)
    op.sent(reply_due=timedelta(minutes=5))  # the agent's retry of the same call
    clock.advance(seconds=1)
    op.acknowledged()
    op.verified(effect_ref="refund/8812")

    resumed = recorder.execution("ex-resumed")
    resumed.status("running")
    resumed.status("waiting_for_approval")
    resumed.heartbeat(resume_handle="checkpoint://t1/c1")
    req = resumed.approval(
        "req-resumed",
        action="deploy",
        arguments={"service": "api", "version": "1.4"},
        approver="role:release-owner",
        resume_handle="checkpoint://t1/c1",
        risk="high",
        grace=timedelta(minutes=1),
    )
    resumed.current_action("deploy", {"version": "1.4", "service": "api"})  # same digest
    clock.advance(seconds=5)
    req.delivered(route="slack:#releases")
    req.acknowledged(approver="alice")
    req.decided("accept")
    clock.advance(seconds=5)
    req.resumed(next_status="running")
    resumed.status("running")

    stuck = recorder.execution("ex-stuck")
    stuck.status("running")
    stuck.heartbeat(resume_handle="h")
    sreq = stuck.approval(
        "req-stuck",
        action="refund",
        arguments={"amount": 10},
        approver="role:ops",
        resume_handle="h",
        grace=timedelta(minutes=1),
    )
    sreq.delivered()
    sreq.decided("accept")
    assert recorder.flush(30) == 0
    assert recorder.counts.delivered == recorder.counts.recorded
    recorder.close()
    dep.tick(T0 + timedelta(minutes=3))

    outputs = [
        dep.topics.execution_state.name,
        dep.topics.operation_state.name,
        dep.topics.reconciliation_work.name,
        dep.topics.approval_verdicts.name,
        dep.topics.anomalies.name,
    ]

    def done(rs: list[Any]) -> bool:
        verdicts = {
            (r.record.request_id, r.record.verdict)
            for r in rs
            if isinstance(r.record, ApprovalVerdict)
        }
        items = [r for r in rs if isinstance(r.record, ReconciliationWorkItem)]
        return (
            ("req-stuck", ApprovalVerdictCode.STUCK_AFTER_DECISION) in verdicts
            and ("req-resumed", ApprovalVerdictCode.RESUMED) in verdicts
            and bool(items)
        )

    with worker(dep):
        got = dep.read_until(outputs, done)
    records = [r.record for r in got]
    ops: dict[str, list[OperationState]] = defaultdict(list)
    for r in records:
        if isinstance(r, OperationState):
            ops[r.operation_id].append(r)
    assert ops["op-timeout"][-1].status is OperationStatus.UNKNOWN
    assert ops["op-timeout"][-1].reason == "reply_timeout"
    items = [r for r in records if isinstance(r, ReconciliationWorkItem)]
    assert [(i.operation_id, i.kind) for i in items] == [("op-timeout", WorkItemKind.REPLY_TIMEOUT)]
    assert [s.status for s in ops["op-twice"]] == [
        OperationStatus.SENT,
        OperationStatus.ACKNOWLEDGED,
        OperationStatus.VERIFIED,
    ]
    assert ops["op-twice"][-1].effect_ref == "refund/8812"
    duplicates = [r for r in records if isinstance(r, Anomaly)]
    assert [(a.kind, a.execution_id) for a in duplicates] == [(AnomalyKind.DUPLICATE, "ex-twice")]
    states = [r for r in records if isinstance(r, ExecutionState)]
    assert {s.execution_id for s in states} == {"ex-timeout", "ex-twice", "ex-resumed", "ex-stuck"}
    verdicts = [(v.request_id, v.verdict) for v in records if isinstance(v, ApprovalVerdict)]
    assert verdicts[-1] in {
        ("req-stuck", ApprovalVerdictCode.STUCK_AFTER_DECISION),
        ("req-resumed", ApprovalVerdictCode.RESUMED),
    }
    assert ("req-resumed", ApprovalVerdictCode.STALE_REQUEST) not in verdicts
    # every input the recorder wrote sits in its execution's murmur2 partition
    inputs = dep.read([t.name for t in dep.topics.inputs()], idle=1.0)
    keyed = [r for r in inputs if r.key is not None]
    assert keyed and all(r.partition == partition_of(r.key, 3) for r in keyed)


def test_an_outage_is_spooled_and_delivered_in_order(
    cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The recorder reaches the broker through a proxy that refuses every connection: its
    facts go to the spool file (counted, logged). Once the proxy forwards, the spool is sent
    in order, with facts recorded meanwhile behind it: per execution, the topics hold exactly
    the recorded facts, in the recorded order, once each. A recorder closed during an outage
    leaves its facts in the spool, and the next one on that spool sends them first."""
    caplog.set_level(logging.WARNING, logger="vigil.recorder")
    dep = deployment(cluster, tmp_path)
    host, port = dep.settings.bootstrap_servers.split(",")[0].rsplit(":", 1)
    fast = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200}
    clock = Clock(T0)
    recorded: dict[str, list[str]] = defaultdict(list)

    def record(rec: Recorder, count: int) -> None:
        for i in range(count):
            ex = f"ex-{i % 3}"
            clock.advance(seconds=1)
            recorded[ex].append(rec.execution(ex).heartbeat().event_id)

    with RegistryProxy(f"tcp://{host}:{port}") as proxy:
        proxy.set(Mode.REFUSE)
        settings = replace(dep.settings, bootstrap_servers=f"127.0.0.1:{proxy.port}")
        rs = replace(
            RecorderSettings(),
            spool_dir=str(tmp_path / "spool"),
            spool_after=timedelta(milliseconds=300),
        )
        rec = Recorder(
            settings,
            recorder_settings=rs,
            codec=dep.codec,
            clock=clock,
            producer_config=fast,
            exit_hook=False,
        )
        record(rec, 30)
        assert rec.flush(2) == 30  # nothing delivered, nothing lost
        assert rec.spooling and rec.counts.spooled == 30 and rec.counts.delivered == 0
        spool = tmp_path / "spool" / "recorder.spool"
        assert len(spool.read_bytes().splitlines()) == 30
        proxy.set(Mode.FORWARD)
        record(rec, 12)  # while the spool is still to send: behind it
        assert rec.flush(60) == 0
        assert not rec.spooling
        assert rec.counts.replayed == 42 and rec.counts.delivered == 42
        assert any("answers again" in m for m in caplog.messages)
        assert any("spooling facts to" in m for m in caplog.messages)
        rec.close()

    # a recorder closed while the broker is away: its facts wait in the spool for the next
    with RegistryProxy(f"tcp://{host}:{port}") as proxy:
        proxy.set(Mode.REFUSE)
        settings = replace(dep.settings, bootstrap_servers=f"127.0.0.1:{proxy.port}")
        rs = replace(RecorderSettings(), spool_dir=str(tmp_path / "spool2"))
        gone = Recorder(
            settings, recorder_settings=rs, codec=dep.codec, clock=clock, exit_hook=False
        )
        record(gone, 6)
        assert gone.close(0.5) == 6
    back = Recorder(
        dep.settings, recorder_settings=rs, codec=dep.codec, clock=clock, exit_hook=False
    )
    record(back, 3)
    assert back.flush(60) == 0
    back.close()

    got = dep.read([dep.topics.run_signals.name], idle=1.5)
    seen: dict[str, list[str]] = defaultdict(list)
    for r in got:
        seen[r.record.execution_id].append(r.record.event_id)  # type: ignore[union-attr]
    assert dict(seen) == dict(recorded)


def test_the_exit_hook_delivers_what_an_agent_left_queued(cluster: Any, tmp_path: Path) -> None:
    """An agent that records and exits without flushing or closing: the exit hook delivers
    its facts before the process ends."""
    import subprocess
    import sys

    dep = deployment(cluster, tmp_path)
    script = (
        "from streams.recorder import Recorder\n"
        "r = Recorder.from_env()\n"
        "run = r.execution('ex-exit')\n"
        "run.status('running')\n"
        "for i in range(50):\n"
        "    run.heartbeat(resume_handle=f'h-{i}')\n"
    )
    env = dep.env() | {"VIGIL_RECORDER_SPOOL_DIR": str(tmp_path / "spool")}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = dep.read([dep.topics.execution_status.name, dep.topics.run_signals.name], idle=1.0)
    assert (
        sorted(type(r.record).__name__ for r in got)
        == ["ExecutionStatusChanged"] + ["RequesterHeartbeat"] * 50
    )
    assert (tmp_path / "spool" / "recorder.spool").read_bytes() == b""


def test_a_broker_lost_mid_stream_is_spooled_and_caught_up_in_order(
    cluster: Any, tmp_path: Path
) -> None:
    """Every connection of the recorder goes through a proxy that names itself as the broker
    (``tests/kafka_proxy.py``). Facts flow, then the proxy cuts every connection while more
    are recorded: the producer keeps them, then gives back what it has not sent and the rest
    goes to the spool; healed, the producer's own and the spooled facts arrive, in order,
    once each, with facts recorded meanwhile behind them."""
    from tests.kafka_proxy import KafkaProxy

    dep = deployment(cluster, tmp_path)
    clock = Clock(T0)
    recorded: dict[str, list[str]] = defaultdict(list)

    def record(rec: Recorder, count: int) -> None:
        for i in range(count):
            ex = f"ex-{i % 4}"
            clock.advance(seconds=1)
            recorded[ex].append(rec.execution(ex).heartbeat().event_id)

    with KafkaProxy(dep.settings.bootstrap_servers) as proxy:
        rec = Recorder(
            replace(dep.settings, bootstrap_servers=proxy.address),
            recorder_settings=replace(
                RecorderSettings(),
                spool_dir=str(tmp_path / "spool"),
                spool_after=timedelta(milliseconds=400),
            ),
            codec=dep.codec,
            clock=clock,
            producer_config={"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200},
            exit_hook=False,
        )
        record(rec, 20)
        assert rec.flush(30) == 0 and rec.counts.delivered == 20
        # (a first connection slower than spool_after is an outage too, caught up already)
        spooled, outages = rec.counts.spooled, rec.counts.outages
        proxy.cut()
        record(rec, 40)
        assert rec.flush(1.5) == 40
        assert rec.spooling and rec.counts.spooled == spooled + 40
        assert rec.counts.outages == outages + 1
        proxy.heal()
        record(rec, 10)
        assert rec.flush(60) == 0
        assert not rec.spooling
        assert rec.counts.delivered == 70
        rec.close()

    got = dep.read([dep.topics.run_signals.name], idle=1.5)
    seen: dict[str, list[str]] = defaultdict(list)
    for r in got:
        seen[r.record.execution_id].append(r.record.event_id)  # type: ignore[union-attr]
    assert dict(seen) == dict(recorded)
