"""Whether one warp-specialized Gluon kernel (Hopper sm_90; jax-triton >= 0.4, Triton >= 3.9)
runs fused Matryoshka's gradient pass (dims 64 / 128 / 256 / 512, D = 512, bf16) at close
to the plain pass's cost, where the K plain blocks cost the sum of their dims' passes.

The pass is CLIP's rows' pass with one exponential per entry (``coefficient``'s SHARED
form, as ``lse_bwd`` sends it): for each dim k, the prefix cosine s^k = a_k,i b_k,j
<x_i, y_j>_{:m_k} (a, b: the prefix inverse norms), c^k_ij = 2^(min(z^k_ij - t_k, 8))
(g^k_r,i + g^k_c,j), and

  dx_i[segment k] = sum_j C^k_ij y_j[segment k],  C^k = sum_{k' >= k} c^k' a_k' b_k'
  cs_k,i = sum_j c^k_ij s^k_ij

(``grad_bwd.prefix_gradient``'s formulas: the GEMM work of one plain pass.)

Variants:

- ``plain``: the library's Gluon pass (``grad_gluon``, 64 x 128 tiles) on the same
  operands with one dim (D = 512): the cost a fused pass is measured against.
- ``mrl_suffix``: this file's kernel. 64 rows a program, x resident (eight 64-feature
  chunks, 64 KiB); the other tower in 64-column tiles through a ring of twelve [64, 64]
  chunks (96 KiB: a tile and half the next). Two consumer warp groups each take half of
  a tile's columns: the similarities over the eight chunks go into one fp32 accumulator
  per segment ([64, 32] each; no wait between chunks), then, from the last dim down,
  each dim's coefficients, their c s sums, and the running suffix sum C^k stored (bf16)
  into segment k's shared P [64, 64] (two sets of four; ``p_full`` / ``p_free``
  mbarriers). Group 0 owns dx's features [0, 256) (chunks 0..3: C^0, C^1, C^2, C^2),
  group 1 [256, 512) (C^3): four [64, 64] fp32 accumulators each. A ring chunk is freed
  by both groups' S and its owner's P @ y (three arrivals). Shared memory: 64 + 96 + 64
  KiB.
- ``mrl_direct``: the same pipeline, each dim's c a b stored unsummed into its P^k as
  soon as its prefix dot is complete (during the feature walk), and every chunk of dx
  summed over the P^k that cover it (15 chunk products a tile instead of 8).
- ``mrl_direct_two_acc``: ``mrl_direct`` with two of a group's four dx accumulators (a
  timing bound without the register pressure; its dx is wrong by design).
- ``mrl_direct_prefetch``, ``mrl_suffix_prefetch``: the same with the statistics out of
  the epilogue's way. The variants above load each dim's row and column statistics
  (a, lse, g; b, g_c) after the tile's S, four dims a tile, and both groups wait on the
  loads (P is shared): with every pass in the library's plain Gluon kernel, CLIP's step
  took 56.3 ms with the column statistics loaded after S and 42.0 with them loaded before
  the tile's wgmmas (benchmarks/NOTES.md, 2026-12-03 runs 2-3). Here the rows' are
  loaded once, before the column loop, and the tile's columns' before its wgmmas, one
  register a vector (``_tile_cols``), converted to the accumulator's layout at their
  use.

Measured (one H200, B = 65536, jax-triton 0.4.1 + Triton 3.9; h200_gluon_mrl.csv):
``plain`` 15.97 ms; ``mrl_direct`` 62.13 (888 B of spills), ``mrl_suffix`` 73.13 (1304
B), both within 3.2e-3 of float32; ``mrl_direct_two_acc`` 48.48 (16 B). One fused pass
costs 3.9x the plain one, more than the per-dim passes it would replace: the four
dims' epilogues on 64 x 64 tiles, not the spills, bound it (docs/notes/matryoshka.md).
With the statistics loaded ahead (760 / 1080 B of spill stores against 888 / 1300, the
same 224.5 KiB of shared memory): ``mrl_direct_prefetch`` 55.46 ms, ``mrl_suffix_prefetch``
61.81, against 60.62 / 71.86 and ``plain`` 16.03 in the same call (2026-12-04): not the
loads either.

Each variant is checked against float32 jnp on the first 512 rows (dx's error over
max |dx|, cs's likewise; wrong over 2e-2 or NaN) at a logit scale of 1 / 0.5 (every
entry matters), then timed at 1 / 0.07 (median of --reps):

  python benchmarks/bench_gluon_mrl.py --batch 65536 --reps 10
  python benchmarks/bench_gluon_mrl.py --compile-only
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
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks._gluon import (compile_rows, compile_sm90, compiled_via, guarded, layout,
                               library_gradient_outputs, main)
from benchmarks._harness import clip_pairs, time_jax
from memeff_jax import _compat
from memeff_jax.backends.triton import grad_gluon
from memeff_jax.backends.triton._common import coefficient, col_stats, row_stats
from memeff_jax.backends.triton.stats_gluon import producer

LOG2E = 1.4426950408889634
CHECK_ROWS = 512
DIMS = (64, 128, 256, 512)
BM, BN, BK, D = 64, 64, 64, 512
NUM_BUF = gl.constexpr(12)
NUM_P = gl.constexpr(2)
# a consumer group's S [BM, BN / 2] and dx chunk [BM, BK] (wgmma accumulators)
S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN // 2, 16]))
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BK, 16]))


@gluon.jit
def _issue(x_smem, y_smem, ready, pos, k: gl.constexpr, acc, use_acc: gl.constexpr,
           CID: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr):
  """Chunk k of the tile (ring position pos) into ``acc``: S half += x_k y_k[half]^T."""
  slot = pos % NB
  mbarrier.wait(ready.index(slot), (pos // NB) & 1)
  b = y_smem.index(slot).slice(CID * HALF, HALF, dim=0).permute((1, 0))
  return warpgroup_mma(x_smem.index(k), b, acc, use_acc=use_acc, is_async=True)


@gluon.jit
def _retire(empty, pos, acc, NB: gl.constexpr):
  """All but the newest wgmma done: chunk ``pos``'s S use is over."""
  acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
  mbarrier.arrive(empty.index(pos % NB))
  return acc


