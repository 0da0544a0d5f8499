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
with row and column offsets).
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
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks._gluon import compile_rows, compile_sm90, compiled_via, guarded, layout, main
from benchmarks._harness import clip_pairs, time_jax
from benchmarks.bench_gluon_mrl import CHECK_ROWS, LOG2E
from benchmarks.bench_gluon_small import (DIMS, NT, RAGGED, STATS_LAYOUT, _tight_barriers,
                                          _tight_producer, _tight_start, _xrows, column_blocks,
                                          prefixes)
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
def _fwd_consumer(x_smem, y_smem, st_rows, x_bar, ready, empty, scal_ptr, off_ptr, xt_ptr, n,
                  m, row0, j_lo, ntiles, k0, ndiag, row_ptr, col_ptr, CID: gl.constexpr,
                  BN: gl.constexpr, HR: gl.constexpr, NT: gl.constexpr):
  """Consumer group CID: rows [row0 + CID HR, + HR) against every tile of the split (see
  the module docstring); at the end the rows' sums of each dim."""
  layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HR, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + CID * HR + gl.arange(0, HR, layout=gl.SliceLayout(0, layout))
  in_rows = rows < n
  a0s = gl.load(xt_ptr + rows, mask=in_rows, other=0.0) * scale2
  a1s = gl.load(xt_ptr + n + rows, mask=in_rows, other=0.0) * scale2
  a2s = gl.load(xt_ptr + 2 * n + rows, mask=in_rows, other=0.0) * scale2
  zs = gl.zeros([BN, HR], gl.float32, layout=layout)
  t0, t1, t2 = zs, zs, zs
  P = 2 * gl.num_programs(0)
  part = 2 * gl.program_id(0) + CID
  ndiag = gl.where(row0 + 2 * HR > n, ntiles, ndiag)   # rows past the end: every tile tested
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
# On the GPU (jax-triton)


def launch(x, y, scale2, xt, yt, variant):
  """Each dim's rows' and columns' sums, [3, n] and [3, m]."""
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  n, m = x.shape[0], y.shape[0]
  f32 = jnp.float32
  scal = jnp.stack([scale2, scale2 - BOUND_HEADROOM, jnp.zeros((), f32)])
  if variant == "library3":   # stats_gluon's kernel on each dim's normalized prefix
    rows, cols = [], []
    for k, d in enumerate(DIMS):
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
  sd = jt.TensorDescriptor.from_array(column_blocks(yt, jnp.zeros_like(yt), scal[1]), (8, BN),
                                      layout=STATS_LAYOUT)
  off = jnp.zeros((2,), jnp.int32)
  rows, cols = _compat.triton_call(
      xd, yd, sd, scal, off, xt.reshape(-1), n, m, -(-m // BN) * BN,
      kernel=_small_fwd_kernel,
      out_shapes=[jax.ShapeDtypeStruct((3, n), f32),
                  jax.ShapeDtypeStruct((3, 2 * -(-n // BM), m), f32)],
      grid=(-(-n // BM), 1), name=f"gluon_{variant}", num_warps=4, num_stages=1, NT=NT)
  return rows, jnp.sum(cols, axis=1)


def reference(x, y, scale2, xt, yt, rows):
  """Each dim's sums over the first ``rows`` rows and columns in float32 jnp, [3, rows]
  each, the self pairs left out."""
  f32 = jnp.float32
  shift = scale2 - BOUND_HEADROOM
  out_r, out_c = [], []
  for k, d in enumerate(DIMS):
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
  xt, yt = prefixes(x, y)
  r = n - RAGGED   # the check's rows and columns: neither a whole number of tiles
  for variant in a.variants.split(","):

    def body(row, variant=variant):
      fn = jax.jit(lambda *v: launch(*v, variant))
      for scale2, timed in ((LOG2E / 0.5, False), (LOG2E / 0.07, True)):
        s2 = jnp.asarray(scale2, jnp.float32)
        if not timed:
          got = fn(x[:r], y[:r], s2, xt[:, :r], yt[:, :r])
          want = reference(x[:r], y[:r], s2, xt[:, :r], yt[:, :r], CHECK_ROWS)
          err = max(float(jnp.max(jnp.abs(g[:, :CHECK_ROWS] - w) / w)) for g, w in zip(got, want))
          bad = not np.isfinite(err) or err > 2e-2
          row.update(err=err if np.isfinite(err) else str(err), wrong=bool(bad))
        else:
          ms = statistics.median(time_jax(fn, x, y, s2, xt, yt, reps=a.reps))
          row.update(ms=round(ms, 4))

    guarded(dict(bench="gluon_small_fwd", variant=variant, batch=n, dim=256, ms=None, err=None,
                 wrong=None, note=f"compiled via {path}"), a.variant_timeout, body)


# ---------------------------------------------------------------------------------------
# Without a GPU: compile for sm_90


VARIANTS = {"library3": (lambda d: True,), "small3_fwd": (lambda d: True,)}


def compile_only(a):
  a.dims = "256"

  def build(variant, d):
    del d
    if variant == "library3":   # the library's kernel at dim 256 (dims 64, 128 alike)
      from benchmarks._gluon import compile_library_forward  # pylint: disable=g-import-not-at-top
      return compile_library_forward("bfloat16", dict(
          D=256, ROW_THR=False, EXCLUDE_SELF=True, TWO_SIDED=True, HAS_MASK=False,
          WANT_MAX=False)), 4, {}
    desc = lambda r: f"tensordesc<bf16[{r},{BK}],{layout((r, BK))!r}>"
    sig = dict(x_desc=desc(BM), y_desc=desc(BN), s_desc=f"tensordesc<fp32[8,{BN}],"
               f"{STATS_LAYOUT!r}>", scal_ptr="*fp32", off_ptr="*i32", xt_ptr="*fp32",
               n="i32", m="i32", cols_per_split="i32", row_ptr="*fp32", col_ptr="*fp32")
    ptrs = [k for k, v in sig.items() if v.startswith(("*", "tensordesc"))]
    return compile_sm90(_small_fwd_kernel, sig, ptrs, dict(NT=NT), 4, 1), 4, {}
  compile_rows(a, VARIANTS, build)


if __name__ == "__main__":
  main(VARIANTS, run, compile_only, reps=10)
