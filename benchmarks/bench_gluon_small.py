"""Whether Matryoshka's three small dims (64, 128, 256) cost less in one software-pipelined
Gluon gradient pass over the first 256 features than in their three per-dim passes
(Hopper sm_90; jax-triton >= 0.4, Triton >= 3.9; bf16).

Matryoshka's gradient is the sum of each dim's, and every dim's coefficients multiply only
the features of its prefix, so the rows' pass splits in two kernels whose outputs add up:
dim 512's plain pass over all the features (the library's Gluon pass) and, over the
first 256 features, the three small dims:

  dx_i[segment k] = sum_j C^k_ij y_j[segment k],  C^k = sum_{k <= k' < 3} c^k'_ij a_k',i b_k',j
  cs_k,i = sum_j c^k_ij s^k_ij

(segments [0, 64), [64, 128), [128, 256); ``grad_bwd.prefix_gradient``'s formulas, with
``coefficient``'s SHARED form: c^k = 2^(min(z^k - t_k, 8)) (g^k_r,i + g^k_c,j), z^k = s^k
scale2, s^k = a_k,i b_k,j <x_i, y_j>_{:m_k}). The small dims' GEMM work then is half a
plain pass (one walk over 256 features for every prefix dot, dx by suffix sums), where
their per-dim passes do 448/512 of one; their three epilogues stay. On an H200 at B =
65536 the per-dim passes take about 7.45 + 4.7 + 3.1 = 15.25 ms (half of CLIP's two at
D = 256, 128, 64 in h200_jt04_mrl_profile.txt); a pass here must take well under that
for Matryoshka's 1.6x bar (docs/notes/matryoshka.md).

The kernel (``_small_consumer``): 64 rows a program, x's first 256 features resident (four
[64, 64] chunks), y's in 64-column tiles through a ring of twelve [64, 64] chunks (three
tiles); two consumer groups, each taking half of a tile's columns for S, as three fp32
accumulators: chunk 0, chunk 1, chunks 2-3, so that the prefix dots are A, A + B and
A + B + C with no wait between chunks. Software-pipelined as ``bench_gluon_pair``'s
``_pipe_consumer``: the next tile's S wgmmas are issued before this tile's epilogue and
run under it. The epilogue stores, for its half of the columns, C^2, C^1 and C^0 into
three shared P tiles; group 0 owns dx's features [0, 128) (C^0 @ y[:, :64], C^1 @ y[:,
64:128]), group 1 [128, 256) (C^2 twice).

Variants: ``small3``, the epilogue of ``bench_gluon_pair``'s ``_coef`` (the library's
``coefficient``) for each dim; ``small3_lean`` (``_lean``), fewer instructions an entry;
``small3_lean_keep``, the same with the self pairs kept (checked against a reference
that keeps them): what the pass would cost were the self pairs' test, which the compiler
predicates into every tile, confined to the diagonal tiles. Dim 256 alone in the same
pipelined shape: ``bench_gluon_pair.py --dims 256 --variants one_n64_pipe``.

``small3_tight`` (``_tight_kernel``) takes out what the lean loop's SASS spends besides
the epilogue's arithmetic, the self pairs' test included:
- the split's one or two tiles holding self pairs are walked first, alone tested
  (``_tile_order``; the walk wraps around the split); the rest two tiles a loop
  iteration, so the next tile's S and the current one trade registers (the lean loop
  copied the three accumulators, 48 MOVs a tile);
- the columns' statistics come with the tile: per 64 columns an [8, 64] fp32 block (b_k
  and g_c,k b_k of the three dims, ``column_blocks``), TMA-loaded into shared memory on
  the tile's mbarrier and read with LDS.64, where the lean loop had 48 predicated global
  loads, their address arithmetic and the masked lanes' zeroing;
- one mbarrier pair a tile rather than a chunk (one wait and one arrival a tile where
  the chunk ring had four of each);
- the epilogue: c b_j = 2^(p b_j a_i scale2 - t_i) (g_r,i b_j + g_c,j b_j), the clamp of
  the exponent only in the tested tiles (kept entries have z <= t), and P without the
  rows' a: Q_2 = c^2 b, Q_1 = c^1 b + Q_2 a_2 / a_1, Q_0 = c^0 b + Q_1 a_1 / a_0 (one FMA
  each), dx's segment k scaled by a_k,i once, at the end.
``small3_tight`` still waits for a tile's P @ y at the tile's end (half the pass's GEMM
work, under no epilogue); ``small3_tight_defer`` waits for it a tile later, under the
next tile's epilogue (a fourth ring tile; the P sets and ring slots freed a tile late).
Two timing bounds of the tight pass, not checked: ``small3_bound_loads``, its loads alone
(consumers that wait for each tile and free it: the rate L2 feeds the 64-row programs),
and ``small3_bound_gemm``, its wgmmas and barriers with the S tiles stored as P and no
epilogue.

``small3_wide`` (``_wide_kernel``) tries the shape those bounds point to: 128-row
programs in which each consumer group owns 64 rows and all 256 of dx's features (four
[64, 64] fp32 accumulators, 128 registers a thread), so its S wgmmas are 64 columns wide
and the groups share no P (each its own three P tiles, 216.4 KiB in all). Each dim's c b
is formed as its prefix dot completes, dims 0 and 1 parked as bf16 in the group's P
tiles, then Q_2, Q_1, Q_0 as above; ``small3_wide_chain`` keeps the prefix dots in one
accumulator (each dim's epilogue waits for its chunks: 616 B of spills against 1704),
``small3_wide_early`` issues all the chunks at once (2356 B, not run). Measured
(2026-12-05, run 2 of h200_gluon_small.csv): ``small3_wide_chain`` 14.30 ms,
``small3_wide`` 18.87 (ptxas serializes its wgmmas for want of registers), against
``small3_tight``'s 15.13 in the same call; both within 2.9e-3 (dx) and 1.2e-6 (cs) of
float32. sm_90: 1213 instructions a 64 x 64 tile of a group (96 exponentials, 32
wgmmas) in the chain's untested loop, 12 of them spill loads and stores; at two
warps a scheduler about 4.9 ms of issue a pass against 5.6 of GEMM, so a pass of 14.3 ms
is mostly waiting, likely because each group waits on its own wgmmas four times a tile
and on three P barriers, with only the other group to fill the gaps.
``small3_wide_chain_rega`` takes Q_k into its wgmmas from registers (the A operand's
layout), with no P store, fence or barrier: 1166 instructions a tile, 46 of them spill
loads and stores (864 B). ``small3_wide_chain_pp`` orders the
groups as FlashAttention-3's ping-pong does: each group's four batches of wgmmas a tile
(chunk 0; chunk 1; chunks 2-3; the Q_k) wait for the other group's batch of the same
rank to be issued (two mbarriers, ``_my_turn`` / ``_pass_turn``), so the groups'
batches alternate on the tensor cores and one group's epilogue runs under the other's
wgmmas, if it is their falling into step that leaves the tensor cores idle: 1249
instructions a tile (396 B of spills). The chain's and rega's
builds are unchanged by it (the same instructions a tile and spills).
``small3_wide_chain_stag`` tests the same suspicion without a wait a batch: group 1's
first batch waits once for group 0's first to complete (``_lead``), so the groups start
a batch apart and then run free: 1210 instructions a tile, 616 B of spills (the chain and
``_pp`` unchanged by it). Measured on one H100 (2026-12-05, h100_gluon_small.csv, one
call): the chain 13.95 ms, ``_stag`` 13.77, ``_bar`` 14.01, ``_pp`` 15.77, ``_rega``
12.47; the hardware counters (h100_ncu_summary.csv) find each group's epilogue waiting
on its own results, not on the other group.
``small3_wide_chain_bar`` hands each P tile to the group's own wgmma with a barrier alone
(``gl.barrier()``, which inside a partition becomes that partition's named barrier,
``bar.sync id, 128``) instead of an mbarrier arrival and wait (a further ``bar.sync`` and
a try-wait loop), three times a tile: 1193-1201 instructions a tile, 608 B of spills;
timed with the others above.

The counters leave ``_rega`` one lever: within a group every wgmma is waited for before
the epilogue that reads it, and each epilogue before the next chunk's wgmma, so a group
alternates between the two. Three attempts to overlap them inside a group:
``small3_wide_chain_rega_rw`` frees Q_2's registers once its wgmmas are done (824 B of
spills against 864, 1162 instructions a tile); ``_rega_nx`` issues the next tile's chunk 0
ahead of this tile's Q_k wgmmas (1592 B, 1236; ``_rega_nxrw`` both, 1780 B, 1280);
``small3_wide_halves`` (``_halves_tile``) splits each tile's S into two [64, 32]
accumulators (the registers of one) and walks the two halves a dim apart, so one half's
epilogue runs under the other half's wgmmas, with Q_2 of the first half issued before the
second half's dim-2 epilogue and the Q_k wgmmas at K = 32 (1324 instructions a tile, 48
wgmmas of which 32 are 64 x 32, 1016 B; ``_halves_rw`` 956 B, 1321). Its 158 extra
instructions are mostly the wgmma descriptors, built in vector registers (60 R2UR).
Measured on one H100 (2026-12-05, run 2 of h100_gluon_small.csv, one call): ``_rega``
12.66 ms, ``_rega_rw`` 12.76, ``_rega_nx`` 15.47, ``_halves`` 15.19, ``_halves_rw`` 15.16,
the chain 14.14: none gains. Freeing Q_2 early changes nothing; the early chunk 0 (its
spills doubled) and the halves (16 more wgmmas and three more waits a tile) lose 20-22%,
likely more than the overlap they buy.

Checked against float32 jnp at n = m = batch - 37 (rows and columns past the ends: the
padded rows' t = +inf and the padded columns' b = 0 give them no weight) on the first 512
rows (dx's error over max |dx|, cs's likewise; wrong over 2e-2 or NaN) at a logit scale
of 1 / 0.5, timed at the batch and 1 / 0.07:

  python benchmarks/bench_gluon_small.py --batch 65536 --reps 10
  python benchmarks/bench_gluon_small.py --compile-only

Measured (one H200, B = 65536, jax-triton 0.4.1 + Triton 3.9.0; h200_gluon_small.csv,
2026-12-05, every variant within 3.5e-3 (dx) and 1e-6 (cs) of float32 at 65499 rows):
``small3`` 33.34 ms, ``small3_lean_keep`` 30.23, ``small3_tight`` 15.37,
``small3_tight_defer`` 16.09, against the per-dim passes' 15.25: the tight pass only
ties them. Its bounds say why: its loads alone take 2.58 ms (L2 keeps up), its wgmmas
and barriers with no epilogue 9.54 (464 TFLOP/s: a consumer's S wgmmas are 32 columns
wide), and the epilogue adds 5.8 ms more; with the forward's 7.47 (``bench_gluon_small_fwd``)
the three dims would cost 7.47 + 2 x 15.37 = 38.2 ms against 24.7 for the bar, and even
with free epilogues 7.47 + 2 x 9.54 = 26.6.

sm_90 builds (``--compile-only``, Triton 3.9.0), 176.5 KiB of
shared memory each, spills and instructions in a consumer's tile loop: ``small3`` 452 B,
1415-1436; ``small3_lean`` 516 B, 1228-1286; ``small3_lean_keep`` 244 B, 979-1041;
``small3_tight`` (184.4 KiB) 168 B, 1320 in the two-tile loop (660 a tile; 48
exponentials, 24 wgmmas; 704-707 with the clamp in every tile) and 886-920 in the tested
one (its fifth ``tile_loops`` span, about 520 instructions, is the out-of-line mbarrier
retry code). At 1000 a tile the consumers' issue is about 8.0 ms a pass (two warps a scheduler,
1.98 GHz), so about 5.3 at 660; the GEMM is 5.6 at 790 TFLOP/s, half of it P @ y.
``small3_tight_defer`` (216.4 KiB) 440 B, 1412-1413 a two-tile iteration (706 a tile;
30 spill stores and reloads an iteration) and 905-914 tested. The tight kernel's walk
order and algebra were checked on the CPU by a float64 NumPy model of it (not kept):
against ``reference`` within 5.6e-7 (n = 320), and with row / column offsets and two or
three splits against a float64 reference dropping the offset self pairs within 1.4e-15.
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
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks._gluon import compile_rows, compile_sm90, compiled_via, guarded, layout, main
from benchmarks._harness import clip_pairs, time_jax
from benchmarks.bench_gluon_mrl import CHECK_ROWS, LOG2E
from benchmarks.bench_gluon_pair import _chunk, _coef, _free_others, _ring_barriers
from memeff_jax.backends.triton._common import off_diagonal, on_diagonal, row_stats
from memeff_jax.backends.triton.stats_gluon import producer

BM, BN, BK = 64, 64, 64
DIMS = (64, 128, 256)
NB = 12      # ring chunks: three tiles of four
NP = 2       # P sets (three tiles each)
RAGGED = 37  # the checks drop the last 37 rows and columns: the ends' masks are checked


@gluon.jit
def _walk3(x_smem, y_smem, ready, it, zs, CID: gl.constexpr, HALF: gl.constexpr,
           NB: gl.constexpr):
  """Issue the S wgmmas of the tile at ring position ``it`` (this group's half of its
  columns), none waited for: chunk 0 into A, chunk 1 into B, chunks 2-3 into C."""
  sa = warpgroup_mma(x_smem.index(0), _chunk(y_smem, ready, it, CID, HALF, NB), zs,
                     use_acc=False, is_async=True)
  sb = warpgroup_mma(x_smem.index(1), _chunk(y_smem, ready, it + 1, CID, HALF, NB), zs,
                     use_acc=False, is_async=True)
  sc = warpgroup_mma(x_smem.index(2), _chunk(y_smem, ready, it + 2, CID, HALF, NB), zs,
                     use_acc=False, is_async=True)
  sc = warpgroup_mma(x_smem.index(3), _chunk(y_smem, ready, it + 3, CID, HALF, NB), sc,
                     is_async=True)
  return sa, sb, sc


@gluon.jit
def _rows(k: gl.constexpr, n, rows, in_rows, xt_ptr, t_ptr, g_r_ptr, BM: gl.constexpr):
  """Dim k's row statistics: a, t, g_r."""
  t, g_r, _ = row_stats(t_ptr + k * n, g_r_ptr + k * n, t_ptr, rows, in_rows, BM, True, False)
  return gl.load(xt_ptr + k * n + rows, mask=in_rows, other=0.0), t, g_r


