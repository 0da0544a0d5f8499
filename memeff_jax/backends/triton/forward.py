"""Forward launchers: a block's row (and column) log-sum-exps and maxima from the
statistics kernels (``stats_fwd``), partial outputs reduced in JAX (docs/math.md §3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from memeff_jax import _compat
from memeff_jax.backends.triton.call import (LN2, LOG2E, bias_args, call, cdiv, chunks,
                                             offsets as stack_offsets, prefix_args, slab_loop,
                                             slab_rows, splits)
from memeff_jax.backends.triton.stats_fwd import _lse_fwd_kernel, _tile_lse_fwd_kernel
from memeff_jax.config import KernelConfig

# The bounded forward (Algorithm.fwd_bounded) sums 2^(z - shift) with one shift per
# block, shift = scale log2(e) - BOUND_HEADROOM: for |s| <= 1 no term passes 2^96, so
# no sum of up to 2^30 terms overflows. Terms under 2^-126 flush to zero, at most
# 2^-96 of them in all, so a sum >= 2^-BOUND_DEPTH is exact to fp32 rounding (2^-26):
# ``fwd_floor`` turns that into a floor on the lse, which ring.forward checks.
BOUND_HEADROOM = 96.0
BOUND_DEPTH = 70.0


@dataclasses.dataclass(frozen=True)
class FwdCall:
  """Static options of one forward launch (``lse_fwd``'s keywords).

  prefix: Matryoshka ``(x_tab, y_tab, ladder)`` (features laid out by the ladder):
  the statistics are then [K, rows] (tiled kernel only). masks: ``where`` masks
  ``(x rows, y rows)`` (bool), or None: a removed row or column is in no softmax.
  bounded (tiled kernel only): the bounded-shift sums, exact where the lse is at least
  ``fwd_floor`` (the caller checks). want_max=False: the maxima are None (bounded: not
  computed)."""

  two_sided: bool
  exclude_self: bool
  config: KernelConfig
  interpret: bool
  prefix: Any = None
  masks: Any = None
  bounded: bool = False
  want_max: bool = True


def lse_fwd(x, y, scale, row_thr, offsets, bias=None, **options):
  """Row (and column) log-sum-exp of the masked block and the largest kept logit of
  each row (column): ``(lse_row, lse_col, max_row, max_col)``, natural log units.
  With a ``bias`` (the pairwise sigmoid, one-sided, exact), the row statistics are the
  sums of softplus(z + bias) instead. ``options``: the fields of ``FwdCall``."""
  if bias is not None:
    return _lse_fwd_tiled(x, y, scale, row_thr, offsets, FwdCall(**options), bias)
  return _lse_fwd(x, y, scale, row_thr, offsets, FwdCall(**options))


def _lse_fwd(x, y, scale, row_thr, offsets, c: FwdCall):
  config = c.config
  if _gluon_fwd(x, y, c):
    return _lse_fwd_gluon(x, y, scale, row_thr, offsets, c)
  tiled = config.algorithm.fwd_tiled or c.prefix is not None
  if c.two_sided and config.algorithm.fwd_col_pass and c.prefix is None:
    # the columns' statistics as a second row pass over the swapped block (the sweep
    # always has its maxima, which the ring drops; the tiled kernel only where asked)
    one = dataclasses.replace(c, two_sided=False, want_max=c.want_max or not tiled)
    lse_row, _, max_row, _ = _lse_fwd(x, y, scale, row_thr, offsets, one)
    lse_col, _, max_col, _ = _lse_fwd(
        y, x, scale, None, offsets[::-1],
        dataclasses.replace(one, masks=None if c.masks is None else c.masks[::-1]))
    return lse_row, lse_col, max_row, max_col
  if tiled:
    return _lse_fwd_tiled(x, y, scale, row_thr, offsets, c)
  assert not c.bounded, "the bounded forward is tiled"
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.fwd.block_m, config.fwd.block_n
  block_d, num_d = chunks(d, config.fwd.block_d)
  row_tiles = cdiv(n, bm)
  programs = min(row_tiles, config.budgets.max_programs) if c.two_sided else row_tiles
  num_splits, per_split = splits(m, bn, programs, config)
  f32 = jnp.float32
  scal = jnp.reshape(scale * LOG2E, (1,)).astype(f32)
  thr = jnp.zeros((1,), f32) if row_thr is None else row_thr.astype(f32)
  out_shapes = [jax.ShapeDtypeStruct((num_splits, n), f32),
                jax.ShapeDtypeStruct((programs, m) if c.two_sided else (1,), f32)] * 2
  xb, yb, has_mask = bias_args(c.masks, row_tiles * bm, cdiv(m, bn) * bn)
  lse_row, lse_col, max_row, max_col = call(
      _lse_fwd_kernel, x, y, scal, thr, stack_offsets(offsets), xb, yb, n, m, per_split,
      out_shapes=out_shapes, grid=(programs, num_splits), num_warps=config.fwd.num_warps,
      num_stages=config.fwd.num_stages, name="memeff/lse_fwd", interpret=c.interpret, D=d,
      BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, NUM_D=num_d, ROW_THR=row_thr is not None,
      EXCLUDE_SELF=c.exclude_self, TWO_SIDED=c.two_sided, PRECISION=config.algorithm.precision,
      HAS_MASK=has_mask)
  lse_row = jax.nn.logsumexp(lse_row * LN2, axis=0)
  lse_col = jax.nn.logsumexp(lse_col * LN2, axis=0) if c.two_sided else None
  if not c.want_max:
    return lse_row, lse_col, None, None
  max_row = jnp.max(max_row, axis=0) * LN2
  max_col = jnp.max(max_col, axis=0) * LN2 if c.two_sided else None
  return lse_row, lse_col, max_row, max_col


def _gluon_fwd(x, y, c: FwdCall) -> bool:
  """Whether a forward runs ``stats_gluon``'s kernel: configured (``FwdTiles.gluon``),
  bounded, no Matryoshka tables, 16-bit inputs of one dtype, d <= 512 (x's rows stay in
  shared memory) in rows of whole 16 bytes (as TMA reads them), and a GPU and jax-triton
  that launch Gluon Hopper kernels."""
  return (c.config.fwd.gluon and c.bounded and c.prefix is None and x.dtype == y.dtype
          and jnp.dtype(x.dtype).itemsize == 2 and x.shape[1] % 8 == 0 and x.shape[1] <= 512
          and _compat.gluon_kernels(c.interpret))


def _lse_fwd_gluon(x, y, scale, row_thr, offsets, c: FwdCall):
  """``_lse_fwd_tiled``'s bounded statistics from ``stats_gluon._lse_fwd_gluon_kernel``
  (its own 128-row programs, 128-column tiles; rows' sums per column split and consumer
  group, columns' per row tile, added in JAX; slabs of rows as the tiled forward's)."""
  from memeff_jax.backends.triton import stats_gluon  # pylint: disable=g-import-not-at-top
  (n, d), m = x.shape, y.shape[0]
  bm, bn, bk = stats_gluon.BLOCK_M, stats_gluon.BLOCK_N, stats_gluon.BLOCK_K
  two_sided, want_max = c.two_sided, c.want_max
  # per row: its row tile's column partials (two-sided), and their maxima
  rows = slab_rows(n, bm, 4 * (cdiv(m, bm) if two_sided else 1) * (2 if want_max else 1),
                   c.config)
  num_splits, per_split = splits(m, bn, rows // bm, c.config)
  xb, yb, has_mask = bias_args(c.masks, cdiv(n, rows) * rows, cdiv(m, bn) * bn)
  f32 = jnp.float32
  scale2 = scale * LOG2E
  shift = scale2 - BOUND_HEADROOM
  scal = jnp.stack([scale2, shift, jnp.zeros_like(scale2)]).astype(f32)
  thr = jnp.zeros((1,), f32) if row_thr is None else row_thr.astype(f32).reshape(-1)
  part = lambda shape, on=True: jax.ShapeDtypeStruct(shape if on else (1,), f32)
  out_shapes = [part((2 * num_splits, rows)), part((rows // bm, m), two_sided),
                part((2 * num_splits, rows), want_max),
                part((rows // bm, m), two_sided and want_max)]

  def body(r0, carry):
    sum_row, sum_col, max_row, max_col = carry
    row_part, col_part, row_max, col_max = call(
        stats_gluon._lse_fwd_gluon_kernel, _compat.Tiles(x, (bm, bk), gluon=True),
        _compat.Tiles(y, (bn, bk), gluon=True), scal, thr, stack_offsets(offsets, r0), xb, yb,
        n, m, per_split, out_shapes=out_shapes, grid=(rows // bm, num_splits), num_warps=4,
        num_stages=1, name="memeff/lse_fwd_gluon", interpret=False, D=d,
        ROW_THR=row_thr is not None, EXCLUDE_SELF=c.exclude_self, TWO_SIDED=two_sided,
        HAS_MASK=has_mask, WANT_MAX=want_max)
    sum_row = jax.lax.dynamic_update_slice(sum_row, jnp.sum(row_part, 0), (r0,))
    if two_sided:
      sum_col = sum_col + jnp.sum(col_part, 0)
    if want_max:
      max_row = jax.lax.dynamic_update_slice(max_row, jnp.max(row_max, 0) * LN2, (r0,))
      if two_sided:
        max_col = jnp.maximum(max_col, jnp.max(col_max, 0) * LN2)
    return sum_row, sum_col, max_row, max_col

  padded = jnp.zeros((cdiv(n, rows) * rows,), f32)
  init = _compat.vary_like(
      (padded, jnp.zeros((m,), f32) if two_sided else None, padded if want_max else None,
       jnp.full((m,), -jnp.inf, f32) if two_sided and want_max else None),
      x, y, scale, *offsets, xb, yb)
  sum_row, sum_col, max_row, max_col = slab_loop(n, rows, body, init)
  lse = lambda v: None if v is None else (shift + jnp.log2(v)) * LN2   # -inf: nothing kept
  return (lse(sum_row[:n]), lse(sum_col), None if max_row is None else max_row[:n], max_col)


def fwd_floor(scale):
  """The lse (natural log units) at and above which the bounded forward's statistics
  are exact: its sum is then at least 2^-BOUND_DEPTH (see BOUND_HEADROOM)."""
  return scale - (BOUND_HEADROOM + BOUND_DEPTH) * LN2


def _lse_fwd_tiled(x, y, scale, row_thr, offsets, c: FwdCall, bias=None):
  """lse_fwd as slabs of GEMM tiles (stats_fwd._tile_lse_fwd_kernel): both sides at once.
  Exact: per-tile log-sum-exps merged by logsumexp; bounded: per-tile sums of
  2^(z - shift), added up, then shift + log2(sum); sigmoid (``bias``): per-tile sums of
  softplus(z + bias), added up."""
  config, prefix, two_sided, bounded, want_max = (c.config, c.prefix, c.two_sided, c.bounded,
                                                  c.want_max)
  sigmoid = bias is not None
  assert not (sigmoid and (two_sided or bounded)), "the sigmoid block is one-sided, exact"
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.fwd.block_m, config.fwd.block_n
  block_k, num_k = chunks(d, config.fwd.block_d) if prefix is None else (
      prefix[2].chunk, d // prefix[2].chunk)
  k, segs, has_tab, x_tab, y_tab = prefix_args(prefix, num_k)
  col_tiles = cdiv(m, bn)
  maxima = want_max or not bounded   # the exact epilogue always stores them
  # per row: the fp32 partials (log-sum-exps or sums, and maxima) of every column tile
  # (and, two-sided, of every row tile's columns)
  parts = (col_tiles + (cdiv(m, bm) if two_sided else 0)) * (2 if maxima else 1)
  rows = slab_rows(n, bm, 4 * k * parts, config)
  xb, yb, has_mask = bias_args(c.masks, cdiv(n, rows) * rows, col_tiles * bn)
  f32 = jnp.float32
  scale2 = scale * LOG2E
  shift = scale2 - BOUND_HEADROOM
  scal = jnp.stack([scale2, shift, jnp.zeros_like(scale2) if bias is None else
                    jnp.asarray(bias, scale2.dtype)]).astype(f32)
  thr = jnp.zeros((1,), f32) if row_thr is None else row_thr.astype(f32).reshape(-1)
  part = lambda shape: jax.ShapeDtypeStruct(shape, f32)
  col_shape = (k, rows // bm, m) if two_sided else (1,)
  out_shapes = [part((k, col_tiles, rows)), part(col_shape),
                part((k, col_tiles, rows) if maxima else (1,)),
                part(col_shape if maxima else (1,))]
  warps = config.fwd.one_sided_warps
  warps = config.fwd.num_warps if two_sided or warps is None else warps
  if bounded or sigmoid:   # sums, added
    merge, add, empty = (lambda p: jnp.sum(p, axis=1)), jnp.add, 0.0
  else:         # log-sum-exps (log2 units in, natural out), merged
    merge, add, empty = (lambda p: jax.nn.logsumexp(p * LN2, axis=1)), jnp.logaddexp, -jnp.inf

  def body(r0, carry):
    lse_row, lse_col, max_row, max_col = carry
    row_part, col_part, row_max, col_max = call(
        _tile_lse_fwd_kernel, x, y, scal, thr, stack_offsets(offsets, r0), x_tab, y_tab, xb,
        yb, n, m, out_shapes=out_shapes, grid=(rows // bm, col_tiles), num_warps=warps,
        num_stages=config.fwd.num_stages, name="memeff/tile_lse_fwd", interpret=c.interpret,
        D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k, NUM_K=num_k,
        ROW_THR=row_thr is not None, EXCLUDE_SELF=c.exclude_self, TWO_SIDED=two_sided,
        PRECISION=config.algorithm.precision, K=k, SEGS=segs, HAS_TAB=has_tab, HAS_MASK=has_mask,
        BOUNDED=bounded, WANT_MAX=want_max, SIGMOID=sigmoid)
    lse_row = jax.lax.dynamic_update_slice(lse_row, merge(row_part), (0, r0))
    if two_sided:
      lse_col = add(lse_col, merge(col_part))
    if want_max:
      max_row = jax.lax.dynamic_update_slice(max_row, jnp.max(row_max, axis=1) * LN2, (0, r0))
      if two_sided:
        max_col = jnp.maximum(max_col, jnp.max(col_max, axis=1) * LN2)
    return lse_row, lse_col, max_row, max_col

  padded = jnp.zeros((k, cdiv(n, rows) * rows), f32)
  cols = jnp.full((k, m), empty, f32) if two_sided else None
  mcols = jnp.full((k, m), -jnp.inf, f32) if two_sided else None
  init = _compat.vary_like((padded, cols, padded if want_max else None,
                            mcols if want_max else None), x, y, scale, *offsets, xb, yb,
                           *(() if bias is None else (bias,)))
  lse_row, lse_col, max_row, max_col = slab_loop(n, rows, body, init)
  if bounded:   # shift + log2(sum), natural units (-inf where nothing was kept)
    lse_row, lse_col = (None if v is None else (shift + jnp.log2(v)) * LN2
                        for v in (lse_row, lse_col))
  out = (lse_row[:, :n], lse_col, None if max_row is None else max_row[:, :n], max_col)
  return tuple(None if v is None else (v[0] if prefix is None else v) for v in out)
