"""The read side: the worker's HTTP API, read model, live feed and metrics."""
