"""The OpenAI Agents SDK adapter (``pip install vigil[openai-agents]``).

    from streams.adapters.openai_agents import AgentsRecorder, Approval, Effect, FileStateStore

    vigil = AgentsRecorder(
        recorder.execution("exec-1"),
        effects={"refund": Effect(connector="payments", idempotency_key="order_id")},
        approvals={"refund": Approval(approver="role:payments-lead", risk="high")},
        state_store=FileStateStore("runs/"),
    )
    result = await vigil.run(agent, "refund order 42")
    for item in result.interruptions:          # a tool with needs_approval=True
        state = vigil.state                     # the RunState the request's handle names
        vigil.approve(state, item)              # or vigil.reject(state, item)
    result = await vigil.resume(agent, state)

What is recorded (topology.md, "Recording from agent frameworks"):

- **Status**: RUNNING when the run starts or resumes, WAITING_FOR_TOOL while a declared effect
  tool runs, WAITING_FOR_APPROVAL when the run stops on interruptions, VALIDATING_OUTPUT and
  COMPLETED on the final output, FAILED when the run raises. Only changes are recorded.
- **Operations**: each call of a tool named in ``effects`` is one operation (id
  ``<execution>/<tool call id>``, attempt 1) with the effect's connector and idempotency key:
  SENT when the tool starts, with the reply deadline the effect or the tool's own
  ``timeout_seconds`` gives; ACKNOWLEDGED (or VERIFIED, when the effect reads a reference of
  the source out of the result) when it returns. When it returns no answer of the connector
  (the SDK's timeout or error message in place of a result) nothing more is recorded: the run
  cannot tell a lost reply from a rejection, so the reply deadline makes the operation
  UNKNOWN (docs/rules.md#deadlines), and a second call with the same idempotency key is a
  FORBIDDEN_RETRY (docs/rules.md#forbidden-retry).
- **Approval requests**: when the run stops on interruptions, one request per pending tool
  call (id ``<execution>/<tool call id>``): the tool's name as the action, the digest of the
  name and the call's arguments, the approver, risk and policy of its ``Approval``, and as
  resume handle the name under which ``state_store`` saved the serialised ``RunState``
  (no store: no handle, and vigil says ORPHANED_WAIT, because nothing durable can take the
  answer). A heartbeat goes with it: the run that asks is alive.
- **Decisions**: ``approve`` on the state is an accept, ``reject`` a decline.
- **Resume receipts**: the resumed run's first step past the approved call, that is the SDK
  invoking the approved tool call, is the receipt (RESUMED). An approved call never resumed is
  STUCK_AFTER_DECISION once its grace is over.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from streams.adapters import Approval, require
from streams.contracts.models.enums import DecisionCode, ExecutionStatus
from streams.recorder import ApprovalRun, ExecutionRun, OperationRun

agents = require("agents", "openai-agents")

S = ExecutionStatus

__all__ = [
    "AgentsRecorder",
    "Approval",
    "Effect",
    "FileStateStore",
    "StateStore",
    "VigilRunHooks",
]


@dataclass(frozen=True)
class Effect:
    """A tool that touches the outside world, and how to record its calls as operations.

    ``idempotency_key``: the name of one of the call's arguments, or a function of the
    arguments (a mapping) returning the key; none: the operation has no key. ``reply_timeout``:
    the reply deadline after the send (none: the tool's ``timeout_seconds``, else the
    connector's timeout in vigil's settings). ``effect_ref``: a function of the tool's result
    returning the reference of the effect at the source when the result proves it (then the
    call is VERIFIED), else None (ACKNOWLEDGED). ``no_reply``: a function of the result saying
    it is not the connector's answer (the SDK's timeout and error messages always are not).
    """

    connector: str
    idempotency_key: str | Callable[[Mapping[str, Any]], str | None] | None = None
    reply_timeout: timedelta | float | None = None
    effect_ref: Callable[[Any], str | None] | None = None
    no_reply: Callable[[Any], bool] | None = None

    def key(self, arguments: Mapping[str, Any]) -> str | None:
        if self.idempotency_key is None:
            return None
        if callable(self.idempotency_key):
            return self.idempotency_key(arguments)
        value = arguments.get(self.idempotency_key)
        return None if value is None else str(value)


class StateStore(Protocol):
    """Where an interrupted run's serialised ``RunState`` is kept until it is resumed. The
    handle ``save`` returns is the approval request's resume handle: it must name something
    that outlives the process, or the live-resume proof is a lie."""

    def save(self, execution_id: str, state_json: str) -> str: ...

    def load(self, handle: str) -> str: ...


@dataclass(frozen=True)
class FileStateStore:
    """``RunState`` JSON in one file per execution under ``directory`` (written to a temporary
    file and renamed, so a crash never leaves half a state); the handle is
    ``openai-agents-runstate:<path>``."""

    directory: str | Path
    PREFIX = "openai-agents-runstate:"

    def save(self, execution_id: str, state_json: str) -> str:
        folder = Path(self.directory)
        folder.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in execution_id)
        path = (folder / f"{safe}.runstate.json").resolve()
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".runstate-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(state_json)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return f"{self.PREFIX}{path}"

    def load(self, handle: str) -> str:
        if not handle.startswith(self.PREFIX):
            raise ValueError(f"resume handle {handle!r} is not one of this store's")
        return Path(handle.removeprefix(self.PREFIX)).read_text(encoding="utf-8")


def _arguments(text: str | None) -> dict[str, Any]:
    """A tool call's JSON arguments as a mapping (the model's text; not an object → under
    ``"arguments"``, so the digest still binds them)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


