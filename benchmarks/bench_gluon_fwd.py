"""Whether a hand-written Gluon warp-specialized kernel (FlashAttention-3's TMA producer
and wgmma consumers, Hopper sm_90) computes the forward's one-sided bounded row
statistics faster than a plain Triton kernel (jax-triton >= 0.4, Triton >= 3.9).

The computation: x [n, D], y [m, D] bf16 (whole 128-row tiles), scale2 = log2(e) / 0.07,
shift = scale2 - 96 (a fixed bound: s <= 1 for unit rows), and per row
row_sum[i] = sum_{j != i} exp2(scale2 <x_i, y_j> - shift), fp32. Each program owns BM
rows of x (resident in shared memory in the Gluon kernels) and streams y in BN-row tiles;
the B x B similarities are never stored. Every tile goes through host TMA descriptors
(``jax_triton.TensorDescriptor``; Gluon's carry the NVMMA shared layout). Variants:

- ``triton``, ``triton_w4``: ``@triton.jit``, 128 x 128 tiles, 8 or 4 warps, 3 stages; for
  D > 128 a 64-feature K loop inside the column loop (x re-read from L2 per chunk: a
  resident 128 x 512 x tile and 3 stages of 128 x 512 y tiles exceed 227 KiB).
- ``gluon``, ``gluon_w8``: Gluon without partitions, 4 or 8 warps over 128 rows, x
  resident, the y chunk NUM_BUF - 1 ahead loaded as each async wgmma is issued.
- ``gluon_ws``: ``gl.warp_specialize``: a 1-warp TMA producer fills a ring of NUM_BUF y
  chunks ([BN, BK], ready / empty mbarriers); the default partition (one warp group, 128
  rows) issues async ``warpgroup_mma`` on the resident x chunks, frees each slot once its
  wgmma is done, then the exp2 epilogue (the diagonal zeroed on the tile holding it).
- ``gluon_ws_pp``: two consumer warp groups (the default partition and a 4-warp worker),
  64 rows each, both reading every y chunk (empty barriers count two arrivals), not
  ordered: one group's epilogue may run while the other's wgmma is in flight.
- ``gluon_ws_pp256`` (D = 128): the same with 128 rows a group, BM = 256.
- ``*_2s`` (``triton``, ``triton_w4``, ``gluon_ws_pp``, ``gluon_ws_pp256``): two-sided, CLIP's
  forward: each tile's column sums too, one partial row per program (Gluon: per consumer
  group), added in XLA; checked on the first 512 columns too.
- ``gluon_ws_pp_ord``, ``gluon_ws_pp256_ord`` (D = 128): FA3's ping-pong, the groups
  taking turns to issue a tile's wgmma (an mbarrier pair); it needs a whole y tile in the
  ring (D // BK <= NUM_BUF), so not at D = 512.

jax-triton 0.4.1 compiles a Gluon module with Triton's make_ttir + make_ttgir passes,
which rewrite the kernel (a wgmma wait after every wgmma); ``memeff_jax._compat`` routes
Gluon modules through ``gluon_to_ttgir`` as ``triton.compile`` does.
Warp-specialized kernels launch through ``_compat`` with the PTX's ``.reqntid`` (8 or 12
warps). Each variant is checked against float32 jnp on the first 512 rows, then timed
(median of --reps); a variant taking over --variant-timeout seconds (a barrier that never
completes) is reported and ends the run, so the riskier variants come last.
``--compile-only`` compiles every variant for sm_90 here (no GPU, no jax launch, the
jax-triton path above) and prints registers and spills (ptxas -v -arch=sm_90a), shared
memory and the compiled warps:

  python benchmarks/bench_gluon_fwd.py --batch 65536 --dims 128,512 --reps 20
  python benchmarks/bench_gluon_fwd.py --compile-only --dims 128,512
"""

from __future__ import annotations

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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from benchmarks._gluon import (compile_rows, compile_sm90, compiled_via, guarded, is_gluon,
                               layout, main)
from benchmarks._harness import clip_pairs, time_jax
from memeff_jax import _compat
from memeff_jax.backends.triton.stats_gluon import producer

BOUND = 96.0          # shift = scale2 - BOUND: exp2 <= 2**96 for s <= 1
SCALE2 = 1.4426950408889634 / 0.07
CHECK_ROWS = 512


