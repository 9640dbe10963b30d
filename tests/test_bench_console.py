"""The console benchmark (``bench/console.py``) on a tiny size against the real broker: its
figures are only worth recording if the console really applied every record it counts, the
cursor walks really reach every row, the page in chromium was answered for every filter, and
every output of the live run is matched to the refresh that showed it. No timing is
asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streams.local.stack import Cluster

ROOT = Path(__file__).resolve().parents[1]
EXECUTIONS = 300


def test_bench_console_runs_small_and_prints_its_figures(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "console.json"
    env = dict(os.environ)
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=cluster.bootstrap_servers,
        SCHEMA_REGISTRY_URL=cluster.schema_registry_url,
    )
    done = subprocess.run(
        [
            sys.executable, "-m", "bench.console", "--executions", str(EXECUTIONS),
            "--events", "600", "--repeat", "3", "--walk-pages", "20", "--page-rounds", "1",
            "--out", str(out), "--workdir", str(tmp_path / "work"),
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for figure in (
        "console_catchup_records_per_s",
        "console_query_executions_p99_ms",
        "console_cursor_walk_page_p99_ms",
        "console_shown_p99_ms",
        "console_page_first_paint_p50_ms",
        "console_page_filter_p99_ms",
    ):
        assert figure in done.stdout
    result = json.loads(out.read_text())
    s = result["sections"]

    catchup = s["console_catchup"]
    assert catchup["records"] == sum(catchup["mix"].values()) > EXECUTIONS
    assert catchup["records_per_s"] > 0

    q = s["console_queries"]
    counts = q["summary_counts"]
    assert sum(counts["executions_by_status"].values()) == EXECUTIONS
    walk = q["walks"]["executions (all) limit=500"]
    assert walk["complete"] and walk["rows"] == EXECUTIONS
    waiting = q["walks"]["executions status=WAITING_FOR_TOOL limit=50"]
    assert (
        waiting["complete"]
        and waiting["rows"] == counts["executions_by_status"]["WAITING_FOR_TOOL"]
    )
    assert q["pages"]["executions status=COMPLETED"]["items"] == 0

    # the page in chromium: every filter answered with the rows of its own query
    pg = s["console_page"]
    assert pg["executions_total"] == EXECUTIONS and pg["attention_total"] > 0
    assert pg["first_paint_ms"]["n"] == 1 and pg["first_paint_ms"]["p50"] > 0
    assert pg["filters"] and all(d["n"] > 0 for d in pg["filters"].values())

    lat = s["console_latency"]
    assert lat["delivery_errors"] == 0 and not lat["observer_errors"]
    assert lat["outputs"] > 0 and lat["failed_fetches"] == 0
    assert lat["not_shown_by_a_refresh"] == 0 and lat["no_frame_found"] == 0
    assert lat["shown_ms"]["n"] == lat["sse_ms"]["n"] == lat["outputs"]
