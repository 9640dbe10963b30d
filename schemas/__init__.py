"""vigil's Avro contracts, installed as the package ``streams.contracts.schemas``."""
