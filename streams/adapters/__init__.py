"""Adapters from the frameworks agents are built with to the recorder (``streams.recorder``).

One module per framework, each an optional extra, each importing its framework only when the
module itself is imported, so vigil without the extra still imports:

- ``streams.adapters.openai_agents`` (``pip install vigil[openai-agents]``): run hooks and the
  interrupt / approve / reject / resume cycle of the OpenAI Agents SDK;
- ``streams.adapters.langgraph`` (``vigil[langgraph]``): ``interrupt()``, the checkpointer and
  ``Command(resume=...)`` of a LangGraph graph;
- ``streams.adapters.mcp`` (``vigil[mcp]``): the client's answer to an MCP elicitation.

What every adapter records, and how each framework's lifecycle maps onto the four proofs of a
valid wait, is in topology.md ("Recording from agent frameworks"); the rules are
docs/rules.md#approval-waits.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType

from streams.contracts.models.enums import DecisionCode

__all__ = ["Approval", "MissingExtra", "decision_code", "require"]


@dataclass(frozen=True)
class Approval:
    """Who decides an action that needs approval, and under which policy: the request's
    fields (docs/rules.md#the-four-proofs, docs/rules.md#thresholds). ``risk`` is ``"low"``
    or ``"high"`` (a HIGH request needs the approver's acknowledgement for a verified route);
    the durations are ``timedelta`` or seconds, none: the policy's or vigil's defaults."""

    approver: str | None = None
    risk: str = "low"
    policy: str | None = None
    expires: timedelta | float | None = None
    grace: timedelta | float | None = None
    heartbeat_fresh: timedelta | float | None = None
    delivery_deadline: timedelta | float | None = None


class MissingExtra(ImportError):
    """The framework of an adapter is not installed; the message names the extra."""


def require(module: str, extra: str) -> ModuleType:
    """``module`` imported, or ``MissingExtra`` saying which extra installs it. Why: an adapter
    used without its framework should say what to install, not fail on a bare import deep in
    the adapter."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(
            f"{module} is not installed: pip install 'vigil[{extra}]' for this adapter"
        ) from err


def decision_code(value: object) -> DecisionCode:
    """A framework's answer as vigil's decision vocabulary (docs/rules.md#decisions).

    Accepted: ``"accept"``, ``"decline"``, ``"cancel"`` (any case) or a ``DecisionCode``;
    ``True`` / ``False`` (an approve / reject button); a mapping with a ``"decision"`` or
    ``"action"`` key holding one of these (MCP's ``ElicitResult.action`` is named so).
    Anything else raises ``ValueError`` rather than being guessed at: reading a dismissal as a
    decline, or an unknown answer as an accept, would give the wrong verdict.
    """
    if isinstance(value, bool):
        return DecisionCode.ACCEPT if value else DecisionCode.DECLINE
    if isinstance(value, dict):
        for key in ("decision", "action"):
            if key in value:
                return decision_code(value[key])
    if isinstance(value, str):
        text = value.strip().upper()
        if text in ("ACCEPT", "DECLINE", "CANCEL"):
            return DecisionCode(text)
    raise ValueError(
        f"decision: {value!r} is not an answer vigil can read: give 'accept', 'decline' or "
        "'cancel', True/False, or a mapping with a 'decision' key"
    )
