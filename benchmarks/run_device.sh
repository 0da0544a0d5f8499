#!/usr/bin/env bash
# One packed run on a GPU machine, logs and CSVs in $OUT. Stages (STAGES, default all):
#   tests    the GPU tests, in TEST_PROCS (4) parallel pytest processes of about equal
#            expected time (shard_tests.py; compiling is the slow part); TEST_CALLS=K,
#            TEST_CALL=I: this call runs part I (from 0) of K (the whole file takes ~2
#            calls of 14 processes at T_TESTS=480 on an H200); after the call, here:
#            shard_tests.py --ledger LOG adds the outcomes to gpu_tests_ledger.csv, and
#            --pending gives the ids still to pass at a commit (the next TEST_IDS).
#            TEST_PENDING=COMMIT: run those, from the carried ledger, on the stack this
#            machine runs (TEST_IDS then narrows them; the stack's name: gpu.txt)
#   headline every loss at B = 65536, D = 512 against memeff, and B = 16384 against dense XLA
#   mrl      Matryoshka (dims 64/128/256/512): fused per family (per dim and in one block),
#            eager, plain, memeff's fused and eager, B = 65536, D = 512
#   table    the B x D tables of docs/benchmarks.md: CLIP and LiT, every provider
#   big      B = 1,048,576
#   sweep    tile candidates of bench_configs.py
#   gradcache training steps, plain vs grad_cache (ViT-S/16 + text tower), not in the default
#            STAGES: its CSV is benchmarks/results/<gpu>_grad_cache.csv
#   compile  a step's start-up (bench_compile.py: CLIP and fused Matryoshka CLIP in fresh
#            processes), without the kernel cache, then twice with it in a fresh folder;
#            not in the default STAGES (compile_plain.csv, compile_kept.csv)
#   ring     multi-GPU scaling, not in the default STAGES (it wants a machine with several
#            GPUs): ring_jax then ring_memeff, each also a stage of its own (one run
#            each if both do not fit in one). ring_jax: bench_ring.py through sharded
#            on 1 and all GPUs, with its correctness check (ring_memeff_jax.csv);
#            ring_memeff: memeff's Distributed* losses under torchrun with 1 process, then
#            one per GPU (ring_memeff_1.csv, ring_memeff_<N>.csv). RING_BATCH: global batches
#            (65536,131072); RING_WEAK: rows per GPU of a weak-scaling series (off; memeff
#            has its points at the process counts RING_MEMEFF_GPUS, default "1 N");
#            RING_LOSSES, RING_REPS (5); timeouts T_RING (420), T_RING_MEMEFF (240 a run).
#            Copy the CSVs to benchmarks/results/<gpu>_ring_*.csv for render_tables.py.
#   source .gpu/setup.sh && STAGES="tests headline" bash benchmarks/run_device.sh
#   source .gpu/setup.sh && STAGES=tests TEST_PENDING=4ba642a TEST_PROCS=15 \
#     bash benchmarks/run_device.sh
#   source .gpu/setup.sh && STAGES=ring RING_WEAK=65536 bash benchmarks/run_device.sh
# The memeff stages need memeff 0.3.1 on the GPU machine: put its wheel next to
# jax-triton's before the call (pip download memeff==0.3.1 --no-deps -d .gpu/), and
# setup.sh installs it with the rest. PROVIDERS ("triton memeff"): the benchmark stages'
# providers, e.g. ours on another stack (Triton 3.9 with memeff on torch's Triton 3.6):
#   (source .gpu4/setup.sh && OUT=/tmp/out/jt04 STAGES=headline PROVIDERS=triton \
#      bash benchmarks/run_device.sh)
#   (source .gpu/setup.sh && OUT=/tmp/out/jt03 STAGES=headline bash benchmarks/run_device.sh)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STAGES=${STAGES:-tests headline mrl table big sweep}
export MEMEFF_TEST_GPU=1
# memeff (the PyTorch baseline) needs a writable Triton cache dir.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
mkdir -p "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import memeff" 2>/dev/null ||
  echo "Error: memeff is not installed here; the memeff stages will fail (see the header)"
