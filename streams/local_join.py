"""The claims join run in-process, for a replay (and tests) that drives a ``Processor`` alone.

Live, the join is a stage of its own: the pipeline publishes ``IdempotencyClaim`` and
``ClaimsProgress`` records to ``<p>.idempotency-claims``, the claims stage
(``vigil_worker/claims.py``) decides on them and sends ``RetryLink`` records back through
``<p>.retry-links``, and the pipeline applies each link when it reads it. A replay has no such
stage and writes no internal topics, so ``LocalJoin`` holds the same state in dicts and calls the
same pure core (``streams.core.claims``), and ``route`` closes the loop within one call: the
claims and progress a handled input gave go into the join instead of onto a topic, and the links
the join decides are handed to the processor at once, as records of ``<p>.retry-links``, before
the next input (docs/rules.md#blind-retries-across-executions, topology.md, "Replays and
backfills").

Why the same decisions as live: the join decides a send only once every input partition's
progress is past it (plus the grace), so what it decides does not depend on when claims reach
it; only the point at which a link is applied to its execution differs (live: when the
pipeline reads it; here: as soon as the join decides it), which is deterministic here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.contracts.envelope import Envelope
from streams.contracts.keys import split_key
from streams.contracts.models.outputs import ClaimsProgress, IdempotencyClaim
from streams.core import claims as cl
from streams.engine.emission import Emission, record_time_ms
from streams.engine.processor import Processor
from streams.kafka.partitioning import partition_of


@dataclass
class LocalJoin:
    """The claims join's state, as the claims stage keeps it in its table: per claims
    partition its watermarks, per (connector, key) its book."""

    partitions: int
    grace_ms: int = 0
    marks: dict[int, cl.Watermarks] = field(default_factory=dict)
    books: dict[str, cl.KeyBook] = field(default_factory=dict)
    #: per claims partition, the books changed by claims since its pending keys were last
    #: brought up to date (``Watermarks.settled``, before a progress that can pass a send)
    unsettled: dict[int, dict[str, cl.KeyBook]] = field(default_factory=dict)
    #: per claims partition, the earliest send to decide of the unsettled books when they were
    #: taken (``_passes``)
    unsettled_earliest: dict[int, int] = field(default_factory=dict)
    #: what the join has done (the replay's summary)
    links: int = 0
    late: int = 0

    def take(self, em: Emission) -> list[cl.Link]:
        """One record the processor addressed to the claims topic; the links it decides."""
        record = em.record
        if type(record) is IdempotencyClaim:
            claim = cl.claim_of(record)
            key = cl.claims_key(claim.connector, claim.key)
            partition = partition_of(key, self.partitions)
            # ``cl.receive_claim``, with the watermarks' pending keys settled at the next
            # progress of the partition (``settled``)
            book, findings = cl.add_claim(
                self.books.get(key), claim, self._marks(partition).watermark, self.grace_ms
            )
            self.books[key] = book
            self.unsettled.setdefault(partition, {})[key] = book
            sent = book.pending()
            first = self.unsettled_earliest.get(partition)
            if sent is not None and (first is None or sent < first):
                self.unsettled_earliest[partition] = sent
            if findings:
                self.late += sum(1 for f in findings if isinstance(f, cl.Late))
            links = cl.links_of(findings)
        elif type(record) is ClaimsProgress:
            partition = em.partition
            assert partition is not None  # progress goes to every partition by number
            marks = self._marks(partition)
            source, at = record.source_partition, cl.to_ms(record.occurred_at)
            noted = marks.note(source, at)
            if not self._passes(partition, marks, noted.watermark):
                # ``cl.receive_progress`` would decide nothing: only the watermark is noted,
                # and the unsettled books wait for a move that passes a send
                self.marks[partition] = noted
                return []
            self.unsettled_earliest.pop(partition, None)
            marks = marks.settled(self.unsettled.pop(partition, {}))
            marks, changed, links = cl.receive_progress(
                marks, source, at, self._book_of, self.grace_ms
            )
            self.marks[partition] = marks
            self.books.update(changed)
        else:
            raise TypeError(f"not a record of the claims topic: {record.avro_name}")
        self.links += len(links)
        return links

    def _passes(self, partition: int, marks: cl.Watermarks, after: int | None) -> bool:
        """Whether moving the partition's watermark to ``after`` could pass a send to decide:
        one of its pending keys' (``marks.earliest``) or one of the books claims changed since
        they were last settled (``unsettled_earliest``, never later than the earliest of
        those books' sends). When it cannot, ``receive_progress`` on the settled watermarks
        would only note the progress, so settling can wait: ``settled`` gives the same
        pending keys from the latest books whenever it runs."""
        if after is None or after == marks.watermark:
            return False
        first = marks.earliest
        unsettled = self.unsettled_earliest.get(partition)
        if unsettled is not None and (first is None or unsettled < first):
            first = unsettled
        return first is not None and first + self.grace_ms < after

    def _marks(self, partition: int) -> cl.Watermarks:
        return self.marks.get(partition) or cl.Watermarks(self.partitions)

    def _book_of(self, key: str) -> cl.KeyBook:
        book = self.books.get(key)
        if book is None:  # a pending key always has a book; an empty one decides nothing
            connector, idempotency_key = split_key(key)
            return cl.KeyBook(connector, idempotency_key)
        return book


def route(processor: Processor, join: LocalJoin, emissions: list[Emission]) -> list[Emission]:
    """What to publish of ``emissions``: the claims and progress go to ``join`` (never
    published), and every link it decides is applied to ``processor`` at once, in the order
    decided, as the pipeline applies a record of ``<p>.retry-links``; what applying a link
    publishes (an operation state, the FORBIDDEN_RETRY alert) is published after the rest."""
    claims_topic = processor.claims_topic
    links_topic = processor.topics.retry_links.name
    out: list[Emission] = []
    pending = emissions
    while pending:
        decided: list[cl.Link] = []
        for em in pending:
            if em.topic == claims_topic:
                decided.extend(join.take(em))
            else:
                out.append(em)
        pending = []
        for link in decided:
            record = cl.link_record(link)
            env = Envelope(
                links_topic,
                processor.partition_of(record.execution_id),
                -1,
                record_time_ms(record),
                record.execution_id.encode(),
                None,
                record,
                None,
            )
            pending.extend(processor.handle(env))
    return out
