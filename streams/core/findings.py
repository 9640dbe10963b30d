"""What the core says about an input it refuses to apply.

The core knows why an event is an anomaly; only the shell knows where the event came from
(topic, partition, offset). The shell turns a finding into an ``Anomaly`` record.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.contracts.models.enums import AnomalyKind


@dataclass(frozen=True, slots=True)
class AnomalyFinding:
    kind: AnomalyKind
    reason: str