# ---------------------------------------------------------------------------------------
# Plain Triton


@triton.jit
def _triton_fwd(x_desc, y_desc, scal_ptr, m, out_ptr, col_ptr, D: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TWO_SIDED: tl.constexpr):
  pid = tl.program_id(0)
  off_m = pid * BM
  scale2 = tl.load(scal_ptr)
  shift = scale2 - 96.0
  rows = off_m + tl.arange(0, BM)
  cols = tl.arange(0, BN)
  row_sum = tl.zeros([BM], dtype=tl.float32)
  if BK == D:
    x = x_desc.load([off_m, 0])
  for j in tl.range(0, m, BN):
    if BK == D:
      s = tl.dot(x, tl.trans(y_desc.load([j, 0])))
    else:
      s = tl.zeros([BM, BN], dtype=tl.float32)
      for k in tl.range(0, D, BK):
        s = tl.dot(x_desc.load([off_m, k]), tl.trans(y_desc.load([j, k])), s)
    e = tl.exp2(s * scale2 - shift)
    if (j < off_m + BM) & (off_m < j + BN):   # the tile holding the diagonal
      e = tl.where(rows[:, None] == (j + cols)[None, :], 0.0, e)
    row_sum += tl.sum(e, 1)
    if TWO_SIDED:   # this row tile's column sums: one partial row per program
      tl.store(col_ptr + pid.to(tl.int64) * m + j + cols, tl.sum(e, 0))
  tl.store(out_ptr + rows, row_sum)


# ---------------------------------------------------------------------------------------
# Gluon


@gluon.jit
def _g_consumer(x_smem, y_smem, x_bar, ready, empty, turn, scal_ptr, out_ptr, col_ptr, off_m,
                m, CID: gl.constexpr, ORDER: gl.constexpr, BMC: gl.constexpr,
                BN: gl.constexpr, KCH: gl.constexpr, NUM_BUF: gl.constexpr,
                TWO_SIDED: gl.constexpr):
  """One warp group (4 warps): rows [off_m + CID BMC, + BMC) against every y tile. With
  ORDER, the two groups take turns issuing a tile's wgmma (FA3's ping-pong: turn[c] is
  signalled by the other group once it has issued its own)."""
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
  row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
  col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
  scale2 = gl.load(scal_ptr)
  shift = scale2 - 96.0
  r0 = off_m + CID * BMC
  rows = r0 + gl.arange(0, BMC, layout=row_layout)
  cols = gl.arange(0, BN, layout=col_layout)
  row_sum = gl.zeros([BMC], gl.float32, layout=row_layout)
  acc = gl.zeros([BMC, BN], gl.float32, layout=acc_layout)
  mbarrier.wait(x_bar, 0)
  it = 0
  t = 0
  for j in range(0, m, BN):
    if ORDER:   # group 0 first (a fresh barrier passes parity 1), then alternate
      mbarrier.wait(turn.index(CID), (t & 1) ^ (1 - CID))
    for k in gl.static_range(KCH):
      slot = it % NUM_BUF
      mbarrier.wait(ready.index(slot), (it // NUM_BUF) & 1)
      a = x_smem.index(k)
      if BMC != a.shape[0]:
        a = a.slice(CID * BMC, BMC, dim=0)
      acc = warpgroup_mma(a, y_smem.index(slot).permute((1, 0)), acc, use_acc=k > 0,
                          is_async=True)
      if k > 0:   # the previous chunk's wgmma is done: free its slot
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((it + NUM_BUF - 1) % NUM_BUF))
      it += 1
    if ORDER:
      mbarrier.arrive(turn.index(1 - CID))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index((it + NUM_BUF - 1) % NUM_BUF))
    e = gl.exp2(acc * scale2 - shift)
    if (j < r0 + BMC) & (r0 < j + BN):   # the tile holding the diagonal
      e = gl.where(gl.expand_dims(rows, 1) == gl.expand_dims(j + cols, 0), 0.0, e)
    row_sum += gl.sum(e, axis=1)
    if TWO_SIDED:   # this group's column sums: one partial row per consumer group
      gl.store(col_ptr + (r0 // BMC).to(gl.int64) * m + j + cols, gl.sum(e, axis=0))
    t += 1
  gl.store(out_ptr + rows, row_sum)


@gluon.jit
def _gluon_ws_fwd(x_desc, y_desc, scal_ptr, m, out_ptr, col_ptr, D: gl.constexpr,
                  NCONS: gl.constexpr, NUM_BUF: gl.constexpr, ORDER: gl.constexpr,
                  TWO_SIDED: gl.constexpr):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  BMC: gl.constexpr = BM // NCONS
  # in turns, a group issues a whole tile while the other has freed only the tile before
  gl.static_assert(not ORDER or KCH <= NUM_BUF, "ORDER needs a tile's chunks in the ring")
  off_m = gl.program_id(0) * BM
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  empty = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  turn = mbarrier.allocate_mbarrier(batch=2)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=NCONS)   # every consumer group frees each chunk
  for i in gl.static_range(2):
    mbarrier.init(turn.index(i), count=1)
  if NCONS == 1:
    gl.warp_specialize([
        (_g_consumer, (x_smem, y_smem, x_bar, ready, empty, turn, scal_ptr, out_ptr, col_ptr,
                       off_m, m, 0, False, BMC, BN, KCH, NUM_BUF, TWO_SIDED)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, off_m, 0, m, BN, BK,
                    KCH, NUM_BUF)),
    ], [1], [24])
  else:   # the second group first among the workers: it starts on a warp-group boundary
    gl.warp_specialize([
        (_g_consumer, (x_smem, y_smem, x_bar, ready, empty, turn, scal_ptr, out_ptr, col_ptr,
                       off_m, m, 0, ORDER, BMC, BN, KCH, NUM_BUF, TWO_SIDED)),
        (_g_consumer, (x_smem, y_smem, x_bar, ready, empty, turn, scal_ptr, out_ptr, col_ptr,
                       off_m, m, 1, ORDER, BMC, BN, KCH, NUM_BUF, TWO_SIDED)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, off_m, 0, m, BN, BK,
                    KCH, NUM_BUF)),
    ], [4, 1], [232, 24])


