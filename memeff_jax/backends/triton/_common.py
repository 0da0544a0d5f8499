"""@triton.jit helpers shared by the statistics and gradient kernels: tile loads,
the similarity tile, the diagonal test and log2-domain log-sum-exp merges.

Everything is in the exp2 domain: logits are ``z = s * scale * log2(e)`` and
log-normalizers are in log2 units; the launchers convert. The feature size D is a
constexpr (rows are contiguous, stride D), so the in-tile offsets are int32
constants the compiler can hoist; a tile's row base is an int64 scalar (n * D may
pass 2**31).
"""

import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, row0, n, c, D: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
              TMA: tl.constexpr = False):
  """Rows [row0, row0 + ROWS) x features [c * BLOCK_D, (c + 1) * BLOCK_D) of a
  row-major [n, D] tensor; zero outside it. TMA: ``ptr`` is a tensor descriptor of
  [ROWS, BLOCK_D] blocks (the copy engine fills outside the tensor with zeros)."""
  if TMA:   # (an early return would still compile the pointer arithmetic below)
    t = ptr.load([row0, c * BLOCK_D])
  else:
    r = tl.arange(0, ROWS)
    f = c * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (row0 + r)[:, None] < n
    if D % BLOCK_D != 0:   # only a ragged feature size needs the feature mask
      mask = mask & (f[None, :] < D)
    t = tl.load(ptr + tl.cast(row0, tl.int64) * D + (r[:, None] * D + f[None, :]), mask=mask,
                other=0.0)
  return t


@triton.jit
def similarity(x_t, x_ptr, y_ptr, row0, col0, n, m, D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D: tl.constexpr,
               PRECISION: tl.constexpr, TMA: tl.constexpr = False):
  """s = x[rows] . y[cols]^T, fp32 [BLOCK_M, BLOCK_N], and the column tile.

  NUM_D == 1: the row tile ``x_t`` is resident and the whole [BLOCK_N, BLOCK_D]
  column tile is loaded once (returned for reuse by the gradient dot; TMA: ``y_ptr``
  is a descriptor of such tiles). Otherwise
  the features are walked in NUM_D chunks of BLOCK_D, reloading both tiles.
  """
  if NUM_D == 1:
    y_t = load_tile(y_ptr, col0, m, 0, D, BLOCK_N, BLOCK_D, TMA)
    s = tl.dot(x_t, tl.trans(y_t), input_precision=PRECISION)
  else:
    y_t = tl.zeros([1, 1], dtype=tl.float32)   # nothing to reuse
    s = tile_similarity(x_ptr, y_ptr, row0, col0, n, m,
                        tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), 0, NUM_D, D, BLOCK_M,
                        BLOCK_N, BLOCK_D, PRECISION)
  return s, y_t


