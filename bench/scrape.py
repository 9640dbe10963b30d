"""The cost of a ``/metrics`` scrape with 100,000 executions in flight, and the event loop's
p99 stall while scrapes and the off-loop state count run.

No Kafka: the worker's metrics over a table of 100,000 in-flight entries (one demo entry
copied under new keys). A stand-in batch loop (``Processor.handle`` of a round of ticks,
then ``asyncio.sleep(0)``) measures how long each turn of the loop takes, alone and with a
scrape every 100 ms plus the open-work count every second. Prints the figures.

    python -m bench.scrape [--executions 100000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from streams.engine.state import Entry
from streams.read.metrics import Metrics
from tests.test_processor import ticks
from tests.test_state_gauges import played


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def _turns(proc: object, seconds: float, at: datetime) -> list[float]:
    """Durations of the loop's turns between two batches (a round of ticks each)."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    last = time.perf_counter()
    while time.perf_counter() < end:
        at += timedelta(milliseconds=1)
        ticks(proc, at)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        now = time.perf_counter()
        out.append(now - last)
        last = now
    return out


async def _run(executions: int, seconds: float) -> dict[str, float]:
    proc = played()
    raw = next(v for v in proc.stores.executions.values() if Entry.decode(v).inflight)
    table = {f"ex-{i}": raw for i in range(executions)}
    proc.stores.executions = table
    proc.state.table = table
    metrics = Metrics(proc, dict)
    at = datetime.now(UTC)
    started = time.perf_counter()
    counts = await metrics.gauges.refresh(table)
    count_s = time.perf_counter() - started
    scrapes: list[float] = []
    for _ in range(200):
        t = time.perf_counter()
        metrics.render()
        scrapes.append(time.perf_counter() - t)
    alone = await _turns(proc, seconds, at)

    stop = False

    async def scraper() -> None:
        while not stop:
            metrics.render()
            await asyncio.sleep(0.1)

    async def counter() -> None:
        while not stop:
            await metrics.gauges.refresh(table)
            await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(scraper()), asyncio.create_task(counter())]
    loaded = await _turns(proc, seconds, at + timedelta(hours=1))
    stop = True
    await asyncio.gather(*tasks)
    return {
        "executions_in_flight": counts.in_flight,
        "count_off_loop_s": count_s,
        "scrape_p50_ms": statistics.median(scrapes) * 1000,
        "scrape_p99_ms": _pct(scrapes, 0.99) * 1000,
        "turn_p99_ms_alone": _pct(alone, 0.99) * 1000,
        "turn_p99_ms_scraped": _pct(loaded, 0.99) * 1000,
        "turn_max_ms_scraped": max(loaded) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executions", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    for name, value in asyncio.run(_run(args.executions, args.seconds)).items():
        print(f"{name:>24}: {value:,.2f}")


if __name__ == "__main__":
    main()
