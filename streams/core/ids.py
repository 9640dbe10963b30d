"""Deterministic ids.

Every output record's id is derived from the inputs that caused it, so that a redelivery after
a crash, or a replay of the same topics, yields the very same id and consumers can deduplicate.
An id derived from an operation or an approval request hashes its scoped key
(``streams.contracts.keys.scoped_key``) as its first part: operation and request ids repeat
across executions, and the ids of two executions' things must not.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from streams.contracts.keys import scoped_key

__all__ = ["deterministic_id", "scoped_key"]

_sha256 = hashlib.sha256


def _part(value: object) -> str:
    if isinstance(value, datetime):
        return str(int(value.timestamp() * 1000))
    return "" if value is None else str(value)


def deterministic_id(kind: str, *parts: object) -> str:
    """``kind`` prefix plus 24 hex digits of SHA-256 over the parts (unit separator between)."""
    # Plain strings (most parts) are joined as they are; every other part goes through
    # ``_part``. Several ids are made per event, so the common case skips the call.
    texts = [kind]
    for value in parts:
        cls = type(value)
        if cls is str:
            texts.append(value)
        elif cls is int:
            texts.append(str(value))
        else:
            texts.append(_part(value))
    digest = _sha256("\x1f".join(texts).encode(errors="surrogatepass")).hexdigest()
    return f"{kind}-{digest[:24]}"
