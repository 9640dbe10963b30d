"""A registry outage is not a property of the records that arrive during it.

The worker reads the registry through a proxy the test breaks (connections refused, then 503)
and heals, so the shared registry itself is never stopped. A record written with a new,
compatible schema version (an id the worker has never seen) while the registry cannot be
asked must be applied once it answers again, and must never be dead-lettered; a record whose
schema id the registry answers 404 for is still a dead letter. The backoff and the alert are
pure and tested without Kafka.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import struct
import time
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from fastavro import parse_schema, schemaless_writer
from hypothesis import given
from hypothesis import strategies as st

from streams.contracts.codec import AvroCodec, RegistryConfig, RegistryOutage, RegistryUnavailable
from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.events import ExecutionStatusChanged
from streams.contracts.models.outputs import DeadLetter, ExecutionState
from streams.core.executions import apply_status, status_event
from streams.kafka.topics import Topics
from streams.replay import run_replay
from tests.registry_proxy import Mode, RegistryProxy
from tests.support import deployment, worker

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def status(ex: str, seq: int, st_: ExecutionStatus, minutes: int = 0) -> ExecutionStatusChanged:
    return ExecutionStatusChanged(
        event_id=f"{ex}-{seq}",
        execution_id=ex,
        sequence=seq,
        status=st_,
        occurred_at=T0 + timedelta(minutes=minutes),
    )


# -- the backoff and the alert (pure) ---------------------------------------------------------


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0.5, max_value=3600))
def test_backoff_doubles_from_half_a_second_up_to_the_cap(failures: int, cap: float) -> None:
    outage = RegistryOutage()
    delays = []
    for n in range(failures):
        outage.failed(float(n))
        delays.append(outage.delay(cap=cap))
    assert delays[0] == min(0.5, cap)
    assert all(0 < d <= cap for d in delays)
    assert all(b == min(cap, 2 * a) for a, b in itertools.pairwise(delays))
    assert outage.since == 0.0  # the outage began at its first failure


def test_an_answer_ends_the_outage_and_says_how_long_it_lasted() -> None:
    outage = RegistryOutage()
    assert outage.answered(5.0) is None  # no outage, nothing to report
    outage.failed(10.0)
    outage.failed(12.0)
    assert outage.answered(14.5) == 4.5
    assert (outage.since, outage.failures, outage.delay()) == (None, 0, 0.0)
    outage.failed(100.0)  # a later outage starts its backoff afresh
    assert outage.delay() == 0.5


def test_an_outage_is_logged_once_as_a_warning_then_once_as_an_error_when_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = RegistryOutage()
    exc = RegistryUnavailable("looking up schema id 7: ConnectError: refused")
    alert, cap = timedelta(seconds=60), timedelta(seconds=30)
    levels = []
    for now in (0.0, 1.0, 30.0, 61.0, 90.0, 150.0):
        outage.failed(now)
        with caplog.at_level(logging.INFO, logger="vigil.codec"):
            caplog.clear()
            outage.pause(exc, alert, cap, now=now)
        levels.append([r.levelno for r in caplog.records])
    assert levels == [
        [logging.WARNING],  # the first failure
        [logging.INFO],
        [logging.INFO],
        [logging.ERROR],  # lasted a minute: once
        [logging.INFO],
        [logging.INFO],
    ]
    outage.answered(151.0)
    outage.failed(400.0)
    with caplog.at_level(logging.WARNING, logger="vigil.codec"):
        caplog.clear()
        assert outage.pause(exc, alert, cap, now=400.0) == 0.5
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # a new outage


# -- the worker, on the real broker and registry ----------------------------------------------


def _framed(schema_id: int, schema: dict, value: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", schema_id))
    schemaless_writer(buf, parse_schema(schema), value)
    return buf.getvalue()


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(lines[0].split()[1]) if lines else 0.0


def test_a_record_met_during_a_registry_outage_is_applied_once_it_answers(
    cluster, tmp_path: Path
) -> None:
    began = time.monotonic()
    dep = deployment(cluster, tmp_path, partitions=1)
    topic = dep.topics.execution_status.name
    first = status("ex-r", 1, ExecutionStatus.CREATED)
    after = status("ex-r", 2, ExecutionStatus.VALIDATING, 1)
    dep.produce([first])
    dep.tick(T0 + timedelta(minutes=1))

    # a newer, compatible version of the producer's schema: an id the worker has never seen
    newer = json.loads(ExecutionStatusChanged.avro_schema_str())
    newer["fields"].append(
        {"name": "region", "type": ["null", "string"], "default": None, "doc": "added later"}
    )
    subject = f"{topic}-{ExecutionStatusChanged.avro_fullname()}"
    new_id = dep.codec.registry.register_schema(subject, Schema(json.dumps(newer), "AVRO"))
    valid = _framed(new_id, newer, after.to_avro() | {"region": "eu"})
    unknown = b"\x00" + struct.pack(">I", 2_147_480_001) + valid[5:]  # the registry says 404
    garbage = b"\x07 not Avro"

    expected_first = apply_status(None, status_event(first)).published
    expected_after = apply_status(
        apply_status(None, status_event(first)).slot, status_event(after)
    ).published
    states, letters = dep.topics.execution_state.name, dep.topics.dead_letters.name

    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        env = {
            "SCHEMA_REGISTRY_URL": proxy.url,
            "VIGIL_REGISTRY_RETRY_MAX": "2s",
            "VIGIL_REGISTRY_OUTAGE_ALERT": "3s",
        }
        raw = Producer({"bootstrap.servers": dep.settings.bootstrap_servers})
        with worker(dep, env=env) as proc:
            # a dead letter before the outage: the worker knows how to write one already
            raw.produce(topic, key=b"ex-r", value=garbage)
            raw.flush(10)
            before = dep.read_until([states, letters], lambda rs: len(rs) >= 2, timeout=30)
            assert [r.record for r in before if isinstance(r.record, ExecutionState)] == [
                expected_first
            ]

            proxy.set(Mode.REFUSE)
            raw.produce(topic, key=b"ex-r", value=valid)
            raw.produce(topic, key=b"ex-r", value=unknown)
            raw.flush(10)
            dep.tick(T0 + timedelta(minutes=3))
            time.sleep(4)
            proxy.set(Mode.UNAVAILABLE)
            time.sleep(4)
            # during the outage: nothing applied, nothing more dead-lettered
            during = dep.read([states, letters], idle=1.0)
            assert len(during) == 2, [r.record for r in during]
            assert _metric(proc.web_port, "vigil_registry_unavailable_total") >= 2

            proxy.set(Mode.FORWARD)
            got = dep.read_until(
                [states, letters],
                lambda rs: (
                    expected_after in [r.record for r in rs]
                    and sum(isinstance(r.record, DeadLetter) for r in rs) >= 2
                ),
                timeout=30,
            )
        log = proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]

    assert [r.record for r in got if isinstance(r.record, ExecutionState)] == [
        expected_first,
        expected_after,
    ]
    dead = [r.record for r in got if isinstance(r.record, DeadLetter)]
    # the garbage, and the record whose schema id the registry does not know; each once
    assert [d.original_value for d in dead] == [garbage, unknown]
    assert "unknown schema id 2147480001" in dead[1].reason
    assert "schema registry unavailable" in log  # the warning
    assert "schema registry unavailable for" in log  # the error: it lasted past 3 s
    assert "schema registry answers again" in log
    assert time.monotonic() - began < 90


def test_a_replay_met_by_a_registry_outage_fails_instead_of_dead_lettering(
    cluster, tmp_path: Path
) -> None:
    """A replay cannot wait for the registry the way a worker does: it stops, saying why, and
    writes no dead letter for a record whose schema could not be looked up. Once the registry
    answers, a replay applies that record."""
    dep = deployment(cluster, tmp_path, partitions=1)
    topic = dep.topics.execution_status.name
    first = status("ex-p", 1, ExecutionStatus.CREATED)
    after = status("ex-p", 2, ExecutionStatus.VALIDATING, 1)
    garbage = b"\x07 not Avro"
    dep.produce([first])
    raw = Producer({"bootstrap.servers": dep.settings.bootstrap_servers})
    raw.produce(topic, key=b"ex-p", value=garbage)
    raw.flush(10)
    dep.tick(T0 + timedelta(minutes=1))
    newer = json.loads(ExecutionStatusChanged.avro_schema_str())
    newer["fields"].append({"name": "zone", "type": ["null", "string"], "default": None})
    subject = f"{topic}-{ExecutionStatusChanged.avro_fullname()}"
    new_id = dep.codec.registry.register_schema(subject, Schema(json.dumps(newer), "AVRO"))
    start = T0 - timedelta(minutes=1)

    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        codec = AvroCodec.connect(RegistryConfig(proxy.url))
        # a first replay: the codec learns every schema but the new one, and how to write a
        # state and a dead letter (so only the new schema id needs the registry below)
        warm = run_replay(dep.settings, codec, start, show_progress=False)
        assert warm.dead_letters == 1

        valid = _framed(new_id, newer, after.to_avro() | {"zone": "z1"})
        raw.produce(topic, key=b"ex-p", value=valid)
        raw.flush(10)
        dep.tick(T0 + timedelta(minutes=3))
        proxy.set(Mode.REFUSE)
        with pytest.raises(RegistryUnavailable, match=f"schema id {new_id}"):
            run_replay(dep.settings, codec, start, show_progress=False)
        replayed = Topics.from_settings(replace(dep.settings, output_suffix="-replay"))
        letters = [r.record for r in dep.read([replayed.dead_letters.name], idle=1.0)]
        # the garbage again (read before the failure), never the record met by the outage
        assert {d.original_value for d in letters} == {garbage}

        proxy.set(Mode.FORWARD)
        healed = run_replay(
            dep.settings, codec, start, output_suffix="-healed", show_progress=False
        )
    assert healed.dead_letters == 1  # the garbage alone
    out = Topics.from_settings(replace(dep.settings, output_suffix="-healed"))
    states = [r.record for r in dep.read([out.execution_state.name], idle=1.0)]
    assert (
        states[-1]
        == apply_status(apply_status(None, status_event(first)).slot, status_event(after)).published
    )


def test_a_replay_started_while_the_registry_is_down_says_so(cluster, tmp_path: Path) -> None:
    """A replay registers its outputs' subjects first: with the registry unreachable it stops
    at once with RegistryUnavailable naming that step, not a transport library's traceback."""
    dep = deployment(cluster, tmp_path, partitions=1)
    dep.produce([status("ex-down", 1, ExecutionStatus.CREATED)])
    with RegistryProxy(dep.settings.schema_registry_url) as proxy:
        proxy.set(Mode.REFUSE)
        codec = AvroCodec.connect(RegistryConfig(proxy.url))
        with pytest.raises(RegistryUnavailable, match="while registering"):
            run_replay(dep.settings, codec, T0 - timedelta(minutes=1), show_progress=False)
