"""The functional core: domain rules as pure functions over immutable data.

Nothing in this package may import Kafka, Faust, asyncio or read a clock: the live worker,
the replay path and the offline audit all call it, so that they can never disagree.
"""
