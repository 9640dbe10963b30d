"""``streams.client``, pure parts: the SSE parser, and typed views that read values a newer
server may send."""

from __future__ import annotations

from streams.client import ApprovalRow, Execution, Page, SSEParser, _stream_event
from streams.contracts.models.enums import ExecutionStatus, OperationStatus, RetryVerdict
from streams.contracts.models.outputs import ExecutionState


def test_sse_parser_events_comments_and_multiline_data() -> None:
    p = SSEParser()
    lines = [": keep-alive", "", "id: a1", "event: X", 'data: {"k":', "data: 1}", "", ""]
    got = [e for line in lines if (e := p.feed(line)) is not None]
    assert got == [{"id": "a1", "event": "X", "data": '{"k":\n1}'}]
    assert p.feed("data:no-space") is None and p.feed("") == {"data": "no-space"}


def test_stream_event_is_the_typed_record() -> None:
    state = ExecutionState(
        execution_id="e",
        status=ExecutionStatus.COMPLETED,
        since="2026-07-26T16:00:00Z",
        first_seen_at="2026-07-26T16:00:00Z",
        last_event_at="2026-07-26T16:00:00Z",
        last_sequence=3,
        terminal=True,
        state_id="exec-1",
    )
    e = _stream_event({"id": "exec-1", "event": "ExecutionState", "data": state.model_dump_json()})
    assert e.record == state and e.terminal
    other = _stream_event({"id": "x", "event": "FromTheFuture", "data": '{"terminal": false}'})
    assert other.record is None and other.data == {"terminal": False} and not other.terminal


def test_unknown_values_and_fields_from_a_newer_server_are_read() -> None:
    n = Execution.model_validate(
        {
            "execution_id": "e",
            "status": "HIBERNATING",
            "new_field": 1,
            "operations": [
                {
                    "operation_id": "o",
                    "attempt": 1,
                    "status": "TELEPORTED",
                    "retry": "ASK_LATER",
                    "since": "2026-07-26T16:00:00Z",
                }
            ],
        }
    )
    assert n.status is ExecutionStatus.UNRECOGNIZED
    assert n.operations[0].status is OperationStatus.UNRECOGNIZED
    assert n.operations[0].retry is RetryVerdict.UNRECOGNIZED
    page = Page[ApprovalRow].model_validate(
        {"items": [{"request_id": "r", "extra": [1]}], "next_cursor": "c", "as_of": {}}
    )
    assert page.items[0].request_id == "r" and page.items[0].extra == [1]  # type: ignore[attr-defined]
    assert page.next_cursor == "c"
