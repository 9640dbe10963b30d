"""The pure core alone, without Kafka, and A/B against another commit.

Why a separate instrument: the end-to-end figures drift by ±20 % on this shared machine
within one session (BENCHMARKS.md, step 6), so a change worth 5 % to the Processor cannot be
seen there. Here the same seeded workload goes through ``Processor.handle`` in-process, as
``vigil replay`` runs it (written behind, flushed every ``REPLAY_FLUSH_EVERY`` records), with
no broker, no registry and no codec: only the core and its state store are timed. With
``--against REF`` the commit REF is checked out into a temporary directory and the two trees
run in alternation, each run in a fresh process, so that drift hits both alike; the medians
and their ratio are printed.

    python -m bench.core --executions 20000 --repeat 3 --against HEAD

``--join`` adds the join across executions (blind retries across executions), run in-process
as ``vigil replay`` runs it: what every OperationEvent of the live worker goes through too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: A fixed start, so that every run and every tree builds the very same workload.
START = datetime(2026, 1, 1, tzinfo=UTC)
SEED = 8


def _layout(new: str, old: str) -> Any:
    """The module ``new`` of this tree's layout, or ``old`` in a tree from before the package
    restructures (``streams/contracts``, ``streams/kafka``, ``streams/engine``): an A/B runs
    this script in both.
    The old path is tried first, since the editable install may resolve the new one to the
    current tree's files while running in the old tree."""
    import importlib

    try:
        return importlib.import_module(old)
    except ModuleNotFoundError:
        return importlib.import_module(new)


def workload(executions: int) -> list[Any]:
    """The benchmark's mix (``bench/workload.py``) as Envelopes, in log order, with ticks every
    second of event time and the final tick rounds, partitioned like every vigil producer.
    The values are empty: the Processor reads the decoded record, not the bytes."""
    from bench.sections import BACKFILL_SPACING, BACKFILL_STEP, BACKFILL_TICK_MS, FINAL_TICK_AFTER
    from bench.workload import from_ms, plan, tick_times
    from streams.settings import Settings

    Envelope = _layout("streams.contracts.envelope", "streams.envelope").Envelope
    ClockTick = _layout("streams.contracts.models.events", "streams.models.events").ClockTick
    partition_of = _layout("streams.kafka.partitioning", "streams.partitioning").partition_of
    Topics = _layout("streams.kafka.topics", "streams.topics").Topics
    settings = Settings.from_env()
    topics = Topics.from_settings(settings)
    inputs = [t.name for t in topics.inputs()]
    n = settings.partitions
    by_type = {m: t.name for t in topics.inputs() for m in t.value_types}
    planned = plan(executions, start=START, spacing=BACKFILL_SPACING, step=BACKFILL_STEP, seed=SEED)
    offsets: Counter[tuple[str, int]] = Counter()
    out: list[Any] = []

    def add(topic: str, partition: int, key: bytes | None, ts_ms: int, record: Any) -> None:
        offset = offsets[(topic, partition)]
        offsets[(topic, partition)] += 1
        out.append(Envelope(topic, partition, offset, ts_ms, key, b"", record, None))

    def tick_round(t: int) -> None:
        for topic in inputs:
            for p in range(n):
                add(
                    topic,
                    p,
                    None,
                    t,
                    ClockTick(ticker_id="bench", partition=p, occurred_at=from_ms(t)),
                )

    ticks = iter(tick_times(planned[0].at_ms, planned[-1].at_ms, BACKFILL_TICK_MS))
    next_tick = next(ticks, None)
    for e in planned:
        while next_tick is not None and next_tick < e.at_ms:
            tick_round(next_tick)
            next_tick = next(ticks, None)
        key = e.record.execution_id  # type: ignore[attr-defined]
        add(by_type[type(e.record)], partition_of(key, n), key.encode(), e.at_ms, e.record)
    while next_tick is not None:
        tick_round(next_tick)
        next_tick = next(ticks, None)
    for after in FINAL_TICK_AFTER:
        tick_round(planned[-1].at_ms + after)
    return out


def digest(emissions: list[Any]) -> dict[str, Any]:
    """What a run published, as one digest: per (topic, key), SHA-256 over each emission's
    headers and record (its JSON) in the order published, then over those per-key digests in
    key order. Two trees that publish the same records with the same ids and the same order
    per key give the same digest, whatever order they interleave keys in."""
    per_key: dict[tuple[str, str], Any] = {}
    for em in emissions:
        h = per_key.get((em.topic, em.key or ""))
        if h is None:
            h = per_key[(em.topic, em.key or "")] = hashlib.sha256()
        h.update(repr(em.headers).encode())
        h.update(type(em.record).__name__.encode())
        h.update(em.record.model_dump_json().encode())
        h.update(b"\x00")
    total = hashlib.sha256()
    for (topic, key), h in sorted(per_key.items()):
        total.update(f"{topic}\x1f{key}\x1f{h.hexdigest()}\n".encode())
    return {"outputs": len(emissions), "keys": len(per_key), "digest": total.hexdigest()}


