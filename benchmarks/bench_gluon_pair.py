"""Whether one Gluon gradient pass for two Matryoshka dims, (D / 2, D), costs little more
than the plain pass at D (Hopper sm_90; jax-triton >= 0.4, Triton >= 3.9; bf16).

bench_gluon_mrl.py's fused pass for all four dims (64 / 128 / 256 / 512) costs 3.5x a
plain pass: its 64 x 64 tiles and four epilogues on them (docs/notes/matryoshka.md).
Two dims whose prefix is half the features fit the library kernel's own shape
(``grad_gluon``: 64 rows resident, 128-column tiles, two consumer groups that each own
half of dx's features), because the smaller dim's segment is exactly group 0's half:

  dx_i[:D/2] = sum_j (c^1_ij + c^0_ij a_i b_j) y_j[:D/2],  dx_i[D/2:] = sum_j c^1_ij y_j[D/2:]
  cs_k,i = sum_j c^k_ij s^k_ij

with s^1 = <x_i, y_j> (unit rows), s^0 = a_i b_j <x_i, y_j>_{:D/2} (a, b: the half
prefixes' inverse norms) and c^k = 2^(min(z^k - t_k, 8)) (g^k_r,i + g^k_c,j)
(``coefficient``'s SHARED form). So the pass has one plain pass's GEMM work and two
epilogues: the prefix dot's (chunks [0, KCH / 2)) under the wgmmas of the other half,
then the whole dot's. Group 0 multiplies P_lo = c^1 + c^0 a b into its features, group
1 P_hi = c^1 into its. A pair (256, 512) and a pair (64, 128) would replace four per-dim
gradient passes by two.

Variants (D = 512 and 256 with 128-feature chunks; D = 128 with 64-feature chunks;
128-column tiles unless named ``_n64``):

- ``plain``: the library's Gluon pass at D = 512 (one dim), the cost to beat.
- ``pair``: this file's kernel, the column statistics of both dims loaded before the
  tile's wgmmas; ``pair_late``: the whole dot's loaded after the prefix's epilogue;
  ``pair_pack``, ``pair_late_pack``: c^0 a b held in bf16 until P_lo (16 registers
  instead of 32; a per-dim pass rounds it too).
- ``pair_n64``, ``pair_n64_plain``: 64-column tiles (a ring of eight [64, 128] chunks,
  two sets of P): the one shape at D = 512 that ptxas fits without spilling (8 B; the
  128-column pair spills 1.6-2.1 KB a thread).
- ``one``, ``one_n64``: the same kernel with dim 1 alone (the plain pass's gradient,
  checked against it): what the second epilogue costs.
- ``indep``, ``indep_one`` (D = 128): independent consumer groups, each taking every
  other 64-column tile whole with its own P and all of dx's features (two [64, 64]
  accumulators; fp32 partials summed after the kernel), so that neither waits on the
  other (``_indep_bwd_kernel``).
- ``one_n64_pipe``, ``pair_n64_pipe`` (D = 512, 256, 128): ``one_n64`` / ``pair_n64``
  software-pipelined across tiles (``_pipe_consumer``): each group issues the next
  tile's S wgmmas before this tile's epilogue, so they run under it, and waits for them
  with its P @ y (FlashAttention-3's intra-warpgroup overlap). The ring holds two tiles
  at D = 512 (so a tile's load has no slack: it starts when the tile two back is freed)
  and four below. sm_90 builds: one_n64_pipe spills 240 B at D = 512 (the x chunks'
  wgmma descriptors, hoisted), pair_n64_pipe 1296 B; none at 256 and 128.
- ``one_peel``, ``one_n64_pipe_peel``, ``pair_n64_pipe_peel``: the self pairs' test in a
  branch of its own, taken on diagonal tiles only (``_coef``'s PEEL). In the Gluon
  kernels ``coefficient``'s ``drop_pairs`` branch is predicated into every tile (its
  ISETP and FSEL issued on all of them; the Triton kernels keep it a branch): the
  library's CLIP pass runs 886 instructions a tile with it, 765 without any self test
  (``compile_library_gradient`` with EXCLUDE_SELF off), the path a peeled kernel takes
  off the diagonal. sm_90 spills: ``one_peel`` 384 B at D = 512 (``one`` 76),
  ``one_n64_pipe_peel`` 300 (240).

Measured (one H200, B = 65536, jax-triton 0.4.1 + Triton 3.9; h200_gluon_pair.csv,
2026-12-04): at D = 512 ``plain`` 15.88 ms, ``one`` 15.34, ``one_n64`` 17.23,
``pair_n64`` 22.75 (run 3; ``pair`` 45.17 with its spills, run 1): the second dim adds
5.5 ms, and the pair saves 0.6 ms against the plain pass plus a per-dim D = 256 pass
(15.88 + about 7.45, half of CLIP's two at D = 256 in h200_jt04_mrl_profile.txt). At
D = 128: ``one`` 8.05, ``pair_late`` 14.69: 6.6 ms for the second dim, and the pair
slower than the two per-dim Triton passes it would replace (about 4.7 + 3.1, the same
file). The pairs are within 3.2e-3 of float32. An epilogue not hidden under a GEMM
costs 5-7 ms a pass here, 2-3x its instructions' issue time (8 consumer warps an SM):
docs/notes/matryoshka.md. Independent groups (runs 7-8, D = 128): one dim 5.71 ms
against 8.11 with a shared P, but the pair 15.33 (15.01 shared): the second epilogue
costs more, not less; the per-dim Triton passes in run 7's profile 4.67 + 3.07
(h200_jt04_clip_d128_d64_profile.txt).

Pipelined and peeled (2026-12-05, the same machine and stack, every variant within
3.4e-3 of float32): at D = 512 ``plain`` 16.13 ms, ``one`` 15.87, ``one_peel`` 17.75,
``one_n64`` 17.57, ``one_n64_pipe`` 23.12, ``one_n64_pipe_peel`` 24.30, ``pair_n64``
23.11, ``pair_n64_pipe`` 56.12: at D = 512 pipelining (a two-tile ring, spills) and
peeling (spills) both lose. At D = 256 ``one_n64`` 11.68 -> ``one_n64_pipe`` 10.41,
``pair_n64`` 22.32 -> 16.90; at D = 128 8.96 -> 7.55 and 16.63 -> 14.21: pipelining
saves 11-24% there, but the pairs stay slower than the per-dim Triton passes they would
replace (7.45 + 4.7 at dims 128 / 256, 4.7 + 3.1 at 64 / 128).

Why pipelining (the sm_90 SASS, ``--compile-only``'s ``tile_loops``: instructions in one
consumer's column-tile loop): each pass measured above is about its GEMM time at 790
TFLOP/s plus its consumers' issue time (two warps a scheduler, 1.98 GHz), not the larger
of the two. D = 512: plain 886-923 instructions a 64 x 128 tile, 11.1 + 3.6 = 14.8 ms
against 15.88; one_n64 595-607 a 64 x 64 tile, 11.1 + 4.8 = 15.9 against 17.23; pair_n64
970-1030, 11.1 + 8.0 = 19.1 against 22.75. D = 128: indep_one 608-610, 2.8 + 2.4 = 5.2
against 5.71; the pairs exceed the sum by 7 ms (pair_late 1207-1230 instructions: 7.7
against 14.7-15.0; indep 1403-1454: 8.5 against 15.33). The groups wait on their wgmmas
and on each other with nothing else to issue.

Each is checked against float32 jnp on the first 512 rows (dx's error over max |dx|,
cs's likewise; wrong over 2e-2 or NaN) at a logit scale of 1 / 0.5, then timed at
1 / 0.07 (median of --reps):

  python benchmarks/bench_gluon_pair.py --batch 65536 --reps 10
  python benchmarks/bench_gluon_pair.py --compile-only
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
from benchmarks.bench_gluon_mrl import CHECK_ROWS, LOG2E, reference_one
from memeff_jax import _compat
from memeff_jax.backends.triton import grad_gluon
from memeff_jax.backends.triton._common import coefficient, on_diagonal, row_stats
from memeff_jax.backends.triton.stats_gluon import producer

BM, BN = 64, 128
CHUNK = {512: 128, 256: 128, 128: 64}    # features a ring chunk


@gluon.jit
def _start(scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, BM: gl.constexpr,
           SN: gl.constexpr, BK: gl.constexpr):
  """What a consumer starts from: scale2, the offsets, the program's rows, their
  statistics (dim 0: a, t, g_r; dim 1: t, g_r), and zeros for the sums of c s, an S
  tile [BM, SN] and a dx accumulator [BM, BK] (wgmma layouts)."""
  s_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, SN, 16])
  o_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
  in_rows = rows < n
  t0, g_r0, _ = row_stats(t_ptr, g_r_ptr, t_ptr, rows, in_rows, BM, True, False)
  t1, g_r1, _ = row_stats(t_ptr + n, g_r_ptr + n, t_ptr, rows, in_rows, BM, True, False)
  return (gl.load(scal_ptr), gl.load(off_ptr), gl.load(off_ptr + 1), rows, in_rows,
          gl.load(xt_ptr + rows, mask=in_rows, other=0.0), t0, g_r0, t1, g_r1,
          gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout)),
          gl.zeros([BM, SN], gl.float32, layout=s_layout),
          gl.zeros([BM, BK], gl.float32, layout=o_layout))


@gluon.jit
def _chunk(y_smem, ready, pos, CID: gl.constexpr, HALF: gl.constexpr, NB: gl.constexpr):
  """This group's half of the ring chunk at ``pos``, once loaded (a wgmma's B)."""
  mbarrier.wait(ready.index(pos % NB), (pos // NB) & 1)
  return y_smem.index(pos % NB).slice(CID * HALF, HALF, dim=0).permute((1, 0))


@gluon.jit
def _ring_barriers(NB: gl.constexpr, NP: gl.constexpr):
  """The mbarriers of a two-consumer kernel, initialized: x loaded; each of NB ring chunks
  ready and empty (freed by the other group's S and its owner's P @ y); each of NP P sets
  full (both halves written) and free (both groups' P @ y done)."""
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NB)
  empty = mbarrier.allocate_mbarrier(batch=NB)
  p_full = mbarrier.allocate_mbarrier(batch=NP)
  p_free = mbarrier.allocate_mbarrier(batch=NP)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NB):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=2)
  for i in gl.static_range(NP):
    mbarrier.init(p_full.index(i), count=2)
    mbarrier.init(p_free.index(i), count=2)
  return x_bar, ready, empty, p_full, p_free


