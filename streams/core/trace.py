"""W3C Trace Context carried as data: which traceparent an input brings, which an output gets.

Agent runtimes trace their runs (OpenTelemetry, W3C ``traceparent``) and may put the context of
the span that produced an event in the event's optional ``traceparent`` field. vigil does no
tracing of its own: it carries that value along so that a verdict or an operation state links
back to the agent run's trace in the tracing tool.

Only a well-formed value is carried: version 00's layout ``vv-<32 hex trace id>-<16 hex
parent id>-<2 hex flags>``, 55 characters, lowercase hex, neither id all zeros, version not
``ff`` (the specification's invalid version). Anything else is dropped, never repaired: the
event is applied as if it carried none (the shell counts the drops), because a bad trace
context is no reason to lose a fact about an agent.

Which traceparent an output carries: the one of the most recent applied input that changed
the thing the output is about, with the execution's own as the fallback (``TraceKeys``).
"""

from __future__ import annotations

import re
from typing import Any

_FORMAT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16
#: trace contexts kept per execution at most (one per operation and per approval request,
#: plus the execution's and the run signals'); the least recently set goes first
MAX_KEPT = 64

#: key of the execution's own trace context (from its status events)
EXECUTION = "execution"
#: key of the run signals' (current action digest, heartbeat): they concern every request
SIGNALS = "signals"


def valid_traceparent(value: object) -> bool:
    """Whether ``value`` is a traceparent vigil carries (see the module's docstring)."""
    if not isinstance(value, str) or len(value) != 55:
        return False
    m = _FORMAT.fullmatch(value)
    if m is None:
        return False
    version, trace_id, parent_id, _ = m.groups()
    return version != "ff" and trace_id != _ZERO_TRACE and parent_id != _ZERO_PARENT


def traceparent_of(record: Any) -> str | None:
    """The record's traceparent if it is one vigil carries, else None (no field, none given,
    or malformed)."""
    value = record.__dict__.get("traceparent")
    return value if value is not None and valid_traceparent(value) else None


def malformed(record: Any) -> bool:
    """Whether the record carries a traceparent that is dropped."""
    value = record.__dict__.get("traceparent")
    return value is not None and not valid_traceparent(value)


def operation_key(operation_id: str) -> str:
    return f"op:{operation_id}"


def request_key(request_id: str) -> str:
    return f"req:{request_id}"


def key_of_input(record: Any) -> str:
    """What an applied input changes, as the key its trace context is kept under: the
    operation, the approval request, the run signals or the execution itself."""
    fields = record.__dict__
    operation_id = fields.get("operation_id")
    if operation_id is not None:
        return operation_key(operation_id)
    request_id = fields.get("request_id")
    if request_id is not None:
        return request_key(request_id)
    if "sequence" in fields:  # a status event
        return EXECUTION
    return SIGNALS


def remember(traces: dict[str, str] | None, key: str, traceparent: str) -> dict[str, str]:
    """A new map with ``traceparent`` as the most recent for ``key``, bounded to
    ``MAX_KEPT`` keys (the least recently set dropped). ``traces`` is left as it was."""
    new = dict(traces or {})
    new.pop(key, None)
    new[key] = traceparent
    while len(new) > MAX_KEPT:
        del new[next(iter(new))]
    return new


def lookup(traces: dict[str, str] | None, *keys: str) -> str | None:
    """The trace context kept for the first of ``keys`` that has one, else the execution's."""
    if not traces:
        return None
    for key in keys:
        value = traces.get(key)
        if value is not None:
            return value
    return traces.get(EXECUTION)
