"""Backward launchers: the rows' gradient ``scale * sum_j c_ij y_j`` and sums
``sum_j c_ij s_ij`` from saved statistics (``grad_bwd``; docs/math.md §3), as one
FlashAttention-shaped pass or as coefficient slabs multiplied in by XLA dots (and,
paired, both towers from one set of slabs)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from memeff_jax import _compat
from memeff_jax.backends.base import rows_dtype, scale_rows
from memeff_jax.backends.triton.call import (LN2, LOG2E, bias_args, call, cdiv, chunks,
                                             dot_precision, offsets as stack_offsets,
                                             prefix_args, slab_loop, slab_rows, splits)
from memeff_jax.backends.triton.forward import BOUND_HEADROOM
from memeff_jax.backends.triton.grad_bwd import (EPI_ENTRIES, _lse_bwd_kernel,
                                                 _tile_coef_bwd_kernel)
from memeff_jax.config import KernelConfig

# The widest spread (log2 units) of a block's row and column log-sum-exps for which the
# gradient shares one exponential per entry between the two softmax roles (lse_bwd):
# the terms that matter, P >= 2^-60, then stay normal floats (2^(z - t) >= 2^-124).
SHARED_SPAN = 64.0


@dataclasses.dataclass(frozen=True)
class BwdCall:
  """Static options of one gradient (``lse_bwd``'s keywords).

  prefix: Matryoshka ``(x_tab, y_tab, ladder)``, as for lse_fwd: the side statistics
  and the returned sums are then [K, rows]. masks: as for lse_fwd. pair: None, or the
  columns' ``(want_cs, out_dtype)``: then also the columns' gradient
  ``scale * sum_i c_ij x_i`` and sums ``sum_i c_ij s_ij`` from the same coefficient
  slabs (tiled kernel only). fwd (a plain one-sided sigmoid block, paired): the
  forward's statistics from the same tiles too (``fwd_grad``)."""

  exclude_self: bool
  want_cs: bool
  out_dtype: Any
  config: KernelConfig
  interpret: bool
  prefix: Any = None
  masks: Any = None
  pair: Any = None
  fwd: bool = False

  def options(self) -> dict:
    """The fields as keywords (a launcher's ``**options``)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  @property
  def tiled(self) -> bool:
    """The tiled (coefficient-slab) gradient: configured so, or paired."""
    return self.config.algorithm.bwd_tiled or self.pair is not None


@dataclasses.dataclass(frozen=True)
class Coefs:
  """One form of the side statistics as the kernels read them: the flattened
  (lse2, g, thr) of the rows and of the columns, the constexpr ``flags``, the scalars
  ``scal`` = (scale log2(e), scale g_max, g_max, the sigmoid's bias or 0) and ``g_max``
  (cotangents are divided by it)."""

  side_stats: tuple
  flags: dict
  scal: jax.Array
  g_max: jax.Array


def lse_bwd(x, y, scale, offsets, row, col, bias=None, **options):
  """``(scale * sum_j c_ij y_j, sum_j c_ij s_ij or None)`` for the rows of x (grad_bwd);
  paired: ``(dx, cs, dy, cs_col)``. With a ``bias`` (the pairwise sigmoid's
  coefficients), each also ends with the rows' ``sum_j c_ij``. ``options``: the fields
  of ``BwdCall``."""
  c = BwdCall(**options)
  f32 = jnp.float32
  g_max = jnp.zeros((), f32)
  for side in (row, col):
    if side is not None:
      g_max = jnp.maximum(g_max, jnp.max(jnp.abs(side.g)).astype(f32))
  g_max = jnp.where(jnp.isfinite(g_max) & (g_max > 0), g_max, 1.0)
  scal = jnp.stack([scale * LOG2E, scale * g_max, g_max,
                    jnp.zeros((), f32) if bias is None else bias]).astype(f32)
  dummy = jnp.zeros((1,), f32)
  lse2 = lambda side: (side.lse * LOG2E).astype(f32)
  g = lambda side: (side.g / g_max).astype(f32)
  thr = lambda side: dummy if side.thr is None else side.thr.astype(f32).reshape(-1)

  if c.masks is not None:   # a removed anchor's softmax is empty: lse = +inf (coefficient)
    gone = lambda side, keep: None if side is None else side._replace(
        lse=jnp.where(keep, side.lse, jnp.inf))
    row, col = gone(row, c.masks[0]), gone(col, c.masks[1])

  def stats(side):
    if side is None:
      return dummy, dummy, dummy
    return lse2(side).reshape(-1), g(side).reshape(-1), thr(side)

  flags = dict(HAS_MASK=c.masks is not None, HAS_ROW=row is not None, HAS_COL=col is not None,
               ROW_THR=row is not None and row.thr is not None,
               COL_THR=col is not None and col.thr is not None, EXCLUDE_SELF=c.exclude_self,
               WANT_CS=c.want_cs, PRECISION=c.config.algorithm.precision,
               SIGMOID=bias is not None)
  go = lambda side_stats, fl: _launch(x, y, scale, offsets, Coefs(side_stats, fl, scal, g_max),
                                      c)
  plain = lambda: go((*stats(row), *stats(col)), dict(flags, SHARED=False))
  if row is None or col is None or c.tiled or bias is not None:
    return plain()   # (the tiled kernel shares the exponential tile by tile)
  # Both roles: rebase them on one shift t per dim (the largest finite lse), so one
  # exponential per entry serves both, c = 2^(z - t) (g_r 2^(t - lse_r) + g_c 2^(t - lse_c)),
  # where every lse of the block lies within SHARED_SPAN of t (else, or NaN: two).
  k = 1 if c.prefix is None else c.prefix[0].shape[0]
  per_dim = lambda side: lse2(side).reshape(k, -1)
  l_r, l_c = per_dim(row), per_dim(col)
  top = lambda l: jnp.max(jnp.where(l < jnp.inf, l, -jnp.inf), axis=1, keepdims=True)
  t = jnp.maximum(top(l_r), top(l_c))   # [K, 1]
  low = jnp.minimum(jnp.min(l_r, axis=1, keepdims=True), jnp.min(l_c, axis=1, keepdims=True))
  ok = jnp.all(t - low <= SHARED_SPAN)
  t = jnp.where(jnp.isfinite(t), t, 0.0)
  # (recomputed inside the branch, so that the rebased factors exist only there)
  rebase = lambda side: (g(side).reshape(k, -1) * jnp.exp2(t - per_dim(side))).reshape(-1)
  shared = lambda: go((jnp.broadcast_to(t, (k, x.shape[0])).reshape(-1), rebase(row), thr(row),
                       dummy, rebase(col), thr(col)), dict(flags, SHARED=True))
  return jax.lax.cond(ok, shared, plain)


def _launch(x, y, scale, offsets, coefs: Coefs, c: BwdCall):
  """lse_bwd's launches for one form of the statistics (``coefs``)."""
  if c.tiled:
    return _lse_bwd_tiled(x, y, scale, offsets, coefs, **c.options())
  d = x.shape[1]
  if _gluon_pass(x, y, coefs, c):
    return _lse_bwd_gluon(x, y, offsets, coefs, c)
  if c.prefix is not None:   # Matryoshka: the ladder's chunks, every feature in one launch
    chunk = c.prefix[2].chunk
    dx, cs, c1 = _lse_bwd_fa(x, y, offsets, coefs, _Features(chunk, d // chunk), **c.options())
    return (dx, cs) if c1 is None else (dx, cs, c1)
  block_d, num_d = chunks(d, c.config.bwd.block_d)
  block_do, num_do = chunks(d, c.config.bwd.block_do)
  dx, cs, c1 = _lse_bwd_fa(x, y, offsets, coefs, _Features(block_d, num_d, block_do, num_do),
                           **c.options())
  out = dx, (None if cs is None else cs[0])
  return out if c1 is None else out + (c1[0],)


def _gluon_pass(x, y, coefs: Coefs, c: BwdCall) -> bool:
  """Whether a FlashAttention-shaped pass runs ``grad_gluon``'s kernel: configured
  (``BwdTiles.gluon``, or its pass's ``RoleTiles.gluon``), d = 512, 16-bit inputs of one
  dtype, no Matryoshka tables, no sigmoid, and a GPU and jax-triton that launch Gluon
  Hopper kernels."""
  tiles = c.config.bwd.for_pass(coefs.flags["HAS_ROW"], coefs.flags["HAS_COL"])
  return (tiles.gluon and c.prefix is None and not coefs.flags["SIGMOID"]
          and x.shape[1] == 512 and x.dtype == y.dtype and jnp.dtype(x.dtype).itemsize == 2
          and _compat.gluon_kernels(c.interpret))


def _lse_bwd_gluon(x, y, offsets, coefs: Coefs, c: BwdCall, *, rows_fwd=False,
                   want_max=False):
  """``(dx, cs or None)`` of one pass from ``grad_gluon._lse_bwd_gluon_kernel`` (its own
  64 x 128 tiles; the column splits as ``_lse_bwd_fa``'s); ``rows_fwd`` (``lse_fwd_rows``):
  dx as ``base.scale_rows`` gives it (a pair) and also the rows' sums of c and
  (``want_max``) largest kept s, [n] each."""
  from memeff_jax.backends.triton import grad_gluon  # pylint: disable=g-import-not-at-top
  (n, d), m = x.shape, y.shape[0]
  bm, bn, bk = grad_gluon.BLOCK_M, grad_gluon.BLOCK_N, grad_gluon.BLOCK_K
  num_splits, per_split = splits(m, bn, cdiv(n, bm), c.config)
  f32 = jnp.float32
  per_row = lambda want: jax.ShapeDtypeStruct((2, num_splits, n) if want else (1,), f32)
  scaled = rows_fwd and num_splits == 1   # (the kernel's own chunks: its groups' halves)
  out_shapes = [jax.ShapeDtypeStruct((num_splits, n, d), c.out_dtype if num_splits == 1 else f32),
                per_row(c.want_cs), per_row(rows_fwd), per_row(want_max),
                jax.ShapeDtypeStruct((2, n) if scaled else (1,), f32)]
  xb, yb, _ = bias_args(c.masks, cdiv(n, bm) * bm, cdiv(m, bn) * bn)
  flags = {k: v for k, v in coefs.flags.items() if k not in ("PRECISION", "SIGMOID")}
  dx, cs, c_sum, s_max, big = call(
      grad_gluon._lse_bwd_gluon_kernel, _compat.Tiles(x, (bm, bk), gluon=True),
      _compat.Tiles(y, (bn, bk), gluon=True), coefs.scal, stack_offsets(offsets),
      *coefs.side_stats, xb, yb, n, m, per_split, out_shapes=out_shapes,
      grid=(cdiv(n, bm), num_splits), num_warps=4, num_stages=1,
      name="memeff/lse_fwd_rows_gluon" if rows_fwd else "memeff/lse_bwd_gluon",
      interpret=False, D=d, **dict(flags, WANT_CS=c.want_cs, WANT_SUM=rows_fwd,
                                   WANT_MAX=want_max, SCALED=scaled))
  out = _dx_out(dx, big, c, rows_fwd), (jnp.sum(cs, axis=(0, 1)) if c.want_cs else None)
  if not rows_fwd:
    return out
  return out + (jnp.sum(c_sum, axis=(0, 1)),
                jnp.max(s_max, axis=(0, 1)) if want_max else None)


def _dx_out(dx, big, c: BwdCall, rows_fwd: bool):
  """A launch's dx [splits, n, d], summed over its column splits: in ``c.out_dtype``, or
  (``rows_fwd``) as ``base.scale_rows``' pair, the kernel's own row scales ``big``
  [G, n] where one split ran (SCALED), else scaled here from the fp32 sum."""
  if dx.shape[0] == 1:
    return (dx[0], big.T) if rows_fwd else dx[0]
  dx = jnp.sum(dx, axis=0)
  return scale_rows(dx, c.out_dtype) if rows_fwd else dx.astype(c.out_dtype)


def fwd_rows_gluon(x, y, config: KernelConfig) -> bool:
  """Whether ``lse_fwd_rows`` runs ``grad_gluon``'s kernel for these operands: where a
  pass of the rows' softmax alone runs it (``_gluon_pass``); else
  ``grad_bwd._lse_bwd_kernel``."""
  coefs = Coefs((), dict(HAS_ROW=True, HAS_COL=False, SIGMOID=False), None, None)
  return _gluon_pass(x, y, coefs, BwdCall(False, False, x.dtype, config, False))


def lse_fwd_rows(x, y, scale, row_thr, offsets, *, exclude_self, want_cs, want_max, config,
                 interpret=False, masks=None):
  """A one-sided block's bounded row statistics and, from the same tiles, its rows'
  gradient for a unit cotangent on every row (``Backend.fwd_rows``):
  ``(lse_row, max_row, dx, dx_big, cs, l)`` with

      c_ij = keep_ij 2^(z_ij - shift),  l_i = sum_j c_ij,  lse_row_i = (shift + log2 l_i) ln 2
      dx_i = scale sum_j c_ij y_j,      cs_i = sum_j c_ij s_ij   (each / l_i: the unit ones)

  in one pass of the rows' gradient kernel (``grad_gluon``'s where ``fwd_rows_gluon``,
  else ``grad_bwd``'s FlashAttention-shaped one, as the config's tiles say, or its
  coefficient slabs where the gradient is tiled, ``Algorithm.bwd_tiled``): its
  coefficient with every row's lse replaced by the bounded forward's shift
  (``forward.BOUND_HEADROOM``; ``ring.forward_rows`` checks ``fwd_floor`` and reruns
  exactly). max_row: the largest kept logit (entries
  that flush to 0 are far below it once the floor holds), or None. dx as
  ``base.scale_rows`` hands it over (float16 chunks and their fp32 scales; the kernel's
  own chunks where one split sweeps every column); l, cs fp32 (cs None unless
  ``want_cs``); a removed or empty row has l = 0, dx = 0."""
  f32 = jnp.float32
  n = x.shape[0]
  scale2 = (scale * LOG2E).astype(f32)
  shift = scale2 - BOUND_HEADROOM
  lse2 = jnp.full((n,), shift, f32)
  if masks is not None:   # a removed row's softmax is empty (as lse_bwd sends it)
    lse2 = jnp.where(masks[0], lse2, jnp.inf)
  dummy = jnp.zeros((1,), f32)
  thr = dummy if row_thr is None else row_thr.astype(f32).reshape(-1)
  gluon = fwd_rows_gluon(x, y, config) and not interpret
  scal = [scale2, jnp.asarray(scale, f32), jnp.ones((), f32), jnp.zeros((), f32)]
  if not gluon:   # (grad_bwd's SCALED bound reads max |y|; grad_gluon's kernel does not)
    scal.append(jnp.max(jnp.abs(y)).astype(f32))
  scal = jnp.stack(scal)
  flags = dict(HAS_MASK=masks is not None, HAS_ROW=True, HAS_COL=False,
               ROW_THR=row_thr is not None, COL_THR=False, EXCLUDE_SELF=exclude_self,
               SHARED=False, SIGMOID=False, PRECISION=config.algorithm.precision)
  coefs = Coefs((lse2, jnp.ones((n,), f32), thr, dummy, dummy, dummy), flags, scal,
                jnp.ones((), f32))
  c = BwdCall(exclude_self, want_cs, jnp.float16, config, interpret, masks=masks)
  if gluon:
    dx, cs, l, s_max = _lse_bwd_gluon(x, y, offsets, coefs, c, rows_fwd=True,
                                      want_max=want_max)
  elif c.tiled:
    dx, cs, l, s_max = _lse_bwd_tiled(x, y, scale, offsets, coefs, rows_fwd=True,
                                      want_max=want_max, **c.options())
  else:
    d = x.shape[1]
    feats = _Features(*chunks(d, config.bwd.block_d), *chunks(d, config.bwd.block_do))
    dx, cs, l, s_max = _lse_bwd_fa(x, y, offsets, coefs, feats, rows_fwd=True,
                                   want_max=want_max, **c.options())
    cs, l = (None if cs is None else cs[0]), l[0]
  lse = (shift + jnp.log2(l)) * LN2   # -inf: nothing kept
  return lse, (None if s_max is None else s_max * scale), *dx, cs, l


@dataclasses.dataclass(frozen=True)
class _Features:
  """The FlashAttention-shaped gradient's feature axes: the similarity's chunks
  (``block_d`` x ``num_d``) and the accumulator's (``block_do`` x ``num_do``; None:
  Matryoshka, every feature in one program)."""

  block_d: int
  num_d: int
  block_do: int | None = None
  num_do: int = 1


def _lse_bwd_fa(x, y, offsets, coefs: Coefs, feats: _Features, *, rows_fwd=False,
                want_max=False, **options):
  """One launch of the FlashAttention-shaped gradient (grad_bwd._lse_bwd_kernel):
  ``(dx, cs, c1)``, cs [K, n] or None, c1 (SIGMOID, or ``rows_fwd``: the rows' sums of
  c) [K, n] or None; ``rows_fwd`` (``lse_fwd_rows``): dx as ``base.scale_rows`` gives it
  (a pair) and also the rows' largest kept s [n] (``want_max``) or None. ``options``: the
  fields of ``BwdCall``."""
  c = BwdCall(**options)
  config, want_cs = c.config, c.want_cs
  (n, d), m = x.shape, y.shape[0]
  tiles = config.bwd.for_pass(coefs.flags["HAS_ROW"], coefs.flags["HAS_COL"])
  bm, bn = tiles.block_m, tiles.block_n
  f32 = jnp.float32
  block_d, num_d, num_do = feats.block_d, feats.num_d, feats.num_do
  k, segs, has_tab, x_tab, y_tab = prefix_args(c.prefix, num_d)
  block_do = d if feats.block_do is None else feats.block_do   # None: Matryoshka, unused
  num_splits, per_split = splits(m, bn, cdiv(n, bm) * num_do, config)
  dx_dtype = c.out_dtype if num_splits == 1 else f32
  scaled = rows_fwd and num_splits == 1   # (one scale a row, for every feature chunk)
  sums = coefs.flags["SIGMOID"] or rows_fwd
  out_shapes = [jax.ShapeDtypeStruct((num_splits, n, d), dx_dtype),
                jax.ShapeDtypeStruct((k, num_splits, n) if want_cs else (1,), f32),
                jax.ShapeDtypeStruct((k, num_splits, n) if sums else (1,), f32),
                jax.ShapeDtypeStruct((num_splits, n) if want_max else (1,), f32),
                jax.ShapeDtypeStruct((1, n) if scaled else (1,), f32)]
  xb, yb, _ = bias_args(c.masks, cdiv(n, bm) * bm, cdiv(m, bn) * bn)
  reuse_y = num_d == 1 and num_do == 1 and block_do == block_d
  # (block_d == d: a power-of-two feature size, rows of >= 32 bytes, no ragged tail)
  tma = (tiles.tma and reuse_y and block_d == d and c.prefix is None
         and _compat.tma_descriptors(c.interpret))
  if tma:
    x, y = _compat.Tiles(x, (bm, block_d)), _compat.Tiles(y, (bn, block_d))
  dx, cs, c1, s_max, big = call(
      _lse_bwd_kernel, x, y, coefs.scal, stack_offsets(offsets), *coefs.side_stats, x_tab,
      y_tab, xb, yb, n, m, per_split, out_shapes=out_shapes,
      grid=(cdiv(n, bm), num_do, num_splits), num_warps=tiles.num_warps,
      num_stages=tiles.num_stages,
      name="memeff/lse_fwd_rows" if rows_fwd else "memeff/lse_bwd", interpret=c.interpret,
      D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, NUM_D=num_d, BLOCK_DO=block_do,
      REUSE_Y=reuse_y, K=k, SEGS=segs, HAS_TAB=has_tab, TMA=tma,
      **dict(coefs.flags, WANT_CS=want_cs, WANT_SUM=rows_fwd, WANT_MAX=want_max,
             SCALED=scaled))
  out = (_dx_out(dx, big, c, rows_fwd), (jnp.sum(cs, axis=1) if want_cs else None),
         (jnp.sum(c1, axis=1) if sums else None))
  if not rows_fwd:
    return out
  return out + ((jnp.max(s_max, axis=0) if want_max else None),)


def _lse_bwd_tiled(x, y, scale, offsets, coefs: Coefs, *, rows_fwd=False, want_max=False,
                   **options):
  """lse_bwd as slabs: coefficient slabs from GEMM tiles (grad_bwd._tile_coef_bwd_kernel),
  then dx[slab] = scale * g_max * c[slab] @ y as XLA dots (Matryoshka: slab k times
  feature segment k of y). ``coefs`` comes from lse_bwd, as for the FlashAttention-shaped
  kernel. ``pair`` (None, or the columns' ``(want_cs, out_dtype)``): the same slabs
  also give the columns' gradient, dy += scale * g_max * c[slab]^T @ x[slab], and their
  sums of c s. ``rows_fwd`` (``lse_fwd_rows``, a plain block): dx as ``base.scale_rows``
  gives it, slab by slab (a pair), and also the rows' sums of c [n] and (``want_max``)
  largest kept s [n] or None. ``options``: the fields of ``BwdCall``."""
  c = BwdCall(**options)
  config, prefix, pair, want_cs = c.config, c.prefix, c.pair, c.want_cs
  side_stats, flags, scal, g_max = coefs.side_stats, coefs.flags, coefs.scal, coefs.g_max
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.bwd.block_m, config.bwd.block_n
  block_k, num_k = chunks(d, config.bwd.block_d) if prefix is None else (
      prefix[2].chunk, d // prefix[2].chunk)
  k, segs, has_tab, x_tab, y_tab = prefix_args(prefix, num_k)
  ends = (d,) if prefix is None else prefix[2].ends
  col_tiles = cdiv(m, bn)
  # fp16 slabs could overflow once the prefix tables (>= 1) multiply the coefficients.
  c_dtype = jnp.float32 if (prefix is not None and x.dtype == jnp.float16) else x.dtype
  # Paired, the slabs may span column blocks of `width` columns (Budgets.pair_block_cols;
  # the last `tail` columns in a narrower one): each slab of rows then walks the blocks,
  # its rows' gradient summed in fp32 across them.
  width = m
  if pair is not None and config.budgets.pair_block_cols:
    width = min(m, max(bn, config.budgets.pair_block_cols // bn * bn))
  blocks, tail = divmod(m, width)
  # The budget counts the slabs; their fp32 per-tile sums (4 / (BLOCK_N itemsize) of
  # them) ride on top, so that a power-of-two budget and batch give whole slabs (at
  # B = 16384 the 64 MiB budget is 8 slabs of 2048 rows, not 9 of 1856 padded to 16704).
  rows = slab_rows(n, bm, k * width * jnp.dtype(c_dtype).itemsize, config,
                   min_rows=config.budgets.min_slab_rows)
  want_cs_col = pair is not None and pair[0]
  sigmoid = flags["SIGMOID"]
  sums = sigmoid or rows_fwd
  # Both roles: one exponential per entry, on a shift each tile picks (TILE_SHIFT).
  tile_flags = {f: v for f, v in flags.items() if f != "SHARED"}
  tile_flags["TILE_SHIFT"] = flags["HAS_ROW"] and flags["HAS_COL"]
  tile_flags["WANT_CS"] = want_cs
  tile_flags["FWD"] = c.fwd
  # FWD: the sigmoid epilogue in column chunks of at most EPI_ENTRIES entries a thread
  tile_flags["EPI_SPLIT"] = min(4, max(1, bm * bn // (32 * config.bwd.num_warps *
                                                      EPI_ENTRIES))) if c.fwd else 1
  f32 = jnp.float32

  def out_shapes(w):   # a slab of w columns
    per_row = lambda want: jax.ShapeDtypeStruct((k, cdiv(w, bn), rows) if want else (1,), f32)
    return [jax.ShapeDtypeStruct((k, rows, w), c_dtype), per_row(want_cs),
            jax.ShapeDtypeStruct((k, rows // bm, w) if want_cs_col else (1,), f32),
            per_row(sums), per_row(c.fwd), per_row(c.fwd or want_max)]

  precision = dot_precision(config, c_dtype)
  y_dot = y.astype(c_dtype)
  padded = cdiv(n, rows) * rows
  xb, yb, _ = bias_args(c.masks, padded, col_tiles * bn)
  x_dot = jnp.pad(x, ((0, padded - n), (0, 0))).astype(c_dtype) if pair is not None else None
  segments = list(zip((0,) + ends[:-1], ends))
  # [rows, w] slab k times [w, features of segment k] (dx), or its transpose times the
  # slab's rows of x (dy): fp32 accumulation.
  times = lambda a, v, dims: jax.lax.dot_general(a, v, (dims, ((), ())), precision=precision,
                                                  preferred_element_type=f32)

  # the tile kernel's scalars: scale * log2(e) and the sigmoid's bias (coefs.scal[0, 3])
  tile_scal = jnp.stack([scal[0], scal[3]])

  def cols_of(v, c0, w, axis):   # columns [c0, c0 + w) of v along axis (all, or a [1]
    # placeholder: v itself)
    if v.shape == (1,) or w == v.shape[axis]:
      return v
    return jax.lax.dynamic_slice_in_dim(v, c0, w, axis)

  def add_cols(acc, c0, part, axis):   # acc[columns c0 ...] += part
    if part.shape[axis] == acc.shape[axis]:
      return acc + part
    return jax.lax.dynamic_update_slice_in_dim(
        acc, cols_of(acc, c0, part.shape[axis], axis) + part, c0, axis)

  def col_stats(v, c0, w):   # a column statistic, [K * m] (or a [1] dummy), for w columns
    return v if v.shape == (1,) or w == m else cols_of(v.reshape(k, m), c0, w, 1).reshape(-1)

  def block(r0, c0, w, acc):
    """Slab r0's coefficients on columns [c0, c0 + w), multiplied in; acc: the slab's
    running sums (None before its first block) and the columns' accumulators."""
    (dxa, cs_a, c1_a, sp_a, mx_a), dy, cs_col = acc
    side = side_stats[:3] + tuple(col_stats(v, c0, w) for v in side_stats[3:])
    coef, cs_part, cs_col_part, c1_part, sp_part, mx_part = call(
        _tile_coef_bwd_kernel, x, cols_of(y, c0, w, 0), tile_scal,
        stack_offsets((offsets[0], offsets[1] + c0), r0), *side, x_tab,
        cols_of(y_tab, c0, w, 1), xb, cols_of(yb, c0, cdiv(w, bn) * bn, 0), n, w,
        out_shapes=out_shapes(w),
        grid=(rows // bm, cdiv(w, bn)),
        num_warps=config.bwd.num_warps, num_stages=config.bwd.num_stages,
        name="memeff/lse_fwd_rows_tiled" if rows_fwd else "memeff/tile_coef_bwd",
        interpret=c.interpret, D=d, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=block_k, NUM_K=num_k, K=k, SEGS=segs, HAS_TAB=has_tab,
        WANT_CS_COL=want_cs_col, SPAN=SHARED_SPAN, WANT_SUM=rows_fwd, WANT_MAX=want_max,
        **tile_flags)
    y_w = cols_of(y_dot, c0, w, 0)
    part = jnp.concatenate([times(coef[i], y_w[:, lo:hi], ((1,), (0,)))
                            for i, (lo, hi) in enumerate(segments)], axis=1) * scal[1]
    plus = lambda a, v: v if a is None else a + v
    dxa = plus(dxa, part)
    cs_a = plus(cs_a, jnp.sum(cs_part, axis=1)) if want_cs else None
    c1_a = plus(c1_a, jnp.sum(c1_part, axis=1)) if sums else None
    sp_a = plus(sp_a, jnp.sum(sp_part, axis=1)) if c.fwd else None
    if c.fwd or want_max:
      mx_b = jnp.max(mx_part, axis=1)
      mx_a = mx_b if mx_a is None else jnp.maximum(mx_a, mx_b)
    if pair is not None:
      x_slab = jax.lax.dynamic_slice_in_dim(x_dot, r0, rows)
      dy = add_cols(dy, c0, jnp.concatenate([times(coef[i], x_slab[:, lo:hi], ((0,), (0,)))
                                             for i, (lo, hi) in enumerate(segments)],
                                            axis=1) * scal[1], 0)
    if want_cs_col:
      cs_col = add_cols(cs_col, c0, jnp.sum(cs_col_part, axis=1) * g_max, 1)
    return (dxa, cs_a, c1_a, sp_a, mx_a), dy, cs_col

  def body(r0, carry):
    dx, big, cs, dy, cs_col, c1, sp, mx = carry
    acc = block(r0, 0, width, ((None,) * 5, dy, cs_col))
    if blocks > 1:
      acc = jax.lax.fori_loop(1, blocks, lambda j, a: block(r0, j * width, width, a), acc)
    if tail:
      acc = block(r0, blocks * width, tail, acc)
    (part, cs_a, c1_a, sp_a, mx_a), dy, cs_col = acc
    if rows_fwd:
      part, part_big = scale_rows(part, x.dtype)
      big = jax.lax.dynamic_update_slice(big, part_big, (r0, 0))
    dx = jax.lax.dynamic_update_slice(dx, part.astype(dx.dtype), (r0, 0))
    if want_cs:
      cs = jax.lax.dynamic_update_slice(cs, cs_a * g_max, (0, r0))
    if sums:
      c1 = jax.lax.dynamic_update_slice(c1, c1_a * g_max, (0, r0))
    if c.fwd:   # (natural units, as lse_fwd gives them)
      sp = jax.lax.dynamic_update_slice(sp, sp_a, (0, r0))
    if c.fwd or want_max:   # (FWD: z, natural units; else s)
      mx = jax.lax.dynamic_update_slice(mx, mx_a * (LN2 if c.fwd else 1.0), (0, r0))
    return dx, big, cs, dy, cs_col, c1, sp, mx

  per_row = lambda want: jnp.zeros((k, padded), f32) if want else None
  init = _compat.vary_like(
      (jnp.zeros((padded, d), rows_dtype(x.dtype) if rows_fwd else c.out_dtype),
       jnp.ones((padded, 1), f32) if rows_fwd else None, per_row(want_cs),
       jnp.zeros((m, d), f32) if pair is not None else None,
       jnp.zeros((k, m), f32) if want_cs_col else None, per_row(sums), per_row(c.fwd),
       per_row(c.fwd or want_max)),
      x, y, scale, *offsets, *side_stats, xb, yb, scal)
  dx, big, cs, dy, cs_col, c1, sp, mx = slab_loop(n, rows, body, init)
  unk = lambda v, cut: v[0, :cut] if prefix is None else v[:, :cut]
  dx, cs = dx[:n], (unk(cs, n) if want_cs else None)
  if rows_fwd:
    return (dx, big[:n]), cs, unk(c1, n), (unk(mx, n) if want_max else None)
  out = (dx, cs) if pair is None else (
      dx, cs, dy.astype(pair[1]), (unk(cs_col, m) if want_cs_col else None))
  out += (unk(c1, n),) if sigmoid else ()
  return out + ((unk(sp, n), unk(mx, n)) if c.fwd else ())
