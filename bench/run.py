"""vigil benchmark: end to end through the real broker and registry, Avro on the wire.

Run from the repository root against a running cluster (``vigil dev up`` prints the env):

    python -m bench.run --executions 20000 --events 60000 --rate 2000 --out bench/results.json

Sections (``--sections``, comma-separated, default all): throughput (one worker), throughput2
(``--workers`` workers, default 2), ceiling (plain aiokafka / confluent-kafka consumers on the
same input topics), replay (the pure Processor in-process, then ``vigil replay`` with one
process per core, end to end), latency (fixed offered load, live
ticker, deadline lags), memory (RSS per in-flight execution, memory:// and rocksdb://),
profile (py-spy on a worker under load, pyinstrument around Processor.handle), floor (one
worker whose core is replaced by a lookup of the pure Processor's outputs: the shell alone;
not in the default set), peer (vigil's worker and a plain Quix Streams app, ``bench/peer``, on
the operations-only log, alternating rounds; ``--peer-floor`` adds the floor on that log; not
in the default set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import harness as h
from bench import sections as sec
from streams.settings import Settings

ALL = (
    "throughput",
    "throughput2",
    "ceiling",
    "replay",
    "latency",
    "memory",
    "profile",
    "floor",
    "peer",
)
#: Sections run only when named.
ON_REQUEST = ("floor", "peer")

console = Console()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--executions",
        type=int,
        default=100_000,
        help="executions in the pre-produced mix (throughput, ceiling, replay)",
    )
    ap.add_argument(
        "--events",
        type=int,
        default=60_000,
        help="events offered in the live latency run (duration = events / rate)",
    )
    ap.add_argument(
        "--rate", type=float, default=2000.0, help="offered load of the latency run, events/s"
    )
    ap.add_argument(
        "--extra-rates",
        default="500",
        help="further offered loads for the latency run (comma-separated; same duration)",
    )
    ap.add_argument("--tick", default="100ms", help="ticker interval of the latency run")
    ap.add_argument("--workers", type=int, default=2, help="workers of the throughput2 section")
    ap.add_argument(
        "--inflight",
        default="100000",
        help="in-flight executions for the memory section (comma-separated)",
    )
    ap.add_argument(
        "--stores", default="memory://,rocksdb://", help="stores for the memory section"
    )
    ap.add_argument(
        "--profile-executions",
        type=int,
        default=5000,
        help="executions of the workload for the profiled worker run",
    )
    ap.add_argument(
        "--floor-executions",
        type=int,
        default=20_000,
        help="executions of the workload for the floor section (its outputs are held in memory)",
    )
    ap.add_argument(
        "--peer-executions",
        type=int,
        default=20_000,
        help="executions of the mix whose OperationEvents make the peer section's log",
    )
    ap.add_argument("--peer-rounds", type=int, default=3, help="rounds of the peer section")
    ap.add_argument(
        "--peer-against",
        type=Path,
        default=None,
        help=(
            "a checkout of another commit with the same schemas (its worker runs on this "
            "harness's deployment): the peer section runs its worker too, on the same log"
        ),
    )
    ap.add_argument(
        "--peer-floor",
        action="store_true",
        help=(
            "the peer section also runs the floor on the same log: the worker with its core "
            "replaced by a lookup of the pure Processor's outputs (the shell alone)"
        ),
    )
    ap.add_argument(
        "--sections",
        default=",".join(s for s in ALL if s not in ON_REQUEST),
        help=f"any of {', '.join(ALL)} ({' and '.join(ON_REQUEST)} only when named)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results.json"))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/vigil-bench"))
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the bench topics")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="add this run's sections to an existing --out file instead of replacing it",
    )
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(wanted) - set(ALL)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")

    base = Settings.from_env()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": " ".join(["python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "cluster": {"bootstrap": base.bootstrap_servers, "registry": base.schema_registry_url},
        "sections": {},
        "load": [],
    }

    def log(msg: str) -> None:
        """Progress lines; a section's heading also records the machine's load average,
        since other work on the machine moves every figure."""
        if msg.startswith("[bold]"):
            la = os.getloadavg()
            name = msg.replace("[bold]", "").replace("[/bold]", "")
            results["load"].append(
                {
                    "at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "section": name,
                    "loadavg_1_5_15": la,
                }
            )
            msg += f" [dim](load {la[0]:.1f} {la[1]:.1f} {la[2]:.1f})[/dim]"
        console.print(msg)

    out_dir = args.out.parent
    t_all = time.time()
    tput_dep = tput_bf = None
    s = results["sections"]
    try:
        if "throughput" in wanted or "ceiling" in wanted or "replay" in wanted:
            log(f"[bold]throughput, 1 worker[/bold] ({args.executions:,} executions)")
            s["throughput_1"], tput_dep, tput_bf = sec.throughput(
                base, args.workdir, args.executions, 1, log
            )
        if "ceiling" in wanted:
            log("[bold]ceiling[/bold]: plain consumers on the same input topics")
            s["ceiling"] = sec.ceiling(base, tput_dep, tput_bf.records, log)
        if "replay" in wanted:
            log("[bold]replay[/bold]: pure Processor in-process")
            s["replay"] = sec.replay(
                base,
                tput_dep,
                tput_bf,
                log,
                out_dir / "profile-processor.txt" if "profile" in wanted else None,
            )
            log("[bold]replay[/bold]: vigil replay (run_replay), one process per core")
            s["replay_cli"] = sec.replay_cli(base, tput_dep, tput_bf, log)
        if tput_dep is not None and not args.keep_topics:
            h.delete_deployment(tput_dep)
        if "throughput2" in wanted:
            log(f"[bold]throughput, {args.workers} workers[/bold]")
            s[f"throughput_{args.workers}"], dep2, _ = sec.throughput(
                base, args.workdir, args.executions, args.workers, log
            )
            if not args.keep_topics:
                h.delete_deployment(dep2)
        if "latency" in wanted:
            log(f"[bold]latency[/bold] at {args.rate:,.0f} events/s, ticker {args.tick}")
            s["latency"] = sec.latency(base, args.workdir, args.events, args.rate, args.tick, log)
            for r in [float(x) for x in args.extra_rates.split(",") if x.strip()]:
                log(f"[bold]latency[/bold] at {r:,.0f} events/s, ticker {args.tick}")
                n = int(args.events * r / args.rate)
                s[f"latency_at_{r:.0f}"] = sec.latency(base, args.workdir, n, r, args.tick, log)
        if "memory" in wanted:
            mem = []
            for store in [x for x in args.stores.split(",") if x]:
                for n in [int(x) for x in args.inflight.split(",") if x]:
                    log(f"[bold]memory[/bold] {store}, {n:,} in flight")
                    try:
                        mem.append(sec.memory(base, args.workdir, n, store, log))
                    except Exception as exc:  # a missing RocksDB binding is a finding, not a crash
                        log(f"  [red]{store} failed: {exc}[/red]")
                        mem.append({"store": store, "inflight": n, "error": str(exc)[-2000:]})
            s["memory"] = mem
            n = min(10_000, max(int(x) for x in args.inflight.split(",") if x))
            s["table_bytes"] = sec.table_bytes(base, args.workdir, n)
            log(f"  table payload per in-flight execution: {s['table_bytes']['total']:,.0f} B")
        if "profile" in wanted:
            n = args.profile_executions
            log(f"[bold]profile[/bold]: py-spy on one worker ({n:,} executions)")
            prof = out_dir / "profile-worker.txt"
            r, dep3, _ = sec.throughput(
                base, args.workdir, args.profile_executions, 1, log, profile=prof
            )
            if not args.keep_topics:
                h.delete_deployment(dep3)
            s["profile"] = {
                "run": r,
                "py_spy": sec.collapsed_top(prof),
                "collapsed_stacks": str(prof),
            }
        if "floor" in wanted:
            n = args.floor_executions
            log(f"[bold]floor[/bold]: one worker, its core replaced by a lookup ({n:,} executions)")
            # the real worker on the same workload in the same run, between the two floor runs,
            # so that the machine's drift shows in the figures rather than in their ratio
            runs = (
                ("floor", True, None),
                ("floor_real_worker", False, None),
                ("floor_profiled", True, out_dir / "profile-floor.txt"),
            )
            for name, floor, prof in runs:
                if not floor:
                    log("  the real worker, same workload:")
                r, dep4, _ = sec.throughput(
                    base, args.workdir, n, 1, log, profile=prof, floor=floor
                )
                if not args.keep_topics:
                    h.delete_deployment(dep4)
                r["cpu_us_per_record"] = sum(r["worker_cpu_s"]) / r["records"] * 1e6
                s[name] = {"run": r}
                if prof is not None:
                    s[name].update(py_spy=sec.collapsed_top(prof), collapsed_stacks=str(prof))
        if "peer" in wanted:
            from bench import peer

            n = args.peer_executions
            log(f"[bold]peer[/bold]: vigil and a Quix Streams app, operations only ({n:,} execs)")
            s["peer"] = peer.section(
                base, args.workdir, n, args.peer_rounds, log, args.peer_against, args.peer_floor
            )
    finally:
        results["elapsed_s"] = time.time() - t_all
        if args.merge and args.out.exists():
            prev = json.loads(args.out.read_text())
            prev.setdefault("runs", [{k: prev.get(k) for k in ("command", "started", "elapsed_s")}])
            prev["runs"].append({k: results[k] for k in ("command", "started", "elapsed_s")})
            for k, v in results["sections"].items():
                old = prev["sections"].get(k)
                if k == "latency" and old and old.get("rate") != v.get("rate"):
                    k = f"latency_at_{v['rate']:.0f}"  # keep the primary offered load's run
                prev["sections"][k] = v
            prev.setdefault("load", []).extend(results["load"])
            prev.setdefault("machine_by_run", []).append(results["machine"])
            results = prev
        results["summary"] = summary(results, args.tick)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, default=str))
        show(results)
        console.print(f"written {args.out}")
    return 0


def machine() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()

    return {
        "nproc": os.cpu_count(),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
        "free_g": sh("free -g"),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
        "other_processes": sh(
            "ps -eo pid,pcpu,rss,args --sort=-pcpu | grep -E 'java|python|pytest' "
            "| grep -v grep | cut -c1-200 | head -20"
        ),
    }


def summary(results: dict[str, Any], tick: str) -> dict[str, Any]:
    s = results["sections"]
    out: dict[str, Any] = {}
    t1 = s.get("throughput_1")
    if t1:
        out["one_worker_events_per_s"] = t1["events_per_s"]
        out["one_worker_records_per_s"] = t1["records_per_s"]
    for k, v in s.items():
        if k.startswith("throughput_") and k != "throughput_1":
            out[f"{k}_events_per_s"] = v["events_per_s"]
    c = s.get("ceiling")
    if c and t1:
        for key in (
            "aiokafka_avrocodec",
            "aiokafka_fastavro",
            "confluent_avrocodec",
            "confluent_fastavro",
        ):
            out[f"ratio_to_{key}"] = t1["records_per_s"] / c[key]["records_per_s"]
    lat = s.get("latency")
    if lat:
        out["p50_latency_ms"] = lat["latency_ms_from_ack"]["p50"]
        out["p99_latency_ms"] = lat["latency_ms_from_ack"]["p99"]
        out["unknown_lag_p99_ms"] = lat["unknown_lag_ms"]["p99"]
        out["stuck_lag_p99_ms"] = lat["stuck_lag_ms"]["p99"]
    for m in s.get("memory", []):
        if "bytes_per_inflight_execution" in m:
            out[f"bytes_per_inflight_{m['store'].rstrip(':/')}_{m['inflight']}"] = m[
                "bytes_per_inflight_execution"
            ]
    r = s.get("replay")
    if r and t1:
        out["replay_inprocess_events_per_s"] = r["events_per_s"]
        out["replay_inprocess_over_live"] = r["records_per_s"] / t1["records_per_s"]
    for key in ("floor", "floor_profiled", "floor_real_worker"):
        if key in s:
            out[f"{key}_events_per_s"] = s[key]["run"]["events_per_s"]
            out[f"{key}_cpu_us_per_record"] = s[key]["run"]["cpu_us_per_record"]
    pr = s.get("peer")
    if pr and "median" in pr:
        m = pr["median"]
        out["peer_vigil_events_per_s"] = m["vigil"]["events_per_s"]
        out["peer_peer_events_per_s"] = m["peer"]["events_per_s"]
        out["peer_vigil_over_peer"] = m["vigil_over_peer"]
        out["peer_vigil_cpu_us_per_event"] = m["vigil"]["cpu_us_per_event"]
        out["peer_peer_cpu_us_per_event"] = m["peer"]["cpu_us_per_event"]
        if "against" in m:
            out["peer_against_events_per_s"] = m["against"]["events_per_s"]
            out["peer_against_cpu_us_per_event"] = m["against"]["cpu_us_per_event"]
        if "against_replay" in m:
            out["peer_against_replay_cpu_us_per_event"] = m["against_replay"]["cpu_us_per_event"]
        if "replay" in m:
            out["peer_replay_events_per_s"] = m["replay"]["events_per_s"]
            out["peer_replay_cpu_us_per_event"] = m["replay"]["cpu_us_per_event"]
            out["peer_replay_over_peer"] = m["replay_over_peer"]
        if "floor" in m:
            out["peer_floor_events_per_s"] = m["floor"]["events_per_s"]
            out["peer_floor_cpu_us_per_event"] = m["floor"]["cpu_us_per_event"]
            out["peer_floor_over_peer"] = m["floor_over_peer"]
    r = s.get("replay_cli")
    if r and t1:
        out["replay_events_per_s"] = r["events_per_s"]
        out["replay_processes"] = r["processes"]
        out["replay_over_live"] = r["records_per_s"] / t1["records_per_s"]
    return out


def show(results: dict[str, Any]) -> None:
    sm = results["summary"]
    s = results["sections"]
    tick_ms = _ms(s.get("latency", {}).get("tick_interval", "100ms"))
    t = Table(title="vigil benchmark", show_lines=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("target", justify="right")
    t.add_column("", justify="center")

    def row(
        name: str, value: float | None, target: float | None, fmt: str, higher: bool = True
    ) -> None:
        if value is None:
            return
        ok = (
            ""
            if target is None
            else ("✓" if (value >= target if higher else value <= target) else "✗")
        )
        tgt = "" if target is None else ("≥ " if higher else "≤ ") + fmt.format(target)
        t.add_row(name, fmt.format(value), tgt, ok)

    row("one worker, events/s", sm.get("one_worker_events_per_s"), 20_000, "{:,.0f}")
    row("one worker, records/s (incl. ticks)", sm.get("one_worker_records_per_s"), None, "{:,.0f}")
    row("floor: the shell, core free, events/s", sm.get("floor_events_per_s"), 20_000, "{:,.0f}")
    row("floor, profiled, events/s", sm.get("floor_profiled_events_per_s"), 20_000, "{:,.0f}")
    row(
        "floor run's real worker, events/s",
        sm.get("floor_real_worker_events_per_s"),
        None,
        "{:,.0f}",
    )
    for key in ("floor", "floor_profiled", "floor_real_worker"):
        row(f"{key}, worker CPU µs per record", sm.get(f"{key}_cpu_us_per_record"), None, "{:,.1f}")
    for k, v in sm.items():
        if k.startswith("throughput_") and k.endswith("_events_per_s"):
            row(f"{k.split('_')[1]} workers, events/s", v, None, "{:,.0f}")
    row("worker / aiokafka+AvroCodec ceiling", sm.get("ratio_to_aiokafka_avrocodec"), 0.5, "{:.3f}")
    row("worker / aiokafka+fastavro ceiling", sm.get("ratio_to_aiokafka_fastavro"), 0.5, "{:.3f}")
    row(
        "worker / confluent+AvroCodec ceiling",
        sm.get("ratio_to_confluent_avrocodec"),
        None,
        "{:.3f}",
    )
    row(
        "worker / confluent+fastavro ceiling", sm.get("ratio_to_confluent_fastavro"), None, "{:.3f}"
    )
    c = s.get("ceiling", {})
    for key in sorted(k for k in c if isinstance(c[k], dict) and "records_per_s" in c[k]):
        row(f"ceiling {key}, records/s", c[key]["records_per_s"], None, "{:,.0f}")
    lat = s.get("latency")
    if lat:
        row(
            f"p50 latency at {lat['rate']:,.0f} ev/s, ms", sm.get("p50_latency_ms"), None, "{:,.0f}"
        )
        row(
            f"p99 latency at {lat['rate']:,.0f} ev/s, ms",
            sm.get("p99_latency_ms"),
            250,
            "{:,.0f}",
            False,
        )
        row(
            "p99 UNKNOWN lag after deadline, ms",
            sm.get("unknown_lag_p99_ms"),
            tick_ms + 500,
            "{:,.0f}",
            False,
        )
        row(
            "p99 STUCK lag after grace, ms",
            sm.get("stuck_lag_p99_ms"),
            tick_ms + 500,
            "{:,.0f}",
            False,
        )
    for k, v in s.items():
        if k.startswith("latency_at_"):
            row(
                f"p50 latency at {v['rate']:,.0f} ev/s, ms",
                v["latency_ms_from_ack"]["p50"],
                None,
                "{:,.0f}",
            )
            row(
                f"p99 latency at {v['rate']:,.0f} ev/s, ms",
                v["latency_ms_from_ack"]["p99"],
                None,
                "{:,.0f}",
            )
            row(
                f"p99 UNKNOWN lag at {v['rate']:,.0f} ev/s, ms",
                v["unknown_lag_ms"]["p99"],
                tick_ms + 500,
                "{:,.0f}",
                False,
            )
    for k, v in sm.items():
        if k.startswith("bytes_per_inflight_"):
            row(
                k.replace("bytes_per_inflight_", "bytes / in-flight exec, "),
                v,
                2048 if "memory" in k else None,
                "{:,.0f}",
                False,
            )
    row(
        "replay events/s, one process (in-process Processor)",
        sm.get("replay_inprocess_events_per_s"),
        None,
        "{:,.0f}",
    )
    row(
        f"replay events/s, vigil replay ({sm.get('replay_processes', '?')} processes)",
        sm.get("replay_events_per_s"),
        None,
        "{:,.0f}",
    )
    row("replay / live", sm.get("replay_over_live"), 2.0, "{:.2f}")
    row(
        "ops-only log: vigil, events/s (median)", sm.get("peer_vigil_events_per_s"), None, "{:,.0f}"
    )
    row("ops-only log: peer, events/s (median)", sm.get("peer_peer_events_per_s"), None, "{:,.0f}")
    row("ops-only log: vigil ÷ peer (median)", sm.get("peer_vigil_over_peer"), 1.0, "{:.2f}")
    row(
        "ops-only log: vigil, CPU-µs per event",
        sm.get("peer_vigil_cpu_us_per_event"),
        None,
        "{:,.1f}",
    )
    row(
        "ops-only log: peer, CPU-µs per event",
        sm.get("peer_peer_cpu_us_per_event"),
        None,
        "{:,.1f}",
    )
    row(
        "ops-only log: vigil replay, one process, no Faust, events/s",
        sm.get("peer_replay_events_per_s"),
        None,
        "{:,.0f}",
    )
    row(
        "ops-only log: vigil replay ÷ peer (median)",
        sm.get("peer_replay_over_peer"),
        None,
        "{:.2f}",
    )
    row(
        "ops-only log: vigil replay, CPU-µs per event",
        sm.get("peer_replay_cpu_us_per_event"),
        None,
        "{:,.1f}",
    )
    row(
        "ops-only log: floor (the shell, core free), events/s",
        sm.get("peer_floor_events_per_s"),
        None,
        "{:,.0f}",
    )
    row("ops-only log: floor ÷ peer (median)", sm.get("peer_floor_over_peer"), 1.0, "{:.2f}")
    row(
        "ops-only log: floor, CPU-µs per event",
        sm.get("peer_floor_cpu_us_per_event"),
        None,
        "{:.1f}",
    )
    row(
        "ops-only log: --peer-against worker, events/s",
        sm.get("peer_against_events_per_s"),
        None,
        "{:,.0f}",
    )
    row(
        "ops-only log: --peer-against worker, CPU-µs per event",
        sm.get("peer_against_cpu_us_per_event"),
        None,
        "{:,.1f}",
    )
    row(
        "ops-only log: --peer-against replay, CPU-µs per event",
        sm.get("peer_against_replay_cpu_us_per_event"),
        None,
        "{:,.1f}",
    )
    console.print(t)


def _ms(text: str) -> float:
    from streams.durations import parse_duration

    return parse_duration(text).total_seconds() * 1000


if __name__ == "__main__":
    raise SystemExit(main())
