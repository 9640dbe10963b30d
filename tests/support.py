"""Helpers for tests against the real broker: isolated topic sets, a worker subprocess,
producing and reading back records."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streams.contracts.codec import AvroCodec, RegistryConfig
from streams.contracts.models.base import Record
from streams.kafka.admin import create_topics, prepare_registry
from streams.kafka.clients import ConsumedRecord, RecordProducer, consume
from streams.kafka.topics import Topics
from streams.local import stack as localstack
from streams.local.stack import Cluster
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Deployment:
    """One isolated vigil deployment on the shared test cluster: its own topic prefix,
    application id and data dir, so tests never see each other's records."""

    settings: Settings
    codec: AvroCodec
    topics: Topics
    workdir: Path
    #: the newest tick written; a running test worker is sent it again every few seconds
    last_tick: Any = None

    def env(self) -> dict[str, str]:
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
            VIGIL_TICK_INTERVAL=f"{int(s.tick_interval.total_seconds() * 1000)}ms",
            PYTHONPATH=str(ROOT),
        )
        return env

    def producer(self) -> RecordProducer:
        return RecordProducer(self.settings, self.codec)

    def produce(self, records: Iterable[Record]) -> None:
        p = self.producer()
        for r in records:
            topic = next(t.name for t in self.topics.inputs() if type(r) in t.value_types)
            p.send(topic, r)
        p.flush()

    def tick(self, at: Any) -> None:
        p = self.producer()
        for spec in self.topics.inputs():
            p.tick(spec.name, spec.partitions, at, "test-ticker")
        p.flush()
        self.last_tick = at if self.last_tick is None else max(self.last_tick, at)

    def read(
        self, topics: list[str], *, idle: float = 3.0, max_records: int | None = None
    ) -> list[ConsumedRecord]:
        return list(
            consume(self.settings, self.codec, topics, idle_timeout=idle, max_records=max_records)
        )

    def read_until(
        self,
        topics: list[str],
        done: Callable[[list[ConsumedRecord]], bool],
        timeout: float = 120.0,
    ) -> list[ConsumedRecord]:
        deadline = time.monotonic() + timeout
        got: list[ConsumedRecord] = []
        while time.monotonic() < deadline:
            got = self.read(topics, idle=1.0)
            if done(got):
                return got
            time.sleep(0.5)
        raise AssertionError(f"timed out; got {len(got)} records: {[r.record for r in got][:20]}")


#: (settings, topic prefix) of the deployments made in the main thread: those made during a
#: test are deleted after it (``conftest._delete_test_topics``), so that a broker running many
#: test sessions does not pile up partitions (and open files) until it stops.
made: list[tuple[Settings, str]] = []
#: made in other threads (a module fixture's background runs outlive the test that started
#: them): deleted at the end of the session.
made_in_background: list[tuple[Settings, str]] = []


def delete_made_topics(since: int = 0) -> None:
    """Delete the topics of the deployments made after the first ``since`` (best effort), in
    one request per cluster: at the end of a session that is hundreds of topics, which one
    request per deployment took minutes to delete. With an operation timeout of 0 a KRaft
    broker acknowledges and deletes nothing: it is waited for. ``VIGIL_TEST_KEEP_TOPICS=1``
    keeps them, to read a failed test's outputs and changelogs afterwards."""
    from confluent_kafka.admin import AdminClient

    if os.environ.get("VIGIL_TEST_KEEP_TOPICS"):
        del made[since:]
        return
    by_cluster: dict[str, tuple[Settings, list[str]]] = {}
    while len(made) > since:
        settings, prefix = made.pop()
        by_cluster.setdefault(settings.bootstrap_servers, (settings, []))[1].append(prefix)
    for settings, prefixes in by_cluster.values():
        try:
            admin = AdminClient(settings.confluent_conf())
            names = [
                t
                for t in admin.list_topics(timeout=10).topics
                if any(t.startswith(p) for p in prefixes)
            ]
            for future in (
                admin.delete_topics(names, operation_timeout=30).values() if names else ()
            ):
                future.result(timeout=60)
        except Exception:  # the test may have stopped the broker; nothing to clean then
            continue


def deployment(cluster: Cluster, tmp_path: Path, partitions: int = 3, **kw: Any) -> Deployment:
    name = f"t{uuid.uuid4().hex[:8]}"
    settings = replace(
        Settings.from_env(),
        bootstrap_servers=cluster.bootstrap_servers,
        schema_registry_url=cluster.schema_registry_url,
        topic_prefix=name,
        app_id=name,
        partitions=partitions,
        data_dir=str(tmp_path / "data"),
        **kw,
    )
    codec = AvroCodec.connect(RegistryConfig(settings.schema_registry_url))
    if threading.current_thread() is threading.main_thread():
        made.append((settings, name))
    else:
        made_in_background.append((settings, name))
    create_topics(settings)
    prepare_registry(settings, codec)
    return Deployment(settings, codec, Topics.from_settings(settings), tmp_path)


