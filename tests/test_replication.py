"""How the topics vigil creates are replicated, decided from the brokers a cluster reports
(``streams.kafka.topics.replication``), and that every producer waits for all in-sync
replicas. Pure: the cluster is a number here; ``test_cluster_kafka.py`` runs it on three
brokers."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.kafka import admin
from streams.kafka.topics import (
    DEFAULT_MIN_INSYNC,
    DEFAULT_REPLICAS,
    Replication,
    ReplicationError,
    replication,
)
from streams.settings import Settings, SettingsError

brokers = st.integers(min_value=1, max_value=12)


def test_the_defaults_by_cluster_size() -> None:
    assert replication(1) == Replication(1, 1)
    assert replication(2) == Replication(2, 1)
    assert replication(3) == Replication(3, 2)
    assert replication(9) == Replication(3, 2)
    assert replication(3).config() == {"min.insync.replicas": "2"}


@given(brokers)
def test_unset_one_broker_may_always_be_lost_without_stopping_writes(n: int) -> None:
    """Unset: never more replicas than brokers, and (from two brokers on) fewer replicas
    required in sync than there are, so that acks=all writes go on with one broker away."""
    r = replication(n)
    assert r.factor == min(DEFAULT_REPLICAS, n)
    assert 1 <= r.min_insync <= r.factor
    if r.factor > 1:
        assert r.min_insync < r.factor
    if n >= DEFAULT_REPLICAS:
        assert r.min_insync == DEFAULT_MIN_INSYNC


@given(brokers, st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12)))
def test_settings_override_within_what_the_cluster_holds(
    n: int, factor: int, min_insync: int | None
) -> None:
    if factor > n:
        with pytest.raises(ReplicationError, match=f"VIGIL_REPLICATION_FACTOR={factor}"):
            replication(n, factor, min_insync)
        return
    if min_insync is not None and min_insync > factor:
        with pytest.raises(ReplicationError, match=f"VIGIL_MIN_INSYNC_REPLICAS={min_insync}"):
            replication(n, factor, min_insync)
        return
    r = replication(n, factor, min_insync)
    assert r.factor == factor
    assert r.min_insync == (min_insync or (DEFAULT_MIN_INSYNC if factor >= 3 else 1))


def test_a_cluster_without_brokers_is_refused() -> None:
    with pytest.raises(ReplicationError):
        replication(0)


def test_settings_refuse_more_in_sync_than_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_REPLICATION_FACTOR", "2")
    monkeypatch.setenv("VIGIL_MIN_INSYNC_REPLICAS", "3")
    with pytest.raises(SettingsError, match="VIGIL_MIN_INSYNC_REPLICAS=3"):
        Settings.from_env()
    monkeypatch.delenv("VIGIL_REPLICATION_FACTOR")
    monkeypatch.delenv("VIGIL_MIN_INSYNC_REPLICAS")
    assert (Settings.from_env().replication_factor, Settings().min_insync_replicas) == (None, None)


class FakeAdmin:
    """An AdminClient whose cluster has ``brokers`` brokers; counts the metadata calls."""

    def __init__(self, brokers: int, failures: int = 0) -> None:
        self.brokers, self.failures, self.calls = brokers, failures, 0

    def list_topics(self, timeout: float) -> Any:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(brokers=dict.fromkeys(range(self.brokers)), topics={})


def test_the_worker_takes_the_replication_of_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Faust gets for its changelogs: decided from the cluster, asked again while it
    does not answer; explicit settings are kept without asking."""
    fake = FakeAdmin(brokers=5, failures=2)
    monkeypatch.setattr(admin, "admin_client", lambda settings: fake)
    resolved = admin.with_replication(Settings(), timeout=0.01)
    assert (resolved.replication_factor, resolved.min_insync_replicas) == (3, 2)
    assert fake.calls == 3
    explicit = replace(Settings(), replication_factor=1, min_insync_replicas=1)
    assert admin.with_replication(explicit) is explicit
    assert fake.calls == 3


def test_every_producer_waits_for_all_in_sync_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idempotent librdkafka producer (outputs, ticker, CLI, replays) implies acks=all,
    and nothing weakens it; Faust's producer (changelogs) is configured with acks=-1."""
    from streams.kafka import clients

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(clients, "Producer", lambda conf: seen.append(conf))
    clients.RecordProducer(Settings(), codec=None)  # type: ignore[arg-type]
    (conf,) = seen
    assert conf["enable.idempotence"] is True
    assert conf.get("acks", "all") in ("all", -1, "-1")

    import faust

    from streams import app as vigil_app

    captured: dict[str, Any] = {}

    class StopHere(Exception):
        pass

    def fake_app(*args: Any, **kwargs: Any) -> Any:
        captured.update(kwargs)
        raise StopHere

    monkeypatch.setattr(faust, "App", fake_app)
    settings = replace(Settings(), replication_factor=3, min_insync_replicas=2)
    with pytest.raises(StopHere):
        vigil_app.create_app(settings)
    assert captured["producer_acks"] == -1
    assert captured["topic_replication_factor"] == 3
