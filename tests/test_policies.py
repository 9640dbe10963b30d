"""Thresholds from configuration: per request, else per action policy, else defaults."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from streams.core.approvals import resolve_thresholds
from streams.engine.processor import Processor, Stores
from streams.local.scenario import Tick
from streams.policies import PolicyError, load_policies
from tests.test_processor import TOPICS, env, ticks

DEFAULTS = dict(
    grace=timedelta(minutes=5),
    heartbeat_fresh=timedelta(minutes=10),
    delivery_deadline=timedelta(minutes=5),
    reply_timeout=timedelta(seconds=30),
    verify_timeout=timedelta(minutes=5),
)


def test_policy_file_refines_defaults(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(
        json.dumps(
            {
                "approval_policies": {"deploy": {"grace": "2h"}},
                "connectors": {"bank": {"verify_timeout": "6h"}},
            }
        )
    )
    p = load_policies(f, **DEFAULTS)
    assert p.approval_policies["deploy"].grace == timedelta(hours=2)
    assert p.operations.timeouts("bank") == (timedelta(seconds=30), timedelta(hours=6))
    assert p.operations.timeouts("sms") == (timedelta(seconds=30), timedelta(minutes=5))


def test_bad_policy_file_says_where(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"approval_policies": {"deploy": {"grace": "soon"}}}))
    with pytest.raises(PolicyError, match=r"p\.json"):
        load_policies(f, **DEFAULTS)


def test_action_policy_changes_the_stream_verdict(tmp_path: Path) -> None:
    """The reference deploy request is STUCK after 5 minutes of grace; under a deploy policy
    with a two-hour grace the same facts are RESUMING."""
    from streams.contracts.models.outputs import ApprovalVerdict
    from streams.local.scenario import REFERENCE_AT, reference_audit_lines, snapshot_events

    (deploy,) = [x for x in reference_audit_lines() if x.request_id == "req-deploy"]
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"approval_policies": {"deploy": {"grace": "2h"}}}))
    p = load_policies(f, **DEFAULTS)
    for policies, expected in ((None, "STUCK_AFTER_DECISION"), (p, "RESUMING")):
        proc = Processor(
            TOPICS, Stores(), policies=policies.approval_policies if policies else None
        )
        out = []
        for e in snapshot_events(deploy):
            out += [x.record for x in proc.handle(env(e))]
        out += ticks(proc, Tick(REFERENCE_AT + timedelta(seconds=1)).at)
        verdicts = [r for r in out if isinstance(r, ApprovalVerdict)]
        assert str(verdicts[-1].verdict) == expected
    assert resolve_thresholds(None, p.approval_policies).grace == timedelta(minutes=5)
