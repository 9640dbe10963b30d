"""The recorder: a small library an agent process uses to publish its facts to vigil.

``Recorder`` (and ``AsyncRecorder``) with their handles ``ExecutionRun``, ``OperationRun`` and
``ApprovalRun``; ``action_digest`` is the canonical digest of an action and its material
arguments; ``InvalidFact`` is what an illegal argument raises. README, "Recording from an
agent", shows the use; ``streams.recorder.recorder`` explains it.
"""

from streams.recorder.delivery import Counts
from streams.recorder.facts import InvalidFact, action_digest, canonical_json
from streams.recorder.recorder import (
    ApprovalRun,
    AsyncRecorder,
    ExecutionRun,
    OperationRun,
    Recorder,
    RecorderSettings,
    current_traceparent,
)
from streams.recorder.spool import SpoolInUse

__all__ = [
    "ApprovalRun",
    "AsyncRecorder",
    "Counts",
    "ExecutionRun",
    "InvalidFact",
    "OperationRun",
    "Recorder",
    "RecorderSettings",
    "SpoolInUse",
    "action_digest",
    "canonical_json",
    "current_traceparent",
]
