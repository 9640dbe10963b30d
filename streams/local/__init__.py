"""The local stack (broker and registry without Docker), the demo and its scenario."""
