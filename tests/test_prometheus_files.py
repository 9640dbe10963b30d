"""What ships for Prometheus and Grafana keeps its promises.

- docker/prometheus/prometheus.yml and rules.yml pass ``promtool check config`` / ``check
  rules``, and every alert rule has a ``promtool test rules`` unit test (tests/*.yml), run
  here (Debian's ``prometheus`` package has promtool; scripts/test.sh installs it).
- Every metric a rule or a dashboard query names is one a worker, the ticker, the alert
  bridge or the reconciler exports, as their metric registries say (built here as they build
  them), or one Prometheus makes itself (``up``, ``ALERTS``).
- The Grafana provisioning points at the dashboards directory and the Prometheus datasource
  the dashboards use.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "docker" / "prometheus"
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
RULE_TESTS = sorted((PROM / "tests").glob("*.yml"))
#: series Prometheus itself makes: a target's scrape health, and the alert rules' state
PROMETHEUS_SERIES = {"up", "ALERTS"}

PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: apt-get install prometheus (scripts/test.sh does)"
)


def promtool(*args: str) -> str:
    assert PROMTOOL is not None
    proc = subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, cwd=PROM, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


# --------------------------------------------------------------------------- exported names


def exported_names() -> set[str]:
    """Every series name the worker's, the ticker's, the alert bridge's and the reconciler's
    ``/metrics`` can show, from their registries: counters as ``_total`` (and ``_created``),
    histograms as ``_bucket``, ``_count`` and ``_sum``."""
    from streams.alert_bridge import BridgeStatus
    from streams.engine.processor import Processor, Stores
    from streams.kafka.offsets import OffsetGuard
    from streams.kafka.topics import Topics
    from streams.read.approval_index import ApprovalIndex
    from streams.read.metrics import Metrics
    from streams.read.web import _IndexCollector
    from streams.reconcile import ReconcilerStatus
    from streams.settings import Settings
    from streams.ticker import TickerStatus

    processor = Processor(Topics.from_settings(Settings(partitions=3)), Stores())
    worker = Metrics(processor, dict, OffsetGuard())
    worker.registry.register(_IndexCollector(ApprovalIndex(processor.stores.executions, 3)))  # type: ignore[arg-type]
    names: set[str] = set()
    registries = (
        worker.registry,
        TickerStatus(1.0).registry,
        BridgeStatus().registry,
        ReconcilerStatus().registry,
    )
    for registry in registries:
        for family in registry.collect():
            suffixes = {
                "counter": ("_total", "_created"),
                "histogram": ("_bucket", "_count", "_sum", "_created"),
                "summary": ("_count", "_sum", "_created", ""),
            }.get(family.type, ("",))
            names.update(family.name + s for s in suffixes)
            names.update(s.name for s in family.samples)
    return names


KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers that are not functions,
    keywords, label names (in braces or a by/on clause), strings or durations."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges
    # label lists (``sum by (x) (...)`` becomes ``sum (...)``, a function call)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", text):
        word = m.group(1)
        if word.lower() not in KEYWORDS:
            names.add(word)
    return names


def rule_expressions() -> dict[str, str]:
    """alert name -> expression, read from rules.yml (a plain-text reading of its layout:
    ``- alert:`` then ``expr:``, inline or as an indented block)."""
    lines = (PROM / "rules.yml").read_text().splitlines()
    out: dict[str, str] = {}
    alert = None
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert:\s*(\S+)", line):
            alert = m.group(1)
        elif (m := re.match(r"(\s*)expr:\s*(.*)$", line)) and alert:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in {">-", ">", "|", "|-"}:
                block = []
                for follow in lines[i + 1 :]:
                    if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                        break
                    block.append(follow.strip())
                rest = " ".join(block)
            out[alert] = rest
    return out


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expression) of every query of every dashboard."""
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def test_metric_names_of_promql() -> None:
    assert metric_names(
        'sum by (kind, le) (rate(a_total{x="y",z=~"q"}[5m])) > on () group_left () '
        "(10 * max(b_seconds)) or absent(c) and up == 0 unless time() - d offset 5m"
    ) == {"a_total", "b_seconds", "c", "up", "d"}


def test_every_rule_and_query_names_an_exported_metric() -> None:
    exported = exported_names() | PROMETHEUS_SERIES
    # the new clock metrics are in the registry, not only in a rule
    assert {
        "vigil_watermark_delay_seconds",
        "vigil_tick_age_seconds",
        "vigil_events_held_by_input",
        "vigil_ticker_last_tick_timestamp_seconds",
        "vigil_alert_bridge_posts_failed_total",
        "vigil_alert_bridge_posts_accepted_total",
        "process_cpu_seconds_total",
    } <= exported
    rules = rule_expressions()
    assert len(rules) >= 8
    queries = dashboard_queries()
    assert len(queries) >= 15
    unknown = []
    for alert, expr in rules.items():
        names = metric_names(expr)
        assert names, (alert, expr)
        unknown += [(alert, n) for n in sorted(names - exported)]
    for dashboard, title, expr in queries:
        names = metric_names(expr)
        assert names, (dashboard, title, expr)
        unknown += [(f"{dashboard}: {title}", n) for n in sorted(names - exported)]
    assert unknown == []


def test_dashboard_shows_pipeline_and_fleet() -> None:
    (dashboard,) = DASHBOARDS
    board = json.loads(dashboard.read_text())
    used = {n for _, _, expr in dashboard_queries() for n in metric_names(expr)}
    for needed in (
        "vigil_events_in_total",  # throughput
        "vigil_consumer_lag",
        "vigil_processing_latency_seconds_bucket",
        "vigil_watermark_delay_seconds",
        "vigil_verdicts_total",
        "vigil_operations_unknown",
        "vigil_work_items_open",
        "vigil_alerts_total",
        "ALERTS",
    ):
        assert needed in used, needed
    assert any(p["type"] == "heatmap" for p in board["panels"])
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "prometheus", panel["title"]


def test_grafana_provisioning_points_at_the_files() -> None:
    datasource = (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    assert "uid: prometheus" in datasource and "url: http://prometheus:9090" in datasource
    provider = (GRAFANA / "provisioning" / "dashboards" / "vigil.yml").read_text()
    assert "path: /var/lib/grafana/dashboards" in provider


def test_every_alert_rule_has_a_unit_test() -> None:
    rules = set(rule_expressions())
    tested: dict[str, set[str]] = {}
    for path in RULE_TESTS:
        text = path.read_text()
        assert "rule_files: [../rules.yml]" in text, path.name
        # per alert: fired (an expected alert) and stayed silent (exp_alerts: [])
        for block in re.split(r"\n\s*- eval_time:", text)[1:]:
            name = re.search(r"alertname:\s*(\S+)", block)
            assert name, path.name
            outcome = "silent" if "exp_alerts: []" in block else "fires"
            tested.setdefault(name.group(1), set()).add(outcome)
    assert set(tested) == rules
    for alert, outcomes in tested.items():
        assert outcomes == {"silent", "fires"}, alert


@needs_promtool
def test_promtool_checks_config_and_rules() -> None:
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")
    assert "10 rules found" in promtool("check", "rules", "rules.yml")


@needs_promtool
def test_promtool_rule_unit_tests() -> None:
    out = promtool("test", "rules", *[str(p.relative_to(PROM)) for p in RULE_TESTS])
    assert out.count("SUCCESS") == len(RULE_TESTS), out
