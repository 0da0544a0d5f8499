"""The FlashAttention-shaped gradient pass (``grad_bwd._lse_bwd_kernel``'s) as a
warp-specialized Gluon kernel for Hopper (sm_90; jax-triton >= 0.4, Triton >= 3.9), at
d = 512: a one-warp TMA producer and two wgmma consumer warp groups.

Per program: 64 rows of x resident in shared memory (four 128-feature chunks), the other
tower's rows streamed in 128-row tiles through a ring of four [128, 128] chunks (one
tile; ``ready`` / ``empty`` mbarriers). Each consumer group computes the similarities of
its half of a tile's columns, S [64, 64] (async wgmma over the chunks), their
coefficients (``_common.coefficient``, the Triton kernels' own) into its half of a shared
P [64, 128] (two buffers, ``p_full`` / ``p_free`` mbarriers), then, once both halves are
in, P @ y into its half of dx's features, [64, 256] fp32 in registers. No similarity is
computed twice, and one group's exponentials run under the other's wgmma. A ring chunk
is freed by the other group's S and its owner's P @ y (two arrivals).

A pass with the columns' softmax loads each tile's column statistics (``col_stats``)
before the tile's wgmma, and ``where``'s biases too (the rows' once): loaded after S,
where the coefficient reads them, their latency stalled both groups (P is shared), tile
after tile.

With every row's lse replaced by the bounded forward's shift, and the rows' sums of c
(and largest kept s) stored too, the same kernel is a one-sided block's forward that
also forms its rows' gradient (``backward.lse_fwd_rows``, ``Algorithm.fwd_row_grad``).

On an H200 (B = 65536, bf16, LiT's pass of the rows' softmax) it takes 15.1 ms against
the Triton kernel's 19.3 (benchmarks/bench_gluon_grad.py, then ``gluon_ws_split_bn128``;
benchmarks/results/h200_gluon_grad.csv); whole steps: docs/benchmarks.md, "The Gluon
gradient". Shared memory: 64 + 128 + 32 KiB.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma,
                                                              warpgroup_mma_wait)

from memeff_jax.backends.triton._common import (coefficient, col_stats, load_bias, row_stats,
                                                self_tiles)
from memeff_jax.backends.triton.stats_gluon import producer

BLOCK_M = 64                   # rows a program
BLOCK_N = 128                  # columns a tile (64 a consumer group)
BLOCK_K = 128                  # features a chunk
NUM_BUF = gl.constexpr(4)      # ring chunks (a whole tile: P @ y reads a tile after its S)
NUM_P = gl.constexpr(2)        # P buffers
# SPLIT's default: the self pairs' test only in the tiles holding them, the rest of the
# walk in loops without it (as grad_bwd's at d <= 128). B = 65536, fwd+bwd, one H100,
# Triton 3.9: CLIP 39.16 -> 37.66 ms, Qwen3 32.90 -> 30.61, LiT (no self pairs) the same
# build (h100_self_split.csv runs 2-3).
SELF_SPLIT = gl.constexpr(True)


@gluon.jit
def _consumer(x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr, off_ptr,
              lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr, yb_ptr,
              n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr, sum_ptr, max_ptr, big_ptr,
              CID: gl.constexpr,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, D: gl.constexpr,
              KCH: gl.constexpr, NB: gl.constexpr, NP: gl.constexpr, HAS_ROW: gl.constexpr,
              HAS_COL: gl.constexpr, ROW_THR: gl.constexpr, COL_THR: gl.constexpr,
              EXCLUDE_SELF: gl.constexpr, WANT_CS: gl.constexpr, HAS_MASK: gl.constexpr,
              SHARED: gl.constexpr, WANT_SUM: gl.constexpr, WANT_MAX: gl.constexpr,
              SCALED: gl.constexpr, SPLIT: gl.constexpr):
  """Consumer warp group CID (4 warps): S for the columns [CID HALF, + HALF) of each tile,
  their coefficients into P, then dx's features [CID NOC BK, + NOC BK) += P @ y; at the
  end dx (times scale g_max), this group's sums of c s (times g_max) and (the forward's
  rows, ``lse_fwd_rows``) its sums of c and largest s where c > 0; SCALED: dx's rows each
  divided by their largest magnitude in this group's features, stored in big."""
  HALF: gl.constexpr = BN // 2
  NOC: gl.constexpr = KCH // 2
  gl.static_assert(NOC == 2, "two output chunks a group (D = 4 BK)")
  s_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16])
  o_layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
  scale2 = gl.load(scal_ptr)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
  in_rows = rows < n
  lse_r, g_r, thr_r = row_stats(lse_r_ptr, g_r_ptr, thr_r_ptr, rows, in_rows, BM, HAS_ROW,
                                ROW_THR)
  bias_r = load_bias(xb_ptr, rows, HAS_MASK)
  cs = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
  c_sum = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
  s_max = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
  s = gl.zeros([BM, HALF], gl.float32, layout=s_layout)
  acc0 = gl.zeros([BM, BK], gl.float32, layout=o_layout)
  acc1 = gl.zeros([BM, BK], gl.float32, layout=o_layout)
  mbarrier.wait(x_bar, 0)
  it = 0   # ring position of the tile's first chunk
  t = 0    # tile count (P buffer t % NP)
  # SPLIT: the self pairs' test only in [d0, d1), the tiles holding them, between two
  # loops without it (three loops, parts 0-2, in the walk's order); else one loop over
  # the split, part 0 (the same machine code as three loops written out)
  SELF_TILES: gl.constexpr = EXCLUDE_SELF and SPLIT
  TEST_ALL: gl.constexpr = EXCLUDE_SELF and not SPLIT   # (the one loop's test)
  d0 = j_hi
  d1 = j_hi
  if SELF_TILES:
    d0, d1 = self_tiles(row0, j_lo, j_hi, row_off, col_off, BM, BN)
  for part in gl.static_range(3 if SELF_TILES else 1):
    lo = j_lo if part == 0 else d0 if part == 1 else d1
    hi = d0 if part == 0 else d1 if part == 1 else j_hi
    for j in range(lo, hi, BN):
      s, acc0, acc1, cs, c_sum, s_max = _tile(
          j, it, t, s, acc0, acc1, cs, c_sum, s_max, x_smem, y_smem, p_smem, ready, empty,
          p_full, p_free, scal_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr,
          xb_ptr, yb_ptr, n, m, row0, rows, row_off, col_off, scale2, lse_r, g_r, thr_r, bias_r,
          CID, BM, BN, KCH, NB, NP, HAS_ROW, HAS_COL, ROW_THR, COL_THR,
          part == 1 or TEST_ALL, WANT_CS, HAS_MASK, SHARED, WANT_SUM,
          WANT_MAX)
      it += KCH
      t += 1
  out_mult = gl.load(scal_ptr + 1)
  acc0 = acc0 * out_mult
  acc1 = acc1 * out_mult
  orows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
  if SCALED:
    big = gl.maximum(gl.max(gl.abs(acc0), axis=1), gl.max(gl.abs(acc1), axis=1))
    big = gl.where(big > 0.0, big, 1.0)
    inv = gl.expand_dims(1.0 / big, 1)
    acc0 = acc0 * inv
    acc1 = acc1 * inv
    gl.store(big_ptr + CID * n + orows, big, mask=orows < n)
  feats = CID * NOC * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, o_layout))
  split = gl.program_id(1).to(gl.int64)
  at = dx_ptr + (split * n + gl.expand_dims(orows, 1)) * D + gl.expand_dims(feats, 0)
  keep = gl.expand_dims(orows < n, 1) & gl.expand_dims(feats < D, 0)
  gl.store(at, acc0.to(dx_ptr.dtype.element_ty), mask=keep)
  gl.store(at + BK, acc1.to(dx_ptr.dtype.element_ty), mask=keep)
  per_row = (CID * gl.num_programs(1) + split) * n + rows   # [2, splits, n]: this group's
  if WANT_CS:
    cs_mult = gl.load(scal_ptr + 2)
    gl.store(cs_ptr + per_row, cs * cs_mult, mask=in_rows)
  if WANT_SUM:
    gl.store(sum_ptr + per_row, c_sum, mask=in_rows)
  if WANT_MAX:
    gl.store(max_ptr + per_row, s_max, mask=in_rows)