class VigilRunHooks(agents.RunHooks):  # type: ignore[misc, name-defined]
    """The SDK's run hooks recording status changes, effect tool calls and resume receipts
    for one ``AgentsRecorder``."""

    def __init__(self, owner: AgentsRecorder) -> None:
        self.owner = owner

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self.owner._status(S.RUNNING)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        self.owner._finished = True

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.owner._tool_started(context, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        self.owner._tool_ended(context, tool, result)


@dataclass
class _Call:
    tool_name: str
    op: OperationRun


@dataclass
class AgentsRecorder:
    """Records one execution of an OpenAI Agents SDK run through ``run`` (a recorder's
    ``ExecutionRun``). ``run``/``resume`` wrap ``Runner.run``; ``approve``/``reject`` wrap the
    state's own. ``hooks`` may also be passed to ``Runner.run`` directly (then the
    interruptions are recorded by ``interrupted(result)``)."""

    execution: ExecutionRun
    effects: Mapping[str, Effect] = field(default_factory=dict)
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    #: the approval of a tool that needs one and is not in ``approvals``
    default_approval: Approval = field(default_factory=Approval)
    state_store: StateStore | None = None
    #: the state of the last interrupted run (what its requests' resume handle names)
    state: Any = None
    _status_now: ExecutionStatus | None = None
    _finished: bool = False
    _calls: dict[str, _Call] = field(default_factory=dict)
    _requests: dict[str, ApprovalRun] = field(default_factory=dict)
    #: call ids of the interrupted calls: the first invocation of one is its receipt
    _pending: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.hooks = VigilRunHooks(self)

    # -- the run ------------------------------------------------------------------------
    async def run(self, agent: Any, input: Any, **kwargs: Any) -> Any:
        """``Runner.run(agent, input, hooks=...)`` with its facts recorded; an interrupted
        result's requests are recorded before it is returned."""
        self._finished = False
        try:
            result = await agents.Runner.run(agent, input, hooks=self.hooks, **kwargs)
        except Exception as err:
            self._status(S.FAILED, reason=type(err).__name__)
            raise
        self._settled(result)
        return result

    async def resume(self, agent: Any, state: Any, **kwargs: Any) -> Any:
        """Runs ``state`` again after its approvals were decided (``approve``/``reject``,
        or the SDK's own with ``decided``), in this process or another one (``state`` loaded
        from the store). The run is RUNNING again from here; the first invocation of an
        interrupted call is its resume receipt (the SDK invokes only the approved ones)."""
        self._pending.update(i.call_id for i in state.get_interruptions() if i.call_id)
        self._status(S.RUNNING)
        return await self.run(agent, state, **kwargs)

    def interrupted(self, result: Any) -> list[ApprovalRun]:
        """Records the requests of a result that stopped on interruptions (done by ``run``):
        saves its state (the resume handle), records WAITING_FOR_APPROVAL, one request per
        pending call, and a heartbeat. Returns the requests' handles (again, without recording
        anything, for a result already recorded)."""
        items = list(result.interruptions)
        if not items:
            return []
        if all(self.request_id(item) in self._requests for item in items):
            return [self._requests[self.request_id(item)] for item in items]
        state = result.to_state()
        self.state = state
        handle = (
            None
            if self.state_store is None
            else self.state_store.save(self.execution.execution_id, state.to_string())
        )
        self._status(S.WAITING_FOR_APPROVAL)
        out = []
        for item in items:
            rid = self.request_id(item)
            if rid in self._requests:
                out.append(self._requests[rid])
                continue
            spec = self.approvals.get(item.name or "", self.default_approval)
            req = self.execution.approval(
                rid,
                action=item.name or "tool",
                arguments=_arguments(item.arguments),
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
            if item.call_id:
                self._pending.add(item.call_id)
            out.append(req)
        self.execution.heartbeat(resume_handle=handle)
        return out

    def request_id(self, item: Any) -> str:
        """The approval request id of a pending tool call: the execution and the call id, the
        same in every process that sees the call (a resumed run after a restart too)."""
        return f"{self.execution.execution_id}/{item.call_id}"

    # -- decisions ------------------------------------------------------------------------
    def approve(self, state: Any, item: Any, *, always_approve: bool = False) -> None:
        """``state.approve(item)``, recorded as an accept."""
        state.approve(item, always_approve=always_approve)
        self.decided(item, DecisionCode.ACCEPT)

    def reject(self, state: Any, item: Any, *, rejection_message: str | None = None) -> None:
        """``state.reject(item)``, recorded as a decline."""
        state.reject(item, rejection_message=rejection_message)
        self.decided(item, DecisionCode.DECLINE)

    def decided(self, item: Any, decision: DecisionCode | str) -> None:
        """Records a decision on ``item`` taken elsewhere (an approval service, the SDK's
        ``approve`` called directly). Works in a process that did not record the request:
        the decision names the digest of the call as the request did."""
        rid = self.request_id(item)
        req = self._requests.get(rid)
        if req is None:
            from streams.recorder import action_digest

            digest = action_digest(item.name or "tool", _arguments(item.arguments))
            req = self.execution.request(rid, action_digest=digest)
            self._requests[rid] = req
        req.decided(decision)

    # -- what the hooks call ----------------------------------------------------------------
    def _status(self, status: ExecutionStatus, reason: str | None = None) -> None:
        if status == self._status_now:
            return
        self.execution.status(status, reason=reason)
        self._status_now = status

    def _settled(self, result: Any) -> None:
        if getattr(result, "interruptions", None):
            self.interrupted(result)
        elif self._finished:
            self._status(S.VALIDATING_OUTPUT)
            self._status(S.COMPLETED)

    def _tool_started(self, context: Any, tool: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id in self._pending:
            self._pending.discard(call_id)
            self.execution.resumed(
                f"{self.execution.execution_id}/{call_id}", next_status=S.RUNNING
            )
        effect = self.effects.get(tool.name)
        if effect is None or call_id is None:
            return
        arguments = _arguments(getattr(context, "tool_arguments", None))
        op = self.execution.operation(
            f"{self.execution.execution_id}/{call_id}",
            connector=effect.connector,
            idempotency_key=effect.key(arguments),
        )
        timeout = effect.reply_timeout
        if timeout is None and getattr(tool, "timeout_seconds", None):
            timeout = float(tool.timeout_seconds)
        self._status(S.WAITING_FOR_TOOL)
        op.sent(reply_due=timeout)
        self._calls[call_id] = _Call(tool.name, op)

    def _tool_ended(self, context: Any, tool: Any, result: Any) -> None:
        call = self._calls.pop(getattr(context, "tool_call_id", None) or "", None)
        if call is None:
            return
        effect = self.effects[call.tool_name]
        if not self._no_reply(effect, tool, result):
            ref = effect.effect_ref(result) if effect.effect_ref else None
            if ref is not None:
                call.op.verified(effect_ref=ref)
            else:
                call.op.acknowledged()
        if not self._calls:
            self._status(S.RUNNING)

    @staticmethod
    def _no_reply(effect: Effect, tool: Any, result: Any) -> bool:
        """Whether ``result`` is the SDK's stand-in for an answer that never came (its
        timeout message, its default error message) or one the effect says is not the
        connector's."""
        if effect.no_reply is not None and effect.no_reply(result):
            return True
        if not isinstance(result, str):
            return False
        if result == agents.default_tool_error_function(None, Exception()):
            return True
        timeout = getattr(tool, "timeout_seconds", None)
        return timeout is not None and result == agents.tool.default_tool_timeout_error_message(
            tool_name=tool.name, timeout_seconds=timeout
        )