@gluon.jit
def _dim(raw, k: gl.constexpr, ahead, tile, stats, BM: gl.constexpr, HALF: gl.constexpr,
         ROW_THR: gl.constexpr, COL_THR: gl.constexpr, EXCLUDE_SELF: gl.constexpr,
         HAS_MASK: gl.constexpr, PREFETCH: gl.constexpr):
  """Dim k's coefficients on the prefix dot ``raw``: (c a b, the rows' sums of c s). Its
  statistics: PREFETCH, ``ahead`` = (every dim's rows' (a, lse, g), hoisted out of the
  column loop; every dim's (b, g_c) of the tile, loaded before its wgmmas in a compact
  layout, one register a vector: ``_tile_cols``), converted here; else loaded here,
  after the tile's S (the loads' latency in the epilogue)."""
  rows, in_rows, cols, row0, col0, scale2, row_off, col_off, n, m = tile
  xt_ptr, yt_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr, yb_ptr = (
      stats)
  if PREFETCH:
    gl.static_assert(not (ROW_THR or COL_THR))
    a, lse_r, g_r = ahead[0][k]
    cl: gl.constexpr = gl.SliceLayout(0, raw.type.layout)
    b = gl.convert_layout(ahead[1][k][0], cl)
    g_c = gl.convert_layout(ahead[1][k][1], cl)
    thr_r = 0.0
    thr_c = 0.0
  else:
    a = gl.load(xt_ptr + k * n + rows, mask=in_rows, other=0.0)
    b = gl.load(yt_ptr + k * m + cols, mask=cols < m, other=0.0)
    lse_r, g_r, thr_r = row_stats(lse_r_ptr + k * n, g_r_ptr + k * n, thr_r_ptr + k * n, rows,
                                  in_rows, BM, True, ROW_THR)
    lse_c, g_c, thr_c = col_stats(lse_c_ptr + k * m, g_c_ptr + k * m, thr_c_ptr + k * m, cols,
                                  m, True, COL_THR, True)
  s = raw * gl.expand_dims(a, 1) * gl.expand_dims(b, 0)
  c = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, lse_r, g_r, thr_r,
                  0.0, g_c, thr_c, xb_ptr, yb_ptr, BM, HALF, True, True, ROW_THR, COL_THR,
                  EXCLUDE_SELF, HAS_MASK, True)
  return c * gl.expand_dims(a, 1) * gl.expand_dims(b, 0), gl.sum(c * s, axis=1)


@gluon.jit
def _row_pre(stats, rows, in_rows, n, BM: gl.constexpr, PREFETCH: gl.constexpr):
  """PREFETCH: every dim's (a, lse, g) of the program's rows (``_dim``'s ``ahead[0]``)."""
  out = 0
  if PREFETCH:
    out = (_row_dim(stats, 0, rows, in_rows, n, BM), _row_dim(stats, 1, rows, in_rows, n, BM),
           _row_dim(stats, 2, rows, in_rows, n, BM), _row_dim(stats, 3, rows, in_rows, n, BM))
  return out