@gluon.jit
def _tile(j, it, t, s, acc0, acc1, cs, c_sum, s_max, x_smem, y_smem, p_smem, ready, empty,
          p_full, p_free, scal_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr,
          thr_c_ptr, xb_ptr, yb_ptr, n, m, row0, rows, row_off, col_off, scale2, lse_r, g_r,
          thr_r, bias_r, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
          KCH: gl.constexpr, NB: gl.constexpr, NP: gl.constexpr, HAS_ROW: gl.constexpr,
          HAS_COL: gl.constexpr, ROW_THR: gl.constexpr, COL_THR: gl.constexpr,
          EXCLUDE_SELF: gl.constexpr, WANT_CS: gl.constexpr, HAS_MASK: gl.constexpr,
          SHARED: gl.constexpr, WANT_SUM: gl.constexpr, WANT_MAX: gl.constexpr):
  """``_consumer``'s column tile [j, j + BN) (ring position it, P buffer t % NP): this
  group's S, coefficients (EXCLUDE_SELF: with the self pairs' test) and sums, its half of
  P, and P @ y into its features."""
  HALF: gl.constexpr = BN // 2
  NOC: gl.constexpr = KCH // 2
  s_layout: gl.constexpr = s.type.layout
  # the columns' statistics and ``where`` biases, loaded while the tile's similarities run
  col0 = j + CID * HALF
  cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, s_layout))
  lse_c, g_c, thr_c = col_stats(lse_c_ptr, g_c_ptr, thr_c_ptr, cols, m, HAS_COL, COL_THR,
                                SHARED)
  bias_c = load_bias(yb_ptr, cols, HAS_MASK)
  for k in gl.static_range(KCH):   # S half = x y[half]^T over the chunks
    slot = (it + k) % NB
    mbarrier.wait(ready.index(slot), ((it + k) // NB) & 1)
    b = y_smem.index(slot).slice(CID * HALF, HALF, dim=0).permute((1, 0))
    s = warpgroup_mma(x_smem.index(k), b, s, use_acc=k > 0, is_async=True)
    if k > 0:   # chunk k - 1's wgmma is done: the other group's output chunk is freed
      s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
      if (k - 1) // NOC != CID:
        mbarrier.arrive(empty.index((it + k - 1) % NB))
  s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
  if (KCH - 1) // NOC != CID:
    mbarrier.arrive(empty.index((it + KCH - 1) % NB))
  c = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, lse_r, g_r,
                  thr_r, lse_c, g_c, thr_c, xb_ptr, yb_ptr, BM, HALF, HAS_ROW, HAS_COL,
                  ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK, SHARED, bias_r=bias_r,
                  bias_c=bias_c)
  if WANT_CS:
    cs += gl.sum(c * s, axis=1)
  if WANT_SUM:
    c_sum += gl.sum(c, axis=1)
  if WANT_MAX:   # (c > 0: the kept entries; none that matters flushes to 0, see lse_fwd_rows)
    s_max = gl.maximum(s_max, gl.max(gl.where(c > 0.0, s, float("-inf")), axis=1))
  pb = t % NP
  mbarrier.wait(p_free.index(pb), ((t // NP) & 1) ^ 1)   # tile t - NP's P @ y done
  p_smem.index(pb).slice(CID * HALF, HALF, dim=1).store(c.to(p_smem.dtype))
  fence_async_shared()   # the generic stores before wgmma's (async proxy) reads
  mbarrier.arrive(p_full.index(pb))
  mbarrier.wait(p_full.index(pb), (t // NP) & 1)        # both halves of P written
  p = p_smem.index(pb)
  acc0 = warpgroup_mma(p, y_smem.index((it + CID * NOC) % NB), acc0, is_async=True)
  acc1 = warpgroup_mma(p, y_smem.index((it + CID * NOC + 1) % NB), acc1, is_async=True)
  acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
  for i in gl.static_range(NOC):
    mbarrier.arrive(empty.index((it + CID * NOC + i) % NB))
  mbarrier.arrive(p_free.index(pb))
  return s, acc0, acc1, cs, c_sum, s_max


@gluon.jit
def _lse_bwd_gluon_kernel(
    # input pointers
    x_desc, y_desc,            # TMA descriptors: x [n, D] in [BM, BK] blocks, y [m, D] in
                               # [BN, BK] blocks (NVMMA shared layout)
    scal_ptr,                  # [4] fp32: scale * log2(e), scale * g_max, g_max, (unused)
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    lse_r_ptr, g_r_ptr, thr_r_ptr,   # [n] row-role statistics, as grad_bwd's
    lse_c_ptr, g_c_ptr, thr_c_ptr,   # [m] column-role statistics
    xb_ptr, yb_ptr,            # fp32 where biases, padded to whole tiles, if HAS_MASK
    # sizes
    n, m,
    cols_per_split,            # columns one program sweeps (a multiple of BN)
    # output pointers
    dx_ptr,                    # [splits, n, D]: scale * g_max * sum_j c_ij y_j
    cs_ptr,                    # [2, splits, n] fp32: g_max * sum_j c_ij s_ij, per group
    sum_ptr,                   # [2, splits, n] fp32: sum_j c_ij, per group, if WANT_SUM
    max_ptr,                   # [2, splits, n] fp32: max s_ij where c_ij > 0, if WANT_MAX
    big_ptr,                   # [2, n] fp32: each row's largest |dx| in a group's features,
                               # if SCALED (one split: dx holds dx / big)
    # constexprs
    D: gl.constexpr, HAS_ROW: gl.constexpr, HAS_COL: gl.constexpr, ROW_THR: gl.constexpr,
    COL_THR: gl.constexpr, EXCLUDE_SELF: gl.constexpr, WANT_CS: gl.constexpr,
    HAS_MASK: gl.constexpr, SHARED: gl.constexpr, WANT_SUM: gl.constexpr = False,
    WANT_MAX: gl.constexpr = False, SCALED: gl.constexpr = False,
    SPLIT: gl.constexpr = SELF_SPLIT,
):
  """``_lse_bwd_kernel``'s dx and c s (no Matryoshka tables, no sigmoid) for BM rows and
  one column split; WANT_SUM / WANT_MAX: also the rows' sums of c and largest kept s (the
  forward's rows, ``backward.lse_fwd_rows``); SCALED: dx in [-1, 1] by its rows' scales in
  big (the two groups' feature halves). Grid (row tiles, splits).

  SPLIT (default ``SELF_SPLIT``, on) with EXCLUDE_SELF: the column loop in three parts,
  the tiles before those holding self pairs, those (``_common.self_tiles``; tested),
  the rest, in the walk's order (so the sums are the single loop's). sm_90, CLIP's
  flags: 752-777 instructions a tile in the untested loops against 886-923, 24 B of
  spill stores against 88; compile time about doubles (docs/notes/gradient.md)."""
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = D // BK
  gl.static_assert(KCH * BK == D)
  gl.static_assert(KCH <= NUM_BUF, "the ring must hold a whole tile")
  row0 = gl.program_id(0) * BM
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  p_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16,
                                                rank=2)
  p_smem = gl.allocate_shared_memory(x_desc.dtype, [NUM_P, BM, BN], p_layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  empty = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  p_full = mbarrier.allocate_mbarrier(batch=NUM_P)
  p_free = mbarrier.allocate_mbarrier(batch=NUM_P)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=2)   # the other group's S, the owner's P @ y
  for i in gl.static_range(NUM_P):
    mbarrier.init(p_full.index(i), count=2)  # both halves written
    mbarrier.init(p_free.index(i), count=2)  # both groups' P @ y done
  gl.warp_specialize([
      (_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                   off_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr,
                   yb_ptr, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr, sum_ptr, max_ptr, big_ptr, 0,
                   BM, BN, BK, D, KCH, NUM_BUF, NUM_P, HAS_ROW, HAS_COL, ROW_THR, COL_THR,
                   EXCLUDE_SELF, WANT_CS, HAS_MASK, SHARED, WANT_SUM, WANT_MAX, SCALED,
                   SPLIT)),
      (_consumer, (x_smem, y_smem, p_smem, x_bar, ready, empty, p_full, p_free, scal_ptr,
                   off_ptr, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr,
                   yb_ptr, n, m, row0, j_lo, j_hi, dx_ptr, cs_ptr, sum_ptr, max_ptr, big_ptr, 1,
                   BM, BN, BK, D, KCH, NUM_BUF, NUM_P, HAS_ROW, HAS_COL, ROW_THR, COL_THR,
                   EXCLUDE_SELF, WANT_CS, HAS_MASK, SHARED, WANT_SUM, WANT_MAX, SCALED,
                   SPLIT)),
      (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                   BK, KCH, NUM_BUF)),
  ], [4, 1], [240, 24])
