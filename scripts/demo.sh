#!/usr/bin/env bash
# The main job on the embedded default: generated data, local DVC remote, SQLite registry, Prefect's
# ephemeral API, CPU. Sets everything up on a fresh clone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"

recsys bootstrap
dvc repro
dvc metrics show