@gluon.jit
def _row_dim(stats, k: gl.constexpr, rows, in_rows, n, BM: gl.constexpr):
  a = gl.load(stats[0] + k * n + rows, mask=in_rows, other=0.0)
  lse_r, g_r, _ = row_stats(stats[2] + k * n, stats[3] + k * n, stats[4], rows, in_rows, BM,
                            True, False)
  return a, lse_r, g_r


@gluon.jit
def _tile_cols(stats, col0, m, HALF: gl.constexpr, PREFETCH: gl.constexpr):
  """PREFETCH: every dim's (b, g_c) of a tile's HALF columns, in a compact layout (each
  warp a copy, one register a vector; ``_dim``'s ``ahead[1]``)."""
  out = 0
  if PREFETCH:
    cols = col0 + gl.arange(0, HALF, layout=gl.BlockedLayout([1], [32], [4], [0]))
    out = (_col_dim(stats, 0, cols, m), _col_dim(stats, 1, cols, m),
           _col_dim(stats, 2, cols, m), _col_dim(stats, 3, cols, m))
  return out


@gluon.jit
def _col_dim(stats, k: gl.constexpr, cols, m):
  keep = cols < m
  return (gl.load(stats[1] + k * m + cols, mask=keep, other=0.0),
          gl.load(stats[6] + k * m + cols, mask=keep, other=0.0))


@gluon.jit
def _start(scal_ptr, off_ptr, stats, row0, n, BM: gl.constexpr, BN: gl.constexpr,
           BK: gl.constexpr, PREFETCH: gl.constexpr):
  """What both consumers start from: scale2, the offsets, the program's rows (and their
  statistics where PREFETCH), and zeros for S, the sums of c s and dx's accumulators."""
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, S_LAYOUT))
  in_rows = rows < n
  return (gl.load(scal_ptr), gl.load(off_ptr), gl.load(off_ptr + 1), rows, in_rows,
          _row_pre(stats, rows, in_rows, n, BM, PREFETCH),
          gl.zeros([BM, BN // 2], gl.float32, layout=S_LAYOUT),
          gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT)),
          gl.zeros([BM, BK], gl.float32, layout=O_LAYOUT))


