"""The MCP elicitation adapter (``pip install vigil[mcp]``).

    from mcp import Client
    from streams.adapters import Approval
    from streams.adapters.mcp import ElicitationRecorder

    async def ask(context, params):            # the client's own way of asking the user
        ...
        return types.ElicitResult(action="cancel")

    vigil = ElicitationRecorder(recorder.execution("exec-1"), ask, server="payments",
                                approval=Approval(approver="role:payments-lead"))
    async with Client(server, elicitation_callback=vigil) as client:
        result = await vigil.call_tool(client, "refund", {"order_id": "o-42"})

An elicitation is a server asking the user, through the client, for an answer while one of its
requests (usually a tool call) waits: an approval wait. The adapter is the client's
``elicitation_callback`` around the client's own (``ask``), and records (topology.md,
"Recording from agent frameworks"):

- **The request**, when the elicitation reaches the client: id ``<execution>/mcp/<n>`` (the
  n-th elicitation this adapter saw), or ``<execution>/mcp/<elicitation id>`` in URL mode; the
  action is the tool being called through ``call_tool`` (else ``"mcp.elicitation"``), its
  material arguments the tool's arguments and what the server asks (message, schema or URL);
  the resume handle is the server's request waiting on this live session
  (``mcp:<server>:request=<id>``). Its delivery: the client has the question and puts it to
  the user (DELIVERED).
- **Heartbeats** while the user decides (every ``heartbeat_every`` seconds): the session that
  will carry the answer is alive.
- **The decision**: the ``ElicitResult``'s action, in MCP's own vocabulary, which is vigil's:
  accept, decline, cancel. A cancel (the user dismissed the question) is recorded as a cancel,
  never as a decline, so vigil says CLOSED_BY_CANCEL, not CLOSED_BY_DECLINE
  (docs/rules.md#decisions).
  An ``ErrorData`` answer or an exception of ``ask`` is no decision: the wait is abandoned,
  its heartbeats stop, and vigil says ORPHANED_WAIT once they are stale.
- **The receipt**: the tool call that was waiting returns (``call_tool``): the server took the
  answer and went on.

Statuses are left to the agent loop around the session (an OpenAI Agents or LangGraph run has
its own adapter), unless ``statuses=True``: then WAITING_FOR_APPROVAL while the user decides
and RUNNING after.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.adapters import Approval, decision_code, require
from streams.contracts.models.enums import ExecutionStatus
from streams.recorder import ApprovalRun, ExecutionRun

require("mcp", "mcp")
import anyio  # noqa: E402
from mcp import types  # noqa: E402

__all__ = ["ElicitationRecorder"]

Ask = Callable[[Any, Any], Awaitable[Any]]


@dataclass
class ElicitationRecorder:
    """An MCP client's ``elicitation_callback`` recording each elicitation of one execution
    (``execution``, a recorder's ``ExecutionRun``) as an approval wait; ``ask`` is the
    client's own callback, which asks the user."""

    execution: ExecutionRun
    ask: Ask
    #: the server's name in the resume handle
    server: str = "server"
    approval: Approval = field(default_factory=Approval)
    #: seconds between heartbeats while the user decides; None: only the one at the request
    heartbeat_every: float | None = 60.0
    statuses: bool = False
    _n: Any = field(default_factory=lambda: itertools.count(1))
    _tool: tuple[str, Mapping[str, Any]] | None = None
    _answered: list[ApprovalRun] = field(default_factory=list)

    async def __call__(self, context: Any, params: Any) -> Any:
        req = self._request(context, params)
        handle = req.requested.resume_handle if req.requested is not None else None
        # the client has the question and puts it to the user now
        req.delivered(route="mcp-client")
        self.execution.heartbeat(resume_handle=handle)
        if self.statuses:
            self.execution.status(ExecutionStatus.WAITING_FOR_APPROVAL)
        result = await self._asking(context, params)
        if isinstance(result, types.ErrorData):
            # no answer: not a decision (a timeout or a refusal is never a decline); the wait
            # is abandoned, its heartbeats stop, and vigil says ORPHANED_WAIT
            return result
        req.decided(decision_code({"action": result.action}))
        self._answered.append(req)
        if self.statuses:
            self.execution.status(ExecutionStatus.RUNNING)
        return result

    async def call_tool(
        self, client: Any, name: str, arguments: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """``client.call_tool(name, arguments)``; the elicitations answered during it get
        their resume receipt when it returns (the server took the answers)."""
        previous, self._tool = self._tool, (name, dict(arguments or {}))
        answered_before = len(self._answered)
        try:
            result = await client.call_tool(name, arguments, **kwargs)
        finally:
            self._tool = previous
        for req in self._answered[answered_before:]:
            req.resumed()
        del self._answered[answered_before:]
        return result

    def _request(self, context: Any, params: Any) -> ApprovalRun:
        mode = getattr(params, "mode", "form")
        eid = getattr(params, "elicitation_id", None) if mode == "url" else None
        rid = f"{self.execution.execution_id}/mcp/{eid or next(self._n)}"
        asked: dict[str, Any] = {"message": params.message}
        if mode == "url":
            asked["url"] = params.url
        else:
            asked["requested_schema"] = _plain(getattr(params, "requested_schema", None))
        if self._tool is not None:
            action, tool_arguments = self._tool
            arguments: dict[str, Any] = {"tool_arguments": _plain(tool_arguments), **asked}
        else:
            action, arguments = "mcp.elicitation", asked
        spec = self.approval
        return self.execution.approval(
            rid,
            action=action,
            arguments=arguments,
            approver=spec.approver,
            resume_handle=f"mcp:{self.server}:request={getattr(context, 'request_id', None)}",
            risk=spec.risk,
            policy=spec.policy,
            expires=spec.expires,
            grace=spec.grace,
            heartbeat_fresh=spec.heartbeat_fresh,
            delivery_deadline=spec.delivery_deadline,
        )

    async def _asking(self, context: Any, params: Any) -> Any:
        """``ask``, with a heartbeat every ``heartbeat_every`` seconds while it runs."""
        if not self.heartbeat_every:
            return await self.ask(context, params)
        out: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def beat() -> None:
                while True:
                    await anyio.sleep(self.heartbeat_every or 0)
                    self.execution.heartbeat()

            tg.start_soon(beat)
            try:
                out.append(await self.ask(context, params))
            finally:
                tg.cancel_scope.cancel()
        return out[0]


def _plain(value: Any) -> Any:
    """A pydantic model or mapping as plain JSON data (the digest takes nothing else)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value
