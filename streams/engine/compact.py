"""Execution entries stored compressed: raw DEFLATE with a preset dictionary.

Why: the executions table is most of what a worker holds per in-flight execution, and an entry
is a few hundred bytes of JSON that repeats the same field names, enum symbols and id shapes
as every other entry. DEFLATE primed with a dictionary of exactly those strings stores an
entry in about 100 B, and reading it back costs one or two µs. Compressing
each entry on its own, rather than a block of them, keeps the table a plain key-value map with
bytes for values: the store, the changelog and recovery need nothing of their own.

The dictionary is part of the stored format: an entry packed with it can only be read with it.
``DICTIONARY_V1`` and ``DICTIONARY_V2`` must therefore never change. A better dictionary gets
a new version byte, and ``unpack`` keeps reading every version it has ever written: entries
are packed with V2 (made for the format 2 slots and operation book), V1 entries are read.
Text written before entries were compressed (it starts with ``{``, ``[`` or the field
separator, never with a version byte) is read as it is.
"""

from __future__ import annotations

import zlib

#: First byte of a packed entry: which dictionary it was compressed with.
V1 = 1
V2 = 2
#: 4 KiB window (``wbits`` -12) and a small hash table: an entry is far shorter than the
#: window, and the compressor's state is copied for every entry, so it is kept small.
_WBITS = -12
_MEM_LEVEL = 4
_LEVEL = 6

# Skeletons of the four JSON fields of an entry, with neutral values: the strings that recur
# from entry to entry. DEFLATE finds a match faster and codes it shorter near the end of the
# dictionary, so the most common shapes (an in-flight execution with an operation) come last.
DICTIONARY_V1 = (
    b'{"execution_id":"ex-0000000","requests":{"ex-0000000-req1":{"request_id":"ex-0000000-req1",'
    b'"execution_id":"ex-0000000","request":{"action":"refund","action_digest":"d1",'
    b'"requested_at":"2026-01-01T00:00:00.000000Z","expires_at":null,"approver_ref":"approver-1",'
    b'"resume_handle":"ex-0000000-resume","risk":"HIGH","policy":null,"overrides":{"grace":null,'
    b'"heartbeat_fresh":null,"delivery_deadline":null}},"deliveries":[{"at":'
    b'"2026-01-01T00:00:00.000000Z","outcome":"DELIVERED"}],"acknowledgements":['
    b'"2026-01-01T00:00:00.000000Z"],"decisions":[{"at":"2026-01-01T00:00:00.000000Z","code":'
    b'"ACCEPT","action_digest":"d1"}],"receipts":[],"digests":[],"heartbeats":[]}},"digests":[],'
    b'"heartbeats":["2026-01-01T00:00:00.000000Z"],"last_verdicts":{"ex-0000000-req1":{"verdict":'
    b'"STUCK_AFTER_DECISION","since":"2026-01-01T00:00:00.000000Z"}},"evaluated_until":'
    b'"2026-01-01T00:00:00.000000Z","dirty":[]}\x1e'
    b'{"kind":"closed","execution_id":"ex-0000000","status":"COMPLETED","closed_at":'
    b'"2026-01-01T00:00:00.000000Z","last_sequence":9,"last_event_id":"ex-0000000-s9"}\x1e'
    b'"status":"VERIFIED","since":"2026-01-01T00:00:00.000000Z","sent":true,"reply_due_at":'
    b'"2026-01-01T00:00:00.000000Z","verify_due_at":"2026-01-01T00:00:00.000000Z","effect_ref":'
    b'"ex-0000000-effect","kinds":["SENT","ACKNOWLEDGED","VERIFIED"],"event_ids":'
    b'["ex-0000000-op1-1-sent","ex-0000000-op1-1-acknowledged","ex-0000000-op1-1-verified"]'
    b'"status":"UNKNOWN","FAILED","MANUAL_REVIEW","RECONCILING","CANCELLED","RUNNING",'
    b'"WAITING_FOR_APPROVAL","open_approval_ids":["ex-0000000-req1"]}\x1e'
    b'{"kind":"in_flight","execution_id":"ex-0000000","status":"WAITING_FOR_TOOL","since":'
    b'"2026-01-01T00:00:00.000000Z","first_seen_at":"2026-01-01T00:00:00.000000Z",'
    b'"last_event_at":"2026-01-01T00:00:00.000000Z","last_sequence":2,"last_event_id":'
    b'"ex-0000000-s2","open_operation_ids":["ex-0000000-op1"],"open_approval_ids":[]}\x1e\x1e'
    b'{"execution_id":"ex-0000000","operations":{"ex-0000000-op1":{"operation_id":'
    b'"ex-0000000-op1","attempts":{"1":{"attempt":1,"connector":"mail","idempotency_key":'
    b'"idem-ex-0000000-op1","status":"SENT","since":"2026-01-01T00:00:00.000000Z","sent":true,'
    b'"reply_due_at":"2026-01-01T00:00:00.000000Z","kinds":["SENT"],"event_ids":'
    b'["ex-0000000-op1-1-sent"]}}}},"by_idempotency_key":{"idem-ex-0000000-op1":'
    b'["ex-0000000-op1"]}}\x1e\x1e'
)

