#!/usr/bin/env bash
# One packed device call: GPU tests, then benchmarks, everything logged under $OUT.
#   source .gpu/setup.sh && bash benchmarks/run_device.sh tests|configs|bench|all
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=${1:-all}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
if [[ $what == tests || $what == all ]]; then
  timeout ${TEST_TIMEOUT:-360} python -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider \
    -o addopts="" --durations=10 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [[ $what == configs || $what == all ]]; then
  timeout ${CONFIG_TIMEOUT:-240} python benchmarks/bench_configs.py --batch 65536 \
    --dims ${CONFIG_DIMS:-512,128,1024} --out "$OUT/configs.csv" 2>&1 | grep -v "^  (" | cut -c1-250
fi
if [[ $what == bench || $what == all ]]; then
  timeout ${BENCH_TIMEOUT:-400} python benchmarks/bench_losses.py ${BENCH_ARGS:---losses clip,lit} \
    --out "$OUT/bench.csv" 2>&1 | cut -c1-250
fi