@gluon.jit
def _dim(p, k: gl.constexpr, st, scale2, row0, col0, rows, cols, row_off, col_off, n, m,
         yt_ptr, g_c_ptr, in_cols, scal_ptr, BM: gl.constexpr, HALF: gl.constexpr):
  """Dim k's coefficients on the prefix dot p [BM, HALF] (its row statistics st = a, t,
  g_r; its columns' loaded here): (c a b, the rows' sums of c s)."""
  a, t, g_r = st
  b = gl.load(yt_ptr + k * m + cols, mask=in_cols, other=0.0)
  g_c = gl.load(g_c_ptr + k * m + cols, mask=in_cols, other=0.0)
  ab = gl.expand_dims(a, 1) * gl.expand_dims(b, 0)
  c, add = _coef(p * ab, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t, g_r, g_c,
                 scal_ptr, BM, HALF)
  return c * ab, add


@gluon.jit
def _lean(p, k: gl.constexpr, st, scale2, row0, col0, rows, cols, row_off, col_off, m, yt_ptr,
          g_c_ptr, in_cols, BM: gl.constexpr, HALF: gl.constexpr, EXCL: gl.constexpr):
  """``_dim`` with fewer instructions an entry: the exponent as one multiply and one FMA
  (p b_j, then times a_i scale2, minus t_i), no s tile (c s = (c b_j) p a_i: the rows'
  sums come without their a_i, multiplied in at the end), c a b as (c b_j) a_i. Columns
  past m need no mask (b_j = 0 zeroes c b_j). EXCL drops the self pairs as ``drop_pairs``
  does (the compiler predicates the test into every tile); else they are kept."""
  a, t, g_r = st
  b = gl.load(yt_ptr + k * m + cols, mask=in_cols, other=0.0)
  g_c = gl.load(g_c_ptr + k * m + cols, mask=in_cols, other=0.0)
  pb = p * gl.expand_dims(b, 0)
  arg = pb * gl.expand_dims(a * scale2, 1) - gl.expand_dims(t, 1)
  c = gl.exp2(gl.minimum(arg, 8.0)) * (gl.expand_dims(g_r, 1) + gl.expand_dims(g_c, 0))
  if EXCL:
    if on_diagonal(row0, col0, row_off, col_off, BM, HALF):
      c = gl.where(off_diagonal(rows, cols, row_off, col_off), c, 0.0)
  cb = c * gl.expand_dims(b, 0)
  return cb * gl.expand_dims(a, 1), gl.sum(cb * p, axis=1)


@gluon.jit
def _lean_tile(sa, sb, sc, st0, st1, st2, p_smem, pb, scale2, row0, col0, rows, cols, row_off,
               col_off, m, yt_ptr, g_c_ptr, in_cols, CID: gl.constexpr, BM: gl.constexpr,
               HALF: gl.constexpr, EXCL: gl.constexpr):
  """The LEAN epilogue of a tile, from the largest dim down: C^2, C^1, C^0 stored (this
  group's half of the columns of P set pb) as the suffix sums form; the three dims'
  rows' sums of (c b) p."""
  p = sa + sb
  suffix, add2 = _lean(p + sc, 2, st2, scale2, row0, col0, rows, cols, row_off, col_off, m,
                       yt_ptr, g_c_ptr, in_cols, BM, HALF, EXCL)
  _put(p_smem, 3 * pb + 2, suffix, CID, HALF)
  w, add1 = _lean(p, 1, st1, scale2, row0, col0, rows, cols, row_off, col_off, m, yt_ptr,
                  g_c_ptr, in_cols, BM, HALF, EXCL)
  suffix = suffix + w
  _put(p_smem, 3 * pb + 1, suffix, CID, HALF)
  w, add0 = _lean(sa, 0, st0, scale2, row0, col0, rows, cols, row_off, col_off, m, yt_ptr,
                  g_c_ptr, in_cols, BM, HALF, EXCL)
  _put(p_smem, 3 * pb, suffix + w, CID, HALF)
  return add0, add1, add2


@gluon.jit
def _put(p_smem, i, v, CID: gl.constexpr, HALF: gl.constexpr):
  """This group's half of the columns of P tile i."""
  p_smem.index(i).slice(CID * HALF, HALF, dim=1).store(v.to(p_smem.dtype))


@gluon.jit
def _small_consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                    off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo, j_hi,
                    dx_ptr, cs_ptr, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    BK: gl.constexpr, NB: gl.constexpr, NP: gl.constexpr,
                    LEAN: gl.constexpr, KEEP: gl.constexpr):
  """Consumer group CID (see the module docstring); LEAN: ``_lean``'s epilogue, from the
  largest dim down, KEEP: with the self pairs kept."""
  HALF: gl.constexpr = BN // 2
  s_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
  o_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
  in_rows = rows < n
  st0 = _rows(0, n, rows, in_rows, xt_ptr, t_ptr, g_r_ptr, BM)
  st1 = _rows(1, n, rows, in_rows, xt_ptr, t_ptr, g_r_ptr, BM)
  st2 = _rows(2, n, rows, in_rows, xt_ptr, t_ptr, g_r_ptr, BM)
  zs = gl.zeros([BM, HALF], gl.float32, layout=s_layout)
  cs0 = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
  cs1, cs2 = cs0, cs0
  acc0 = gl.zeros([BM, BK], gl.float32, layout=o_layout)
  acc1 = acc0
  mbarrier.wait(x_bar, 0)
  sa, sb, sc = _walk3(x_smem, y_smem, ready, 0, zs, CID, HALF, NB)
  sa, sb, sc = warpgroup_mma_wait(num_outstanding=0, deps=(sa, sb, sc))
  _free_others(empty, 0, CID, 4, NB)
  it = 0   # ring position of the tile's first chunk
  t = 0    # tile count (P set t % NP)
  for j in range(j_lo, j_hi, BN):
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, s_layout))
    in_cols = cols < m
    # the next tile's S (past the split's end: the producer's extra tile, discarded)
    na, nb, nc = _walk3(x_smem, y_smem, ready, it + 4, zs, CID, HALF, NB)
    pb = t % NP
    mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
    if LEAN:
      add0, add1, add2 = _lean_tile(sa, sb, sc, st0, st1, st2, p_smem, pb, scale2, row0, col0,
                                    rows, cols, row_off, col_off, m, yt_ptr, g_c_ptr, in_cols,
                                    CID, BM, HALF, not KEEP)
      cs0 += add0
      cs1 += add1
      cs2 += add2
    else:
      p = sa
      w0, add = _dim(p, 0, st0, scale2, row0, col0, rows, cols, row_off, col_off, n, m,
                     yt_ptr, g_c_ptr, in_cols, scal_ptr, BM, HALF)
      cs0 += add
      w0 = w0.to(p_smem.dtype)   # (a per-dim pass rounds each dim's too)
      p = p + sb
      w1, add = _dim(p, 1, st1, scale2, row0, col0, rows, cols, row_off, col_off, n, m,
                     yt_ptr, g_c_ptr, in_cols, scal_ptr, BM, HALF)
      cs1 += add
      w1 = w1.to(p_smem.dtype)
      p = p + sc
      suffix, add = _dim(p, 2, st2, scale2, row0, col0, rows, cols, row_off, col_off, n, m,
                         yt_ptr, g_c_ptr, in_cols, scal_ptr, BM, HALF)
      cs2 += add
      _put(p_smem, 3 * pb + 2, suffix, CID, HALF)
      suffix = suffix + w1.to(gl.float32)
      _put(p_smem, 3 * pb + 1, suffix, CID, HALF)
      _put(p_smem, 3 * pb, suffix + w0.to(gl.float32), CID, HALF)
    fence_async_shared()
    mbarrier.arrive(p_full.index(pb))
    mbarrier.wait(p_full.index(pb), (t // NP) & 1)        # both halves of the three written
    if CID == 0:
      acc0 = warpgroup_mma(p_smem.index(3 * pb), y_smem.index(it % NB), acc0, is_async=True)
      acc1 = warpgroup_mma(p_smem.index(3 * pb + 1), y_smem.index((it + 1) % NB), acc1,
                           is_async=True)
    else:
      acc0 = warpgroup_mma(p_smem.index(3 * pb + 2), y_smem.index((it + 2) % NB), acc0,
                           is_async=True)
      acc1 = warpgroup_mma(p_smem.index(3 * pb + 2), y_smem.index((it + 3) % NB), acc1,
                           is_async=True)
    sa, sb, sc, acc0, acc1 = warpgroup_mma_wait(num_outstanding=0,
                                                deps=(na, nb, nc, acc0, acc1))
    for i in gl.static_range(2):
      mbarrier.arrive(empty.index((it + 2 * CID + i) % NB))
    mbarrier.arrive(p_free.index(pb))
    _free_others(empty, it + 4, CID, 4, NB)
    it += 4
    t += 1
  out_mult = gl.load(scal_ptr + 1)
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
  feats = 2 * CID * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, o_layout))
  at = dx_ptr + gl.expand_dims(orows, 1).to(gl.int64) * (4 * BK) + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < 4 * BK, 0)
  ty = dx_ptr.dtype.element_ty
  gl.store(at, (acc0 * out_mult).to(ty), mask=keep)
  gl.store(at + BK, (acc1 * out_mult).to(ty), mask=keep)
  cs_mult = gl.load(scal_ptr + 2)
  if LEAN:   # (the rows' a_k, left out of the sums)
    cs0 = cs0 * st0[0]
    cs1 = cs1 * st1[0]
    cs2 = cs2 * st2[0]
  gl.store(cs_ptr + CID * n + rows, cs0 * cs_mult, mask=in_rows)          # [3 dims, 2, n]
  gl.store(cs_ptr + (2 + CID) * n + rows, cs1 * cs_mult, mask=in_rows)
  gl.store(cs_ptr + (4 + CID) * n + rows, cs2 * cs_mult, mask=in_rows)