@gluon.jit
def _coef(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t, g_r, g_c, scal_ptr,
          BM: gl.constexpr, SN: gl.constexpr, PEEL: gl.constexpr = False):
  """One dim's coefficients on its cosines s [BM, SN] (``coefficient``'s SHARED form, both
  roles on the shift t, self pairs dropped) and the rows' sums of c s. PEEL: the self
  pairs' test in a branch of its own, taken on diagonal tiles only (``coefficient``'s
  ``drop_pairs`` branch is small enough that the compiler predicates its test and
  selects into every tile: 121 of the library pass's 886 instructions a tile, sm_90)."""
  if PEEL:
    if on_diagonal(row0, col0, row_off, col_off, BM, SN):
      c = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t, g_r, 0.0,
                      0.0, g_c, 0.0, scal_ptr, scal_ptr, BM, SN, True, True, False, False, True,
                      False, True)
    else:
      c = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t, g_r, 0.0,
                      0.0, g_c, 0.0, scal_ptr, scal_ptr, BM, SN, True, True, False, False,
                      False, False, True)
  else:
    c = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t, g_r, 0.0,
                    0.0, g_c, 0.0, scal_ptr, scal_ptr, BM, SN, True, True, False, False, True,
                    False, True)
  return c, gl.sum(c * s, axis=1)