def run_once(executions: int, join: bool = False) -> dict[str, Any]:
    """One timed pass of a fresh Processor over the workload (built before the clock starts).
    What it publishes is kept and digested after the clock stops (``digest``). ``join``: the
    join across executions on, run in-process as ``vigil replay`` runs it (the claims and
    progress go to ``streams.local_join``, the links it decides back to the Processor)."""
    from datetime import timedelta

    from streams.app import tune_gc

    engine = _layout("streams.engine.processor", "streams.processor")
    Processor, Stores = engine.Processor, engine.Stores
    from streams.replay import REPLAY_FLUSH_EVERY
    from streams.settings import Settings

    Topics = _layout("streams.kafka.topics", "streams.topics").Topics
    envs = workload(executions)
    settings = Settings.from_env()
    processor = Processor.from_settings(
        settings,
        Topics.from_settings(settings),
        Stores(),
        write_behind=True,
        **({"cross_execution": True} if join else {}),
    )
    handle = processor.handle
    if join:
        from streams.local_join import LocalJoin, route

        grace_ms = settings.claims_grace // timedelta(milliseconds=1)
        local = LocalJoin(settings.partitions, grace_ms)

        def handle(env: Any) -> list[Any]:
            return route(processor, local, processor.handle(env))

    tune_gc()
    published: list[Any] = []
    keep = published.extend
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i, env in enumerate(envs, 1):
        keep(handle(env))
        if i % REPLAY_FLUSH_EVERY == 0:
            processor.flush()
            processor.flush_clocks()
    if join:
        keep(route(processor, local, processor.publish_progress()))
    processor.flush()
    processor.flush_clocks()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "records": len(envs),
        "outputs": len(published),
        "digest": digest(published)["digest"],
        "seconds": seconds,
        "cpu_seconds": cpu,
        "us_per_record": seconds / len(envs) * 1e6,
        "cpu_us_per_record": cpu / len(envs) * 1e6,
    }


def _run_in(tree: Path, executions: int, join: bool = False) -> dict[str, Any]:
    """One run in a fresh process, with ``tree`` first on the import path: this very script
    drives the ``streams`` and ``bench`` packages of ``tree`` (an older commit may not have
    the script)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    script = str(Path(__file__).resolve())
    proc = subprocess.run(
        [sys.executable, script, "--executions", str(executions), "--once"]
        + (["--join"] if join else []),
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _checkout(ref: str, into: Path) -> str:
    """``ref``'s tree (committed files only) into ``into``; returns its commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    us = [r["us_per_record"] for r in runs]
    cpu = [r["cpu_us_per_record"] for r in runs]
    return {
        "runs": runs,
        "median_us_per_record": statistics.median(us),
        "min_us_per_record": min(us),
        "median_cpu_us_per_record": statistics.median(cpu),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.core",
        description="Time the pure Processor in-process (no Kafka), optionally A/B against a "
        "commit, runs alternating in fresh processes.",
    )
    ap.add_argument("--executions", type=int, default=20_000, help="workload size (20000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tree (3)")
    ap.add_argument("--against", metavar="REF", help="also run this git commit, alternating")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument(
        "--join",
        action="store_true",
        help="with the join across executions, in-process as vigil replay runs it (off: the "
        "Processor alone, as before)",
    )
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.once:
        print(json.dumps(run_once(args.executions, args.join)))
        return 0
    result: dict[str, Any] = {
        "executions": args.executions,
        "repeat": args.repeat,
        "join": args.join,
    }
    with tempfile.TemporaryDirectory(prefix="vigil-core-ab-") as tmp:
        trees = {"current": ROOT}
        if args.against:
            result["against_commit"] = _checkout(args.against, Path(tmp))
            trees["against"] = Path(tmp)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i in range(args.repeat):
            for name, tree in trees.items() if i % 2 == 0 else reversed(trees.items()):
                r = _run_in(tree, args.executions, args.join)
                runs[name].append(r)
                print(
                    f"{name:>8}: {r['records']:,} records, {r['outputs']:,} outputs, "
                    f"{r['us_per_record']:.1f} µs/record ({r['cpu_us_per_record']:.1f} CPU), "
                    f"digest {r['digest'][:12]}",
                    flush=True,
                )
    for name, rs in runs.items():
        result[name] = _summary(rs)
    if args.against:
        cur, old = result["current"], result["against"]
        digests = {r["digest"] for r in cur["runs"] + old["runs"]}
        result["outputs_equal"] = len(digests) == 1
        if not result["outputs_equal"]:
            print(
                f"OUTPUTS DIFFER: the two trees publish different records ({len(digests)} "
                "digests among the runs)"
            )
        else:
            print(f"outputs equal: every run published the same records ({digests.pop()[:16]})")
        result["speedup"] = old["median_us_per_record"] / cur["median_us_per_record"]
        result["cpu_speedup"] = old["median_cpu_us_per_record"] / cur["median_cpu_us_per_record"]
        print(
            f"median: current {cur['median_us_per_record']:.1f} µs/record, "
            f"{result['against_commit']} {old['median_us_per_record']:.1f}: "
            f"{result['speedup']:.3f} times as fast"
        )
        print(
            f"median CPU: current {cur['median_cpu_us_per_record']:.1f} CPU-µs/record, "
            f"{result['against_commit']} {old['median_cpu_us_per_record']:.1f}: "
            f"{result['cpu_speedup']:.3f} times as fast (the better guide on a loaded machine)"
        )
    else:
        print(f"median: {result['current']['median_us_per_record']:.1f} µs/record")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result.get("outputs_equal", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