@triton.jit
def tile_similarity(x_ptr, y_ptr, row0, col0, n, m, s, C_LO: tl.constexpr, C_HI: tl.constexpr,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
  """s + x[rows] . y[cols]^T over the feature chunks [C_LO, C_HI) of width BLOCK_K,
  fp32 [BLOCK_M, BLOCK_N]: a plain GEMM K loop, software-pipelined by Triton."""
  for c in range(C_LO, C_HI):
    x_c = load_tile(x_ptr, row0, n, c, D, BLOCK_M, BLOCK_K)
    y_c = load_tile(y_ptr, col0, m, c, D, BLOCK_N, BLOCK_K)
    s = tl.dot(x_c, tl.trans(y_c), s, input_precision=PRECISION)
  return s


@triton.jit
def on_diagonal(row0, col0, row_off, col_off, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """Whether the tile holds a pair with global row index == global column index."""
  r, c = row0 + row_off, col0 + col_off
  return (c < r + BLOCK_M) & (r < c + BLOCK_N)


@triton.jit
def self_tiles(row0, j_lo, j_hi, row_off, col_off, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
  """[d0, d1): the column tiles j_lo + k BLOCK_N of [j_lo, j_hi) that ``on_diagonal``
  finds holding self pairs of the rows [row0, row0 + BLOCK_M) (none: d0 = d1), so that
  a loop over the others skips the test."""
  ntiles = (j_hi - j_lo + BLOCK_N - 1) // BLOCK_N
  diag = row0 + row_off - col_off   # the local column of row0's self pair
  u = diag - BLOCK_N - j_lo         # tile k holds one where k BLOCK_N > u ...
  k0 = tl.minimum(tl.where(u < 0, 0, u // BLOCK_N + 1), ntiles)
  v = diag + BLOCK_M - j_lo         # ... and k BLOCK_N < v
  k1 = tl.maximum(k0, tl.minimum(tl.where(v <= 0, 0, (v + BLOCK_N - 1) // BLOCK_N), ntiles))
  return j_lo + k0 * BLOCK_N, j_lo + k1 * BLOCK_N


@triton.jit
def off_diagonal(rows, cols, row_off, col_off):
  """[rows, cols] mask: global row index != global column index."""
  return (rows + row_off)[:, None] != (cols + col_off)[None, :]


@triton.jit
def safe_max(v):
  """A shift for exp2: the max itself, or 0 where it is -inf (nothing kept)."""
  return tl.where(v == float("-inf"), 0.0, v)


@triton.jit
def lse2_merge(a, b):
  """log2(2^a + 2^b), exact -inf where both are -inf."""
  mx = safe_max(tl.maximum(a, b))
  return mx + tl.log2(tl.exp2(a - mx) + tl.exp2(b - mx))


@triton.jit
def lse2(z, AXIS: tl.constexpr):
  """(log2 sum 2^z, max z) along AXIS, the sum shifted by the max; both -inf where
  every entry is -inf. The max feeds the in-batch accuracy (does the positive beat it)."""
  top = tl.max(z, AXIS)
  mx = safe_max(top)
  return mx + tl.log2(tl.sum(tl.exp2(z - tl.expand_dims(mx, AXIS)), AXIS)), top


@triton.jit
def softplus(u):
  """log(1 + e^u) to fp32 rounding for every u, 0 at -inf (a dropped entry):
  max(u, 0) + log1p(e^-|u|), log1p by ``log1p_unit`` (Triton has no log1p, and
  log(1 + e) alone loses e's digits)."""
  return sigmoid_softplus(u)[1]


@triton.jit
def sigmoid_softplus(u):
  """``(sigmoid(u), softplus(u))`` from one exponential e = e^-|u|: the sigmoid is
  1 / (1 + e) for u >= 0 and e / (1 + e) below (no cancellation either way), the
  softplus as ``softplus`` says; both 0 at u = -inf."""
  e = tl.exp(-tl.abs(u))
  r = 1.0 / (1.0 + e)
  sig = tl.where(u >= 0.0, r, e * r)
  return sig, tl.maximum(u, 0.0) + log1p_unit(e)


@triton.jit
def log1p_unit(e):
  """log(1 + e) for e in [0, 1], to 1.7e-7 relative in fp32 (2^-22.5; 0 at 0):
  e p(e) with p a degree-9 fit to log1p(e) / e (Chebyshev nodes, float64, rounded to
  fp32; tests/test_numerics.py checks it). Ten FMAs: libdevice's log with Goldberg's
  correction (log(1 + e) e / ((1 + e) - 1)) took 20 more instructions an entry in the
  SigLIP gradient's epilogue (sm_90 SASS, 2904 -> 2032 a 64 x 64 tile program)."""
  p = -0.0032140363
  p = p * e + 0.019649167
  p = p * e - 0.05643503
  p = p * e + 0.105332285
  p = p * e - 0.15251452
  p = p * e + 0.19651492
  p = p * e - 0.24947809
  p = p * e + 0.333291
  p = p * e - 0.4999985
  p = p * e + 1.0
  return e * p


@triton.jit
def load_bias(bias_ptr, idx, HAS_MASK: tl.constexpr):
  """The ``where`` mask at ``idx`` as an additive logit bias, 0 kept, -inf removed
  (``launch._bias_args``: padded so that every index a program reads is in range); a
  dummy without HAS_MASK. Nothing is computed per element: with 8 warps
  the load lands in the accumulator's layout (a load for every column a thread
  holds), and a bounds mask, a compare and a select on each of them made the
  one-sided tiled forward 34% longer in its sm_90 SASS and its kernel 7.2 -> 9.9 ms
  (LiT, B = 65536, D = 512, H200); without them the masked forward takes 9.4 ms end to
  end instead of 11.1 (plain 8.0; benchmarks/NOTES.md, a7d1076). Loaded ahead of
  the GEMM loop, where its latency hides. The dummy is 0.0, no tensor (a Gluon kernel's
  tensors carry a layout: ``coefficient``)."""
  bias = 0.0
  if HAS_MASK:
    bias = tl.load(bias_ptr + idx)
  return bias


@triton.jit
def logits(s, scale2, bias_r, bias_c, HAS_MASK: tl.constexpr, ROW_MASK: tl.constexpr):
  """z = s * scale2 (log2 units), -inf on the ``where``-removed columns and (ROW_MASK)
  rows: the biases of ``load_bias`` fold into the multiply (a fused multiply-add an
  entry, one more add for the rows) where selecting on the masks took two more
  operations an entry. The forwards drop removed rows only where the columns'
  statistics need it (TWO_SIDED): a removed row's own statistics are discarded by the
  losses (removed rows are zeros, so they stay finite)."""
  z = s * scale2
  if HAS_MASK:
    if ROW_MASK:
      z = z + bias_r[:, None]
    z = z + bias_c[None, :]
  return z


@triton.jit
def drop_pairs(v, fill, row0, col0, rows, cols, row_off, col_off, m, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, EXCLUDE_SELF: tl.constexpr):
  """``v`` [BLOCK_M, BLOCK_N] with ``fill`` on the self pairs (EXCLUDE_SELF; only tiles
  holding the diagonal pay for the test) and on the columns past m (``rows`` = row0 +
  arange(BLOCK_M), ``cols`` = col0 + arange(BLOCK_N); only the last column tile pays)."""
  if EXCLUDE_SELF:
    if on_diagonal(row0, col0, row_off, col_off, BLOCK_M, BLOCK_N):
      v = tl.where(off_diagonal(rows, cols, row_off, col_off), v, fill)
  if col0 + BLOCK_N > m:
    v = tl.where((cols < m)[None, :], v, fill)
  return v


@triton.jit
def tile_origin(off_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """Where a tiled-pass program's tile lies, from ``off_ptr`` = [global offset of
  row 0, of column 0, first row of the slab]: (row_off, col_off, first row of the
  tile within the slab, first row and first column of the tile in the block)."""
  local0 = tl.program_id(0) * BLOCK_M
  return (tl.load(off_ptr), tl.load(off_ptr + 1), local0, tl.load(off_ptr + 2) + local0,
          tl.program_id(1) * BLOCK_N)


@triton.jit
def row_stats(lse_r_ptr, g_r_ptr, thr_r_ptr, rows, in_rows, BLOCK_M: tl.constexpr,
              HAS_ROW: tl.constexpr, ROW_THR: tl.constexpr):
  """The row-role statistics of ``coefficient`` for these rows: (lse, g, thr); rows out
  of range get lse = +inf and g = 0 (no contribution); 0.0 for those not asked for."""
  lse_r = 0.0   # (no tensors made here: a Gluon kernel's carry a layout, its ``rows``')
  g_r = 0.0
  thr_r = 0.0
  if HAS_ROW:
    lse_r = tl.load(lse_r_ptr + rows, mask=in_rows, other=float("inf"))
    g_r = tl.load(g_r_ptr + rows, mask=in_rows, other=0.0)
    if ROW_THR:
      thr_r = tl.load(thr_r_ptr + rows, mask=in_rows, other=0.0)
  return lse_r, g_r, thr_r


@triton.jit
def col_stats(lse_c_ptr, g_c_ptr, thr_c_ptr, cols, m, HAS_COL: tl.constexpr,
              COL_THR: tl.constexpr, SHARED: tl.constexpr = False,
              SIGMOID: tl.constexpr = False):
  """The column-role statistics ``coefficient`` reads for these columns: (lse, g, thr),
  columns out of range lse = +inf, g = 0; 0.0 for those it does not read (SHARED and
  SIGMOID read no lse)."""
  in_cols = cols < m
  lse_c = 0.0
  g_c = 0.0
  thr_c = 0.0
  if HAS_COL:
    g_c = tl.load(g_c_ptr + cols, mask=in_cols, other=0.0)
    if not (SHARED or SIGMOID):
      lse_c = tl.load(lse_c_ptr + cols, mask=in_cols, other=float("inf"))
  if COL_THR:
    thr_c = tl.load(thr_c_ptr + cols, mask=in_cols, other=0.0)
  return lse_c, g_c, thr_c


@triton.jit
def coefficient(s, scale2, row0, col0, rows, cols, row_off, col_off, n, m, lse_r, g_r, thr_r,
                lse_c, g_c, thr_c, xb_ptr, yb_ptr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr,
                HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, ROW_THR: tl.constexpr,
                COL_THR: tl.constexpr, EXCLUDE_SELF: tl.constexpr, HAS_MASK: tl.constexpr,
                SHARED: tl.constexpr, TILE_SHIFT: tl.constexpr = False,
                SPAN: tl.constexpr = None, SIGMOID: tl.constexpr = False, sbias=0.0,
                bias_r=None, bias_c=None):
  """The softmax coefficient tile of the gradient, fp32 [BLOCK_M, BLOCK_N]:

      c_ij = g_r_i keep^r_ij 2^(z_ij - lse_r_i) + g_c_j keep^c_ij 2^(z_ij - lse_c_j)

  with z = s * scale2 (log2 units), for the tile's ``rows`` = row0 + arange(BLOCK_M) and
  ``cols`` = col0 + arange(BLOCK_N). The row statistics come as [BLOCK_M] tensors
  (rows out of range: lse = +inf, g = 0), the column ones as ``col_stats`` loads them.
  No tensor is made here but from its arguments, so a Gluon kernel calls it too (its
  tensors carry their layouts: ``grad_gluon``, which loads the column statistics
  before the tile's similarities, so their latency hides under the GEMM).

  HAS_MASK (``where``): the launcher sends the removed rows' and columns' lse as +inf,
  so each softmax role drops its own removed anchors, and the ``where`` biases of
  ``load_bias`` (0 kept, -inf removed), added to the exponents, drop the other side:
  the column bias in the row role, the row bias in the column role, both where one
  exponential serves both. Every exponent is then finite or -inf (no NaN), and no
  mask is tested per entry. The Triton kernels leave the biases to be loaded here, at
  their use (loaded ahead of the column loop, the masks lengthened the
  FlashAttention-shaped gradient's live ranges: on an H200, CLIP at B = 65536, D = 512
  with ``where`` took 61.5 instead of 52.4 ms; benchmarks/NOTES.md, 1985f8c).
  ``grad_gluon`` passes them loaded (``bias_r`` [BLOCK_M] once, ``bias_c`` [BLOCK_N]
  before the tile's wgmmas), as it does the column statistics: loaded here, after S,
  their latency held up both consumer groups (P is shared), tile after tile (CLIP
  with ``where`` 55.9 ms against 40.1 unmasked; benchmarks/NOTES.md, 2026-12-04).

  SHARED (both roles): the launcher has rebased both roles on one shift t, passed as
  every row's lse (g_r, g_c then hold g 2^(t - lse); lse_c is not read), so one
  exponential per entry serves both: c_ij = 2^(z_ij - t) (g_r_i keep^r_ij + g_c_j
  keep^c_ij). Kept entries have z <= t; the clamp keeps dropped ones finite.

  TILE_SHIFT (both roles, plain statistics): the same, with t the largest finite lse
  of this tile's rows and columns and the factors g 2^(t - lse) computed here, where
  every lse of the tile lies within SPAN (the launcher's ``SHARED_SPAN``) of t; else
  (or NaN) one exponential per role.
  The choice is the tile's own, so no launcher-wide check (and no host round trip of
  a ``lax.cond``) is needed.

  SIGMOID (the pairwise sigmoid, docs/math.md §13): c_ij = sigmoid(z_ij ln 2 + sbias)
  (g_r_i + g_c_j), no statistic read; a ``where``-removed row or column, or a dropped
  pair, has sigmoid(-inf) = 0.
  """
  z = s * scale2
  if HAS_MASK:   # (b_r, b_c exist only here and under HAS_MASK below)
    if bias_r is None:
      bias_r = load_bias(xb_ptr, rows, HAS_MASK)
    if bias_c is None:
      bias_c = load_bias(yb_ptr, cols, HAS_MASK)
    b_r = bias_r[:, None]
    b_c = bias_c[None, :]
  if SIGMOID:
    u = z * 0.6931471805599453 + sbias
    if HAS_MASK:
      u = u + b_r + b_c
    sig = 1.0 / (1.0 + tl.exp(-u))
    if HAS_ROW:
      coef = g_r[:, None] * sig
    if HAS_COL:
      p_c = g_c[None, :] * sig
      if HAS_ROW:
        coef = coef + p_c
      else:
        coef = p_c
  elif TILE_SHIFT:
    tl.static_assert(HAS_ROW and HAS_COL and not SHARED)
    t = tl.maximum(tl.max(tl.where(lse_r < float("inf"), lse_r, float("-inf")), 0),
                   tl.max(tl.where(lse_c < float("inf"), lse_c, float("-inf")), 0))
    low = tl.minimum(tl.min(lse_r, 0), tl.min(lse_c, 0))
    if t - low <= SPAN:   # (False for NaN, or an empty row: lse = -inf)
      if HAS_MASK:
        e = tl.exp2(tl.minimum(s * scale2 + (b_r - t) + b_c, 8.0))
      else:
        e = tl.exp2(tl.minimum(z - t, 8.0))
      p_r = e * (g_r * tl.exp2(t - lse_r))[:, None]   # rows out of range: lse = +inf, 0
      p_c = e * (g_c * tl.exp2(t - lse_c))[None, :]
    else:
      if HAS_MASK:
        p_r = g_r[:, None] * tl.exp2(z - lse_r[:, None] + b_c)
        p_c = g_c[None, :] * tl.exp2(z - lse_c[None, :] + b_r)
      else:
        p_r = g_r[:, None] * tl.exp2(z - lse_r[:, None])
        p_c = g_c[None, :] * tl.exp2(z - lse_c[None, :])
    if ROW_THR:
      p_r = tl.where(s <= thr_r[:, None], p_r, 0.0)
    if COL_THR:
      p_c = tl.where(s <= thr_c[None, :], p_c, 0.0)
    coef = p_r + p_c
  elif SHARED:
    tl.static_assert(HAS_ROW and HAS_COL)
    f_r = g_r[:, None]
    if ROW_THR:
      f_r = tl.where(s <= thr_r[:, None], f_r, 0.0)
    f_c = g_c[None, :]
    if COL_THR:
      f_c = tl.where(s <= thr_c[None, :], f_c, 0.0)
    if HAS_MASK:
      coef = tl.exp2(tl.minimum(s * scale2 + (b_r - lse_r[:, None]) + b_c, 8.0)) * (f_r + f_c)
    else:
      coef = tl.exp2(tl.minimum(z - lse_r[:, None], 8.0)) * (f_r + f_c)
  else:
    if HAS_ROW:   # row-role softmax: g_i * P_ij
      if HAS_MASK:
        p = tl.exp2(z - lse_r[:, None] + b_c)
      else:
        p = tl.exp2(z - lse_r[:, None])
      if ROW_THR:
        p = tl.where(s <= thr_r[:, None], p, 0.0)
      coef = g_r[:, None] * p
    if HAS_COL:   # column-role softmax: g_j * P_ji
      if HAS_MASK:
        p = tl.exp2(z - lse_c[None, :] + b_r)
      else:
        p = tl.exp2(z - lse_c[None, :])
      if COL_THR:
        p = tl.where(s <= thr_c[None, :], p, 0.0)
      if HAS_ROW:
        coef = coef + g_c[None, :] * p
      else:
        coef = g_c[None, :] * p
  return drop_pairs(coef, 0.0, row0, col0, rows, cols, row_off, col_off, m, BLOCK_M, BLOCK_N,
                    EXCLUDE_SELF)
