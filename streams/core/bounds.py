"""Values the contracts allow but the domain cannot use, found before the core sees them.

The Avro contracts carry times as ``timestamp-millis`` longs and approval thresholds as longs
of seconds. A decodable record may therefore hold a time in the year 1 or 9999, or a
threshold of ``10**12`` seconds (31,700 years) or of minus one second. The core adds
thresholds and timeouts to times (a decision plus the grace period, a heartbeat plus its
freshness window, a send plus its reply timeout, a closed execution plus its retention) and
builds threshold objects that refuse negative values; such a record would make it raise, and
the record would come again after every restart. So every input is checked here first, and one
that falls outside these bounds is reported as an anomaly and not applied:

- every time field (event time, expiry, reply and verification due times, a tick's time) lies
  in ``[EARLIEST, LATEST)``: 1971-01-01 to 9000-01-01 (UTC). Before 1971 is no plausible event
  time for this system (and the shell already judged event times so). The upper bound leaves
  about a thousand years below the largest date Python can hold (9999-12-31), so adding any
  bounded duration, or several, to an accepted time stays computable. Whether a time is
  plausible *now* is the stream-relative future-skew rule's business, not this one's.
- every duration a record carries (an approval request's ``grace_seconds``,
  ``heartbeat_fresh_seconds``, ``delivery_deadline_seconds``) lies in ``[0, MAX_DURATION]``,
  365 days. Zero is usable (the deadline is the fact's own instant); a negative threshold is
  meaningless; the longest waits the domain knows are hours, days for a maintenance window
  held on purpose, so a year is beyond any sane threshold, and 365 days added to a time below
  ``LATEST`` stays computable. Published thresholds are milliseconds in Avro longs: a year is
  about 3.2e10 of them.
- every text field has a length bound (``TEXT_BOUNDS``): 1,024 characters for ids, names,
  references and digests (``MAX_ID_CHARS``), 8,192 for the free text of a status's ``reason``
  and an operation event's ``detail`` (``MAX_TEXT_CHARS``). What an input carries is kept in
  its execution's table entry (ids, idempotency keys, digests, references), and an entry is
  one changelog record, which Kafka refuses beyond its maximum message size: unbounded, ten
  operations with idempotency keys of 150,000 characters made an entry of 2.3 MB that could
  never be written, and its partition stalled. Ids in practice are tens of characters (a
  UUID is 36, a SHA-256 digest in hex 64; Stripe's idempotency keys stop at 255), so 1,024
  leaves room for any real one; the free text is for people and 8 KiB is several paragraphs.
  A longer field is a VALUE_TOO_LARGE anomaly naming the field and its length. The bound is
  per field; what many inputs add up to in one entry is bounded by the shell
  (``VIGIL_MAX_ENTRY_BYTES``, ``streams.engine.processor``). ``traceparent`` is exempt: it is
  checked for its exact layout and dropped when malformed (``streams.core.trace``).
- other numbers need no bound: ``sequence`` (a long) and ``attempt`` (an int, at least 1) are
  only compared, never added to a time nor narrowed; a tick's ``partition`` is informative (the
  shell uses the record's Kafka partition).

The configured durations (thresholds, per-connector timeouts, retentions, the future skew) get
the same ``MAX_DURATION`` bound where they are loaded (``streams.settings``,
``streams.policies``), so the core never adds more than that to a time, and must be whole
milliseconds (``duration_problem``), the unit deadlines are scheduled and published in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.contracts.models import events as ev
from streams.contracts.models.base import Record
from streams.contracts.models.enums import AnomalyKind
from streams.core.findings import AnomalyFinding

#: The earliest time any input may carry (inclusive).
EARLIEST = datetime(1971, 1, 1, tzinfo=UTC)
#: The first time no input may carry (exclusive).
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
#: The longest duration a record or the configuration may give (inclusive).
MAX_DURATION = timedelta(days=365)
MAX_SECONDS = int(MAX_DURATION.total_seconds())
_MS = timedelta(milliseconds=1)

#: The time fields of every input record type (the contracts' ``timestamp-millis`` fields).
TIME_FIELDS: dict[type[Record], tuple[str, ...]] = {
    ev.ExecutionStatusChanged: ("occurred_at",),
    ev.OperationEvent: ("occurred_at", "reply_due_at", "verify_due_at"),
    ev.ApprovalRequested: ("occurred_at", "expires_at"),
    ev.ApprovalDelivery: ("occurred_at",),
    ev.ApproverAcknowledgement: ("occurred_at",),
    ev.ApprovalDecision: ("occurred_at",),
    ev.CurrentActionDigest: ("occurred_at",),
    ev.ResumeReceipt: ("occurred_at",),
    ev.RequesterHeartbeat: ("occurred_at",),
    ev.ClockTick: ("occurred_at",),
}

#: The durations, in whole seconds, of every input record type that carries any.
SECONDS_FIELDS: dict[type[Record], tuple[str, ...]] = {
    ev.ApprovalRequested: ("grace_seconds", "heartbeat_fresh_seconds", "delivery_deadline_seconds"),
}

#: The longest id, name, reference or digest an input may carry, in characters (inclusive).
MAX_ID_CHARS = 1024
#: The longest free text (a status's reason, an operation event's detail), in characters.
MAX_TEXT_CHARS = 8192
#: The text fields that are free text; every other text field is bounded as an id.
FREE_TEXT = frozenset({"reason", "detail"})
#: Text fields that are not bounded here (their layout is checked where they are used).
UNBOUNDED_TEXT = frozenset({"traceparent"})


def _text_bounds(cls: type[Record]) -> tuple[tuple[str, int], ...]:
    """Every text field of ``cls`` (``str`` or ``str | None``) with its bound."""
    out = []
    for name, info in cls.model_fields.items():
        if name in UNBOUNDED_TEXT or info.annotation not in (str, str | None):
            continue
        out.append((name, MAX_TEXT_CHARS if name in FREE_TEXT else MAX_ID_CHARS))
    return tuple(out)


#: The text fields of every input record type, each with its bound in characters.
TEXT_BOUNDS: dict[type[Record], tuple[tuple[str, int], ...]] = {
    cls: _text_bounds(cls) for cls in TIME_FIELDS
}


def text_bounds(cls: type[Record]) -> tuple[tuple[str, int], ...]:
    """``TEXT_BOUNDS`` of ``cls``, found for a type the table does not list yet."""
    texts = TEXT_BOUNDS.get(cls)
    if texts is None:
        texts = TEXT_BOUNDS[cls] = _text_bounds(cls)
    return texts


#: The other numeric fields of the inputs, which need no bound (see the module docstring).
UNBOUNDED_NUMBERS: dict[type[Record], tuple[str, ...]] = {
    ev.ExecutionStatusChanged: ("sequence",),
    ev.OperationEvent: ("attempt",),
    ev.ClockTick: ("partition",),
}


def time_in_domain(t: datetime) -> bool:
    """Whether ``t`` (aware) lies in ``[EARLIEST, LATEST)``."""
    return EARLIEST <= t < LATEST


def duration_problem(value: timedelta, *, positive: bool = False) -> str | None:
    """Why a configured duration is unusable (negative, zero where it must be ``positive``,
    beyond ``MAX_DURATION``, a fraction of a millisecond), or None. For the configuration
    loaders; a record's durations are whole seconds, checked by ``out_of_domain``."""
    if value < timedelta(0):
        return "is negative"
    if positive and value == timedelta(0):
        return "is zero, and must be positive"
    if value > MAX_DURATION:
        return f"is beyond the bound of {MAX_DURATION.days} days"
    if value % _MS:
        # deadlines are kept and published in milliseconds: one between two of them would
        # fall due at a millisecond before it, forever
        return "is not a whole number of milliseconds"
    return None


