#!/usr/bin/env bash
# The GPU rows of issues 11 and 14, cut into pieces that each fit one device command (10 minutes on one H100).
# No session so far was lent a GPU; this is the plan for the first one that is, so its 30 device-minutes go
# to measuring, not to working out commands.
#
# On this machine, once (the data beside the checkout does not travel to the device; .gpu-data does when
# it is carried):
#     mkdir -p .gpu-data && cp -r ../shared/data/ml-1m-half ../shared/data/ml-100k .gpu-data/
#     grep -qx '/.gpu-data/' .git/info/exclude || echo '/.gpu-data/' >> .git/info/exclude
# then one device `run` per phase, with carry [".gpu-data"]:
#     bash benchmarks/gpu_session.sh step     # throughput and all-users scoring, three models (≈ 1 min)
#     bash benchmarks/gpu_session.sh sasrec   # SASRec defaults, ml-1m-half, seeds 42–44, and a 10-s budget run
#     bash benchmarks/gpu_session.sh claims   # BERT4Rec and MOJITO in SASRec's regime, ml-1m-half, 3 seeds
#     bash benchmarks/gpu_session.sh stream   # warm vs cold stream, ml-1m-half, SASRec, 5 batches
# Each phase merges its rows into benchmarks/results/*.json as the CPU runs do and, where $OUT is set (the
# device tool's folder that comes back), copies those files there: merge them into the checkout's own with
# the scripts' merge functions (bench_models.merge, bench_stream.write_record), then rebuild the tables
# (python benchmarks/curves.py). Every phase runs under `timeout` a little inside the device's limit, with
# --work-dir so a phase cut short can be run again while the machine is still warm (its idle release is
# short: call again at once).
#
# Environment: PYTHON (default python3: on the device image it is the interpreter that holds CUDA torch),
# DATA_ROOT (default .gpu-data, else ../shared/data), DEVICE (default cuda; `DEVICE=cpu` checks the
# commands on a CPU box, slowly), LIMIT_S (default 570).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase="${1:-}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
LIMIT_S="${LIMIT_S:-570}"
if [[ -z "${DATA_ROOT:-}" ]]; then
  if [[ -d .gpu-data ]]; then DATA_ROOT=.gpu-data; else DATA_ROOT=../shared/data; fi
fi
if [[ ! -d "$DATA_ROOT/ml-1m-half" ]]; then
  echo "gpu_session: no ml-1m-half under DATA_ROOT=$DATA_ROOT; copy ../shared/data/ml-1m-half there (see the top of this file)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK="${TMPDIR:-/tmp}/recsys-gpu-session"
SASREC='sasrec:ce@residual=reference,n_heads=2,patience=20,grad_clip=0,windows=all,min_epochs=100,batching=random'

run() { timeout --signal=INT "$LIMIT_S" "$PYTHON" "$@"; }

case "$phase" in
  step)
    [[ "$DEVICE" != cuda ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    run benchmarks/bench_step.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --batches 24
    results=(step.json)
    ;;
  sasrec)
    # the defaults as trained on the CPU (batch 128): quality and time to best over three seeds
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --seeds 3 \
      --runs "$SASREC" --work-dir "$WORK/sasrec"
    # the issue's budget: test NDCG@10 of what 10 s of training (validation included) reaches, large batches
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" \
      --max-minutes 0.1667 --work-dir "$WORK/budget" \
      --runs "${SASREC},batch_size=1024,lr_scaling=sqrt,warmup_steps=50,min_epochs=0" \
             "${SASREC},batch_size=2048,lr_scaling=sqrt,warmup_steps=50,min_epochs=0"
    results=(models.json)
    ;;
  claims)
    # BERT4Rec's and MOJITO's defaults (benchmarks/curves.py BERT4REC_DEFAULT_RUN, MOJITO_LONG), against the
    # SASRec seeds of the `sasrec` phase
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --seeds 3 \
      --runs 'mojito@batching=random,patience=20,min_epochs=100,windows=all' \
             'bert4rec@windows=all,min_epochs=200,patience=40,grad_clip=0,dropout=0.2,residual=reference,head_norm=true,last_item_share=0.1' \
      --work-dir "$WORK/claims"
    results=(models.json)
    ;;
  stream)
    # one cold line, two warm; a --cold-only helper on the same GPU trains cold runs newest step first
    stream=(benchmarks/bench_stream.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE"
            --models sasrec 'sasrec@warm_keep=0.7' --batches 5 --work-dir "$WORK/stream")
    run "${stream[@]}" --cold-only &
    helper=$!
    run "${stream[@]}"
    wait "$helper" || echo "gpu_session: the cold helper stopped early (the main process trained what it left)" >&2
    results=(stream.json)
    ;;
  *)
    echo "usage: bash benchmarks/gpu_session.sh step|sasrec|claims|stream (see the top of this file)" >&2
    exit 2
    ;;
esac

if [[ -n "${OUT:-}" ]]; then
  for f in "${results[@]}"; do cp "benchmarks/results/$f" "$OUT/"; done
fi
