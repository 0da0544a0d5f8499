"""The FlashAttention-shaped gradient loop with and without Triton's automatic warp
specialization, on a GPU (jax-triton >= 0.4, Triton >= 3.9, sm_90).

A reduced copy of ``grad_bwd._lse_bwd_kernel``'s column loop: dx_i = sum_j c_ij y_j
and cs_i = sum_j c_ij s_ij with c the rows' softmax (ROLES = 1, LiT's pass) or both roles on
one exponential, the columns' factors read per column tile (ROLES = 2, CLIP's shared
pass); no ``where``, no self pairs, whole tiles (the cases the shipped kernel handles with
branches inside the loop, which Triton's pass does not partition). Every tile and
statistic is loaded through device-side tensor descriptors: on sm_90 the pass partitions
only loops whose loads are all descriptors, and splits a 128-row tile over two consumer
warp groups (64 rows each) fed by one producer warp group, 12 warps compiled from 4
(launched through ``_compat``'s ``compiled_warps``). Each variant is checked against
float32 jnp on the first rows, then timed (median of --reps). With Triton 3.9 every
partitioned variant computed a wrong dx (NaN in most): NOTES.md 2026-12-03,
``h200_ws_gradient.csv``. Rerun it on a newer Triton before trying the pass again.

  python benchmarks/bench_ws_gradient.py --batch 65536 --dims 128,256
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

if __package__ in (None, ""):   # run as a file
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from benchmarks._harness import clip_pairs, time_jax
from memeff_jax import _compat


@triton.jit
def _ws_grad_kernel(x_ptr, y_ptr, scal_ptr, lse_ptr, g_ptr, gc_ptr, st_ptr, n, m, dx_ptr,
                    cs_ptr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    ROLES: tl.constexpr, WS: tl.constexpr, PACKED: tl.constexpr,
                    CS: tl.constexpr):
  pid = tl.program_id(0)
  xd = tl.make_tensor_descriptor(x_ptr, shape=[n, D], strides=[D, 1], block_shape=[BM, D])
  yd = tl.make_tensor_descriptor(y_ptr, shape=[m, D], strides=[D, 1], block_shape=[BN, D])
  gcd = tl.make_tensor_descriptor(gc_ptr, shape=[m], strides=[1], block_shape=[BN])
  scale2 = tl.load(scal_ptr)
  x = xd.load([pid * BM, 0])
  if PACKED:   # the rows' (lse, g, 0, 0) as one [BM, 4] block of a 2-D descriptor
    sd = tl.make_tensor_descriptor(st_ptr, shape=[n, 4], strides=[4, 1], block_shape=[BM, 4])
    even, odd = tl.split(tl.reshape(sd.load([pid * BM, 0]), [BM, 2, 2]))
    lse = tl.split(even)[0]
    g = tl.split(odd)[0]
  else:        # two [BM] blocks of 1-D descriptors
    ld = tl.make_tensor_descriptor(lse_ptr, shape=[n], strides=[1], block_shape=[BM])
    gd = tl.make_tensor_descriptor(g_ptr, shape=[n], strides=[1], block_shape=[BM])
    lse = ld.load([pid * BM])
    g = gd.load([pid * BM])
  acc = tl.zeros([BM, D], dtype=tl.float32)
  cs = tl.zeros([BM], dtype=tl.float32)
  for j0 in tl.range(0, m, BN, warp_specialize=WS):
    y = yd.load([j0, 0])
    s = tl.dot(x, tl.trans(y))
    if ROLES == 2:
      c = tl.exp2(s * scale2 - lse[:, None]) * (g[:, None] + gcd.load([j0])[None, :])
    else:
      c = g[:, None] * tl.exp2(s * scale2 - lse[:, None])
    if CS:
      cs += tl.sum(c * s, 1)
    acc = tl.dot(c.to(y.dtype), y, acc)
  rows = pid * BM + tl.arange(0, BM)
  tl.store(dx_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], acc.to(dx_ptr.dtype.element_ty))
  tl.store(cs_ptr + rows, cs)


def launch(x, y, scale2, lse, g, gc, *, roles, bm, bn, warps, stages, ws, packed=False,
           cs=True):
  n, d = x.shape
  st = jnp.stack([lse, g, jnp.zeros_like(g), jnp.zeros_like(g)], 1)
  return _compat.triton_call(
      x, y, scale2, lse, g, gc, st, n, y.shape[0], kernel=_ws_grad_kernel,
      out_shapes=[jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((n,), jnp.float32)],
      grid=(n // bm,), name="ws_grad", num_warps=warps, num_stages=stages,
      D=d, BM=bm, BN=bn, ROLES=roles, WS=ws, PACKED=packed, CS=cs)


def _s(x, y):
  return jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32).T,
                 precision=jax.lax.Precision.HIGHEST)


def row_lse2(x, y, scale2, chunk=4096):
  """The rows' log2-sum-exp2 of z = s * scale2 (the statistics a forward would pass)."""
  return jnp.concatenate([jax.nn.logsumexp(_s(x[i:i + chunk], y) * scale2[0] * np.log(2), 1)
                          / np.log(2) for i in range(0, x.shape[0], chunk)])


