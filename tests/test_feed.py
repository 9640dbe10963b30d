"""The SSE feed's memory of recent outputs: held as published bytes, read back on demand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from streams.contracts.models.enums import ExecutionStatus
from streams.contracts.models.outputs import ExecutionState
from streams.read.feed import Feed

T0 = datetime(2026, 7, 26, 16, 0, tzinfo=UTC)


def state(execution_id: str, seq: int, terminal: bool = False) -> ExecutionState:
    status = ExecutionStatus.COMPLETED if terminal else ExecutionStatus.RUNNING
    return ExecutionState(
        execution_id=execution_id,
        status=status,
        since=T0 + timedelta(seconds=seq),
        first_seen_at=T0,
        last_event_at=T0 + timedelta(seconds=seq),
        last_sequence=seq,
        terminal=terminal,
        state_id=f"state-{execution_id}-{seq}",
    )


class Wire:
    """Stands in for the codec: the bytes are a key into what was "published"."""

    def __init__(self) -> None:
        self.sent: dict[bytes, ExecutionState] = {}
        self.decoded = 0

    def publish(self, feed: Feed, *records: ExecutionState) -> None:
        items = []
        for r in records:
            value = r.state_id.encode()
            self.sent[value] = r
            items.append((r, "t.execution-state", value))
        feed.publish(items)

    def decode(self, topic: str, value: bytes) -> ExecutionState:
        assert topic == "t.execution-state"
        self.decoded += 1
        return self.sent[value]


def test_held_events_read_back_as_the_records_published() -> None:
    wire = Wire()
    feed = Feed(wire.decode)
    records = [state("ex-1", i) for i in range(3)] + [state("ex-1", 3, terminal=True)]
    wire.publish(feed, *records)
    assert wire.decoded == 0  # nothing decoded until a client reads
    held = feed.held("ex-1")
    assert [e.id for e in held] == [r.state_id for r in records]
    assert [e.record for e in held] == records
    assert [e.terminal for e in held] == [False, False, False, True]
    assert held[0].data == records[0].model_dump_json()
    assert held[0].sse().startswith(f"id: {records[0].state_id}\nevent: ExecutionState\n".encode())


def test_resume_after_an_id_and_duplicates_once() -> None:
    wire = Wire()
    feed = Feed(wire.decode)
    a, b, c = (state("ex-1", i) for i in range(3))
    wire.publish(feed, a, b)
    wire.publish(feed, b, c)  # b redelivered right after itself: held once
    assert [e.id for e in feed.held("ex-1", after=a.state_id)] == [b.state_id, c.state_id]
    assert [e.id for e in feed.held("ex-1", after="gone")] == [a.state_id, b.state_id, c.state_id]


def test_bounded_per_execution_and_in_executions() -> None:
    wire = Wire()
    feed = Feed(wire.decode, per_execution=2, max_executions=2)
    wire.publish(feed, *(state("ex-1", i) for i in range(5)))
    assert [e.record.last_sequence for e in feed.held("ex-1")] == [3, 4]
    wire.publish(feed, state("ex-2", 1))
    wire.publish(feed, state("ex-1", 5))  # ex-1 most recently active again
    wire.publish(feed, state("ex-3", 1))  # evicts the least recently active: ex-2
    assert feed.held("ex-2") == []
    assert [e.record.last_sequence for e in feed.held("ex-1")] == [4, 5]
    assert len(feed.held("ex-3")) == 1
