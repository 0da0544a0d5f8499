"""@triton.jit helpers shared by the statistics and gradient kernels: tile loads,
the similarity tile, the keep mask and log2-domain log-sum-exp merges.

Everything is in the exp2 domain: logits are ``z = s * scale * log2(e)`` and
log-normalizers are in log2 units; the launchers convert.
"""

import triton
import triton.language as tl


@triton.jit
def load_rows(ptr, rows, n, stride, feats, d):
  """[R, F] tile of a row-major [n, d] tensor; rows >= n and features >= d read 0."""
  offs = rows.to(tl.int64)[:, None] * stride + feats[None, :]
  return tl.load(ptr + offs, mask=(rows[:, None] < n) & (feats[None, :] < d), other=0.0)


@triton.jit
def similarity(x_t, x_ptr, y_ptr, rows, cols, n, m, d, stride_xn, stride_ym,
               BLOCK_D: tl.constexpr, NUM_D: tl.constexpr, PRECISION: tl.constexpr):
  """s = x[rows] . y[cols]^T, fp32 [BLOCK_M, BLOCK_N], and the column tile.

  NUM_D == 1: the row tile ``x_t`` is resident and the whole [BLOCK_N, BLOCK_D]
  column tile is loaded once (returned for reuse by the gradient dot). Otherwise
  the features are walked in NUM_D chunks of BLOCK_D, reloading both tiles.
  """
  feats = tl.arange(0, BLOCK_D)
  if NUM_D == 1:
    y_t = load_rows(y_ptr, cols, m, stride_ym, feats, d)
    s = tl.dot(x_t, tl.trans(y_t), input_precision=PRECISION)
  else:
    y_t = tl.zeros([1, 1], dtype=tl.float32)   # nothing to reuse
    s = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float32)
    for c in range(NUM_D):
      f = c * BLOCK_D + feats
      x_c = load_rows(x_ptr, rows, n, stride_xn, f, d)
      y_c = load_rows(y_ptr, cols, m, stride_ym, f, d)
      s = tl.dot(x_c, tl.trans(y_c), s, input_precision=PRECISION)
  return s, y_t


@triton.jit
def keep_mask(s, rows, cols, n, m, row_off, col_off, thr_r, thr_c,
              ROW_THR: tl.constexpr, COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr):
  """Entries that enter a softmax: in range, not the self pair (global indices,
  EXCLUDE_SELF), and s <= the row's (ROW_THR) / column's (COL_THR) threshold."""
  keep = (rows[:, None] < n) & (cols[None, :] < m)
  if EXCLUDE_SELF:
    keep = keep & ((rows + row_off)[:, None] != (cols + col_off)[None, :])
  if ROW_THR:
    keep = keep & (s <= thr_r[:, None])
  if COL_THR:
    keep = keep & (s <= thr_c[None, :])
  return keep


@triton.jit
def safe_max(v):
  """A shift for exp2: the max itself, or 0 where it is -inf (nothing kept)."""
  return tl.where(v == float("-inf"), 0.0, v)


@triton.jit
def lse2_merge(a, b):
  """log2(2^a + 2^b), exact -inf where both are -inf."""
  mx = safe_max(tl.maximum(a, b))
  return mx + tl.log2(tl.exp2(a - mx) + tl.exp2(b - mx))
