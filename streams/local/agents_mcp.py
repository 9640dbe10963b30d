"""The MCP play of ``streams.local.agents``, in a module of its own: the MCP server reads its
tools' annotations at run time (the ``Context`` parameter), so this module imports MCP at the
top and does not postpone annotations. Imported only when the MCP agent is played."""

from typing import Any

from mcp import Client, types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from streams.adapters import Approval
from streams.adapters.mcp import ElicitationRecorder
from streams.local.agent_cases import Case, ScriptClock
from streams.recorder import Recorder


class Confirm(BaseModel):
    """What the payments server asks the user to confirm."""

    confirm: bool


def payments_server() -> MCPServer:
    """An MCP server whose ``refund`` tool asks the user (an elicitation) before it refunds,
    and returns the user's answer."""
    server = MCPServer("payments")

    @server.tool()
    async def refund(order_id: str, amount: int, ctx: Context) -> str:
        answer = await ctx.elicit(f"Refund {amount} on {order_id}?", Confirm)
        return answer.action

    return server


async def play(recorder: Recorder, clock: ScriptClock, prefix: str) -> list[Case]:
    """The payments server called twice in process, the user's answers scripted."""
    server = payments_server()
    cases = []
    for name, action, expect in (
        ("mcp-cancel", "cancel", "CLOSED_BY_CANCEL"),
        ("mcp-decline", "decline", "CLOSED_BY_DECLINE"),
    ):

        async def ask(_context: Any, _params: Any, action: str = action) -> Any:
            clock.advance(15)  # the user reads the question
            return types.ElicitResult(action=action)  # type: ignore[arg-type]

        ex = f"{prefix}{name}"
        vigil = ElicitationRecorder(
            recorder.execution(ex),
            ask,
            server="payments",
            approval=Approval(approver="role:payments-lead"),
            heartbeat_every=None,
            statuses=True,
        )
        vigil.execution.status("running")
        async with Client(server, elicitation_callback=vigil, mode="legacy") as client:
            await vigil.call_tool(client, "refund", {"order_id": "o-7", "amount": 12})
        clock.advance(2)
        cases.append(Case(ex, f"MCP elicitation answered {action}", expect))
    return cases
