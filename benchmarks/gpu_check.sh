#!/usr/bin/env bash
# The GPU check: batchlab's 7B experiment and every CUDA-only path, on one GPU machine with PyTorch
# and transformers but no network and no pydantic, in under 9 minutes (the device tool allows 10 per
# command and 15 per task, machine start included). Random Mistral-7B-v0.3 weights in fp16
# (backend.model=random:mistral-7b): timing does not depend on weight values, and no hub is reachable.
#
# Prepare here (PyPI reachable), once:   bash benchmarks/gpu_wheels.sh     # -> .whl/ (git-ignored, ~3 MB)
# Run through the device tool:
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
#                --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
#                bash benchmarks/gpu_check.sh $OUT",
#       carry=[".whl"], timeout_s=600)
# (the command is one line; the repo itself travels as the working directory, batchlab runs from it).
#
# Stages, each under `timeout` with its own budget (seconds; they add up to BUDGET_TOTAL <= 540, so
# the command ends inside 9 minutes whatever hangs; a stage that runs out is recorded and the next
# one starts):
#   env       10   nvidia-smi, versions, imports
#   tests     70   pytest tests/backends/test_cuda.py (the CUDA-only tests; skipped on CPU machines)
#   engine    80   benchmarks/gpu_check.py engine: decode step of the step engine vs generate() at
#                  batch 16 and 64 (target <= 1.2x); a deliberately small KV budget; a real oversize
#                  batch (torch.OutOfMemoryError under an allocator cap) and dynamic's back-off
#   sweep    170   configs/full.yaml shortened: naive vs dynamic vs continuous at RATES (default
#                  4, 8, 16 req/s: around request-level batching's knee, estimated), 8 s of traffic
#                  after 2 s of warm-up, outputs of 64 tokens, one repeat
#   profile-iteration  45   batchlab profile --strategy continuous (the step engine)
#   profile-request    50   batchlab profile --strategy dynamic (generate() batches)
#   validate  80   batchlab validate at VAL_RATES (default 6 and 12 req/s: rates the sweep did not
#                  run; a profile sees no rates at all), dynamic and continuous, 6 s per point
#   ratios    10   the roofline preset mistral-7b-h200 against each measured profile, per term
# Output: $OUT/gpu_check.log (everything printed), $OUT/stages.json (rc and seconds per stage),
# $OUT/engine.json, $OUT/ratios.json, $OUT/report.md (the sweep's report) and
# $OUT/gpu_check.tar.gz: the folder gpu_check/ with every CSV, JSON, YAML, report and plot of every
# stage (sweep/, validate/, profile-*.json, engine.json, ratios.json, logs). Six files: the device tool
# brings back at most 8, each under 16 MiB.
# Knobs (environment): GPU_CHECK_MODEL, _DEVICE, _DTYPE, _RATES, _VAL_RATES, _DURATION, _STAGES,
# _PRESET; PYTHON. A CPU dry run of the plumbing (minutes, tiny model):
#   GPU_CHECK_MODEL=random:mini-llama GPU_CHECK_DEVICE=cpu GPU_CHECK_DTYPE=float32 GPU_CHECK_DURATION=1 \
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh /tmp/gpu-dry
set -uo pipefail
shopt -s nullglob
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUT_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MODEL=${GPU_CHECK_MODEL:-random:mistral-7b}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
DTYPE=${GPU_CHECK_DTYPE:-float16}
RATES=${GPU_CHECK_RATES:-[4,8,16]}
VAL_RATES=${GPU_CHECK_VAL_RATES:-[6,12]}
DURATION=${GPU_CHECK_DURATION:-8}
PRESET=${GPU_CHECK_PRESET:-mistral-7b-h200}
STAGES=${GPU_CHECK_STAGES:-env tests engine sweep profile-iteration profile-request validate ratios}
declare -A BUDGET=([env]=10 [tests]=70 [engine]=80 [sweep]=170 [profile-iteration]=45 [profile-request]=50
                   [validate]=80 [ratios]=10)
BUDGET_TOTAL=540   # + up to 5 s of --kill-after per stage and the packing: inside the tool's 600 s
total=0
for b in "${BUDGET[@]}"; do total=$((total + b)); done
(( total <= BUDGET_TOTAL )) || { echo "gpu_check: stage budgets add up to $total s > $BUDGET_TOTAL s" >&2; exit 2; }

