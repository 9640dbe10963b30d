"""Faust agents: the thin stream-processing shell around ``streams.core``."""
