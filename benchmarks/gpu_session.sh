#!/usr/bin/env bash
# The GPU rows of issues 11 and 14, cut into pieces that each fit one device command (10 minutes on one H100).
# Written before any session had a GPU, so that a lease goes to measuring, not to working out commands.
#
# Session 16 had 15 device-minutes and used `quick` (all of it in one command, then the gaps on the warm
# machine): `BENCH_COMMIT=$(git rev-parse --short HEAD)` in the device command names the commit (the
# checkout travels without .git), and `set -o pipefail; bash benchmarks/gpu_session.sh quick 2>&1 | tee
# $OUT/quick.log` keeps the log. Run `quick` first in a short lease; the phases below suit a longer one.
#
# On this machine, once (the data beside the checkout does not travel to the device; .gpu-data does when
# it is carried):
#     mkdir -p .gpu-data && cp -r ../shared/data/ml-1m-half ../shared/data/ml-100k .gpu-data/
#     grep -qx '/.gpu-data/' .git/info/exclude || echo '/.gpu-data/' >> .git/info/exclude
# then one device `run` per phase, with carry [".gpu-data"]:
#     bash benchmarks/gpu_session.sh step     # throughput and all-users scoring, three models (≈ 1 min)
#     bash benchmarks/gpu_session.sh sasrec   # SASRec defaults, ml-1m-half, seeds 42–44, and a 10-s budget run
#     bash benchmarks/gpu_session.sh claims   # BERT4Rec and MOJITO in SASRec's regime, ml-1m-half, 3 seeds
#     bash benchmarks/gpu_session.sh wide     # SASRec at dim 128 (lr 2e-3 and 1e-3), ml-1m-half, 3 seeds (≈ 6 min)
#     bash benchmarks/gpu_session.sh stream   # warm vs cold stream, ml-1m-half, SASRec, 5 batches
#     bash benchmarks/gpu_session.sh bert4rec # BERT4Rec's quality candidates only, shared (as quick's end)
# Each phase merges its rows into benchmarks/results/*.json as the CPU runs do and, where $OUT is set (the
# device tool's folder that comes back), copies those files there: merge them into the checkout's own with
# the scripts' merge functions (bench_models.merge(rows, path) into results/models-gpu.json — GPU rows never go
# to models.json, whose (dataset, run, seed) keys they would take over — bench_stream.write_record), then
# rebuild the tables (python benchmarks/curves.py). Every phase runs under `timeout` a little inside the device's limit, with
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
# The SASRec defaults of sessions 6-20 as their rows name them (measured at params.yaml's dim 64, lr 1e-3 of
# then; without dim and lr the string builds today's defaults, so a new run at the old ones adds dim=64,lr=0.001)
SASREC_D64='sasrec:ce@residual=reference,n_heads=2,patience=20,grad_clip=0,windows=all,min_epochs=100,batching=random'
# params.yaml's SASRec since session 21 (benchmarks/curves.py SASREC_DEFAULT_RUN)
SASREC="${SASREC_D64},dim=128,lr=0.002"
# BERT4Rec's and MOJITO's defaults (benchmarks/curves.py BERT4REC_DEFAULT_RUN, MOJITO_DEFAULT_RUN); MOJITO's
# sessions 10-28 defaults as their rows name them (curves.py MOJITO_LONG, measured at the lr 1e-3 of then)
BERT4REC_LIS01='bert4rec@windows=all,min_epochs=200,patience=40,grad_clip=0,dropout=0.2,residual=reference,head_norm=true,last_item_share=0.1'
# (sessions 13-31's defaults, curves.py BERT4REC_LIS01; sessions 32-50 with the weights' average on,
# BERT4REC_EMA_WARMUP; since session 51 no attention dropout over 400 epochs, BERT4REC_AD0_E400)
BERT4REC="${BERT4REC_LIS01},ema=0.999,ema_warmup=true"
BERT4REC="${BERT4REC/patience=40/patience=80},attn_dropout=0,epochs=400,patience=400,min_epochs=0"
# session 53: twice its rate after a warm-up (curves.BERT4REC_AD0_E400_LR6, session 52's ml-100k lead) fell level
# or behind the defaults on ml-1m-half (CPU) after epoch ~160, so no GPU run of it; decayed linearly to a quarter
# of it by epoch 400 (curves.BERT4REC_AD0_E400_LIN6) its ml-100k validation leads, its test trails (RESULTS.md),
# and ml-1m-half has one CPU seed (validation level, test lower): its three seeds here decide
BERT4REC_AD0_E400_LIN6="${BERT4REC},lr=0.006,warmup_steps=100,lr_schedule=linear,lr_final=0.25"
MOJITO_LONG='mojito@batching=random,patience=20,min_epochs=100,windows=all'
MOJITO="${MOJITO_LONG},lr=0.002"
# MOJITO at SASRec's width and rate (curves.py's MOJITO_WIDE; BERT4Rec's, BERT4REC_WIDE, is concluded: 0.1677
# against 0.1673 at its own width, session 23)
MOJITO_WIDE="${MOJITO_LONG},dim=128,lr=0.002"
# SASRec's defaults with the training step captured as a CUDA graph (curves.py SASREC_GRAPHED): the GPU time
# ratios' base; MOJITO graphed at its sessions 10-28 defaults, at SASRec's width (README's GPU setting) and at
# today's defaults (curves.py MOJITO_GRAPHED, MOJITO_WIDE_GRAPHED, MOJITO_LR2_GRAPHED)
SASREC_GRAPHED="${SASREC},cuda_graph=true"
MOJITO_GRAPHED="${MOJITO_LONG},cuda_graph=true"
MOJITO_WIDE_GRAPHED="${MOJITO_WIDE},cuda_graph=true"
MOJITO_LR2_GRAPHED="${MOJITO},cuda_graph=true"
# BERT4Rec candidates for its ml-1m-half aim (curves.py BERT4REC_MASK02_GRAPHED, BERT4REC_PEER_GRAPHED), on its
# defaults (Bernoulli masking) graphed: the paper's ML-1M mask rate, and RecTools' BERT4Rec shape (d 256,
# 4 heads, lr 1e-3, mask rate 0.15)
BERT4REC_GRAPHED="${BERT4REC_LIS01},cuda_graph=true"
BERT4REC_MASK02_GRAPHED="${BERT4REC_GRAPHED},mask_prob=0.2"
BERT4REC_PEER_GRAPHED="${BERT4REC_GRAPHED},dim=256,n_heads=4,ffn_dim=1024,lr=0.001,mask_prob=0.15"
# session 28's next BERT4Rec candidates (both above scored below the defaults): a higher mask rate, and width
# 128 with more dropout (curves.py BERT4REC_MASK04_GRAPHED, BERT4REC_WIDE_D03_GRAPHED)
BERT4REC_MASK04_GRAPHED="${BERT4REC_GRAPHED},mask_prob=0.4"
BERT4REC_WIDE_D03_GRAPHED="${BERT4REC_LIS01/dropout=0.2/dropout=0.3},dim=128,ffn_dim=512,lr=0.002,cuda_graph=true"
# session 29's: a moving average of the weights (curves.py BERT4REC_EMA_GRAPHED)
BERT4REC_EMA_GRAPHED="${BERT4REC_GRAPHED},ema=0.999"
# session 32's: a slower average, and the average on mask rate 0.4 (curves.py BERT4REC_EMA9995_GRAPHED,
# BERT4REC_MASK04_EMA_GRAPHED)
BERT4REC_EMA9995_GRAPHED="${BERT4REC_GRAPHED},ema=0.9995"
BERT4REC_MASK04_EMA_GRAPHED="${BERT4REC_MASK04_GRAPHED},ema=0.999"
# and, after them, the average with its decay warmed up (curves.py BERT4REC_EMA_WARMUP_GRAPHED)
BERT4REC_EMA_WARMUP_GRAPHED="${BERT4REC_EMA_GRAPHED},ema_warmup=true"
# session 33's: twice the patience (curves.py BERT4REC_EMA_WARMUP_P80_GRAPHED; the average's validation still rose
# when patience 40 stopped it)
BERT4REC_EMA_WARMUP_P80_GRAPHED="${BERT4REC_EMA_WARMUP_GRAPHED/patience=40/patience=80}"
# bench_step.py's MOJITO at README's GPU width
MOJITO_WIDE_STEP='mojito@dim=128'
# the 10-s budget's large-batch SASRec (add batch_size=N): sqrt-scaled rate, a short warm-up, no epoch floor
BIG="${SASREC},lr_scaling=sqrt,warmup_steps=50,min_epochs=0"