@gluon.jit
def _mrl_consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                  off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr,
                  CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  D: gl.constexpr, NB: gl.constexpr, NP: gl.constexpr, ROW_THR: gl.constexpr,
                  COL_THR: gl.constexpr, EXCLUDE_SELF: gl.constexpr, HAS_MASK: gl.constexpr,
                  PREFETCH: gl.constexpr):
  """The suffix sums' consumer (see the module's ``mrl_suffix``); PREFETCH: ``_dim``'s."""
  HALF: gl.constexpr = BN // 2
  scale2, row_off, col_off, rows, in_rows, row_pre, zs, cs0, acc0 = _start(
      scal_ptr, off_ptr, stats, row0, n, BM, BN, BK, PREFETCH)
  cs1, cs2, cs3 = cs0, cs0, cs0
  acc1, acc2, acc3 = acc0, acc0, acc0
  mbarrier.wait(x_bar, 0)
  it = 0   # ring position of the tile's first chunk
  t = 0    # tile count (P set t % NP)
  for j in range(j_lo, j_hi, BN):
    col_pre = _tile_cols(stats, j + CID * HALF, m, HALF, PREFETCH)   # (before the wgmmas)
    # one accumulator a segment: chunks 0 | 1 | 2, 3 | 4..7
    d0 = _issue(x_smem, y_smem, ready, it, 0, zs, False, CID, HALF, NB)
    d1 = _issue(x_smem, y_smem, ready, it + 1, 1, zs, False, CID, HALF, NB)
    d1 = _retire(empty, it, d1, NB)
    d2 = _issue(x_smem, y_smem, ready, it + 2, 2, zs, False, CID, HALF, NB)
    d2 = _retire(empty, it + 1, d2, NB)
    d2 = _issue(x_smem, y_smem, ready, it + 3, 3, d2, True, CID, HALF, NB)
    d2 = _retire(empty, it + 2, d2, NB)
    d3 = _issue(x_smem, y_smem, ready, it + 4, 4, zs, False, CID, HALF, NB)
    d3 = _retire(empty, it + 3, d3, NB)
    for k in gl.static_range(5, 8):
      d3 = _issue(x_smem, y_smem, ready, it + k, k, d3, True, CID, HALF, NB)
      d3 = _retire(empty, it + k - 1, d3, NB)
    d0, d1, d2, d3 = warpgroup_mma_wait(num_outstanding=0, deps=(d0, d1, d2, d3))
    mbarrier.arrive(empty.index((it + 7) % NB))
    # the prefix dots, then each dim from the last down into its segment's P
    d1 = d0 + d1
    d2 = d1 + d2
    d3 = d2 + d3
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, S_LAYOUT))
    ahead = (row_pre, col_pre)
    tile = (rows, in_rows, cols, row0, col0, scale2, row_off, col_off, n, m)
    pb = t % NP
    mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
    cab, add = _dim(d3, 3, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs3 += add
    suffix = cab
    p_smem.index(pb * 4 + 3).slice(CID * HALF, HALF, dim=1).store(suffix.to(p_smem.dtype))
    cab, add = _dim(d2, 2, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs2 += add
    suffix += cab
    p_smem.index(pb * 4 + 2).slice(CID * HALF, HALF, dim=1).store(suffix.to(p_smem.dtype))
    cab, add = _dim(d1, 1, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs1 += add
    suffix += cab
    p_smem.index(pb * 4 + 1).slice(CID * HALF, HALF, dim=1).store(suffix.to(p_smem.dtype))
    cab, add = _dim(d0, 0, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs0 += add
    suffix += cab
    p_smem.index(pb * 4).slice(CID * HALF, HALF, dim=1).store(suffix.to(p_smem.dtype))
    fence_async_shared()   # the generic stores before wgmma's (async proxy) reads
    mbarrier.arrive(p_full.index(pb))
    mbarrier.wait(p_full.index(pb), (t // NP) & 1)        # both halves of every P written
    # dx's features of this group: chunks 4 CID .. 4 CID + 3, each with its segment's P
    if CID == 0:
      acc0 = warpgroup_mma(p_smem.index(pb * 4), y_smem.index(it % NB), acc0, is_async=True)
      acc1 = warpgroup_mma(p_smem.index(pb * 4 + 1), y_smem.index((it + 1) % NB), acc1,
                           is_async=True)
      acc2 = warpgroup_mma(p_smem.index(pb * 4 + 2), y_smem.index((it + 2) % NB), acc2,
                           is_async=True)
      acc3 = warpgroup_mma(p_smem.index(pb * 4 + 2), y_smem.index((it + 3) % NB), acc3,
                           is_async=True)
    else:
      acc0 = warpgroup_mma(p_smem.index(pb * 4 + 3), y_smem.index((it + 4) % NB), acc0,
                           is_async=True)
      acc1 = warpgroup_mma(p_smem.index(pb * 4 + 3), y_smem.index((it + 5) % NB), acc1,
                           is_async=True)
      acc2 = warpgroup_mma(p_smem.index(pb * 4 + 3), y_smem.index((it + 6) % NB), acc2,
                           is_async=True)
      acc3 = warpgroup_mma(p_smem.index(pb * 4 + 3), y_smem.index((it + 7) % NB), acc3,
                           is_async=True)
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0,
                                                deps=(acc0, acc1, acc2, acc3))
    for i in gl.static_range(4):
      mbarrier.arrive(empty.index((it + CID * 4 + i) % NB))
    mbarrier.arrive(p_free.index(pb))
    it += 8
    t += 1
  out_mult = gl.load(scal_ptr + 1)
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, O_LAYOUT))
  feats = CID * 4 * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, O_LAYOUT))
  split = gl.program_id(1).to(gl.int64)
  at = dx_ptr + (split * n + gl.expand_dims(orows, 1)) * D + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < D, 0)
  ty = dx_ptr.dtype.element_ty
  gl.store(at, (acc0 * out_mult).to(ty), mask=keep)
  gl.store(at + BK, (acc1 * out_mult).to(ty), mask=keep)
  gl.store(at + 2 * BK, (acc2 * out_mult).to(ty), mask=keep)
  gl.store(at + 3 * BK, (acc3 * out_mult).to(ty), mask=keep)
  _store_cs(cs_ptr, scal_ptr, (cs0, cs1, cs2, cs3), rows, in_rows, n, CID)


