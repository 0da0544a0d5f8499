"""CLIP at B = 1,048,576, D = 512, bf16, fwd+bwd on one GPU: finite, timed once.

  python benchmarks/bench_1m.py --out big.csv
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import memeff_jax as mj
from benchmarks._harness import Result, Writer, compiled_extra_gib


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=1 << 20)
  p.add_argument("--dim", type=int, default=512)
  p.add_argument("--losses", default="clip,lit")
  p.add_argument("--out", default=None)
  a = p.parse_args()
  w = Writer(a.out)
  b, d = a.batch, a.dim
  kx, ky = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (b, d), jnp.float32).astype(jnp.bfloat16)
  y = jax.random.normal(ky, (b, d), jnp.float32).astype(jnp.bfloat16)
  for name in a.losses.split(","):
    fn, argnums = {"clip": (mj.clip_loss, (0, 1)), "lit": (mj.lit_loss, (0,))}[name]
    step = jax.jit(jax.value_and_grad(lambda x, y: fn(x, y, backend="triton"), argnums=argnums))
    r = Result(name, "triton", b, d, "bfloat16", extra_gib=compiled_extra_gib(step, x, y))
    jax.block_until_ready(step(x, y))     # compile + first run
    t0 = time.perf_counter()
    val, grads = jax.block_until_ready(step(x, y))
    r.ms = (time.perf_counter() - t0) * 1e3
    finite = bool(np.isfinite(float(val))) and all(
        bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads)
    r.note = f"loss={float(val):.4f} finite={finite}"
    w.add(r)


if __name__ == "__main__":
  main()
