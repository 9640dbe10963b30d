"""Plumbing of the benchmark: isolated deployments on the cluster, pre-encoded records, raw
producing, worker subprocesses, output offsets and output records.

Every section gets its own deployment (topic prefix, Faust app id, data dir), like the tests'
``tests/support.py``, so sections never see each other's records. Output topics are switched to
``message.timestamp.type=LogAppendTime`` right after creation: the worker stamps outputs with
event time (CreateTime), the broker then overwrites that with the time it appended the record,
which is what the latency and deadline-lag figures need.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from bench.workload import Planned, from_ms
from streams.contracts.codec import AvroCodec, RegistryConfig
from streams.contracts.models.base import Record
from streams.contracts.models.events import ClockTick
from streams.kafka.admin import create_topics, prepare_registry
from streams.kafka.partitioning import partition_of
from streams.kafka.topics import Topics
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Wire:
    """One record as it goes on the wire: encoded once, before any clock starts."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    ts_ms: int
    index: int  # position in the plan (-1: a tick)


@dataclass
class Deployment:
    settings: Settings
    codec: AvroCodec
    topics: Topics
    workdir: Path

    @property
    def inputs(self) -> list[str]:
        return [t.name for t in self.topics.inputs()]

    @property
    def outputs(self) -> list[str]:
        return [t.name for t in self.topics.outputs()]

    def env(self, **extra: str) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=s.bootstrap_servers,
            SCHEMA_REGISTRY_URL=s.schema_registry_url,
            VIGIL_TOPIC_PREFIX=s.topic_prefix,
            VIGIL_OUTPUT_SUFFIX=s.output_suffix,
            VIGIL_PARTITIONS=str(s.partitions),
            VIGIL_APP_ID=s.app_id,
            VIGIL_STORE=s.store,
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def topic_of(self, record: Record) -> str:
        for spec in self.topics.inputs():
            if type(record) in spec.value_types and not isinstance(record, ClockTick):
                return spec.name
        raise KeyError(type(record))


def deployment(
    base: Settings, workdir: Path, section: str, *, partitions: int = 6, store: str = "memory://"
) -> Deployment:
    name = f"bench-{section}-{uuid.uuid4().hex[:6]}"
    settings = replace(
        base,
        topic_prefix=name,
        app_id=name,
        partitions=partitions,
        store=store,
        data_dir=str(workdir / name / "data"),
    )
    codec = AvroCodec.connect(RegistryConfig(settings.schema_registry_url))
    create_topics(settings)
    prepare_registry(settings, codec)
    dep = Deployment(settings, codec, Topics.from_settings(settings), workdir / name)
    dep.workdir.mkdir(parents=True, exist_ok=True)
    _log_append_time(settings, dep.outputs)
    return dep


def _log_append_time(settings: Settings, topics: list[str]) -> None:
    admin = AdminClient(settings.confluent_conf())
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            t,
            incremental_configs=[
                ConfigEntry(
                    "message.timestamp.type",
                    "LogAppendTime",
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        for t in topics
    ]
    for fut in admin.incremental_alter_configs(resources).values():
        fut.result(30)


def delete_deployment(dep: Deployment) -> None:
    """Drop a section's topics (inputs, outputs, changelogs) so the broker's disk stays small."""
    admin = AdminClient(dep.settings.confluent_conf())
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(dep.settings.app_id)]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            with suppress(Exception):  # best effort
                fut.result(30)


# -- encoding ---------------------------------------------------------------------------------
def encode(
    dep: Deployment, planned: list[Planned], tick_ms: Iterable[int], final_ticks: Iterable[int] = ()
) -> list[Wire]:
    """Events and tick rounds merged in time order (a tick round at t goes after the events at
    t), then the final tick rounds. Keys are execution ids; partitions murmur2 like every
    vigil producer; timestamps the event times."""
    n = dep.settings.partitions
    out: list[Wire] = []
    ticks = iter(sorted(tick_ms))
    next_tick = next(ticks, None)

    def tick_round(t: int) -> None:
        at = from_ms(t)
        for topic in dep.inputs:
            for p in range(n):
                rec = ClockTick(ticker_id="bench-ticker", partition=p, occurred_at=at)
                out.append(Wire(topic, p, None, dep.codec.encode(topic, rec), t, -1))

    for i, e in enumerate(planned):
        while next_tick is not None and next_tick < e.at_ms:
            tick_round(next_tick)
            next_tick = next(ticks, None)
        topic = dep.topic_of(e.record)
        key = e.record.execution_id  # type: ignore[attr-defined]
        out.append(
            Wire(
                topic,
                partition_of(key, n),
                key.encode(),
                dep.codec.encode(topic, e.record),
                e.at_ms,
                i,
            )
        )
    while next_tick is not None:
        tick_round(next_tick)
        next_tick = next(ticks, None)
    for t in final_ticks:
        tick_round(t)
    return out


# -- producing --------------------------------------------------------------------------------
def producer(settings: Settings, **extra: Any) -> Producer:
    conf = settings.confluent_conf() | {
        "linger.ms": 5,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "batch.num.messages": 10_000,
    }
    conf.update(extra)
    return Producer(conf)


def produce_all(settings: Settings, wires: list[Wire]) -> float:
    """As fast as librdkafka takes them; returns the seconds it took (flush included)."""
    p = producer(settings, **{"linger.ms": 20})
    errors: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    t0 = time.perf_counter()
    for i, w in enumerate(wires):
        while True:
            try:
                p.produce(
                    w.topic,
                    value=w.value,
                    key=w.key,
                    partition=w.partition,
                    timestamp=w.ts_ms,
                    on_delivery=report,
                )
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left or errors:
        raise RuntimeError(f"{left} undelivered, errors {errors[:3]}")
    return time.perf_counter() - t0


