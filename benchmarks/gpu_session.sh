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
  quick)
    # The whole of a 15-minute device lease in one command (QUICK_S seconds of work, default 540), most
    # telling first, each piece bounded so a slow one cannot starve the rest: the step/scoring rows; the
    # 10-s budget at three batch sizes (seed 42) and at the middle one for seeds 43–44; the SASRec defaults
    # on seed 42 (time to best); then BERT4Rec's and MOJITO's defaults on seed 42, each given half of what
    # is left by --max-minutes (a row the clock stopped says so: `stopped_by: time_limit`). GPU rows go to
    # results/models-gpu.json (their (dataset, run, seed) keys would replace the CPU rows in models.json).
    budget_s="${QUICK_S:-540}"
    gpu=(--dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --results benchmarks/results/models-gpu.json)
    back() { [[ -z "${OUT:-}" ]] || cp benchmarks/results/step.json benchmarks/results/models-gpu.json "$OUT/" 2>/dev/null || true; }
    left() { echo $(( budget_s - SECONDS )); }
    [[ "$DEVICE" != cuda ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    timeout --signal=INT 150 "$PYTHON" benchmarks/bench_step.py --dataset ml-1m-half --data-root "$DATA_ROOT" \
      --device "$DEVICE" --batches 24 || echo "gpu_session: step failed" >&2
    back
    big="${SASREC},lr_scaling=sqrt,warmup_steps=50,min_epochs=0"
    timeout --signal=INT 150 "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --max-minutes 0.1667 \
      --work-dir "$WORK/budget" --runs "${big},batch_size=512" "${big},batch_size=1024" "${big},batch_size=2048" \
      || echo "gpu_session: budget runs failed" >&2
    back
    timeout --signal=INT 100 "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --max-minutes 0.1667 \
      --work-dir "$WORK/budget" --seeds 2 --seed-offset 1 --runs "${big},batch_size=1024" \
      || echo "gpu_session: budget seeds failed" >&2
    back
    cap=$(( $(left) / 2 - 20 )); (( cap < 150 )) || cap=150
    if (( cap > 20 )); then
      timeout --signal=INT $(( cap + 60 )) "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --work-dir "$WORK/sasrec" \
        --max-minutes "$(awk "BEGIN{print $cap/60}")" --runs "$SASREC" || echo "gpu_session: sasrec failed" >&2
      back
    fi
    for run in 'bert4rec@windows=all,min_epochs=200,patience=40,grad_clip=0,dropout=0.2,residual=reference,head_norm=true,last_item_share=0.1' \
               'mojito@batching=random,patience=20,min_epochs=100,windows=all'; do
      cap=$(( $(left) / 2 - 25 )); [[ $run == mojito* ]] && cap=$(( $(left) - 45 ))
      (( cap > 20 )) || { echo "gpu_session: no time left for $run" >&2; continue; }
      timeout --signal=INT $(( cap + 40 )) "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --work-dir "$WORK/claims" \
        --max-minutes "$(awk "BEGIN{print $cap/60}")" --runs "$run" || echo "gpu_session: $run failed" >&2
      back
    done
    results=()  # each piece copied its files already
    ;;
  *)
    echo "usage: bash benchmarks/gpu_session.sh quick|step|sasrec|claims|stream (see the top of this file)" >&2
    exit 2
    ;;
esac

if [[ -n "${OUT:-}" ]]; then
  for f in "${results[@]}"; do cp "benchmarks/results/$f" "$OUT/"; done
fi
