"""How long this worker can be sure it still owns its partitions: fencing a zombie.

Why: a worker that stops for longer than the group's session timeout (SIGSTOP, a long GC-like
stall, a VM paused) is removed from the group and its partitions go to another worker. When it
runs again it does not know yet: the rebalance reaches it only after its next heartbeat fails.
Until then it would publish the outputs of the batch it was in the middle of and, worse, write
that batch's state to the table changelogs the new owner already writes, so that the next
recovery of those tables reads a zombie's entries. Kafka's own fencing (transactions with the
consumer group's metadata) is not available here: Faust's consumer is aiokafka and the outputs go
through confluent-kafka.

So the worker keeps a lease. Every heartbeat the group coordinator accepts proves membership
until the broker's session timer runs out: at most ``session_timeout`` after the heartbeat was
*sent* (the broker received it later, never earlier). Before each step that reaches the broker
(outputs, state, clocks and acknowledgements) the pipeline asks ``valid()``; when the lease has
run out it waits for a heartbeat to renew it, or for the rebalance that tells it the
partitions are gone, and then drops the batch. A stop that falls between the check and the
send can still let one step through; the check right before the state write keeps such a batch
from reaching the changelogs, and its outputs are the same records the new owner publishes
(every output is a function of the inputs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class MembershipLease:
    """Membership proven by accepted heartbeats, counted in monotonic seconds."""

    def __init__(
        self,
        session_timeout: float,
        *,
        margin: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session_timeout = session_timeout
        #: kept back from the session timeout: the broker's timer and ours are not one clock
        self.margin = margin
        self.clock = clock
        self.proven_at: float | None = None

    def renew(self, sent_at: float | None = None) -> None:
        """A heartbeat sent at ``sent_at`` was accepted (or a join completed now)."""
        at = self.clock() if sent_at is None else sent_at
        if self.proven_at is None or at > self.proven_at:
            self.proven_at = at

    def valid(self) -> bool:
        """Whether the broker cannot have expired this member's session yet."""
        if self.proven_at is None:
            return True  # no group coordinator seen (a test double, a standalone consumer)
        return self.clock() - self.proven_at < self.session_timeout - self.margin

    def watch(self, coordinator: Any) -> None:
        """Renew the lease from every heartbeat ``coordinator`` (aiokafka's
        ``GroupCoordinator``) sees accepted. Its heartbeat routine calls ``_do_heartbeat`` on
        the instance, which returns whether the broker accepted it."""
        original = getattr(coordinator, "_do_heartbeat", None)
        if original is None or getattr(original, "_vigil_lease", None) is self:
            return

        async def _do_heartbeat() -> bool:
            sent_at = self.clock()
            accepted = await original()
            if accepted:
                self.renew(sent_at)
            return bool(accepted)

        _do_heartbeat._vigil_lease = self  # type: ignore[attr-defined]
        coordinator._do_heartbeat = _do_heartbeat
