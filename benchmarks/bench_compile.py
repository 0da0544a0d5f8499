"""What a training step costs before it runs: each loss's jit(value_and_grad) in fresh
processes, the seconds spent importing memeff_jax, lowering (jax-triton compiles every
Triton kernel of the step here), compiling (XLA) and in the first run (jaxlib compiles
the kernels' PTX on jax-triton 0.3.1), then one more run.

Each loss runs in ``--processes`` fresh processes one after the other, so the later ones
show what was kept from the first: JAX's persistent compilation cache (``--jax-cache
DIR``) keeps XLA's executable, memeff_jax's kernel cache (on by default, in the user's
cache folder: pass ``--env MEMEFF_JAX_KERNEL_CACHE=0`` or a fresh folder for a cold
start) the compiled kernels. ``--env NAME=VALUE`` (repeatable) goes to every process.

  python -m benchmarks.bench_compile --losses clip,clip_mrl --batch 8192 --dims 512 \
      --out compile.csv
  python -m benchmarks.bench_compile --losses clip --jax-cache /tmp/jax_cache

Measured (one H100, B = 8192, D = 512, bf16; 2026-12-06, benchmarks/NOTES.md): lowering
CLIP's step 6.3 s and fused Matryoshka CLIP's (dims 64-512) 26 s on jax-triton 0.4.1 +
Triton 3.9 (0.3.1 + 3.6: 6.1 and 16-20 s), in every process, with JAX's persistent cache
or without; XLA's compile 3-10 s, 0.05-0.2 s from that cache. With the kernels kept by
the first process, the second lowers CLIP's step in 1.6 s and fused Matryoshka's in 2.1
on 3.9 (5.1 and 5.5 on 3.6, where Triton's kernel specialization imports torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

if __package__ in (None, ""):   # run as a file
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks._harness import Writer  # pylint: disable=wrong-import-position


@dataclasses.dataclass
class Row:
  loss: str
  batch: int
  dim: int
  dtype: str
  process: int            # 1 for the first fresh process, 2 for the next, ...
  provider: str = "triton"
  import_s: float | None = None
  lower_s: float | None = None
  compile_s: float | None = None
  first_s: float | None = None
  second_s: float | None = None
  env: str = ""
  note: str = ""


def child(loss: str, b: int, d: int, dtype: str, provider: str) -> dict:
  """One fresh process's times (this process must not have imported jax before)."""
  t0 = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from benchmarks import bench_losses  # pylint: disable=g-import-not-at-top
  out = dict(import_s=time.perf_counter() - t0)
  args = bench_losses.inputs(loss, b, d, jnp.dtype(dtype))
  step = bench_losses.jax_step(loss, provider, d=d)
  jax.block_until_ready(args)
  t = time.perf_counter()
  lowered = step.lower(*args)
  out["lower_s"] = time.perf_counter() - t
  t = time.perf_counter()
  compiled = lowered.compile()
  out["compile_s"] = time.perf_counter() - t
  for name in ("first_s", "second_s"):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    out[name] = time.perf_counter() - t
  return out


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--losses", default="clip,clip_mrl")
  p.add_argument("--batch", type=int, default=8192)
  p.add_argument("--dims", type=int, default=512)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--provider", default="triton", help="a backend name (interpret: no GPU)")
  p.add_argument("--jax-cache", default=None, help="JAX's persistent compilation cache dir")
  p.add_argument("--env", action="append", default=[], help="NAME=VALUE for every process")
  p.add_argument("--out", default=None)
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.child:
    print("CHILD " + json.dumps(child(a.child, a.batch, a.dims, a.dtype, a.provider)),
          flush=True)
    return
  env = dict(os.environ)
  extra = dict(kv.split("=", 1) for kv in a.env)
  if a.jax_cache:
    extra.update(JAX_COMPILATION_CACHE_DIR=a.jax_cache,
                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  env.update(extra)
  extra_note = " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
  writer = Writer(a.out)
  for loss in a.losses.split(","):
    for i in range(1, a.processes + 1):
      row = Row(loss, a.batch, a.dims, a.dtype, i, a.provider, env=extra_note)
      out = subprocess.run([sys.executable, "-m", "benchmarks.bench_compile", "--child", loss,
                            "--batch", str(a.batch), "--dims", str(a.dims), "--dtype", a.dtype,
                            "--provider", a.provider],
                           capture_output=True, text=True, env=env, check=False)
      found = [l for l in out.stdout.splitlines() if l.startswith("CHILD ")]
      if found:
        for k, v in json.loads(found[-1][6:]).items():
          setattr(row, k, round(v, 3))
      else:
        errors = [l for l in out.stderr.splitlines() if "Error" in l] or ["no output"]
        row.note = errors[-1][:200]
      writer.add(row)


if __name__ == "__main__":
  main()
