"""Real agents of each framework, scripted and offline, recording through their adapters.

``vigil demo --agent FRAMEWORK`` plays them against a live worker, and the end-to-end tests
(tests/test_adapters_kafka.py) check the verdicts vigil publishes on them. No model provider
is called: the OpenAI Agents run takes its turns from the SDK's ``ScriptedModel``, the
LangGraph graph has no LLM in it, and the MCP server runs in process. Each framework is
imported only when its agent is played (its extra installed).

Every play takes the recorder and a ``ScriptClock`` (the recorder's clock, moved by the play
between the steps a real run would spread over minutes), records one execution per case, and
returns the cases: execution id → what vigil should say about it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

from streams.local.agent_cases import Case, ScriptClock
from streams.recorder import Recorder

FRAMEWORKS = ("langgraph", "openai-agents", "mcp")

__all__ = ["FRAMEWORKS", "PLAYS", "Case", "ScriptClock", "deploy_graph", "play_live"]


# ---------------------------------------------------------------------------------------------
# LangGraph: plan → gate (interrupt) → deploy


class DeployState(TypedDict, total=False):
    service: str
    approved: bool
    deployed: str


def deploy_graph(checkpointer: Any) -> Any:
    """A graph without an LLM: it plans a deploy, asks a human at ``gate`` through
    ``interrupt()``, and deploys when the answer is an accept."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def plan(state: DeployState) -> DeployState:
        return {"service": state["service"]}

    def gate(state: DeployState) -> DeployState:
        answer = interrupt(
            {"action": "deploy", "arguments": {"service": state["service"], "version": "1.4"}}
        )
        return {"approved": answer == "accept"}

    def deploy(state: DeployState) -> DeployState:
        return {"deployed": state["service"] if state.get("approved") else ""}

    builder = StateGraph(DeployState)
    builder.add_node("plan", plan)
    builder.add_node("gate", gate)
    builder.add_node("deploy", deploy)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "gate")
    builder.add_edge("gate", "deploy")
    builder.add_edge("deploy", END)
    return builder.compile(checkpointer=checkpointer)


