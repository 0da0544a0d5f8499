"""Whether a hand-written Gluon warp-specialized kernel (FlashAttention-3's forward shape:
a TMA producer warp and wgmma consumer warp groups, Hopper sm_90) runs the rows' gradient
pass faster than a plain Triton kernel (jax-triton >= 0.4, Triton >= 3.9).

The computation is LiT's gradient pass (ROLES = 1 of bench_ws_gradient.py): given x [n, D],
y [m, D] bf16 (whole tiles), scale2 = log2(e) / 0.07 and the rows' lse_i (log2 units) and
g_i, with c_ij = g_i exp2(scale2 s_ij - lse_i), s = x y^T (self pairs included),

  dx_i = sum_j c_ij y_j  (bf16, as bench_ws_gradient)   cs_i = sum_j c_ij s_ij  (fp32),

i.e. attention's P @ V with K = V = y and a known lse. Every tile goes through host TMA
descriptors (``jax_triton.TensorDescriptor``; Gluon's carry the NVMMA shared layout).
Variants (the riskier last):

- ``triton``: ``@triton.jit``, the library's gradient tiles (config/defaults.py): 64 x 64,
  8 warps, 2 stages at D = 512; 64 x 128, 4 warps, 3 stages at D = 128; x [64, D]
  resident, the whole y row tile used for both dots, acc [64, D] fp32 (at D = 512 ptxas
  spills 52-72 bytes a thread, Triton 3.9).
- ``triton_bn128`` (D = 512): 64 x 128, 8 warps, 1 stage (the library's TMA tiles for the
  rows' softmax alone at D = 512, ``RoleTiles(block_n=128, num_stages=1)``).
- ``gluon_ws``: ``gl.warp_specialize``: a 1-warp TMA producer loads x once (BK-feature
  chunks, resident) and fills a ring of NUM_BUF y chunks [BN, BK] (ready / empty
  mbarriers); one consumer warp group (64 rows) per column tile: S = x y^T (async
  warpgroup_mma over the chunks), c = g exp2(S scale2 - lse) and cs += sum(c S) in
  registers, then acc += c (bf16, registers as wgmma's A operand, DotOperandLayout) @ y
  chunk (the same shared chunks S read, not transposed).
- ``gluon_ws_pp``: two consumer groups of 64 rows (BM = 128), unordered, both reading
  every y chunk (empty barriers count two arrivals), as bench_gluon_fwd's winner; the
  consumer groups get 240 registers a thread (setmaxnreg), the producer 24.
- ``gluon_ws_pp_bn128`` (D = 512): the same on 128-column tiles, 3 chunks in the ring
  (S [64, 128] takes 64 registers more: ptxas spills a few bytes; the smallest ring).
- ``library`` (D = 512): the library's kernel (``memeff_jax.backends.triton.grad_gluon``,
  this probe's ``gluon_ws_split_bn128`` until it moved there): 64 rows, all D features,
  S not recomputed: each of two groups computes S for half of a 128-column tile, writes
  its coefficients into its half of a shared P [64, 128] (2 buffers; p_full / p_free
  mbarriers), then acc [64, D / 2] += P @ y over its half of the features; a ring of 4
  chunks [128, 128] (one tile), 224 KiB. (``gluon_ws_split``, 64-column tiles and a ring
  of 8 [64, 128] chunks, ran at D = 256 and 512 before: h200_gluon_grad.csv run 2.)

The fp32 accumulator [64, DO] of a warp group must stay in registers (DO <= 256: 128 a
thread), so at D = 512 the output features are split (all but ``library``):
grid (n / BM, D / DO), DO = 256 as two [64, 128] accumulators (one per 128-feature
chunk); each program recomputes S over
all of D for its half of dx (S's wgmma work twice: 6 n^2 D tensor flops for the 4 n^2 D
counted). A program's chunks run in a rotated order, its own DO slice last, so the
chunks the P @ V dot needs are the last ones loaded and the others are freed as soon as
their S wgmma is done. Shared memory: D = 512: x [128, 512] resident (128 KiB) + 6 y
chunks [64, 128] (96 KiB) = 224 KiB (BN = 64: S [64, 64] 32 + acc 128 + c 16 registers a
thread; ``gluon_ws``, 64 rows: x 64 KiB + 8 chunks); D = 128: BN = 128, one 128-feature
chunk a tile, x 32 KiB (16 for ``gluon_ws``) + 4 chunks [128, 128] (128 KiB).

jax-triton 0.4.1's Gluon compile is rerouted (``memeff_jax._compat``);
warp-specialized kernels launch through ``_compat`` with the PTX's ``.reqntid``. Each
variant is checked against float32 jnp on the first 512 rows (bench_ws_gradient's
reference: dx's error over max |dx|, cs's likewise; wrong over 2e-2 or NaN), then timed
(median of --reps; TFLOP/s count 4 n^2 D); a variant taking over --variant-timeout
seconds (a barrier never completed) is reported and ends the run. ``--compile-only``
compiles every variant for sm_90 here (no GPU) and prints registers, spills, shared
memory and warps:

  python benchmarks/bench_gluon_grad.py --batch 65536 --dims 128,512 --reps 10
  python benchmarks/bench_gluon_grad.py --compile-only --dims 128,512
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

from benchmarks._gluon import (compile_library_gradient, compile_rows, compile_sm90,
                               compiled_via, guarded, is_gluon, layout,
                               library_gradient_outputs, main)
from benchmarks._harness import clip_pairs, time_jax
from benchmarks.bench_ws_gradient import reference, row_lse2
from memeff_jax import _compat
from memeff_jax.backends.triton import grad_gluon

SCALE2 = 1.4426950408889634 / 0.07
CHECK_ROWS = 512


# ---------------------------------------------------------------------------------------
# Plain Triton


@triton.jit
def _triton_grad(x_desc, y_desc, scal_ptr, lse_ptr, g_ptr, m, dx_ptr, cs_ptr,
                 D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
  pid = tl.program_id(0)
  scale2 = tl.load(scal_ptr)
  rows = pid * BM + tl.arange(0, BM)
  lse = tl.load(lse_ptr + rows)
  g = tl.load(g_ptr + rows)
  x = x_desc.load([pid * BM, 0])
  acc = tl.zeros([BM, D], dtype=tl.float32)
  cs = tl.zeros([BM], dtype=tl.float32)
  for j in tl.range(0, m, BN):
    y = y_desc.load([j, 0])
    s = tl.dot(x, tl.trans(y))
    c = g[:, None] * tl.exp2(s * scale2 - lse[:, None])
    cs += tl.sum(c * s, 1)
    acc = tl.dot(c.to(y.dtype), y, acc)
  tl.store(dx_ptr + rows[:, None] * D + tl.arange(0, D)[None, :],
           acc.to(dx_ptr.dtype.element_ty))
  tl.store(cs_ptr + rows, cs)


# ---------------------------------------------------------------------------------------
# Gluon


@gluon.jit
def _gg_producer(x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, off_m, rot, m,
                 BN: gl.constexpr, BK: gl.constexpr, KCH: gl.constexpr,
                 NUM_BUF: gl.constexpr):
  """1 warp: the x rows once, then every y tile's KCH chunks into the ring, both in the
  program's rotated chunk order (position k holds features ((k + rot) % KCH) BK)."""
  mbarrier.expect(x_bar, KCH * x_desc.block_type.nbytes)
  for k in gl.static_range(KCH):
    tma.async_load(x_desc, [off_m, ((k + rot) % KCH) * BK], x_bar, x_smem.index(k))
  it = 0
  for j in range(0, m, BN):
    for k in gl.static_range(KCH):
      slot = it % NUM_BUF
      mbarrier.wait(empty.index(slot), ((it // NUM_BUF) & 1) ^ 1)   # fresh: passes
      mbarrier.expect(ready.index(slot), y_desc.block_type.nbytes)
      tma.async_load(y_desc, [j, ((k + rot) % KCH) * BK], ready.index(slot), y_smem.index(slot))
      it += 1


@gluon.jit
def _gg_consumer(x_smem, y_smem, x_bar, ready, empty, scal_ptr, lse_ptr, g_ptr, dx_ptr,
                 cs_ptr, off_m, do_off, m, CID: gl.constexpr, BMC: gl.constexpr,
                 BN: gl.constexpr, BK: gl.constexpr, D: gl.constexpr, KCH: gl.constexpr,
                 NDO: gl.constexpr, NUM_BUF: gl.constexpr):
  """One warp group (4 warps): rows [off_m + CID BMC, + BMC) against every y tile; dx's
  features [do_off, do_off + NDO BK) in NDO fp32 accumulators [BMC, BK] (the ring's last
  NDO chunks of each tile)."""
  s_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
  o_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
  p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
  row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
  orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
  ocol_layout: gl.constexpr = gl.SliceLayout(0, o_layout)
  gl.static_assert(NDO == 1 or NDO == 2, "one or two output chunks")
  scale2 = gl.load(scal_ptr)
  r0 = off_m + CID * BMC
  rows = r0 + gl.arange(0, BMC, layout=row_layout)
  lse = gl.expand_dims(gl.load(lse_ptr + rows), 1)
  g = gl.expand_dims(gl.load(g_ptr + rows), 1)
  cs = gl.zeros([BMC], gl.float32, layout=row_layout)
  s = gl.zeros([BMC, BN], gl.float32, layout=s_layout)
  acc0 = gl.zeros([BMC, BK], gl.float32, layout=o_layout)
  if NDO == 2:
    acc1 = gl.zeros([BMC, BK], gl.float32, layout=o_layout)
  mbarrier.wait(x_bar, 0)
  it = 0
  for j in range(0, m, BN):
    for k in gl.static_range(KCH):   # S = x y^T over the chunks
      slot = it % NUM_BUF
      mbarrier.wait(ready.index(slot), (it // NUM_BUF) & 1)
      a = x_smem.index(k)
      if BMC != a.shape[0]:
        a = a.slice(CID * BMC, BMC, dim=0)
      s = warpgroup_mma(a, y_smem.index(slot).permute((1, 0)), s, use_acc=k > 0,
                        is_async=True)
      if k > 0:   # chunk k - 1's wgmma is done: free its slot unless P @ V reads it
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        if k - 1 < KCH - NDO:
          mbarrier.arrive(empty.index((it + NUM_BUF - 1) % NUM_BUF))
      it += 1
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    c = g * gl.exp2(s * scale2 - lse)
    cs += gl.sum(c * s, axis=1)
    p = gl.convert_layout(c.to(gl.bfloat16), p_layout)
    # P @ V: the tile's last NDO chunks, [BN, BK] each, as wgmma's B (not transposed)
    acc0 = warpgroup_mma(p, y_smem.index((it + NUM_BUF - NDO) % NUM_BUF), acc0, is_async=True)
    if NDO == 2:
      acc1 = warpgroup_mma(p, y_smem.index((it + NUM_BUF - 1) % NUM_BUF), acc1, is_async=True)
      acc0, acc1, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, p))
    else:   # (p: wgmma reads its registers until done)
      acc0, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, p))
    for i in gl.static_range(NDO):
      mbarrier.arrive(empty.index((it + NUM_BUF - NDO + i) % NUM_BUF))
  orows = r0 + gl.arange(0, BMC, layout=orow_layout)
  ocols = do_off + gl.arange(0, BK, layout=ocol_layout)
  offs = gl.expand_dims(orows, 1) * D + gl.expand_dims(ocols, 0)
  gl.store(dx_ptr + offs, acc0.to(dx_ptr.dtype.element_ty))
  if NDO == 2:
    gl.store(dx_ptr + offs + BK, acc1.to(dx_ptr.dtype.element_ty))
  if do_off == 0:
    gl.store(cs_ptr + rows, cs)


@gluon.jit
def _gluon_ws_grad(x_desc, y_desc, scal_ptr, lse_ptr, g_ptr, m, dx_ptr, cs_ptr,
                   D: gl.constexpr, DO: gl.constexpr, NCONS: gl.constexpr,
                   NUM_BUF: gl.constexpr):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  NDO: gl.constexpr = DO // BK
  BMC: gl.constexpr = BM // NCONS
  # the P @ V chunks of a tile stay until its end: the ring must hold them and one more
  gl.static_assert(NDO < NUM_BUF, "the ring must outlast a tile's output chunks")
  off_m = gl.program_id(0) * BM
  pid_o = gl.program_id(1)
  do_off = pid_o * DO
  rot = (pid_o + 1) * NDO   # this program's output chunks last in each tile
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  empty = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=NCONS)   # every consumer group frees each chunk
  if NCONS == 1:
    gl.warp_specialize([
        (_gg_consumer, (x_smem, y_smem, x_bar, ready, empty, scal_ptr, lse_ptr, g_ptr, dx_ptr,
                        cs_ptr, off_m, do_off, m, 0, BMC, BN, BK, D, KCH, NDO, NUM_BUF)),
        (_gg_producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, off_m, rot, m, BN,
                        BK, KCH, NUM_BUF)),
    ], [1], [24])
  else:   # the second group first among the workers: it starts on a warp-group boundary
    gl.warp_specialize([
        (_gg_consumer, (x_smem, y_smem, x_bar, ready, empty, scal_ptr, lse_ptr, g_ptr, dx_ptr,
                        cs_ptr, off_m, do_off, m, 0, BMC, BN, BK, D, KCH, NDO, NUM_BUF)),
        (_gg_consumer, (x_smem, y_smem, x_bar, ready, empty, scal_ptr, lse_ptr, g_ptr, dx_ptr,
                        cs_ptr, off_m, do_off, m, 1, BMC, BN, BK, D, KCH, NDO, NUM_BUF)),
        (_gg_producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, off_m, rot, m, BN,
                        BK, KCH, NUM_BUF)),
    ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------
# Variants


def _bk(d):
  """Feature chunk: the whole row up to 128, else 128 (DO = 256 is two chunks)."""
  return min(d, 128)


def _do(d):
  """dx features a program writes: at most 256 (two [64, 128] fp32 accumulators)."""
  return min(d, 256)


# name: (kernel, BM, BN(D), BK(D), num_warps(D), num_stages(D), constexprs(D), runs at D)
VARIANTS = {   # the riskier ones last: a hung kernel (a barrier never completed) ends the run
    "triton": (_triton_grad, 64, lambda d: 128 if d <= 128 else 64, lambda d: d,
               lambda d: 4 if d <= 128 else 8, lambda d: 3 if d <= 128 else 2,
               lambda d: {}, lambda d: True),
    "triton_bn128": (_triton_grad, 64, lambda d: 128, lambda d: d, lambda d: 8, lambda d: 1,
                     lambda d: {}, lambda d: d > 128),
    "gluon_ws": (_gluon_ws_grad, 64, lambda d: 128 if d <= 128 else 64, _bk, lambda d: 4,
                 lambda d: 1, lambda d: dict(DO=_do(d), NCONS=1, NUM_BUF=4 if d <= 128 else 8),
                 lambda d: True),
    "gluon_ws_pp": (_gluon_ws_grad, 128, lambda d: 128 if d <= 128 else 64, _bk, lambda d: 4,
                    lambda d: 1,
                    lambda d: dict(DO=_do(d), NCONS=2, NUM_BUF=4 if d <= 128 else 6),
                    lambda d: True),
    "gluon_ws_pp_bn128": (_gluon_ws_grad, 128, lambda d: 128, _bk, lambda d: 4, lambda d: 1,
                          lambda d: dict(DO=_do(d), NCONS=2, NUM_BUF=3), lambda d: d > 128),
    "library": (grad_gluon._lse_bwd_gluon_kernel, grad_gluon.BLOCK_M,
                lambda d: grad_gluon.BLOCK_N, lambda d: grad_gluon.BLOCK_K, lambda d: 4,
                lambda d: 1, lambda d: {}, lambda d: d == 512),
}


def _tiles(variant, d):
  kernel, bm, bn, bk, warps, stages, extra, _ = VARIANTS[variant]
  return kernel, bm, bn(d), bk(d), warps(d), stages(d), extra(d)


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def launch(x, y, scale2, lse, g, variant):
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, d = x.shape
  if variant == "library":   # LiT's pass: the rows' softmax, c s, no scale (out_mult = 1)
    f32, one = jnp.float32, jnp.ones((1,), jnp.float32)
    dummy = jnp.zeros((1,), f32)
    scal = jnp.concatenate([scale2, one, one, dummy])
    dx, cs = _compat.triton_call(
        *library_args(x, y, scal, jnp.zeros((2,), jnp.int32), lse, g, dummy), n,
        y.shape[0], y.shape[0], kernel=grad_gluon._lse_bwd_gluon_kernel,
        out_shapes=library_gradient_outputs(n, d, x.dtype),
        grid=(n // grad_gluon.BLOCK_M, 1), name="gluon_grad_library", num_warps=4,
        num_stages=1, **LIT_PASS)[:2]
    return dx[0], jnp.sum(cs, axis=(0, 1))
  kernel, bm, bn, bk, warps, stages, extra = _tiles(variant, d)
  if is_gluon(kernel):   # host descriptors carrying Gluon's shared layout
    xd = jt.TensorDescriptor.from_array(x, (bm, bk), layout=layout((bm, bk)))
    yd = jt.TensorDescriptor.from_array(y, (bn, bk), layout=layout((bn, bk)))
    consts = dict(D=d, **extra)
    grid = (n // bm, d // extra["DO"])
  else:
    xd, yd = _compat.Tiles(x, (bm, bk)), _compat.Tiles(y, (bn, bk))
    consts = dict(D=d, BM=bm, BN=bn)
    grid = (n // bm,)
  # _compat launches with the PTX's .reqntid: 8 or 12 warps for the partitioned kernels
  dx, cs = _compat.triton_call(
      xd, yd, scale2, lse, g, y.shape[0], kernel=kernel,
      out_shapes=[jax.ShapeDtypeStruct(x.shape, x.dtype),
                  jax.ShapeDtypeStruct((n,), jnp.float32)],
      grid=grid, name=f"gluon_grad_{variant}", num_warps=warps, num_stages=stages, **consts)
  return dx, cs


def run(a):
  n = a.batch
  assert n % 256 == 0, "whole tiles only"
  path = compiled_via()
  for d in map(int, a.dims.split(",")):
    k = jax.random.split(jax.random.key(d), 2)
    x, y = clip_pairs(k[0], n, d)   # each row's softmax leans on its positive
    scale2 = jnp.full((1,), SCALE2, jnp.float32)
    lse = row_lse2(x, y, scale2)
    g = 0.5 + jax.random.uniform(k[1], (n,), jnp.float32)
    want_dx, want_cs = reference(x, y, scale2, lse, g, None, 1, CHECK_ROWS)
    for variant in a.variants.split(","):
      if not VARIANTS[variant][7](d):
        continue

      def body(row, variant=variant):
        fn = jax.jit(lambda *v: launch(*v, variant))
        dx, cs = fn(x, y, scale2, lse, g)
        err_dx = float(jnp.max(jnp.abs(dx[:CHECK_ROWS].astype(jnp.float32) - want_dx)) /
                       jnp.max(jnp.abs(want_dx)))
        err_cs = float(jnp.max(jnp.abs(cs[:CHECK_ROWS] - want_cs)) / jnp.max(jnp.abs(want_cs)))
        bad = not (np.isfinite(err_dx) and np.isfinite(err_cs)) or max(err_dx, err_cs) > 2e-2
        row.update(err_dx=err_dx if np.isfinite(err_dx) else str(err_dx),
                   err_cs=err_cs if np.isfinite(err_cs) else str(err_cs), wrong=bool(bad))
        ms = statistics.median(time_jax(fn, x, y, scale2, lse, g, reps=a.reps))
        row.update(ms=round(ms, 4), tflops=round(4 * n * n * d / ms / 1e9, 1))

      guarded(dict(bench="gluon_grad", variant=variant, batch=n, dim=d, ms=None, tflops=None,
                   err_dx=None, err_cs=None, wrong=None,
                   note=f"compiled via {path}" if is_gluon(VARIANTS[variant][0]) else ""),
              a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile every variant for sm_90 (host descriptors, ``m`` a runtime i32)


def library_args(x, y, scal, off, lse, g, dummy):
  """The library kernel's inputs for LiT's pass (no column role, thresholds or masks)."""
  tiles = lambda a, rows: _compat.Tiles(a, (rows, grad_gluon.BLOCK_K), gluon=True)
  return (tiles(x, grad_gluon.BLOCK_M), tiles(y, grad_gluon.BLOCK_N), scal, off, lse, g,
          dummy, dummy, dummy, dummy, dummy, dummy)


LIT_PASS = dict(D=512, HAS_ROW=True, HAS_COL=False, ROW_THR=False, COL_THR=False,
                EXCLUDE_SELF=False, WANT_CS=True, HAS_MASK=False, SHARED=False)


def compile_only(a):
  def build(variant, d):
    if variant == "library":
      return (compile_library_gradient("bfloat16", LIT_PASS), 4,
              dict(tile=f"{grad_gluon.BLOCK_M}x{grad_gluon.BLOCK_N}", bk=grad_gluon.BLOCK_K,
                   do=d, num_buf=4))
    kernel, bm, bn, bk, warps, stages, extra = _tiles(variant, d)
    if is_gluon(kernel):
      desc = lambda r: f"tensordesc<bf16[{r},{bk}],{layout((r, bk))!r}>"
      consts = dict(D=d, **extra)
    else:
      desc = lambda r: f"tensordesc<bf16[{r},{bk}]>"
      consts = dict(D=d, BM=bm, BN=bn)
    sig = dict(x_desc=desc(bm), y_desc=desc(bn), scal_ptr="*fp32", lse_ptr="*fp32",
               g_ptr="*fp32", m="i32", dx_ptr="*bf16", cs_ptr="*fp32")
    ptrs = ("x_desc", "y_desc", "scal_ptr", "lse_ptr", "g_ptr", "dx_ptr", "cs_ptr")
    return (compile_sm90(kernel, sig, ptrs, consts, warps, stages), warps,
            dict(tile=f"{bm}x{bn}", bk=bk, do=extra.get("DO", d),
                 num_buf=extra.get("NUM_BUF", stages)))
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