run() { timeout --signal=INT "$LIMIT_S" "$PYTHON" "$@"; }

# quick's and bert4rec's budget: QUICK_S seconds of work from the script's start
budget_s="${QUICK_S:-540}"
mkdir -p "$WORK"
gpu=(--dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --results benchmarks/results/models-gpu.json)
step=(benchmarks/bench_step.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --batches 24)
back() { [[ -z "${OUT:-}" ]] || cp benchmarks/results/step.json benchmarks/results/models-gpu.json "$OUT/" 2>/dev/null || true; }
left() { echo $(( budget_s - SECONDS )); }
within() {  # within N CMD...: CMD under a timeout of N seconds, or of what is left if less; skipped under 20 s
  local t=$(( $(left) - 10 ))
  (( t >= 20 )) || { echo "gpu_session: no time left for: ${*:2:3}" >&2; return 1; }
  (( t < $1 )) || t=$1; shift
  timeout --signal=INT -k 10 "$t" "$@"
}
done_on_gpu() {  # a row of run $1, seed 42 + $2 that stopped early is already in models-gpu.json
  "$PYTHON" - "$1" "$2" <<'PY'
import json, pathlib, sys
path = pathlib.Path("benchmarks/results/models-gpu.json")
rows = json.loads(path.read_text()) if path.is_file() else []
sys.exit(0 if any(r["dataset"] == "ml-1m-half" and r["run"] == sys.argv[1] and r["seed"] == 42 + int(sys.argv[2])
              and r["stopped_by"] == "early_stopping" for r in rows) else 1)
PY
}
# shared_runs N PAIR...: the first N of the "RUN OFFSET" pairs as quality seeds at once on the one device
# (--shared-device N: their times go into no ratio), each under what is left of the budget less 45 s
shared_runs() {
  local n=$1; shift
  (( n <= $# )) || n=$#
  local cap=$(( $(left) - 45 ))
  if (( n == 0 || cap < 60 )); then
    echo "gpu_session: no claim runs ($# missing, ${cap}s left)" >&2
    return 0
  fi
  echo "gpu_session: $n claim runs at once for up to ${cap}s: ${*:1:$n}" >&2
  local pids=() pair i
  for pair in "${@:1:$n}"; do
    timeout --signal=INT -k 10 $(( cap + 30 )) "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" \
      --work-dir "$WORK/shared-${#pids[@]}" --seed-offset "${pair##* }" --shared-device "$n" --threads 2 \
      --max-minutes "$(awk "BEGIN{print $cap/60}")" --runs "${pair% *}" > "$WORK/shared-${#pids[@]}.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || echo "gpu_session: claim run $i failed or was cut (log below)" >&2
    grep -v "^  " "$WORK/shared-$i.log" | tail -n 4 >&2
  done
}

case "$phase" in
  step)
    [[ "$DEVICE" != cuda ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    run benchmarks/bench_step.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" --batches 24
    results=(step.json)
    ;;
  sasrec)
    # the defaults as trained on the CPU (batch 128): quality and time to best over three seeds
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" \
      --results benchmarks/results/models-gpu.json --seeds 3 \
      --runs "$SASREC" --work-dir "$WORK/sasrec"
    # the issue's budget: test NDCG@10 of what 10 s of training (validation included) reaches, large batches
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" \
      --results benchmarks/results/models-gpu.json \
      --max-minutes 0.1667 --work-dir "$WORK/budget" \
      --runs "${BIG},batch_size=1024" "${BIG},batch_size=2048"
    results=(models-gpu.json)
    ;;
  claims)
    # BERT4Rec's and MOJITO's defaults, against the SASRec seeds of the `sasrec` phase
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" \
      --results benchmarks/results/models-gpu.json --seeds 3 \
      --runs "$MOJITO" "$BERT4REC" "$BERT4REC_AD0_E400_LIN6" \
      --work-dir "$WORK/claims"
    results=(models-gpu.json)
    ;;
  wide)
    # SASRec at dim 128 to early stopping, seeds 42–44 (session 19: on the CPU, dim 128 at lr 2e-3 reached
    # validation 0.194 by epoch 24, where dim 64 takes ~90 epochs; on a launch-bound GPU the width costs little
    # a step): params.yaml's SASRec since session 21, and the same width at the old rate
    run benchmarks/bench_models.py --dataset ml-1m-half --data-root "$DATA_ROOT" --device "$DEVICE" \
      --results benchmarks/results/models-gpu.json --seeds 3 \
      --runs "$SASREC" "${SASREC_D64},dim=128,lr=0.001" --work-dir "$WORK/wide"
    results=(models-gpu.json)
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
    # telling first, each piece bounded so that a slow one cannot starve the rest. What issue 11 still needs
    # (after session 32, whose lease ran BERT4Rec's candidates: `bert4rec` below):
    #   1. alone on the device and timed: graphed SASRec's defaults, seed 42 (the same-lease baseline), and
    #      BERT4Rec's defaults graphed (the weights' average warmed up since session 32,
    #      BERT4REC_EMA_WARMUP_GRAPHED, seed 42): BERT4Rec's GPU time ratio on the path a GPU user runs;
    #   2. the step and all-users scoring of MOJITO at width 128 (MOJITO_WIDE_STEP), graphed: the <= 0.05 s
    #      scoring aim for README's MOJITO GPU setting (its defaults score in 0.044 s);
    #   3. quality seeds, QUICK_SHARED (default 5) processes at once with --shared-device: BERT4Rec's defaults
    #      graphed on seeds 42-44 (its 0.90 x aim on ml-1m-half: without the warm-up the average scored 0.89 x),
    #      MOJITO's defaults (lr 2e-3 since session 29) graphed seeds 43-44, and the older claim seeds.
    #      curves.py takes their times into no ratio (the rows of seeds trained alone give the claims' times).
    # With QUICK_STEPS=1 it first measures the step rows again (the three models eager, SASRec and MOJITO graphed).
    # GPU rows go to results/models-gpu.json: their (dataset, run, seed) keys would replace the CPU rows in
    # models.json. Commit the rows that come back (benchmarks/curves.py builds the GPU tables from them).
    [[ "$DEVICE" != cuda ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    if [[ "${QUICK_STEPS:-0}" == 1 ]]; then
      within 120 "$PYTHON" "${step[@]}" || echo "gpu_session: step failed" >&2
      for batch in 128 1024; do
        within 90 "$PYTHON" "${step[@]}" --models sasrec mojito --batch-size "$batch" --cuda-graph \
          || echo "gpu_session: graphed step at batch $batch failed" >&2
      done
      back
    fi
    within 80 "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --max-minutes 1 --work-dir "$WORK/sasrec-graphed" \
      --runs "$SASREC_GRAPHED" || echo "gpu_session: graphed SASRec failed" >&2
    back
    within 170 "$PYTHON" benchmarks/bench_models.py "${gpu[@]}" --max-minutes 2.4 --work-dir "$WORK/bert4rec-graphed" \
      --runs "$BERT4REC_EMA_WARMUP_GRAPHED" || echo "gpu_session: graphed BERT4Rec failed" >&2
    back
    within 70 "$PYTHON" "${step[@]}" --models "$MOJITO_WIDE_STEP" --batch-size 128 --cuda-graph \
      || echo "gpu_session: MOJITO's graphed step at width 128 failed" >&2
    back
    # the quality seeds still missing, most telling first; a row that stopped early is done (one the clock
    # stopped is trained again)
    todo=()
    for pair in "$BERT4REC_AD0_E400_LIN6 0" "$BERT4REC_AD0_E400_LIN6 1" "$BERT4REC_AD0_E400_LIN6 2" \
                "$BERT4REC 0" "$BERT4REC 1" "$BERT4REC 2" \
                "$BERT4REC_EMA_WARMUP_GRAPHED 0" "$BERT4REC_EMA_WARMUP_GRAPHED 1" "$BERT4REC_EMA_WARMUP_GRAPHED 2" \
                "$MOJITO_LR2_GRAPHED 1" "$MOJITO_LR2_GRAPHED 2" \
                "$MOJITO_WIDE_GRAPHED 0" "$MOJITO_WIDE_GRAPHED 1" "$MOJITO_WIDE_GRAPHED 2" \
                "$MOJITO 0" "$MOJITO 1" "$MOJITO 2"; do
      done_on_gpu "${pair% *}" "${pair##* }" || todo+=("$pair")
    done
    shared_runs "${QUICK_SHARED:-5}" "${todo[@]}"
    back
    results=()  # each piece copied its files already
    ;;
  bert4rec)
    # Issue 11's last open aim (BERT4Rec >= 0.90 x SASRec on ml-1m-half; 0.89 x with train.ema 0.999,
    # session 32) and nothing else: QUICK_SHARED (default 6) quality seeds at once for QUICK_S seconds, most
    # telling first; a pair already in models-gpu.json (stopped early) is skipped. Session 32 ran everything
    # up to the warm-up seeds: BERT4Rec's defaults since then (the average with its decay warmed up), graphed,
    # on five seeds (their mean is what the aim reads), then twice the patience (session 33: the average's
    # validation still rose when patience 40 stopped it). Same use as quick: `QUICK_S=545 ... gpu_session.sh
    # bert4rec`, carry .gpu-data.
    [[ "$DEVICE" != cuda ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    todo=()
    for pair in "$BERT4REC_EMA_GRAPHED 0" "$BERT4REC_EMA_GRAPHED 1" "$BERT4REC_EMA_GRAPHED 2" \
                "$BERT4REC_MASK04_GRAPHED 0" "$BERT4REC_MASK04_EMA_GRAPHED 0" "$BERT4REC_EMA9995_GRAPHED 0" \
                "$BERT4REC_WIDE_D03_GRAPHED 0" "$BERT4REC_EMA9995_GRAPHED 1" "$BERT4REC_EMA9995_GRAPHED 2" \
                "$BERT4REC_EMA_WARMUP_GRAPHED 0" "$BERT4REC_EMA_WARMUP_GRAPHED 1" "$BERT4REC_EMA_WARMUP_GRAPHED 2" \
                "$BERT4REC_EMA_WARMUP_GRAPHED 3" "$BERT4REC_EMA_WARMUP_GRAPHED 4" \
                "$BERT4REC_EMA_WARMUP_P80_GRAPHED 0" "$BERT4REC_EMA_WARMUP_P80_GRAPHED 1" \
                "$BERT4REC_EMA_WARMUP_P80_GRAPHED 2"; do
      done_on_gpu "${pair% *}" "${pair##* }" || todo+=("$pair")
    done
    shared_runs "${QUICK_SHARED:-6}" "${todo[@]}"
    back
    results=()
    ;;
  *)
    echo "usage: bash benchmarks/gpu_session.sh quick|bert4rec|step|sasrec|claims|wide|stream (see the top of this file)" >&2
    exit 2
    ;;
esac

if [[ -n "${OUT:-}" ]]; then
  for f in "${results[@]}"; do cp "benchmarks/results/$f" "$OUT/"; done
fi
