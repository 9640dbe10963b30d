"""A table recovery whose changelog records stop coming, on the real broker: the worker seeks
the partition back and goes on (``vigil_worker/recovery_watch.py``).

A first worker processes the first part of a stream and is stopped once every input is
committed. A second one, with a data dir of its own, must restore the executions table from
the changelog before it processes anything. It runs with ``tests/sites/recovery_drop`` on its
``PYTHONPATH`` (see there): right after Faust seeks the changelog partitions for its recovery,
one partition's read offset is set past its end, so the fetch loop drops all its records, and
Faust's recovery would wait for them for ever. The worker must say so, seek the partition
back, finish the recovery, and then publish for the rest of the stream exactly what the pure
Processor computes for the whole of it: the rest depends on the restored state.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, worker
from tests.test_changelog_atomic_kafka import SplitStream, wait_committed_to_the_end
from tests.test_faults_kafka import worker_logs

pytestmark = pytest.mark.kafka

SITE = ROOT / "tests" / "sites" / "recovery_drop"
INJECTED = "injected: recovery drops"  # as the site hook prints it


def test_a_recovery_whose_changelog_records_stop_coming_is_sought_back(
    cluster: Any, tmp_path: Path
) -> None:
    stream = SplitStream.played(cluster, tmp_path)
    dep = stream.dep
    first = ["--data-dir", str(tmp_path / "first")]
    with worker(dep, reticks=False, ready_timeout=40, extra_args=first):
        wait_committed_to_the_end(dep)

    fault = {"VIGIL_TEST_RECOVERY_DROPS": "1", "PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}"}
    second = ["--data-dir", str(tmp_path / "second")]
    with worker(dep, env=fault, reticks=False, ready_timeout=60, extra_args=second) as w:
        deadline = time.monotonic() + 60
        while "table recovery waited" not in w.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the stall was never seen\n{worker_logs(dep)}"
            time.sleep(0.5)
        stream.finish(timeout=90)
    log = w.log_path.read_text(errors="replace")
    assert INJECTED in log  # the fault was hit
    assert "Done reading from changelog topics" in log.split("table recovery waited")[-1]
