"""``ChangelogProducer`` on the real broker: a delivery larger than one chunk is written whole,
in order per partition, and reports the last offset of each partition.

A batch that writes more changelog records than ``DELIVER_CHUNK`` (a watermark deciding every
waiting key at once) is handed to librdkafka a chunk at a time, each waited for before the
next, so that librdkafka never copies all of it at once (BENCHMARKS.md, issue 30 step 4).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streams.settings import Settings
from vigil_worker import changelog
from vigil_worker.changelog import ChangelogProducer

pytestmark = pytest.mark.kafka


def test_a_delivery_of_several_chunks_is_written_whole_and_in_order(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(changelog, "DELIVER_CHUNK", 300)
    settings = replace(
        Settings.from_env(),
        bootstrap_servers=cluster.bootstrap_servers,
        schema_registry_url=cluster.schema_registry_url,
    )
    topic = f"vigil-test-changelog-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for f in admin.create_topics([NewTopic(topic, num_partitions=3)]).values():
        f.result(timeout=60)
    try:
        records = [
            (n % 3, f"k{n}".encode(), None if n % 50 == 49 else f"v{n}".encode())
            for n in range(1000)  # four chunks, the last a partial one; some deletions
        ]
        producer = ChangelogProducer(settings, 1_000_000)
        last = asyncio.run(producer.deliver(topic, records))
        # a second delivery continues where the first ended
        more = asyncio.run(producer.deliver(topic, [(1, b"after", b"x")]))
        assert last == {0: 333, 1: 332, 2: 332}
        assert more == {1: 333}

        consumer = Consumer(
            settings.confluent_conf()
            | {"group.id": f"t-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
            got: dict[int, list[tuple[bytes | None, bytes | None]]] = {0: [], 1: [], 2: []}
            while sum(len(v) for v in got.values()) < len(records) + 1:
                msg = consumer.poll(10.0)
                assert msg is not None, "records missing on the topic"
                assert msg.error() is None
                got[msg.partition()].append((msg.key(), msg.value()))
        finally:
            consumer.close()
        for p in range(3):
            sent = [(k, v) for q, k, v in records if q == p] + (
                [(b"after", b"x")] if p == 1 else []
            )
            assert got[p] == sent  # every record once, in the order given
    finally:
        for f in admin.delete_topics([topic], operation_timeout=30).values():
            f.result(timeout=60)
