"""Launchers: the only module that calls ``jax_triton.triton_call``.

Each launcher turns arrays into one kernel launch (or, with ``interpret=True``, the
same launch under Triton's interpreter inside a ``jax.pure_callback``) and reduces
the per-program partial outputs in JAX. ``TritonBackend`` exposes them with the
``fwd_stats`` / ``bwd`` contract of ``_core``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from memeff_jax import _compat
from memeff_jax.config import (KernelConfig, default_config, ladder_chunk, matryoshka_config,
                               paired_config)
from memeff_jax.kernels.grad_bwd import _lse_bwd_kernel, _tile_coef_bwd_kernel
from memeff_jax.kernels.stats_fwd import _lse_fwd_kernel, _tile_lse_fwd_kernel

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The widest spread (log2 units) of a block's row and column log-sum-exps for which the
# gradient shares one exponential per entry between the two softmax roles (lse_bwd):
# the terms that matter, P >= 2^-60, then stay normal floats (2^(z - t) >= 2^-124).
SHARED_SPAN = 64.0
# The bounded forward (KernelConfig.fwd_bounded) sums 2^(z - shift) with one shift per
# block, shift = scale log2(e) - BOUND_HEADROOM: for |s| <= 1 no term passes 2^96, so
# no sum of up to 2^30 terms overflows. Terms under 2^-126 flush to zero, at most
# 2^-96 of them in all, so a sum >= 2^-BOUND_DEPTH is exact to fp32 rounding (2^-26):
# ``fwd_floor`` turns that into a floor on the lse, which ring.forward checks.
BOUND_HEADROOM = 96.0
BOUND_DEPTH = 70.0


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _chunks(d: int, block: int) -> tuple[int, int]:
  """(chunk width, number of chunks) covering d features (power-of-two width >= 16)."""
  d_pad = max(16, 1 << (d - 1).bit_length())
  width = min(block, d_pad)
  return width, _cdiv(d, width)


def _splits(m: int, block_n: int, programs: int, cfg: KernelConfig) -> tuple[int, int]:
  """Split the column sweep so at least ``cfg.min_programs`` programs run.

  Returns (splits, columns per split); a split is a whole number of column tiles.
  """
  col_tiles = _cdiv(m, block_n)
  splits = max(1, min(col_tiles, _cdiv(cfg.min_programs, programs)))
  per_split = _cdiv(col_tiles, splits) * block_n
  return _cdiv(m, per_split), per_split


# ---------------------------------------------------------------- interpreter path
def _to_torch(a):
  import torch  # pylint: disable=g-import-not-at-top
  a = np.array(a)   # a writable copy: torch refuses read-only buffers
  if a.dtype == jnp.bfloat16:
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(a)


def _from_torch(t, dtype):
  import torch  # pylint: disable=g-import-not-at-top
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(jnp.bfloat16)
  return t.numpy().astype(dtype, copy=False)


def _torch_dtype(dtype):
  import torch  # pylint: disable=g-import-not-at-top
  return {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.float16): torch.float16,
          jnp.dtype(jnp.bfloat16): torch.bfloat16}[jnp.dtype(dtype)]


@functools.cache
def _fix_interpreter_bf16_dot() -> None:
  """Triton's interpreter (3.6-3.9) multiplies bf16 dot operands as their raw uint16
  storage. Widen them to fp32 first: exact for bf16 values, and what the tensor
  cores do (exact products, fp32 accumulation). Other dtypes are untouched."""
  import triton.language as tl  # pylint: disable=g-import-not-at-top
  from triton.runtime import interpreter  # pylint: disable=g-import-not-at-top
  builder = type(interpreter.interpreter_builder)
  original = builder.create_dot

  def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
      a, b = (interpreter.TensorHandle(
          interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32),
          tl.float32) if h.dtype.scalar == tl.bfloat16 else h for h in (a, b))
    return original(self, a, b, d, input_precision, max_num_imprecise_acc)

  builder.create_dot = create_dot


# The interpreter patches triton.language globally while a kernel runs: one at a
# time (several host devices call back from several threads).
_INTERPRETER_LOCK = threading.Lock()


def _interpret_call(kernel, args, out_shapes, grid, constexprs):
  """The same launch, run by Triton's interpreter on the host."""
  _fix_interpreter_bf16_dot()
  arrays = [a for a in args if not isinstance(a, int)]

  def host(*vals):
    import torch  # pylint: disable=g-import-not-at-top
    it = iter(vals)
    full = [a if isinstance(a, int) else _to_torch(next(it)) for a in args]
    # Poisoned outputs: an element the kernel forgets to write shows up as NaN.
    outs = [torch.full(s.shape, float("nan"), dtype=_torch_dtype(s.dtype)) for s in out_shapes]
    with _INTERPRETER_LOCK:
      kernel[grid](*full, *outs, **constexprs)
    return tuple(_from_torch(o, s.dtype) for o, s in zip(outs, out_shapes))

  return jax.pure_callback(host, tuple(out_shapes), *arrays)


