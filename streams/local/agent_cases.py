"""The clock and the cases of the scripted agents (``streams.local.agents``), apart so that
each framework's play imports them without importing the others."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


class ScriptClock:
    """The recorder's clock, moved by the play (event time, not the wall clock)."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


@dataclass(frozen=True)
class Case:
    """One execution of a play and the verdict vigil should reach on it."""

    execution_id: str
    what: str
    expect: str
