"""The pure-core benchmark (``bench/core.py``) times what ``vigil replay`` runs: the A/B
comparison is only fair if every run and every tree gets the very same input."""

from __future__ import annotations

from bench import core


def _fingerprint(envs: list) -> list[tuple]:
    return [(e.topic, e.partition, e.offset, e.timestamp_ms, e.key, e.record) for e in envs]


def test_the_workload_is_the_same_on_every_build_in_log_order_per_partition() -> None:
    first, second = core.workload(40), core.workload(40)
    assert _fingerprint(first) == _fingerprint(second)
    assert all(e.ok for e in first)
    positions: dict[tuple[str, int], int] = {}
    for e in first:  # offsets count up from 0 on each topic partition, as on the log
        assert e.offset == positions.get((e.topic, e.partition), 0)
        positions[(e.topic, e.partition)] = e.offset + 1


def test_a_run_processes_every_record_and_reports_its_outputs() -> None:
    result = core.run_once(40)
    assert result["records"] == len(core.workload(40))
    assert result["outputs"] > result["records"] // 2
    assert result["us_per_record"] > 0 and result["cpu_us_per_record"] > 0


def test_the_digest_of_a_run_is_the_same_every_time_and_sees_any_changed_record() -> None:
    from streams.contracts.models.base import replace
    from streams.engine.processor import Emission

    a, b = core.run_once(30), core.run_once(30)
    assert a["digest"] == b["digest"] and a["outputs"] == b["outputs"]
    first = Emission("t", "k", core.workload(1)[0].record)
    other = Emission("t", "k", replace(first.record, event_id="another"))
    assert core.digest([first])["digest"] != core.digest([other])["digest"]
    # the same records per key, keys interleaved differently: the same digest
    x, y = Emission("t", "k1", first.record), Emission("t", "k2", other.record)
    assert core.digest([x, y])["digest"] == core.digest([y, x])["digest"]
    assert core.digest([x, x, y])["digest"] != core.digest([x, y, y])["digest"]


def test_with_the_join_the_claims_go_to_it_and_the_mix_publishes_the_same(monkeypatch) -> None:
    """``--join`` runs the join across executions in-process: the claims and progress the
    Processor addresses to the claims topic are taken by the join, never published; the
    mix has no blind retry across executions, so what is published is what the Processor
    alone publishes."""
    from streams import local_join

    taken: list[str] = []
    take = local_join.LocalJoin.take

    def counting(self: local_join.LocalJoin, em: object) -> list:
        taken.append(type(em.record).__name__)  # type: ignore[attr-defined]
        return take(self, em)

    monkeypatch.setattr(local_join.LocalJoin, "take", counting)
    alone, joined = core.run_once(40), core.run_once(40, join=True)
    assert {"IdempotencyClaim", "ClaimsProgress"} <= set(taken)
    assert joined["records"] == alone["records"]
    assert joined["digest"] == alone["digest"] and joined["outputs"] == alone["outputs"]