def _call(kernel, *args, out_shapes, grid, num_warps, num_stages, name, interpret,
          **constexprs):
  if interpret:
    outs = _interpret_call(kernel, args, out_shapes, grid, constexprs)
  else:
    outs = _compat.triton_call(*args, kernel=kernel, out_shapes=out_shapes, grid=grid,
                               name=name, num_warps=num_warps, num_stages=num_stages,
                               **constexprs)
  # Inside shard_map the launch's outputs vary over the axes its inputs vary over.
  return _compat.vary_like(tuple(outs), [a for a in args if not isinstance(a, int)])


def _offsets(offsets, *more) -> jax.Array:
  return jnp.stack([jnp.asarray(o, jnp.int32) for o in (*offsets, *more)])


def _slab_rows(n: int, block_m: int, row_bytes: int, config: KernelConfig,
               min_rows: int = 1) -> int:
  """Rows per slab of the tiled passes: a multiple of block_m whose per-slab buffers
  (row_bytes per row) fit config.slab_kib, at least min_rows, at most the (padded)
  batch; then evened out over the slabs that takes (n = 4100 in 2048-row slabs would
  run a third slab of 4 rows padded to 2048; three slabs of 1408 rows pad 124)."""
  budget = config.slab_kib * 2**10 // max(row_bytes, 1) // block_m * block_m
  rows = min(max(budget, _cdiv(min_rows, block_m) * block_m, block_m), n)
  return _cdiv(_cdiv(n, _cdiv(n, rows)), block_m) * block_m


def _slab_loop(n: int, rows: int, body, init):
  """``body(r0, carry)`` over the slabs starting at rows 0, rows, 2 rows, ... < n. r0 has
  JAX's default int dtype (int64 under jax_enable_x64), as the fori_loop index and the
  Python ints it meets in the bodies' update indices do."""
  slabs = _cdiv(n, rows)
  if slabs == 1:
    return body(jnp.asarray(0), init)
  return jax.lax.fori_loop(0, slabs, lambda k, c: body(k * rows, c), init)


def _dot_precision(config: KernelConfig, dtype):
  if jnp.dtype(dtype).itemsize < 4 or config.precision == "tf32":
    return jax.lax.Precision.DEFAULT
  return jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------------- launchers
def _bias_args(masks, rows, cols):
  """The kernels' ``where`` arguments: (x bias, y bias, HAS_MASK), fp32 0 kept, -inf
  removed, padded (removed) to ``rows`` / ``cols`` entries: every index a program
  reads, so the kernels load them without bounds checks."""
  if masks is None:
    dummy = jnp.zeros((1,), jnp.float32)
    return dummy, dummy, False
  bias = lambda keep, size: jnp.pad(jnp.where(keep, 0.0, -jnp.inf).astype(jnp.float32),
                                    (0, size - keep.shape[0]), constant_values=-jnp.inf)
  return bias(masks[0], rows), bias(masks[1], cols), True


