"""Bench only: the worker's shell with a free core (``python -m bench.run --sections floor``).

Why: the one-worker figure mixes two costs, the pure core's and the shell's (fetch, decode,
encode, produce, acknowledge, commit). Step 7 timed the core alone (``bench/core.py``); this
times the shell alone. The benchmark puts this directory on the worker's ``PYTHONPATH`` and
``VIGIL_BENCH_FLOOR`` names a pickle of the outputs the pure Processor computed for the very
same records, by (topic, partition, offset) of the input after which it published them.
``Processor.handle`` is replaced by a lookup in that map: the worker publishes the same
outputs, through the same codec, producer and batch, but computes nothing and writes no
state (so no changelog records either). What it reaches is an upper bound on any worker
with this shell, whatever its core.

Nothing here is imported unless that variable is set; production code has no hook for it.
"""

from __future__ import annotations

import os
import pickle
from typing import Any


def _install(path: str) -> None:
    from streams.engine.processor import Emission, Processor

    with open(path, "rb") as f:
        outputs: dict[tuple[str, int, int], list[Emission]] = pickle.load(f)
    nothing: list[Emission] = []

    def handle(self: Processor, env: Any, token: Any = None) -> list[Emission]:
        self.scheduler.done(token)
        return list(outputs.get((env.topic, env.partition, env.offset), nothing))

    Processor.handle = handle  # type: ignore[method-assign]


_path = os.environ.get("VIGIL_BENCH_FLOOR")
if _path:
    _install(_path)
