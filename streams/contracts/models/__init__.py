"""Pydantic mirrors of the Avro contracts in ``schemas/``.

The ``.avsc`` files are the public contract; these models are how Python code holds the same
records. ``tests/test_contracts.py`` proves that the two agree field by field.
"""
