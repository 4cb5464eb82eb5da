#!/usr/bin/env bash
# The GPU check: the training step, the MoE grouped GEMM and the host syncs on one CUDA GPU of a machine that may
# have no network. It needs `python3` with torch (≥ 2.11), tiktoken, pyyaml, tqdm and pytest (transformers and
# matplotlib are used where present; datasets, wandb and the corpus packages are not needed) and the tokens prepared
# beforehand on a machine that has them. It writes 7 files directly under $OUT (summary.md, logs.tar.gz and one JSON
# per measuring part) and takes about 8 minutes (GPU_CHECK_BUDGET_S, default 480 s, cold compiles included). How to
# run it and what each part measures: docs/benchmarks.md, "The GPU check".
#
#   python -m harness.gpu_check prepare         # on a machine with the corpus: data_cache/gpu_check_gpt2 (~6.4 MiB)
#   bash harness/gpu_check.sh                   # on the GPU machine, the repo and that folder copied there
#   bash harness/gpu_check.sh --dry             # anywhere: the same parts and files on CPU with tiny sizes (1–2 min)
#
# Parts, in order: env, tests-gpu (the grouped GEMM's GPU test first), moe-gemm, bench-0.12b, loss-chunk, sync,
# bench-1b. Each runs under `timeout` with min(its cap, the budget left − the floors promised to the parts
# after it), so the whole stays within GPU_CHECK_BUDGET_S (default 480 s) and a slow part is cut (rc 124/137 in
# summary.md) while the rest still runs. After every part the logs are packed into $OUT/logs.tar.gz and summary.md is
# rewritten, so even a call cut from outside leaves both. GPU_CHECK_PARTS="bench-1b sync" runs only those.
set -u -o pipefail
cd "$(dirname "$0")/.."

DRY=${GPU_CHECK_DRY:-0}
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
DATA=$(realpath -m "${GPU_CHECK_DATA:-data_cache/gpu_check_gpt2}")
# Logs, checkpoints (1.4 GB per 0.12B run) and compile caches stay out of $OUT, whose files all travel back.
SCRATCH=${GPU_CHECK_SCRATCH:-$(mktemp -d -t gpu_check.XXXXXX)}
LOGS=$SCRATCH/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}  # python3 unless PYTHON says otherwise; the tests pass their own interpreter
ORDER=(env tests-gpu moe-gemm bench-0.12b loss-chunk sync bench-1b)
PARTS=${GPU_CHECK_PARTS:-${ORDER[*]}}
GRACE=5  # seconds between a part's SIGTERM (train.py checkpoints and returns) and its SIGKILL

export SCALEVEC_TOKENIZER_DIR=${SCALEVEC_TOKENIZER_DIR:-$DATA/tokenizers}  # GPT-2 ranks, carried with the data
# One inductor cache for all parts: sync and loss-chunk compile the graphs bench-0.12b compiled, and load them.
export TIKTOKEN_CACHE_DIR=$SCRATCH/tiktoken TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$SCRATCH/inductor}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
# Each recompile and its reason in the part's log: a block that recompiles per instance (and so falls back to eager past
# the recompile limit) would make a bench row wrong without failing it.
export TORCH_LOGS=${TORCH_LOGS:-recompiles}

declare -A CAP FLOOR
if [ "$DRY" = 1 ]; then
  BUDGET=${GPU_CHECK_BUDGET_S:-300}
  for p in "${ORDER[@]}"; do CAP[$p]=150 FLOOR[$p]=0; done  # the tiny sizes bound a dry run
  TINY=(model.d_model=64 model.n_layers=2 model.n_heads=2 train.compile=false)  # eager: the configs compile
  BENCH=(--device cpu --no-memory --vocab-size 512 --seq-len 32 --steps 2 --warmup 1)
  B012=(--micro-batch 2) B1B=(--micro-batch 2)
  CHUNKS=(16 null 64)  # of the 2 × 32 tokens, as 1024 / null / 16384 are of 32 × 1024 (null: 1024 on CPU)
  MOE=(--config configs/tiny_moe.yaml --tokens 256 --iters 2 --warmup 1 --device cpu model.d_model=64 model.n_heads=2)
  SYNC=(--every 2 --device cpu)
  TRAIN=(data.seq_len=32 train.micro_batch=2 train.global_batch=4 train.eval_tokens=64 "${TINY[@]}")
else
  BUDGET=${GPU_CHECK_BUDGET_S:-480}
  # Caps allow for cold compiles (a 1B block graph: 1–2 min on its first call); floors are what a part is promised.
  CAP=([env]=30 [tests-gpu]=120 [moe-gemm]=60 [bench-0.12b]=150 [loss-chunk]=90 [sync]=120 [bench-1b]=210)
  FLOOR=([env]=10 [tests-gpu]=60 [moe-gemm]=30 [bench-0.12b]=100 [loss-chunk]=50 [sync]=60 [bench-1b]=140)
  TINY=()
  BENCH=(--compile)
  # 0.12B: the config's micro-batch (32 × 1024); 1B: Table 3's setting (4 × 4096). Steps are few: compile dominates.
  B012=(--micro-batch 32 --steps 10 --warmup 3) B1B=(--micro-batch 4 --steps 6 --warmup 3)
  # null: the default rule, 4 × 8192 for 32 × 1024 tokens at V = 50,304 (model/loss.py, default_chunk_tokens)
  CHUNKS=(1024 null 16384)
  MOE=(--config configs/moe/0.5b.yaml --tokens 16384 --iters 10 --warmup 3)  # MoE-0.5B's micro-batch, 16 × 1024
  SYNC=(--every 10 --device cuda)
  TRAIN=(train.micro_batch=32 train.global_batch=64 train.eval_tokens=32768)  # 2 micro-batches: accumulation too