@gluon.jit
def _mrl_consumer_direct(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                         scal_ptr, off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr,
                         CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                         BK: gl.constexpr, D: gl.constexpr, NB: gl.constexpr,
                         NP: gl.constexpr, ROW_THR: gl.constexpr, COL_THR: gl.constexpr,
                         EXCLUDE_SELF: gl.constexpr, HAS_MASK: gl.constexpr,
                         PREFETCH: gl.constexpr, TWO_ACC: gl.constexpr):
  """``direct``: each dim's coefficients as soon as its prefix dot is complete (under
  the next chunk's wgmma), stored unsummed, c^k a b, into P^k; then chunk c of dx takes
  sum_{k: m_k > 64 c} P^k @ y_c (15 chunk products a tile instead of 8, no suffix tiles
  in registers). Group 0 owns chunks 0, 2, 4, 5 (8 products), group 1 chunks 1, 3, 6, 7
  (7).
  TWO_ACC (a timing bound, not a gradient): only each group's first two chunks of dx
  (two accumulators: ptxas spills none), the rest left unwritten."""
  HALF: gl.constexpr = BN // 2
  scale2, row_off, col_off, rows, in_rows, row_pre, zs, cs0, acc0 = _start(
      scal_ptr, off_ptr, stats, row0, n, BM, BN, BK, PREFETCH)
  cs1, cs2, cs3 = cs0, cs0, cs0
  acc1, acc2, acc3 = acc0, acc0, acc0
  mbarrier.wait(x_bar, 0)
  it = 0
  t = 0
  for j in range(j_lo, j_hi, BN):
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, S_LAYOUT))
    ahead = (row_pre, _tile_cols(stats, col0, m, HALF, PREFETCH))
    tile = (rows, in_rows, cols, row0, col0, scale2, row_off, col_off, n, m)
    pb = t % NP
    mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
    d0 = _issue(x_smem, y_smem, ready, it, 0, zs, False, CID, HALF, NB)
    d1 = _issue(x_smem, y_smem, ready, it + 1, 1, zs, False, CID, HALF, NB)
    d0 = _retire(empty, it, d0, NB)
    cab, add = _dim(d0, 0, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs0 += add
    p_smem.index(pb * 4).slice(CID * HALF, HALF, dim=1).store(cab.to(p_smem.dtype))
    d2 = _issue(x_smem, y_smem, ready, it + 2, 2, zs, False, CID, HALF, NB)
    d1 = _retire(empty, it + 1, d1, NB)
    pre = d0 + d1
    cab, add = _dim(pre, 1, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs1 += add
    p_smem.index(pb * 4 + 1).slice(CID * HALF, HALF, dim=1).store(cab.to(p_smem.dtype))
    d2 = _issue(x_smem, y_smem, ready, it + 3, 3, d2, True, CID, HALF, NB)
    d2 = _retire(empty, it + 2, d2, NB)
    d3 = _issue(x_smem, y_smem, ready, it + 4, 4, zs, False, CID, HALF, NB)
    d2 = _retire(empty, it + 3, d2, NB)
    pre = pre + d2
    cab, add = _dim(pre, 2, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs2 += add
    p_smem.index(pb * 4 + 2).slice(CID * HALF, HALF, dim=1).store(cab.to(p_smem.dtype))
    for k in gl.static_range(5, 8):
      d3 = _issue(x_smem, y_smem, ready, it + k, k, d3, True, CID, HALF, NB)
      d3 = _retire(empty, it + k - 1, d3, NB)
    d3 = warpgroup_mma_wait(num_outstanding=0, deps=(d3,))
    mbarrier.arrive(empty.index((it + 7) % NB))
    pre = pre + d3
    cab, add = _dim(pre, 3, ahead, tile, stats, BM, HALF, ROW_THR, COL_THR,
                    EXCLUDE_SELF, HAS_MASK, PREFETCH)
    cs3 += add
    p_smem.index(pb * 4 + 3).slice(CID * HALF, HALF, dim=1).store(cab.to(p_smem.dtype))
    fence_async_shared()
    mbarrier.arrive(p_full.index(pb))
    mbarrier.wait(p_full.index(pb), (t // NP) & 1)
    if CID == 0:   # chunks 0, 2, 4, 5
      for k in gl.static_range(4):
        acc0 = _pv(p_smem, y_smem, pb, k, it, acc0, NB)
      for k in gl.static_range(2, 4):
        acc1 = _pv(p_smem, y_smem, pb, k, it + 2, acc1, NB)
      if not TWO_ACC:
        acc2 = _pv(p_smem, y_smem, pb, 3, it + 4, acc2, NB)
        acc3 = _pv(p_smem, y_smem, pb, 3, it + 5, acc3, NB)
    else:          # chunks 1, 3, 6, 7
      for k in gl.static_range(1, 4):
        acc0 = _pv(p_smem, y_smem, pb, k, it + 1, acc0, NB)
      for k in gl.static_range(2, 4):
        acc1 = _pv(p_smem, y_smem, pb, k, it + 3, acc1, NB)
      if not TWO_ACC:
        acc2 = _pv(p_smem, y_smem, pb, 3, it + 6, acc2, NB)
        acc3 = _pv(p_smem, y_smem, pb, 3, it + 7, acc3, NB)
    if TWO_ACC:
      acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
    else:
      acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0,
                                                  deps=(acc0, acc1, acc2, acc3))
    if CID == 0:
      mbarrier.arrive(empty.index(it % NB))
      mbarrier.arrive(empty.index((it + 2) % NB))
      mbarrier.arrive(empty.index((it + 4) % NB))
      mbarrier.arrive(empty.index((it + 5) % NB))
    else:
      mbarrier.arrive(empty.index((it + 1) % NB))
      mbarrier.arrive(empty.index((it + 3) % NB))
      mbarrier.arrive(empty.index((it + 6) % NB))
      mbarrier.arrive(empty.index((it + 7) % NB))
    mbarrier.arrive(p_free.index(pb))
    it += 8
    t += 1
  out_mult = gl.load(scal_ptr + 1)
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, O_LAYOUT))
  feats = gl.arange(0, BK, layout=gl.SliceLayout(0, O_LAYOUT))
  split = gl.program_id(1).to(gl.int64)
  at = dx_ptr + (split * n + gl.expand_dims(orows, 1)) * D + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < BK, 0)
  ty = dx_ptr.dtype.element_ty
  if CID == 0:
    gl.store(at, (acc0 * out_mult).to(ty), mask=keep)
    gl.store(at + 2 * BK, (acc1 * out_mult).to(ty), mask=keep)
    if not TWO_ACC:
      gl.store(at + 4 * BK, (acc2 * out_mult).to(ty), mask=keep)
      gl.store(at + 5 * BK, (acc3 * out_mult).to(ty), mask=keep)
  else:
    gl.store(at + BK, (acc0 * out_mult).to(ty), mask=keep)
    gl.store(at + 3 * BK, (acc1 * out_mult).to(ty), mask=keep)
    if not TWO_ACC:
      gl.store(at + 6 * BK, (acc2 * out_mult).to(ty), mask=keep)
      gl.store(at + 7 * BK, (acc3 * out_mult).to(ty), mask=keep)
  _store_cs(cs_ptr, scal_ptr, (cs0, cs1, cs2, cs3), rows, in_rows, n, CID)


@gluon.jit
def _store_cs(cs_ptr, scal_ptr, cs, rows, in_rows, n, CID: gl.constexpr):
  """A group's four dims' sums of c s (times g_max) into cs [K, 2, splits, n]."""
  cs_mult = gl.load(scal_ptr + 2)
  per_dim = 2 * gl.num_programs(1) * n
  at = cs_ptr + (CID * gl.num_programs(1) + gl.program_id(1).to(gl.int64)) * n + rows
  for k in gl.static_range(4):
    gl.store(at + k * per_dim, cs[k] * cs_mult, mask=in_rows)


@gluon.jit
def _pv(p_smem, y_smem, pb, k: gl.constexpr, pos, acc, NB: gl.constexpr):
  """acc += P^k @ y's chunk at ring position pos."""
  return warpgroup_mma(p_smem.index(pb * 4 + k), y_smem.index(pos % NB), acc, is_async=True)


@gluon.jit
def _mrl_bwd_gluon_kernel(
    x_desc, y_desc,            # TMA descriptors: x [n, D], y [m, D] in [64, 64] blocks
    scal_ptr,                  # [4] fp32: scale * log2(e), scale * g_max, g_max, (unused)
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    lse_r_ptr, g_r_ptr, thr_r_ptr,   # [K, n] row statistics (SHARED: the shift t, g 2^(t - lse))
    lse_c_ptr, g_c_ptr, thr_c_ptr,   # [K, m] column statistics (lse_c unused)
    xt_ptr, yt_ptr,            # [K, n], [K, m] fp32 prefix inverse norms
    xb_ptr, yb_ptr,            # fp32 where biases, if HAS_MASK
    n, m, cols_per_split,
    dx_ptr,                    # [splits, n, D]
    cs_ptr,                    # [K, 2, splits, n] fp32, per consumer group
    D: gl.constexpr, ROW_THR: gl.constexpr, COL_THR: gl.constexpr,
    EXCLUDE_SELF: gl.constexpr, HAS_MASK: gl.constexpr, DIRECT: gl.constexpr = False,
    TWO_ACC: gl.constexpr = False, PREFETCH: gl.constexpr = False,
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  gl.static_assert(KCH == 8 and BK == 64 and BN == 64)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [NUM_P * 4, BM, BN], p_layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  empty = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  p_full = mbarrier.allocate_mbarrier(batch=NUM_P)
  p_free = mbarrier.allocate_mbarrier(batch=NUM_P)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=3)   # both groups' S, the owner's P @ y
  for i in gl.static_range(NUM_P):
    mbarrier.init(p_full.index(i), count=2)
    mbarrier.init(p_free.index(i), count=2)
  stats = (xt_ptr, yt_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr,
           yb_ptr)
  if DIRECT:
    gl.warp_specialize([
        (_mrl_consumer_direct, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                                scal_ptr, off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr,
                                0, BM, BN, BK, D, NUM_BUF, NUM_P, ROW_THR, COL_THR,
                                EXCLUDE_SELF, HAS_MASK, PREFETCH, TWO_ACC)),
        (_mrl_consumer_direct, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                                scal_ptr, off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr,
                                1, BM, BN, BK, D, NUM_BUF, NUM_P, ROW_THR, COL_THR,
                                EXCLUDE_SELF, HAS_MASK, PREFETCH, TWO_ACC)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                    BK, KCH, NUM_BUF)),
    ], [4, 1], [248, 24])
  else:
    gl.warp_specialize([
        (_mrl_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                         off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr, 0, BM, BN, BK,
                         D, NUM_BUF, NUM_P, ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK,
                         PREFETCH)),
        (_mrl_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                         off_ptr, stats, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr, 1, BM, BN, BK,
                         D, NUM_BUF, NUM_P, ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK,
                         PREFETCH)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                    BK, KCH, NUM_BUF)),
    ], [4, 1], [248, 24])


