"""The floor benchmark (``bench/floor_site``) runs the real worker with its core replaced by
a lookup of the pure Processor's outputs. Its figure is only an upper bound on the shell if
the replaced core publishes exactly what the real one does, and acknowledges every input."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from bench import core
from bench.sections import outputs_by_input
from streams.engine.processor import Processor, Stores
from streams.kafka.topics import Topics
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter, as the worker does: the hook is installed at start-up.
CHILD = """
import json, pickle, sys
from bench import core
from streams.engine.processor import Processor, Stores
from streams.settings import Settings
from streams.kafka.topics import Topics

settings = Settings.from_env()
processor = Processor.from_settings(settings, Topics.from_settings(settings), Stores())
published, tokens = [], []
for i, env in enumerate(core.workload(40)):
    published.extend(processor.handle(env, token=i))
    tokens.extend(processor.drain_done())
sys.stdout.buffer.write(pickle.dumps((published, tokens, dict(processor.stores.executions))))
"""


def _real_outputs(cross_execution: bool) -> tuple[Processor, dict]:
    settings = Settings.from_env()
    processor = Processor.from_settings(
        settings, Topics.from_settings(settings), Stores(), cross_execution=cross_execution
    )
    return processor, outputs_by_input(processor, core.workload(40))


@pytest.mark.parametrize("cross_execution", [False, True], ids=["alone", "with-claims"])
def test_the_replaced_core_publishes_the_real_outputs_and_acknowledges_every_input(
    tmp_path: Path, cross_execution: bool
) -> None:
    """With the join across executions on (the peer section's floor), the table also holds
    the claims and progress the real core addresses to the claims topic: the floor's worker
    still sends them, and its claims stage still takes them."""
    processor, table = _real_outputs(cross_execution)
    expected = [em for ems in table.values() for em in ems]
    assert len(expected) > 40  # the 40 executions publish states, verdicts, operations
    to_claims = [em for em in expected if em.topic == processor.claims_topic]
    assert bool(to_claims) is cross_execution
    path = tmp_path / "outputs.pickle"
    path.write_bytes(pickle.dumps(table, protocol=5))
    env = dict(os.environ)
    env.update(
        VIGIL_BENCH_FLOOR=str(path),
        PYTHONPATH=f"{ROOT / 'bench' / 'floor_site'}{os.pathsep}{ROOT}",
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=tmp_path, capture_output=True, check=True
    )
    published, tokens, state = pickle.loads(done.stdout)
    assert published == expected
    assert tokens == list(range(len(core.workload(40))))
    assert state == {}  # it computes nothing and writes no state: the shell alone is timed
    assert processor.stores.executions  # where the real core wrote its entries


def test_without_the_variable_the_site_hook_changes_nothing(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("VIGIL_BENCH_FLOOR", None)
    env["PYTHONPATH"] = f"{ROOT / 'bench' / 'floor_site'}{os.pathsep}{ROOT}"
    probe = (
        "import json, streams.engine.processor as p; "
        "print(json.dumps(p.Processor.handle.__qualname__))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, check=True
    )
    assert json.loads(done.stdout) == "Processor.handle"
