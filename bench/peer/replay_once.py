"""One single-process ``vigil replay`` of a deployment's inputs, timed from inside: the peer
section's Faust-free reference (``bench/peer/__init__.py``, ``replay_run``).

The replay runs the worker's ``Processor`` and the claims join (in-process) over the same log,
read by a confluent-kafka consumer in batches and written by the same producer and codec, with
no Faust, no changelog and no offset commits: what vigil's per-record path costs without the
worker's shell. The output topics and their schemas are made before the clock starts; the
replay itself is timed (wall and process CPU, every thread). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime

from streams.contracts.codec import AvroCodec, RegistryConfig
from streams.kafka.admin import create_topics, prepare_registry
from streams.kafka.topics import Topics
from streams.replay import replay_partitions
from streams.settings import Settings


def main(suffix: str) -> None:
    settings = Settings.from_env()
    codec = AvroCodec.connect(RegistryConfig(settings.schema_registry_url))
    out_settings = replace(settings, output_suffix=suffix)
    outputs = Topics.from_settings(out_settings).outputs()
    create_topics(out_settings, outputs)
    prepare_registry(out_settings, codec, outputs)
    cpu0, t0 = time.process_time(), time.perf_counter()
    summary = replay_partitions(
        settings, codec, datetime(1971, 1, 1, tzinfo=UTC), None, suffix, None
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_s": cpu,
                "records": summary.records_read,
                "outputs": summary.outputs_by_topic,
                "joined": summary.joined,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
