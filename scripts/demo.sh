#!/usr/bin/env bash
# The main job on the embedded default: generated data, local DVC remote, SQLite registry, Prefect's
# ephemeral API, CPU. Sets everything up on a fresh clone, then runs the whole retraining loop.
set -euo pipefail
if [[ $# -gt 0 ]]; then  # it takes no arguments: `--help` must not start a half-hour job
  echo "usage: bash scripts/demo.sh   (no arguments; DEMO_MODELS=\"sasrec\" trains a subset, TORCH_INDEX_URL picks" \
       "the torch build; README, Quick start)" >&2
  exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"

recsys bootstrap                 # raw store: dvc pull, or generate the default dataset and `dvc add` it
recsys data batch 1              # a new batch arrives in the inbox (the same batch twice is a no-op)
# ingest → dvc repro (prepare, then train + evaluate every model in params.yaml: MostPop, SASRec, BERT4Rec,
# MOJITO) → gate → registry. DEMO_MODELS="sasrec" trains a subset (MostPop, the gate's baseline, always runs).
# shellcheck disable=SC2086  # DEMO_MODELS is a space-separated list on purpose
python -m flows.pipeline ${DEMO_MODELS:+--models $DEMO_MODELS}
# The metrics of the models this run trained: with DEMO_MODELS, the others have none, and `dvc metrics show`
# would end on "DVC failed to load some metrics" and rows of dashes.
if [[ -n "${DEMO_MODELS:-}" ]]; then
  shown=()
  [[ ! -f metrics/mostpop.json ]] || shown+=(metrics/mostpop.json)
  for model in $DEMO_MODELS; do [[ "$model" == mostpop ]] || shown+=("metrics/$model.json"); done
  dvc metrics show "${shown[@]}"
else
  dvc metrics show
fi