def reference(x, y, scale2, lse, g, gc, roles, rows):
  """float32 dx and cs of the first ``rows`` rows."""
  s = _s(x[:rows], y)
  e = jnp.exp2(s * scale2[0] - lse[:rows, None])
  c = e * (g[:rows, None] + gc[None, :]) if roles == 2 else g[:rows, None] * e
  return jnp.dot(c, y.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST), jnp.sum(c * s, 1)


# (BM, BN, warps, stages, WS, extra): the partitioned variants (the rows' statistics as
# two 1-D descriptors, packed in one 2-D one, or without the c s sums), then the same
# loop unpartitioned, and the shipped D = 128 gradient tile (64 x 128, 4 warps, 3 stages)
VARIANTS = [(128, 128, 4, 2, True, {}), (128, 128, 4, 2, True, dict(packed=True)),
            (128, 128, 4, 2, True, dict(cs=False)), (128, 64, 4, 3, True, {}),
            (128, 128, 8, 2, False, {}), (64, 128, 4, 3, False, {}),
            (64, 64, 4, 3, False, {})]


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--dims", default="128,256")
  p.add_argument("--reps", type=int, default=20)
  a = p.parse_args()
  n = a.batch
  for d in map(int, a.dims.split(",")):
    k = jax.random.split(jax.random.key(d), 3)
    # CLIP-like pairs, temperature 0.07, the rows' true statistics, so each row's
    # softmax leans on its positive (no cancellation in dx)
    x, y = clip_pairs(k[0], n, d)
    scale2 = jnp.full((1,), 1.4426950408889634 / 0.07, jnp.float32)
    lse = row_lse2(x, y, scale2)
    g = 0.5 + jax.random.uniform(k[2], (n,), jnp.float32)
    gc = jnp.flip(g)
    for roles in (1, 2):
      want = reference(x, y, scale2, lse, g, gc, roles, 512)
      for bm, bn, warps, stages, ws, extra in VARIANTS:
        tag = (f"RESULT d={d} roles={roles} tile={bm}x{bn} warps={warps} stages={stages} "
               f"ws={ws} {extra}")
        fn = jax.jit(lambda *v, kw=dict(roles=roles, bm=bm, bn=bn, warps=warps, stages=stages,
                                         ws=ws, **extra): launch(*v, **kw))
        try:
          dx, cs = fn(x, y, scale2, lse, g, gc)
          err_dx = float(jnp.max(jnp.abs(dx[:512].astype(jnp.float32) - want[0])) /
                         jnp.max(jnp.abs(want[0])))
          err_cs = float(jnp.max(jnp.abs(cs[:512] - want[1])) / jnp.max(jnp.abs(want[1])))
          ms = statistics.median(time_jax(fn, x, y, scale2, lse, g, gc, reps=a.reps))
        except Exception as e:   # pylint: disable=broad-except
          print(f"{tag} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
          continue
        tflops = 4 * n * n * d / ms / 1e9
        bad = err_dx > 2e-2 or (extra.get("cs", True) and err_cs > 2e-2)
        print(f"{tag} ms={ms:.3f} tflops={tflops:.0f} err_dx={err_dx:.1e} err_cs={err_cs:.1e}"
              f"{' WRONG' if bad else ''}", flush=True)


if __name__ == "__main__":
  main()
