"""The worker's log under a backlog: mode's timer-drift lines only at debug level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import mode.timers
import pytest

from streams.app import quiet_timer_drift


@pytest.fixture
def timers_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("mode.timers")
    before = logger.level
    logger.setLevel(logging.NOTSET)
    try:
        yield logger
    finally:
        logger.setLevel(before)


def test_mode_logs_timer_drift_through_the_logger_quieted(timers_logger: logging.Logger) -> None:
    assert mode.timers.logger.name == timers_logger.name == "mode.timers"


@pytest.mark.parametrize("loglevel", ["info", "INFO", "warning", "error", "not-a-level"])
def test_drift_lines_are_dropped_below_debug(
    timers_logger: logging.Logger, loglevel: str, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_timer_drift(loglevel)
    with caplog.at_level(logging.INFO):
        mode.timers.logger.info("Timer %s woke up too late, with a drift of +%r", "commit", 1.2)
        mode.timers.logger.warning("a timer warning still shows")
    assert [r.getMessage() for r in caplog.records] == ["a timer warning still shows"]


def test_debug_keeps_them(timers_logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    quiet_timer_drift("debug")
    with caplog.at_level(logging.DEBUG):
        mode.timers.logger.info("Timer %s woke up too late, with a drift of +%r", "commit", 1.2)
    assert any("woke up too late" in r.getMessage() for r in caplog.records)
