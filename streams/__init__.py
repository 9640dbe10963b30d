"""vigil: what AI agents are really doing, from their event streams."""