@gluon.jit
def _small_bwd_kernel(
    x_desc, y_desc,            # TMA descriptors: x, y [n, >= 256] in [64, 64] blocks
    scal_ptr,                  # [3] fp32: scale * log2(e), scale * g_max, g_max
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    xt_ptr, yt_ptr,            # [3, n], [3, m] fp32: each dim's prefix inverse norms
    t_ptr, g_r_ptr,            # [3, n] fp32: each dim's shift t and g_r 2^(t - lse_r)
    g_c_ptr,                   # [3, m] fp32: each dim's g_c 2^(t - lse_c)
    n, m, cols_per_split,
    dx_ptr,                    # [n, 256]
    cs_ptr,                    # [3 dims, 2 groups, n] fp32
    NB: gl.constexpr, NP: gl.constexpr, LEAN: gl.constexpr = False,
    KEEP: gl.constexpr = False,   # (LEAN) self pairs kept: the reference's keep_self
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  gl.static_assert(BK == 64 and NB % 4 == 0)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [4, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NB, BN, BK], y_desc.layout)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [3 * NP, BM, BN], p_layout)
  x_bar, ready, empty, p_full, p_free = _ring_barriers(NB, NP)
  gl.warp_specialize([
      (_small_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                         scal_ptr, off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m,
                         row0, j_lo, j_hi, dx_ptr, cs_ptr, 0, BM, BN, BK, NB, NP, LEAN,
                         KEEP)),
      (_small_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                         scal_ptr, off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m,
                         row0, j_lo, j_hi, dx_ptr, cs_ptr, 1, BM, BN, BK, NB, NP, LEAN,
                         KEEP)),
      (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi + BN,
                  BN, BK, 4, NB)),
  ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------
# ``small3_tight``: the same pass with fewer instructions a tile


NT = 3       # tight ring: three tiles of four chunks, one mbarrier pair a tile
STATS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