fi
BENCH+=(--no-hf-reference)  # transformers' compiled Llama would be one more cold compile per size: see the docs

T0=$(date +%s)
printf 'part\trc\tseconds\tlimit\n' > "$LOGS/status.tsv"

wanted() { [[ " $PARTS " == *" $1 "* ]]; }

promised_after() {  # the floors of the wanted parts after $1
  local seen=0 sum=0 p
  for p in "${ORDER[@]}"; do
    ((seen)) && wanted "$p" && sum=$((sum + FLOOR[$p]))
    [ "$p" = "$1" ] && seen=1
  done
  echo "$sum"
}

report() {  # the logs packed and the summary rewritten after every part
  tar -czf "$SCRATCH/logs.tar.gz" -C "$LOGS" . && mv -f "$SCRATCH/logs.tar.gz" "$OUT/logs.tar.gz"
  "$PY" -m harness.gpu_check summary "$OUT" --logs "$LOGS" > /dev/null 2>> "$LOGS/summary.log"
}

# part NAME CMD...: CMD under a timeout of min(CAP, budget left − promised − GRACE), logged to $LOGS/NAME.log.
part() {
  local name=$1
  shift
  wanted "$name" || return 0
  local left=$((BUDGET - ($(date +%s) - T0) - $(promised_after "$name") - GRACE))
  local limit=$((CAP[$name] < left ? CAP[$name] : left))
  if ((limit < 10)); then
    printf '%s\tskipped (no time left)\t0\t%s\n' "$name" "$limit" >> "$LOGS/status.tsv"
    echo "== $name: skipped, no time left"
    return 0
  fi
  echo "== $name (limit ${limit} s)"
  local t=$(date +%s) rc=0
  timeout -k "$GRACE" "$limit" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t))" "$limit" >> "$LOGS/status.tsv"
  tail -n 3 "$LOGS/$name.log" | sed 's/^/   /'
  report
}

part env "$PY" -m harness.gpu_check env --data "$DATA"
# The MoE first: the grouped GEMM's GPU test against the per-expert loop (pytest keeps the files' order: test_moe.py,
# then the other gpu tests; one line per test, so a cut part still shows which passed), then both paths timed at
# MoE-0.5B's shapes.
# -o addopts: one process, whatever pytest.ini adds (its -n 2 needs pytest-xdist and would not keep this order).
part tests-gpu env -u TORCH_LOGS SCALEVEC_TEST_GPU=1 "$PY" -m pytest -o addopts="-p no:cacheprovider" -vv -m gpu \
  tests/test_moe.py \
  $(ls tests/test_*.py | grep -v '/test_moe.py$')
part moe-gemm "$PY" -m harness.gpu_check moe-gemm "${MOE[@]}" --json "$OUT/moe_gemm.json"
# Then 3 more steps of each under torch.profiler: where unified's extra time goes (logs.tar.gz, summary.md).
part bench-0.12b "$PY" -m scripts.bench --config configs/dense/0.12b.yaml --presets baseline unified "${BENCH[@]}" \
  "${B012[@]}" --json "$OUT/bench_0.12b.json" --profile "$LOGS/profile_0.12b.md" -- "${TINY[@]}"
# The baseline's blocks as just compiled (from the inductor cache); only the head's chunk graph changes.
MODELS=()
for c in "${CHUNKS[@]}"; do MODELS+=("configs/dense/0.12b.yaml train.loss_chunk_tokens=$c"); done
part loss-chunk "$PY" -m scripts.bench --models "${MODELS[@]}" --presets baseline "${BENCH[@]}" "${B012[@]}" \
  --json "$OUT/loss_chunk.json" -- "${TINY[@]}"
# train.main in one process, four short runs on the carried tokens (harness/gpu_check.py, sync_runs).
part sync "$PY" -m harness.gpu_check sync "${SYNC[@]}" --runs-dir "$SCRATCH/runs" --json "$OUT/sync.json" -- \
  --config configs/dense/0.12b.yaml --config configs/scale/baseline.yaml data.source=builtin:pd_english \
  data.tokenizer=gpt2 data.max_tokens=null "data.dir=$DATA/pd_english" "data.val_sets=[$DATA/wikitext2]" \
  schedule.warmup_steps=1 optim.lr=2e-3 log.wandb.mode=disabled "${TRAIN[@]}"
part bench-1b "$PY" -m scripts.bench --config configs/dense/1b.yaml --presets baseline unified "${BENCH[@]}" \
  "${B1B[@]}" --json "$OUT/bench_1b.json" -- "${TINY[@]}"

report
FAILED=$(awk -F'\t' 'NR > 1 && $2 != "0"' "$LOGS/status.tsv" | wc -l)
echo "total $(($(date +%s) - T0)) s; $FAILED part(s) failed, cut or skipped; $(find "$OUT" -type f | wc -l) files" \
  "under $OUT; summary.md follows"
[ -n "${GPU_CHECK_SCRATCH:-}" ] || rm -rf "$SCRATCH"
cat "$OUT/summary.md"
[ "$FAILED" -eq 0 ]  # the exit status says whether every part passed; summary.md says which did not
