"""The bounded forward (``stats_fwd._tile_lse_fwd_kernel``'s BOUNDED epilogue) as a
warp-specialized Gluon kernel for Hopper (sm_90; jax-triton >= 0.4, Triton >= 3.9), for
d <= 512: a one-warp TMA producer and two wgmma consumer warp groups.

Per program: 128 rows of x resident in shared memory (64-feature chunks), the other
tower's rows streamed in 128-row tiles through a ring of four [128, 64] chunks (``ready``
/ ``empty`` mbarriers; both groups free a chunk). Each consumer group takes half of every
tile's columns and computes the transposed tile S^T [64, 128] (y's chunk the wgmma's A,
x's its B), then the epilogue: every kept entry's 2^(z - shift). A column's sum (CLIP's
column statistics) runs along the tile's second axis, inside each warp; the rows' terms
are added entry by entry into a register tile and summed across the warps once, at the
end. The groups are not ordered, so one group's exponentials run under the other's
wgmma (FlashAttention-3's forward). The epilogue is the Triton kernels' own
(``_common.logits``, ``drop_pairs``, ``load_bias``, called with the roles swapped):
``where=`` biases, the thresholds, self pairs and ragged tiles come with it.

Why this shape (one H200, B = 65536, CLIP's forward, benchmarks/NOTES.md): with S
[rows, columns], a column sum is a sum across a group's warps, which Triton lowers in
four shared-memory rounds with a barrier each, every tile (D = 512: 9.0 ms, the Triton
forward 9.2; transposed: 7.7); and x stays resident (a [256, 64] chunk of x streamed
with each chunk of y made the kernel wait on L2: 9.35 ms). Shared memory: 32 KiB of x
per 128 features, 64 KiB of ring.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from memeff_jax.backends.triton._common import drop_pairs, load_bias, logits

BLOCK_M = 128                  # rows a program (resident)
BLOCK_N = 128                  # columns a tile (64 a consumer group)
BLOCK_K = 64                   # features a chunk
NUM_BUF = gl.constexpr(4)      # ring chunks


@gluon.jit
def producer(x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi,
             BN: gl.constexpr, BK: gl.constexpr, KCH: gl.constexpr, NB: gl.constexpr):
  """One warp: the program's rows of x once, then each column tile's KCH chunks into the
  ring (rows, columns and features past the ends load as zeros). Both Gluon kernels'
  (``grad_gluon``'s too)."""
  mbarrier.expect(x_bar, KCH * x_desc.block_type.nbytes)
  for k in gl.static_range(KCH):
    tma.async_load(x_desc, [row0, k * BK], x_bar, x_smem.index(k))
  it = 0
  for j in range(j_lo, j_hi, BN):
    for k in gl.static_range(KCH):
      slot = it % NB
      mbarrier.wait(empty.index(slot), ((it // NB) & 1) ^ 1)   # fresh: passes
      mbarrier.expect(ready.index(slot), y_desc.block_type.nbytes)
      tma.async_load(y_desc, [j, k * BK], ready.index(slot), y_smem.index(slot))
      it += 1


@gluon.jit
def _consumer(x_smem, y_smem, x_bar, ready, empty, scal_ptr, thr_ptr, off_ptr, xb_ptr, yb_ptr,
              n, m, row0, local0, j_lo, j_hi, row_part_ptr, col_part_ptr, row_max_ptr,
              col_max_ptr, CID: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
              KCH: gl.constexpr, NB: gl.constexpr, ROW_THR: gl.constexpr,
              EXCLUDE_SELF: gl.constexpr, TWO_SIDED: gl.constexpr, HAS_MASK: gl.constexpr,
              WANT_MAX: gl.constexpr):
  """Consumer warp group CID (4 warps): the columns [CID HALF, + HALF) of every column
  tile of the split against the program's BM rows, as the transposed tile S^T [HALF, BM]
  (y's chunk the wgmma's A, x's its B): a column's sum runs along the tile's second axis,
  inside each warp, and the rows' terms add up entry by entry in registers, summed across
  the warps once, at the end. At the end the rows' sums (and maxima) over those columns."""
  HALF: gl.constexpr = BN // 2
  layout: gl.constexpr = gl.NVMMADistributedLayout(
      version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
  scale2 = gl.load(scal_ptr)
  shift = gl.load(scal_ptr + 1)
  row_off = gl.load(off_ptr)
  col_off = gl.load(off_ptr + 1)
  rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
  bias_r = load_bias(xb_ptr, rows, HAS_MASK)
  thr = 0.0
  if ROW_THR:
    thr = gl.load(thr_ptr + rows, mask=rows < n, other=0.0)
  terms = gl.zeros([HALF, BM], gl.float32, layout=layout)   # the rows' terms, entry by entry
  row_max = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(0, layout))
  st = gl.zeros([HALF, BM], gl.float32, layout=layout)
  part = (local0 // BM).to(gl.int64) * m   # the program's partial row (TWO_SIDED)
  mbarrier.wait(x_bar, 0)
  it = 0
  for j in range(j_lo, j_hi, BN):
    col0 = j + CID * HALF
    cols = col0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
    bias_c = load_bias(yb_ptr, cols, HAS_MASK)   # (loaded before the tile's wgmma)
    for k in gl.static_range(KCH):
      slot = it % NB
      mbarrier.wait(ready.index(slot), (it // NB) & 1)
      a = y_smem.index(slot).slice(CID * HALF, HALF, dim=0)
      st = warpgroup_mma(a, x_smem.index(k).permute((1, 0)), st, use_acc=k > 0,
                         is_async=True)
      if k > 0:   # chunk it - 1's wgmma is done: this group is done with its chunk
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        mbarrier.arrive(empty.index((it + NB - 1) % NB))
      it += 1
    st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
    mbarrier.arrive(empty.index((it + NB - 1) % NB))
    # the tile's logits, transposed: logits(st, .., the columns' bias first) adds the
    # rows' bias (second) always, the columns' (first) where TWO_SIDED; drop_pairs with
    # the roles swapped drops the self pairs and the rows past n
    z = logits(st, scale2, bias_c, bias_r, HAS_MASK, True) if TWO_SIDED else st * scale2
    if HAS_MASK and not TWO_SIDED:
      z = z + gl.expand_dims(bias_c, 1)
    if ROW_THR:
      z = gl.where(st <= gl.expand_dims(thr, 0), z, float("-inf"))
    z = drop_pairs(z, float("-inf"), col0, row0, cols, rows, col_off, row_off, n, HALF, BM,
                   EXCLUDE_SELF)
    if col0 + HALF > m:
      z = gl.where(gl.expand_dims(cols < m, 1), z, float("-inf"))
    e = gl.exp2(z - shift)   # 0 where dropped
    terms += e
    if WANT_MAX:
      row_max = gl.maximum(row_max, gl.max(z, axis=0))
    if TWO_SIDED:
      gl.store(col_part_ptr + part + cols, gl.sum(e, axis=1), mask=cols < m)
      if WANT_MAX:
        gl.store(col_max_ptr + part + cols, gl.max(z, axis=1), mask=cols < m)
  # row partials [2 splits, R]: this group's of this split
  at = (2 * gl.program_id(1) + CID).to(gl.int64) * gl.num_programs(0) * BM + local0 + (
      gl.arange(0, BM, layout=gl.SliceLayout(0, layout)))
  gl.store(row_part_ptr + at, gl.sum(terms, axis=0))
  if WANT_MAX:
    gl.store(row_max_ptr + at, row_max)


@gluon.jit
def _lse_fwd_gluon_kernel(
    # input pointers
    x_desc, y_desc,            # TMA descriptors: x [n, D] in [BM, BK] blocks, y [m, D] in
                               # [BN, BK] blocks (NVMMA shared layout)
    scal_ptr,                  # [3] fp32: scale * log2(e), the bounded shift (log2 units), 0
    thr_ptr,                   # [n] fp32 row thresholds (raw similarity), if ROW_THR
    off_ptr,                   # [3] int32: global offsets of row 0 and column 0, first slab row
    xb_ptr, yb_ptr,            # fp32 where biases, padded to whole slabs / tiles, if HAS_MASK
    # sizes
    n, m,
    cols_per_split,            # columns one program sweeps (a multiple of BN)
    # output pointers
    row_part_ptr,              # [2 splits, R] fp32: the rows' sums of 2^(z - shift), per
                               # split and consumer group
    col_part_ptr,              # [R / BM, m] fp32: the same per column and row tile
    row_max_ptr,               # [2 splits, R] fp32: the rows' largest kept z, if WANT_MAX
    col_max_ptr,               # [R / BM, m] fp32: the columns' (TWO_SIDED), if WANT_MAX
    # constexprs
    D: gl.constexpr, ROW_THR: gl.constexpr, EXCLUDE_SELF: gl.constexpr,
    TWO_SIDED: gl.constexpr, HAS_MASK: gl.constexpr, WANT_MAX: gl.constexpr,
):
  """The bounded row (and column) sums of one slab of R rows, as ``_tile_lse_fwd_kernel``'s
  BOUNDED epilogue (no Matryoshka tables, no sigmoid). Grid (R / BM, splits)."""
  BM: gl.constexpr = x_desc.block_type.shape[0]
  BK: gl.constexpr = x_desc.block_type.shape[1]
  BN: gl.constexpr = y_desc.block_type.shape[0]
  KCH: gl.constexpr = (D + BK - 1) // BK
  local0 = gl.program_id(0) * BM
  row0 = gl.load(off_ptr + 2) + local0
  j_lo = gl.program_id(1) * cols_per_split
  j_hi = gl.minimum(m, j_lo + cols_per_split)
  x_smem = gl.allocate_shared_memory(x_desc.dtype, [KCH, BM, BK], x_desc.layout)
  y_smem = gl.allocate_shared_memory(y_desc.dtype, [NUM_BUF, BN, BK], y_desc.layout)
  x_bar = mbarrier.allocate_mbarrier()
  ready = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  empty = mbarrier.allocate_mbarrier(batch=NUM_BUF)
  mbarrier.init(x_bar, count=1)
  for i in gl.static_range(NUM_BUF):
    mbarrier.init(ready.index(i), count=1)
    mbarrier.init(empty.index(i), count=2)   # both consumer groups read every chunk
  gl.warp_specialize([
      (_consumer, (x_smem, y_smem, x_bar, ready, empty, scal_ptr, thr_ptr, off_ptr, xb_ptr,
                   yb_ptr, n, m, row0, local0, j_lo, j_hi, row_part_ptr, col_part_ptr,
                   row_max_ptr, col_max_ptr, 0, BM, BN, KCH, NUM_BUF, ROW_THR, EXCLUDE_SELF,
                   TWO_SIDED, HAS_MASK, WANT_MAX)),
      (_consumer, (x_smem, y_smem, x_bar, ready, empty, scal_ptr, thr_ptr, off_ptr, xb_ptr,
                   yb_ptr, n, m, row0, local0, j_lo, j_hi, row_part_ptr, col_part_ptr,
                   row_max_ptr, col_max_ptr, 1, BM, BN, KCH, NUM_BUF, ROW_THR, EXCLUDE_SELF,
                   TWO_SIDED, HAS_MASK, WANT_MAX)),
      (producer, (x_desc, y_desc, x_smem, y_smem, x_bar, ready, empty, row0, j_lo, j_hi, BN,
                   BK, KCH, NUM_BUF)),
  ], [4, 1], [232, 24])
