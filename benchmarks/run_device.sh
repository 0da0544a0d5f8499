#!/usr/bin/env bash
# One packed device call: the headline comparison, the benchmark table, the 1M run,
# the GPU tests and a tile sweep, each stage under its own time limit, logs in $OUT.
#   source .gpu/setup.sh && bash benchmarks/run_device.sh
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEMEFF_TEST_GPU=1
# memeff (the PyTorch baseline) could not create its Triton cache dir in run 3.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
stage() { local t=$1; shift; timeout "$t" "$@" 2>&1 | grep -E "RESULT|Error|error" | cut -c1-260; }
stage ${T_HEAD:-120} python benchmarks/bench_losses.py --losses clip,lit,qwen3,qwen3_qqdd,qwen3_k7 \
  --batch 65536 --dims 512 --providers triton,ring1,reference,memeff --out "$OUT/headline.csv"
stage ${T_TABLE:-200} python benchmarks/bench_losses.py --losses clip,lit \
  --batch 4096,16384,65536,262144 --dims 128,512,1024 --providers triton,blockwise,reference,memeff \
  --max-dense-batch 16384 --out "$OUT/table.csv"
stage ${T_BIG:-60} python benchmarks/bench_1m.py --losses clip --out "$OUT/big.csv"
timeout ${T_TESTS:-150} python -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider \
  -o addopts="" -rf --tb=short ${TEST_K:+-k "$TEST_K"} > "$OUT/gpu_tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | sed 's/.*::/  /' | cut -c1-120 | tail -45
stage ${T_SWEEP:-60} python benchmarks/bench_configs.py --batch 65536 --dims ${SWEEP_DIMS:-1024} \
  --reps 5 --out "$OUT/configs.csv"
