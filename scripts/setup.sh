#!/usr/bin/env bash
# Create .venv and install the project with pinned dependencies. Idempotent; sourced by demo.sh / test.sh.
# PyTorch 2.13.0 from the configured package index. TORCH_INDEX_URL picks the build instead, e.g.
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/demo.sh     # CPU only (PyPI's Linux
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 bash scripts/demo.sh   #   wheel bundles CUDA: GBs)
# Without TORCH_INDEX_URL an installed torch 2.13.0 of any build satisfies the pin and is kept; with it, an
# installed build other than the one its last path part names (cpu, cu128: torch 2.13.0+cpu, +cu128) is replaced.
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
# The install is redone when pyproject.toml or TORCH_INDEX_URL changes (unset: the stamp of pyproject alone).
stamp=".venv/.installed-$( { cat pyproject.toml; printf '%s' "${TORCH_INDEX_URL:-}"; } | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # Pinned exactly: an unpinned torch pulls several GB of CUDA wheels.
  torch_args=("torch==2.13.0")
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    torch_args+=(--index-url "$TORCH_INDEX_URL")
    build="${TORCH_INDEX_URL%/}"
    build="${build##*/}"
    have="$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
    if [[ -n "$have" && "$have" != "2.13.0+$build" ]]; then
      echo "setup: torch $have installed; TORCH_INDEX_URL names the $build build: replacing it" >&2
      torch_args+=(--force-reinstall)
    fi
  fi
  .venv/bin/python -m pip install --quiet "${torch_args[@]}"
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  touch "$stamp"
fi
# shellcheck disable=SC1091
source .venv/bin/activate
