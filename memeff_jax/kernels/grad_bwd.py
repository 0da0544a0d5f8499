"""Gradient kernel: one FlashAttention-shaped pass per output tower."""

import triton
import triton.language as tl

from memeff_jax.kernels._common import keep_mask, load_rows, similarity


@triton.jit
def _lse_bwd_kernel(
    # input pointers
    x_ptr, y_ptr,              # [n, d] rows whose gradient this pass writes, [m, d] columns
    scal_ptr,                  # [3] fp32: scale * log2(e), scale * g_max, g_max
    off_ptr,                   # [2] int32: global offsets of row 0 and column 0
    lse_r_ptr, g_r_ptr, thr_r_ptr,   # [n] row-role statistics (log2 units, +inf if empty)
    lse_c_ptr, g_c_ptr, thr_c_ptr,   # [m] column-role statistics
    # sizes and strides
    n, m, d, stride_xn, stride_ym,
    cols_per_split,            # columns one program sweeps (a multiple of BLOCK_N)
    # output pointers
    dx_ptr,                    # [splits, n, d]: scale * g_max * sum_j c_ij y_j
    cs_ptr,                    # [splits, n] fp32: g_max * sum_j c_ij s_ij
    # constexprs
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_D: tl.constexpr, BLOCK_DO: tl.constexpr, REUSE_Y: tl.constexpr,
    HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, ROW_THR: tl.constexpr,
    COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr, PRECISION: tl.constexpr,
):
  """dx_i = scale * sum_j c_ij y_j with the softmax coefficient

      c_ij = g_r_i keep^r_ij 2^(z_ij - lse_r_i) + g_c_j keep^c_ij 2^(z_ij - lse_c_j).

  Grid (row tiles, feature chunks of BLOCK_DO, column splits). A program owns
  BLOCK_M rows and BLOCK_DO gradient features in an fp32 register tile written
  once (no atomics: deterministic). The cotangents come divided by g_max so the
  coefficient tile, cast to the input dtype for the dot, stays in [-2, 2] (no
  fp16 underflow at large batches); g_max is multiplied back in fp32.
  """
  tl.static_assert(BLOCK_D >= 16)  # tl.dot
  pid_m = tl.program_id(0)
  pid_o = tl.program_id(1)
  pid_s = tl.program_id(2)
  scale2 = tl.load(scal_ptr)
  out_mult = tl.load(scal_ptr + 1)
  cs_mult = tl.load(scal_ptr + 2)
  row_off = tl.load(off_ptr)
  col_off = tl.load(off_ptr + 1)
  rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  feats_o = pid_o * BLOCK_DO + tl.arange(0, BLOCK_DO)
  x_t = tl.zeros([1, 1], dtype=tl.float32)
  if NUM_D == 1:
    x_t = load_rows(x_ptr, rows, n, stride_xn, tl.arange(0, BLOCK_D), d)
  in_rows = rows < n
  lse_r = tl.zeros([BLOCK_M], dtype=tl.float32)
  g_r = tl.zeros([BLOCK_M], dtype=tl.float32)
  thr_r = tl.zeros([BLOCK_M], dtype=tl.float32)
  if HAS_ROW:
    lse_r = tl.load(lse_r_ptr + rows, mask=in_rows, other=float("inf"))
    g_r = tl.load(g_r_ptr + rows, mask=in_rows, other=0.0)
    if ROW_THR:
      thr_r = tl.load(thr_r_ptr + rows, mask=in_rows, other=0.0)
  acc = tl.zeros([BLOCK_M, BLOCK_DO], dtype=tl.float32)
  cs = tl.zeros([BLOCK_M], dtype=tl.float32)
  j_lo = pid_s * cols_per_split
  j_hi = tl.minimum(m, j_lo + cols_per_split)
  for j0 in range(j_lo, j_hi, BLOCK_N):
    cols = j0 + tl.arange(0, BLOCK_N)
    in_cols = cols < m
    s, y_t = similarity(x_t, x_ptr, y_ptr, rows, cols, n, m, d, stride_xn, stride_ym,
                        BLOCK_D, NUM_D, PRECISION)
    z = s * scale2
    coef = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if HAS_ROW:   # row-role softmax: g_i * P_ij
      keep = keep_mask(s, rows, cols, n, m, row_off, col_off, thr_r, thr_r,
                       ROW_THR, False, EXCLUDE_SELF)
      coef += tl.where(keep, g_r[:, None] * tl.exp2(z - lse_r[:, None]), 0.0)
    if HAS_COL:   # column-role softmax: g_j * P_ji
      lse_c = tl.load(lse_c_ptr + cols, mask=in_cols, other=float("inf"))
      g_c = tl.load(g_c_ptr + cols, mask=in_cols, other=0.0)
      thr_c = tl.zeros([BLOCK_N], dtype=tl.float32)
      if COL_THR:
        thr_c = tl.load(thr_c_ptr + cols, mask=in_cols, other=0.0)
      keep = keep_mask(s, rows, cols, n, m, row_off, col_off, thr_c, thr_c,
                       False, COL_THR, EXCLUDE_SELF)
      coef += tl.where(keep, g_c[None, :] * tl.exp2(z - lse_c[None, :]), 0.0)
    cs += tl.sum(coef * s, 1)
    if REUSE_Y:
      y_o = y_t
    else:
      y_o = load_rows(y_ptr, cols, m, stride_ym, feats_o, d)
    acc = tl.dot(coef.to(y_o.dtype), y_o, acc, input_precision=PRECISION)
  dx = acc * out_mult
  offs = (pid_s.to(tl.int64) * n + rows.to(tl.int64))[:, None] * d + feats_o[None, :]
  tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty),
           mask=in_rows[:, None] & (feats_o[None, :] < d))
  if pid_o == 0:
    tl.store(cs_ptr + pid_s.to(tl.int64) * n + rows, cs * cs_mult, mask=in_rows)