FLAGS = dict(ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True, HAS_MASK=False)


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def operands(x, y, scale2):
  """The pass's statistics: prefix inverse norms, the shared shift t_k = scale2 (the
  bound of a cosine's logit), and rebased cotangents in [0.5, 1.5] / B."""
  n = x.shape[0]
  f32 = jnp.float32
  inv = lambda v: jnp.stack([jax.lax.rsqrt(jnp.sum(jnp.square(v[:, :d].astype(f32)), 1))
                             for d in DIMS])
  xt, yt = inv(x), inv(y)
  k = jax.random.split(jax.random.key(1), 2)
  g_r = (0.5 + jax.random.uniform(k[0], (4, n), f32)) / n
  g_c = (0.5 + jax.random.uniform(k[1], (4, n), f32)) / n
  t = jnp.full((4, n), scale2, f32)
  return xt, yt, t, g_r, g_c


def reference(x, y, scale2, xt, yt, t, g_r, g_c, rows):
  """dx and cs of the first ``rows`` rows in float32 jnp (self pairs dropped)."""
  x = x[:rows].astype(jnp.float32)
  y = y.astype(jnp.float32)
  dx = jnp.zeros(x.shape, jnp.float32)
  suffix = jnp.zeros((rows, y.shape[0]), jnp.float32)
  cs = []
  off = jnp.arange(rows)[:, None] == jnp.arange(y.shape[0])[None, :]
  for k in range(3, -1, -1):
    d = DIMS[k]
    ab = xt[k, :rows, None] * yt[k, None, :]
    s = (x[:, :d] @ y[:, :d].T) * ab
    c = jnp.exp2(jnp.minimum(s * scale2 - t[k, :rows, None], 8.0)) * (
        g_r[k, :rows, None] + g_c[k, None, :])
    c = jnp.where(off, 0.0, c)
    cs.append(jnp.sum(c * s, axis=1))
    suffix = suffix + c * ab
    lo = 0 if k == 0 else DIMS[k - 1]
    dx = dx.at[:, lo:d].set(suffix @ y[:, lo:d])
  return dx, jnp.stack(cs[::-1])


