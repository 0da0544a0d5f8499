"""Gradient kernels, one pass per output tower.

``_lse_bwd_kernel`` is FlashAttention-shaped: a program owns a row tile, streams the
other tower and accumulates its gradient rows in fp32 registers, written once
(Matryoshka too: ``prefix_gradient``).
Where that accumulator does not fit (d_pad > 512 on an H200), ``_tile_coef_bwd_kernel``
writes slabs of the coefficient matrix from GEMM tiles and the launcher multiplies
each slab into the gradient with an XLA dot. Both share ``_common.coefficient``.
"""

import triton
import triton.language as tl

from memeff_jax.backends.triton._common import (coefficient, col_stats, drop_pairs, load_bias,
                                                load_tile, logits, row_stats, self_tiles,
                                                sigmoid_softplus, similarity, tile_origin,
                                                tile_similarity)

# fp32 entries of a tile that one thread's epilogue may work on at once (FWD): the
# sigmoid epilogue keeps several temporaries an entry, so past 32 it spills (sm_90).
EPI_ENTRIES = 32


@triton.jit
def _lse_bwd_kernel(
    # input pointers
    x_ptr, y_ptr,              # [n, D] rows whose gradient this pass writes, [m, D] columns
    scal_ptr,                  # [4] fp32: scale * log2(e), scale * g_max, g_max, SIGMOID bias;
                               # SCALED: [5], max |y| last
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    lse_r_ptr, g_r_ptr, thr_r_ptr,   # [n] row-role statistics (log2 units, +inf if empty)
    lse_c_ptr, g_c_ptr, thr_c_ptr,   # [m] column-role statistics (SHARED: lse_c unused)
    xt_ptr, yt_ptr,            # [K, n], [K, m] fp32 prefix inverse norms, if HAS_TAB
    xb_ptr, yb_ptr,            # fp32 where biases of the rows / columns (0 kept, -inf
                               # removed), padded to whole tiles, if HAS_MASK
    # sizes
    n, m,
    cols_per_split,            # columns one program sweeps (a multiple of BLOCK_N)
    # output pointers
    dx_ptr,                    # [splits, n, D]: scale * g_max * sum_j c_ij y_j
    cs_ptr,                    # [K, splits, n] fp32: g_max * sum_j c_ij s_ij (WANT_CS)
    c1_ptr,                    # [K, splits, n] fp32: g_max * sum_j c_ij (SIGMOID, WANT_SUM)
    max_ptr,                   # [splits, n] fp32: max s_ij where c_ij > 0 (WANT_MAX)
    big_ptr,                   # [1, n] fp32: each row's bound of |dx| (SCALED)
    # constexprs
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D: tl.constexpr, BLOCK_DO: tl.constexpr, REUSE_Y: tl.constexpr,
    HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, ROW_THR: tl.constexpr,
    COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr, WANT_CS: tl.constexpr,
    PRECISION: tl.constexpr, HAS_MASK: tl.constexpr, K: tl.constexpr, SEGS: tl.constexpr,
    HAS_TAB: tl.constexpr, SHARED: tl.constexpr, SIGMOID: tl.constexpr, TMA: tl.constexpr,
    WANT_SUM: tl.constexpr = False, WANT_MAX: tl.constexpr = False,
    SCALED: tl.constexpr = False,
):
  """dx_i = scale * sum_j c_ij y_j with the softmax coefficient

      c_ij = g_r_i keep^r_ij 2^(z_ij - lse_r_i) + g_c_j keep^c_ij 2^(z_ij - lse_c_j).

  Grid (row tiles, feature chunks of BLOCK_DO, column splits). A program owns
  BLOCK_M rows and BLOCK_DO gradient features in an fp32 register tile written
  once (no atomics: deterministic). The cotangents come divided by g_max so the
  coefficient tile, cast to the input dtype for the dot, stays in [-2, 2] (no
  fp16 underflow at large batches); g_max is multiplied back in fp32.

  Out-of-range rows carry lse = +inf and g = 0 and out-of-range columns load as
  zero rows (no contribution to the dot or to sum c s), so only the last column
  tile (where 2^(0 - lse_r) could overflow the cast) and the diagonal tiles are masked.

  SHARED: both roles' statistics rebased on one shift, one exponential per entry
  (``_common.coefficient``; the launcher decides, see launch.lse_bwd).

  HAS_TAB (Matryoshka, K prefix dims ending as in the tiled kernels' SEGS; the
  features walked in NUM_D chunks of BLOCK_D; BLOCK_DO and REUSE_Y unused): see
  ``prefix_gradient``.

  SIGMOID: the pairwise sigmoid's coefficients (``_common.coefficient``), and the rows'
  sums of c (the bias's gradient) in c1.

  WANT_SUM / WANT_MAX (no tables; the forward's rows, ``backward.lse_fwd_rows``): the
  rows' sums of c in c1 and their largest s where c > 0 in max. SCALED (one split): each
  row of dx divided by its bound scale g_max c1_i max |y| (c >= 0), stored in big
  (``base.scale_rows``): no reduction over the accumulator (one over its rows cost LiT's
  step on Triton 3.6 7 ms at d = 512, B = 65536: 28.8 against 21.8; h200_fwd_row_grad.csv
  runs 5-6).

  EXCLUDE_SELF at D <= 128: only the one or two tiles holding self pairs test for them
  (``_common.self_tiles``); the test otherwise sits in every tile (the compiler
  predicates ``drop_pairs``' branch), 15-31% of a tile's instructions there. B = 65536,
  fwd+bwd, bf16, one H100: CLIP 8.95 -> 8.13 ms at d = 64, Qwen3 12.94 -> 9.63 at 128
  on Triton 3.9; 9.69 -> 8.92, 13.59 -> 11.97 on 3.6 (benchmarks/NOTES.md, 2026-12-05).
  Past 128 the split's two loop bodies spill more than the test costs.

  TMA (one feature chunk, the column tile reused, no prefix tables): x_ptr and y_ptr
  are tensor descriptors of [BLOCK_M, BLOCK_D] and [BLOCK_N, BLOCK_D] tiles, loaded
  by the copy engine (no address registers).
  """
  tl.static_assert(BLOCK_D >= 16)  # tl.dot
  tl.static_assert(not TMA or (REUSE_Y and not HAS_TAB))
  tl.static_assert(not (HAS_TAB and (WANT_SUM or WANT_MAX)))
  pid_m = tl.program_id(0)
  pid_o = tl.program_id(1)
  pid_s = tl.program_id(2)
  scale2 = tl.load(scal_ptr)
  out_mult = tl.load(scal_ptr + 1)
  cs_mult = tl.load(scal_ptr + 2)
  sbias = tl.load(scal_ptr + 3)
  row_off = tl.load(off_ptr)
  col_off = tl.load(off_ptr + 1)
  row0 = pid_m * BLOCK_M
  rows = row0 + tl.arange(0, BLOCK_M)
  j_lo = pid_s * cols_per_split
  j_hi = tl.minimum(m, j_lo + cols_per_split)
  if HAS_TAB:
    prefix_gradient(x_ptr, y_ptr, xt_ptr, yt_ptr, row0, j_lo, j_hi, n, m, scale2, out_mult,
                    cs_mult, row_off, col_off, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr,
                    g_c_ptr, thr_c_ptr, xb_ptr, yb_ptr,
                    dx_ptr + pid_s.to(tl.int64) * n * D, cs_ptr + pid_s.to(tl.int64) * n,
                    c1_ptr + pid_s.to(tl.int64) * n, sbias,
                    tl.num_programs(2) * n, D, BLOCK_M, BLOCK_N, BLOCK_D, NUM_D, K, SEGS,
                    HAS_ROW, HAS_COL, ROW_THR, COL_THR, EXCLUDE_SELF, WANT_CS, PRECISION,
                    HAS_MASK, SHARED, SIGMOID)
  else:   # (an early return would still compile this body)
    x_t = tl.zeros([1, 1], dtype=tl.float32)
    if NUM_D == 1:
      x_t = load_tile(x_ptr, row0, n, 0, D, BLOCK_M, BLOCK_D, TMA)
    in_rows = rows < n
    lse_r, g_r, thr_r = row_stats(lse_r_ptr, g_r_ptr, thr_r_ptr, rows, in_rows, BLOCK_M, HAS_ROW,
                                  ROW_THR)
    acc = tl.zeros([BLOCK_M, BLOCK_DO], dtype=tl.float32)
    cs = tl.zeros([BLOCK_M], dtype=tl.float32)
    c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    s_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if EXCLUDE_SELF and D <= 128:
      # The self pairs' test leaves the loop body: [j_lo, d0) and [d1, j_hi) in one
      # untested body (an outer loop of two), the tiles holding self pairs, [d0, d1),
      # tested between them; the walk's order is the single loop's, so the sums are too.
      d0, d1 = self_tiles(row0, j_lo, j_hi, row_off, col_off, BLOCK_M, BLOCK_N)
      lo = j_lo
      hi = d0
      for part in range(2):
        for j0 in range(lo, hi, BLOCK_N):
          acc, cs, c1, s_max = _rows_tile(
              acc, cs, c1, s_max, x_t, x_ptr, y_ptr, j0, row0, rows, n, m, pid_o, scale2,
              sbias, row_off, col_off, lse_r, g_r, thr_r, lse_c_ptr, g_c_ptr, thr_c_ptr,
              xb_ptr, yb_ptr, D, BLOCK_M, BLOCK_N, BLOCK_D, NUM_D, BLOCK_DO, REUSE_Y, HAS_ROW,
              HAS_COL, ROW_THR, COL_THR, False, WANT_CS, PRECISION, HAS_MASK, SHARED, SIGMOID,
              TMA, WANT_SUM, WANT_MAX)
        if part == 0:
          for j0 in range(d0, d1, BLOCK_N):
            acc, cs, c1, s_max = _rows_tile(
                acc, cs, c1, s_max, x_t, x_ptr, y_ptr, j0, row0, rows, n, m, pid_o, scale2,
                sbias, row_off, col_off, lse_r, g_r, thr_r, lse_c_ptr, g_c_ptr, thr_c_ptr,
                xb_ptr, yb_ptr, D, BLOCK_M, BLOCK_N, BLOCK_D, NUM_D, BLOCK_DO, REUSE_Y,
                HAS_ROW, HAS_COL, ROW_THR, COL_THR, True, WANT_CS, PRECISION, HAS_MASK, SHARED,
                SIGMOID, TMA, WANT_SUM, WANT_MAX)
        lo = d1
        hi = j_hi
    else:
      for j0 in range(j_lo, j_hi, BLOCK_N):
        acc, cs, c1, s_max = _rows_tile(
            acc, cs, c1, s_max, x_t, x_ptr, y_ptr, j0, row0, rows, n, m, pid_o, scale2, sbias,
            row_off, col_off, lse_r, g_r, thr_r, lse_c_ptr, g_c_ptr, thr_c_ptr, xb_ptr, yb_ptr,
            D, BLOCK_M, BLOCK_N, BLOCK_D, NUM_D, BLOCK_DO, REUSE_Y, HAS_ROW, HAS_COL, ROW_THR,
            COL_THR, EXCLUDE_SELF, WANT_CS, PRECISION, HAS_MASK, SHARED, SIGMOID, TMA,
            WANT_SUM, WANT_MAX)
    dx = acc * out_mult
    if SCALED:
      big = c1 * out_mult * tl.load(scal_ptr + 4)
      big = tl.where(big > 0.0, big, 1.0)
      dx = dx * (1.0 / big)[:, None]
      if pid_o == 0:   # (one scale a row: the bound holds for every feature chunk)
        tl.store(big_ptr + rows, big, mask=in_rows)
    feats = pid_o * BLOCK_DO + tl.arange(0, BLOCK_DO)
    base = dx_ptr + (pid_s.to(tl.int64) * n + row0) * D
    offs = tl.arange(0, BLOCK_M)[:, None] * D + feats[None, :]
    tl.store(base + offs, dx.to(dx_ptr.dtype.element_ty),
             mask=in_rows[:, None] & (feats[None, :] < D))
    if WANT_CS:
      if pid_o == 0:
        tl.store(cs_ptr + pid_s.to(tl.int64) * n + rows, cs * cs_mult, mask=in_rows)
    if SIGMOID or WANT_SUM:
      if pid_o == 0:
        tl.store(c1_ptr + pid_s.to(tl.int64) * n + rows, c1 * cs_mult, mask=in_rows)
    if WANT_MAX:
      if pid_o == 0:
        tl.store(max_ptr + pid_s.to(tl.int64) * n + rows, s_max, mask=in_rows)


