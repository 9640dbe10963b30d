"""The framework adapters with the real frameworks installed and no broker: each adapter's
facts, as the recorder builds them, for scripted runs of an OpenAI Agents SDK agent, a
LangGraph graph and an MCP client session (tests/test_adapters_kafka.py takes the same agents
through the real worker)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.adapters import Approval, decision_code
from streams.contracts.models.base import Record
from streams.contracts.models.enums import DecisionCode, OperationEventKind
from streams.contracts.models.events import (
    ApprovalDecision,
    ApprovalDelivery,
    ApprovalRequested,
    ExecutionStatusChanged,
    OperationEvent,
    RequesterHeartbeat,
    ResumeReceipt,
)
from streams.local.agent_cases import ScriptClock
from streams.recorder import Recorder, RecorderSettings, action_digest
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 7, 1, 12, tzinfo=UTC)


class Capture(Recorder):
    """A recorder pointed at nothing that keeps what it is given: the adapters' facts, built
    and validated by the real recorder, without a broker."""

    def __init__(self, tmp: Path, clock: ScriptClock) -> None:
        settings = replace(
            Settings(), bootstrap_servers="127.0.0.1:9", schema_registry_url="http://127.0.0.1:9"
        )
        rs = replace(RecorderSettings(), spool_dir=str(tmp / "spool"), close_timeout=0)
        super().__init__(settings, recorder_settings=rs, clock=clock, exit_hook=False)
        self.records: list[Record] = []

    def record(self, record: Record) -> Record:
        self.records.append(record)
        return record

    def of(self, kind: type[Record], execution_id: str | None = None) -> list[Any]:
        return [
            r
            for r in self.records
            if isinstance(r, kind) and execution_id in (None, getattr(r, "execution_id", None))
        ]

    def statuses(self, execution_id: str) -> list[str]:
        return [r.status.value for r in self.of(ExecutionStatusChanged, execution_id)]


@pytest.fixture
def rec(tmp_path: Path) -> Any:
    recorder = Capture(tmp_path, ScriptClock(T0))
    yield recorder
    recorder.close(0)


# ---------------------------------------------------------------------------------------------
# The decision vocabulary


@given(st.sampled_from(["accept", "decline", "cancel"]), st.sampled_from([str.lower, str.upper]))
def test_answers_are_read_as_themselves_whatever_their_case(word: str, case: Any) -> None:
    code = decision_code(case(word))
    assert code.value == word.upper()
    assert decision_code({"action": case(word)}) is code  # MCP's ElicitResult.action
    assert decision_code({"decision": code}) is code


def test_a_cancel_is_never_a_decline_and_unreadable_answers_are_refused() -> None:
    assert decision_code("cancel") is DecisionCode.CANCEL
    assert decision_code(True) is DecisionCode.ACCEPT
    assert decision_code(False) is DecisionCode.DECLINE
    for bad in ("timeout", "", None, 1, {"x": "accept"}, "UNRECOGNIZED", "yes"):
        with pytest.raises(ValueError, match="decision"):
            decision_code(bad)


def test_vigil_imports_without_the_extras_and_an_adapter_names_its_extra() -> None:
    """With the frameworks hidden, vigil's CLI and the adapters package still import, and an
    adapter module says which extra to install."""
    code = (
        "import sys\n"
        "for name in ('agents', 'langgraph', 'mcp'):\n"
        "    sys.modules[name] = None\n"
        "import streams.cli.main, streams.adapters, streams.local.agents\n"
        "for mod, extra in (('openai_agents', 'openai-agents'), ('langgraph', 'langgraph'),"
        " ('mcp', 'mcp')):\n"
        "    try:\n"
        "        __import__('streams.adapters.' + mod)\n"
        "    except ImportError as err:\n"
        "        assert f'vigil[{extra}]' in str(err), err\n"
        "    else:\n"
        "        raise SystemExit(mod + ' imported without its framework')\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# OpenAI Agents SDK

openai_agents = pytest.importorskip("streams.adapters.openai_agents")


def _refund_tools(calls: list[str]) -> list[Any]:
    from agents import function_tool

    @function_tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order."""
        calls.append(f"refund {order_id}")
        return "refunded"

    @function_tool(timeout=0.05)
    async def send_sms(to: str, text: str) -> str:
        """Text a customer."""
        calls.append(f"sms {text}")
        if text == "slow":
            await asyncio.sleep(5)
        return "receipt sms-1"

    return [refund, send_sms]