def out_of_domain(record: Record) -> AnomalyFinding | None:
    """An anomaly if one of ``record``'s texts, times or durations lies outside the bounds
    above, else None. Any input record type, ticks included; the first offending field is
    named."""
    fields = record.__dict__
    cls = type(record)
    for name, bound in text_bounds(cls):
        text = fields[name]
        if text is not None and len(text) > bound:
            return AnomalyFinding(
                AnomalyKind.VALUE_TOO_LARGE,
                f"{cls.avro_name}.{name} has {len(text):,} characters, above the bound of "
                f"{bound:,}; not applied",
            )
    names = TIME_FIELDS.get(cls)
    if names is None:  # a type this table does not list yet: every time it holds
        names = tuple(n for n, v in fields.items() if isinstance(v, datetime))
    for name in names:
        t = fields[name]
        if t is not None and not EARLIEST <= t < LATEST:
            where = (
                f"before {EARLIEST.year}, the earliest time vigil accepts"
                if t < EARLIEST
                else f"in {LATEST.year} or later, past the times vigil can add deadlines to"
            )
            return AnomalyFinding(
                AnomalyKind.TIME_OUT_OF_RANGE,
                f"{cls.avro_name}.{name} {t.isoformat()} is {where}; not applied",
            )
    for name in SECONDS_FIELDS.get(cls, ()):
        seconds = fields[name]
        if seconds is not None and not 0 <= seconds <= MAX_SECONDS:
            problem = (
                "is negative"
                if seconds < 0
                else f"exceeds {MAX_SECONDS} s ({MAX_DURATION.days} days)"
            )
            return AnomalyFinding(
                AnomalyKind.VALUE_OUT_OF_RANGE,
                f"{cls.avro_name}.{name} = {seconds} s {problem}: no usable threshold; not applied",
            )
    return None