@triton.jit
def _rows_tile(acc, cs, c1, s_max, x_t, x_ptr, y_ptr, j0, row0, rows, n, m, pid_o, scale2,
               sbias, row_off, col_off, lse_r, g_r, thr_r, lse_c_ptr, g_c_ptr, thr_c_ptr,
               xb_ptr, yb_ptr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, NUM_D: tl.constexpr, BLOCK_DO: tl.constexpr,
               REUSE_Y: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
               ROW_THR: tl.constexpr, COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
               WANT_CS: tl.constexpr, PRECISION: tl.constexpr, HAS_MASK: tl.constexpr,
               SHARED: tl.constexpr, SIGMOID: tl.constexpr, TMA: tl.constexpr,
               WANT_SUM: tl.constexpr, WANT_MAX: tl.constexpr):
  """One column tile (columns j0 + arange(BLOCK_N)) of ``_lse_bwd_kernel``'s loop:
  its coefficients into the rows' gradient and sums. EXCLUDE_SELF: the self pairs'
  test (on tiles holding them)."""
  s, y_t = similarity(x_t, x_ptr, y_ptr, row0, j0, n, m, D, BLOCK_M, BLOCK_N, BLOCK_D, NUM_D,
                      PRECISION, TMA)
  cols = j0 + tl.arange(0, BLOCK_N)
  lse_c, g_c, thr_c = col_stats(lse_c_ptr, g_c_ptr, thr_c_ptr, cols, m, HAS_COL, COL_THR,
                                SHARED, SIGMOID)
  coef = coefficient(s, scale2, row0, j0, rows, cols, row_off, col_off, n, m, lse_r, g_r,
                     thr_r, lse_c, g_c, thr_c, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N, HAS_ROW,
                     HAS_COL, ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK, SHARED,
                     SIGMOID=SIGMOID, sbias=sbias)
  if WANT_CS:
    cs += tl.sum(coef * s, 1)
  if SIGMOID or WANT_SUM:
    c1 += tl.sum(coef, 1)
  if WANT_MAX:   # (c > 0: the kept entries; none that matters flushes to 0)
    s_max = tl.maximum(s_max, tl.max(tl.where(coef > 0.0, s, float("-inf")), 1))
  if REUSE_Y:
    y_o = y_t
  else:
    y_o = load_tile(y_ptr, j0, m, pid_o, D, BLOCK_N, BLOCK_DO)
  acc = tl.dot(coef.to(y_o.dtype), y_o, acc, input_precision=PRECISION)
  return acc, cs, c1, s_max