@contextmanager
def worker(
    dep: Deployment,
    *,
    ready_timeout: float = 90.0,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    reticks: bool = True,
) -> Iterator[subprocess.Popen[bytes]]:
    """``vigil worker`` as a subprocess, waited on until its agent runs, stopped with SIGTERM.

    Like a live ticker, the test keeps ticking while the worker runs (``reticks``): it sends
    the newest tick again every two seconds. That changes no time, but heals a tick the worker
    missed (faust-streaming 0.15.3 can skip records fetched while it seeks at start-up). Tests
    that predict offsets of records produced while the worker runs turn it off.
    """
    log_path = dep.workdir / f"worker-{uuid.uuid4().hex[:6]}.log"
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streams.cli",
        "worker",
        "--web-port",
        str(port),
        "--data-dir",
        str(dep.workdir / "data"),
        *(extra_args or []),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=dep.env() | (env or {}),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=dep.workdir,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            if "Ready" in text and "[^Worker]" in text:
                break
            if proc.poll() is not None:
                raise AssertionError(f"worker exited {proc.returncode}:\n{text[-4000:]}")
            time.sleep(0.3)
        else:
            raise AssertionError(f"worker not ready:\n{log_path.read_text()[-4000:]}")
        proc.log_path = log_path  # type: ignore[attr-defined]
        proc.web_port = port  # type: ignore[attr-defined]
        stop = threading.Event()
        if reticks:
            threading.Thread(target=_retick, args=(dep, stop), daemon=True).start()
        try:
            yield proc
        finally:
            stop.set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _retick(dep: Deployment, stop: threading.Event) -> None:
    producer = dep.producer()
    while not stop.wait(2.0):
        if dep.last_tick is not None:
            for spec in dep.topics.inputs():
                producer.tick(spec.name, spec.partitions, dep.last_tick, "test-reticker")
            producer.flush()


def kill_hard(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def play(dep: Deployment, steps: Iterable[Any]) -> None:
    """Produce scenario steps in order: records to their topic, ticks to every partition of
    every input topic."""
    from streams.local.scenario import Tick

    p = dep.producer()
    last = None
    for s in steps:
        if isinstance(s, Tick):
            for spec in dep.topics.inputs():
                p.tick(spec.name, spec.partitions, s.at, "test-ticker")
            last = s.at if last is None else max(last, s.at)
        else:
            topic = next(t.name for t in dep.topics.inputs() if type(s) in t.value_types)
            p.send(topic, s)
    p.flush()
    if last is not None:
        dep.last_tick = last if dep.last_tick is None else max(dep.last_tick, last)


def by_id(records: Iterable[ConsumedRecord]) -> dict[str, Record]:
    """Outputs keyed by their deterministic id; asserts duplicates are identical."""
    out: dict[str, Record] = {}
    for r in records:
        rec = r.record
        assert rec is not None, r.error
        rid = next(
            getattr(rec, f)
            for f in (
                "state_id",
                "resolution_id",
                "work_item_id",
                "verdict_id",
                "alert_id",
                "anomaly_id",
                "dead_letter_id",
            )
            if hasattr(rec, f)
        )
        if rid in out:
            assert out[rid] == rec, f"same id, different record: {rid}"
        out[rid] = rec
    return out


def free_block(size: int) -> int:
    """A first port of ``size`` consecutive free ports on 127.0.0.1 (nodes listen on the
    first and every second one after it, controllers on the ports between), below the
    ephemeral range, where the system's outgoing connections would take them meanwhile."""
    rng = random.Random()
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for _ in range(200):
        base = rng.randrange(20000, low - size)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no block of free ports")


@contextmanager
def own_brokers(
    cluster: Cluster, state_dir: Path, brokers: int = 1, timeout: float = 150.0
) -> Iterator[tuple[Cluster, localstack.Settings]]:
    """Kafka broker(s) of a test's own (own ports and data dir under ``state_dir``, the jars
    of the shared download cache), with the session's schema registry: for a test that stops
    or kills brokers, which on the session's broker would disturb every test after it, and
    which there meets a broker holding the whole session's partitions. Skips without a Java.
    Killed -9 and wiped after: the data is deleted anyway, and a controlled shutdown costs
    seconds per node."""
    import pytest

    try:
        localstack.find_java()
    except localstack.LocalStackError as exc:
        pytest.skip(f"brokers of a test's own need a Java to run on: {exc}")
    base = free_block(2 * brokers)
    settings = localstack.Settings(
        cache_dir=localstack.Settings.from_env().cache_dir,
        state_dir=state_dir,
        kafka_port=base,
        controller_port=base + 1,
        registry_port=0,  # not started: the session's registry serves
        brokers=brokers,
    )
    bootstrap = None
    try:
        started = localstack.up(settings=settings, services=("kafka",), timeout=timeout)
        bootstrap = started.bootstrap_servers
        yield Cluster(bootstrap, cluster.schema_registry_url), settings
    finally:
        # their topics go with the brokers: nothing for delete_made_topics to wait on
        made[:] = [m for m in made if m[0].bootstrap_servers != bootstrap]
        for pid in localstack.broker_pids(settings).values():
            with suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        localstack.wipe(settings)
