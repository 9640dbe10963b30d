"""Tests only: a worker whose core fails on one event, or whose broker refuses one output once
(``tests/test_poison_kafka.py``).

The test puts this directory on the worker's ``PYTHONPATH`` and sets either variable:

- ``VIGIL_TEST_RAISE_ON_EVENT`` to an event id: applying that status or operation event raises
  ``OverflowError``, every time, as the core did on a duration the schema allows and the
  domain cannot use. Every batch that applies it fails.
- ``VIGIL_TEST_REFUSE_OUTPUT_ONCE`` to an execution id: the first output about that execution
  the worker hands its producer is refused, as by a broker whose topic was just deleted. That
  batch fails; its records come again and nothing is refused any more.

The worker's own code runs otherwise unchanged. Nothing here is imported unless one of the
variables is set; production code has no hook for it.
"""

from __future__ import annotations

import os
from typing import Any

#: In the errors raised, which the worker logs with the failed batch.
RAISED = "injected core failure"
REFUSED = "injected output refusal"


def _raise_on(event_id: str) -> None:
    from streams.engine.processor import Processor

    for name in ("_on_input",):
        apply = getattr(Processor, name)

        def failing(self: Processor, env: Any, record: Any, out: Any, _apply: Any = apply) -> Any:
            if record.event_id == event_id:
                raise OverflowError(f"{RAISED} on {event_id}")
            return _apply(self, env, record, out)

        setattr(Processor, name, failing)


def _refuse_once(execution_id: str) -> None:
    from streams.kafka.clients import RecordProducer

    send = RecordProducer.send_emission
    left = [1]

    def refusing(self: RecordProducer, em: Any, value: bytes | None = None) -> bytes:
        if left[0] and getattr(em.record, "execution_id", None) == execution_id:
            left[0] -= 1
            raise RuntimeError(f"{REFUSED}: {em.topic}")
        return send(self, em, value)

    RecordProducer.send_emission = refusing  # type: ignore[method-assign]


_event = os.environ.get("VIGIL_TEST_RAISE_ON_EVENT")
if _event:
    _raise_on(_event)
_execution = os.environ.get("VIGIL_TEST_REFUSE_OUTPUT_ONCE")
if _execution:
    _refuse_once(_execution)