@triton.jit
def prefix_gradient(x_ptr, y_ptr, xt_ptr, yt_ptr, row0, j_lo, j_hi, n, m, scale2, out_mult,
                    cs_mult, row_off, col_off, lse_r_ptr, g_r_ptr, thr_r_ptr, lse_c_ptr,
                    g_c_ptr, thr_c_ptr, xb_ptr, yb_ptr, dx_ptr, cs_ptr, c1_ptr, sbias,
                    cs_stride, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, NUM_D: tl.constexpr, K: tl.constexpr,
                    SEGS: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
                    ROW_THR: tl.constexpr, COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
                    WANT_CS: tl.constexpr, PRECISION: tl.constexpr, HAS_MASK: tl.constexpr,
                    SHARED: tl.constexpr, SIGMOID: tl.constexpr):
  """The Matryoshka body of ``_lse_bwd_kernel`` for one row tile and column split:

      dx_i[segment k] = scale * sum_j C^k_ij y_j[segment k],
      C^k_ij = sum_{k' >= k} c^k'_ij a_k',i b_k',j,   cs_k,i = sum_j c^k_ij s^k_ij,

  with c^k the coefficient tile of dim k at the prefix cosines s^k = a_k b_k <x, y>_{:m_k}.
  Per column tile: one walk over the feature chunks (each column chunk loaded once
  for both dots) gives every prefix dot as a running sum and each dim's coefficients
  at its segment end; then the suffix sums C^k, from the last dim down, each
  multiply into their own segment's accumulators (one fp32 [BLOCK_M, BLOCK_D] tile
  per chunk): the GEMM work of one plain pass. Only the K coefficient tiles of the
  current column tile are kept (registers: 32 x 64 tiles with 8 warps fit an H200's
  255 per thread at D = 512, K = 4; 64-row tiles spill, and splitting the chunks
  over several launches to fit them did not pay on an H200: NOTES.md, 8947bc5).
  """
  rows = row0 + tl.arange(0, BLOCK_M)
  in_rows = rows < n
  acc = ()     # the rows' gradient, chunk by chunk
  for c in tl.static_range(NUM_D):
    acc = acc + (tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32),)
  cs = ()      # per dim: the rows' sums of c s
  c1 = ()      # and of c (SIGMOID)
  for k in tl.static_range(K):
    cs = cs + (tl.zeros([BLOCK_M], dtype=tl.float32),)
    c1 = c1 + (tl.zeros([BLOCK_M], dtype=tl.float32),)
  for j0 in range(j_lo, j_hi, BLOCK_N):
    cols = j0 + tl.arange(0, BLOCK_N)
    y_c = ()
    for c in tl.static_range(NUM_D):
      y_c = y_c + (load_tile(y_ptr, j0, m, c, D, BLOCK_N, BLOCK_D),)
    s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    coef_ab = ()
    for k in tl.static_range(K):
      # dim k's chunks: [end of dim k - 1, end of dim k) (constexpr bounds, inlined)
      for c in tl.static_range((SEGS << 16 >> (16 * k)) & 0xFFFF, (SEGS >> (16 * k)) & 0xFFFF):
        s = tl.dot(load_tile(x_ptr, row0, n, c, D, BLOCK_M, BLOCK_D), tl.trans(y_c[c]), s,
                   input_precision=PRECISION)
      a = tl.load(xt_ptr + k * n + rows, mask=in_rows, other=0.0)
      b = tl.load(yt_ptr + k * m + cols, mask=cols < m, other=0.0)
      s_k = s * a[:, None] * b[None, :]
      lse_r, g_r, thr_r = row_stats(lse_r_ptr + k * n, g_r_ptr + k * n, thr_r_ptr + k * n, rows,
                                    in_rows, BLOCK_M, HAS_ROW, ROW_THR)
      lse_c, g_c, thr_c = col_stats(lse_c_ptr + k * m, g_c_ptr + k * m, thr_c_ptr + k * m,
                                    cols, m, HAS_COL, COL_THR, SHARED, SIGMOID)
      coef = coefficient(s_k, scale2, row0, j0, rows, cols, row_off, col_off, n, m, lse_r,
                         g_r, thr_r, lse_c, g_c, thr_c, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N,
                         HAS_ROW, HAS_COL, ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK, SHARED,
                         SIGMOID=SIGMOID, sbias=sbias)
      if WANT_CS:
        cs = cs[:k] + (cs[k] + tl.sum(coef * s_k, 1),) + cs[k + 1:]
      if SIGMOID:
        c1 = c1[:k] + (c1[k] + tl.sum(coef, 1),) + c1[k + 1:]
      coef_ab = coef_ab + (coef * a[:, None] * b[None, :],)
    suffix = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.static_range(K - 1, -1, -1):
      suffix = suffix + coef_ab[k]
      for c in tl.static_range((SEGS << 16 >> (16 * k)) & 0xFFFF, (SEGS >> (16 * k)) & 0xFFFF):
        if y_c[c].dtype == tl.float16:   # the prefix tables (>= 1) could overflow fp16
          d = tl.dot(suffix, y_c[c].to(tl.float32), acc[c], input_precision="tf32")
        else:
          d = tl.dot(suffix.to(y_c[c].dtype), y_c[c], acc[c], input_precision=PRECISION)
        acc = acc[:c] + (d,) + acc[c + 1:]
  offs = tl.arange(0, BLOCK_M)[:, None] * D + tl.arange(0, BLOCK_D)[None, :]
  for c in tl.static_range(NUM_D):
    tl.store(dx_ptr + tl.cast(row0, tl.int64) * D + c * BLOCK_D + offs,
             (acc[c] * out_mult).to(dx_ptr.dtype.element_ty), mask=in_rows[:, None])
  if WANT_CS:
    for k in tl.static_range(K):
      tl.store(cs_ptr + k * cs_stride + rows, cs[k] * cs_mult, mask=in_rows)
  if SIGMOID:
    for k in tl.static_range(K):
      tl.store(c1_ptr + k * cs_stride + rows, c1[k] * cs_mult, mask=in_rows)


