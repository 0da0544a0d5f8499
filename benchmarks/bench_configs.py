"""Tile sweep and time split for the Triton backend (one GPU, one process).

For each feature size and KernelConfig: CLIP fwd+bwd and forward-only time at one
batch, so the defaults in config.py come from measurements and the backward's share
of the time is visible (bwd = fwd+bwd - fwd).

  python benchmarks/bench_configs.py --batch 65536 --dims 512 --out configs.csv
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

import memeff_jax as mj
from benchmarks._harness import Result, Writer, guarded, summarize, time_jax
from memeff_jax.config import KernelConfig, default_config

# (fwd_block_m, fwd_block_n, fwd_warps, fwd_stages, bwd_block_m, bwd_block_n, bwd_warps,
#  bwd_stages, block_d, bwd_block_do); block_d / bwd_block_do = 0 means next_pow2(d).
CANDIDATES = {
    128: [(128, 64, 8, 3, 128, 64, 8, 3, 0, 0), (128, 128, 8, 3, 128, 64, 8, 2, 0, 0),
          (64, 64, 4, 3, 64, 64, 4, 3, 0, 0), (128, 64, 8, 3, 64, 128, 8, 3, 0, 0)],
    512: [(64, 64, 8, 3, 64, 32, 8, 2, 0, 0), (64, 32, 8, 3, 32, 64, 8, 2, 0, 0),
          (128, 32, 8, 2, 64, 64, 8, 2, 0, 0), (64, 64, 8, 3, 32, 64, 8, 3, 0, 0),
          (64, 64, 4, 2, 64, 32, 16, 2, 0, 0), (64, 64, 8, 3, 64, 64, 8, 3, 64, 128)],
    1024: [(64, 64, 8, 3, 64, 64, 8, 3, 64, 256), (64, 64, 8, 3, 32, 64, 8, 3, 64, 512),
           (128, 64, 8, 3, 64, 64, 8, 3, 64, 128), (64, 64, 8, 3, 64, 64, 8, 3, 128, 512)],
}


def config_of(t, d) -> KernelConfig:
  pow2 = max(16, 1 << (d - 1).bit_length())
  fm, fn, fw, fs, bm, bn, bw, bs, bd, bdo = t
  return KernelConfig(fwd_block_m=fm, fwd_block_n=fn, fwd_num_warps=fw, fwd_num_stages=fs,
                      bwd_block_m=bm, bwd_block_n=bn, bwd_num_warps=bw, bwd_num_stages=bs,
                      block_d=bd or pow2, bwd_block_do=bdo or pow2)


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--dims", default="128,512,1024")
  p.add_argument("--losses", default="clip")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  w = Writer(a.out)
  b = a.batch
  for d in map(int, a.dims.split(",")):
    cands = [dataclasses.astuple(default_config(d, jnp.bfloat16))] + CANDIDATES.get(d, [])
    x, y = (jax.random.normal(k, (b, d), jnp.float32).astype(jnp.bfloat16)
            for k in jax.random.split(jax.random.key(0), 2))
    for i, t in enumerate(cands):
      cfg = default_config(d, jnp.bfloat16) if i == 0 else config_of(t, d)
      for name in a.losses.split(","):
        fn = {"clip": mj.clip_loss, "lit": mj.lit_loss}[name]
        argnums = (0, 1) if name == "clip" else (0,)
        gemms = 5 if name == "clip" else 3
        label = "default" if i == 0 else f"cfg{i}"
        note = str(dataclasses.astuple(cfg)[:10])
        full = jax.jit(jax.value_and_grad(
            lambda x, y: fn(x, y, backend="triton", config=cfg), argnums=argnums))
        fwd = jax.jit(lambda x, y: fn(x, y, backend="triton", config=cfg))
        r = Result(f"{name}_fwd+bwd", label, b, d, "bfloat16", note=note)
        guarded(w, r, lambda: summarize(r, time_jax(full, x, y, reps=a.reps),
                                        gemms * 2.0 * b * b * d))
        r2 = Result(f"{name}_fwd", label, b, d, "bfloat16", note=note)
        guarded(w, r2, lambda: summarize(r2, time_jax(fwd, x, y, reps=a.reps), 2.0 * b * b * d))


if __name__ == "__main__":
  main()
