"""``DirectTable`` (``vigil_worker/changelog.py``): a table's store and its changelog change
together or not at all. No broker: a real Faust table (memory and RocksDB stores) and a stand-in
for the producer that acknowledges or refuses each changelog record, and keeps what it acknowledged.

The rule under test: what the store holds (hence what every read returns, and what the worker
judges applied) is never ahead of what the changelog holds. Behind is allowed: the inputs of a
failed batch are read again and applied again, deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import faust
import pytest
from faust.streams import _current_event
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.engine.state import ExecutionStore
from vigil_worker.changelog import DirectTable

STORES = ["memory://"]
if importlib.util.find_spec("rocksdict") or importlib.util.find_spec("rocksdb"):
    STORES.append("rocksdb://")


class Refused(Exception):
    """The broker's answer to a changelog record it did not take."""


class Broker:
    """The producer ``DirectTable.send`` is handed (``ChangelogProducer.deliver``'s
    contract): takes the records of a send up to ``take`` of them (all when ``None``) and
    refuses the rest, as a broker that fails part of a batch. ``log`` is what the changelog
    topic holds, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[int, bytes | None, bytes | None]] = []
        self.take: int | None = None
        self.during_flush: Any = None

    async def deliver(
        self, topic: str, records: list[tuple[int, bytes | None, bytes | None]]
    ) -> dict[int, int]:
        last: dict[int, int] = {}
        refused = 0
        for i, (partition, key, value) in enumerate(records):
            if self.take is not None and i >= self.take:
                refused += 1
                continue
            self.log.append((partition, key, value))
            last[partition] = sum(1 for p, _, _ in self.log if p == partition) - 1
        if self.during_flush is not None:
            self.during_flush()
        if refused:
            raise Refused(f"{topic}: {refused} of {len(records)} records")
        return last


class _At:
    __slots__ = ("__weakref__", "message")

    def __init__(self, partition: int) -> None:
        self.message = NamedTuple("M", [("partition", int)])(partition)


@contextlib.contextmanager
def in_partition(partition: int) -> Iterator[None]:
    """What the pipeline does around a write: the event being processed is of ``partition``."""
    at = _At(partition)
    token = _current_event.set(weakref.ref(at))
    try:
        yield
    finally:
        _current_event.reset(token)


def make_table(store: str, datadir: Path, name: str = "executions") -> DirectTable:
    app = faust.App(f"atomic-{datadir.name}", store=store, datadir=str(datadir))
    table = app.Table(
        name,
        default=None,
        partitions=3,
        value_type=bytes,
        schema=faust.Schema(
            key_type=str, value_type=bytes, key_serializer="json", value_serializer="raw"
        ),
    )
    return DirectTable(table)


def write(t: DirectTable, partition: int, changes: dict[str, bytes | None]) -> None:
    with in_partition(partition):
        for key, value in changes.items():
            if value is None:
                del t[key]
            else:
                t[key] = value


def stored(t: DirectTable, keys: Any) -> dict[str, bytes]:
    """What the table's store itself holds (not through the batch's writes)."""
    out = {}
    for key in keys:
        with in_partition(partition_of(key)):
            value = t.table.data.get(key)
        if value is not None:
            out[key] = value
    return out


def read(t: DirectTable, keys: Any) -> dict[str, bytes]:
    """What a reader of the table sees."""
    return {k: t[k] for k in keys if k in t and t.get(k) is not None}


def partition_of(key: str) -> int:
    return int(key[-1]) % 3


def send(t: DirectTable, broker: Broker) -> int:
    return asyncio.run(t.send(broker))


@pytest.mark.parametrize("store", STORES)
def test_a_failed_send_leaves_every_read_as_before_the_batch(store: str, tmp_path: Path) -> None:
    t, broker = make_table(store, tmp_path), Broker()
    write(t, 0, {"a0": b"1", "c0": b"3"})
    assert send(t, broker) == 2
    before = {"a0": b"1", "c0": b"3"}
    keys = ["a0", "b1", "c0"]
    assert read(t, keys) == before == stored(t, keys)

    write(t, 0, {"a0": b"2", "c0": None})
    write(t, 1, {"b1": b"9"})
    assert read(t, keys) == {"a0": b"2", "b1": b"9"}  # the batch reads its own writes
    assert stored(t, keys) == before  # the store takes them only once the broker has them
    broker.take = 1  # the first record reaches the changelog, the other two do not
    with pytest.raises(Refused):
        send(t, broker)
    assert read(t, keys) == before == stored(t, keys)
    assert t.pending() == 0
    t.discard()
    assert read(t, keys) == before == stored(t, keys)

    broker.take = None  # the records come again, applied again: the same writes
    write(t, 0, {"a0": b"2", "c0": None})
    write(t, 1, {"b1": b"9"})
    assert send(t, broker) == 3
    assert read(t, keys) == {"a0": b"2", "b1": b"9"} == stored(t, keys)


@pytest.mark.parametrize("store", STORES)
def test_discard_drops_the_batch_writes_with_their_changelog_records(
    store: str, tmp_path: Path
) -> None:
    t, broker = make_table(store, tmp_path), Broker()
    write(t, 2, {"x2": b"old"})
    send(t, broker)
    write(t, 2, {"x2": b"new", "y2": b"more"})
    t.discard()
    assert t.pending() == 0
    assert read(t, ["x2", "y2"]) == {"x2": b"old"}
    assert len(t) == len(list(t)) == len(dict(t.items()))
    assert send(t, broker) == 0
    assert len(broker.log) == 1


@pytest.mark.parametrize("store", STORES)
def test_a_rebalance_during_the_send_keeps_what_the_broker_acknowledged(
    store: str, tmp_path: Path
) -> None:
    """A rebalance's ``forget`` may discard while the send waits for the broker. What the
    broker then acknowledged is on the changelog: the store takes it, and a RocksDB store
    records the offset it holds up to (recovery starts from there)."""
    t, broker = make_table(store, tmp_path), Broker()
    write(t, 1, {"k1": b"v"})
    broker.during_flush = t.discard
    assert send(t, broker) == 1
    assert read(t, ["k1"]) == {"k1": b"v"} == stored(t, ["k1"])
    if store.startswith("rocksdb"):
        name = t.table.changelog_topic.get_topic_name()
        assert t.table.data.persisted_offset(TP(name, 1)) == 0


@pytest.mark.skipif("rocksdb://" not in STORES, reason="no RocksDB binding installed")
def test_a_failed_send_records_no_persisted_offset(tmp_path: Path) -> None:
    """Only a RocksDB store persists offsets (a memory store recovers the whole changelog)."""
    t, broker = make_table("rocksdb://", tmp_path), Broker()
    name = t.table.changelog_topic.get_topic_name()
    write(t, 0, {"a0": b"1"})
    send(t, broker)
    write(t, 0, {"a0": b"2", "b0": b"3"})
    broker.take = 1
    with pytest.raises(Refused):
        send(t, broker)
    # the store holds the first batch only: recovery must read the changelog from offset 1
    assert t.table.data.persisted_offset(TP(name, 0)) == 0


def test_an_execution_entry_is_not_applied_in_memory_when_its_write_failed(
    tmp_path: Path,
) -> None:
    """Through the write-behind cache, as the pipeline does it: an input applied and flushed,
    the changelog write refused, the batch forgotten. The input must read as not applied, or
    it would be skipped when it comes again and its effect never reach the changelog."""
    t, broker = make_table("memory://", tmp_path), Broker()
    store = ExecutionStore(t)
    store.partition = 0
    store.view("inflight")["ex0"] = '{"status":"RUNNING"}'
    store.mark_applied("ex0", (0, 0, 7), lambda _r, _p: None)
    with in_partition(0):
        assert store.flush(0) == 1
    assert store.applied("ex0", (0, 0, 7))
    broker.take = 0
    with pytest.raises(Refused):
        send(t, broker)
    store.discard()  # the pipeline's forget()
    t.discard()
    assert not store.applied("ex0", (0, 0, 7))
    assert store.view("inflight").get("ex0") is None
    assert "ex0" not in t


# -- any sequence of batches, each refused from any record on ---------------------------------
KEYS = [f"k{i}" for i in range(6)]
batches = st.lists(
    st.tuples(
        st.lists(st.tuples(st.sampled_from(KEYS), st.none() | st.binary(min_size=1, max_size=3))),
        st.none() | st.integers(0, 6),  # how many records the broker takes (None: all)
        st.booleans(),  # whether the batch is read back before its send
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(runs=batches)
def test_the_store_is_never_ahead_of_the_changelog(tmp_path_factory: Any, runs: Any) -> None:
    """Batches of writes and deletions (a key written several times in one), each sent to a
    broker that takes all of its records or only the first few. After every batch the store
    and every read hold exactly what the wholly taken batches wrote, which is what replaying
    their changelog records gives: a batch taken in part leaves the store as it was."""
    t, broker = make_table("memory://", tmp_path_factory.mktemp("p")), Broker()
    model: dict[str, bytes] = {}
    whole: list[tuple[int, bytes | None, bytes | None]] = []  # records of the batches taken
    for changes, take, peek in runs:
        after = dict(model)
        for key, value in changes:
            if value is None and key not in after:
                continue  # deleting what is not there is a KeyError, as in a dict
            write(t, partition_of(key), {key: value})
            if value is None:
                del after[key]
            else:
                after[key] = value
        if peek:
            assert read(t, KEYS) == after
        start = len(broker.log)
        broker.take = take
        try:
            send(t, broker)
        except Refused:
            t.discard()
        else:
            model = after
            whole += broker.log[start:]
        assert read(t, KEYS) == model == stored(t, KEYS)
        replayed: dict[str, bytes] = {}
        for _, key, value in whole:
            k = json.loads(key) if key else ""
            if value is None:
                replayed.pop(k, None)
            else:
                replayed[k] = value
        assert replayed == model


# -- the test-only site hook that makes a real worker's changelog sends fail ------------------
SITE = Path(__file__).resolve().parent / "sites" / "changelog_fail"
PROBE = "import vigil_worker.changelog as c; print(c.DirectTable.send.__qualname__)"


@pytest.mark.parametrize(("fails", "send"), [(None, "DirectTable.send"), ("1", "failing_send")])
def test_the_site_hook_replaces_the_send_only_when_asked(
    tmp_path: Path, fails: str | None, send: str
) -> None:
    env = dict(os.environ)
    env.pop("VIGIL_TEST_CHANGELOG_FAILS", None)
    if fails is not None:
        env["VIGIL_TEST_CHANGELOG_FAILS"] = fails
    env["PYTHONPATH"] = f"{SITE}{os.pathsep}{SITE.parents[2]}"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, check=True
    )
    assert done.stdout.decode().strip().endswith(send)