def _agent(steps: list[Any], tools: list[Any]) -> Any:
    from agents import Agent
    from agents.testing import ScriptedModel

    return Agent(name="refunds", model=ScriptedModel(steps), tools=tools)


def _config() -> Any:
    from agents import RunConfig

    return RunConfig(tracing_disabled=True)


def test_agents_effect_calls_are_operations_and_a_timeout_records_no_reply(rec: Capture) -> None:
    """A declared effect tool is one operation per call, keyed as declared; the SDK's
    timeout message is no reply (the operation stays SENT, vigil makes it UNKNOWN at its
    deadline, the tool's own timeout); a result is ACKNOWLEDGED, or VERIFIED when the effect
    reads the source's reference out of it. An undeclared tool records nothing."""
    from agents.testing import assistant_message, function_call

    calls: list[str] = []
    steps = [
        [function_call("send_sms", {"to": "+1", "text": "slow"}, call_id="c1")],
        [function_call("send_sms", {"to": "+1", "text": "hi"}, call_id="c2")],
        [assistant_message("done")],
    ]
    effect = openai_agents.Effect(
        connector="sms",
        idempotency_key=lambda a: f"sms:{a['to']}",
        effect_ref=lambda r: r.split()[-1] if r.startswith("receipt") else None,
    )
    vigil = openai_agents.AgentsRecorder(rec.execution("ex-1"), effects={"send_sms": effect})
    result = asyncio.run(vigil.run(_agent(steps, _refund_tools(calls)), "go", run_config=_config()))
    assert result.final_output == "done" and calls == ["sms slow", "sms hi"]
    ops = [(o.operation_id, o.kind, o.idempotency_key) for o in rec.of(OperationEvent)]
    assert ops == [
        ("ex-1/c1", OperationEventKind.SENT, "sms:+1"),
        ("ex-1/c2", OperationEventKind.SENT, "sms:+1"),
        ("ex-1/c2", OperationEventKind.VERIFIED, "sms:+1"),
    ]
    sent = rec.of(OperationEvent)[0]
    assert sent.reply_due_at is not None and (sent.reply_due_at - T0).total_seconds() == 0.05
    assert rec.of(OperationEvent)[2].effect_ref == "sms-1"
    assert rec.statuses("ex-1") == [
        "RUNNING",
        "WAITING_FOR_TOOL",
        "RUNNING",
        "WAITING_FOR_TOOL",
        "RUNNING",
        "VALIDATING_OUTPUT",
        "COMPLETED",
    ]