@gluon.jit
def _store(dx_ptr, cs_ptr, scal_ptr, acc0, acc1, cs0, cs1, n, row0, rows, in_rows,
           CID: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, D: gl.constexpr,
           NOC: gl.constexpr):
  """A consumer's outputs: its NOC chunks of dx's features (times scale g_max) and its
  two dims' sums of c s (times g_max) into cs [2 dims, 2 groups, n]."""
  out_mult = gl.load(scal_ptr + 1)
  o_layout: gl.constexpr = acc0.type.layout
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
  feats = CID * NOC * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, o_layout))
  at = dx_ptr + gl.expand_dims(orows, 1).to(gl.int64) * D + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < D, 0)
  ty = dx_ptr.dtype.element_ty
  gl.store(at, (acc0 * out_mult).to(ty), mask=keep)
  if NOC == 2:
    gl.store(at + BK, (acc1 * out_mult).to(ty), mask=keep)
  cs_mult = gl.load(scal_ptr + 2)
  gl.store(cs_ptr + CID * n + rows, cs0 * cs_mult, mask=in_rows)
  gl.store(cs_ptr + (2 + CID) * n + rows, cs1 * cs_mult, mask=in_rows)


@gluon.jit
def _pair_consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                   off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo, j_hi,
                   dx_ptr, cs_ptr, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                   BK: gl.constexpr, D: gl.constexpr, KCH: gl.constexpr, NB: gl.constexpr,
                   NP: gl.constexpr, LATE: gl.constexpr, PACK: gl.constexpr,
                   SINGLE: gl.constexpr, PEEL: gl.constexpr):
  """Consumer group CID: S for the columns [CID HALF, + HALF) of each tile, as the
  prefix dot (chunks [0, NOC)) and the whole dot on top of it; dim 0's coefficients on
  the prefix while the rest of the walk runs, dim 1's on the whole; P_lo and P_hi (its
  half of the columns); then its half of dx's features += P_CID @ y."""
  HALF: gl.constexpr = BN // 2
  NOC: gl.constexpr = KCH // 2
  scale2, row_off, col_off, rows, in_rows, a0, t0, g_r0, t1, g_r1, cs0, zs, acc0 = _start(
      scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, BM, HALF, BK)
  cs1, acc1 = cs0, acc0
  s_layout: gl.constexpr = zs.type.layout
  mbarrier.wait(x_bar, 0)
  it = 0   # ring position of the tile's first chunk
  t = 0    # tile count (P set t % NP)
  for j in range(j_lo, j_hi, BN):
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, s_layout))
    in_cols = cols < m
    b0 = gl.load(yt_ptr + cols, mask=in_cols, other=0.0)
    g_c0 = gl.load(g_c_ptr + cols, mask=in_cols, other=0.0)
    if not LATE:
      g_c1 = gl.load(g_c_ptr + m + cols, mask=in_cols, other=0.0)
    lo = zs
    for k in gl.static_range(NOC):   # the prefix dot
      lo = warpgroup_mma(x_smem.index(k), _chunk(y_smem, ready, it + k, CID, HALF, NB), lo,
                         use_acc=k > 0, is_async=True)
    lo = warpgroup_mma_wait(num_outstanding=0, deps=(lo,))
    if CID == 1:   # group 0's chunks: this group's S use is over
      for k in gl.static_range(NOC):
        mbarrier.arrive(empty.index((it + k) % NB))
    full = lo
    for k in gl.static_range(NOC, KCH):   # the rest, in flight under dim 0's epilogue
      full = warpgroup_mma(x_smem.index(k), _chunk(y_smem, ready, it + k, CID, HALF, NB),
                           full, use_acc=True, is_async=True)
    if not SINGLE:
      s0 = lo * gl.expand_dims(a0, 1) * gl.expand_dims(b0, 0)
      c0, add = _coef(s0, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t0, g_r0,
                      g_c0, scal_ptr, BM, HALF, PEEL)
      cs0 += add
      w0 = c0 * gl.expand_dims(a0, 1) * gl.expand_dims(b0, 0)
      if PACK:   # held as bf16 until P_lo (its own rounding, as a per-dim pass rounds it)
        w0 = w0.to(p_smem.dtype)
    if LATE:
      g_c1 = gl.load(g_c_ptr + m + cols, mask=in_cols, other=0.0)
    full = warpgroup_mma_wait(num_outstanding=0, deps=(full,))
    if CID == 0:   # group 1's chunks
      for k in gl.static_range(NOC, KCH):
        mbarrier.arrive(empty.index((it + k) % NB))
    c1, add = _coef(full, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t1, g_r1,
                    g_c1, scal_ptr, BM, HALF, PEEL)
    cs1 += add
    pb = t % NP
    mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
    p_smem.index(2 * pb + 1).slice(CID * HALF, HALF, dim=1).store(c1.to(p_smem.dtype))
    if SINGLE:   # (a timing bound: dim 1 alone, P_lo = P_hi)
      p_smem.index(2 * pb).slice(CID * HALF, HALF, dim=1).store(c1.to(p_smem.dtype))
    else:
      p_smem.index(2 * pb).slice(CID * HALF, HALF, dim=1).store(
          (c1 + w0.to(gl.float32)).to(p_smem.dtype))
    fence_async_shared()
    mbarrier.arrive(p_full.index(pb))
    mbarrier.wait(p_full.index(pb), (t // NP) & 1)        # both halves of both P written
    p = p_smem.index(2 * pb + CID)
    acc0 = warpgroup_mma(p, y_smem.index((it + CID * NOC) % NB), acc0, is_async=True)
    if NOC == 2:
      acc1 = warpgroup_mma(p, y_smem.index((it + CID * NOC + 1) % NB), acc1, is_async=True)
      acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
    else:
      acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
    for i in gl.static_range(NOC):
      mbarrier.arrive(empty.index((it + CID * NOC + i) % NB))
    mbarrier.arrive(p_free.index(pb))
    it += KCH
    t += 1
  _store(dx_ptr, cs_ptr, scal_ptr, acc0, acc1, cs0, cs1, n, row0, rows, in_rows, CID, BM, BK,
         D, NOC)


@gluon.jit
def _walk(x_smem, y_smem, ready, it, lo, hi, CID: gl.constexpr, HALF: gl.constexpr,
          KCH: gl.constexpr, NB: gl.constexpr, SPLIT: gl.constexpr):
  """Issue the S wgmmas of the tile at ring position ``it`` (this group's half of its
  columns), none waited for: SPLIT, the prefix chunks [0, KCH / 2) into lo and the rest
  into hi (the prefix dot is lo, the whole dot lo + hi); else every chunk into lo."""
  for k in gl.static_range(KCH):
    b = _chunk(y_smem, ready, it + k, CID, HALF, NB)
    if SPLIT and k >= KCH // 2:
      hi = warpgroup_mma(x_smem.index(k), b, hi, use_acc=k > KCH // 2, is_async=True)
    else:
      lo = warpgroup_mma(x_smem.index(k), b, lo, use_acc=k > 0, is_async=True)
  return lo, hi


@gluon.jit
def _free_others(empty, it, CID: gl.constexpr, KCH: gl.constexpr, NB: gl.constexpr):
  """This group's S of the tile at ring position ``it`` is done: free the other group's
  chunks of it (their owner frees them again after its P @ y)."""
  for k in gl.static_range(KCH):
    if k // (KCH // 2) != CID:
      mbarrier.arrive(empty.index((it + k) % NB))


@gluon.jit
def _pipe_consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                   off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo, j_hi,
                   dx_ptr, cs_ptr, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                   BK: gl.constexpr, D: gl.constexpr, KCH: gl.constexpr, NB: gl.constexpr,
                   NP: gl.constexpr, SINGLE: gl.constexpr, PEEL: gl.constexpr):
  """``_pair_consumer`` software-pipelined across tiles: the next tile's S wgmmas are
  issued before this tile's epilogue, so they run under it (FlashAttention-3's
  intra-warpgroup overlap); the ring must hold two tiles. The tile's column statistics
  are loaded before the wgmmas that precede its epilogue. SINGLE: dim 1 alone, one P for
  both groups (the plain pass's work, for timing)."""
  HALF: gl.constexpr = BN // 2
  NOC: gl.constexpr = KCH // 2
  scale2, row_off, col_off, rows, in_rows, a0, t0, g_r0, t1, g_r1, cs0, zs, acc0 = _start(
      scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, BM, HALF, BK)
  cs1, acc1 = cs0, acc0
  s_layout: gl.constexpr = zs.type.layout
  mbarrier.wait(x_bar, 0)
  lo, hi = _walk(x_smem, y_smem, ready, 0, zs, zs, CID, HALF, KCH, NB, not SINGLE)
  if SINGLE:
    lo = warpgroup_mma_wait(num_outstanding=0, deps=(lo,))
  else:
    lo, hi = warpgroup_mma_wait(num_outstanding=0, deps=(lo, hi))
  _free_others(empty, 0, CID, KCH, NB)
  it = 0   # ring position of the tile's first chunk
  t = 0    # tile count (P set t % NP)
  for j in range(j_lo, j_hi, BN):
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, s_layout))
    in_cols = cols < m
    g_c1 = gl.load(g_c_ptr + m + cols, mask=in_cols, other=0.0)
    if not SINGLE:
      b0 = gl.load(yt_ptr + cols, mask=in_cols, other=0.0)
      g_c0 = gl.load(g_c_ptr + cols, mask=in_cols, other=0.0)
    # the next tile's S (past the split's end: the producer's extra tile, discarded)
    lo_n, hi_n = _walk(x_smem, y_smem, ready, it + KCH, zs, zs, CID, HALF, KCH, NB,
                       not SINGLE)
    if SINGLE:
      full = lo
    else:
      ab = gl.expand_dims(a0, 1) * gl.expand_dims(b0, 0)
      s0 = lo * ab
      c0, add = _coef(s0, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t0, g_r0,
                      g_c0, scal_ptr, BM, HALF, PEEL)
      cs0 += add
      w0 = (c0 * ab).to(p_smem.dtype)   # held in bf16, as a per-dim pass rounds it
      full = lo + hi
    c1, add = _coef(full, scale2, row0, col0, rows, cols, row_off, col_off, n, m, t1, g_r1,
                    g_c1, scal_ptr, BM, HALF, PEEL)
    cs1 += add
    pb = t % NP
    mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
    p_smem.index(2 * pb + 1).slice(CID * HALF, HALF, dim=1).store(c1.to(p_smem.dtype))
    if not SINGLE:
      p_smem.index(2 * pb).slice(CID * HALF, HALF, dim=1).store(
          (c1 + w0.to(gl.float32)).to(p_smem.dtype))
    fence_async_shared()
    mbarrier.arrive(p_full.index(pb))
    mbarrier.wait(p_full.index(pb), (t // NP) & 1)        # both halves written
    if SINGLE:
      p = p_smem.index(2 * pb + 1)
    else:
      p = p_smem.index(2 * pb + CID)
    acc0 = warpgroup_mma(p, y_smem.index((it + CID * NOC) % NB), acc0, is_async=True)
    if NOC == 2:
      acc1 = warpgroup_mma(p, y_smem.index((it + CID * NOC + 1) % NB), acc1, is_async=True)
    if SINGLE:
      lo, acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(lo_n, acc0, acc1))
    else:
      lo, hi, acc0, acc1 = warpgroup_mma_wait(num_outstanding=0,
                                              deps=(lo_n, hi_n, acc0, acc1))
    for i in gl.static_range(NOC):
      mbarrier.arrive(empty.index((it + CID * NOC + i) % NB))
    mbarrier.arrive(p_free.index(pb))
    _free_others(empty, it + KCH, CID, KCH, NB)
    it += KCH
    t += 1
  _store(dx_ptr, cs_ptr, scal_ptr, acc0, acc1, cs0, cs1, n, row0, rows, in_rows, CID, BM, BK,
         D, NOC)


@gluon.jit
def _pair_bwd_kernel(
    x_desc, y_desc,            # TMA descriptors: x [n, D] in [BM, BK] blocks, y [m, D] in
                               # [BN, BK] blocks; unit rows
    scal_ptr,                  # [4] fp32: scale * log2(e), scale * g_max, g_max, (unused)
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    xt_ptr, yt_ptr,            # [n], [m] fp32: the half prefixes' inverse norms (dim 0)
    t_ptr, g_r_ptr,            # [2, n] fp32: each dim's shift t and g_r 2^(t - lse_r)
    g_c_ptr,                   # [2, m] fp32: each dim's g_c 2^(t - lse_c)
    n, m, cols_per_split,
    dx_ptr,                    # [n, D]
    cs_ptr,                    # [2 dims, 2 groups, n] fp32
    D: gl.constexpr, NP: gl.constexpr,  # NP: sets of (P_lo, P_hi)
    LATE: gl.constexpr = False, PACK: gl.constexpr = False,
    NB: gl.constexpr = 4,               # ring chunks (a whole tile at D = 512)
    SINGLE: gl.constexpr = False,
    PIPE: gl.constexpr = False,         # _pipe_consumer (the ring: two tiles)
    PEEL: gl.constexpr = False,         # the self pairs' test on diagonal tiles only (_coef)
):
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  gl.static_assert(KCH * BK == D and KCH % 2 == 0 and KCH <= NB)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NB, BN, BK], y_desc.layout)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [2 * NP, BM, BN], p_layout)
  x_bar, ready, empty, p_full, p_free = _ring_barriers(NB, NP)
  if PIPE:   # (the producer loads one tile past the split: the consumers' last S is ahead)
    gl.warp_specialize([
        (_pipe_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                          scal_ptr, off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m,
                          row0, j_lo, j_hi, dx_ptr, cs_ptr, 0, BM, BN, BK, D, KCH, NB, NP,
                          SINGLE, PEEL)),
        (_pipe_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free,
                          scal_ptr, off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m,
                          row0, j_lo, j_hi, dx_ptr, cs_ptr, 1, BM, BN, BK, D, KCH, NB, NP,
                          SINGLE, PEEL)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo,
                    j_hi + BN, BN, BK, KCH, NB)),
    ], [4, 1], [240, 24])
  else:
    gl.warp_specialize([
        (_pair_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                          off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo,
                          j_hi, dx_ptr, cs_ptr, 0, BM, BN, BK, D, KCH, NB, NP, LATE, PACK, SINGLE,
                          PEEL)),
        (_pair_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                          off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo,
                          j_hi, dx_ptr, cs_ptr, 1, BM, BN, BK, D, KCH, NB, NP, LATE, PACK, SINGLE,
                          PEEL)),
        (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                    BK, KCH, NB)),
    ], [4, 1], [240, 24])