def lse_fwd(x, y, scale, row_thr, offsets, *, two_sided, exclude_self, config, interpret,
            prefix=None, masks=None, bounded=False, want_max=True):
  """Row (and column) log-sum-exp of the masked block and the largest kept logit of
  each row (column): ``(lse_row, lse_col, max_row, max_col)``, natural log units.

  prefix: Matryoshka ``(x_tab, y_tab, ladder)`` (features laid out by the ladder):
  the statistics are then [K, rows] (tiled kernel only). masks: ``where`` masks
  ``(x rows, y rows)`` (bool), or None: a removed row or column is in no softmax.
  bounded (tiled kernel only): the bounded-shift sums, exact where the lse is at least
  ``fwd_floor`` (the caller checks). want_max=False: the maxima are None (bounded: not
  computed)."""
  if config.fwd_tiled or prefix is not None:
    return _lse_fwd_tiled(x, y, scale, row_thr, offsets, two_sided=two_sided,
                          exclude_self=exclude_self, config=config, interpret=interpret,
                          prefix=prefix, masks=masks, bounded=bounded, want_max=want_max)
  assert not bounded, "the bounded forward is tiled"
  if two_sided and config.fwd_col_pass:   # the columns' statistics as a second row pass
    opts = dict(exclude_self=exclude_self, config=config, interpret=interpret)
    lse_row, _, max_row, _ = lse_fwd(x, y, scale, row_thr, offsets, two_sided=False,
                                     masks=masks, **opts)
    lse_col, _, max_col, _ = lse_fwd(y, x, scale, None, offsets[::-1], two_sided=False,
                                     masks=None if masks is None else masks[::-1], **opts)
    return lse_row, lse_col, max_row, max_col
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.fwd_block_m, config.fwd_block_n
  block_d, num_d = _chunks(d, config.fwd_block_d)
  row_tiles = _cdiv(n, bm)
  programs = min(row_tiles, config.max_programs) if two_sided else row_tiles
  splits, per_split = _splits(m, bn, programs, config)
  f32 = jnp.float32
  scal = jnp.reshape(scale * LOG2E, (1,)).astype(f32)
  thr = jnp.zeros((1,), f32) if row_thr is None else row_thr.astype(f32)
  out_shapes = [jax.ShapeDtypeStruct((splits, n), f32),
                jax.ShapeDtypeStruct((programs, m) if two_sided else (1,), f32)] * 2
  xb, yb, has_mask = _bias_args(masks, row_tiles * bm, _cdiv(m, bn) * bn)
  lse_row, lse_col, max_row, max_col = _call(
      _lse_fwd_kernel, x, y, scal, thr, _offsets(offsets), xb, yb, n, m, per_split,
      out_shapes=out_shapes, grid=(programs, splits), num_warps=config.fwd_num_warps,
      num_stages=config.fwd_num_stages, name="memeff/lse_fwd", interpret=interpret, D=d,
      BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, NUM_D=num_d, ROW_THR=row_thr is not None,
      EXCLUDE_SELF=exclude_self, TWO_SIDED=two_sided, PRECISION=config.precision,
      HAS_MASK=has_mask)
  lse_row = jax.nn.logsumexp(lse_row * LN2, axis=0)
  lse_col = jax.nn.logsumexp(lse_col * LN2, axis=0) if two_sided else None
  if not want_max:
    return lse_row, lse_col, None, None
  max_row = jnp.max(max_row, axis=0) * LN2
  max_col = jnp.max(max_col, axis=0) * LN2 if two_sided else None
  return lse_row, lse_col, max_row, max_col


def fwd_floor(scale):
  """The lse (natural log units) at and above which the bounded forward's statistics
  are exact: its sum is then at least 2^-BOUND_DEPTH (see BOUND_HEADROOM)."""
  return scale - (BOUND_HEADROOM + BOUND_DEPTH) * LN2


def _prefix_args(prefix, num_k):
  """Kernel arguments of the Matryoshka tables: (K, SEGS, HAS_TAB, x_tab, y_tab)."""
  if prefix is None:
    dummy = jnp.zeros((1,), jnp.float32)
    return 1, num_k, False, dummy, dummy
  x_tab, y_tab, ladder = prefix
  return len(ladder.ends), ladder.segs, True, x_tab.astype(jnp.float32), y_tab.astype(
      jnp.float32)