def test_agents_interruption_is_a_request_whose_handle_names_the_saved_state(
    rec: Capture, tmp_path: Path
) -> None:
    """The run stops on a tool that needs approval: WAITING_FOR_APPROVAL, one request with
    the digest of the tool's name and arguments, the approver of its Approval, and the
    resume handle the state store returned for the serialised RunState (a heartbeat with it).
    The approve is an accept; a resume in another process, from the state the handle names,
    records the receipt when it invokes the approved call."""
    from agents import RunState
    from agents.testing import assistant_message, function_call

    calls: list[str] = []
    tools = _refund_tools(calls)
    steps = [
        [function_call("refund", {"order_id": "o-1", "amount": 5}, call_id="c9")],
        [assistant_message("refunded")],
    ]
    agent = _agent(steps, tools)
    store = openai_agents.FileStateStore(tmp_path / "states")
    approvals = {"refund": Approval(approver="role:lead", risk="high", policy="refunds")}
    first = openai_agents.AgentsRecorder(
        rec.execution("ex-2"), approvals=approvals, state_store=store
    )
    result = asyncio.run(first.run(agent, "refund o-1", run_config=_config()))
    (req,) = rec.of(ApprovalRequested, "ex-2")
    assert (req.request_id, req.action, req.approver_ref, req.risk, req.policy) == (
        "ex-2/c9",
        "refund",
        "role:lead",
        "HIGH",
        "refunds",
    )
    assert req.action_digest == action_digest("refund", {"order_id": "o-1", "amount": 5})
    assert req.resume_handle is not None and req.resume_handle.startswith("openai-agents-runstate:")
    assert rec.of(RequesterHeartbeat, "ex-2")[-1].resume_handle == req.resume_handle
    assert rec.statuses("ex-2") == ["RUNNING", "WAITING_FOR_APPROVAL"]
    assert first.interrupted(result)[0].request_id == req.request_id  # recorded once
    assert len(rec.of(ApprovalRequested, "ex-2")) == 1 and calls == []

    # another process: the state from the store, a new adapter, the approval, the resume
    async def resume() -> Any:
        state = await RunState.from_string(agent, store.load(req.resume_handle))
        later = openai_agents.AgentsRecorder(
            rec.execution("ex-2"), approvals=approvals, state_store=store
        )
        for item in state.get_interruptions():
            later.approve(state, item)
        return await later.resume(agent, state, run_config=_config())

    assert asyncio.run(resume()).final_output == "refunded"
    (decision,) = rec.of(ApprovalDecision, "ex-2")
    assert decision.decision is DecisionCode.ACCEPT
    assert decision.action_digest == req.action_digest
    (receipt,) = rec.of(ResumeReceipt, "ex-2")
    assert receipt.request_id == req.request_id and calls == ["refund o-1"]
    assert rec.statuses("ex-2")[2:] == ["RUNNING", "VALIDATING_OUTPUT", "COMPLETED"]


def test_agents_reject_is_a_decline_and_no_store_means_no_resume_handle(rec: Capture) -> None:
    from agents.testing import assistant_message, function_call

    calls: list[str] = []
    steps = [
        [function_call("refund", {"order_id": "o-2", "amount": 1}, call_id="c1")],
        [assistant_message("not refunded")],
    ]
    agent = _agent(steps, _refund_tools(calls))
    vigil = openai_agents.AgentsRecorder(rec.execution("ex-3"))
    result = asyncio.run(vigil.run(agent, "refund o-2", run_config=_config()))
    (req,) = rec.of(ApprovalRequested, "ex-3")
    assert req.resume_handle is None  # nothing durable holds the state: ORPHANED_WAIT
    for item in result.interruptions:
        vigil.reject(vigil.state, item)
    asyncio.run(vigil.resume(agent, vigil.state, run_config=_config()))
    assert [d.decision for d in rec.of(ApprovalDecision, "ex-3")] == [DecisionCode.DECLINE]
    assert rec.of(ResumeReceipt, "ex-3") == [] and calls == []


def test_agents_run_that_raises_is_failed(rec: Capture) -> None:
    from agents.testing import ModelStep

    vigil = openai_agents.AgentsRecorder(rec.execution("ex-4"))
    agent = _agent([ModelStep.raise_error(RuntimeError("provider down"))], [])
    with pytest.raises(RuntimeError):
        asyncio.run(vigil.run(agent, "go", run_config=_config()))
    assert rec.statuses("ex-4") == ["RUNNING", "FAILED"]
    assert rec.of(ExecutionStatusChanged, "ex-4")[-1].reason == "RuntimeError"


# ---------------------------------------------------------------------------------------------
# LangGraph

lg = pytest.importorskip("streams.adapters.langgraph")