def launch(x, y, scale2, xt, yt, t, g_r, g_c, variant):
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, d = x.shape
  f32 = jnp.float32
  dummy = jnp.zeros((1,), f32)
  scal = jnp.stack([scale2, jnp.ones((), f32), jnp.ones((), f32), jnp.zeros((), f32)])
  off = jnp.zeros((2,), jnp.int32)
  if variant == "plain":   # dim 512 alone, the library's kernel
    dx, cs = _compat.triton_call(
        _compat.Tiles(x, (grad_gluon.BLOCK_M, grad_gluon.BLOCK_K), gluon=True),
        _compat.Tiles(y, (grad_gluon.BLOCK_N, grad_gluon.BLOCK_K), gluon=True), scal, off,
        t[3], g_r[3], dummy, dummy, g_c[3], dummy, dummy, dummy, n, n, n,
        kernel=grad_gluon._lse_bwd_gluon_kernel,
        out_shapes=library_gradient_outputs(n, d, x.dtype),
        grid=(n // grad_gluon.BLOCK_M, 1), name="gluon_mrl_plain", num_warps=4, num_stages=1,
        D=512, HAS_ROW=True, HAS_COL=True, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True,
        WANT_CS=True, HAS_MASK=False, SHARED=True)[:2]
    return dx[0], jnp.sum(cs, axis=(0, 1))[None]
  xd = jt.TensorDescriptor.from_array(x, (BM, BK), layout=layout((BM, BK)))
  yd = jt.TensorDescriptor.from_array(y, (BN, BK), layout=layout((BN, BK)))
  dx, cs = _compat.triton_call(
      xd, yd, scal, off, t.reshape(-1), g_r.reshape(-1), dummy, dummy, g_c.reshape(-1), dummy,
      xt.reshape(-1), yt.reshape(-1), dummy, dummy, n, n, n, kernel=_mrl_bwd_gluon_kernel,
      out_shapes=[jax.ShapeDtypeStruct((1, n, d), x.dtype),
                  jax.ShapeDtypeStruct((4, 2, 1, n), f32)],
      grid=(n // BM, 1), name=f"gluon_{variant}", num_warps=4, num_stages=1, D=d,
      **KERNEL_FLAGS[variant], **FLAGS)
  return dx[0], jnp.sum(cs, axis=(1, 2))


def run(a):
  n = a.batch
  assert n % 128 == 0, "whole tiles only"
  path = compiled_via()
  x, y = clip_pairs(jax.random.key(0), n, D)
  for variant in a.variants.split(","):
    def body(row, variant=variant):
      fn = jax.jit(lambda *v: launch(*v, variant))
      for scale2, timed in ((LOG2E / 0.5, False), (LOG2E / 0.07, True)):
        s2 = jnp.asarray(scale2, jnp.float32)
        ops = operands(x, y, s2)
        if not timed:
          dx, cs = fn(x, y, s2, *ops)
          want_dx, want_cs = reference(x, y, s2, *ops, CHECK_ROWS)
          if variant == "plain":   # dim 512 alone: dx over every feature, cs of that dim
            one = tuple(v[3:] for v in ops)
            want_dx, want_cs = reference_one(x, y, s2, *one, CHECK_ROWS)
          err = lambda got, want: float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
          err_dx = err(dx[:CHECK_ROWS].astype(jnp.float32), want_dx)
          err_cs = err(cs[:, :CHECK_ROWS], want_cs)
          bad = not (np.isfinite(err_dx) and np.isfinite(err_cs)) or max(err_dx, err_cs) > 2e-2
          row.update(err_dx=err_dx, err_cs=err_cs, wrong=bool(bad))
        else:
          ms = statistics.median(time_jax(fn, x, y, s2, *ops, reps=a.reps))
          row.update(ms=round(ms, 4), tflops=round(4 * n * n * D / ms / 1e9, 1))

    guarded(dict(bench="gluon_mrl_grad", variant=variant, batch=n, dim=D, ms=None, tflops=None,
                 err_dx=None, err_cs=None, wrong=None, note=f"compiled via {path}"),
            a.variant_timeout, body)


def reference_one(x, y, scale2, xt, yt, t, g_r, g_c, rows):
  """The plain pass (dim 512 alone; the library kernel's inputs are unit vectors, so
  no tables): dx over every feature and cs, float32 jnp."""
  xf, yf = x[:rows].astype(jnp.float32), y.astype(jnp.float32)
  s = xf @ yf.T
  c = jnp.exp2(jnp.minimum(s * scale2 - t[0, :rows, None], 8.0)) * (
      g_r[0, :rows, None] + g_c[0, None, :])
  c = jnp.where(jnp.arange(rows)[:, None] == jnp.arange(y.shape[0])[None, :], 0.0, c)
  return c @ yf, jnp.sum(c * s, axis=1)[None]


# ---------------------------------------------------------------------------------------
# Without a GPU: compile for sm_90


KERNEL_FLAGS = {"mrl_direct": dict(DIRECT=True), "mrl_suffix": {},
                "mrl_direct_two_acc": dict(DIRECT=True, TWO_ACC=True),
                "mrl_direct_prefetch": dict(DIRECT=True, PREFETCH=True),
                "mrl_suffix_prefetch": dict(PREFETCH=True)}
VARIANTS = {v: (lambda d: d == 512,) for v in ("plain", *KERNEL_FLAGS)}


def compile_only(a):
  def build(variant, d):
    if variant == "plain":
      from benchmarks._gluon import compile_library_gradient  # pylint: disable=g-import-not-at-top
      return (compile_library_gradient("bfloat16", dict(
          D=512, HAS_ROW=True, HAS_COL=True, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True,
          WANT_CS=True, HAS_MASK=False, SHARED=True)), 4, {})
    desc = lambda r: f"tensordesc<bf16[{r},{BK}],{layout((r, BK))!r}>"
    sig = dict(x_desc=desc(BM), y_desc=desc(BN), off_ptr="*i32", n="i32", m="i32",
               cols_per_split="i32", dx_ptr="*bf16",
               **{p: "*fp32" for p in ("scal_ptr", "lse_r_ptr", "g_r_ptr", "thr_r_ptr",
                                       "lse_c_ptr", "g_c_ptr", "thr_c_ptr", "xt_ptr", "yt_ptr",
                                       "xb_ptr", "yb_ptr", "cs_ptr")})
    ptrs = [k for k, v in sig.items() if v.startswith(("*", "tensordesc"))]
    return (compile_sm90(_mrl_bwd_gluon_kernel, sig, ptrs,
                         dict(D=512, **KERNEL_FLAGS[variant], **FLAGS), 4, 1), 4, {})
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