@gluon.jit
def _gluon_fwd(x_desc, y_desc, scal_ptr, m, out_ptr, col_ptr, D: gl.constexpr,
               NUM_BUF: gl.constexpr, TWO_SIDED: gl.constexpr):
  """No partitions: num_warps warps (4 or 8, [num_warps, 1] over the rows), the y chunk
  NUM_BUF - 1 ahead loaded as each wgmma is issued."""
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  WARPS: gl.constexpr = gl.num_warps()
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16])
  row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
  col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
  off_m = gl.program_id(0) * BM
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
  total = (m // BN) * KCH
  mbarrier.expect(x_bar, KCH * x_desc.block_type.nbytes)
  for k in gl.static_range(KCH):
    tma.async_load(x_desc, [off_m, k * BK], x_bar, x_smem.index(k))
  for p in gl.static_range(NUM_BUF - 1):   # prologue
    mbarrier.expect(ready.index(p), y_desc.block_type.nbytes, pred=p < total)
    tma.async_load(y_desc, [(p // KCH) * BN, (p % KCH) * BK], ready.index(p), y_smem.index(p),
                   pred=p < total)
  scale2 = gl.load(scal_ptr)
  shift = scale2 - 96.0
  rows = off_m + gl.arange(0, BM, layout=row_layout)
  cols = gl.arange(0, BN, layout=col_layout)
  row_sum = gl.zeros([BM], gl.float32, layout=row_layout)
  acc = gl.zeros([BM, BN], gl.float32, layout=acc_layout)
  mbarrier.wait(x_bar, 0)
  it = 0
  for j in range(0, m, BN):
    for k in gl.static_range(KCH):
      slot = it % NUM_BUF
      mbarrier.wait(ready.index(slot), (it // NUM_BUF) & 1)
      acc = warpgroup_mma(x_smem.index(k), y_smem.index(slot).permute((1, 0)), acc,
                          use_acc=k > 0, is_async=True)
      if k > 0:   # chunk it - 1's wgmma is done: its slot takes chunk it + NUM_BUF - 1
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
      nxt = it + NUM_BUF - 1
      ns = nxt % NUM_BUF
      mbarrier.expect(ready.index(ns), y_desc.block_type.nbytes, pred=nxt < total)
      tma.async_load(y_desc, [(nxt // KCH) * BN, (nxt % KCH) * BK], ready.index(ns),
                     y_smem.index(ns), pred=nxt < total)
      it += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    e = gl.exp2(acc * scale2 - shift)
    if (j < off_m + BM) & (off_m < j + BN):   # the tile holding the diagonal
      e = gl.where(gl.expand_dims(rows, 1) == gl.expand_dims(j + cols, 0), 0.0, e)
    row_sum += gl.sum(e, axis=1)
    if TWO_SIDED:
      gl.store(col_ptr + gl.program_id(0).to(gl.int64) * m + j + cols, gl.sum(e, axis=0))
  gl.store(out_ptr + rows, row_sum)


# ---------------------------------------------------------------------------------------
# Variants


def _bk(d):
  """Feature chunk: the whole row up to 128, else 64 (a resident 128 x 512 x tile is
  128 KiB; 4 buffers of 128 x 64 y chunks add 64 KiB)."""
  return d if d <= 128 else 64


def _nbuf(d):
  return 3 if d <= 128 else 4


# name: (kernel, BM, BN, BK(D), num_warps, num_stages, constexprs(D), runs at D)
VARIANTS = {   # the riskier ones last: a hung kernel (a barrier never completed) ends the run
    "triton": (_triton_fwd, 128, 128, _bk, 8, 3, lambda d: {}, lambda d: True),
    "triton_w4": (_triton_fwd, 128, 128, _bk, 4, 3, lambda d: {}, lambda d: True),
    "gluon": (_gluon_fwd, 128, 128, _bk, 4, 1, lambda d: dict(NUM_BUF=_nbuf(d)),
              lambda d: True),
    "gluon_w8": (_gluon_fwd, 128, 128, _bk, 8, 1, lambda d: dict(NUM_BUF=_nbuf(d)),
                 lambda d: True),
    "gluon_ws": (_gluon_ws_fwd, 128, 128, _bk, 4, 1,
                 lambda d: dict(NCONS=1, NUM_BUF=_nbuf(d), ORDER=False), lambda d: True),
    "gluon_ws_pp": (_gluon_ws_fwd, 128, 128, _bk, 4, 1,
                    lambda d: dict(NCONS=2, NUM_BUF=_nbuf(d), ORDER=False), lambda d: True),
    "gluon_ws_pp256": (_gluon_ws_fwd, 256, 128, _bk, 4, 1,
                       lambda d: dict(NCONS=2, NUM_BUF=3, ORDER=False), lambda d: d <= 128),
    # two-sided (_2s, CLIP's forward): also each tile's column sums, one partial row per
    # program (consumer group), added in XLA
    "triton_2s": (_triton_fwd, 128, 128, _bk, 8, 3, lambda d: {}, lambda d: True),
    "triton_w4_2s": (_triton_fwd, 128, 128, _bk, 4, 3, lambda d: {}, lambda d: True),
    "gluon_ws_pp_2s": (_gluon_ws_fwd, 128, 128, _bk, 4, 1,
                       lambda d: dict(NCONS=2, NUM_BUF=_nbuf(d), ORDER=False), lambda d: True),
    "gluon_ws_pp256_2s": (_gluon_ws_fwd, 256, 128, _bk, 4, 1,
                          lambda d: dict(NCONS=2, NUM_BUF=3, ORDER=False), lambda d: d <= 128),
    # ORDER: a tile's chunks must fit the ring (KCH <= NUM_BUF), so D <= 128 only
    "gluon_ws_pp_ord": (_gluon_ws_fwd, 128, 128, _bk, 4, 1,
                        lambda d: dict(NCONS=2, NUM_BUF=_nbuf(d), ORDER=True),
                        lambda d: d <= 128),
    "gluon_ws_pp256_ord": (_gluon_ws_fwd, 256, 128, _bk, 4, 1,
                           lambda d: dict(NCONS=2, NUM_BUF=3, ORDER=True), lambda d: d <= 128),
}


def _two_sided(variant: str) -> bool:
  return variant.endswith("_2s")


def _args(variant, d):
  """(kernel, BM, BN, BK, warps, stages, constexprs, runtime signature) of ``variant`` at D."""
  kernel, bm, bn, bk, warps, stages, extra, _ = VARIANTS[variant]
  bk = bk(d)
  consts = dict(D=d, TWO_SIDED=_two_sided(variant),
                **(extra(d) if is_gluon(kernel) else dict(BM=bm, BN=bn, BK=bk)))
  desc = (lambda r: f"tensordesc<bf16[{r},{bk}],{layout((r, bk))!r}>") if is_gluon(kernel) else (
      lambda r: f"tensordesc<bf16[{r},{bk}]>")
  sig = dict(x_desc=desc(bm), y_desc=desc(bn), scal_ptr="*fp32", m="i32", out_ptr="*fp32",
             col_ptr="*fp32")
  return kernel, bm, bn, bk, warps, stages, consts, sig


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def launch(x, y, scale2, variant):
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, d = x.shape
  kernel, bm, bn, bk, warps, stages, consts, _ = _args(variant, d)
  if is_gluon(kernel):   # host descriptors carrying Gluon's shared layout
    xd = jt.TensorDescriptor.from_array(x, (bm, bk), layout=layout((bm, bk)))
    yd = jt.TensorDescriptor.from_array(y, (bn, bk), layout=layout((bn, bk)))
  else:
    xd, yd = _compat.Tiles(x, (bm, bk)), _compat.Tiles(y, (bn, bk))
  two = consts["TWO_SIDED"]
  parts = n // (bm // consts.get("NCONS", 1))   # column partial rows
  out = [jax.ShapeDtypeStruct((n,), jnp.float32),
         jax.ShapeDtypeStruct((parts, y.shape[0]) if two else (1,), jnp.float32)]
  # _compat launches with the PTX's .reqntid: 8 or 12 warps for the partitioned kernels
  row, col = _compat.triton_call(
      xd, yd, scale2, y.shape[0], kernel=kernel, out_shapes=out, grid=(n // bm,),
      name=f"gluon_fwd_{variant}", num_warps=warps, num_stages=stages, **consts)
  return row, (jnp.sum(col, 0) if two else None)


def reference(x, y, scale2, rows):
  """float32 sums of the first ``rows`` rows and of the first ``rows`` columns, the
  diagonal left out."""
  def sums(a, b):
    s = jnp.dot(a[:rows].astype(jnp.float32), b.astype(jnp.float32).T,
                precision=jax.lax.Precision.HIGHEST)
    e = jnp.exp2(s * scale2[0] - (scale2[0] - BOUND))
    return jnp.sum(e.at[jnp.arange(rows), jnp.arange(rows)].set(0.0), 1)
  return sums(x, y), sums(y, x)


def run(a):
  n = a.batch
  assert n % 256 == 0, "whole tiles only"
  path = compiled_via()
  for d in map(int, a.dims.split(",")):
    x, y = clip_pairs(jax.random.key(d), n, d)   # unit rows: s <= 1, the bound's premise
    scale2 = jnp.full((1,), SCALE2, jnp.float32)
    want = reference(x, y, scale2, CHECK_ROWS)
    for variant in a.variants.split(","):
      if not VARIANTS[variant][7](d):
        continue

      def body(row, variant=variant):
        fn = jax.jit(lambda x, y, s: launch(x, y, s, variant))
        got = fn(x, y, scale2)
        err = max(float(jnp.max(jnp.abs(g[:CHECK_ROWS] - w) / w))
                  for g, w in zip(got, want) if g is not None)
        bad = not np.isfinite(err) or err > 2e-2
        row.update(err=err if np.isfinite(err) else str(err), wrong=bool(bad))
        ms = statistics.median(time_jax(fn, x, y, scale2, reps=a.reps))
        row.update(ms=round(ms, 4), tflops=round(2 * n * n * d / ms / 1e9, 1))

      guarded(dict(bench="gluon_fwd", variant=variant, batch=n, dim=d, ms=None, tflops=None,
                   err=None, wrong=None,
                   note=f"compiled via {path}" if is_gluon(VARIANTS[variant][0]) else ""),
              a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile every variant for sm_90 (host descriptors, ``m`` a runtime i32)


def compile_only(a):
  def build(variant, d):
    kernel, _, _, _, warps, stages, consts, sig = _args(variant, d)
    ptrs = ("x_desc", "y_desc", "scal_ptr", "out_ptr", "col_ptr")
    return compile_sm90(kernel, sig, ptrs, consts, warps, stages), warps, {}
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=20)