def test_durability_follows_the_checkpointer(tmp_path: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    assert lg.durable_checkpointer(InMemorySaver()) is False
    assert lg.durable_checkpointer(None) is False
    on_disk = sqlite3.connect(tmp_path / "c.sqlite", check_same_thread=False)
    in_memory = sqlite3.connect(":memory:", check_same_thread=False)
    assert lg.durable_checkpointer(SqliteSaver(on_disk)) is True
    assert lg.durable_checkpointer(SqliteSaver(in_memory)) is False


@pytest.mark.parametrize("saver", ["sqlite", "memory"])
def test_langgraph_interrupt_decision_and_receipt(rec: Capture, tmp_path: Path, saver: str) -> None:
    """interrupt() is a request (digest of the value's action and arguments); its resume
    handle is the thread and checkpoint on SQLite and none in memory; Command(resume=...)
    is the decision and the node finishing past its interrupt the receipt; nodes are
    heartbeats; the caller's stream chunks are what LangGraph would have yielded."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    from streams.local.agents import deploy_graph

    checkpointer = (
        SqliteSaver(sqlite3.connect(tmp_path / "c.sqlite", check_same_thread=False))
        if saver == "sqlite"
        else InMemorySaver()
    )
    graph = deploy_graph(checkpointer)
    config = {"configurable": {"thread_id": "th-1"}}
    vigil = lg.GraphRecorder(rec.execution("ex-g"), approval=Approval(approver="role:ops"))
    chunks = list(vigil.stream(graph, {"service": "api"}, config))
    assert chunks[0] == {"plan": {"service": "api"}}  # "updates", no "tasks" chunk leaked
    assert len(chunks) == 2 and "__interrupt__" in chunks[1]
    (req,) = rec.of(ApprovalRequested)
    interrupt_id = graph.get_state(config).interrupts[0].id
    assert req.request_id == f"ex-g/{interrupt_id}"
    assert req.action_digest == action_digest("deploy", {"service": "api", "version": "1.4"})
    checkpoint = graph.get_state(config).config["configurable"]["checkpoint_id"]
    if saver == "sqlite":
        assert req.resume_handle == f"langgraph:thread=th-1;ns=;checkpoint={checkpoint}"
    else:
        assert req.resume_handle is None
    assert rec.statuses("ex-g") == ["RUNNING", "WAITING_FOR_APPROVAL"]
    values = vigil.invoke(graph, Command(resume="cancel"), config)
    assert values["deployed"] == ""
    assert [d.decision for d in rec.of(ApprovalDecision)] == [DecisionCode.CANCEL]
    assert [r.request_id for r in rec.of(ResumeReceipt)] == [req.request_id]
    assert rec.statuses("ex-g")[2:] == ["RUNNING", "VALIDATING_OUTPUT", "COMPLETED"]
    assert len(rec.of(RequesterHeartbeat)) >= 4  # plan, gate (twice), deploy, the request


def test_langgraph_resume_value_that_is_no_decision_is_refused_before_running(
    rec: Capture,
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from streams.local.agents import deploy_graph

    graph = deploy_graph(InMemorySaver())
    config = {"configurable": {"thread_id": "th-2"}}
    vigil = lg.GraphRecorder(rec.execution("ex-h"))
    vigil.invoke(graph, {"service": "api"}, config)
    with pytest.raises(ValueError, match="decision"):
        vigil.invoke(graph, Command(resume="maybe later"), config)
    assert graph.get_state(config).next == ("gate",)  # still waiting, nothing resumed
    assert rec.of(ApprovalDecision) == []


# ---------------------------------------------------------------------------------------------
# MCP elicitation

pytest.importorskip("streams.adapters.mcp")


@pytest.mark.parametrize("answer", ["accept", "decline", "cancel"])
def test_mcp_answer_is_the_decision_in_the_same_vocabulary(rec: Capture, answer: str) -> None:
    """The client's answer to the elicitation is the decision as it was given (a cancel stays
    a cancel); the request names the tool being called; the tool's return is the receipt."""
    import anyio

    from streams.local import agents_mcp

    async def play() -> Any:
        from mcp import Client, types

        from streams.adapters.mcp import ElicitationRecorder

        seen = []

        async def ask(_c: Any, params: Any) -> Any:
            seen.append(params.message)
            content = {"confirm": True} if answer == "accept" else None
            return types.ElicitResult(action=answer, content=content)  # type: ignore[arg-type]

        vigil = ElicitationRecorder(rec.execution("ex-m"), ask, server="payments")
        server = agents_mcp.payments_server()
        async with Client(server, elicitation_callback=vigil, mode="legacy") as c:
            out = await vigil.call_tool(c, "refund", {"order_id": "o-7", "amount": 12})
        return seen, out

    seen, out = anyio.run(play)
    assert seen == ["Refund 12 on o-7?"]
    assert out.structured_content == {"result": answer}
    (req,) = rec.of(ApprovalRequested)
    assert (req.request_id, req.action, req.resume_handle) == (
        "ex-m/mcp/1",
        "refund",
        "mcp:payments:request=1",
    )
    assert [d.outcome for d in rec.of(ApprovalDelivery)] == ["DELIVERED"]
    assert [d.decision.value for d in rec.of(ApprovalDecision)] == [answer.upper()]
    assert [r.request_id for r in rec.of(ResumeReceipt)] == ["ex-m/mcp/1"]
    assert rec.statuses("ex-m") == []  # statuses are the agent loop's unless asked


