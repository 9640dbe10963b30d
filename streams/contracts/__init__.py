"""The public contracts: Avro models, the codec and compiled writers, the registry, AsyncAPI."""
