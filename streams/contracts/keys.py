"""The keys of what belongs to one execution: operations and approval requests.

Operation ids and approval request ids are chosen by the agent runtime and repeat across runs
(``call_1``, ``charge-1``): they name a thing only within their execution. The output topics
that carry such records are keyed by the **scoped key** ``scoped_key(execution_id, id)``, and
every id derived from an operation or a request hashes it (``streams.core.ids``;
docs/rules.md#ids-and-keys):

    scoped_key("exec-42", "charge-1") == "exec-42/charge-1"
    scoped_key("a/b", "c d")          == "a%2Fb/c%20d"

Each part is percent-encoded (RFC 3986, UTF-8, every character but the unreserved
``A-Z a-z 0-9 - . _ ~`` escaped), then the parts are joined with ``/``. An encoded part never
contains ``/``, so the key splits back into exactly its parts whatever characters the ids hold
(``split_key``); the common ids stay readable, and the key is safe in a URL path as it is.
A key contains no ``\\x1f`` either, the separator ``deterministic_id`` joins its parts with,
so an id hashed from it first can never be the id of another execution's thing.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

#: the separator between the parts of a scoped key (never inside an encoded part)
KEY_SEPARATOR = "/"

_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _encode(part: str) -> str:
    # Lone surrogates cannot be UTF-8 encoded strictly; kept as their code units, so that
    # even such a (hostile) id has a key of its own instead of failing the batch.
    return quote(part, safe="", errors="surrogatepass")


def scoped_key(execution_id: str, local_id: str) -> str:
    """The key of an operation or approval request: its execution's id and its own, each
    percent-encoded, joined by ``/`` (see the module's docstring)."""
    # The common case, once per output record: quote's work only when something needs it.
    if _PLAIN.issuperset(execution_id) and _PLAIN.issuperset(local_id):
        return f"{execution_id}/{local_id}"
    return f"{_encode(execution_id)}/{_encode(local_id)}"


def split_key(key: str) -> tuple[str, str]:
    """The execution id and the operation or request id of a ``scoped_key``; ``ValueError``
    for a text that is not one (an operation id alone, as keys were before scoping)."""
    parts = key.split(KEY_SEPARATOR)
    if len(parts) != 2:
        raise ValueError(f"not a scoped key (execution/id, each percent-encoded): {key!r}")
    execution_id, local_id = (unquote(p, errors="surrogatepass") for p in parts)
    if scoped_key(execution_id, local_id) != key:
        raise ValueError(f"not a canonical scoped key: {key!r}")
    return execution_id, local_id