def play_langgraph(
    recorder: Recorder, clock: ScriptClock, workdir: Path, prefix: str
) -> list[Case]:
    """Three threads of the deploy graph: waiting on a human with a SQLite checkpointer
    (WAITING), the same with an in-memory saver (ORPHANED_WAIT: no durable handle), and one
    accepted and resumed (RESUMED)."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    from streams.adapters import Approval
    from streams.adapters.langgraph import GraphRecorder

    workdir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(workdir / "checkpoints.sqlite", check_same_thread=False)
    durable = deploy_graph(SqliteSaver(conn))
    volatile = deploy_graph(InMemorySaver())
    approval = Approval(approver="role:release-owner", grace=timedelta(minutes=1))
    cases = []
    for name, graph, resume, expect in (
        ("lg-sqlite-waiting", durable, False, "WAITING"),
        ("lg-memory-waiting", volatile, False, "ORPHANED_WAIT"),
        ("lg-sqlite-resumed", durable, True, "RESUMED"),
    ):
        ex = f"{prefix}{name}"
        config = {"configurable": {"thread_id": ex}}
        vigil = GraphRecorder(recorder.execution(ex), approval=approval)
        vigil.invoke(graph, {"service": "api"}, config)
        clock.advance(2)
        for req in vigil.requests():  # the notifier put the request in front of the approver
            req.delivered(route="slack:#releases")
        clock.advance(5)
        vigil.heartbeat(graph, config)
        if resume:
            clock.advance(10)
            vigil.invoke(graph, Command(resume="accept"), config)
        clock.advance(3)
        cases.append(Case(ex, f"LangGraph, {type(graph.checkpointer).__name__}", expect))
    conn.close()
    return cases


# ---------------------------------------------------------------------------------------------
# OpenAI Agents SDK: a refund agent


def play_openai_agents(
    recorder: Recorder, clock: ScriptClock, workdir: Path, prefix: str
) -> list[Case]:
    """Three runs of a refund agent: its refund approved and never resumed
    (STUCK_AFTER_DECISION after the grace), approved and resumed (RESUMED), and one whose SMS
    tool times out and is called again with the same idempotency key (the first call UNKNOWN
    with a work item, the second a FORBIDDEN_RETRY)."""
    return asyncio.run(_play_openai_agents(recorder, clock, workdir, prefix))


async def _play_openai_agents(
    recorder: Recorder, clock: ScriptClock, workdir: Path, prefix: str
) -> list[Case]:
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from streams.adapters import Approval
    from streams.adapters.openai_agents import AgentsRecorder, Effect, FileStateStore

    @function_tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order (needs a human's approval)."""
        return f"refunded {amount} on {order_id}"

    @function_tool(timeout=0.05)
    async def send_sms(to: str, text: str) -> str:
        """Text a customer; the provider sometimes never answers."""
        if text.startswith("slow"):
            await asyncio.sleep(5)
        return "queued"

    config = RunConfig(tracing_disabled=True)
    store = FileStateStore(workdir / "runstates")
    cases = []

    def vigil_for(ex: str) -> AgentsRecorder:
        return AgentsRecorder(
            recorder.execution(ex),
            effects={"send_sms": Effect(connector="sms", idempotency_key="to")},
            approvals={"refund": Approval(approver="role:payments-lead", grace=60)},
            state_store=store,
        )

    for name, resume in (("oa-approved-never-resumed", False), ("oa-approved-resumed", True)):
        ex = f"{prefix}{name}"
        model = ScriptedModel(
            [
                [function_call("refund", {"order_id": "o-42", "amount": 30}, call_id="call-1")],
                [assistant_message("refunded")],
            ]
        )
        agent = Agent(name="refunds", model=model, tools=[refund])
        vigil = vigil_for(ex)
        result = await vigil.run(agent, "refund order o-42", run_config=config)
        clock.advance(2)
        for req in vigil.interrupted(result):
            req.delivered(route="slack:#payments")
        clock.advance(20)
        for item in result.interruptions:
            vigil.approve(vigil.state, item)
        if resume:
            clock.advance(5)
            await vigil.resume(agent, vigil.state, run_config=config)
        expect = "RESUMED" if resume else "STUCK_AFTER_DECISION"
        cases.append(Case(ex, "OpenAI Agents SDK refund", expect))

    ex = f"{prefix}oa-sms-timeout-retry"

    def later(_call: Any) -> Any:
        clock.advance(60)  # the model takes a minute before it tries again
        return ModelStep(
            output=[
                function_call("send_sms", {"to": "+15550100", "text": "slow again"}, call_id="c-2")
            ]
        )

    model = ScriptedModel(
        [
            [function_call("send_sms", {"to": "+15550100", "text": "slow"}, call_id="c-1")],
            ModelStep.respond(later),
            [assistant_message("could not text the customer")],
        ]
    )
    agent = Agent(name="notifier", model=model, tools=[send_sms])
    await vigil_for(ex).run(agent, "tell the customer", run_config=config)
    clock.advance(5)
    cases.append(Case(ex, "OpenAI Agents SDK tool timeout, then a retry", "FORBIDDEN_RETRY"))
    return cases


# ---------------------------------------------------------------------------------------------
# MCP: a payments server that asks before it refunds


def play_mcp(recorder: Recorder, clock: ScriptClock, workdir: Path, prefix: str) -> list[Case]:
    """An in-process MCP server whose refund tool asks the user (elicitation) before it
    refunds, called twice: the user dismisses the question (CLOSED_BY_CANCEL), then declines
    it (CLOSED_BY_DECLINE)."""
    import anyio

    from streams.local.agents_mcp import play

    return anyio.run(play, recorder, clock, prefix)


PLAYS: dict[str, Callable[[Recorder, ScriptClock, Path, str], list[Case]]] = {
    "langgraph": play_langgraph,
    "openai-agents": play_openai_agents,
    "mcp": play_mcp,
}


def play_live(framework: str, settings: Any, codec: Any, workdir: Path) -> list[Case]:
    """``vigil demo --agent FRAMEWORK``: plays that framework's agent through a recorder on the
    demo's topics, its clock starting five minutes ago (the runs' minutes are played in a
    moment, then the demo's ticks bring time to now), and delivers every fact before it
    returns the cases."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from streams.recorder import RecorderSettings

    clock = ScriptClock(datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5))
    options = replace(RecorderSettings(), spool_dir=str(workdir / "spool"))
    recorder = Recorder(settings, recorder_settings=options, codec=codec, clock=clock)
    try:
        return PLAYS[framework](recorder, clock, workdir, f"{framework}-")
    finally:
        recorder.flush(30)
        recorder.close()
