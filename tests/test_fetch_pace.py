"""The fetch pace: eager under a backlog, patient once caught up (vigil_worker/fetch_pace.py). No
Kafka: the Kafka test is tests/test_fetch_pace_kafka.py."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from vigil_worker.fetch_pace import (
    EAGER_MIN_BYTES,
    FetchPace,
    FetchSizes,
    apply_sizes,
    running_fetcher,
)

PATIENT = FetchSizes(16 * 1024, 25)


def test_a_full_batch_makes_fetches_eager_and_a_small_one_patient_again() -> None:
    pace = FetchPace(PATIENT, full=5000)
    assert pace.sizes == PATIENT
    assert pace.after_batch(40) is None  # caught up already
    assert pace.after_batch(5000) == FetchSizes(EAGER_MIN_BYTES, 25)
    assert pace.after_batch(5000) is None
    assert pace.after_batch(2000) is None  # in between: no flapping
    assert pace.after_batch(1249) == PATIENT  # under a quarter
    assert not pace.eager


def test_patient_sizes_of_one_byte_never_switch() -> None:
    pace = FetchPace(FetchSizes(1, 1500), full=10)
    assert all(pace.after_batch(n) is None for n in (10, 100, 0, 10))
    assert pace.sizes == FetchSizes(1, 1500)


@given(
    full=st.integers(min_value=1, max_value=10_000),
    batches=st.lists(st.integers(min_value=1, max_value=20_000), max_size=60),
)
def test_the_pace_follows_the_last_full_or_small_batch(full: int, batches: list[int]) -> None:
    """Model: eager after a batch of ``full`` or more, patient after one under ``full // 4``,
    unchanged in between; a change is reported exactly when the state flips, as the sizes
    to use from then on."""
    pace = FetchPace(PATIENT, full=full)
    eager = False
    for n in batches:
        before = eager
        if n >= full:
            eager = True
        elif n < max(1, full // 4):
            eager = False
        change = pace.after_batch(n)
        assert pace.eager is eager
        assert (change is not None) == (eager != before)
        if change is not None:
            assert change == pace.sizes
        assert pace.sizes.max_wait_ms == PATIENT.max_wait_ms
        assert pace.sizes.min_bytes == (EAGER_MIN_BYTES if eager else PATIENT.min_bytes)


def test_the_sizes_are_set_on_the_fetcher_behind_fausts_consumer_thread() -> None:
    fetcher = SimpleNamespace(_fetch_min_bytes=1, _fetch_max_wait_ms=1500)
    consumer = SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_fetcher=fetcher)))
    assert running_fetcher(consumer) is fetcher
    assert apply_sizes(fetcher, PATIENT)
    assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == (16 * 1024, 25)


def test_nothing_is_set_before_the_consumer_thread_started_its_fetcher() -> None:
    assert running_fetcher(SimpleNamespace(_thread=SimpleNamespace(_consumer=None))) is None
    assert running_fetcher(SimpleNamespace()) is None
    assert not apply_sizes(None, PATIENT)
    assert not apply_sizes(SimpleNamespace(), PATIENT)


def test_the_worker_flags_set_the_fetch_sizes(monkeypatch) -> None:
    from typer.testing import CliRunner

    import streams.app
    from streams.cli.main import app

    seen = []
    monkeypatch.setattr(streams.app, "run_worker", lambda s, loglevel: seen.append(s))
    result = CliRunner().invoke(
        app, ["worker", "--fetch-min-bytes", "1", "--fetch-max-wait", "40ms"]
    )
    assert result.exit_code == 0, result.output
    assert seen[0].fetch_min_bytes == 1
    assert seen[0].fetch_max_wait.total_seconds() == 0.04