@gluon.jit
def _indep_consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_bar, scal_ptr, off_ptr,
                    xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo, j_hi, dx_ptr,
                    cs_ptr, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    BK: gl.constexpr, D: gl.constexpr, NB: gl.constexpr,
                    SINGLE: gl.constexpr):
  """Consumer group CID of the independent form (D = 2 BK): the column tiles CID, CID + 2,
  ... whole, S [BM, BN] as the prefix dot (chunk 0) and the whole dot on top of it, its
  own P_lo and P_hi, and all of dx's features for its tiles (two [BM, BK] accumulators),
  stored as its own partial [2 groups, n, D] (fp32; summed by the caller). No group
  waits on the other: one group's epilogue can run under the other's wgmmas."""
  scale2, row_off, col_off, rows, in_rows, a0, t0, g_r0, t1, g_r1, cs0, zs, acc0 = _start(
      scal_ptr, off_ptr, xt_ptr, t_ptr, g_r_ptr, n, row0, BM, BN, BK)
  cs1, acc1 = cs0, acc0
  s_layout: gl.constexpr = zs.type.layout
  o_layout: gl.constexpr = acc0.type.layout
  bar = p_bar.index(CID)
  mbarrier.wait(x_bar, 0)
  t = 0   # this group's tile count
  for j in range(j_lo + CID * BN, j_hi, 2 * BN):
    pos = (2 * t + CID) * 2   # ring position of the tile's first chunk
    cols = j + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    in_cols = cols < m
    b0 = gl.load(yt_ptr + cols, mask=in_cols, other=0.0)
    g_c0 = gl.load(g_c_ptr + cols, mask=in_cols, other=0.0)
    g_c1 = gl.load(g_c_ptr + m + cols, mask=in_cols, other=0.0)
    mbarrier.wait(ready.index(pos % NB), (pos // NB) & 1)
    lo = warpgroup_mma(x_smem.index(0), y_smem.index(pos % NB).permute((1, 0)), zs,
                       use_acc=False, is_async=True)
    lo = warpgroup_mma_wait(num_outstanding=0, deps=(lo,))
    mbarrier.wait(ready.index((pos + 1) % NB), ((pos + 1) // NB) & 1)
    full = warpgroup_mma(x_smem.index(1), y_smem.index((pos + 1) % NB).permute((1, 0)), lo,
                         use_acc=True, is_async=True)
    if not SINGLE:
      s0 = lo * gl.expand_dims(a0, 1) * gl.expand_dims(b0, 0)
      c0, add = _coef(s0, scale2, row0, j, rows, cols, row_off, col_off, n, m, t0, g_r0, g_c0,
                      scal_ptr, BM, BN)
      cs0 += add
      w0 = c0 * gl.expand_dims(a0, 1) * gl.expand_dims(b0, 0)
    full = warpgroup_mma_wait(num_outstanding=0, deps=(full,))
    c1, add = _coef(full, scale2, row0, j, rows, cols, row_off, col_off, n, m, t1, g_r1, g_c1,
                    scal_ptr, BM, BN)
    cs1 += add
    p_smem.index(2 * CID + 1).store(c1.to(p_smem.dtype))
    if SINGLE:
      p_smem.index(2 * CID).store(c1.to(p_smem.dtype))
    else:
      p_smem.index(2 * CID).store((c1 + w0).to(p_smem.dtype))
    fence_async_shared()
    mbarrier.arrive(bar)
    mbarrier.wait(bar, t & 1)   # this group's P written
    acc0 = warpgroup_mma(p_smem.index(2 * CID), y_smem.index(pos % NB), acc0, is_async=True)
    acc1 = warpgroup_mma(p_smem.index(2 * CID + 1), y_smem.index((pos + 1) % NB), acc1,
                         is_async=True)
    acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
    mbarrier.arrive(empty.index(pos % NB))
    mbarrier.arrive(empty.index((pos + 1) % NB))
    t += 1
  out_mult = gl.load(scal_ptr + 1)
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
  feats = gl.arange(0, BK, layout=gl.SliceLayout(0, o_layout))
  at = dx_ptr + (CID * n + gl.expand_dims(orows, 1).to(gl.int64)) * D + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < BK, 0)
  gl.store(at, acc0 * out_mult, mask=keep)
  gl.store(at + BK, acc1 * out_mult, mask=keep)
  cs_mult = gl.load(scal_ptr + 2)
  gl.store(cs_ptr + CID * n + rows, cs0 * cs_mult, mask=in_rows)          # [2 dims, 2, n]
  gl.store(cs_ptr + (2 + CID) * n + rows, cs1 * cs_mult, mask=in_rows)


@gluon.jit
def _indep_bwd_kernel(x_desc, y_desc, scal_ptr, off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr,
                      g_c_ptr, n, m, cols_per_split, dx_ptr, cs_ptr, D: gl.constexpr,
                      NB: gl.constexpr, SINGLE: gl.constexpr):
  """``_pair_bwd_kernel``'s arguments (dx_ptr: [2 groups, n, D] fp32 partials), the
  independent form: two chunks a tile (D = 2 BK), NB ring chunks, P per group."""
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  gl.static_assert(D == 2 * BK and NB % 4 == 0)
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [2, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NB, BN, BK], y_desc.layout)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [4, BM, BN], p_layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NB)
  empty = mbarrier.allocate_mbarrier(batch=NB)
  p_bar = mbarrier.allocate_mbarrier(batch=2)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NB):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=1)   # the owning group's P @ y
  for i in gl.static_range(2):
    mbarrier.init(p_bar.index(i), count=1)
  gl.warp_specialize([
      (_indep_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_bar, scal_ptr,
                         off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo,
                         j_hi, dx_ptr, cs_ptr, 0, BM, BN, BK, D, NB, SINGLE)),
      (_indep_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_bar, scal_ptr,
                         off_ptr, xt_ptr, yt_ptr, t_ptr, g_r_ptr, g_c_ptr, n, m, row0, j_lo,
                         j_hi, dx_ptr, cs_ptr, 1, BM, BN, BK, D, NB, SINGLE)),
      (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                  BK, 2, NB)),
  ], [4, 1], [240, 24])


