#!/usr/bin/env bash
# The main job on the embedded default: generated data, local DVC remote, SQLite registry, Prefect's
# ephemeral API, CPU. Sets everything up on a fresh clone, then runs the whole retraining loop.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"

recsys bootstrap                 # raw store: dvc pull, or generate the default dataset and `dvc add` it
recsys data batch 1              # a new batch arrives in the inbox (the same batch twice is a no-op)
python -m flows.pipeline         # ingest → dvc repro (prepare, train, evaluate) → gate → registry
dvc metrics show