has() { [[ " $STAGES " == *" $1 "* ]]; }
stage() { local t=$1; shift; timeout "$t" "$@" 2>&1 | grep -E "RESULT|Error|error" | cut -c1-260; }
if has tests; then
  # TEST_IDS: a file of test ids to run instead of all of them (e.g. a rerun);
  # TEST_PROCS: parallel pytest processes (4). At T_TESTS a shard gets SIGINT: pytest
  # still reports its failures. Every id's duration is in the log (--durations=0):
  # shard_tests.py --record adds them to the durations the shards are balanced by.
  if [ -n "$TEST_IDS" ]; then cp "$TEST_IDS" /tmp/gpu_ids; else
    python -m pytest --collect-only -q -m gpu tests/test_gpu.py -o addopts="" \
      -p no:cacheprovider | grep "::" > /tmp/gpu_ids
  fi
  stack=$(python -c "import jax_triton as j, triton as t
print(f'jax-triton {j.__version__} + Triton {t.__version__}')")
  echo "$stack" >> "$OUT/gpu.txt"   # the ledger's --stack
  if [ -n "$TEST_PENDING" ]; then
    python benchmarks/shard_tests.py --pending --ids /tmp/gpu_ids --commit "$TEST_PENDING" \
      --stack "$stack" > /tmp/gpu_pending && mv /tmp/gpu_pending /tmp/gpu_ids
    echo "$(wc -l < /tmp/gpu_ids) ids not yet passed at $TEST_PENDING on $stack"
  fi
  rm -rf /tmp/gpu_shards
  python benchmarks/shard_tests.py --ids /tmp/gpu_ids --shards ${TEST_PROCS:-4} \
    --calls ${TEST_CALLS:-1} --call ${TEST_CALL:-0} --out /tmp/gpu_shards
  for f in /tmp/gpu_shards/shard.*; do
    i=${f##*.}
    [ -s $f ] || continue   # an empty shard would run the whole file
    timeout -s INT -k 30 ${T_TESTS:-420} python -m pytest -m gpu $(cat $f) -v -p no:cacheprovider \
      -o addopts="" -rf --tb=short --durations=0 > "$OUT/gpu_tests.$i.log" 2>&1 &
  done
  wait
  # One log: the device returns at most 8 files, and the CSVs of later stages must fit.
  cat "$OUT"/gpu_tests.*.log > /tmp/gpu_tests.log 2>/dev/null; rm -f "$OUT"/gpu_tests.*.log
  mv /tmp/gpu_tests.log "$OUT/gpu_tests.log"
  grep -cE "PASSED" "$OUT/gpu_tests.log" | sed 's/^/passed: /'
  grep -E "FAILED|ERROR|Timeout" "$OUT/gpu_tests.log" | cut -c1-200 | head -30
fi
# memeff runs in processes of its own: after jax-triton has run in a process, its
# Triton finds no cache dir ("Could not create or locate cache dir").
for prov in ${PROVIDERS:-triton memeff}; do
  has headline && stage ${T_HEAD:-200} python benchmarks/bench_losses.py \
    --losses clip,lit,qwen3,qwen3_qqdd,qwen3_k7,lit_qwen3,siglip --batch 65536 --dims 512 \
    --providers $prov --reps ${HEAD_REPS:-10} --out "$OUT/headline_$prov.csv"
  has headline && stage ${T_HEAD16:-60} python benchmarks/bench_losses.py --losses clip,lit,siglip \
    --batch 16384 --dims 512 --providers $prov$([ $prov = triton ] && echo ,dense) \
    --out "$OUT/headline16k_$prov.csv"
done
MRL_LOSSES=clip,clip_mrl,clip_mrl_eager,lit,lit_mrl,qwen3,qwen3_mrl,lit_qwen3,lit_qwen3_mrl
# ours also in one block (*_mrl_one; memeff has no such form)
for prov in ${PROVIDERS:-triton memeff}; do
  has mrl && stage ${T_MRL:-240} python benchmarks/bench_losses.py --losses $MRL_LOSSES$(
    [ $prov = triton ] && echo ,clip_mrl_one,lit_mrl_one,qwen3_mrl_one,lit_qwen3_mrl_one) \
    --batch 65536 --dims 512 --providers $prov --reps ${MRL_REPS:-10} --out "$OUT/mrl_$prov.csv"
done
for prov in $(echo ${PROVIDERS:-triton memeff} | sed 's/triton/triton,blockwise,dense,reference/'); do
  has table && stage ${T_TABLE:-300} python benchmarks/bench_losses.py --losses clip,lit \
    --batch 4096,16384,65536,262144 --dims 128,512,1024 --providers $prov \
    --max-dense-batch 16384 --reps ${TABLE_REPS:-10} --out "$OUT/table_${prov%%,*}.csv"
done
has big && stage ${T_BIG:-120} python benchmarks/bench_1m.py --losses clip --out "$OUT/big.csv"
has sweep && stage ${T_SWEEP:-90} python benchmarks/bench_configs.py --batch 65536 \
  --dims ${SWEEP_DIMS:-256,1024} --reps 5 --out "$OUT/configs.csv"
# 95% of the GPU for XLA (the default 75% would cap the step's memory at 105 GiB).
has gradcache && XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 stage ${T_GRADCACHE:-420} \
  python benchmarks/bench_grad_cache.py --out "$OUT/grad_cache.csv"
if has compile; then
  stage ${T_COMPILE:-240} python -m benchmarks.bench_compile --losses clip,clip_mrl \
    --env MEMEFF_JAX_KERNEL_CACHE=0 --out "$OUT/compile_plain.csv"
  rm -rf /tmp/memeff_kernels
  stage ${T_COMPILE:-240} python -m benchmarks.bench_compile --losses clip,clip_mrl \
    --env MEMEFF_JAX_KERNEL_CACHE=/tmp/memeff_kernels --out "$OUT/compile_kept.csv"
fi
NGPU=$(nvidia-smi -L | wc -l)
RING_ARGS="--losses ${RING_LOSSES:-clip,lit,qwen3_qqdd,lit_qwen3,clip_mrl}
  --batch ${RING_BATCH:-65536,131072} --reps ${RING_REPS:-5} ${RING_WEAK:+--weak $RING_WEAK}"
if has ring || has ring_jax; then
  stage ${T_RING:-420} python benchmarks/bench_ring.py $RING_ARGS --devices 1,$NGPU --check \
    --out "$OUT/ring_memeff_jax.csv"
fi
if has ring || has ring_memeff; then
  # memeff in processes of its own (see above); the 1-process run first: its times are
  # the baseline of the efficiency of the N-process run.
  for n in $(echo ${RING_MEMEFF_GPUS:-1 $NGPU} | tr ' ' '\n' | sort -nu); do
    stage ${T_RING_MEMEFF:-240} python -m torch.distributed.run --standalone --nproc_per_node=$n \
      benchmarks/bench_ring_memeff.py $RING_ARGS --out "$OUT/ring_memeff_$n.csv" \
      $([ $n -gt 1 ] && echo --baseline "$OUT/ring_memeff_1.csv")
  done
fi
true
