"""Forward kernel: row (and column) log-sum-exp statistics of a masked similarity block."""

import triton
import triton.language as tl

from memeff_jax.kernels._common import keep_mask, lse2_merge, load_rows, safe_max, similarity


@triton.jit
def _lse_fwd_kernel(
    # input pointers
    x_ptr, y_ptr,            # [n, d], [m, d] (row-major)
    scal_ptr,                # [1] fp32: scale * log2(e)
    thr_ptr,                 # [n] fp32 row thresholds (raw similarity), if ROW_THR
    off_ptr,                 # [2] int32: global offsets of row 0 and column 0
    # sizes and strides
    n, m, d, stride_xn, stride_ym,
    cols_per_split,          # columns one program sweeps (a multiple of BLOCK_N)
    # output pointers
    lse_row_ptr,             # [splits, n] fp32, log2 units
    lse_col_ptr,             # [programs, m] fp32, log2 units (TWO_SIDED)
    # constexprs
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D: tl.constexpr, ROW_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr,
    TWO_SIDED: tl.constexpr, PRECISION: tl.constexpr,
):
  """lse_row_i = log2 sum_j keep_ij 2^(z_ij) over this split's columns.

  Grid (programs, splits). A program takes row tiles pid, pid + programs, ... and
  sweeps its split of the columns with an online (max, sum) per row. TWO_SIDED:
  each program also keeps one partial column log-sum-exp per column (read-modify-
  write of its own row of lse_col: no atomics, deterministic), merged in JAX.
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
  for rb in range(pid_p, tl.cdiv(n, BLOCK_M), num_p):
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    x_t = tl.zeros([1, 1], dtype=tl.float32)
    if NUM_D == 1:
      x_t = load_rows(x_ptr, rows, n, stride_xn, tl.arange(0, BLOCK_D), d)
    thr = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ROW_THR:
      thr = tl.load(thr_ptr + rows, mask=rows < n, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)   # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)            # running sum of 2^(z - m_i)
    for j0 in range(j_lo, j_hi, BLOCK_N):
      cols = j0 + tl.arange(0, BLOCK_N)
      s, _ = similarity(x_t, x_ptr, y_ptr, rows, cols, n, m, d, stride_xn, stride_ym,
                        BLOCK_D, NUM_D, PRECISION)
      keep = keep_mask(s, rows, cols, n, m, row_off, col_off, thr, thr,
                       ROW_THR, False, EXCLUDE_SELF)
      z = tl.where(keep, s * scale2, float("-inf"))
      m_new = tl.maximum(m_i, tl.max(z, 1))
      shift = safe_max(m_new)
      l_i = l_i * tl.exp2(m_i - shift) + tl.sum(tl.exp2(z - shift[:, None]), 1)
      m_i = m_new
      if TWO_SIDED:
        c_max = safe_max(tl.max(z, 0))
        c_lse = c_max + tl.log2(tl.sum(tl.exp2(z - c_max[None, :]), 0))
        seen = tl.where(rb == pid_p, 0, m)   # nothing stored yet on this program's first tile
        old = tl.load(col_part + cols, mask=cols < seen, other=float("-inf"))
        tl.store(col_part + cols, lse2_merge(old, c_lse), mask=cols < m)
    lse = m_i + tl.log2(l_i)   # -inf where nothing was kept
    tl.store(lse_row_ptr + pid_s.to(tl.int64) * n + rows, lse, mask=rows < n)