# The same for entries whose slots and operation book are format 2 (JSON arrays, epoch
# milliseconds: ``streams.engine.state``); the approval book's JSON as in ``DICTIONARY_V1``.
DICTIONARY_V2 = (
    DICTIONARY_V1[: DICTIONARY_V1.index(b'"dirty":[]}\x1e') + len(b'"dirty":[]}\x1e')]
    + b'["c","ex-0000000","COMPLETED",1767225600000,9,"ex-0000000-s9"]\x1e'
    b'"FAILED","CANCELLED","EXPIRED","VERIFIED","UNKNOWN","MANUAL_REVIEW","RECONCILING",'
    b'"reply_timeout","verification_timeout","REPLY_TIMEOUT","VERIFICATION_TIMEOUT","wi-","alert-"'
    b'"RUNNING","WAITING_FOR_APPROVAL","VALIDATING_OUTPUT",["ex-0000000-req1"]]\x1e'
    b'["ex-0000000",[["ex-0000000-op1",[[1,"mail","idem-ex-0000000-op1","ACKNOWLEDGED",null,'
    b'1767225600000,true,1767225600000,1767225600000,"ex-0000000-effect",null,null,null,'
    b'["SENT","ACKNOWLEDGED","VERIFIED"],["ex-0000000-op1-1-sent","ex-0000000-op1-1-acknowledged",'
    b'"ex-0000000-op1-1-verified"]]]]],{"idem-ex-0000000-op1":["ex-0000000-op1"]}]\x1e\x1e'
    b'["i","ex-0000000","WAITING_FOR_TOOL",1767225600000,1767225600000,1767225600000,2,'
    b'"ex-0000000-s2",["ex-0000000-op1"],[]]\x1e\x1e'
    b'["ex-0000000",[["ex-0000000-op1",[[1,"mail","idem-ex-0000000-op1","SENT",null,'
    b'1767225600000,true,1767225600000,null,null,null,null,null,["SENT"],'
    b'["ex-0000000-op1-1-sent"]]]]],{"idem-ex-0000000-op1":["ex-0000000-op1"]}]\x1e\x1e'
)

_DICTIONARIES = {V1: DICTIONARY_V1, V2: DICTIONARY_V2}
_COMPRESSOR = zlib.compressobj(
    _LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, DICTIONARY_V2
)
_DECOMPRESSORS = {v: zlib.decompressobj(_WBITS, d) for v, d in _DICTIONARIES.items()}
_VERSION = bytes([V2])


def pack(text: str) -> bytes:
    """``text`` compressed with the newest dictionary, behind its version byte. A copy of a
    compressor already primed with the dictionary costs less than priming a new one."""
    c = _COMPRESSOR.copy()
    return _VERSION + c.compress(text.encode()) + c.flush()


def is_packed(raw: bytes | bytearray | str) -> bool:
    return isinstance(raw, bytes | bytearray) and len(raw) > 0 and raw[0] in _DICTIONARIES


def unpack(raw: bytes | bytearray) -> str:
    """The text ``pack`` was given, with whichever dictionary its version byte names. Raises
    ``ValueError`` for a version it does not know or bytes that are not what it wrote."""
    decompressor = _DECOMPRESSORS.get(raw[0]) if raw else None
    if decompressor is None:
        raise ValueError(f"not a packed entry (version byte {raw[:1]!r})")
    d = decompressor.copy()
    try:
        data = d.decompress(memoryview(raw)[1:]) + d.flush()
    except zlib.error as exc:
        raise ValueError(f"a packed entry that does not decompress: {exc}") from exc
    if not d.eof:
        raise ValueError("a packed entry cut short")
    return data.decode()
