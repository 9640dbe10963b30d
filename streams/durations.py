"""Human-friendly durations for command-line options: ``5m``, ``90s``, ``1h``, ``1h30m``, ``300``.

A bare number is seconds (the unit the snapshot file's ``*_seconds`` fields use). Units:
``ms``, ``s``, ``m``, ``h``, ``d``; parts may be combined largest first or in any order, each
unit at most once. Negative durations are refused: no threshold can be negative.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str) -> timedelta:
    """Parse ``text`` into a timedelta; raise ValueError (with the text) if it is not one."""
    value = text.strip().lower()
    if _NUMBER.fullmatch(value):
        return timedelta(seconds=float(value))
    total = timedelta(0)
    seen: set[str] = set()
    position = 0
    for match in _PART.finditer(value):
        if match.start() != position or match.group(2) in seen:
            break
        seen.add(match.group(2))
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    else:
        if seen and position == len(value):
            return total
    raise ValueError(f"not a duration: {text!r} (examples: 300, 90s, 5m, 1h, 1h30m, 250ms, 2d)")


def format_duration(value: timedelta) -> str:
    """``value`` written the way ``parse_duration`` reads it, largest unit first: ``24h``,
    ``1h30m``, ``250ms``, ``0s``. Days are used for whole days from two on (``7d``); a day
    and a half stays ``36h``. Sub-millisecond parts are dropped."""
    ms = round(value / timedelta(milliseconds=1))
    if ms < 0:
        raise ValueError(f"negative duration: {value}")
    if ms == 0:
        return "0s"
    day_ms = 86_400_000
    if ms % day_ms == 0 and ms >= 2 * day_ms:
        return f"{ms // day_ms}d"
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
