"""Kafka plumbing: clients, admin, the topic catalogue, partitioning, offsets, security."""
