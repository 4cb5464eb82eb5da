#!/usr/bin/env bash
# Sweep the peak learning rate of one config: one run per lr, then a table of final validation losses.
#
#   scripts/sweep_lr.sh CONFIG [LR ...] [-- key=value ...]
#   scripts/sweep_lr.sh configs/figures/fig5/hg_dp.yaml                       # the paper's grid (PAPER.md §2.1)
#   NPROC=8 scripts/sweep_lr.sh configs/dense/0.12b.yaml 2e-3 4e-3 -- train.steps=2000
#
# Each lr runs under `torchrun --standalone --nproc_per_node=$NPROC` (default: every GPU nvidia-smi lists, else one
# process on CPU, run as plain `python train.py`) in its own run directory, $OUT_DIR/<sweep>/<config>-lr<LR>, and
# all of them share one wandb group, <sweep> (default sweep-<config name>; set SWEEP to choose). Re-running the same
# command skips finished runs and resumes unfinished ones from their newest checkpoint. The last step prints
# `python -m scripts.summarize` over the sweep: final val loss per lr, the best marked.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
config=$1
shift
[[ -f $config ]] || { echo "error: config $config does not exist" >&2; exit 2; }

lrs=()
overrides=()
while [[ $# -gt 0 ]]; do
    if [[ $1 == -- ]]; then
        shift
        overrides=("$@")
        break
    fi
    lrs+=("$1")
    shift
done
[[ ${#lrs[@]} -gt 0 ]] || lrs=(6e-4 1e-3 2e-3 3e-3 4e-3 5e-3 6e-3)

if [[ -z ${NPROC:-} ]]; then
    NPROC=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
    [[ $NPROC -gt 0 ]] || NPROC=1
fi
PYTHON=${PYTHON:-python}
name=$(basename "$config" .yaml)
sweep=${SWEEP:-sweep-$name}
out_dir=${OUT_DIR:-runs}/$sweep

for lr in "${lrs[@]}"; do
    run=$name-lr$lr
    if "$PYTHON" -m scripts.summarize --check-finished "$out_dir/$run"; then
        echo "== $run: finished, skipped"
        continue
    fi
    echo "== $run ($NPROC process(es))"
    args=(train.py --config "$config" "optim.lr=$lr" "log.out_dir=$out_dir" "log.run_name=$run"
          "log.wandb.group=$sweep" "${overrides[@]}")
    if [[ $NPROC -gt 1 ]]; then
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" "${args[@]}"
    else
        "$PYTHON" "${args[@]}"
    fi
done

"$PYTHON" -m scripts.summarize "${lrs[@]/#/$out_dir/$name-lr}"