# -- workers ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_at: float  # time.time() when "Ready" showed in its log

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextmanager
def workers(
    dep: Deployment,
    count: int = 1,
    ready_timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> Iterator[list[WorkerProc]]:
    """``vigil worker`` subprocesses (each its own web port and data dir), stopped with
    SIGTERM (SIGKILL after 30 s) on the way out. ``env``: added to the deployment's."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for i in range(count):
            log_path = dep.workdir / f"worker-{i}-{uuid.uuid4().hex[:4]}.log"
            cmd = [
                sys.executable,
                "-m",
                "streams.cli.main",
                "worker",
                "--web-port",
                str(free_port()),
                "--data-dir",
                str(dep.workdir / f"data-{i}"),
                "--loglevel",
                "warning" if os.environ.get("BENCH_QUIET_WORKER") else "info",
            ]
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    env=dep.env(**(env or {})),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=dep.workdir,
                    start_new_session=True,
                )
            procs.append((proc, log_path))
        ready: list[WorkerProc] = []
        deadline = time.monotonic() + ready_timeout
        for proc, log_path in procs:
            while True:
                text = log_path.read_text(errors="replace")
                if "Ready" in text and "[^Worker]" in text:
                    ready.append(WorkerProc(proc, log_path, time.time()))
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited {proc.returncode}:\n{text[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker not ready:\n{text[-3000:]}")
                time.sleep(0.02)
        yield ready
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextmanager
def ticker(dep: Deployment, interval: str) -> Iterator[subprocess.Popen[bytes]]:
    """The real ``vigil ticker`` at ``interval`` (wall-clock ticks)."""
    log_path = dep.workdir / "ticker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "ticker", "--interval", interval],
            env=dep.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_group_stable(dep: Deployment, members: int, timeout: float = 90.0) -> None:
    admin = AdminClient(dep.settings.confluent_conf())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = admin.describe_consumer_groups([dep.settings.app_id])[dep.settings.app_id]
        try:
            g = desc.result(10)
            if str(g.state).endswith("STABLE") and len(g.members) == members:
                assigned = sum(len(m.assignment.topic_partitions) for m in g.members)
                if assigned and all(m.assignment.topic_partitions for m in g.members):
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"consumer group {dep.settings.app_id} not stable with {members} members")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# -- outputs ----------------------------------------------------------------------------------
class Offsets:
    """End offsets of a set of topics (one consumer kept open for the polling)."""

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        self.c = Consumer(settings.confluent_conf() | {"group.id": f"bench-{uuid.uuid4().hex[:6]}"})
        meta = self.c.list_topics(timeout=10)
        self.tps = [TopicPartition(t, p) for t in topics for p in sorted(meta.topics[t].partitions)]

    def ends(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tp in self.tps:
            _, high = self.c.get_watermark_offsets(tp, timeout=10, cached=False)
            out[tp.topic] = out.get(tp.topic, 0) + high
        return out

    def close(self) -> None:
        self.c.close()


def wait_outputs(
    off: Offsets,
    expected: dict[str, int],
    *,
    settle: float = 4.0,
    timeout: float = 1800.0,
    progress: Any = None,
) -> tuple[dict[str, int], bool]:
    """Until every topic in ``expected`` has at least that many records and nothing has grown
    for ``settle`` seconds (every topic counted). Returns the end offsets and whether the
    expectation was met (False: timed out or stalled short of it)."""
    last: dict[str, int] = {}
    changed = time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ends = off.ends()
        if ends != last:
            last, changed = ends, time.monotonic()
            if progress:
                progress(sum(ends.values()))
        met = all(ends.get(t, 0) >= n for t, n in expected.items())
        idle = time.monotonic() - changed
        if met and idle >= settle:
            return ends, True
        if not met and idle >= max(60.0, settle):
            return ends, False
        time.sleep(0.25)
    return last, False


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    append_ms: int
    ts_type: int
    value: bytes


def read_all(settings: Settings, topics: list[str]) -> list[OutRecord]:
    """Every record of ``topics`` from the beginning up to their current end."""
    c = Consumer(
        settings.confluent_conf()
        | {
            "group.id": f"bench-read-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    try:
        meta = c.list_topics(timeout=10)
        want: dict[tuple[str, int], int] = {}
        tps = []
        for t in topics:
            for p in meta.topics[t].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                if high > low:
                    want[(t, p)] = high
                    tps.append(TopicPartition(t, p, low))
        c.assign(tps)
        out: list[OutRecord] = []
        while want:
            for msg in c.consume(10_000, 1.0):
                if msg.error():
                    continue
                tp = (msg.topic(), msg.partition())
                ts_type, ts = msg.timestamp()
                out.append(OutRecord(msg.topic(), ts, ts_type, msg.value()))
                if tp in want and msg.offset() + 1 >= want[tp]:
                    del want[tp]
        return out
    finally:
        c.close()


class FastDecoder:
    """Confluent-framed Avro → dict with fastavro and the writer schema (no pydantic), for
    reading the outputs back after a run."""

    def __init__(self, codec: AvroCodec) -> None:
        self.codec = codec
        self._schemas: dict[int, Any] = {}

    def schema(self, schema_id: int) -> Any:
        parsed = self._schemas.get(schema_id)
        if parsed is None:
            import json

            from fastavro import parse_schema

            parsed = parse_schema(json.loads(self.codec.registry.get_schema(schema_id).schema_str))
            self._schemas[schema_id] = parsed
        return parsed

    def __call__(self, data: bytes) -> dict[str, Any]:
        import io

        from fastavro import schemaless_reader

        (sid,) = struct.unpack(">I", data[1:5])
        return schemaless_reader(io.BytesIO(data[5:]), self.schema(sid), None)  # type: ignore[no-any-return]


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)
