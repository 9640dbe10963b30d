#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the pinned Python packages, then pytest.
# The session fixture starts the local Kafka broker and schema registry (downloaded from Maven
# Central into ~/.cache/vigil on first use) unless KAFKA_BOOTSTRAP_SERVERS and
# SCHEMA_REGISTRY_URL name a cluster, and stops what it started.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
ruff check .
ruff format --check .
python -m pytest "$@"
