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
