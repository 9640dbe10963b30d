#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the pinned Python packages, then pytest.
# The session fixture starts the local Kafka broker and schema registry (downloaded from Maven
# Central into ~/.cache/vigil on first use) unless KAFKA_BOOTSTRAP_SERVERS and
# SCHEMA_REGISTRY_URL name a cluster, and stops what it started. Installs chromium (apt) when
# /usr/bin/chromium is missing.
set -euo pipefail
# The console's browser tests drive Debian's chromium through Playwright (no browser download);
# the alert bridge's tests run Debian's Alertmanager; promtool (Debian's prometheus) checks
# and unit-tests docker/prometheus/.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/prometheus-alertmanager ] || [ ! -x /usr/bin/promtool ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium prometheus-alertmanager prometheus >/dev/null
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
ruff check .
ruff format --check .
# Everything on .venv's Python; meanwhile the pure tests on Python 3.12 and 3.13 (own venvs,
# same pins) at the lowest CPU priority: the real-broker tests spend most of their time
# waiting on the broker and the workers, and the CPU they leave idle is enough for the others.
OTHERS_LOG="$(mktemp)"
trap 'rm -f "$OTHERS_LOG"' EXIT
nice -n 19 bash "$ROOT/scripts/test-pythons.sh" "$@" >"$OTHERS_LOG" 2>&1 &
OTHERS=$!
# The main run in VIGIL_TEST_PROCESSES pytest processes (pytest-xdist; default 2, 0: one
# process), a test file to a process, all of them sharing the one local stack the first to need
# it starts (tests/conftest.py): most real-broker tests wait on the broker and the workers, and
# a second process fills that time.
main=0
python -m pytest -n "${VIGIL_TEST_PROCESSES:-2}" --dist loadfile "$@" || main=$?
others=0
wait "$OTHERS" || others=$?
cat "$OTHERS_LOG"
[ "$main" -eq 0 ] || exit "$main"
exit "$others"
