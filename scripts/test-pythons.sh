#!/usr/bin/env bash
# The pure tests (no broker, no browser: `-m "not kafka"`) on each other supported Python, each
# in its own venv (.venv-3.12, .venv-3.13) installed from the same pins as .venv. Run by
# scripts/test.sh at the lowest CPU priority while the whole suite runs on the main Python;
# the versions come from VIGIL_OTHER_PYTHONS (default "3.12 3.13"; empty: none). The versions
# run side by side (each pytest uses one core); each one's output is shown when all are done.
# Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The interpreter of Python $1: python3.X on PATH when it runs (pyenv's shim only runs the
# versions pyenv is told to use), else the newest pyenv-installed 3.X.
interpreter() {
  local v="$1" candidate
  if "python$v" -c "" >/dev/null 2>&1; then
    command -v "python$v"
    return
  fi
  for candidate in $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/$v".* 2>/dev/null | sort -V -r); do
    if [ -x "$candidate/bin/python$v" ]; then
      echo "$candidate/bin/python$v"
      return
    fi
  done
  return 1
}

# Python $1's venv, installed (idempotent, like bootstrap.sh), then its pure tests.
run_on() {
  local v="$1" PY VENV STAMP
  shift
  PY="$(interpreter "$v")" || { echo "Python $v not found (python$v or pyenv)"; return 1; }
  VENV="$ROOT/.venv-$v"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  STAMP="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
  if [ ! -f "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    # the same filter as bootstrap.sh: setuptools' information-only editable notice
    PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
      "$VENV/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" -e "$ROOT[test,openai-agents,langgraph,mcp]"
    touch "$STAMP"
  fi
  echo "== pure tests on $("$VENV/bin/python" -V)"
  (cd "$ROOT" && "$VENV/bin/python" -m pytest "$@" -m "not kafka")
}

LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
declare -A PIDS
for v in ${VIGIL_OTHER_PYTHONS-3.12 3.13}; do
  run_on "$v" "$@" >"$LOGS/$v.log" 2>&1 &
  PIDS[$v]=$!
done
failed=""
for v in "${!PIDS[@]}"; do
  wait "${PIDS[$v]}" || failed="$failed $v"
done
for v in ${VIGIL_OTHER_PYTHONS-3.12 3.13}; do
  cat "$LOGS/$v.log"
done
if [ -n "$failed" ]; then
  echo "pure tests failed on Python$failed" >&2
  exit 1
fi
