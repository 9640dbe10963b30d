"""The lean probe (``bench/lean.py``) is a measurement of what the same work costs written
another way: its figure means something only while it publishes exactly what the Processor
publishes on the operations-only log, record for record, topic, key and headers included."""

from __future__ import annotations

from collections import Counter

from bench import lean


def test_the_probe_publishes_the_processors_records_on_the_operations_log() -> None:
    real = lean.run(600, "processor")
    probe = lean.run(600, "lean")
    assert real["events"] == probe["events"] > 1000
    assert probe["records_by_id"] == real["records_by_id"]
    # every kind of record the probe claims to do is in the comparison, the UNKNOWNs and
    # their settlements too
    kinds = Counter(name for name, _ in probe["records_by_id"])
    assert set(kinds) == set(lean._ID)
    assert all(n > 0 for n in kinds.values())
