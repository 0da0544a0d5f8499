"""The one differentiable op every loss uses: masked, scaled per-row statistics of a
similarity block, over its rows and optionally its columns. The statistic is the
block's ``Reduction`` (``spec.reduction``, ``_reduction.py``, docs/math.md §12): the
softmax's log-sum-exp below, or the sigmoid's sums (SigLIP, with ``bias``).

    z_ij  = scale * s_ij,   s_ij = <x_i, y_j>
            (prefix dims: s^k_ij = a_ik * b_jk * <x_i[:m_k], y_j[:m_k]>, a/b the
             per-prefix inverse-norm tables x_tab [K, n] / y_tab [K, m])
    keep  = [s_ij <= row_thr_i]       (if row_thr is given; raw similarity units)
          & [global i != global j]    (if exclude_self)
          & x_mask_i & y_mask_j       (if the ``where`` masks are given: a removed row
                                       or column is in no softmax)
    lse_row_i = log sum_j keep_ij exp(z_ij)          [n]   ([K, n] with dims)
    lse_col_j = log sum_i keep_ij exp(z_ij)          [m]   (two_sided only)
    max_row_i = max_j keep_ij z_ij, max_col_j alike  (no gradient: in-batch accuracy;
                                                      None unless spec.want_max)

``symmetric`` blocks pass ``y=None`` and mean y = x (the q-q and d-d blocks): one
gradient pass then folds both softmax roles of each pair. With ``axis_name`` the
rows are this device's shard and the columns run over the whole ring
(``ring.py``); without it the ring has one device.

VJP, for cotangents g_row / g_col (the softmax's coefficients; a reduction's
``coefficient`` in general):

    c_ij   = g_row_i * keep_ij * exp(z_ij - lse_row_i) + g_col_j * keep_ij * exp(z_ij - lse_col_j)
    dx_i   = scale * sum_j c_ij y_j,   dy_j = scale * sum_i c_ij x_i
    dscale = sum_ij c_ij s_ij,         da_ik = scale * sum_j c^k_ij s^k_ij / a_ik

Only O(n) residuals are saved (the inputs and the statistics), except where the
gradient is formed in the forward pass: ``_fuses`` (a ``local`` reduction, the sigmoid,
whose block the backend ``fuses``) saves the unit-cotangent gradients of both towers,
``_fuses_rows`` (a one-sided softmax block whose rows train, where the backend
``fuses_rows``) the rows' one, O(n d) each, and the backward scales them
(docs/math.md §3, §12). With
``symbolic_zeros`` a locked tower, a constant temperature or an unused column
statistic skips its gradient kernels.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Hashable

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from memeff_jax import ring
from memeff_jax._compat import standard_numpy, varying_axes
from memeff_jax._reduction import SOFTMAX, Reduction
from memeff_jax.backends.base import Block, Side, unscale_rows
from memeff_jax.config import KernelConfig


@dataclasses.dataclass(frozen=True)
class BlockSpec:
  """Static options of one block; hashable, closed over by the custom_vjp."""

  backend: Any                      # a backends.Backend: fwd_stats / bwd of a backends.Block
  two_sided: bool = False           # also the column statistics
  exclude_self: bool = False        # drop the pairs with global row index == column index
  symmetric: bool = False           # y is x (call with y=None)
  dims: tuple[int, ...] | None = None   # prefix (Matryoshka) dims
  axis_name: Hashable | None = None     # ring axis (inside shard_map)
  config: KernelConfig | None = None
  want_max: bool = True             # the maxima (in-batch accuracy); False: they are None
  reduction: Reduction = SOFTMAX    # the per-row statistic, its merge and its coefficient
  cast: Any = None                  # x / y arrive in the glue dtype and compute in this one
                                    # (float16 prefix blocks: their gradient, scaled by
                                    # the tables inside, leaves in fp32)

  def __post_init__(self):
    if self.two_sided and self.symmetric:
      raise ValueError("a symmetric block's column statistics are its row statistics")


def block_stats(x, y, scale, row_thr=None, x_tab=None, y_tab=None, x_mask=None, y_mask=None,
                bias=None, *, spec: BlockSpec):
  """``(lse_row, lse_col, max_row, max_col)`` of the block: the statistics of
  ``spec.reduction`` (the softmax's log-normalizers) and the largest kept logit
  ``max_j keep_ij z_ij`` of each row and column (-inf if none; no gradient, it feeds
  the in-batch accuracy; None unless ``spec.want_max``); the column ones are None
  unless ``spec.two_sided``. ``x_mask`` / ``y_mask``: bool [n] / [m] row masks, both or
  neither (a symmetric block takes ``x_mask`` only). ``bias``: a 0-d logit bias added
  before the reduction (the sigmoid's; a softmax takes none), with a gradient."""
  if (spec.dims is None) != (x_tab is None):
    raise ValueError("prefix dims and inverse-norm tables go together")
  if spec.symmetric != (y is None):
    raise ValueError("symmetric blocks take y=None; other blocks need y")
  if (y_mask is not None) != (x_mask is not None and not spec.symmetric):
    raise ValueError("row masks: both or neither (a symmetric block takes x_mask only)")
  with jax.named_scope(f"memeff/block_{spec.reduction.name}"):
    if (bias is not None) != spec.reduction.biased:
      raise ValueError(f"the {spec.reduction.name} reduction takes "
                       f"{'a' if spec.reduction.biased else 'no'} logit bias")
    return _op(spec)(x, y, scale, row_thr, x_tab, y_tab, x_mask, y_mask, bias)


block_lse = block_stats   # the softmax's name for it, kept for its callers


@functools.cache
def _op(spec: BlockSpec):

  cast = lambda v: v if (v is None or spec.cast is None) else v.astype(spec.cast)

  @jax.custom_vjp
  def op(x, y, scale, row_thr, x_tab, y_tab, x_mask, y_mask, bias):
    block = Block(cast(x), cast(y), x_tab, y_tab, x_mask, y_mask, bias=bias)
    return ring.forward(spec, block, scale, row_thr)

  def fwd(x, y, scale, row_thr, x_tab, y_tab, x_mask, y_mask, bias):
    val = lambda p: None if p is None else p.value
    block = Block(cast(val(x)), cast(val(y)), val(x_tab), val(y_tab), val(x_mask),
                  val(y_mask), bias=val(bias))
    need = ring.Need(
        x=x.perturbed, y=(y is not None and y.perturbed), scale=scale.perturbed,
        x_tab=(x_tab is not None and x_tab.perturbed),
        y_tab=(y_tab is not None and y_tab.perturbed),
        bias=(bias is not None and bias.perturbed))
    # The residuals have one layout whichever inputs are perturbed (an unused slot holds
    # an empty array, and bwd finds the path again from ``need``): JAX's dead-code pass
    # over a traced op reads the residual layout of the last forward it traced, which
    # under this cached jit may be another perturbation's (NOTES.md 2026-12-07).
    empty = jnp.zeros((0,), jnp.float32)
    slots = lambda k, vs=(): tuple(empty if v is None else v for v in vs) + (empty,) * (k - len(vs))
    res = lambda *lse: (block, val(scale), val(row_thr), *slots(2, lse))
    if _fuses(spec, need, block, row_thr):
      lse_row, max_row, *unit = spec.backend.fwd_grad(block, val(scale), spec=spec,
                                                      want_cs=need.scale)
      out = (lse_row, None, max_row if spec.want_max else None, None)
      return out, (res(), need, slots(4, unit), slots(4))
    if _fuses_rows(spec, need, block):
      lse_row, max_row, *rows = ring.forward_rows(spec, block, val(scale), val(row_thr),
                                                  need.scale)
      out = (lse_row, None, max_row, None)
      return out, (res(lse_row), need, slots(4), slots(4, rows))
    out = ring.forward(spec, block, val(scale), val(row_thr))
    return out, (res(*out[:2]), need, slots(4), slots(4))

  def bwd(saved, cts):
    (block, scale, row_thr, lse_row, lse_col), need, unit, rows = saved
    # The maxima's cotangents (cts[2:]) are dropped: they carry no gradient.
    g_row, g_col = (None if (c is None or isinstance(c, SymbolicZero)) else c for c in cts[:2])
    if g_row is None and g_col is None:
      return (None,) * 9
    if _fuses(spec, need, block, row_thr):
      out = _scaled(need, block, scale, unit, g_row)
    elif _fuses_rows(spec, need, block):
      out = _rows_scaled(spec, need, block, scale, row_thr, lse_row, rows, g_row)
    else:
      residual = spec.reduction.residual
      row = None if g_row is None else Side(residual(lse_row), g_row, row_thr)
      col = None if g_col is None else Side(residual(lse_col), g_col, None)
      dx, dy, dscale, dxt, dyt, dbias = ring.backward(spec, need, block, scale, row, col)
      out = dx, dy, dscale, None, dxt, dyt, None, None, dbias
    primals = (block.x, block.y, scale, None, block.x_tab, block.y_tab, None, None, block.bias)
    return tuple(map(_summed_like, out, primals))

  op.defvjp(standard_numpy(fwd), standard_numpy(bwd), symbolic_zeros=True)
  # Under jit, so that a user's eager shard_map can run it (JAX has no eager
  # symbolic-zeros custom_vjp inside shard_map).
  return jax.jit(op)


def _summed_like(ct, primal):
  """Inside shard_map: a cotangent summed over the mesh axes it varies over and its
  primal does not, as JAX's own transposes sum them (a replicated temperature's or
  bias's gradient from this device's rows: over the ring's axis and any data-parallel
  one beside it)."""
  if ct is None or primal is None:
    return ct
  extra = varying_axes(ct) - varying_axes(primal)
  return lax.psum(ct, tuple(sorted(extra, key=str))) if extra else ct


def _fuses(spec: BlockSpec, need, block: Block, row_thr) -> bool:
  """Whether the block's gradient comes from its forward (``Backend.fwd_grad``): a
  ``local`` reduction (its coefficients read no statistic, so the gradient for a unit
  cotangent on every row can be formed before the cotangent is known), one device,
  both towers training, where the backend offers it. The families whose blocks take
  this path give every kept row the same cotangent (``_scaled``)."""
  return (spec.reduction.local and spec.axis_name is None and row_thr is None
          and need.x and need.y and block.x_tab is None
          and spec.backend.fuses(block.x, block.y, spec))


def _fuses_rows(spec: BlockSpec, need, block: Block) -> bool:
  """Whether the rows' gradient comes from the forward (``Backend.fwd_rows``): the
  softmax, a plain one-sided block on one device whose rows train (LiT's, Qwen3's
  queries), where the backend offers it (``fuses_rows``, told whether the columns train
  too: it weighs the forward's rows plus the columns' pass against its paired pass)."""
  return (spec.reduction.name == SOFTMAX.name and spec.axis_name is None and not spec.two_sided
          and not spec.symmetric and spec.dims is None and spec.cast is None and need.x
          and spec.backend.fuses_rows(block.x, block.y, spec, y_trains=need.y))


def _rows_scaled(spec: BlockSpec, need, block: Block, scale, row_thr, lse_row, rows, g_row):
  """The op's cotangents from ``fwd_rows``' unit-cotangent rows' gradient ``rows`` =
  (dx, dx_big, cs, l), each row's times l_i: the rows' coefficients are g_i P_ij, so row
  i's gradient is g_i / l_i times its saved one (docs/math.md §3), rounded to x's dtype
  once here (the saved one is float16 by row scales, ``backends.base.scale_rows``); the
  columns' gradient (Qwen3's documents) is the columns' pass from the row statistics, as
  without it."""
  dx, dx_big, cs, l = rows
  f32 = jnp.float32
  f = jnp.where(l > 0, g_row.astype(f32) / jnp.where(l > 0, l, 1.0), 0.0)
  dx_out = (f[:, None] * unscale_rows(dx, dx_big)).astype(block.x.dtype)
  dscale = jnp.sum(f * cs).astype(jnp.result_type(scale)) if need.scale else None
  dy = None
  if need.y:
    row = Side(spec.reduction.residual(lse_row), g_row, row_thr)
    dy = ring.backward(spec, need._replace(x=False, scale=False), block, scale, row, None)[1]
  return dx_out, dy, dscale, None, None, None, None, None, None


def _scaled(need, block: Block, scale, unit, g_row):
  """The op's cotangents from ``fwd_grad``'s unit-cotangent gradients ``unit`` =
  (dx, cs, dy, csum): each is linear in the rows' cotangents, which are one value g
  over the kept rows (a removed row's coefficients are zeros), so it is g times the
  unit one. A cotangent that differs between kept rows gives NaN gradients, not wrong
  ones."""
  dx, cs, dy, csum = unit
  g = g_row.astype(dx.dtype)
  kept = jnp.ones(g.shape, bool) if block.x_mask is None else block.x_mask
  g0 = jnp.max(jnp.where(kept, g, -jnp.inf))
  g0 = jnp.where(jnp.all(jnp.where(kept, g == g0, True)), g0, jnp.nan)
  g0 = jnp.where(jnp.any(kept), g0, 0.0)
  dscale = (g0 * jnp.sum(cs)).astype(jnp.result_type(scale)) if need.scale else None
  dbias = (g0 * jnp.sum(csum)).astype(block.bias.dtype) if need.bias else None
  return ((g0 * dx).astype(block.x.dtype), (g0 * dy).astype(block.y.dtype), dscale, None,
          None, None, None, None, dbias)
