"""The LangGraph adapter (``pip install vigil[langgraph]``).

    from streams.adapters import Approval
    from streams.adapters.langgraph import GraphRecorder

    vigil = GraphRecorder(recorder.execution("exec-1"), approval=Approval(approver="role:ops"))
    vigil.invoke(graph, {"service": "api"}, config)                 # stops on interrupt()
    vigil.heartbeat(graph, config)                                   # while the thread waits
    vigil.invoke(graph, Command(resume="accept"), config)            # the decision, resumed

``stream``/``astream`` and ``invoke``/``ainvoke`` run the compiled graph as its own methods do
(the chunks of ``stream_mode``, default ``"updates"``) and record (topology.md, "Recording from
agent frameworks"):

- **Status**: RUNNING when the graph runs, WAITING_FOR_APPROVAL when it stops on interrupts,
  VALIDATING_OUTPUT and COMPLETED when it ends with nothing left to run, FAILED when it raises.
- **Heartbeats**: every node that finishes (node progress), every interrupt, and each
  ``heartbeat()`` a process able to resume the thread sends while it waits.
- **Approval requests**: each ``interrupt(value)`` still pending when the graph stops is one
  request, id ``<execution>/<interrupt id>``. The action and its material arguments come from
  the value (a mapping with ``"action"`` and ``"arguments"``, or ``describe``), so the digest
  binds the request to what the node is about to do. The resume handle is the thread and its
  checkpoint id, ``langgraph:thread=<id>;ns=<ns>;checkpoint=<id>``, when the graph's
  checkpointer keeps it beyond the process; with an in-memory saver (``InMemorySaver``, or
  SQLite on ``:memory:``) there is no handle, and vigil says ORPHANED_WAIT: a restart loses
  the interruption, so nothing can take the answer (docs/rules.md#the-four-proofs).
- **Decisions**: a ``Command(resume=...)`` run through the adapter records the decision on
  each interrupt it answers, the resume value read as accept / decline / cancel
  (``streams.adapters.decision_code``, or ``decision``).
- **Resume receipts**: the interrupted node running past ``interrupt()`` (its task finishing
  without interrupting again) is the receipt: the run took the answer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.adapters import Approval, decision_code, require
from streams.contracts.models.enums import DecisionCode, ExecutionStatus
from streams.recorder import ApprovalRun, ExecutionRun, action_digest

require("langgraph", "langgraph")
from langgraph.types import Command, Interrupt  # noqa: E402

S = ExecutionStatus

__all__ = ["GraphRecorder", "durable_checkpointer", "resume_handle"]

Describe = Callable[[Any, str], tuple[str, Mapping[str, Any] | None]]


def durable_checkpointer(checkpointer: Any) -> bool:
    """Whether ``checkpointer`` keeps a thread's checkpoints beyond this process: not an
    in-memory saver, not SQLite on an in-memory database, and not none at all. Savers this
    function does not know (Postgres, Redis, a platform's) are taken as durable, and so is
    ``AsyncSqliteSaver``, whose database it cannot read from the event loop; the ``durable``
    argument of ``GraphRecorder`` overrides it for a saver that is not (``durable=False`` for
    an async SQLite saver on ``:memory:``)."""
    if checkpointer is None or checkpointer is False:
        return False
    from langgraph.checkpoint.memory import InMemorySaver

    if isinstance(checkpointer, InMemorySaver):
        return False
    conn = getattr(checkpointer, "conn", None)
    if isinstance(conn, sqlite3.Connection):
        # the main database's file; '' for ':memory:' and for a temporary database
        rows = conn.execute("PRAGMA database_list").fetchall()
        return any(name == "main" and path for _, name, path in rows)
    return True


def resume_handle(config: Mapping[str, Any]) -> str:
    """The handle of a stored interruption: the thread, namespace and checkpoint id a
    ``Command(resume=...)`` continues from."""
    c = config.get("configurable", {})
    return (
        f"langgraph:thread={c.get('thread_id')};ns={c.get('checkpoint_ns', '')};"
        f"checkpoint={c.get('checkpoint_id')}"
    )


def _snapshot(graph: Any, config: Mapping[str, Any]) -> Any:
    """The thread's latest state, or None for a graph without a checkpointer (it can
    interrupt nothing: there is no thread to read)."""
    if getattr(graph, "checkpointer", None) is None:
        return None
    return graph.get_state(config)


async def _asnapshot(graph: Any, config: Mapping[str, Any]) -> Any:
    if getattr(graph, "checkpointer", None) is None:
        return None
    return await graph.aget_state(config)


def _describe(value: Any, node: str) -> tuple[str, Mapping[str, Any] | None]:
    """The action and material arguments of an interrupt's value: a mapping naming its
    ``action`` (with ``arguments``, or its other keys as the arguments), else the node's name
    with the value as its one argument. The value must be plain JSON data for the digest;
    give ``describe`` for anything else."""
    if isinstance(value, Mapping) and isinstance(value.get("action"), str):
        if isinstance(value.get("arguments"), Mapping):
            return value["action"], value["arguments"]
        return value["action"], {k: v for k, v in value.items() if k != "action"}
    return node, {"value": value}


@dataclass
class GraphRecorder:
    """Records one execution's run of a compiled LangGraph graph through ``execution`` (a
    recorder's ``ExecutionRun``); one thread of the graph is one execution."""

    execution: ExecutionRun
    #: who decides, and under which policy (per action in ``approvals``)
    approval: Approval = field(default_factory=Approval)
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    describe: Describe = _describe
    #: a resume value as a decision (default: ``decision_code``)
    decision: Callable[[Any], DecisionCode | str] = decision_code
    #: whether the checkpointer is durable; None: ``durable_checkpointer`` decides
    durable: bool | None = None
    _status_now: ExecutionStatus | None = None
    _requests: dict[str, ApprovalRun] = field(default_factory=dict)
    #: task id → request ids answered, until the task runs past its interrupt
    _answered: dict[str, list[str]] = field(default_factory=dict)

    # -- running ----------------------------------------------------------------------------
    def stream(
        self, graph: Any, input: Any, config: Mapping[str, Any], **kwargs: Any
    ) -> Iterator[Any]:
        """``graph.stream(input, config, ...)``, recorded; yields what it yields."""
        asked, modes = self._modes(kwargs)
        self._before(_snapshot(graph, config), input)
        try:
            for chunk in graph.stream(input, config, stream_mode=modes, **kwargs):
                out = self._chunk(chunk, asked)
                if out is not None:
                    yield out
        except Exception as err:
            self._status(S.FAILED, reason=type(err).__name__)
            raise
        self._after(_snapshot(graph, config), graph)

    async def astream(
        self, graph: Any, input: Any, config: Mapping[str, Any], **kwargs: Any
    ) -> AsyncIterator[Any]:
        """``graph.astream(input, config, ...)``, recorded; yields what it yields."""
        asked, modes = self._modes(kwargs)
        self._before(await _asnapshot(graph, config), input)
        try:
            async for chunk in graph.astream(input, config, stream_mode=modes, **kwargs):
                out = self._chunk(chunk, asked)
                if out is not None:
                    yield out
        except Exception as err:
            self._status(S.FAILED, reason=type(err).__name__)
            raise
        self._after(await _asnapshot(graph, config), graph)

    def invoke(self, graph: Any, input: Any, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """Runs the graph to its end or its interrupts (``stream`` drained) and returns the
        thread's values."""
        for _ in self.stream(graph, input, config, **kwargs):
            pass
        return graph.get_state(config).values

    async def ainvoke(
        self, graph: Any, input: Any, config: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        async for _ in self.astream(graph, input, config, **kwargs):
            pass
        return (await graph.aget_state(config)).values

    def heartbeat(self, graph: Any, config: Mapping[str, Any]) -> None:
        """The process that can resume this thread is alive (the live-resume proof): call it
        every few minutes while the thread waits, well inside the heartbeat window."""
        snapshot = _snapshot(graph, config)
        handle = None if snapshot is None else self._handle(graph, snapshot)
        self.execution.heartbeat(resume_handle=handle)

    async def aheartbeat(self, graph: Any, config: Mapping[str, Any]) -> None:
        """``heartbeat`` for a graph whose checkpointer is asynchronous."""
        snapshot = await _asnapshot(graph, config)
        handle = None if snapshot is None else self._handle(graph, snapshot)
        self.execution.heartbeat(resume_handle=handle)

    # -- what a run records ------------------------------------------------------------------
    @staticmethod
    def _modes(kwargs: dict[str, Any]) -> tuple[str | list[str], list[str]]:
        """The caller's stream modes, and the modes run: those plus ``tasks``, what the
        adapter reads (its chunks are yielded only when the caller asked for them)."""
        asked = kwargs.pop("stream_mode", "updates")
        modes = [asked] if isinstance(asked, str) else list(asked)
        return asked, modes if "tasks" in modes else [*modes, "tasks"]

    def _chunk(self, chunk: tuple[str, Any], asked: str | list[str]) -> Any:
        """Reads one ``(mode, data)`` chunk; returns what the caller's ``stream`` would have
        yielded for it (the bare data when it asked for one mode), or None."""
        mode, data = chunk
        if mode == "tasks" and isinstance(data, Mapping) and "result" in data:
            self._task_done(data)
        if isinstance(asked, str):
            return data if mode == asked else None
        return chunk if mode in asked else None

    def _before(self, snapshot: Any, input: Any) -> None:
        if snapshot is not None and isinstance(input, Command) and input.resume is not None:
            self._decide(snapshot, input.resume)
        self._status(S.RUNNING)

    def _decide(self, snapshot: Any, resume: Any) -> None:
        """Records the decision on each pending interrupt the resume value answers."""
        pending: list[tuple[Any, Interrupt]] = [
            (task, i) for task in snapshot.tasks for i in task.interrupts
        ]
        if (
            isinstance(resume, Mapping)
            and resume
            and all(any(i.id == k for _, i in pending) for k in resume)
        ):
            answers = {k: v for k, v in resume.items()}
        else:
            answers = {i.id: resume for _, i in pending}
        for task, intr in pending:
            if intr.id not in answers:
                continue
            rid = self.request_id(intr)
            req = self._requests.get(rid)
            if req is None:
                action, arguments = self.describe(intr.value, task.name)
                req = self.execution.request(rid, action_digest=action_digest(action, arguments))
            req.decided(self.decision(answers[intr.id]))
            self._answered.setdefault(task.id, []).append(rid)

    def _task_done(self, data: Mapping[str, Any]) -> None:
        """A node finished: progress (a heartbeat), and the receipt of the answers it took
        when it ran past its interrupt."""
        self.execution.heartbeat()
        if data.get("interrupts") or data.get("error"):
            return
        for rid in self._answered.pop(str(data.get("id")), []):
            self.execution.resumed(rid, next_status=S.RUNNING)

    def _after(self, snapshot: Any, graph: Any) -> None:
        if snapshot is None:
            return
        pending = [(task, i) for task in snapshot.tasks for i in task.interrupts]
        if pending:
            handle = self._handle(graph, snapshot)
            self._status(S.WAITING_FOR_APPROVAL)
            for task, intr in pending:
                self._request(task, intr, handle)
            self.execution.heartbeat(resume_handle=handle)
        elif not snapshot.next:
            self._status(S.VALIDATING_OUTPUT)
            self._status(S.COMPLETED)

    def _request(self, task: Any, intr: Interrupt, handle: str | None) -> ApprovalRun:
        rid = self.request_id(intr)
        if rid in self._requests:
            return self._requests[rid]
        action, arguments = self.describe(intr.value, task.name)
        spec = self.approvals.get(action, self.approval)
        req = self.execution.approval(
            rid,
            action=action,
            arguments=arguments,
            approver=spec.approver,
            resume_handle=handle,
            risk=spec.risk,
            policy=spec.policy,
            expires=spec.expires,
            grace=spec.grace,
            heartbeat_fresh=spec.heartbeat_fresh,
            delivery_deadline=spec.delivery_deadline,
        )
        self._requests[rid] = req
        return req

    def request_id(self, intr: Interrupt) -> str:
        """The approval request id of an interrupt: the execution and LangGraph's interrupt
        id, which stays the same while the interrupt waits (in any process that reads the
        thread)."""
        return f"{self.execution.execution_id}/{intr.id}"

    def requests(self) -> list[ApprovalRun]:
        """The handles of the requests this adapter recorded (to record their delivery)."""
        return list(self._requests.values())

    def _handle(self, graph: Any, snapshot: Any) -> str | None:
        durable = (
            self.durable
            if self.durable is not None
            else durable_checkpointer(getattr(graph, "checkpointer", None))
        )
        return resume_handle(snapshot.config) if durable else None

    def _status(self, status: ExecutionStatus, reason: str | None = None) -> None:
        if status == self._status_now:
            return
        self.execution.status(status, reason=reason)
        self._status_now = status