mkdir -p "$OUT"
W=$(mktemp -d)/gpu_check
mkdir -p "$W"
cd "$REPO" || exit 1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg BATCHLAB_DATA="$W/data"
LOG="$OUT/gpu_check.log"
BL=("$PY" -m batchlab.cli)
# configs/full.yaml as it is, shortened: the same backend, strategies, knobs and prompt lengths
COMMON=(--set "backend.model=$MODEL" --set "backend.device=$DEVICE" --set "backend.dtype=$DTYPE"
        --set backend.warmup_batches=1 --set traffic.repeats=1 --set traffic.warmup_s=2
        --set "traffic.duration_s=$DURATION" --set traffic.output_len=64)
PROFILE_GRID=(--batch-sizes 1,4,16,64 --contexts 64,256 --prompts 64,256,1024 --new-tokens 10 --repeats 2 --warmup 1)

echo "[]" > "$W/stages.json"
stage() {   # stage NAME COMMAND...: run under its budget, log, record rc and seconds
    local name=$1 start=$SECONDS rc
    shift
    [[ " $STAGES " == *" $name "* ]] || return 0
    echo "=== $name (budget ${BUDGET[$name]} s, at $((SECONDS - T0)) s)" | tee -a "$LOG"
    timeout --kill-after=5 "${BUDGET[$name]}" "$@" 2>&1 | tee -a "$LOG" "$W/$name.log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: rc $rc in $((SECONDS - start)) s$([[ $rc == 124 || $rc == 137 ]] && echo ' (ran out of its budget)')" | tee -a "$LOG"
    "$PY" - "$W/stages.json" "$name" "$rc" "$((SECONDS - start))" "${BUDGET[$name]}" <<'EOF'
import json, sys
p, name, rc, s, b = sys.argv[1:]
rows = json.load(open(p)) + [{"stage": name, "rc": int(rc), "seconds": int(s), "budget_s": int(b)}]
json.dump(rows, open(p, "w"), indent=1)
EOF
}

env_facts() {   # run by `timeout` in a child bash: exported with PY
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || echo "no nvidia-smi"
    "$PY" -c "import sys, torch, transformers, pydantic; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'pydantic', pydantic.__version__)"
    "$PY" -m batchlab.cli --help > /dev/null && echo "batchlab imports"
}
export -f env_facts
export PY

T0=$SECONDS
echo "gpu_check: $MODEL on $DEVICE ($DTYPE), rates $RATES, validation rates $VAL_RATES, $DURATION s per point; work dir $W" | tee "$LOG"
stage env bash -c env_facts
stage tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/backends/test_cuda.py
stage engine "$PY" benchmarks/gpu_check.py engine --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --out "$W/engine.json"
# NOTE: without full.yaml's vllm: a managed baseline needs the model's files (not a random shape)
# and its own environment, minutes to install, which this check's budget does not hold
stage sweep "${BL[@]}" run configs/full.yaml --out "$W/sweep" "${COMMON[@]}" --set "traffic.rates=$RATES" \
    --set "strategies=[naive,dynamic,continuous]"
stage profile-iteration "${BL[@]}" profile configs/full.yaml --strategy continuous "${PROFILE_GRID[@]}" \
    --out "$W/profile-iteration.json" "${COMMON[@]}"
stage profile-request "${BL[@]}" profile configs/full.yaml --strategy dynamic "${PROFILE_GRID[@]}" \
    --out "$W/profile-request.json" "${COMMON[@]}"
stage validate "${BL[@]}" validate configs/full.yaml --profile "$W/profile-iteration.json" --profile "$W/profile-request.json" \
    --out "$W/validate" "${COMMON[@]}" --set "traffic.rates=$VAL_RATES" --set "strategies=[dynamic,continuous]" \
    --set "traffic.duration_s=$(( DURATION > 6 ? 6 : DURATION ))"
stage ratios "$PY" benchmarks/gpu_check.py ratios --preset "$PRESET" --out "$W/ratios.json" "$W"/profile-*.json

echo "gpu_check: done in $((SECONDS - T0)) s (budget $BUDGET_TOTAL s)" | tee -a "$LOG"
cp "$W/stages.json" "$OUT/"
for f in engine.json ratios.json; do [[ -f "$W/$f" ]] && cp "$W/$f" "$OUT/"; done
[[ -f "$W/sweep/report.md" ]] && cp "$W/sweep/report.md" "$OUT/report.md"
cp "$LOG" "$W/"
rm -rf "$W/data"
tar -czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$W")" gpu_check
ls -l "$OUT"
