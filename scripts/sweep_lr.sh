#!/usr/bin/env bash
# Sweep the peak learning rate of one config: one run per lr, then a table of final validation losses.
#
#   scripts/sweep_lr.sh CONFIG [LR ...] [-- key=value ...]
#   scripts/sweep_lr.sh configs/figures/fig5/hg_dp.yaml                       # the paper's grid (docs/paper.md §2.1)
#   NPROC=8 scripts/sweep_lr.sh configs/dense/0.12b.yaml 2e-3 4e-3 -- train.steps=2000
#
# Each lr runs under `torchrun --standalone --nproc_per_node=$NPROC` (default: every GPU nvidia-smi lists, else one
# process on CPU, run as plain `python train.py`) in its own run directory, $OUT_DIR/<sweep>/<config>-lr<LR>, and
# all of them share one wandb group, <sweep> (default sweep-<config name>; set SWEEP to choose). Re-running the same
# command skips finished runs and resumes unfinished ones from their newest checkpoint. The last step prints
# `python -m scripts.summarize` over the sweep: final val loss per lr, the best marked.
# An override log.out_dir=DIR stands for OUT_DIR=DIR; log.wandb.group=G names the wandb group (the folder stays
# <sweep>). The script sets optim.lr and log.run_name per run itself: give lrs as arguments and SWEEP for the name.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
config=$1
shift
[[ -f $config ]] || { echo "error: config $config does not exist" >&2; exit 2; }
name=$(basename "$config" .yaml)

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
for lr in "${lrs[@]}"; do  # all before the first run: a typo in the last lr must not wait for the others to train
    mantissa=${lr%%[eE]*}
    if [[ ! $lr =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ || ! $mantissa =~ [1-9] ]]; then
        echo "error: lr $lr is not a positive number (e.g. 3e-3); give the lrs before --, the overrides after it" >&2
        exit 2
    fi
done

# The keys this script sets for every run: log.out_dir and log.wandb.group are honoured (and taken out of the
# overrides, which would otherwise win over the script's own values), optim.lr and log.run_name refused before any run.
base_dir=${OUT_DIR:-}
group=
passed=()
refused=()
for o in ${overrides[@]+"${overrides[@]}"}; do
    read -r key <<<"${o%%=*}"  # the key as train.py reads it: text before the first =, spaces trimmed
    value=${o#*=}
    case $key in
        log.out_dir)
            [[ -n $value ]] || { echo "error: override $o: log.out_dir needs a folder" >&2; exit 2; }
            if [[ -n ${OUT_DIR:-} && $OUT_DIR != "$value" ]]; then
                echo "error: OUT_DIR=$OUT_DIR and override $o name two places for the sweep; give one of them" >&2
                exit 2
            fi
            base_dir=$value ;;
        log.wandb.group) group=$value ;;
        log.run_name | optim.lr) refused+=("$o") ;;
        *) passed+=("$o") ;;
    esac
done
sweep=${SWEEP:-sweep-$name}
out_dir=${base_dir:-runs}/$sweep
for o in ${refused[@]+"${refused[@]}"}; do
    if [[ ${o%%=*} == *log.run_name* ]]; then
        echo "error: override $o: the sweep names each run <config>-lr<LR> itself (here $out_dir/$name-lr${lrs[0]}" \
             "...); set SWEEP=NAME to name the sweep's folder, OUT_DIR=DIR or log.out_dir=DIR for where it goes" >&2
    else
        echo "error: override $o: the sweep sets optim.lr per run; give the lrs as arguments before --, e.g." \
             "scripts/sweep_lr.sh $config ${o#*=} -- ..." >&2
    fi
done
[[ ${#refused[@]} -eq 0 ]] || exit 2

if [[ -z ${NPROC:-} ]]; then
    NPROC=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
    [[ $NPROC -gt 0 ]] || NPROC=1
fi
[[ $NPROC =~ ^[1-9][0-9]*$ ]] || { echo "error: NPROC=$NPROC: give the processes per run as a whole number ≥ 1" >&2; exit 2; }
PYTHON=${PYTHON:-python}

for lr in "${lrs[@]}"; do
    run=$name-lr$lr
    if "$PYTHON" -m scripts.summarize --check-finished "$out_dir/$run"; then
        echo "== $run: finished, skipped"
        continue
    fi
    echo "== $run ($NPROC process(es))"
    args=(train.py --config "$config" "optim.lr=$lr" "log.out_dir=$out_dir" "log.run_name=$run"
          "log.wandb.group=${group:-$sweep}" ${passed[@]+"${passed[@]}"})
    if [[ $NPROC -gt 1 ]]; then
        "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" "${args[@]}"
    else
        "$PYTHON" "${args[@]}"
    fi
done

"$PYTHON" -m scripts.summarize "${lrs[@]/#/$out_dir/$name-lr}"
