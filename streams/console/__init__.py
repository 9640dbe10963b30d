"""``vigil console``: a downstream service that reads vigil's output topics into a queryable
SQLite view (``view``), serves it as JSON (``api``) and runs as its own process (``service``).
"""
