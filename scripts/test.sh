#!/usr/bin/env bash
# Sets up and runs the whole test suite (unit + slow end-to-end), as CI does.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
PREFECT_HOME="$(mktemp -d)"
export PREFECT_HOME
trap 'rm -rf "$PREFECT_HOME"' EXIT
python -m pytest -q "$@"
