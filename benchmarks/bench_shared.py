"""Shared negative columns against the same loss with N more batch columns (one GPU).

For LiT, Qwen3 and CLIP (whose rows take them): fwd+bwd time and compiled extra
memory of ``loss(x, y, shared_negatives=c)``, the batch's block plus one [B, N] block
(provider ``shared``), against the row softmax of one [B, B + N] block, y and c
concatenated, the diagonal excluded, on the same kernels (``_core.block_lse``;
provider ``wide``; Qwen3 with its threshold on every column; CLIP's columns' softmax
on the batch block beside it), side by side. The bar: ``shared`` within 1.1x of
``wide``. Only the O(B) glue differs in what is computed.

  python benchmarks/bench_shared.py --batch 65536 --negatives 65536 --dims 512
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

import memeff_jax as mj
from benchmarks._harness import Result, Writer, compiled_extra_gib, guarded, summarize, time_jax
from memeff_jax import _core, backends
from memeff_jax._terms import MARGIN_TIE

_LOSSES = {"lit": (mj.lit_loss, (0,)), "qwen3": (mj.qwen3_loss, (0, 1, 2)),
           "clip": (mj.clip_loss, (0, 1, 2))}
T, MARGIN = 0.05, 0.1


def _unit(v):
  return (v / jnp.linalg.norm(v.astype(jnp.float32), axis=-1, keepdims=True)).astype(v.dtype)


def _wide(name, backend):
  """The loss with the shared columns as N more batch columns of one block."""
  spec = _core.BlockSpec(backend=backend, exclude_self=True, want_max=False)
  scale = jnp.float32(1.0 / T)

  def loss(x, y, c):
    x, y, c = _unit(x), _unit(y), _unit(c)
    if name == "lit":
      y, c = jax.lax.stop_gradient(y), jax.lax.stop_gradient(c)
    pos = jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32), axis=-1)
    thr = jax.lax.stop_gradient(pos + MARGIN + MARGIN_TIE) if name == "qwen3" else None
    lse = _core.block_lse(x, jnp.concatenate([y, c]), scale, thr, spec=spec)[0]
    ell = jnp.mean(jnp.logaddexp(lse, scale * pos) - scale * pos)
    if name != "clip":
      return ell
    col = _core.block_lse(y, x, scale, spec=spec)[0]   # the columns' softmax: B candidates
    return 0.5 * (ell + jnp.mean(jnp.logaddexp(col, scale * pos) - scale * pos))
  return loss


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--negatives", type=int, default=65536)
  p.add_argument("--dims", default="512")
  p.add_argument("--losses", default="lit,qwen3,clip")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--backend", default="triton", help="interpret: a CPU check of the script")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  w = Writer(a.out)
  be = backends.resolve(a.backend, jnp.bfloat16)
  for d in map(int, a.dims.split(",")):
    keys = jax.random.split(jax.random.key(0), 3)
    x, y = (jax.random.normal(k, (a.batch, d), jnp.float32).astype(jnp.bfloat16)
            for k in keys[:2])
    y = (x.astype(jnp.float32) + jax.random.normal(keys[2], x.shape)).astype(jnp.bfloat16)
    c = jax.random.normal(keys[2], (a.negatives, d), jnp.float32).astype(jnp.bfloat16)
    for name in a.losses.split(","):
      fn, argnums = _LOSSES[name]
      kw = dict(margin=MARGIN) if name == "qwen3" else {}
      shared = functools.partial(lambda x, y, c, f: f(x, y, shared_negatives=c, temperature=T,
                                                      backend=a.backend, **kw), f=fn)
      for provider, loss in (("shared", shared), ("wide", _wide(name, be))):
        step = jax.jit(jax.value_and_grad(loss, argnums=argnums))
        r = Result(name, provider, a.batch, d, "bfloat16", note=f"negatives={a.negatives}")
        def timed(r=r, step=step):
          r.extra_gib = compiled_extra_gib(step, x, y, c)
          return summarize(r, time_jax(step, x, y, c, reps=a.reps), None)
        guarded(w, r, timed)


if __name__ == "__main__":
  main()