def test_mcp_error_answer_is_no_decision(rec: Capture) -> None:
    import anyio

    from streams.local import agents_mcp

    async def play() -> None:
        from mcp import Client, types

        from streams.adapters.mcp import ElicitationRecorder

        async def ask(_c: Any, _p: Any) -> Any:
            return types.ErrorData(code=types.INVALID_REQUEST, message="no user here")

        vigil = ElicitationRecorder(rec.execution("ex-e"), ask, heartbeat_every=None)
        server = agents_mcp.payments_server()
        async with Client(server, elicitation_callback=vigil, mode="legacy") as c:
            await vigil.call_tool(c, "refund", {"order_id": "o-8", "amount": 1})

    with pytest.raises(ExceptionGroup):  # the server's tool fails without an answer
        anyio.run(play)
    assert len(rec.of(ApprovalRequested)) == 1
    assert rec.of(ApprovalDecision) == [] and rec.of(ResumeReceipt) == []


def test_demo_refuses_a_framework_it_has_no_agent_for() -> None:
    """``vigil demo --agent`` names the frameworks it can play, and --help lists the option;
    nothing is started for a bad value."""
    from typer.testing import CliRunner

    from streams.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--agent", "crewai"])
    assert result.exit_code == 2
    assert "langgraph, openai-agents, mcp" in result.output
    helped = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0 and "--agent" in helped.output


def test_langgraph_async_run_records_the_same_facts(rec: Capture, tmp_path: Path) -> None:
    """``ainvoke``/``aheartbeat`` on an async SQLite checkpointer: the same request, handle,
    decision and receipt as the sync path (its durability is the saver's: not in memory)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.types import Command

    from streams.local.agents import deploy_graph

    async def run() -> Any:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
            graph = deploy_graph(saver)
            config = {"configurable": {"thread_id": "th-a"}}
            vigil = lg.GraphRecorder(rec.execution("ex-a"))
            await vigil.ainvoke(graph, {"service": "api"}, config)
            await vigil.aheartbeat(graph, config)
            return await vigil.ainvoke(graph, Command(resume="accept"), config)

    assert asyncio.run(run())["deployed"] == "api"
    (req,) = rec.of(ApprovalRequested)
    assert req.resume_handle is not None and req.resume_handle.startswith("langgraph:thread=th-a;")
    assert [d.decision for d in rec.of(ApprovalDecision)] == [DecisionCode.ACCEPT]
    assert [r.request_id for r in rec.of(ResumeReceipt)] == [req.request_id]
    assert rec.statuses("ex-a")[-1] == "COMPLETED"
