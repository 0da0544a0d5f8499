"""Whether Matryoshka's three small dims (64, 128, 256) cost less in one Gluon forward pass
over the first 256 features than in their three per-dim forwards (Hopper sm_90;
jax-triton >= 0.4, Triton >= 3.9; bf16; CLIP's two-sided bounded statistics).

Per dim k (m_k = 64, 128, 256 features), with a_k,i and b_k,j the inverse norms of the
rows' prefixes: z^k_ij = a_k,i b_k,j <x_i, y_j>_{:m_k} scale2 and, the self pairs left
out, row_k,i = sum_j 2^(z^k_ij - shift) and col_k,j = sum_i 2^(z^k_ij - shift), shift =
scale2 - 96 (``stats_gluon``'s bound: |s| <= 1). The library runs ``stats_gluon``'s
kernel once per dim on the normalized prefixes: on an H200 at B = 65536 the three take
about 9.9 ms of the fused loss's 17.9 ms forward (4.2 at d = 256 and 2.7 at 128 in
h200_jt04_mrl_profile.txt, 2.98 at 64 in h200_jt04_d64.csv), though their GEMM work is
448 features' (4.9 ms at 790 TFLOP/s) and one walk over 256 features gives every prefix
dot (2.8 ms): each per-dim forward is mostly its epilogue. With the small dims' gradient
in one pass too (``bench_gluon_small.py``), the bar of 1.6x plain CLIP leaves the three
forwards and two gradient passes 24.7 ms.

The kernel (``_fwd_consumer``): 128 rows a program, x's first 256 features resident
(four [128, 64] chunks); y's in 64-column tiles through ``bench_gluon_small``'s tight
ring (three tiles of four chunks, each with its columns' statistics block, TMA-loaded
on one mbarrier, the tiles holding the program's self pairs walked first and alone
tested). Two consumer groups, 64 rows each, both reading every tile; each computes the
transposed tile S^T [64 columns, 64 rows] (y's chunk the wgmma's A, x's the B) in one
accumulator, dim by dim: chunk 0 (dim 64's dot), its epilogue, chunk 1 added (dim
128's), its epilogue, chunks 2-3 added (dim 256's), its epilogue. The epilogue: 2^(S b_j
a_i scale2 - shift) (one multiply, one FMA, the exponential), added entry by entry into
the dim's register tile of the rows' terms (summed across the warps once, at the end)
and summed along the tile's rows (a column's sum runs inside a warp: the transposed
tile of ``stats_gluon``), stored per consumer group as a partial row. A group's
epilogues run while the other group's wgmmas do (the groups are not ordered).

Variants: ``small3_fwd``; ``library3``, the library's Gluon forward
(``stats_gluon._lse_fwd_gluon_kernel``) on each dim's normalized prefix, three launches
(the prefixes normalized in the timed step too), for the comparison in the same call.
``all4_fwd`` (``_all4_fwd_kernel``) takes dim 512 into the same walk, so that one pass
over the 512 features gives every dim's sums (the fused loss's forward: the per-dim
forwards take 17.9 ms in h200_jt04_mrl_profile.txt, the plain one 7.1): x's 512 features
resident (128 KiB), y's tiles through a ring of eight [64, 64] chunks, each freed as both
groups' wgmma on it completes, the columns' statistics blocks (b_0 .. b_3, -shift) in a
ring of four beside it; chunk 0, its epilogue, chunk 1, its epilogue, chunks 2-3, chunks
4-7, each dim's epilogue once its chunks are in. The rows' a_k scale2 are read from
shared memory each tile: held in registers with the four terms tiles they spilled 1416
B. ``all4_fwd_early`` keeps chunk 1 and then chunks 4-7 in a second accumulator, so that
a group's own wgmmas run under its dim-64 and dim-256 epilogues (FlashAttention-3's
overlap inside a warp group) where ``all4_fwd`` leaves that to the other group.
``library4`` runs the library's kernel once per dim, 512 included, for the comparison.
Rows and columns past the ends: a column's statistics block carries -shift in its row 6
(-inf past m, so the padded columns' exponentials are 0 in every tile), and a program
with rows past n tests every tile (rows < n joins the self-pair mask). Each is checked
against float32 jnp at n = m = batch - 37 (neither a whole number of tiles) on the first
512 rows and columns (max relative error of the sums; wrong over 2e-2 or NaN), then
timed at the batch (median of --reps):

  python benchmarks/bench_gluon_small_fwd.py --batch 65536 --reps 10
  python benchmarks/bench_gluon_small_fwd.py --compile-only

Measured (one H200, B = 65536, jax-triton 0.4.1 + Triton 3.9.0; h200_gluon_small.csv,
2026-12-05): ``small3_fwd`` 7.47 ms (within 4.4e-7 of float32 at 65499 rows and
columns), ``library3`` 9.94: 2.47 ms saved, short of the 3.1-5.5 ms model below, the
epilogue's issue and the GEMM not overlapping. (``library3``'s check launched the
library's kernel wrongly at the ragged size, a split not a whole number of tiles and
unpadded row partials: mended after the run, not re-run.)

sm_90 builds (``--compile-only``, Triton 3.9.0): ``small3_fwd``
168.6 KiB of shared memory, no spills, 671-672 instructions a consumer's tile (a
[64, 64] tile, 96 exponentials, 16 wgmmas; 669-671 before the ends' masks) and 1041-1042
in the tested loop (859-861 before: rows < n there); the library's
kernel at d = 256 848-856 a [64, 128] tile (64 exponentials). For one H200 at B = 65536
that puts the fused pass's consumers' issue at about 2.7 ms (two warps a scheduler, 1.98
GHz), its GEMM at 2.8 (790 TFLOP/s) and its exponentials at 3.1 (16 a cycle an SM): at
least 3.1 ms, about 5.5 if its issue and GEMM do not overlap; the per-dim forwards take
9.9. The walk order and the chained sums were checked on the CPU by a float64 NumPy model
of the kernel (not kept): within 2.3e-15 of a dense float64 reference (n = 512, m = 640,
with row and column offsets). ``all4_fwd``: 202.7 KiB, 108 B of spills, 1095-1122
instructions a tile (1501-1548 tested; 128 exponentials, 32 wgmmas); for B = 65536 about
4.4 ms of issue, 5.6 of GEMM and 4.1 of exponentials, against the four per-dim
forwards' 17.9 ms in the profile (7.1 + 10.8; the small three 9.94 here as
``library3``). A float64 NumPy model of its walk, statistics blocks and masks (not kept)
is within 7.6e-7 of ``reference`` (float32) at n = m = 300. ``all4_fwd_early``: 544 B
of spills, 1189-1223 instructions a tile. Measured on one H100 (2026-12-05,
h100_gluon_small.csv, one call): ``library4`` 17.16 ms, ``all4_fwd`` 12.85,
``all4_fwd_early`` 13.19, ``small3_fwd`` 7.39.
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
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks._gluon import compile_rows, compile_sm90, compiled_via, guarded, layout, main
from benchmarks._harness import clip_pairs, time_jax
from benchmarks.bench_gluon_mrl import CHECK_ROWS, LOG2E
from benchmarks.bench_gluon_small import (DIMS, NT, RAGGED, STATS_LAYOUT, _tight_barriers,
                                          _tight_producer, _tight_start, _tile_order, _xrows,
                                          column_blocks, prefixes, stat_blocks)
from memeff_jax import _compat
from memeff_jax.backends.triton import stats_gluon
from memeff_jax.backends.triton._common import off_diagonal
from memeff_jax.backends.triton.forward import BOUND_HEADROOM

BM, BN, BK = 128, 64, 64   # rows a program (64 a consumer group), columns a tile, features


@gluon.jit
def _fwd_dim(s, st_rows, r, a_s, neg_shift, terms, keep, layout: gl.constexpr,
             EXCL: gl.constexpr):
  """A dim's epilogue on its prefix dot s^T [BN, HR]: e = 2^(s b_j a_i scale2 - shift_j)
  (b: row r of the statistics blocks, a scale2 given; neg_shift [BN, 1]: -shift_j, their
  row 6, -inf past the columns' end), the self pairs and the rows past the end zeroed where
  EXCL; the rows' terms plus e, and the columns' sums of e."""
  b = gl.expand_dims(st_rows.index(r).load(gl.SliceLayout(1, layout)), 1)
  e = gl.exp2((s * b) * gl.expand_dims(a_s, 0) + neg_shift)
  if EXCL:
    e = gl.where(keep, e, 0.0)
  return terms + e, gl.sum(e, axis=1)


@gluon.jit
def _fwd_tile(i, t0, t1, t2, a0s, a1s, a2s, x_smem, y_smem, st_rows, ready, empty, zs, n,
              rows, row_off, col_off, j_lo, ntiles, k0, m, col_ptr, part, P,
              CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr, NT: gl.constexpr,
              EXCL: gl.constexpr):
  """Walk position i: the tile's three prefix dots in one accumulator, each dim's
  epilogue between them, the columns' sums stored as partial row ``part``; the ring
  slot freed after the last wgmma."""
  layout: gl.constexpr = zs.type.layout
  slot = i % NT
  r0 = 8 * (i % 4)   # the tile's statistics block
  cols = j_lo + ((k0 + i) % ntiles) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
  keep = 0
  if EXCL:   # (transposed: columns first)
    keep = off_diagonal(cols, rows, col_off, row_off) & gl.expand_dims(rows < n, 0)
  mbarrier.wait(ready.index(slot), (i // NT) & 1)
  neg_shift = gl.expand_dims(st_rows.index(r0 + 6).load(gl.SliceLayout(1, layout)), 1)
  s = warpgroup_mma(y_smem.index(4 * slot), _xchunk(x_smem, 0, CID, HR), zs, use_acc=False,
                    is_async=True)
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  t0, c0 = _fwd_dim(s, st_rows, r0, a0s, neg_shift, t0, keep, layout, EXCL)
  s = warpgroup_mma(y_smem.index(4 * slot + 1), _xchunk(x_smem, 1, CID, HR), s, is_async=True)
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  t1, c1 = _fwd_dim(s, st_rows, r0 + 1, a1s, neg_shift, t1, keep, layout, EXCL)
  s = warpgroup_mma(y_smem.index(4 * slot + 2), _xchunk(x_smem, 2, CID, HR), s, is_async=True)
  s = warpgroup_mma(y_smem.index(4 * slot + 3), _xchunk(x_smem, 3, CID, HR), s, is_async=True)
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  mbarrier.arrive(empty.index(slot))   # this group is done with the tile's chunks
  t2, c2 = _fwd_dim(s, st_rows, r0 + 2, a2s, neg_shift, t2, keep, layout, EXCL)
  in_cols = cols < m
  gl.store(col_ptr + part * m + cols, c0, mask=in_cols)          # [3 dims, P, m]
  gl.store(col_ptr + (P + part) * m + cols, c1, mask=in_cols)
  gl.store(col_ptr + (2 * P + part) * m + cols, c2, mask=in_cols)
  return t0, t1, t2


@gluon.jit
def _xchunk(x_smem, k: gl.constexpr, CID: gl.constexpr, HR: gl.constexpr):
  """This group's rows of x's chunk k, transposed (a wgmma's B)."""
  return _xrows(x_smem, k, CID, HR).permute((1, 0))


@gluon.jit
def _group_start(scal_ptr, off_ptr, row0, n, ntiles, ndiag, CID: gl.constexpr,
                 BN: gl.constexpr, HR: gl.constexpr):
  """A consumer group's opening, shared by ``_fwd_consumer`` and ``_all4_consumer``: the
  logit scale, the ring blocks' offsets, its rows (and which are in the batch), a zero
  [BN, HR] terms tile, the column partials' count and this group's part of them, and the
  tiles to test (all where rows run past n)."""
  layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HR, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + CID * HR + gl.arange(0, HR, layout=gl.SliceLayout(0, layout))
  zs = gl.zeros([BN, HR], gl.float32, layout=layout)
  ndiag = gl.where(row0 + 2 * HR > n, ntiles, ndiag)   # rows past the end: every tile tested
  return (scale2, row_off, col_off, rows, rows < n, zs, 2 * gl.num_programs(0),
          2 * gl.program_id(0) + CID, ndiag)


@gluon.jit
def _fwd_consumer(x_smem, y_smem, st_rows, x_bar, ready, empty, scal_ptr, off_ptr, xt_ptr, n,
                  m, row0, j_lo, ntiles, k0, ndiag, row_ptr, col_ptr, CID: gl.constexpr,
                  BN: gl.constexpr, HR: gl.constexpr, NT: gl.constexpr):
  """Consumer group CID: rows [row0 + CID HR, + HR) against every tile of the split (see
  the module docstring); at the end the rows' sums of each dim."""
  scale2, row_off, col_off, rows, in_rows, zs, P, part, ndiag = _group_start(
      scal_ptr, off_ptr, row0, n, ntiles, ndiag, CID, BN, HR)
  a0s = gl.load(xt_ptr + rows, mask=in_rows, other=0.0) * scale2
  a1s = gl.load(xt_ptr + n + rows, mask=in_rows, other=0.0) * scale2
  a2s = gl.load(xt_ptr + 2 * n + rows, mask=in_rows, other=0.0) * scale2
  t0, t1, t2 = zs, zs, zs
  mbarrier.wait(x_bar, 0)
  for i in range(0, ndiag):   # the tiles holding the program's self pairs: tested
    t0, t1, t2 = _fwd_tile(i, t0, t1, t2, a0s, a1s, a2s, x_smem, y_smem, st_rows, ready, empty,
                           zs, n, rows, row_off, col_off, j_lo, ntiles, k0, m, col_ptr,
                           part, P, CID, BN, HR, NT, True)
  for i in range(ndiag, ntiles):
    t0, t1, t2 = _fwd_tile(i, t0, t1, t2, a0s, a1s, a2s, x_smem, y_smem, st_rows, ready, empty,
                           zs, n, rows, row_off, col_off, j_lo, ntiles, k0, m, col_ptr,
                           part, P, CID, BN, HR, NT, False)
  gl.store(row_ptr + rows, gl.sum(t0, axis=0), mask=in_rows)          # [3 dims, n]
  gl.store(row_ptr + n + rows, gl.sum(t1, axis=0), mask=in_rows)
  gl.store(row_ptr + 2 * n + rows, gl.sum(t2, axis=0), mask=in_rows)


@gluon.jit
def _small_fwd_kernel(
    x_desc, y_desc,            # TMA descriptors: x [n, >= 256] in [128, 64] blocks, y in
                               # [64, 64] blocks
    s_desc,                    # TMA descriptor: the columns' statistics, ``column_blocks``
    scal_ptr,                  # fp32: scale * log2(e) (the bounded shift: s_desc's row 6)
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    xt_ptr,                    # [3, n] fp32: each dim's prefix inverse norms of x's rows
    n, m, cols_per_split,      # (one split: cols_per_split >= m, a multiple of 64)
    row_ptr,                   # [3, n] fp32: each dim's rows' sums
    col_ptr,                   # [3, 2 n / 128, m] fp32: each dim's columns' sums per
                               # program and consumer group
    NT: gl.constexpr,
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  HR: gl.constexpr = BM // 2
  gl.static_assert(BM == 128)
  row0, j_lo, ntiles, k0, ndiag, x_smem, y_smem, st_smem, st_rows = _tight_start(
      x_desc, y_desc, s_desc, off_ptr, m, cols_per_split, NT)
  x_bar, ready, empty = _tight_barriers(NT)
  gl.warp_specialize([
      (_fwd_consumer, (x_smem, y_smem, st_rows, x_bar, ready, empty, scal_ptr, off_ptr,
                       xt_ptr, n, m, row0, j_lo, ntiles, k0, ndiag, row_ptr, col_ptr, 0, BN,
                       HR, NT)),
      (_fwd_consumer, (x_smem, y_smem, st_rows, x_bar, ready, empty, scal_ptr, off_ptr,
                       xt_ptr, n, m, row0, j_lo, ntiles, k0, ndiag, row_ptr, col_ptr, 1, BN,
                       HR, NT)),
      (_tight_producer, (x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready, empty,
                         row0, j_lo, ntiles, k0, BN, BK, NT)),
  ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------
# ``all4_fwd``: every dim (64, 128, 256, 512) in one walk over the 512 features


DIMS4 = (64, 128, 256, 512)
KCH4 = gl.constexpr(8)   # x's and a tile's chunks
NB4 = 8    # the chunk ring: one tile's chunks, each freed as both groups' wgmma on it is done


@gluon.jit
def _all4_producer(x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready, empty,
                   st_ready, row0, j_lo, ntiles, k0, BN: gl.constexpr, BK: gl.constexpr,
                   NB: gl.constexpr):
  """One warp: x's 512 features once, then each tile in walk order chunk by chunk into the
  ring, and its columns' statistics block into block i % 4 (loaded with the tile's first
  chunk, whose slot is freed only once both groups are at tile i - 1, so past tile i - 4's
  reads)."""
  mbarrier.expect(x_bar, KCH4 * x_desc.block_type.nbytes)
  for k in gl.static_range(KCH4):
    tma.async_load(x_desc, [row0, k * BK], x_bar, x_smem.index(k))
  for i in range(0, ntiles):
    j = j_lo + ((k0 + i) % ntiles) * BN
    for k in gl.static_range(KCH4):
      c = i * KCH4 + k
      slot = c % NB
      mbarrier.wait(empty.index(slot), ((c // NB) & 1) ^ 1)   # fresh: passes
      mbarrier.expect(ready.index(slot), y_desc.block_type.nbytes)
      tma.async_load(y_desc, [j, k * BK], ready.index(slot), y_smem.index(slot))
      if k == 0:
        mbarrier.expect(st_ready.index(i % 4), s_desc.block_type.nbytes)
        tma.async_load(s_desc, [(j // BN) * 8, 0], st_ready.index(i % 4), st_smem.index(i % 4))


@gluon.jit
def _all4_chunk(s, i, k: gl.constexpr, x_smem, y_smem, ready, CID: gl.constexpr,
                HR: gl.constexpr, NB: gl.constexpr, ACC: gl.constexpr = True):
  """Chunk k of walk position i added into S^T (into s where ACC and k > 0; issued, not
  waited for)."""
  c = i * KCH4 + k
  mbarrier.wait(ready.index(c % NB), (c // NB) & 1)
  return warpgroup_mma(y_smem.index(c % NB), _xchunk(x_smem, k, CID, HR), s,
                       use_acc=ACC and k > 0, is_async=True)


@gluon.jit
def _all4_tile(i, t0, t1, t2, t3, a_smem, x_smem, y_smem, st_rows, ready, empty, st_ready, zs,
               n, rows, row_off, col_off, j_lo, ntiles, k0, m, col_ptr, part, P,
               CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr, NB: gl.constexpr,
               EXCL: gl.constexpr, EARLY: gl.constexpr):
  """Walk position i: the tile's four prefix dots in one accumulator (chunk 0; + 1;
  + 2-3; + 4-7), each dim's epilogue (``_fwd_dim``) once its chunks are in, each chunk's
  slot freed as its wgmma completes; the columns' sums stored as partial row ``part``.
  EARLY: two accumulators, so that a group's own wgmmas run under its epilogues: chunk 1
  under dim 64's, chunks 4-7 (the second accumulator) under dim 256's.
  The rows' a_k scale2 are read from shared memory each tile (held in registers, with the
  four terms tiles, they spilled 1416 B)."""
  layout: gl.constexpr = zs.type.layout
  a_layout: gl.constexpr = gl.SliceLayout(0, layout)
  c0 = i * KCH4
  r0 = 8 * (i % 4)   # the tile's statistics block
  cols = j_lo + ((k0 + i) % ntiles) * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
  keep = 0
  if EXCL:   # (transposed: columns first)
    keep = off_diagonal(cols, rows, col_off, row_off) & gl.expand_dims(rows < n, 0)
  mbarrier.wait(st_ready.index(i % 4), (i // 4) & 1)
  neg_shift = gl.expand_dims(st_rows.index(r0 + 6).load(gl.SliceLayout(1, layout)), 1)
  if EARLY:
    s = _all4_chunk(zs, i, 0, x_smem, y_smem, ready, CID, HR, NB)
    sb = _all4_chunk(zs, i, 1, x_smem, y_smem, ready, CID, HR, NB, False)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
  else:
    s = _all4_chunk(zs, i, 0, x_smem, y_smem, ready, CID, HR, NB)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  mbarrier.arrive(empty.index(c0 % NB))
  a = a_smem.index(4 * CID).load(a_layout)
  t0, e0 = _fwd_dim(s, st_rows, r0, a, neg_shift, t0, keep, layout, EXCL)
  if EARLY:
    sb = warpgroup_mma_wait(num_outstanding=0, deps=(sb,))
    s = s + sb
  else:
    s = _all4_chunk(s, i, 1, x_smem, y_smem, ready, CID, HR, NB)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  mbarrier.arrive(empty.index((c0 + 1) % NB))
  a = a_smem.index(4 * CID + 1).load(a_layout)
  t1, e1 = _fwd_dim(s, st_rows, r0 + 1, a, neg_shift, t1, keep, layout, EXCL)
  s = _all4_chunk(s, i, 2, x_smem, y_smem, ready, CID, HR, NB)
  s = _all4_chunk(s, i, 3, x_smem, y_smem, ready, CID, HR, NB)
  if EARLY:   # chunks 4-7 into a second accumulator, under dim 256's epilogue
    for k in gl.static_range(4, KCH4):
      sb = _all4_chunk(sb, i, k, x_smem, y_smem, ready, CID, HR, NB, k > 4)
    s = warpgroup_mma_wait(num_outstanding=5, deps=(s,))
    mbarrier.arrive(empty.index((c0 + 2) % NB))
    s = warpgroup_mma_wait(num_outstanding=4, deps=(s,))
    mbarrier.arrive(empty.index((c0 + 3) % NB))
  else:
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    mbarrier.arrive(empty.index((c0 + 2) % NB))
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(empty.index((c0 + 3) % NB))
  a = a_smem.index(4 * CID + 2).load(a_layout)
  t2, e2 = _fwd_dim(s, st_rows, r0 + 2, a, neg_shift, t2, keep, layout, EXCL)
  if EARLY:
    sb = warpgroup_mma_wait(num_outstanding=0, deps=(sb,))
    for k in gl.static_range(4, KCH4):
      mbarrier.arrive(empty.index((c0 + k) % NB))
    s = s + sb
  else:
    for k in gl.static_range(4, KCH4):
      s = _all4_chunk(s, i, k, x_smem, y_smem, ready, CID, HR, NB)
      if k > 4:   # chunk k - 1's wgmma is done
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        mbarrier.arrive(empty.index((c0 + k - 1) % NB))
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(empty.index((c0 + KCH4 - 1) % NB))
  a = a_smem.index(4 * CID + 3).load(a_layout)
  t3, e3 = _fwd_dim(s, st_rows, r0 + 3, a, neg_shift, t3, keep, layout, EXCL)
  in_cols = cols < m
  gl.store(col_ptr + part * m + cols, e0, mask=in_cols)          # [4 dims, P, m]
  gl.store(col_ptr + (P + part) * m + cols, e1, mask=in_cols)
  gl.store(col_ptr + (2 * P + part) * m + cols, e2, mask=in_cols)
  gl.store(col_ptr + (3 * P + part) * m + cols, e3, mask=in_cols)
  return t0, t1, t2, t3


@gluon.jit
def _all4_consumer(x_smem, y_smem, st_rows, a_all, x_bar, ready, empty, st_ready, scal_ptr,
                   off_ptr, xt_ptr, n, m, row0, j_lo, ntiles, k0, ndiag, row_ptr, col_ptr,
                   CID: gl.constexpr, BN: gl.constexpr, HR: gl.constexpr, NB: gl.constexpr,
                   EARLY: gl.constexpr):
  """``_fwd_consumer`` for the four dims: rows [row0 + CID HR, + HR) against every tile
  of the split, the tiles holding self pairs (or rows past n) first and alone tested."""
  scale2, row_off, col_off, rows, in_rows, zs, P, part, ndiag = _group_start(
      scal_ptr, off_ptr, row0, n, ntiles, ndiag, CID, BN, HR)
  # a_all's rows 4 CID + k: written here, read back each tile by the same threads
  for k in gl.static_range(4):
    a = gl.load(xt_ptr + k * n + rows, mask=in_rows, other=0.0)
    a_all.index(4 * CID + k).store(a * scale2)
  t0, t1, t2, t3 = zs, zs, zs, zs
  mbarrier.wait(x_bar, 0)
  for i in range(0, ndiag):
    t0, t1, t2, t3 = _all4_tile(i, t0, t1, t2, t3, a_all, x_smem, y_smem, st_rows, ready,
                                empty, st_ready, zs, n, rows, row_off, col_off, j_lo, ntiles,
                                k0, m, col_ptr, part, P, CID, BN, HR, NB, True, EARLY)
  for i in range(ndiag, ntiles):
    t0, t1, t2, t3 = _all4_tile(i, t0, t1, t2, t3, a_all, x_smem, y_smem, st_rows, ready,
                                empty, st_ready, zs, n, rows, row_off, col_off, j_lo, ntiles,
                                k0, m, col_ptr, part, P, CID, BN, HR, NB, False, EARLY)
  gl.store(row_ptr + rows, gl.sum(t0, axis=0), mask=in_rows)          # [4 dims, n]
  gl.store(row_ptr + n + rows, gl.sum(t1, axis=0), mask=in_rows)
  gl.store(row_ptr + 2 * n + rows, gl.sum(t2, axis=0), mask=in_rows)
  gl.store(row_ptr + 3 * n + rows, gl.sum(t3, axis=0), mask=in_rows)


@gluon.jit
def _all4_fwd_kernel(
    x_desc, y_desc,            # TMA descriptors: x [n, 512] in [128, 64] blocks, y in [64, 64]
    s_desc,                    # TMA descriptor: the columns' statistics, ``column_blocks4``
    scal_ptr, off_ptr,         # as ``_small_fwd_kernel``'s
    xt_ptr,                    # [4, n] fp32: each dim's prefix inverse norms of x's rows
    n, m, cols_per_split,      # (one split: cols_per_split >= m, a multiple of 64)
    row_ptr,                   # [4, n] fp32: each dim's rows' sums
    col_ptr,                   # [4, 2 n / 128, m] fp32: each dim's columns' sums per
                               # program and consumer group
    NB: gl.constexpr, EARLY: gl.constexpr = False,   # (``_all4_tile``)
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  HR: gl.constexpr = BM // 2
  gl.static_assert(BM == 128 and BK == 64 and BN == 64)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  ntiles, k0, ndiag = _tile_order(row0, gl.load(off_ptr), gl.load(off_ptr + 1), j_lo, j_hi,
                                  BM, BN)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH4, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NB, BN, BK], y_desc.layout)
  st_smem = gl.allocate_shared_memory(s_desc.dtype, [4, 8, BN], s_desc.layout)
  st_rows = st_smem.reinterpret(s_desc.dtype, [4 * 8, BN],
                                gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
  a_all = gl.allocate_shared_memory(gl.float32, [8, HR],   # [group, dim]: a_k scale2
                                    gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
  x_bar, ready, empty = _tight_barriers(NB)
  st_ready = mbarrier.allocate_mbarrier(batch=4)
  for i in gl.static_range(4):
    mbarrier.init(st_ready.index(i), count=1)
  gl.warp_specialize([
      (_all4_consumer, (x_smem, y_smem, st_rows, a_all, x_bar, ready, empty, st_ready,
                        scal_ptr, off_ptr, xt_ptr, n, m, row0, j_lo, ntiles, k0, ndiag, row_ptr,
                        col_ptr, 0, BN, HR, NB, EARLY)),
      (_all4_consumer, (x_smem, y_smem, st_rows, a_all, x_bar, ready, empty, st_ready,
                        scal_ptr, off_ptr, xt_ptr, n, m, row0, j_lo, ntiles, k0, ndiag, row_ptr,
                        col_ptr, 1, BN, HR, NB, EARLY)),
      (_all4_producer, (x_desc, y_desc, s_desc, x_smem, y_smem, st_smem, x_bar, ready, empty,
                        st_ready, row0, j_lo, ntiles, k0, BN, BK, NB)),
  ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def dims_of(variant):
  """The dims a variant sums: the three small ones, or with 512 (``all4_*``, ``library4``)."""
  return DIMS4 if variant.startswith("all4") or variant == "library4" else DIMS


def column_blocks4(yt, shift):
  """``all4_fwd``'s column statistics (``stat_blocks``): per tile of 64 columns the rows
  b_0 .. b_3, 0, 0, -shift (-inf past m), 0."""
  return stat_blocks(jnp.concatenate([yt, jnp.zeros((2, yt.shape[1]), yt.dtype)]), shift)


def launch(x, y, scale2, xt, yt, variant):
  """Each dim's rows' and columns' sums, [dims, n] and [dims, m]."""
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, m = x.shape[0], y.shape[0]
  f32 = jnp.float32
  scal = jnp.stack([scale2, scale2 - BOUND_HEADROOM, jnp.zeros((), f32)])
  if variant.startswith("library"):   # stats_gluon's kernel on each dim's normalized prefix
    rows, cols = [], []
    for k, d in enumerate(dims_of(variant)):
      xk = (x[:, :d].astype(f32) * xt[k, :, None]).astype(x.dtype)
      yk = (y[:, :d].astype(f32) * yt[k, :, None]).astype(y.dtype)
      bm, bn, bk = stats_gluon.BLOCK_M, stats_gluon.BLOCK_N, stats_gluon.BLOCK_K
      dummy = jnp.zeros((1,), f32)
      one = jax.ShapeDtypeStruct((1,), f32)
      row_part, col_part, _, _ = _compat.triton_call(
          _compat.Tiles(xk, (bm, min(bk, d)), gluon=True),
          _compat.Tiles(yk, (bn, min(bk, d)), gluon=True), scal, dummy,
          jnp.zeros((3,), jnp.int32), dummy, dummy, n, m, -(-m // bn) * bn,
          kernel=stats_gluon._lse_fwd_gluon_kernel,
          out_shapes=[jax.ShapeDtypeStruct((2, -(-n // bm) * bm), f32),   # (as the library:
                      jax.ShapeDtypeStruct((-(-n // bm), m), f32), one, one],   # whole tiles)
          grid=(-(-n // bm), 1), name=f"small_fwd_library_{d}", num_warps=4, num_stages=1, D=d,
          ROW_THR=False, EXCLUDE_SELF=True, TWO_SIDED=True, HAS_MASK=False, WANT_MAX=False)
      rows.append(jnp.sum(row_part, 0)[:n])
      cols.append(jnp.sum(col_part, 0))
    return jnp.stack(rows), jnp.stack(cols)
  xd = jt.TensorDescriptor.from_array(x, (BM, BK), layout=layout((BM, BK)))
  yd = jt.TensorDescriptor.from_array(y, (BN, BK), layout=layout((BN, BK)))
  if variant.startswith("all4"):
    kernel, consts = _all4_fwd_kernel, dict(NB=NB4, EARLY=variant == "all4_fwd_early")
    blocks = column_blocks4(yt, scal[1])
  else:
    kernel, consts = _small_fwd_kernel, dict(NT=NT)
    blocks = column_blocks(yt, jnp.zeros_like(yt), scal[1])
  k = len(dims_of(variant))
  rows, cols = _compat.triton_call(
      xd, yd, jt.TensorDescriptor.from_array(blocks, (8, BN), layout=STATS_LAYOUT), scal,
      jnp.zeros((2,), jnp.int32), xt.reshape(-1), n, m, -(-m // BN) * BN, kernel=kernel,
      out_shapes=[jax.ShapeDtypeStruct((k, n), f32),
                  jax.ShapeDtypeStruct((k, 2 * -(-n // BM), m), f32)],
      grid=(-(-n // BM), 1), name=f"gluon_{variant}", num_warps=4, num_stages=1, **consts)
  return rows, jnp.sum(cols, axis=1)


def reference(x, y, scale2, xt, yt, rows, dims=DIMS):
  """Each dim's sums over the first ``rows`` rows and columns in float32 jnp, [dims, rows]
  each, the self pairs left out."""
  f32 = jnp.float32
  shift = scale2 - BOUND_HEADROOM
  out_r, out_c = [], []
  for k, d in enumerate(dims):
    def sums(a, b, at, bt):
      s = jnp.dot(a[:rows, :d].astype(f32), b[:, :d].astype(f32).T,
                  precision=jax.lax.Precision.HIGHEST) * at[:rows, None] * bt[None, :]
      e = jnp.exp2(s * scale2 - shift)
      return jnp.sum(e.at[jnp.arange(rows), jnp.arange(rows)].set(0.0), 1)
    out_r.append(sums(x, y, xt[k], yt[k]))
    out_c.append(sums(y, x, yt[k], xt[k]))
  return jnp.stack(out_r), jnp.stack(out_c)


def run(a):
  n = a.batch
  path = compiled_via()
  x, y = clip_pairs(jax.random.key(0), n, 512)
  r = n - RAGGED   # the check's rows and columns: neither a whole number of tiles
  for variant in a.variants.split(","):
    dims = dims_of(variant)
    xt, yt = prefixes(x, y, dims)

    def body(row, variant=variant, dims=dims, xt=xt, yt=yt):
      fn = jax.jit(lambda *v: launch(*v, variant))
      for scale2, timed in ((LOG2E / 0.5, False), (LOG2E / 0.07, True)):
        s2 = jnp.asarray(scale2, jnp.float32)
        if not timed:
          got = fn(x[:r], y[:r], s2, xt[:, :r], yt[:, :r])
          want = reference(x[:r], y[:r], s2, xt[:, :r], yt[:, :r], CHECK_ROWS, dims)
          err = max(float(jnp.max(jnp.abs(g[:, :CHECK_ROWS] - w) / w)) for g, w in zip(got, want))
          bad = not np.isfinite(err) or err > 2e-2
          row.update(err=err if np.isfinite(err) else str(err), wrong=bool(bad))
        else:
          ms = statistics.median(time_jax(fn, x, y, s2, xt, yt, reps=a.reps))
          row.update(ms=round(ms, 4))

    guarded(dict(bench="gluon_small_fwd", variant=variant, batch=n, dim=dims[-1], ms=None, err=None,
                 wrong=None, note=f"compiled via {path}"), a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile for sm_90


VARIANTS = {v: (lambda d, v=v: d == dims_of(v)[-1],)   # (``--compile-only``: the largest dim)
            for v in ("library3", "small3_fwd", "library4", "all4_fwd", "all4_fwd_early")}


def compile_only(a):
  a.dims = "256,512"

  def build(variant, d):
    if variant.startswith("library"):   # its kernel at the largest dim (the smaller alike)
      from benchmarks._gluon import compile_library_forward  # pylint: disable=g-import-not-at-top
      return compile_library_forward("bfloat16", dict(
          D=d, ROW_THR=False, EXCLUDE_SELF=True, TWO_SIDED=True, HAS_MASK=False,
          WANT_MAX=False)), 4, {}
    desc = lambda r: f"tensordesc<bf16[{r},{BK}],{layout((r, BK))!r}>"
    sig = dict(x_desc=desc(BM), y_desc=desc(BN), s_desc=f"tensordesc<fp32[8,{BN}],"
               f"{STATS_LAYOUT!r}>", scal_ptr="*fp32", off_ptr="*i32", xt_ptr="*fp32",
               n="i32", m="i32", cols_per_split="i32", row_ptr="*fp32", col_ptr="*fp32")
    ptrs = [k for k, v in sig.items() if v.startswith(("*", "tensordesc"))]
    if variant.startswith("all4"):
      return compile_sm90(_all4_fwd_kernel, sig, ptrs,
                          dict(NB=NB4, EARLY=variant == "all4_fwd_early"), 4, 1), 4, {}
    return compile_sm90(_small_fwd_kernel, sig, ptrs, dict(NT=NT), 4, 1), 4, {}
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