@triton.jit
def _tile_coef_bwd_kernel(
    # input pointers
    x_ptr, y_ptr,              # [n, D] rows, [m, D] columns
    scal_ptr,                  # [2] fp32: scale * log2(e), the SIGMOID bias
    off_ptr,                   # [3] int32: global offsets of row 0 and column 0, first slab row
    lse_r_ptr, g_r_ptr, thr_r_ptr,   # [K, n] row-role statistics (log2 units, +inf if empty)
    lse_c_ptr, g_c_ptr, thr_c_ptr,   # [K, m] column-role statistics
    xt_ptr, yt_ptr,            # [K, n], [K, m] fp32 prefix inverse norms, if HAS_TAB
    xb_ptr, yb_ptr,            # fp32 where biases of the rows / columns (0 kept, -inf
                               # removed), padded to whole tiles, if HAS_MASK
    # sizes
    n, m,
    # output pointers
    c_ptr,                     # [K, R, m] coefficient slabs (see below) / g_max
    cs_ptr,                    # [K, column tiles, R] fp32: per-tile sum_j c^k_ij s^k_ij / g_max
    cs_col_ptr,                # [K, R / BLOCK_M, m] fp32: per-tile sum_i c^k_ij s^k_ij / g_max
    c1_ptr,                    # [K, column tiles, R] fp32: per-tile sum_j c^k_ij / g_max
                               # (SIGMOID, WANT_SUM)
    sp_ptr, mx_ptr,            # [column tiles, R] fp32: per-tile sum_j softplus(z_ij + b) and
                               # max_j z_ij (log2 units), kept entries (FWD); WANT_MAX:
                               # mx the per-tile max_j s_ij of the entries with c > 0
    # constexprs
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_K: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    ROW_THR: tl.constexpr, COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
    WANT_CS: tl.constexpr, WANT_CS_COL: tl.constexpr, PRECISION: tl.constexpr,
    K: tl.constexpr, SEGS: tl.constexpr, HAS_TAB: tl.constexpr, HAS_MASK: tl.constexpr,
    TILE_SHIFT: tl.constexpr, SPAN: tl.constexpr, SIGMOID: tl.constexpr,
    FWD: tl.constexpr = False, EPI_SPLIT: tl.constexpr = 1, WANT_SUM: tl.constexpr = False,
    WANT_MAX: tl.constexpr = False,
):
  """One [BLOCK_M, BLOCK_N] tile of the softmax coefficients of a slab of R rows.

  Grid (R / BLOCK_M, column tiles), a plain GEMM tile with a coefficient epilogue
  (the cotangents come divided by g_max, so the stored tile lies in [-2, 2]).
  The launcher multiplies the slab into the gradient with one XLA dot,
  dx[slab] = scale * g_max * c[slab] @ y, so the gradient's GEMM runs at cuBLAS
  speed, and, paired, the columns' gradient from the same slab,
  dy += scale * g_max * c[slab]^T @ x[slab] (WANT_CS_COL: with its column sums of
  c s). Rows past n store zeros. TILE_SHIFT (both roles): one exponential per entry,
  on a shift the tile picks from its own statistics (``coefficient``).

  Matryoshka (K prefix dims, segment ends in SEGS as in the forward): feature
  segment k of dx takes the coefficients of every dim that contains it, so slab k
  holds the suffix sum C^k_ij = sum_{k' >= k} c^k'_ij a_k',i b_k',j and the launcher
  multiplies slab k with segment k of y only: the GEMM work of one plain pass. The
  dims are visited from the last, so one running sum is all that is kept: the full
  dot, then each shorter prefix dot walked afresh from feature 0 (as many chunks as
  subtracting the tails for a doubling ladder, and exactly the forward's sums: a
  difference full - tail would lose digits that the prefix tables, ~ D / m_k,
  amplify). SIGMOID: the pairwise sigmoid's coefficients, and their per-tile row sums.

  FWD (a plain one-sided sigmoid block): the forward's statistics from the same tiles,
  the per-tile sums of softplus(z + b) and maxima of z (``_tile_lse_fwd_kernel``'s),
  with sigmoid(z + b) from the same exponential (``sigmoid_softplus``): the gradient
  for the row cotangents g_r computed in the forward pass (``fwd_grad``), in
  EPI_SPLIT column chunks (``fwd_epilogue``).

  WANT_SUM / WANT_MAX (a plain block; ``lse_fwd_rows`` on the tiled gradient): the
  per-tile row sums of c and maxima of the kept s, as the FlashAttention-shaped
  kernel's ``rows_fwd`` gives them.
  """
  tl.static_assert(BLOCK_K >= 16)  # tl.dot
  tl.static_assert(not FWD or (SIGMOID and K == 1 and HAS_ROW and not HAS_COL and not ROW_THR))
  tl.static_assert(K == 1 or not (WANT_SUM or WANT_MAX))
  pid_n = tl.program_id(1)
  scale2 = tl.load(scal_ptr)
  sbias = tl.load(scal_ptr + 1)
  row_off, col_off, local0, row0, col0 = tile_origin(off_ptr, BLOCK_M, BLOCK_N)
  rows = row0 + tl.arange(0, BLOCK_M)
  cols = col0 + tl.arange(0, BLOCK_N)
  local = local0 + tl.arange(0, BLOCK_M)
  in_rows = rows < n
  zeros = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
  if FWD:
    s = tile_similarity(x_ptr, y_ptr, row0, col0, n, m, zeros, 0, NUM_K, D, BLOCK_M, BLOCK_N,
                        BLOCK_K, PRECISION)
    g_r = row_stats(lse_r_ptr, g_r_ptr, thr_r_ptr, rows, in_rows, BLOCK_M, HAS_ROW, False)[1]
    fwd_epilogue(s, c_ptr, cs_ptr, c1_ptr, sp_ptr, mx_ptr, local, scale2, sbias, g_r, rows,
                 row0, col0, row_off, col_off, n, m, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N,
                 EXCLUDE_SELF, HAS_MASK, WANT_CS, EPI_SPLIT)
  else:
    suffix = zeros  # C^k
    for k in tl.static_range(K - 1, -1, -1):
      # dim k's prefix dot: chunks [0, end of dim k) (constexpr bound, inlined)
      s = tile_similarity(x_ptr, y_ptr, row0, col0, n, m, zeros, 0, (SEGS >> (16 * k)) & 0xFFFF,
                          D, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
      if HAS_TAB:
        a = tl.load(xt_ptr + k * n + rows, mask=in_rows, other=0.0)
        b = tl.load(yt_ptr + k * m + cols, mask=cols < m, other=0.0)
        s = s * a[:, None] * b[None, :]
      lse_r, g_r, thr_r = row_stats(lse_r_ptr + k * n, g_r_ptr + k * n, thr_r_ptr + k * n, rows,
                                    in_rows, BLOCK_M, HAS_ROW, ROW_THR)
      lse_c, g_c, thr_c = col_stats(lse_c_ptr + k * m, g_c_ptr + k * m, thr_c_ptr + k * m,
                                    cols, m, HAS_COL, COL_THR, False, SIGMOID)
      coef = coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, lse_r, g_r,
                         thr_r, lse_c, g_c, thr_c, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N, HAS_ROW,
                         HAS_COL, ROW_THR, COL_THR, EXCLUDE_SELF, HAS_MASK, False, TILE_SHIFT,
                         SPAN, SIGMOID, sbias)
      if row0 + BLOCK_M > n:   # the column role sees zero rows there: keep the slab clean
        coef = tl.where(in_rows[:, None], coef, 0.0)
      if HAS_TAB:
        coef_ab = coef * a[:, None] * b[None, :]
      else:
        coef_ab = coef
      if k == K - 1:
        suffix = coef_ab
      else:
        suffix = suffix + coef_ab
      tl.store(c_ptr + (k * tl.num_programs(0) * BLOCK_M + local).to(tl.int64)[:, None] * m +
               cols[None, :], suffix.to(c_ptr.dtype.element_ty), mask=(cols < m)[None, :])
      cs_base = (k * tl.num_programs(1) + pid_n) * tl.num_programs(0) * BLOCK_M
      if WANT_CS:
        tl.store(cs_ptr + cs_base + local, tl.sum(coef * s, 1))
      if SIGMOID or WANT_SUM:
        tl.store(c1_ptr + cs_base + local, tl.sum(coef, 1))
      if WANT_MAX:   # (c > 0: the kept entries; none that matters flushes to 0)
        tl.store(mx_ptr + cs_base + local, tl.max(tl.where(coef > 0.0, s, float("-inf")), 1))
      if WANT_CS_COL:   # rows past n have coef 0
        col_base = (k * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * m
        tl.store(cs_col_ptr + col_base + cols, tl.sum(coef * s, 0), mask=cols < m)


@triton.jit
def fwd_epilogue(s, c_ptr, cs_ptr, c1_ptr, sp_ptr, mx_ptr, local, scale2, sbias, g_r, rows,
                 row0, col0, row_off, col_off, n, m, xb_ptr, yb_ptr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, EXCLUDE_SELF: tl.constexpr, HAS_MASK: tl.constexpr,
                 WANT_CS: tl.constexpr, SPLIT: tl.constexpr):
  """The FWD tile's epilogue on ``s`` in SPLIT (1, 2 or 4) column chunks, one after
  the other, so that a thread's temporaries stay those of one chunk (a 128-wide tile
  spilled otherwise): each chunk's coefficients stored in the slab ``c_ptr`` (rows
  ``local``), and the tile's row sums of c s, c and softplus and its row maxima of z
  in its column tile's entries of the per-tile outputs. Every pointer is formed at its
  store (formed ahead of the GEMM, they stayed live through it: 168 instead of 141
  registers a thread at 64 x 64, 4 warps, in an sm_90 compile)."""
  tl.static_assert(SPLIT == 1 or SPLIT == 2 or SPLIT == 4)
  parts = (s,)   # the chunks, left to right
  if SPLIT >= 2:
    parts = halves(s, BLOCK_M, BLOCK_N)
  if SPLIT == 4:
    parts = halves(parts[0], BLOCK_M, BLOCK_N // 2) + halves(parts[1], BLOCK_M, BLOCK_N // 2)
  cs, c1, sp, mx = fwd_chunk(parts[0], c_ptr, local, scale2, sbias, g_r, rows, row0, col0,
                             row_off, col_off, n, m, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N // SPLIT,
                             EXCLUDE_SELF, HAS_MASK, WANT_CS)
  for i in tl.static_range(1, SPLIT):
    cs, c1, sp, mx = merge((cs, c1, sp, mx), fwd_chunk(
        parts[i], c_ptr, local, scale2, sbias, g_r, rows, row0, col0 + i * (BLOCK_N // SPLIT),
        row_off, col_off, n, m, xb_ptr, yb_ptr, BLOCK_M, BLOCK_N // SPLIT, EXCLUDE_SELF,
        HAS_MASK, WANT_CS))
  at = tl.program_id(1) * tl.num_programs(0) * BLOCK_M + local
  if WANT_CS:
    tl.store(cs_ptr + at, cs)
  tl.store(c1_ptr + at, c1)
  tl.store(sp_ptr + at, sp)
  tl.store(mx_ptr + at, mx)


@triton.jit
def halves(v, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """[BLOCK_M, BLOCK_N] ``v`` as its column halves (a thread holds columns of both)."""
  return tl.split(tl.permute(tl.reshape(v, [BLOCK_M, 2, BLOCK_N // 2]), [0, 2, 1]))


@triton.jit
def merge(a, b):
  """Two chunks' (sum c s, sum c, sum softplus, max z) rows as the tile's."""
  return a[0] + b[0], a[1] + b[1], a[2] + b[2], tl.maximum(a[3], b[3])


@triton.jit
def fwd_chunk(s, c_ptr, local, scale2, sbias, g_r, rows, row0, col0, row_off, col_off, n, m, xb_ptr,
              yb_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
              HAS_MASK: tl.constexpr, WANT_CS: tl.constexpr):
  """One column chunk [col0, col0 + BLOCK_N) of a FWD tile: z as the forward takes it
  (``where``-removed rows dropped too, their c must be 0), c = g_r sigmoid(z + b)
  stored, and the chunk's (sum_j c s, sum_j c, sum_j softplus(z + b), max_j z) rows.
  The row statistics are reduced as soon as their chunk is formed: kept to the stores,
  z and the softplus tile held twice the registers (sm_90, 64 x 64 tile, 4 warps:
  245 -> 128 a thread, so twice the resident programs)."""
  cols = col0 + tl.arange(0, BLOCK_N)
  z = logits(s, scale2, load_bias(xb_ptr, rows, HAS_MASK), load_bias(yb_ptr, cols, HAS_MASK),
             HAS_MASK, True)
  z = drop_pairs(z, float("-inf"), row0, col0, rows, cols, row_off, col_off, m, BLOCK_M,
                 BLOCK_N, EXCLUDE_SELF)
  if row0 + BLOCK_M > n:
    z = tl.where((rows < n)[:, None], z, float("-inf"))
  mx = tl.max(z, 1)
  sig, sp = sigmoid_softplus(z * 0.6931471805599453 + sbias)
  sp = tl.sum(sp, 1)
  coef = g_r[:, None] * sig
  c1 = tl.sum(coef, 1)
  cs = tl.zeros([BLOCK_M], dtype=tl.float32)
  if WANT_CS:
    cs = tl.sum(coef * s, 1)
  tl.store(c_ptr + local.to(tl.int64)[:, None] * m + cols[None, :],
           coef.to(c_ptr.dtype.element_ty), mask=(cols < m)[None, :])
  return cs, c1, sp, mx
