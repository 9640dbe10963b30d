#!/usr/bin/env bash
# Installs vigil, its pinned dependencies and the framework adapters' extras (their tests run
# the real frameworks) into .venv (idempotent). Sourced by the others.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
STAMP="$ROOT/.venv/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  "$ROOT/.venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  # setuptools ends every editable install of a package_dir mapping (schemas/ is
  # streams.contracts.schemas) with an information-only "Editable installation." warning
  # about same-named folders in the working directory; only that one is filtered out.
  PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    "$ROOT/.venv/bin/python" -m pip install --quiet -c "$ROOT/constraints.txt" -e "$ROOT[test,openai-agents,langgraph,mcp]"
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