def _lse_fwd_tiled(x, y, scale, row_thr, offsets, *, two_sided, exclude_self, config,
                   interpret, prefix, masks, bounded, want_max):
  """lse_fwd as slabs of GEMM tiles (stats_fwd._tile_lse_fwd_kernel): both sides at once.
  Exact: per-tile log-sum-exps merged by logsumexp; bounded: per-tile sums of
  2^(z - shift), added up, then shift + log2(sum)."""
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.fwd_block_m, config.fwd_block_n
  block_k, num_k = _chunks(d, config.fwd_block_d) if prefix is None else (
      prefix[2].chunk, d // prefix[2].chunk)
  k, segs, has_tab, x_tab, y_tab = _prefix_args(prefix, num_k)
  col_tiles = _cdiv(m, bn)
  maxima = want_max or not bounded   # the exact epilogue always stores them
  # per row: the fp32 partials (log-sum-exps or sums, and maxima) of every column tile
  # (and, two-sided, of every row tile's columns)
  parts = (col_tiles + (_cdiv(m, bm) if two_sided else 0)) * (2 if maxima else 1)
  rows = _slab_rows(n, bm, 4 * k * parts, config)
  xb, yb, has_mask = _bias_args(masks, _cdiv(n, rows) * rows, col_tiles * bn)
  f32 = jnp.float32
  scale2 = scale * LOG2E
  shift = scale2 - BOUND_HEADROOM
  scal = jnp.stack([scale2, shift]).astype(f32)
  thr = jnp.zeros((1,), f32) if row_thr is None else row_thr.astype(f32).reshape(-1)
  part = lambda shape: jax.ShapeDtypeStruct(shape, f32)
  col_shape = (k, rows // bm, m) if two_sided else (1,)
  out_shapes = [part((k, col_tiles, rows)), part(col_shape),
                part((k, col_tiles, rows) if maxima else (1,)),
                part(col_shape if maxima else (1,))]
  warps = config.fwd_one_sided_warps
  warps = config.fwd_num_warps if two_sided or warps is None else warps
  if bounded:   # sums, added
    merge, add, empty = (lambda p: jnp.sum(p, axis=1)), jnp.add, 0.0
  else:         # log-sum-exps (log2 units in, natural out), merged
    merge, add, empty = (lambda p: jax.nn.logsumexp(p * LN2, axis=1)), jnp.logaddexp, -jnp.inf

  def body(r0, carry):
    lse_row, lse_col, max_row, max_col = carry
    row_part, col_part, row_max, col_max = _call(
        _tile_lse_fwd_kernel, x, y, scal, thr, _offsets(offsets, r0), x_tab, y_tab, xb, yb, n,
        m, out_shapes=out_shapes, grid=(rows // bm, col_tiles), num_warps=warps,
        num_stages=config.fwd_num_stages, name="memeff/tile_lse_fwd", interpret=interpret,
        D=d, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k, NUM_K=num_k,
        ROW_THR=row_thr is not None, EXCLUDE_SELF=exclude_self, TWO_SIDED=two_sided,
        PRECISION=config.precision, K=k, SEGS=segs, HAS_TAB=has_tab, HAS_MASK=has_mask,
        BOUNDED=bounded, WANT_MAX=want_max)
    lse_row = jax.lax.dynamic_update_slice(lse_row, merge(row_part), (0, r0))
    if two_sided:
      lse_col = add(lse_col, merge(col_part))
    if want_max:
      max_row = jax.lax.dynamic_update_slice(max_row, jnp.max(row_max, axis=1) * LN2, (0, r0))
      if two_sided:
        max_col = jnp.maximum(max_col, jnp.max(col_max, axis=1) * LN2)
    return lse_row, lse_col, max_row, max_col

  padded = jnp.zeros((k, _cdiv(n, rows) * rows), f32)
  cols = jnp.full((k, m), empty, f32) if two_sided else None
  mcols = jnp.full((k, m), -jnp.inf, f32) if two_sided else None
  init = _compat.vary_like((padded, cols, padded if want_max else None,
                            mcols if want_max else None), x, y, scale, *offsets, xb, yb)
  lse_row, lse_col, max_row, max_col = _slab_loop(n, rows, body, init)
  if bounded:   # shift + log2(sum), natural units (-inf where nothing was kept)
    lse_row, lse_col = (None if v is None else (shift + jnp.log2(v)) * LN2
                        for v in (lse_row, lse_col))
  out = (lse_row[:, :n], lse_col, None if max_row is None else max_row[:, :n], max_col)
  return tuple(None if v is None else (v[0] if prefix is None else v) for v in out)


def _lse_bwd_tiled(x, y, scale, offsets, *, side_stats, flags, want_cs, out_dtype, config,
                   interpret, scal, g_max, prefix, masks, pair):
  """lse_bwd as slabs: coefficient slabs from GEMM tiles (grad_bwd._tile_coef_bwd_kernel),
  then dx[slab] = scale * g_max * c[slab] @ y as XLA dots (Matryoshka: slab k times
  feature segment k of y). ``side_stats``, ``flags``, ``scal`` and ``g_max`` come from
  lse_bwd, as for the FlashAttention-shaped kernel. ``pair`` (None, or the columns'
  ``(want_cs, out_dtype)``): the same slabs also give the columns' gradient,
  dy += scale * g_max * c[slab]^T @ x[slab], and their sums of c s."""
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.bwd_block_m, config.bwd_block_n
  block_k, num_k = _chunks(d, config.bwd_block_d) if prefix is None else (
      prefix[2].chunk, d // prefix[2].chunk)
  k, segs, has_tab, x_tab, y_tab = _prefix_args(prefix, num_k)
  ends = (d,) if prefix is None else prefix[2].ends
  col_tiles = _cdiv(m, bn)
  # fp16 slabs could overflow once the prefix tables (>= 1) multiply the coefficients.
  c_dtype = jnp.float32 if (prefix is not None and x.dtype == jnp.float16) else x.dtype
  # The budget counts the slabs; their fp32 per-tile sums (4 / (BLOCK_N itemsize) of
  # them) ride on top, so that a power-of-two budget and batch give whole slabs (at
  # B = 16384 the 64 MiB budget is 8 slabs of 2048 rows, not 9 of 1856 padded to 16704).
  rows = _slab_rows(n, bm, k * m * jnp.dtype(c_dtype).itemsize, config,
                    min_rows=config.min_slab_rows)
  want_cs_col = pair is not None and pair[0]
  # Both roles: one exponential per entry, on a shift each tile picks (TILE_SHIFT).
  tile_flags = {f: v for f, v in flags.items() if f != "SHARED"}
  tile_flags["TILE_SHIFT"] = flags["HAS_ROW"] and flags["HAS_COL"]
  f32 = jnp.float32
  out_shapes = [jax.ShapeDtypeStruct((k, rows, m), c_dtype),
                jax.ShapeDtypeStruct((k, col_tiles, rows) if want_cs else (1,), f32),
                jax.ShapeDtypeStruct((k, rows // bm, m) if want_cs_col else (1,), f32)]
  precision = _dot_precision(config, c_dtype)
  y_dot = y.astype(c_dtype)
  padded = _cdiv(n, rows) * rows
  xb, yb, _ = _bias_args(masks, padded, col_tiles * bn)
  x_dot = jnp.pad(x, ((0, padded - n), (0, 0))).astype(c_dtype) if pair is not None else None
  segments = list(zip((0,) + ends[:-1], ends))
  # [rows, m] slab k times [m, features of segment k] (dx), or its transpose times the
  # slab's rows of x (dy): fp32 accumulation.
  times = lambda c, v, dims: jax.lax.dot_general(c, v, (dims, ((), ())), precision=precision,
                                                  preferred_element_type=f32)

  def body(r0, carry):
    dx, cs, dy, cs_col = carry
    c, cs_part, cs_col_part = _call(
        _tile_coef_bwd_kernel, x, y, scal[:1], _offsets(offsets, r0), *side_stats, x_tab,
        y_tab, xb, yb, n, m, out_shapes=out_shapes, grid=(rows // bm, col_tiles),
        num_warps=config.bwd_num_warps, num_stages=config.bwd_num_stages,
        name="memeff/tile_coef_bwd", interpret=interpret, D=d, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=block_k, NUM_K=num_k, K=k, SEGS=segs, HAS_TAB=has_tab,
        WANT_CS_COL=want_cs_col, SPAN=SHARED_SPAN, **tile_flags)
    part = jnp.concatenate([times(c[i], y_dot[:, lo:hi], ((1,), (0,)))
                            for i, (lo, hi) in enumerate(segments)], axis=1) * scal[1]
    dx = jax.lax.dynamic_update_slice(dx, part.astype(dx.dtype), (r0, 0))
    if want_cs:
      cs = jax.lax.dynamic_update_slice(cs, jnp.sum(cs_part, axis=1) * g_max, (0, r0))
    if pair is not None:
      x_slab = jax.lax.dynamic_slice_in_dim(x_dot, r0, rows)
      dy = dy + jnp.concatenate([times(c[i], x_slab[:, lo:hi], ((0,), (0,)))
                                 for i, (lo, hi) in enumerate(segments)], axis=1) * scal[1]
    if want_cs_col:
      cs_col = cs_col + jnp.sum(cs_col_part, axis=1) * g_max
    return dx, cs, dy, cs_col

  init = _compat.vary_like(
      (jnp.zeros((padded, d), out_dtype), jnp.zeros((k, padded), f32) if want_cs else None,
       jnp.zeros((m, d), f32) if pair is not None else None,
       jnp.zeros((k, m), f32) if want_cs_col else None),
      x, y, scale, *offsets, *side_stats, xb, yb)
  dx, cs, dy, cs_col = _slab_loop(n, rows, body, init)
  unk = lambda v, cut: v[0, :cut] if prefix is None else v[:, :cut]
  dx, cs = dx[:n], (unk(cs, n) if want_cs else None)
  if pair is None:
    return dx, cs
  return dx, cs, dy.astype(pair[1]), (unk(cs_col, m) if want_cs_col else None)


def _bwd_tiled(config: KernelConfig, pair) -> bool:
  """Whether lse_bwd takes the tiled (coefficient-slab) gradient: configured so, or
  paired."""
  return config.bwd_tiled or pair is not None


def lse_bwd(x, y, scale, offsets, row, col, *, exclude_self, want_cs, out_dtype, config,
            interpret, prefix=None, masks=None, pair=None):
  """``(scale * sum_j c_ij y_j, sum_j c_ij s_ij or None)`` for the rows of x (grad_bwd).

  prefix: Matryoshka ``(x_tab, y_tab, ladder)``, as for lse_fwd: the side statistics
  and the returned sums are then [K, rows]. masks: as for lse_fwd.
  pair: None, or the columns' ``(want_cs, out_dtype)``: then also the columns' gradient
  ``scale * sum_i c_ij x_i`` and sums ``sum_i c_ij s_ij`` from the same coefficient
  slabs (tiled kernel only): ``(dx, cs, dy, cs_col)``."""
  f32 = jnp.float32
  g_max = jnp.zeros((), f32)
  for side in (row, col):
    if side is not None:
      g_max = jnp.maximum(g_max, jnp.max(jnp.abs(side.g)).astype(f32))
  g_max = jnp.where(jnp.isfinite(g_max) & (g_max > 0), g_max, 1.0)
  scal = jnp.stack([scale * LOG2E, scale * g_max, g_max]).astype(f32)
  dummy = jnp.zeros((1,), f32)
  lse2 = lambda side: (side.lse * LOG2E).astype(f32)
  g = lambda side: (side.g / g_max).astype(f32)
  thr = lambda side: dummy if side.thr is None else side.thr.astype(f32).reshape(-1)

  if masks is not None:   # a removed anchor's softmax is empty: lse = +inf (coefficient)
    gone = lambda side, keep: None if side is None else side._replace(
        lse=jnp.where(keep, side.lse, jnp.inf))
    row, col = gone(row, masks[0]), gone(col, masks[1])

  def stats(side):
    if side is None:
      return dummy, dummy, dummy
    return lse2(side).reshape(-1), g(side).reshape(-1), thr(side)

  flags = dict(HAS_MASK=masks is not None, HAS_ROW=row is not None, HAS_COL=col is not None,
               ROW_THR=row is not None and row.thr is not None,
               COL_THR=col is not None and col.thr is not None, EXCLUDE_SELF=exclude_self,
               WANT_CS=want_cs, PRECISION=config.precision)
  go = functools.partial(_lse_bwd_launch, x, y, scale, offsets, want_cs=want_cs,
                         out_dtype=out_dtype, config=config, interpret=interpret, scal=scal,
                         g_max=g_max, prefix=prefix, masks=masks, pair=pair)
  plain = lambda: go((*stats(row), *stats(col)), dict(flags, SHARED=False))
  if row is None or col is None or _bwd_tiled(config, pair):
    return plain()   # (the tiled kernel shares the exponential tile by tile)
  # Both roles: rebase them on one shift t per dim (the largest finite lse), so one
  # exponential per entry serves both, c = 2^(z - t) (g_r 2^(t - lse_r) + g_c 2^(t - lse_c)),
  # where every lse of the block lies within SHARED_SPAN of t (else, or NaN: two).
  k = 1 if prefix is None else prefix[0].shape[0]
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


def _lse_bwd_launch(x, y, scale, offsets, side_stats, flags, *, want_cs, out_dtype, config,
                    interpret, scal, g_max, prefix, masks, pair):
  """lse_bwd's launches for one form of the statistics (``side_stats``, ``flags``)."""
  if _bwd_tiled(config, pair):
    return _lse_bwd_tiled(x, y, scale, offsets, side_stats=side_stats, flags=flags,
                          want_cs=want_cs, out_dtype=out_dtype, config=config,
                          interpret=interpret, scal=scal, g_max=g_max, prefix=prefix,
                          masks=masks, pair=pair)
  d = x.shape[1]
  if prefix is not None:   # Matryoshka: the ladder's chunks, every feature in one launch
    chunk = prefix[2].chunk
    return _lse_bwd_fa(x, y, scal, offsets, side_stats, masks, flags, want_cs, out_dtype,
                       config, interpret, chunk, d // chunk, prefix)
  block_d, num_d = _chunks(d, config.bwd_block_d)
  block_do, num_do = _chunks(d, config.bwd_block_do)
  dx, cs = _lse_bwd_fa(x, y, scal, offsets, side_stats, masks, flags, want_cs, out_dtype,
                       config, interpret, block_d, num_d, None, block_do=block_do,
                       num_do=num_do)
  return dx, (None if cs is None else cs[0])


def _lse_bwd_fa(x, y, scal, offsets, side_stats, masks, flags, want_cs, out_dtype, config,
                interpret, block_d, num_d, prefix, block_do=None, num_do=1):
  """One launch of the FlashAttention-shaped gradient (grad_bwd._lse_bwd_kernel):
  ``(dx, cs)``, cs [K, n] or None. ``block_do`` / ``num_do``: the plain body's feature
  axis (Matryoshka: unused)."""
  (n, d), m = x.shape, y.shape[0]
  bm, bn = config.bwd_block_m, config.bwd_block_n
  f32 = jnp.float32
  k, segs, has_tab, x_tab, y_tab = _prefix_args(prefix, num_d)
  block_do = d if block_do is None else block_do   # None: Matryoshka, unused
  splits, per_split = _splits(m, bn, _cdiv(n, bm) * num_do, config)
  dx_dtype = out_dtype if splits == 1 else f32
  out_shapes = [jax.ShapeDtypeStruct((splits, n, d), dx_dtype),
                jax.ShapeDtypeStruct((k, splits, n) if want_cs else (1,), f32)]
  xb, yb, _ = _bias_args(masks, _cdiv(n, bm) * bm, _cdiv(m, bn) * bn)
  dx, cs = _call(
      _lse_bwd_kernel, x, y, scal, _offsets(offsets), *side_stats, x_tab, y_tab, xb, yb,
      n, m, per_split, out_shapes=out_shapes, grid=(_cdiv(n, bm), num_do, splits),
      num_warps=config.bwd_num_warps, num_stages=config.bwd_num_stages,
      name="memeff/lse_bwd", interpret=interpret, D=d, BLOCK_M=bm, BLOCK_N=bn,
      BLOCK_D=block_d, NUM_D=num_d, BLOCK_DO=block_do,
      REUSE_Y=(num_d == 1 and num_do == 1 and block_do == block_d), K=k, SEGS=segs,
      HAS_TAB=has_tab, **dict(flags, WANT_CS=want_cs))
  dx = dx[0] if splits == 1 else jnp.sum(dx, axis=0)
  return dx.astype(out_dtype), (jnp.sum(cs, axis=1) if want_cs else None)


@functools.cache
def _device_smem_kib() -> int:
  """Shared memory one block may use on the first GPU, by compute capability (KiB)."""
  try:
    major, minor = (int(v) for v in str(jax.devices()[0].compute_capability).split("."))
  except (AttributeError, RuntimeError, ValueError):
    return 227
  if major in (9, 10):   # H100/H200, B200
    return 227
  if (major, minor) in ((8, 0), (8, 7)):   # A100, Orin
    return 163
  return 96 if major == 7 else 99   # V100; consumer Ampere/Ada/Blackwell


class Ladder(NamedTuple):
  """Matryoshka dims as the kernels walk them: feature segments [m_{k-1}, m_k), each
  padded with zero features to a multiple of ``chunk`` (a no-op for aligned ladders
  such as (64, 128, 256, 512)), so every dim ends on a chunk boundary."""

  dims: tuple[int, ...]     # the user's dims
  ends: tuple[int, ...]     # their ends in the padded layout
  chunk: int                # the kernels' feature chunk

  @classmethod
  def of(cls, dims, block: int) -> "Ladder":
    chunk = ladder_chunk(dims, block)
    ends = tuple(itertools.accumulate(_cdiv(hi - lo, chunk) * chunk
                                      for lo, hi in zip((0,) + dims[:-1], dims)))
    return cls(tuple(dims), ends, chunk)

  @property
  def segs(self) -> int:
    """The kernels' SEGS: dim k ends after chunk ``(SEGS >> 16 k) & 0xFFFF``."""
    assert self.ends[-1] // self.chunk < 2**16
    return sum((e // self.chunk) << (16 * k) for k, e in enumerate(self.ends))

  def _pairs(self):
    return zip((0,) + self.dims[:-1], self.dims, (0,) + self.ends[:-1])

  def pad(self, v):
    if self.ends == self.dims:
      return v
    segs = [v[:, lo:hi] for lo, hi, _ in self._pairs()]
    widths = [e - p for e, (_, _, p) in zip(self.ends, self._pairs())]
    return jnp.concatenate([jnp.pad(sg, ((0, 0), (0, w - sg.shape[1])))
                            for sg, w in zip(segs, widths)], axis=1)

  def unpad(self, g):
    if self.ends == self.dims:
      return g
    return jnp.concatenate([g[:, p:p + hi - lo] for lo, hi, p in self._pairs()], axis=1)


@dataclasses.dataclass(frozen=True)
class TritonBackend:
  """The Triton kernels behind the ``fwd_stats`` / ``bwd`` contract of ``_core``."""

  interpret: bool = False

  @property
  def name(self) -> str:
    return "interpret" if self.interpret else "triton"

  def _smem_kib(self) -> int | None:
    """The GPU's shared memory a block (KiB) the configs are fitted to; None (the
    H100's) for the interpreter."""
    return None if self.interpret else _device_smem_kib()

  def default_config(self, d: int, dtype) -> KernelConfig:
    """The config a block of feature size ``d`` gets with ``config=None``."""
    return default_config(d, dtype, interpret=self.interpret, smem_kib=self._smem_kib())

  def _setup(self, spec, x, x_tab, y_tab):
    """(config, prefix or None): Matryoshka's config from ``matryoshka_config``."""
    d, dtype = x.shape[1], x.dtype
    default = self.default_config(d, dtype)
    cfg = spec.config if spec.config is not None else default
    if spec.dims is None:
      return cfg, None
    # The default config, whichever its matryoshka_per_dim, gets Matryoshka's tiles.
    own = dataclasses.replace(cfg, matryoshka_per_dim=default.matryoshka_per_dim) != default
    cfg = matryoshka_config(cfg, spec.dims, jnp.dtype(dtype).itemsize, self._smem_kib(),
                            retile=not own and not self.interpret, interpret=self.interpret)
    return cfg, (x_tab, y_tab, Ladder.of(spec.dims, cfg.fwd_block_d))

  def fwd_floor(self, x, scale, spec):
    """None where the block's forward is exact only; else the floor (natural log units)
    above which ``fwd_stats(bounded=True)``'s statistics are exact (every one of them
    that is kept must reach it, or the caller reruns the exact forward)."""
    cfg = self._setup(spec, x, None, None)[0]
    return fwd_floor(scale) if cfg.fwd_bounded and (cfg.fwd_tiled or spec.dims) else None

  def fwd_stats(self, x, y, scale, *, row_thr, x_tab, y_tab, masks, offsets, spec,
                bounded=False):
    cfg, prefix = self._setup(spec, x, x_tab, y_tab)
    if prefix is not None:
      x, y = prefix[2].pad(x), prefix[2].pad(y)
    return lse_fwd(x, y, scale, row_thr, offsets, two_sided=spec.two_sided,
                   exclude_self=spec.exclude_self, config=cfg, interpret=self.interpret,
                   prefix=prefix, masks=masks, bounded=bounded, want_max=spec.want_max)

  def bwd(self, x, y, scale, *, row, col, x_tab, y_tab, masks, offsets, spec, want_cs,
          out_dtype):
    cfg, prefix = self._setup(spec, x, x_tab, y_tab)
    if prefix is not None:
      x, y = prefix[2].pad(x), prefix[2].pad(y)
    dx, cs = lse_bwd(x, y, scale, offsets, row, col, exclude_self=spec.exclude_self,
                     want_cs=want_cs, out_dtype=out_dtype, config=cfg,
                     interpret=self.interpret, prefix=prefix, masks=masks)
    return (dx if prefix is None else prefix[2].unpad(dx)), cs

  def pairs(self, x, y, spec) -> bool:
    """Whether ``bwd_pair`` serves this block (when both its towers need a gradient)."""
    cfg = self._setup(spec, x, None, None)[0]
    return cfg.bwd_pair or y.shape[0] <= cfg.bwd_pair_max_batch

  def bwd_pair(self, x, y, scale, *, row, col, x_tab, y_tab, masks, offsets, spec, want_cs,
               out_dtype):
    """``bwd`` for the rows of x and, from the same coefficient slabs, for the rows of
    y (the transposed block): ``(dx, cs_x, dy, cs_y)``; ``want_cs`` and ``out_dtype``
    are pairs (x, y)."""
    cfg, prefix = self._setup(spec, x, x_tab, y_tab)
    cfg = paired_config(cfg, x.shape[1], jnp.dtype(x.dtype).itemsize, self._smem_kib())
    if prefix is not None:
      x, y = prefix[2].pad(x), prefix[2].pad(y)
    dx, cs, dy, cs_col = lse_bwd(
        x, y, scale, offsets, row, col, exclude_self=spec.exclude_self, want_cs=want_cs[0],
        out_dtype=out_dtype[0], config=cfg, interpret=self.interpret, prefix=prefix,
        masks=masks, pair=(want_cs[1], out_dtype[1]))
    if prefix is not None:
      dx, dy = prefix[2].unpad(dx), prefix[2].unpad(dy)
    return dx, cs, dy, cs_col
