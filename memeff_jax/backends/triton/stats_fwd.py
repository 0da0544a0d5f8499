"""Forward kernels: row (and column) log-sum-exp statistics of a masked similarity block,
and the largest kept logit of each row (column), for the in-batch accuracy.

``_lse_fwd_kernel`` sweeps the columns with a resident row tile and an online
(max, sum) per row; ``_tile_lse_fwd_kernel`` is one GEMM tile with a partial
statistics epilogue for both sides, launched over slabs of rows. memeff_jax.config picks one
per feature size (the tiled form wins once the GEMM is deep enough to hide its
exponentials). The tiled form also has a bounded-shift epilogue (BOUNDED): one
exponential per entry against a fixed shift serves both sides, with no maxima
(ring.forward checks the statistics and falls back to the exact form).
"""

import triton
import triton.language as tl

from memeff_jax.backends.triton._common import (drop_pairs, load_bias, load_tile, logits, lse2,
                                                lse2_merge, safe_max, similarity, softplus,
                                                tile_origin, tile_similarity)


@triton.jit
def _lse_fwd_kernel(
    # input pointers
    x_ptr, y_ptr,            # [n, D], [m, D] (row-major, contiguous)
    scal_ptr,                # [1] fp32: scale * log2(e)
    thr_ptr,                 # [n] fp32 row thresholds (raw similarity), if ROW_THR
    off_ptr,                 # [2] int32: global offsets of row 0 and column 0
    xb_ptr, yb_ptr,          # fp32 where biases of the rows / columns (0 kept, -inf removed),
                             # padded to whole tiles, if HAS_MASK
    # sizes
    n, m,
    cols_per_split,          # columns one program sweeps (a multiple of BLOCK_N)
    # output pointers
    lse_row_ptr,             # [splits, n] fp32, log2 units
    lse_col_ptr,             # [programs, m] fp32, log2 units (TWO_SIDED)
    max_row_ptr,             # [splits, n] fp32: the rows' largest kept z (log2 units)
    max_col_ptr,             # [programs, m] fp32: the columns' (TWO_SIDED)
    # constexprs
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D: tl.constexpr, ROW_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
    TWO_SIDED: tl.constexpr, PRECISION: tl.constexpr, HAS_MASK: tl.constexpr,
):
  """lse_row_i = log2 sum_j keep_ij 2^(z_ij) over this split's columns.

  Grid (programs, splits). A program takes row tiles pid, pid + programs, ... and
  sweeps its split of the columns with an online (max, sum) per row. TWO_SIDED:
  each program also keeps one partial column log-sum-exp per column (read-modify-
  write of its own row of lse_col: no atomics, deterministic), merged in JAX.
  Masks cost only where they can bite: the diagonal on tiles that hold it, column
  range on the last column tile, row range (TWO_SIDED) on the last row tile.
  """
  tl.static_assert(BLOCK_D >= 16)  # tl.dot
  pid_p = tl.program_id(0)
  pid_s = tl.program_id(1)
  num_p = tl.num_programs(0)
  scale2 = tl.load(scal_ptr)
  row_off = tl.load(off_ptr)
  col_off = tl.load(off_ptr + 1)
  j_lo = pid_s * cols_per_split
  j_hi = tl.minimum(m, j_lo + cols_per_split)
  col_part = lse_col_ptr + pid_p.to(tl.int64) * m
  col_max = max_col_ptr + pid_p.to(tl.int64) * m
  for rb in range(pid_p, tl.cdiv(n, BLOCK_M), num_p):
    row0 = rb * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    x_t = tl.zeros([1, 1], dtype=tl.float32)
    if NUM_D == 1:
      x_t = load_tile(x_ptr, row0, n, 0, D, BLOCK_M, BLOCK_D)
    thr = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ROW_THR:
      thr = tl.load(thr_ptr + rows, mask=rows < n, other=0.0)
    bias_r = load_bias(xb_ptr, rows, HAS_MASK)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)   # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)            # running sum of 2^(z - m_i)
    for j0 in range(j_lo, j_hi, BLOCK_N):
      cols = j0 + tl.arange(0, BLOCK_N)
      bias_c = load_bias(yb_ptr, cols, HAS_MASK)
      s, _ = similarity(x_t, x_ptr, y_ptr, row0, j0, n, m, D, BLOCK_M, BLOCK_N, BLOCK_D,
                        NUM_D, PRECISION)
      z = logits(s, scale2, bias_r, bias_c, HAS_MASK, TWO_SIDED)
      if ROW_THR:
        z = tl.where(s <= thr[:, None], z, float("-inf"))
      z = drop_pairs(z, float("-inf"), row0, j0, rows, cols, row_off, col_off, m, BLOCK_M,
                     BLOCK_N, EXCLUDE_SELF)
      m_new = tl.maximum(m_i, tl.max(z, 1))
      shift = safe_max(m_new)
      l_i = l_i * tl.exp2(m_i - shift) + tl.sum(tl.exp2(z - shift[:, None]), 1)
      m_i = m_new
      if TWO_SIDED:
        if row0 + BLOCK_M > n:
          z = tl.where((rows < n)[:, None], z, float("-inf"))
        c_lse, c_max = lse2(z, 0)
        seen = tl.where(rb == pid_p, 0, m)   # nothing stored yet on this program's first tile
        old = tl.load(col_part + cols, mask=cols < seen, other=float("-inf"))
        tl.store(col_part + cols, lse2_merge(old, c_lse), mask=cols < m)
        old = tl.load(col_max + cols, mask=cols < seen, other=float("-inf"))
        tl.store(col_max + cols, tl.maximum(old, c_max), mask=cols < m)
    lse = m_i + tl.log2(l_i)   # -inf where nothing was kept
    tl.store(lse_row_ptr + pid_s.to(tl.int64) * n + rows, lse, mask=rows < n)
    tl.store(max_row_ptr + pid_s.to(tl.int64) * n + rows, m_i, mask=rows < n)