def p_buffers(d: int) -> int:
  """P sets: one at D = 512 (64 + 128 + 32 KiB of shared memory), two below."""
  return 1 if d == 512 else 2


# ---------------------------------------------------------------------------------------
# On the GPU (jax-triton)


def operands(x, y, scale2):
  """Dim 0 (the half prefix): inverse norms a, b; both dims the shared shift t = scale2
  and rebased cotangents in [0.5, 1.5] / B."""
  n, d = x.shape
  f32 = jnp.float32
  inv = lambda v: jax.lax.rsqrt(jnp.sum(jnp.square(v[:, :d // 2].astype(f32)), 1))
  k = jax.random.split(jax.random.key(1), 2)
  g_r = (0.5 + jax.random.uniform(k[0], (2, n), f32)) / n
  g_c = (0.5 + jax.random.uniform(k[1], (2, n), f32)) / n
  return inv(x), inv(y), jnp.full((2, n), scale2, f32), g_r, g_c


def reference(x, y, scale2, xt, yt, t, g_r, g_c, rows):
  """dx and cs [2, rows] of the first ``rows`` rows in float32 jnp (self pairs dropped)."""
  h = x.shape[1] // 2
  x = x[:rows].astype(jnp.float32)
  y = y.astype(jnp.float32)
  off = jnp.arange(rows)[:, None] == jnp.arange(y.shape[0])[None, :]
  coef = lambda s, k: jnp.where(off, 0.0, jnp.exp2(jnp.minimum(
      s * scale2 - t[k, :rows, None], 8.0)) * (g_r[k, :rows, None] + g_c[k, None, :]))
  ab = xt[:rows, None] * yt[None, :]
  s0 = (x[:, :h] @ y[:, :h].T) * ab
  s1 = x @ y.T
  c0, c1 = coef(s0, 0), coef(s1, 1)
  dx = jnp.concatenate([(c1 + c0 * ab) @ y[:, :h], c1 @ y[:, h:]], axis=1)
  return dx, jnp.stack([jnp.sum(c0 * s0, 1), jnp.sum(c1 * s1, 1)])


def launch(x, y, scale2, xt, yt, t, g_r, g_c, variant):
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, d = x.shape
  f32 = jnp.float32
  dummy = jnp.zeros((1,), f32)
  scal = jnp.stack([scale2, jnp.ones((), f32), jnp.ones((), f32), jnp.zeros((), f32)])
  off = jnp.zeros((2,), jnp.int32)
  if variant == "plain":   # the whole dot alone, the library's kernel
    dx, cs = _compat.triton_call(
        _compat.Tiles(x, (grad_gluon.BLOCK_M, grad_gluon.BLOCK_K), gluon=True),
        _compat.Tiles(y, (grad_gluon.BLOCK_N, grad_gluon.BLOCK_K), gluon=True), scal, off,
        t[1], g_r[1], dummy, dummy, g_c[1], dummy, dummy, dummy, n, n, n,
        kernel=grad_gluon._lse_bwd_gluon_kernel,
        out_shapes=library_gradient_outputs(n, d, x.dtype),
        grid=(n // grad_gluon.BLOCK_M, 1), name="gluon_pair_plain", num_warps=4, num_stages=1,
        D=512, HAS_ROW=True, HAS_COL=True, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True,
        WANT_CS=True, HAS_MASK=False, SHARED=True)[:2]
    return dx[0], jnp.sum(cs, axis=(0, 1))[None]
  bk = CHUNK[d]
  if variant.startswith("indep"):
    xd = jt.TensorDescriptor.from_array(x, (BM, bk), layout=layout((BM, bk)))
    yd = jt.TensorDescriptor.from_array(y, (64, bk), layout=layout((64, bk)))
    dx, cs = _compat.triton_call(
        xd, yd, scal, off, xt, yt, t.reshape(-1), g_r.reshape(-1), g_c.reshape(-1), n, n, n,
        kernel=_indep_bwd_kernel,
        out_shapes=[jax.ShapeDtypeStruct((2, n, d), f32), jax.ShapeDtypeStruct((2, 2, n), f32)],
        grid=(n // BM, 1), name=f"gluon_{variant}_{d}", num_warps=4, num_stages=1, D=d,
        NB=8, SINGLE=variant == "indep_one")
    return jnp.sum(dx, axis=0).astype(x.dtype), jnp.sum(cs, axis=1)
  bn, consts = shape(variant, d)
  xd = jt.TensorDescriptor.from_array(x, (BM, bk), layout=layout((BM, bk)))
  yd = jt.TensorDescriptor.from_array(y, (bn, bk), layout=layout((bn, bk)))
  dx, cs = _compat.triton_call(
      xd, yd, scal, off, xt, yt, t.reshape(-1), g_r.reshape(-1), g_c.reshape(-1), n, n, n,
      kernel=_pair_bwd_kernel,
      out_shapes=[jax.ShapeDtypeStruct((n, d), x.dtype), jax.ShapeDtypeStruct((2, 2, n), f32)],
      grid=(n // BM, 1), name=f"gluon_{variant}_{d}", num_warps=4, num_stages=1, **consts)
  return dx, jnp.sum(cs, axis=1)


def run(a):
  n = a.batch
  assert n % 128 == 0, "whole tiles only"
  path = compiled_via()
  for d in map(int, a.dims.split(",")):
    x, y = clip_pairs(jax.random.key(0), n, d)
    for variant in a.variants.split(","):
      if not VARIANTS[variant][-1](d):
        continue

      def body(row, variant=variant):
        fn = jax.jit(lambda *v: launch(*v, variant))
        for scale2, timed in ((LOG2E / 0.5, False), (LOG2E / 0.07, True)):
          s2 = jnp.asarray(scale2, jnp.float32)
          ops = operands(x, y, s2)
          if not timed:
            dx, cs = fn(x, y, s2, *ops)
            want_dx, want_cs = reference(x, y, s2, *ops, CHECK_ROWS)
            if variant == "plain" or single(variant):   # dim 1 alone: dx over every
              want_dx, want_cs = reference_one(x, y, s2, None, None, ops[2][1:], ops[3][1:],
                                               ops[4][1:], CHECK_ROWS)   # feature, its cs
              cs = cs[-1:]
            err = lambda got, want: float(jnp.max(jnp.abs(got - want)) /
                                          jnp.max(jnp.abs(want)))
            err_dx = err(dx[:CHECK_ROWS].astype(jnp.float32), want_dx)
            err_cs = err(cs[:, :CHECK_ROWS], want_cs)
            bad = not (np.isfinite(err_dx) and np.isfinite(err_cs)) or max(err_dx, err_cs) > 2e-2
            row.update(err_dx=err_dx, err_cs=err_cs, wrong=bool(bad))
          else:
            ms = statistics.median(time_jax(fn, x, y, s2, *ops, reps=a.reps))
            row.update(ms=round(ms, 4), tflops=round(4 * n * n * d / ms / 1e9, 1))

      guarded(dict(bench="gluon_pair_grad", variant=variant, batch=n, dim=d, ms=None,
                   tflops=None, err_dx=None, err_cs=None, wrong=None,
                   note=f"compiled via {path}"), a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile for sm_90


FLAGS = {"pair": {}, "pair_late": dict(LATE=True), "pair_pack": dict(PACK=True),
         "pair_late_pack": dict(LATE=True, PACK=True),
         "pair_n64": dict(BN=64, NB=8, NP=2, LATE=True, PACK=True),
         "pair_n64_plain": dict(BN=64, NB=8, NP=2),
         "one": dict(SINGLE=True), "one_n64": dict(BN=64, NB=8, NP=2, SINGLE=True),
         "one_n64_pipe": dict(BN=64, NB=8, NP=2, SINGLE=True, PIPE=True),
         "pair_n64_pipe": dict(BN=64, NB=8, NP=2, PIPE=True),
         "one_peel": dict(SINGLE=True, PEEL=True),
         "one_n64_pipe_peel": dict(BN=64, NB=8, NP=2, SINGLE=True, PIPE=True, PEEL=True),
         "pair_n64_pipe_peel": dict(BN=64, NB=8, NP=2, PIPE=True, PEEL=True)}


def single(variant: str) -> bool:
  """Whether a variant computes dim 1 alone (checked against the plain pass)."""
  return variant == "indep_one" or FLAGS.get(variant, {}).get("SINGLE", False)


def shape(variant: str, d: int):
  """(BN, the kernel's constexprs) of a variant at D = d."""
  f = dict(FLAGS[variant])
  bn = f.pop("BN", BN)
  f.setdefault("NP", p_buffers(d))
  f.setdefault("NB", 4)
  return bn, dict(D=d, **f)


VARIANTS = {"plain": (lambda d: d == 512,), **{v: (lambda d: d in CHUNK,) for v in FLAGS},
            "indep": (lambda d: d == 128,), "indep_one": (lambda d: d == 128,)}


def compile_only(a):
  def build(variant, d):
    if variant == "plain":
      from benchmarks._gluon import compile_library_gradient  # pylint: disable=g-import-not-at-top
      return (compile_library_gradient("bfloat16", dict(
          D=512, HAS_ROW=True, HAS_COL=True, ROW_THR=False, COL_THR=False, EXCLUDE_SELF=True,
          WANT_CS=True, HAS_MASK=False, SHARED=True)), 4, {})
    bk = CHUNK[d]
    if variant.startswith("indep"):
      bn, consts = 64, dict(D=d, NB=8, SINGLE=variant == "indep_one")
      kernel = _indep_bwd_kernel
    else:
      bn, consts = shape(variant, d)
      kernel = _pair_bwd_kernel
    desc = lambda r: f"tensordesc<bf16[{r},{bk}],{layout((r, bk))!r}>"
    sig = dict(x_desc=desc(BM), y_desc=desc(bn), off_ptr="*i32", n="i32", m="i32",
               cols_per_split="i32", dx_ptr="*fp32" if variant.startswith("indep") else "*bf16",
               **{p: "*fp32" for p in ("scal_ptr", "xt_ptr", "yt_ptr", "t_ptr", "g_r_ptr",
                                       "g_c_ptr", "cs_ptr")})
    ptrs = [k for k, v in sig.items() if v.startswith(("*", "tensordesc"))]
    return compile_sm90(kernel, sig, ptrs, consts, 4, 1), 4, {}
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
