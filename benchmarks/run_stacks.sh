#!/usr/bin/env bash
# GPU tests on each tested stack in one device call: run_device.sh's tests stage once per
# stack, each in a shell of its own with its own caches (TRITON_CACHE_DIR, the kernel
# cache under XDG_CACHE_HOME, both empty at the start), logs in $OUT/<stack>/.
# STACKS (default "39 36 31_39"):
#   39     jax-triton 0.4.1 + Triton 3.9: .gpu4/ (../shared/wheels-jt04/*.whl, setup.sh,
#          and pack_triton.sh's triton-3.9.0.tar.xz)
#   36     jax-triton 0.3.1 + the machine's Triton 3.6: .gpu/ (../shared/wheels/*.whl,
#          setup.sh; memeff's wheel may sit there too)
#   31_39  jax-triton 0.3.1 + Triton 3.9: .gpu/'s jax-triton and setup.sh with .gpu4/'s
#          Triton archive, put together on the device (the carried tree holds one archive)
# IDS_<stack> (default $IDS): a file of test ids; T_<stack> (default 150): each shard's
# time limit; PROCS (16) processes a stack. Carry [".gpu", ".gpu4"]; then, here:
#   python benchmarks/shard_tests.py --ledger OUT/<stack>/gpu_tests.log --ids IDS \
#       --commit C --stack "$(tail -1 OUT/<stack>/gpu.txt)" --gpu "..." --date D
#   IDS=ids.txt bash benchmarks/run_stacks.sh
set -o pipefail
ROOT=$PWD; BASE=${OUT:-/tmp/out}
mkdir -p /tmp/g31_39 && cp .gpu/jax_triton-*.whl .gpu/setup.sh /tmp/g31_39/ &&
  ln -sf "$ROOT"/.gpu4/triton-*.tar.xz /tmp/g31_39/
for S in ${STACKS:-39 36 31_39}; do
  case $S in 39) D=.gpu4;; 36) D=.gpu;; 31_39) D=/tmp/g31_39;;
    *) echo "unknown stack $S"; continue;; esac
  ids=$(eval echo "\${IDS_$S:-$IDS}"); t=$(eval echo "\${T_$S:-150}")
  ( mkdir -p "$BASE/$S"; export XDG_CACHE_HOME=/tmp/xdg_$S TRITON_CACHE_DIR=/tmp/tc_$S
    source "$D/setup.sh" > "$BASE/$S/setup.log" 2>&1; tail -1 "$BASE/$S/setup.log"
    start=$(date +%s)
    OUT=$BASE/$S STAGES=tests TEST_IDS=$ids TEST_PROCS=${PROCS:-16} T_TESTS=$t \
      bash benchmarks/run_device.sh 2>&1 | grep -v "^Error: memeff" | tail -25
    echo "stack $S: $(( $(date +%s) - start )) s" )
done
