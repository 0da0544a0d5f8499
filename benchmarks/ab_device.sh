#!/usr/bin/env bash
# A base commit against this checkout in one device call: bench_losses.py (fwd+bwd, the
# triton provider) run alternately from the base tree and from the checkout, REPS times,
# on the stack setup.sh put on PYTHONPATH. CSVs: $OUT/ab_${TAG}_{base,tree}_<rep>.csv.
# The base is a tree copied on the CPU machine into an ignored folder the call carries
# (the device has no git):
#   git archive <commit> memeff_jax benchmarks | tar -x -C .gpu/base
# then, on the device (setup.sh's site folder, first on PYTHONPATH, is kept for both):
#   source .gpu/setup.sh && BASE=.gpu/base TAG=36 LOSSES=clip,qwen3 DIMS=64,128 \
#     bash benchmarks/ab_device.sh
# (h100_self_split.csv run 1 was measured so before this script had its name; runs 2-3 by it.)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: "${BASE:?BASE: the base tree}"; TAG=${TAG:-ab}
SITE=${PYTHONPATH%%:*}   # setup.sh's packages (jax-triton, a packed Triton)
ROOT=$PWD; BASE=$(cd "$BASE" && pwd)
for rep in $(seq 1 "${REPS:-1}"); do
  for side in base tree; do
    dir=$ROOT; [ $side = base ] && dir=$BASE
    (cd "$dir" && PYTHONPATH="$SITE:$dir" timeout "${T_AB:-120}" python benchmarks/bench_losses.py \
       --losses "${LOSSES:-clip,lit,qwen3}" --batch "${BATCH:-65536}" --dims "${DIMS:-64,128}" \
       --providers triton --reps "${AB_REPS:-10}" --out "$OUT/ab_${TAG}_${side}_${rep}.csv" 2>&1 |
       grep -E "RESULT|rror" | cut -c1-200)
  done
done
