"""The engine: one decoded input record in, the output records and the state changes out.

Everything here is driven alike by the live worker (``vigil_worker/``), the replay
(``streams/replay.py``) and the tests; none of it reads a topic or sends a record. The domain
rules are in ``streams/core/`` (pure functions, no Kafka, no clock); the engine is what runs
them in stream time over tables. How one record flows through it:

1. ``processor.Processor.handle`` takes an ``Envelope`` (the record decoded, with its topic,
   partition, offset and timestamp) and checks what the core cannot: the key against the
   record, text bounds, stream time (anomalies otherwise).
2. ``scheduler.Scheduler`` moves the partition's clock (``observe``) and holds the event until
   the partition's watermark passes its time; when the watermark moves, ``release`` hands back
   the held events and the due deadlines of executions, in time order; a due time the
   execution no longer has (``state.ExecutionStore.quiet``) is passed over unread.
3. The processor loads the execution's aggregate from ``state.ExecutionStore`` (a write-behind
   cache over the executions table, entries packed by ``compact``), applies the event or the
   deadline with the pure core (``streams.core.execution``), and keeps the new aggregate.
4. ``emitter.Emitter`` turns the core's output records, and the anomalies and dead letters
   about inputs, into ``emission.Emission``s (topic, key, headers, partition).
5. The shell sends the emissions, then ``Processor.flush`` writes the changed entries and
   ``flush_clocks`` the partition clocks (``vigil_worker/checkpoint.py`` says in which order,
   and why), and ``flow.hold_back`` says which input partitions run ahead and should pause.

Its siblings are the services that run beside it: the ticker (``streams/ticker.py``), the
alert bridge (``streams/alert_bridge.py``), the replay (``streams/replay.py``), the reconciler
(``streams/reconcile.py``), the console (``streams/console/``).
"""
