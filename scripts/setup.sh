#!/usr/bin/env bash
# Create .venv and install the project with pinned dependencies. Idempotent; sourced by demo.sh / test.sh.
# CPU PyTorch by default. On a CUDA machine, install the CUDA build of the same version first, e.g.
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128
# and this script keeps it (the pin is satisfied).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false GX_ANALYTICS_ENABLED=false
# A loaded 2-core machine can take longer than the default 20 s to start the ephemeral API.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="${PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS:-120}"
export PYTHONDONTWRITEBYTECODE=1

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # Pinned exactly: an unpinned torch pulls several GB of CUDA wheels.
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
# shellcheck disable=SC1091
source .venv/bin/activate
