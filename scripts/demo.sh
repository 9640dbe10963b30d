#!/usr/bin/env bash
# The main job on a fresh machine: install, start the local broker and registry, create the
# topics, run a worker and the ticker on the bundled scenario and print what comes out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec vigil demo "$@"