@triton.jit
def _tile_lse_fwd_kernel(
    # input pointers
    x_ptr, y_ptr,            # [n, D], [m, D] (row-major, contiguous)
    scal_ptr,                # [3] fp32: scale * log2(e), the BOUNDED shift (log2 units), the
                             # SIGMOID bias
    thr_ptr,                 # [K, n] fp32 row thresholds (raw similarity), if ROW_THR
    off_ptr,                 # [3] int32: global offsets of row 0 and column 0, first slab row
    xt_ptr, yt_ptr,          # [K, n], [K, m] fp32 prefix inverse norms, if HAS_TAB
    xb_ptr, yb_ptr,          # fp32 where biases of the rows / columns (0 kept, -inf removed),
                             # padded to whole slabs / tiles, if HAS_MASK
    # sizes
    n, m,
    # output pointers
    row_part_ptr,            # [K, column tiles, R] fp32: per-tile row log-sum-exp (log2 units;
                             # BOUNDED: the sum of 2^(z - shift))
    col_part_ptr,            # [K, R / BLOCK_M, m] fp32: the same per column (TWO_SIDED)
    row_max_ptr,             # [K, column tiles, R] fp32: per-tile row max z (log2 units), if
                             # WANT_MAX
    col_max_ptr,             # [K, R / BLOCK_M, m] fp32: per-tile column max z (TWO_SIDED)
    # constexprs
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_K: tl.constexpr, ROW_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
    TWO_SIDED: tl.constexpr, PRECISION: tl.constexpr, K: tl.constexpr, SEGS: tl.constexpr,
    HAS_TAB: tl.constexpr, HAS_MASK: tl.constexpr, BOUNDED: tl.constexpr,
    WANT_MAX: tl.constexpr, SIGMOID: tl.constexpr,
):
  """One [BLOCK_M, BLOCK_N] tile of a slab of R rows: its row and column partial
  log-sum-exps, each over the tile only, merged in JAX.

  Grid (R / BLOCK_M, column tiles): every program is a plain GEMM tile (the features
  walked in NUM_K pipelined chunks of BLOCK_K) with a statistics epilogue, so one
  sweep gives both the row and the column statistics with exact maxima, no atomics
  and a fixed reduction order.

  Matryoshka (K prefix dims): the chunks walk on in K segments; dim k ends after
  chunk ``(SEGS >> 16 k) & 0xFFFF`` (the launcher aligns every dim to a chunk), and
  its epilogue takes the prefix cosines s^k = a_k,i b_k,j <x_i, y_j>_{:m_k} from the
  running dot: one feature walk for every dim. Without dims, K = 1 and SEGS = NUM_K.
  BOUNDED: every kept entry's 2^(z - shift), one exponential for both sides, summed
  over the tile's rows and columns: no maxima, no max reductions (on an H200 the
  two-sided epilogue takes half the time: 3.1 against 6.5 ms at B = 65536, D = 64).
  The launcher picks the shift so that no term overflows; ``ring.forward`` checks that
  no statistic underflowed (``launch.fwd_floor``). WANT_MAX also stores the maxima
  (the in-batch accuracy); the exact epilogue always does.
  SIGMOID (one-sided, exact): the row partials are sums of softplus(z ln 2 + bias) (the
  pairwise sigmoid's negatives, docs/math.md §13), natural units, added in JAX.
  """
  tl.static_assert(BLOCK_K >= 16)  # tl.dot
  tl.static_assert(not (SIGMOID and (TWO_SIDED or BOUNDED)))
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  scale2 = tl.load(scal_ptr)
  shift = 0.0
  if BOUNDED:
    shift = tl.load(scal_ptr + 1)
  row_off, col_off, local0, row0, col0 = tile_origin(off_ptr, BLOCK_M, BLOCK_N)
  rows = row0 + tl.arange(0, BLOCK_M)
  cols = col0 + tl.arange(0, BLOCK_N)
  local = local0 + tl.arange(0, BLOCK_M)
  bias_r = load_bias(xb_ptr, rows, HAS_MASK)
  bias_c = load_bias(yb_ptr, cols, HAS_MASK)
  s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
  for k in tl.static_range(K):
    # dim k's chunks: [end of dim k - 1, end of dim k) (constexpr: inlined, an
    # assignment would make them tensors)
    s = tile_similarity(x_ptr, y_ptr, row0, col0, n, m, s, (SEGS << 16 >> (16 * k)) & 0xFFFF,
                        (SEGS >> (16 * k)) & 0xFFFF, D, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    s_k = s
    if HAS_TAB:
      a = tl.load(xt_ptr + k * n + rows, mask=rows < n, other=0.0)
      b = tl.load(yt_ptr + k * m + cols, mask=cols < m, other=0.0)
      s_k = s * a[:, None] * b[None, :]
    z = logits(s_k, scale2, bias_r, bias_c, HAS_MASK, TWO_SIDED)
    if ROW_THR:
      thr = tl.load(thr_ptr + k * n + rows, mask=rows < n, other=0.0)
      z = tl.where(s_k <= thr[:, None], z, float("-inf"))
    z = drop_pairs(z, float("-inf"), row0, col0, rows, cols, row_off, col_off, m, BLOCK_M,
                   BLOCK_N, EXCLUDE_SELF)
    if TWO_SIDED:
      if row0 + BLOCK_M > n:
        z = tl.where((rows < n)[:, None], z, float("-inf"))
    row_base = (k * tl.num_programs(1) + pid_n) * tl.num_programs(0) * BLOCK_M
    col_base = (k * tl.num_programs(0) + pid_m).to(tl.int64) * m
    if BOUNDED:
      e = tl.exp2(z - shift)   # 0 where dropped
      tl.store(row_part_ptr + row_base + local, tl.sum(e, 1))
      if TWO_SIDED:
        tl.store(col_part_ptr + col_base + cols, tl.sum(e, 0), mask=cols < m)
      if WANT_MAX:
        tl.store(row_max_ptr + row_base + local, tl.max(z, 1))
        if TWO_SIDED:
          tl.store(col_max_ptr + col_base + cols, tl.max(z, 0), mask=cols < m)
    elif SIGMOID:
      sp = softplus(z * 0.6931471805599453 + tl.load(scal_ptr + 2))   # 0 where dropped
      tl.store(row_part_ptr + row_base + local, tl.sum(sp, 1))
      tl.store(row_max_ptr + row_base + local, tl.max(z, 1))
    else:
      r_lse, r_max = lse2(z, 1)
      tl.store(row_part_ptr + row_base + local, r_lse)
      tl.store(row_max_ptr + row_base + local, r_max)
      if TWO_SIDED:
        c_lse, c_max = lse2(z, 0)
        tl.store(col_part_ptr + col_base + cols, c_lse, mask=cols < m)
        tl.store(col_max_ptr + col_base + cols, c_max, mask=cols < m)