@gluon.jit
def _tile_order(row0, row_off, col_off, j_lo, j_hi, BM: gl.constexpr, BN: gl.constexpr):
  """The split's column tiles in walk order, the ones holding self pairs first: how many
  tiles, the first holding self pairs (k0; the walk is k0, k0 + 1, ... mod the count)
  and how many hold them (0-2)."""
  ntiles = (j_hi - j_lo + BN - 1) // BN
  diag = row0 + row_off - col_off - j_lo   # the split's column of row0's self pair
  u = diag - BN
  k0 = gl.minimum(gl.where(u < 0, 0, u // BN + 1), ntiles)
  u = diag + BM
  k1 = gl.maximum(k0, gl.minimum(gl.where(u <= 0, 0, (u + BN - 1) // BN), ntiles))
  return ntiles, k0, k1 - k0


@gluon.jit
def _tight_start(x_desc, y_desc, s_desc, off_ptr, m, cols_per_split, NT: gl.constexpr):
  """A tight kernel's program: its first row, split, walk (``_tile_order``) and shared
  memory: x's four chunks, the ring's NT tiles of four chunks, and four statistics
  blocks (tile i's in block i % 4: the producer writes tile i + 4's once the ring slot of
  tile i + 4 - NT is freed, NT >= 3, so after tile i's reads) with their view a
  statistic a row."""
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  gl.static_assert(BK == 64 and BN == 64)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  ntiles, k0, ndiag = _tile_order(row0, gl.load(off_ptr), gl.load(off_ptr + 1), j_lo, j_hi,
                                  BM, BN)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [4, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [4 * NT, BN, BK], y_desc.layout)
  st_smem = gl.allocate_shared_memory(s_desc.dtype, [4, 8, BN], s_desc.layout)
  # TMA stores an unswizzled block row by row: read it so (a view takes a power-of-two
  # shape, hence four blocks)
  st_rows = st_smem.reinterpret(s_desc.dtype, [4 * 8, BN],
                                gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
  return row0, j_lo, ntiles, k0, ndiag, x_smem, y_smem, st_smem, st_rows


@gluon.jit
def _tight_barriers(NT: gl.constexpr):
  """The tight ring's mbarriers, initialized: x loaded; each of its NT tiles ready (the
  producer's one arrival with the bytes) and empty (both consumer groups read every
  tile)."""
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NT)
  empty = mbarrier.allocate_mbarrier(batch=NT)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NT):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=2)
  return x_bar, ready, empty


@gluon.jit
def _tight_producer(x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready, empty,
                    row0, j_lo, ntiles, k0, BN: gl.constexpr, BK: gl.constexpr,
                    NT: gl.constexpr):
  """One warp: x's first 256 features once, then each tile in walk order, one past the
  end (the consumers' discarded next S): its four chunks and its columns' statistics
  block, one mbarrier a tile."""
  mbarrier.expect(x_bar, 4 * x_desc.block_type.nbytes)
  for k in gl.static_range(4):
    tma.async_load(x_desc, [row0, k * BK], x_bar, x_smem.index(k))
  for i in range(0, ntiles + 1):
    slot = i % NT
    mbarrier.wait(empty.index(slot), ((i // NT) & 1) ^ 1)   # fresh: passes
    mbarrier.expect(ready.index(slot),
                    4 * y_desc.block_type.nbytes + s_desc.block_type.nbytes)
    j = j_lo + ((k0 + i) % ntiles) * BN
    for k in gl.static_range(4):
      tma.async_load(y_desc, [j, k * BK], ready.index(slot), y_smem.index(4 * slot + k))
    tma.async_load(s_desc, [(j // BN) * 8, 0], ready.index(slot), st_smem.index(i % 4))


@gluon.jit
def _xrows(x_smem, k: gl.constexpr, CID: gl.constexpr, HR: gl.constexpr):
  """Consumer group CID's rows of x's chunk k, when a program's x chunks hold the rows of
  both groups (a wgmma's A; transposed, its B)."""
  return x_smem.index(k).slice(CID * HR, HR, dim=0)


@gluon.jit
def _ychunk(y_smem, slot, k: gl.constexpr, CID: gl.constexpr, HALF: gl.constexpr):
  """This group's half of chunk k of the tile in ring slot ``slot`` (a wgmma's B)."""
  return y_smem.index(4 * slot + k).slice(CID * HALF, HALF, dim=0).permute((1, 0))


@gluon.jit
def _walk_tile(x_smem, y_smem, ready, i, zs, CID: gl.constexpr, HALF: gl.constexpr,
               NT: gl.constexpr):
  """``_walk3`` on the tight ring: tile i's S wgmmas (A, B, C), none waited for."""
  slot = i % NT
  mbarrier.wait(ready.index(slot), (i // NT) & 1)
  sa = warpgroup_mma(x_smem.index(0), _ychunk(y_smem, slot, 0, CID, HALF), zs, use_acc=False,
                     is_async=True)
  sb = warpgroup_mma(x_smem.index(1), _ychunk(y_smem, slot, 1, CID, HALF), zs, use_acc=False,
                     is_async=True)
  sc = warpgroup_mma(x_smem.index(2), _ychunk(y_smem, slot, 2, CID, HALF), zs, use_acc=False,
                     is_async=True)
  sc = warpgroup_mma(x_smem.index(3), _ychunk(y_smem, slot, 3, CID, HALF), sc, is_async=True)
  return sa, sb, sc


@gluon.jit
def _tight_dim(p, st_rows, r, a_s, t, g_r, keep, CID: gl.constexpr, HALF: gl.constexpr,
               EXCL: gl.constexpr):
  """A dim on its prefix dot p: c b_j = 2^(p b_j a_i scale2 - t_i) (g_r,i b_j + g_c,j b_j)
  (the columns' b and g_c b: rows r and r + 3 of the statistics blocks); where EXCL, the
  exponent clamped to 8 and the self pairs zeroed (kept entries have z <= t, so only a
  dropped one needs the clamp: ``coefficient``'s SHARED form); and the rows' sums of
  (c b) p (a_i left out)."""
  layout: gl.constexpr = gl.SliceLayout(0, p.type.layout)
  b = gl.expand_dims(st_rows.index(r).slice(CID * HALF, HALF).load(layout), 0)
  gb = gl.expand_dims(st_rows.index(r + 3).slice(CID * HALF, HALF).load(layout), 0)
  arg = (p * b) * gl.expand_dims(a_s, 1) - gl.expand_dims(t, 1)
  if EXCL:
    arg = gl.minimum(arg, 8.0)
  cb = gl.exp2(arg) * (gl.expand_dims(g_r, 1) * b + gb)
  if EXCL:
    cb = gl.where(keep, cb, 0.0)
  return cb, gl.sum(cb * p, axis=1)


@gluon.jit
def _tight_tile(i, sa, sb, sc, acc0, acc1, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
                ready, empty, p_full, p_free, zs, rs, rows, row_off, col_off, j_lo, ntiles,
                k0, CID: gl.constexpr, BN: gl.constexpr, NT: gl.constexpr, NP: gl.constexpr,
                EXCL: gl.constexpr, DEFER: gl.constexpr, BOUND: gl.constexpr = 0):
  """Walk position i: the next tile's S issued, this tile's epilogue under it (from the
  largest dim down, P as Q_2 = c^2 b, Q_1 = c^1 b + Q_2 a_2 / a_1, Q_0 = c^0 b + Q_1 a_1 /
  a_0; dx's segment k is a_k,i (Q_k @ y)), P @ y, then everything waited for and the
  tile's ring slot and P set freed; DEFER: this tile's P @ y left running (under the next
  tile's epilogue), the previous tile's waited for and its slot and P set freed. BOUND 2:
  no epilogue (the S tiles stored as P: the pass's GEMM and barriers alone)."""
  HALF: gl.constexpr = BN // 2
  a0s, a1s, a2s, t0, t1, t2, g0, g1, g2, r21, r10 = rs
  na, nb, nc = _walk_tile(x_smem, y_smem, ready, i + 1, zs, CID, HALF, NT)
  slot = i % NT
  keep = 0
  if EXCL:
    cols = j_lo + ((k0 + i) % ntiles) * BN + CID * HALF + gl.arange(
        0, HALF, layout=gl.SliceLayout(0, zs.type.layout))
    keep = off_diagonal(rows, cols, row_off, col_off)
  pb = i % NP
  mbarrier.wait(p_free.index(pb), ((i // NP) & 1) ^ 1)   # tile i - NP's P @ y done
  if BOUND == 2:
    add0 = gl.sum(sa, axis=1)
    add1, add2 = add0, add0
    _put(p_smem, 3 * pb + 2, sc, CID, HALF)
    _put(p_smem, 3 * pb + 1, sb, CID, HALF)
    _put(p_smem, 3 * pb, sa, CID, HALF)
  else:
    p = sa + sb
    q, add2 = _tight_dim(p + sc, st_rows, 8 * (i % 4) + 2, a2s, t2, g2, keep, CID, HALF, EXCL)
    _put(p_smem, 3 * pb + 2, q, CID, HALF)
    cb, add1 = _tight_dim(p, st_rows, 8 * (i % 4) + 1, a1s, t1, g1, keep, CID, HALF, EXCL)
    q = q * gl.expand_dims(r21, 1) + cb
    _put(p_smem, 3 * pb + 1, q, CID, HALF)
    cb, add0 = _tight_dim(sa, st_rows, 8 * (i % 4), a0s, t0, g0, keep, CID, HALF, EXCL)
    _put(p_smem, 3 * pb, q * gl.expand_dims(r10, 1) + cb, CID, HALF)
  fence_async_shared()
  mbarrier.arrive(p_full.index(pb))
  mbarrier.wait(p_full.index(pb), (i // NP) & 1)        # both halves of the three written
  if CID == 0:
    acc0 = warpgroup_mma(p_smem.index(3 * pb), y_smem.index(4 * slot), acc0, is_async=True)
    acc1 = warpgroup_mma(p_smem.index(3 * pb + 1), y_smem.index(4 * slot + 1), acc1,
                         is_async=True)
  else:
    acc0 = warpgroup_mma(p_smem.index(3 * pb + 2), y_smem.index(4 * slot + 2), acc0,
                         is_async=True)
    acc1 = warpgroup_mma(p_smem.index(3 * pb + 2), y_smem.index(4 * slot + 3), acc1,
                         is_async=True)
  if DEFER:   # all but this tile's two P @ y wgmmas: the next S and the previous P @ y
    # (acc0, acc1 kept alive, still being written: only the next P @ y reads them)
    na, nb, nc, acc0, acc1 = warpgroup_mma_wait(num_outstanding=2,
                                                deps=(na, nb, nc, acc0, acc1))
    mbarrier.arrive(empty.index((i + NT - 1) % NT), pred=i > 0)
    mbarrier.arrive(p_free.index((i + NP - 1) % NP), pred=i > 0)
  else:
    na, nb, nc, acc0, acc1 = warpgroup_mma_wait(num_outstanding=0,
                                                deps=(na, nb, nc, acc0, acc1))
    mbarrier.arrive(empty.index(slot))   # this group is done with the tile
    mbarrier.arrive(p_free.index(pb))
  return na, nb, nc, acc0, acc1, cs0 + add0, cs1 + add1, cs2 + add2


@gluon.jit
def _norms(xt_ptr, rows, in_rows, n):
  """The three dims' prefix inverse norms of these rows of x (xt [3, n]; 1 past n)."""
  a0 = gl.load(xt_ptr + rows, mask=in_rows, other=1.0)
  a1 = gl.load(xt_ptr + n + rows, mask=in_rows, other=1.0)
  a2 = gl.load(xt_ptr + 2 * n + rows, mask=in_rows, other=1.0)
  return a0, a1, a2


@gluon.jit
def _tight_consumer(x_smem, y_smem, st_rows, p_smem, x_bar, ready, empty, p_full, p_free,
                    scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo, ntiles, k0,
                    ndiag, dx_ptr, cs_ptr, CID: gl.constexpr, BM: gl.constexpr,
                    BN: gl.constexpr, BK: gl.constexpr, NT: gl.constexpr, NP: gl.constexpr,
                    DEFER: gl.constexpr, BOUND: gl.constexpr):
  """``_small_consumer`` with fewer instructions a tile: the tiles holding self pairs
  walked first and alone tested for them; the rest two a loop iteration, so that the
  next tile's S and the current one swap roles instead of being copied; the columns'
  statistics from shared memory (TMA-loaded with the tile); ``_tight_tile``'s epilogue."""
  HALF: gl.constexpr = BN // 2
  s_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
  o_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
  in_rows = rows < n
  a0, a1, a2 = _norms(xt_ptr, rows, in_rows, n)
  t0, g0, _ = row_stats(t_ptr, g_r_ptr, t_ptr, rows, in_rows, BM, True, False)
  t1, g1, _ = row_stats(t_ptr + n, g_r_ptr + n, t_ptr, rows, in_rows, BM, True, False)
  t2, g2, _ = row_stats(t_ptr + 2 * n, g_r_ptr + 2 * n, t_ptr, rows, in_rows, BM, True, False)
  rs = (a0 * scale2, a1 * scale2, a2 * scale2, t0, t1, t2, g0, g1, g2, a2 / a1, a1 / a0)
  zs = gl.zeros([BM, HALF], gl.float32, layout=s_layout)
  cs0 = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
  cs1, cs2 = cs0, cs0
  acc0 = gl.zeros([BM, BK], gl.float32, layout=o_layout)
  acc1 = acc0
  mbarrier.wait(x_bar, 0)
  sa, sb, sc = _walk_tile(x_smem, y_smem, ready, 0, zs, CID, HALF, NT)
  sa, sb, sc = warpgroup_mma_wait(num_outstanding=0, deps=(sa, sb, sc))
  for i in range(0, ndiag):   # the tiles holding self pairs: tested
    sa, sb, sc, acc0, acc1, cs0, cs1, cs2 = _tight_tile(
        i, sa, sb, sc, acc0, acc1, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem, ready,
        empty, p_full, p_free, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID, BN, NT,
        NP, True, DEFER, BOUND)
  for i in range(ndiag, ntiles - 1, 2):   # the rest, two an iteration
    sa, sb, sc, acc0, acc1, cs0, cs1, cs2 = _tight_tile(
        i, sa, sb, sc, acc0, acc1, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem, ready,
        empty, p_full, p_free, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID, BN, NT,
        NP, False, DEFER, BOUND)
    sa, sb, sc, acc0, acc1, cs0, cs1, cs2 = _tight_tile(
        i + 1, sa, sb, sc, acc0, acc1, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem, ready,
        empty, p_full, p_free, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID, BN, NT,
        NP, False, DEFER, BOUND)
  if (ntiles - ndiag) % 2 == 1:   # and the odd one
    sa, sb, sc, acc0, acc1, cs0, cs1, cs2 = _tight_tile(
        ntiles - 1, sa, sb, sc, acc0, acc1, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
        ready, empty, p_full, p_free, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID,
        BN, NT, NP, False, DEFER, BOUND)
  acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))   # (DEFER: the last)
  out_mult = gl.load(scal_ptr + 1)
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
  in_orows = orows < n
  feats = 2 * CID * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, o_layout))
  at = dx_ptr + gl.expand_dims(orows, 1).to(gl.int64) * (4 * BK) + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(in_orows, 1) & gl.expand_dims(feats < 4 * BK, 0)
  ty = dx_ptr.dtype.element_ty
  # dx's segments: a_0 (Q_0 @ y), a_1 (Q_1 @ y) (group 0); a_2 (Q_2 @ y) twice (group 1)
  m0 = gl.load(xt_ptr + 2 * CID * n + orows, mask=in_orows, other=0.0) * out_mult
  m1 = gl.load(xt_ptr + (1 + CID) * n + orows, mask=in_orows, other=0.0) * out_mult
  gl.store(at, (acc0 * gl.expand_dims(m0, 1)).to(ty), mask=keep)
  gl.store(at + BK, (acc1 * gl.expand_dims(m1, 1)).to(ty), mask=keep)
  cs_mult = gl.load(scal_ptr + 2)
  gl.store(cs_ptr + CID * n + rows, cs0 * (a0 * cs_mult), mask=in_rows)     # [3 dims, 2, n]
  gl.store(cs_ptr + (2 + CID) * n + rows, cs1 * (a1 * cs_mult), mask=in_rows)
  gl.store(cs_ptr + (4 + CID) * n + rows, cs2 * (a2 * cs_mult), mask=in_rows)


@gluon.jit
def _tight_kernel(
    x_desc, y_desc,            # TMA descriptors: x, y [n, >= 256] in [64, 64] blocks
    s_desc,                    # TMA descriptor: the columns' statistics [m / 64 * 8, 64]
                               # fp32 in [8, 64] blocks (``column_blocks``)
    scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr,   # as ``_small_bwd_kernel``'s
    n, m, cols_per_split,      # (cols_per_split a multiple of 64)
    dx_ptr, cs_ptr,
    NT: gl.constexpr, NP: gl.constexpr,
    DEFER: gl.constexpr,       # each tile's P @ y waited for a tile later (NT >= 4)
    BOUND: gl.constexpr = 0,   # 1: the loads alone; 2: no epilogue (timing bounds)
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  row0, j_lo, ntiles, k0, ndiag, x_smem, y_smem, st_smem, st_rows = _tight_start(
      x_desc, y_desc, s_desc, off_ptr, m, cols_per_split, NT)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [3 * NP, BM, BN], p_layout)
  x_bar, ready, empty, p_full, p_free = _ring_barriers(NT, NP)
  if BOUND == 1:
    gl.warp_specialize([
        (_loads_consumer, (x_bar, ready, empty, ntiles, NT)),
        (_loads_consumer, (x_bar, ready, empty, ntiles, NT)),
        (_tight_producer, (x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready,
                           empty, row0, j_lo, ntiles, k0, BN, BK, NT)),
    ], [4, 1], [240, 24])
  else:
    gl.warp_specialize([
        (_tight_consumer, (x_smem, y_smem, st_rows, p_smem, x_bar, ready, empty, p_full,
                           p_free, scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo,
                           ntiles, k0, ndiag, dx_ptr, cs_ptr, 0, BM, BN, BK, NT, NP, DEFER,
                           BOUND)),
        (_tight_consumer, (x_smem, y_smem, st_rows, p_smem, x_bar, ready, empty, p_full,
                           p_free, scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo,
                           ntiles, k0, ndiag, dx_ptr, cs_ptr, 1, BM, BN, BK, NT, NP, DEFER,
                           BOUND)),
        (_tight_producer, (x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready,
                           empty, row0, j_lo, ntiles, k0, BN, BK, NT)),
    ], [4, 1], [240, 24])


@gluon.jit
def _loads_consumer(x_bar, ready, empty, ntiles, NT: gl.constexpr):
  """A consumer group of BOUND 1: every tile waited for and freed, nothing computed (the
  pass's loads alone: their rate from L2 bounds the pass)."""
  mbarrier.wait(x_bar, 0)
  for i in range(0, ntiles + 1):
    mbarrier.wait(ready.index(i % NT), (i // NT) & 1)
    mbarrier.arrive(empty.index(i % NT))


# ---------------------------------------------------------------------------------------
# ``small3_wide``: 128-row programs; each consumer group its own 64 rows, 64-column S
# wgmmas and all 256 of dx's features, no P shared between the groups


@gluon.jit
def _wide_put(p_smem, k, v, p_bar, phase, BAR: gl.constexpr = False):
  """v as P tile k (bf16), written by the whole group before its wgmma reads it: the
  group's stores fenced for the async proxy, then the group synchronized, by an mbarrier
  round trip or, BAR, by a barrier alone (within a partition, its own named barrier)."""
  p_smem.index(k).store(v.to(p_smem.dtype))
  fence_async_shared()
  if BAR:
    gl.barrier()
  else:
    mbarrier.arrive(p_bar.index(k))
    mbarrier.wait(p_bar.index(k), phase)


@gluon.jit
def _my_turn(turn, k, CID: gl.constexpr, PP: gl.constexpr):
  """PP 1 (FlashAttention-3's ping-pong): group CID's k-th batch of wgmmas waits until the
  other group has issued its own k-th (group 0's first batch waits for nothing), so the
  groups' batches alternate and each group's epilogue runs under the other's wgmmas.
  PP 2 (a staggered start): group 1's first batch waits until group 0's first has
  completed (``_lead``); after that neither waits for the other."""
  if PP == 1:
    if CID == 0:
      mbarrier.wait(turn.index(0), (k - 1) & 1, pred=k > 0)
    else:
      mbarrier.wait(turn.index(1), k & 1)
  elif PP == 2 and CID == 1:
    mbarrier.wait(turn.index(1), 0, pred=k == 0)


@gluon.jit
def _pass_turn(turn, CID: gl.constexpr, PP: gl.constexpr):
  """PP 1: this group's batch is issued; the other group's turn."""
  if PP == 1:
    mbarrier.arrive(turn.index(1 - CID))


@gluon.jit
def _lead(turn, k, CID: gl.constexpr, PP: gl.constexpr):
  """PP 2: group 0's first batch has completed (k = 0): group 1 may start, a batch behind,
  so that from then on one group's epilogues tend to fall under the other's wgmmas."""
  if PP == 2 and CID == 0:
    mbarrier.arrive(turn.index(1), pred=k == 0)


@gluon.jit
def _wide_tile(i, s0, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
               p_bar, ready, empty, turn, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0,
               CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr, NT: gl.constexpr,
               EXCL: gl.constexpr, EARLY: gl.constexpr, REGA: gl.constexpr,
               PP: gl.constexpr, BAR: gl.constexpr, RW: gl.constexpr, NX: gl.constexpr):
  """Walk position i for this group's rows: the three prefix dots (chunk 0; + chunk 1; +
  chunks 2-3), each dim's c b as its dot completes (dims 0 and 1 parked as bf16 in the
  group's P tiles 0 and 1), then from the largest dim down Q_2 = c^2 b, Q_1 = c^1 b + Q_2
  a_2 / a_1, Q_0 = c^0 b + Q_1 a_1 / a_0 into P and onto dx's segments; the ring slot
  freed after the last wgmma. EARLY (``_wide_dots``): 1, chunks 2-3 issued with 0 and 1
  (three S accumulators in flight); 0, after dim 0's epilogue; 2, ``_wide_chain``. REGA:
  the Q_k wgmmas take Q_k from registers. PP (``_wide_chain`` only): 1, its four batches
  of wgmmas a tile (chunk 0; chunk 1; chunks 2-3; the Q_k) take turns with the other
  group's; 2, group 1 starts a batch behind group 0 (``_my_turn``). BAR: each P tile
  handed to the group's wgmma by a barrier (``_wide_put``). With REGA: RW, Q_2 released
  once its two wgmmas are done (waited for after Q_1's are issued, before Q_0 is formed:
  16 registers fewer from then on); NX, the next tile's chunk 0 issued ahead of this
  tile's Q_k wgmmas (into S, free once Q_2 is formed) and returned waited for, so that
  the next tile starts on its S (s0) and no chunk-0 wgmma is waited for alone."""
  a0s, a1s, a2s, t0, t1, t2, g0, g1, g2, r21, r10 = rs
  layout: gl.constexpr = zs.type.layout
  gl.static_assert(EARLY == 2 or not PP)
  slot = i % NT
  r0 = 8 * (i % 4)   # the tile's statistics block
  pt = 3 * CID       # this group's P tiles
  keep = 0
  if EXCL:
    cols = j_lo + ((k0 + i) % ntiles) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    keep = off_diagonal(rows, cols, row_off, col_off)
  gl.static_assert(REGA or not (RW or NX))
  if not NX:   # (NX: waited for when s0's wgmma was issued)
    mbarrier.wait(ready.index(slot), (i // NT) & 1)
  if EARLY == 2:   # one accumulator, each dim's epilogue between its chunks
    q, add0, add1, add2 = _wide_chain(x_smem, y_smem, st_rows, p_smem, pt, slot, r0, a0s, a1s,
                                      a2s, t0, t1, t2, g0, g1, g2, keep, zs, turn, 4 * i, s0,
                                      CID, BN, HR, EXCL, PP, NX)
  else:
    q, add0, add1, add2 = _wide_dots(x_smem, y_smem, st_rows, p_smem, pt, slot, r0, a0s, a1s,
                                     a2s, t0, t1, t2, g0, g1, g2, keep, zs, CID, BN, HR, EXCL,
                                     EARLY)
  if REGA:   # Q from registers: no P store, fence or barrier
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=layout, k_width=2)
    q2 = gl.convert_layout(q.to(p_smem.dtype), a_layout)
    if NX:   # the next tile's chunk 0 (past the split's end: the producer's extra tile)
      nslot = (i + 1) % NT
      mbarrier.wait(ready.index(nslot), ((i + 1) // NT) & 1)
      s0 = warpgroup_mma(_xrows(x_smem, 0, CID, HR), _ychunk(y_smem, nslot, 0, 0, BN), zs,
                         use_acc=False, is_async=True)
    _my_turn(turn, 4 * i + 3, CID, PP)
    acc2 = warpgroup_mma(q2, y_smem.index(4 * slot + 2), acc2, is_async=True)
    acc3 = warpgroup_mma(q2, y_smem.index(4 * slot + 3), acc3, is_async=True)
    q = p_smem.index(pt + 1).load(layout).to(gl.float32) + q * gl.expand_dims(r21, 1)
    q1 = gl.convert_layout(q.to(p_smem.dtype), a_layout)
    acc1 = warpgroup_mma(q1, y_smem.index(4 * slot + 1), acc1, is_async=True)
    if RW:   # Q_2's wgmmas (and any chunk before them) done: q2 free
      acc2, acc3, q2 = warpgroup_mma_wait(num_outstanding=1, deps=(acc2, acc3, q2))
    q = p_smem.index(pt).load(layout).to(gl.float32) + q * gl.expand_dims(r10, 1)
    q0 = gl.convert_layout(q.to(p_smem.dtype), a_layout)
    acc0 = warpgroup_mma(q0, y_smem.index(4 * slot), acc0, is_async=True)
    _pass_turn(turn, CID, PP)
    if NX:
      s0, acc0, acc1, acc2, acc3, q0, q1, q2 = warpgroup_mma_wait(
          num_outstanding=0, deps=(s0, acc0, acc1, acc2, acc3, q0, q1, q2))
    else:
      acc0, acc1, acc2, acc3, q0, q1, q2 = warpgroup_mma_wait(
          num_outstanding=0, deps=(acc0, acc1, acc2, acc3, q0, q1, q2))
  else:
    _wide_put(p_smem, pt + 2, q, p_bar, i & 1, BAR)
    _my_turn(turn, 4 * i + 3, CID, PP)
    acc2 = warpgroup_mma(p_smem.index(pt + 2), y_smem.index(4 * slot + 2), acc2, is_async=True)
    acc3 = warpgroup_mma(p_smem.index(pt + 2), y_smem.index(4 * slot + 3), acc3, is_async=True)
    q = p_smem.index(pt + 1).load(layout).to(gl.float32) + q * gl.expand_dims(r21, 1)
    _wide_put(p_smem, pt + 1, q, p_bar, i & 1, BAR)
    acc1 = warpgroup_mma(p_smem.index(pt + 1), y_smem.index(4 * slot + 1), acc1, is_async=True)
    q = p_smem.index(pt).load(layout).to(gl.float32) + q * gl.expand_dims(r10, 1)
    _wide_put(p_smem, pt, q, p_bar, i & 1, BAR)
    acc0 = warpgroup_mma(p_smem.index(pt), y_smem.index(4 * slot), acc0, is_async=True)
    _pass_turn(turn, CID, PP)
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0,
                                                deps=(acc0, acc1, acc2, acc3))
  mbarrier.arrive(empty.index(slot))   # this group is done with the tile
  return s0, acc0, acc1, acc2, acc3, cs0 + add0, cs1 + add1, cs2 + add2


@gluon.jit
def _halves_tile(i, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
                 ready, empty, zh, rs, rows, row_off, col_off, j_lo, ntiles, k0,
                 CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr, NT: gl.constexpr,
                 EXCL: gl.constexpr, RW: gl.constexpr):
  """``_wide_tile``'s chain and Q_k from registers (REGA) on the tile's two column halves,
  each in an accumulator of its own ([HR, BN / 2]: the registers of one [HR, BN] S), so
  that one half's epilogue runs while the other half's wgmma does: chunk 0 of both halves
  issued, then for each dim half A's epilogue (its next chunks issued after it) under
  half B's wgmmas and half B's under half A's next; Q_2 of half A issued before half B's
  dim-2 epilogue. The Q_k wgmmas take K = BN / 2 (the half's columns). RW: the Q_2
  operands released once their wgmmas are done (waited for before the Q_0 are formed)."""
  HALF: gl.constexpr = BN // 2
  a0s, a1s, a2s, t0, t1, t2, g0, g1, g2, r21, r10 = rs
  layout: gl.constexpr = zh.type.layout
  acc_layout: gl.constexpr = acc0.type.layout
  a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
  slot = i % NT
  r0 = 8 * (i % 4)
  pt = 3 * CID
  ka = 0
  kb = 0
  if EXCL:
    cols = j_lo + ((k0 + i) % ntiles) * BN + gl.arange(0, HALF, layout=gl.SliceLayout(0, layout))
    ka = off_diagonal(rows, cols, row_off, col_off)
    kb = off_diagonal(rows, cols + HALF, row_off, col_off)
  mbarrier.wait(ready.index(slot), (i // NT) & 1)
  x0 = _xrows(x_smem, 0, CID, HR)
  sa = warpgroup_mma(x0, _ychunk(y_smem, slot, 0, 0, HALF), zh, use_acc=False, is_async=True)
  sb = warpgroup_mma(x0, _ychunk(y_smem, slot, 0, 1, HALF), zh, use_acc=False, is_async=True)
  # dim 0
  sa = warpgroup_mma_wait(num_outstanding=1, deps=(sa,))
  u, add0 = _tight_dim(sa, st_rows, r0, a0s, t0, g0, ka, 0, HALF, EXCL)
  p_smem.index(pt).slice(0, HALF, dim=1).store(u.to(p_smem.dtype))
  x1 = _xrows(x_smem, 1, CID, HR)
  sa = warpgroup_mma(x1, _ychunk(y_smem, slot, 1, 0, HALF), sa, is_async=True)
  sb = warpgroup_mma_wait(num_outstanding=1, deps=(sb,))
  u, add = _tight_dim(sb, st_rows, r0, a0s, t0, g0, kb, 1, HALF, EXCL)
  add0 += add
  p_smem.index(pt).slice(HALF, HALF, dim=1).store(u.to(p_smem.dtype))
  sb = warpgroup_mma(x1, _ychunk(y_smem, slot, 1, 1, HALF), sb, is_async=True)
  # dim 1
  sa = warpgroup_mma_wait(num_outstanding=1, deps=(sa,))
  u, add1 = _tight_dim(sa, st_rows, r0 + 1, a1s, t1, g1, ka, 0, HALF, EXCL)
  p_smem.index(pt + 1).slice(0, HALF, dim=1).store(u.to(p_smem.dtype))
  x2 = _xrows(x_smem, 2, CID, HR)
  x3 = _xrows(x_smem, 3, CID, HR)
  sa = warpgroup_mma(x2, _ychunk(y_smem, slot, 2, 0, HALF), sa, is_async=True)
  sa = warpgroup_mma(x3, _ychunk(y_smem, slot, 3, 0, HALF), sa, is_async=True)
  sb = warpgroup_mma_wait(num_outstanding=2, deps=(sb,))
  u, add = _tight_dim(sb, st_rows, r0 + 1, a1s, t1, g1, kb, 1, HALF, EXCL)
  add1 += add
  p_smem.index(pt + 1).slice(HALF, HALF, dim=1).store(u.to(p_smem.dtype))
  sb = warpgroup_mma(x2, _ychunk(y_smem, slot, 2, 1, HALF), sb, is_async=True)
  sb = warpgroup_mma(x3, _ychunk(y_smem, slot, 3, 1, HALF), sb, is_async=True)
  # dim 2, and Q_2 of each half as soon as it is formed
  sa = warpgroup_mma_wait(num_outstanding=2, deps=(sa,))
  qa, add2 = _tight_dim(sa, st_rows, r0 + 2, a2s, t2, g2, ka, 0, HALF, EXCL)
  qa2 = gl.convert_layout(qa.to(p_smem.dtype), a_layout)
  acc2 = warpgroup_mma(qa2, y_smem.index(4 * slot + 2).slice(0, HALF, dim=0), acc2,
                       is_async=True)
  acc3 = warpgroup_mma(qa2, y_smem.index(4 * slot + 3).slice(0, HALF, dim=0), acc3,
                       is_async=True)
  sb = warpgroup_mma_wait(num_outstanding=2, deps=(sb,))
  qb, add = _tight_dim(sb, st_rows, r0 + 2, a2s, t2, g2, kb, 1, HALF, EXCL)
  add2 += add
  qb2 = gl.convert_layout(qb.to(p_smem.dtype), a_layout)
  acc2 = warpgroup_mma(qb2, y_smem.index(4 * slot + 2).slice(HALF, HALF, dim=0), acc2,
                       is_async=True)
  acc3 = warpgroup_mma(qb2, y_smem.index(4 * slot + 3).slice(HALF, HALF, dim=0), acc3,
                       is_async=True)
  # Q_1 = c^1 b + Q_2 a_2 / a_1, Q_0 = c^0 b + Q_1 a_1 / a_0, half by half
  r21e = gl.expand_dims(r21, 1)
  r10e = gl.expand_dims(r10, 1)
  y1 = y_smem.index(4 * slot + 1)
  qa = p_smem.index(pt + 1).slice(0, HALF, dim=1).load(layout).to(gl.float32) + qa * r21e
  qa1 = gl.convert_layout(qa.to(p_smem.dtype), a_layout)
  acc1 = warpgroup_mma(qa1, y1.slice(0, HALF, dim=0), acc1, is_async=True)
  qb = p_smem.index(pt + 1).slice(HALF, HALF, dim=1).load(layout).to(gl.float32) + qb * r21e
  qb1 = gl.convert_layout(qb.to(p_smem.dtype), a_layout)
  acc1 = warpgroup_mma(qb1, y1.slice(HALF, HALF, dim=0), acc1, is_async=True)
  if RW:
    acc2, acc3, qa2, qb2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc2, acc3, qa2, qb2))
  y0 = y_smem.index(4 * slot)
  qa = p_smem.index(pt).slice(0, HALF, dim=1).load(layout).to(gl.float32) + qa * r10e
  qa0 = gl.convert_layout(qa.to(p_smem.dtype), a_layout)
  acc0 = warpgroup_mma(qa0, y0.slice(0, HALF, dim=0), acc0, is_async=True)
  qb = p_smem.index(pt).slice(HALF, HALF, dim=1).load(layout).to(gl.float32) + qb * r10e
  qb0 = gl.convert_layout(qb.to(p_smem.dtype), a_layout)
  acc0 = warpgroup_mma(qb0, y0.slice(HALF, HALF, dim=0), acc0, is_async=True)
  acc0, acc1, acc2, acc3, qa0, qb0, qa1, qb1, qa2, qb2 = warpgroup_mma_wait(
      num_outstanding=0, deps=(acc0, acc1, acc2, acc3, qa0, qb0, qa1, qb1, qa2, qb2))
  mbarrier.arrive(empty.index(slot))   # this group is done with the tile
  return acc0, acc1, acc2, acc3, cs0 + add0, cs1 + add1, cs2 + add2


@gluon.jit
def _wide_chain(x_smem, y_smem, st_rows, p_smem, pt, slot, r0, a0s, a1s, a2s, t0, t1, t2, g0,
                g1, g2, keep, zs, turn, k, s0, CID: gl.constexpr, BN: gl.constexpr,
                HR: gl.constexpr, EXCL: gl.constexpr, PP: gl.constexpr, NX: gl.constexpr):
  """``_wide_tile``'s prefix dots in one accumulator (each dim's epilogue waits for its
  chunks): c^0 b and c^1 b parked in P tiles pt and pt + 1, c^2 b returned, with the rows'
  sums. k: the tile's first batch of wgmmas (PP's turns). NX: chunk 0's S is s0, waited
  for."""
  if NX:
    s = s0
  else:
    _my_turn(turn, k, CID, PP)
    s = warpgroup_mma(_xrows(x_smem, 0, CID, HR), _ychunk(y_smem, slot, 0, 0, BN), zs,
                      use_acc=False, is_async=True)
    _pass_turn(turn, CID, PP)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    _lead(turn, k, CID, PP)
  u, add0 = _tight_dim(s, st_rows, r0, a0s, t0, g0, keep, 0, BN, EXCL)
  p_smem.index(pt).store(u.to(p_smem.dtype))   # (read back by the same threads)
  _my_turn(turn, k + 1, CID, PP)
  s = warpgroup_mma(_xrows(x_smem, 1, CID, HR), _ychunk(y_smem, slot, 1, 0, BN), s,
                    is_async=True)
  _pass_turn(turn, CID, PP)
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  u, add1 = _tight_dim(s, st_rows, r0 + 1, a1s, t1, g1, keep, 0, BN, EXCL)
  p_smem.index(pt + 1).store(u.to(p_smem.dtype))
  _my_turn(turn, k + 2, CID, PP)
  s = warpgroup_mma(_xrows(x_smem, 2, CID, HR), _ychunk(y_smem, slot, 2, 0, BN), s,
                    is_async=True)
  s = warpgroup_mma(_xrows(x_smem, 3, CID, HR), _ychunk(y_smem, slot, 3, 0, BN), s,
                    is_async=True)
  _pass_turn(turn, CID, PP)
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  q, add2 = _tight_dim(s, st_rows, r0 + 2, a2s, t2, g2, keep, 0, BN, EXCL)
  return q, add0, add1, add2


@gluon.jit
def _wide_dots(x_smem, y_smem, st_rows, p_smem, pt, slot, r0, a0s, a1s, a2s, t0, t1, t2, g0,
               g1, g2, keep, zs, CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr,
               EXCL: gl.constexpr, EARLY: gl.constexpr):
  """``_wide_chain`` with chunks 0 and 1 in accumulators of their own (and, EARLY, chunks
  2-3 issued with them), so that each dim's epilogue runs under the next chunks."""
  sa = warpgroup_mma(_xrows(x_smem, 0, CID, HR), _ychunk(y_smem, slot, 0, 0, BN), zs,
                     use_acc=False, is_async=True)
  sb = warpgroup_mma(_xrows(x_smem, 1, CID, HR), _ychunk(y_smem, slot, 1, 0, BN), zs,
                     use_acc=False, is_async=True)
  if EARLY:
    sc = warpgroup_mma(_xrows(x_smem, 2, CID, HR), _ychunk(y_smem, slot, 2, 0, BN), zs,
                       use_acc=False, is_async=True)
    sc = warpgroup_mma(_xrows(x_smem, 3, CID, HR), _ychunk(y_smem, slot, 3, 0, BN), sc,
                       is_async=True)
    sa = warpgroup_mma_wait(num_outstanding=3, deps=(sa,))
  else:
    sa = warpgroup_mma_wait(num_outstanding=1, deps=(sa,))
  u, add0 = _tight_dim(sa, st_rows, r0, a0s, t0, g0, keep, 0, BN, EXCL)
  p_smem.index(pt).store(u.to(p_smem.dtype))   # (read back by the same threads)
  if EARLY:
    sb = warpgroup_mma_wait(num_outstanding=2, deps=(sb,))
  else:
    sb = warpgroup_mma_wait(num_outstanding=0, deps=(sb,))
  p = sa + sb
  if not EARLY:
    sc = warpgroup_mma(_xrows(x_smem, 2, CID, HR), _ychunk(y_smem, slot, 2, 0, BN), zs,
                       use_acc=False, is_async=True)
    sc = warpgroup_mma(_xrows(x_smem, 3, CID, HR), _ychunk(y_smem, slot, 3, 0, BN), sc,
                       is_async=True)
  u, add1 = _tight_dim(p, st_rows, r0 + 1, a1s, t1, g1, keep, 0, BN, EXCL)
  p_smem.index(pt + 1).store(u.to(p_smem.dtype))
  sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
  q, add2 = _tight_dim(p + sc, st_rows, r0 + 2, a2s, t2, g2, keep, 0, BN, EXCL)
  return q, add0, add1, add2


@gluon.jit
def _wide_rows(xt_ptr, t_ptr, g_r_ptr, scale2, rows, n):
  """The rows' statistics of the three dims: a_k scale2, t_k, g_r,k, a_2 / a_1, a_1 / a_0."""
  in_rows = rows < n
  a0, a1, a2 = _norms(xt_ptr, rows, in_rows, n)
  t0, g0, _ = row_stats(t_ptr, g_r_ptr, t_ptr, rows, in_rows, 64, True, False)
  t1, g1, _ = row_stats(t_ptr + n, g_r_ptr + n, t_ptr, rows, in_rows, 64, True, False)
  t2, g2, _ = row_stats(t_ptr + 2 * n, g_r_ptr + 2 * n, t_ptr, rows, in_rows, 64, True, False)
  return a0 * scale2, a1 * scale2, a2 * scale2, t0, t1, t2, g0, g1, g2, a2 / a1, a1 / a0


@gluon.jit
def _wide_consumer(x_smem, y_smem, st_rows, p_smem, p_bar, x_bar, ready, empty, turn,
                   scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo, ntiles, k0, ndiag,
                   dx_ptr, cs_ptr, CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr,
                   NT: gl.constexpr, EARLY: gl.constexpr, REGA: gl.constexpr,
                   PP: gl.constexpr, BAR: gl.constexpr, RW: gl.constexpr, NX: gl.constexpr,
                   HV: gl.constexpr):
  """Consumer group CID: rows [row0 + CID HR, + HR) against every tile of the split, the
  tiles holding the program's self pairs first and alone tested; dx's four 64-feature
  segments in four accumulators. HV: ``_halves_tile`` (S in [HR, BN / 2] halves)."""
  SN: gl.constexpr = BN // 2 if HV else BN   # S's columns a wgmma
  layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SN, 16])
  acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + CID * HR + gl.arange(0, HR, layout=gl.SliceLayout(1, layout))
  rs = _wide_rows(xt_ptr, t_ptr, g_r_ptr, scale2, rows, n)
  zs = gl.zeros([HR, SN], gl.float32, layout=layout)
  cs0 = gl.zeros([HR], gl.float32, layout=gl.SliceLayout(1, layout))
  cs1, cs2 = cs0, cs0
  za = gl.zeros([HR, BN], gl.float32, layout=acc_layout)
  acc0, acc1, acc2, acc3 = za, za, za, za
  mbarrier.wait(x_bar, 0)
  s0 = zs
  if NX:   # the first tile's chunk 0
    mbarrier.wait(ready.index(0), 0)
    s0 = warpgroup_mma(_xrows(x_smem, 0, CID, HR), _ychunk(y_smem, 0, 0, 0, BN), zs,
                       use_acc=False, is_async=True)
    s0 = warpgroup_mma_wait(num_outstanding=0, deps=(s0,))
  if HV:
    for i in range(0, ndiag):   # the tiles holding the program's self pairs: tested
      acc0, acc1, acc2, acc3, cs0, cs1, cs2 = _halves_tile(
          i, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem, ready,
          empty, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID, BN, HR, NT, True, RW)
    for i in range(ndiag, ntiles):
      acc0, acc1, acc2, acc3, cs0, cs1, cs2 = _halves_tile(
          i, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem, ready,
          empty, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID, BN, HR, NT, False, RW)
  else:
    for i in range(0, ndiag):   # the tiles holding the program's self pairs: tested
      s0, acc0, acc1, acc2, acc3, cs0, cs1, cs2 = _wide_tile(
          i, s0, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
          p_bar, ready, empty, turn, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID,
          BN, HR, NT, True, EARLY, REGA, PP, BAR, RW, NX)
    for i in range(ndiag, ntiles):
      s0, acc0, acc1, acc2, acc3, cs0, cs1, cs2 = _wide_tile(
          i, s0, acc0, acc1, acc2, acc3, cs0, cs1, cs2, x_smem, y_smem, st_rows, p_smem,
          p_bar, ready, empty, turn, zs, rs, rows, row_off, col_off, j_lo, ntiles, k0, CID,
          BN, HR, NT, False, EARLY, REGA, PP, BAR, RW, NX)
  rows = row0 + CID * HR + gl.arange(0, HR, layout=gl.SliceLayout(1, acc_layout))
  cs0 = gl.convert_layout(cs0, rows.type.layout)
  cs1 = gl.convert_layout(cs1, rows.type.layout)
  cs2 = gl.convert_layout(cs2, rows.type.layout)
  in_rows = rows < n   # (the a_k again: not held across the loop)
  a0, a1, a2 = _norms(xt_ptr, rows, in_rows, n)
  out_mult = gl.load(scal_ptr + 1)
  feats = gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
  at = dx_ptr + gl.expand_dims(rows, 1).to(gl.int64) * (4 * BN) + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(in_rows, 1) & gl.expand_dims(feats < BN, 0)
  ty = dx_ptr.dtype.element_ty
  # dx's segments: a_0 (Q_0 @ y), a_1 (Q_1 @ y), a_2 (Q_2 @ y) twice
  gl.store(at, (acc0 * gl.expand_dims(a0 * out_mult, 1)).to(ty), mask=keep)
  gl.store(at + BN, (acc1 * gl.expand_dims(a1 * out_mult, 1)).to(ty), mask=keep)
  gl.store(at + 2 * BN, (acc2 * gl.expand_dims(a2 * out_mult, 1)).to(ty), mask=keep)
  gl.store(at + 3 * BN, (acc3 * gl.expand_dims(a2 * out_mult, 1)).to(ty), mask=keep)
  cs_mult = gl.load(scal_ptr + 2)
  gl.store(cs_ptr + rows, cs0 * (a0 * cs_mult), mask=in_rows)          # [3 dims, n]
  gl.store(cs_ptr + n + rows, cs1 * (a1 * cs_mult), mask=in_rows)
  gl.store(cs_ptr + 2 * n + rows, cs2 * (a2 * cs_mult), mask=in_rows)


@gluon.jit
def _wide_kernel(
    x_desc,                    # TMA descriptor: x [n, >= 256] in [128, 64] blocks
    y_desc, s_desc, scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr,   # as ``_tight_kernel``'s
    n, m, cols_per_split,
    dx_ptr,                    # [n, 256]
    cs_ptr,                    # [3 dims, n] fp32
    NT: gl.constexpr, EARLY: gl.constexpr,   # (``_wide_tile``)
    REGA: gl.constexpr = False, PP: gl.constexpr = False, BAR: gl.constexpr = False,
    RW: gl.constexpr = False, NX: gl.constexpr = False, HV: gl.constexpr = False,
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  HR: gl.constexpr = BM // 2
  gl.static_assert(BM == 128)
  row0, j_lo, ntiles, k0, ndiag, x_smem, y_smem, st_smem, st_rows = _tight_start(
      x_desc, y_desc, s_desc, off_ptr, m, cols_per_split, NT)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [6, HR, BN], p_layout)   # 3 a group
  p_bar = mbarrier.allocate_mbarrier(batch=6)
  x_bar, ready, empty = _tight_barriers(NT)
  for i in gl.static_range(6):
    mbarrier.init(p_bar.index(i), count=1)
  turn = mbarrier.allocate_mbarrier(batch=2)   # PP: group k's turn to issue
  for i in gl.static_range(2):
    mbarrier.init(turn.index(i), count=1)
  gl.warp_specialize([
      (_wide_consumer, (x_smem, y_smem, st_rows, p_smem, p_bar, x_bar, ready, empty, turn,
                        scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo, ntiles, k0,
                        ndiag, dx_ptr, cs_ptr, 0, BN, HR, NT, EARLY, REGA, PP, BAR, RW, NX,
                        HV)),
      (_wide_consumer, (x_smem, y_smem, st_rows, p_smem, p_bar, x_bar, ready, empty, turn,
                        scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, j_lo, ntiles, k0,
                        ndiag, dx_ptr, cs_ptr, 1, BN, HR, NT, EARLY, REGA, PP, BAR, RW, NX,
                        HV)),
      (_tight_producer, (x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready, empty,
                         row0, j_lo, ntiles, k0, BN, BK, NT)),
  ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def prefixes(x, y, dims=DIMS):
  """Each dim's prefix inverse norms of x's and y's rows, [dims, n] fp32."""
  inv = lambda v: jnp.stack([jax.lax.rsqrt(jnp.sum(jnp.square(v[:, :d].astype(jnp.float32)),
                                                   1)) for d in dims])
  return inv(x), inv(y)


def operands(x, y, scale2):
  """Each small dim's prefix inverse norms a, b [3, n] (``prefixes``), the shared shift t
  = scale2 and rebased cotangents in [0.5, 1.5] / B."""
  n = x.shape[0]
  f32 = jnp.float32
  k = jax.random.split(jax.random.key(1), 2)
  g_r = (0.5 + jax.random.uniform(k[0], (3, n), f32)) / n
  g_c = (0.5 + jax.random.uniform(k[1], (3, n), f32)) / n
  return *prefixes(x, y), jnp.full((3, n), scale2, f32), g_r, g_c


def reference(x, y, scale2, xt, yt, t, g_r, g_c, rows, keep_self=False):
  """dx [rows, 256] and cs [3, rows] in float32 jnp (self pairs dropped unless kept)."""
  x = x[:rows, :256].astype(jnp.float32)
  y = y[:, :256].astype(jnp.float32)
  off = (jnp.arange(rows)[:, None] == jnp.arange(y.shape[0])[None, :]) & (not keep_self)
  dx, cs = jnp.zeros_like(x), []
  for k, d in enumerate(DIMS):
    ab = xt[k, :rows, None] * yt[k, None, :]
    s = (x[:, :d] @ y[:, :d].T) * ab
    c = jnp.where(off, 0.0, jnp.exp2(jnp.minimum(s * scale2 - t[k, :rows, None], 8.0)) * (
        g_r[k, :rows, None] + g_c[k, None, :]))
    dx = dx.at[:, :d].add((c * ab) @ y[:, :d])
    cs.append(jnp.sum(c * s, 1))
  return dx, jnp.stack(cs)


def launch(x, y, scale2, xt, yt, t, g_r, g_c, variant):
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  from memeff_jax import _compat  # pylint: disable=g-import-not-at-top
  n = x.shape[0]
  f32 = jnp.float32
  scal = jnp.stack([scale2, jnp.ones((), f32), jnp.ones((), f32)])
  off = jnp.zeros((2,), jnp.int32)
  xd = jt.TensorDescriptor.from_array(x, (BM, BK), layout=layout((BM, BK)))
  yd = jt.TensorDescriptor.from_array(y, (BN, BK), layout=layout((BN, BK)))
  out_shapes = [jax.ShapeDtypeStruct((n, 256), x.dtype), jax.ShapeDtypeStruct((3, 2, n), f32)]
  if variant in WIDE:
    xd = jt.TensorDescriptor.from_array(x, (2 * BM, BK), layout=layout((2 * BM, BK)))
    sd = jt.TensorDescriptor.from_array(column_blocks(yt, g_c), (8, BN), layout=STATS_LAYOUT)
    out_shapes[1] = jax.ShapeDtypeStruct((3, 1, n), f32)
    dx, cs = _compat.triton_call(
        xd, yd, sd, scal, off, xt.reshape(-1), t.reshape(-1), g_r.reshape(-1), n, n, n,
        kernel=_wide_kernel, out_shapes=out_shapes, grid=(-(-n // (2 * BM)), 1),
        name=f"gluon_{variant}", num_warps=4, num_stages=1, **WIDE[variant])
  elif variant in TIGHT:
    sd = jt.TensorDescriptor.from_array(column_blocks(yt, g_c), (8, BN), layout=STATS_LAYOUT)
    dx, cs = _compat.triton_call(
        xd, yd, sd, scal, off, xt.reshape(-1), t.reshape(-1), g_r.reshape(-1), n, n, n,
        kernel=_tight_kernel, out_shapes=out_shapes, grid=(-(-n // BM), 1),
        name=f"gluon_{variant}", num_warps=4, num_stages=1, NP=NP, **TIGHT[variant])
  else:
    dx, cs = _compat.triton_call(
        xd, yd, scal, off, xt.reshape(-1), yt.reshape(-1), t.reshape(-1), g_r.reshape(-1),
        g_c.reshape(-1), n, n, n, kernel=_small_bwd_kernel, out_shapes=out_shapes,
        grid=(-(-n // BM), 1), name=f"gluon_{variant}", num_warps=4, num_stages=1, NB=NB, NP=NP,
        **FLAGS[variant])
  return dx, jnp.sum(cs, axis=1)


def column_blocks(yt, g_c, shift=None):
  """``small3_tight``'s column statistics (``stat_blocks``): per tile of 64 columns the
  rows b_0, b_1, b_2, g_c,0 b_0, g_c,1 b_1, g_c,2 b_2, then row 6 and zeros."""
  return stat_blocks(jnp.concatenate([yt, g_c * yt]), shift)


def stat_blocks(lead, shift=None):
  """Six rows of column statistics [6, m] as TMA blocks, [m / 64 8, 64] fp32 (m padded to
  whole tiles): per tile of 64 columns the six rows (zeros past m: a column with b = 0
  adds nothing to a gradient), row 6 (given the forward's ``shift``, -shift, and -inf
  past m, whose exponentials are then 0; else 0) and a row of zeros."""
  m = lead.shape[1]
  pad = -m % BN
  six = jnp.zeros((1, m + pad), lead.dtype)
  if shift is not None:
    six = jnp.where(jnp.arange(m + pad) < m, -shift, -jnp.inf)[None].astype(lead.dtype)
  rows = jnp.concatenate([jnp.pad(lead, ((0, 0), (0, pad))), six,
                          jnp.zeros((1, m + pad), lead.dtype)])
  return rows.reshape(8, -1, BN).transpose(1, 0, 2).reshape(-1, BN)


def run(a):
  n = a.batch
  path = compiled_via()
  x, y = clip_pairs(jax.random.key(0), n, 512)
  r = n - RAGGED   # the check's rows and columns: neither a whole number of tiles
  for variant in a.variants.split(","):

    def body(row, variant=variant):
      fn = jax.jit(lambda *v: launch(*v, variant))
      for scale2, timed in ((LOG2E / 0.5, False), (LOG2E / 0.07, True)):
        s2 = jnp.asarray(scale2, jnp.float32)
        if not timed and TIGHT.get(variant, {}).get("BOUND"):   # a bound: nothing to check
          row.update(note=row["note"] + "; a timing bound, not checked")
        elif not timed:
          ops = operands(x[:r], y[:r], s2)
          dx, cs = fn(x[:r], y[:r], s2, *ops)
          want_dx, want_cs = reference(x[:r], y[:r], s2, *ops, CHECK_ROWS,
                                       keep_self=FLAGS.get(variant, {}).get("KEEP", False))
          err = lambda got, want: float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
          err_dx = err(dx[:CHECK_ROWS].astype(jnp.float32), want_dx)
          err_cs = err(cs[:, :CHECK_ROWS], want_cs)
          bad = not (np.isfinite(err_dx) and np.isfinite(err_cs)) or max(err_dx, err_cs) > 2e-2
          row.update(err_dx=err_dx, err_cs=err_cs, wrong=bool(bad))
        else:
          ops = operands(x, y, s2)
          ms = statistics.median(time_jax(fn, x, y, s2, *ops, reps=a.reps))
          row.update(ms=round(ms, 4))

    guarded(dict(bench="gluon_small_grad", variant=variant, batch=n, dim=256, ms=None,
                 err_dx=None, err_cs=None, wrong=None, note=f"compiled via {path}"),
            a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile for sm_90


FLAGS = {"small3": {}, "small3_lean": dict(LEAN=True),
         "small3_lean_keep": dict(LEAN=True, KEEP=True)}
TIGHT = {"small3_tight": dict(NT=NT, DEFER=False),   # ``_tight_kernel``
         "small3_tight_defer": dict(NT=NT + 1, DEFER=True),
         # timing bounds of the tight pass, not checked: its loads alone; without epilogue
         "small3_bound_loads": dict(NT=NT, DEFER=False, BOUND=1),
         "small3_bound_gemm": dict(NT=NT, DEFER=False, BOUND=2)}
WIDE = {"small3_wide": dict(NT=NT, EARLY=0),   # ``_wide_kernel``
        "small3_wide_early": dict(NT=NT, EARLY=1),
        "small3_wide_chain": dict(NT=NT, EARLY=2),
        "small3_wide_chain_rega": dict(NT=NT, EARLY=2, REGA=True),
        "small3_wide_chain_rega_rw": dict(NT=NT, EARLY=2, REGA=True, RW=True),
        "small3_wide_chain_rega_nx": dict(NT=NT, EARLY=2, REGA=True, NX=True),
        "small3_wide_chain_rega_nxrw": dict(NT=NT, EARLY=2, REGA=True, RW=True, NX=True),
        "small3_wide_halves": dict(NT=NT, EARLY=2, HV=True),
        "small3_wide_halves_rw": dict(NT=NT, EARLY=2, HV=True, RW=True),
        "small3_wide_chain_pp": dict(NT=NT, EARLY=2, PP=True),
        "small3_wide_chain_stag": dict(NT=NT, EARLY=2, PP=2),
        "small3_wide_chain_bar": dict(NT=NT, EARLY=2, BAR=True)}
VARIANTS = {v: (lambda d: True,) for v in (*FLAGS, *TIGHT, *WIDE)}


def compile_only(a):
  a.dims = "256"

  def build(variant, d):
    del d
    desc = lambda r: f"tensordesc<bf16[{r},{BK}],{layout((r, BK))!r}>"
    sig = dict(x_desc=desc(BM), y_desc=desc(BN), off_ptr="*i32", n="i32", m="i32",
               cols_per_split="i32", dx_ptr="*bf16",
               **{p: "*fp32" for p in ("scal_ptr", "xt_ptr", "yt_ptr", "t_ptr", "g_r_ptr",
                                       "g_c_ptr", "cs_ptr")})
    if variant in WIDE:
      kernel, consts = _wide_kernel, dict(WIDE[variant])
      sig["x_desc"] = desc(2 * BM)
      sig["s_desc"] = f"tensordesc<fp32[8,{BN}],{STATS_LAYOUT!r}>"
      del sig["yt_ptr"], sig["g_c_ptr"]
    elif variant in TIGHT:
      kernel, consts = _tight_kernel, dict(NP=NP, **TIGHT[variant])
      sig["s_desc"] = f"tensordesc<fp32[8,{BN}],{STATS_LAYOUT!r}>"
      del sig["yt_ptr"], sig["g_c_ptr"]
    else:
      kernel, consts = _small_bwd_kernel, dict(NB=NB, NP=NP, **FLAGS[variant])
    ptrs = [k for k, v in sig.items() if v.startswith(("*", "tensordesc"))]
    return compile_sm90(kernel, sig, ptrs, consts, 4, 1), 4, {}
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
