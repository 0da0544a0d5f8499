"""One training step in a process of its own, for the kernel cache's GPU test:
``python -m tests.support.cache_step OUT.npz`` runs jit(value_and_grad) of CLIP (bf16,
2085 x 512: the Gluon kernels and TMA loads on jax-triton 0.4) and of fused Matryoshka
CLIP (dims 8 / 40 / 72) on backend="triton", and saves the losses and gradients, with
the seconds lowering took (the cache is whatever MEMEFF_JAX_KERNEL_CACHE says)."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import memeff_jax as mj
from tests.support.data import features


def main(out: str) -> None:
  saved, lower_s = {}, 0.0
  for name, (b, d), kw in (("clip", (2085, 512), {}),
                           ("mrl", (300, 72), dict(matryoshka_dims=(8, 40, 72)))):
    x, y = features(5, [(b, d), (b, d)], jnp.bfloat16)
    step = jax.jit(jax.value_and_grad(
        lambda a, c, kw=kw: mj.clip_loss(a, c, backend="triton", **kw), argnums=(0, 1)))
    t = time.perf_counter()
    lowered = step.lower(x, y)
    lower_s += time.perf_counter() - t
    value, (gx, gy) = lowered.compile()(x, y)
    saved.update({f"{name}_value": np.asarray(value),
                  f"{name}_gx": np.asarray(gx.astype(jnp.float32)),
                  f"{name}_gy": np.asarray(gy.astype(jnp.float32))})
  np.savez(out, lower_s=lower_s, **saved)


if __name__ == "__main__":
  main(sys.argv[1])
