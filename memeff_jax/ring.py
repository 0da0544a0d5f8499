"""The ring: per-shard drivers of the block statistics and their gradients (the
shard_map wrapper for callers holding global arrays is ``sharding.sharded``).

Inside ``shard_map`` each device holds a contiguous shard of both towers. The
column tower travels around the ring with ``lax.ppermute`` (i -> i + 1): at hop h
device r computes on the block that started on device (r - h) mod W, sending it on
before computing, so XLA can overlap the transfer with the kernels. Column
statistics (forward) and column gradients (backward) ride with their block and
arrive home after one lap, so per-device memory stays O(local batch * d): nothing
is ever assembled. The custom_vjp in ``_core`` wraps the whole ring, and the
backward ring is explicit here. Without an axis the ring has one device and one hop.

The hops' statistics merge through the block's reduction (``spec.reduction``,
docs/math.md §12: the softmax's log_add_exp), the maxima with ``max``; the backward
ring only carries the ``Side`` statistics to the backend.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

from memeff_jax._compat import to_varying, vary_like
from memeff_jax._terms import glue_dtype
from memeff_jax.backends.base import Block, Side, rows_dtype


class Need(NamedTuple):
  """Which primal inputs of the block op need a gradient."""

  x: bool
  y: bool
  scale: bool
  x_tab: bool
  y_tab: bool
  bias: bool = False


def _ring(axis_name):
  if axis_name is None:
    return 1, 0, None
  size = lax.axis_size(axis_name)
  # Rotation i -> i + 1, defined once.
  shift = functools.partial(lax.ppermute, axis_name=axis_name,
                            perm=[(i, (i + 1) % size) for i in range(size)])
  return size, lax.axis_index(axis_name), shift


def _lap(size, step, carry):
  """Hops 0 .. size-2 send the visiting block on; the last hop keeps it."""
  carry = lax.fori_loop(0, size - 1, lambda h, c: step(h, c, True), carry)
  return step(size - 1, carry, False)


def _carry(v, axis, *refs):
  """A loop carry's initial values (a pytree) varying over the ring's axis and over
  every axis ``refs`` vary over (a data-parallel axis beside the ring's, whose shards
  hold other batches), as the values the loop body makes."""
  return vary_like(to_varying(v, axis), *refs)


def _local(spec, block: Block) -> Block:
  """This device's block (a symmetric one: its columns are its rows)."""
  if spec.symmetric:
    return block._replace(y=block.x, y_tab=block.x_tab, y_mask=block.x_mask)
  return block


def _columns(block: Block) -> tuple:
  """What travels round the ring: the columns, their tables and their masks."""
  return block.y, block.y_tab, block.y_mask


def _visit(block: Block, columns: tuple, offsets: tuple) -> Block:
  """This device's rows against the visiting ``columns``, at global ``offsets``."""
  y, y_tab, y_mask = columns
  return block._replace(y=y, y_tab=y_tab, y_mask=y_mask, offsets=offsets)


def forward(spec, block: Block, scale, row_thr):
  """``(lse_row, lse_col, max_row, max_col)`` of this device's rows / columns over the
  whole ring: the statistics of ``spec.reduction`` and the maxima (the column ones None
  unless two-sided, the maxima None unless ``spec.want_max``). ``block``: this device's
  shard of both towers (its ``offsets`` are set per hop); the columns, their tables
  and their ``where`` masks travel round the ring.

  Where the backend has a bounded forward (``fwd_floor``), the lap runs it, and reruns
  exactly if any kept row's or column's lse (over the whole ring) is below the floor
  or not finite; every device takes the same branch. (A bounded forward is the
  softmax kernels' fixed shift: its floor is on the log-sum-exp.)"""
  floor = spec.backend.fwd_floor(block.x, scale, spec)
  lap = functools.partial(_forward, spec, block, scale, row_thr)
  if floor is None:
    return lap(bounded=False)
  out = lap(bounded=True)
  ok = jnp.ones((), bool)
  for lse, keep in ((out[0], block.x_mask), (out[1], block.y_mask)):   # (symmetric: no out[1])
    if lse is not None:
      good = (lse >= floor) & (lse < jnp.inf)
      ok = ok & jnp.all(good if keep is None else good | ~keep)
  if spec.axis_name is not None:
    ok = lax.pmin(ok.astype(jnp.int32), spec.axis_name) > 0
  return lax.cond(ok, lambda: out, lambda: lap(bounded=False))


def forward_rows(spec, block: Block, scale, row_thr, want_cs):
  """One device, a block the backend ``fuses_rows``: ``(lse_row, max_row, dx, dx_big, cs,
  l)`` from ``Backend.fwd_rows`` (the row statistics and the rows' gradient for a unit
  cotangent on every row, times l). Where it is bounded, it is checked as ``forward``
  checks a lap; if any kept row's lse is below the floor or not finite, or a gradient
  entry is not finite, the exact forward and the rows' gradient pass run instead (l = 1)
  with cotangents 1 / (scale max |y|), so that it writes the saved dtype at once (no
  entry of the unit gradient passes scale max |y|; no [n, d] buffer but the saved one),
  and that scale for each of the backend's ``chunks``."""
  be = spec.backend

  def exact(chunks=1):
    lse, _, max_row, _ = _drop_max(spec, be.fwd_stats(block, scale, row_thr=row_thr,
                                                      spec=spec, bounded=False))
    ones = jnp.ones(lse.shape, jnp.float32)
    big = jnp.asarray(scale, jnp.float32) * jnp.max(jnp.abs(block.y)).astype(jnp.float32)
    big = jnp.where((big > 0) & (big < jnp.inf), big, 1.0)
    unit = Side(spec.reduction.residual(lse), ones / big, row_thr)
    dx, cs = be.bwd(block, scale, row=unit, col=None, spec=spec, want_cs=want_cs,
                    out_dtype=rows_dtype(block.x.dtype))[:2]
    return (lse, max_row, dx, jnp.full((lse.shape[0], chunks), big),
            None if cs is None else cs * big, ones)

  floor = be.fwd_floor(block.x, scale, spec)
  if floor is None:
    return exact()
  out = be.fwd_rows(block, scale, row_thr=row_thr, spec=spec, want_cs=want_cs)
  good = (out[0] >= floor) & (out[0] < jnp.inf)
  ok = jnp.all(good if block.x_mask is None else good | ~block.x_mask)
  ok = ok & jnp.all(jnp.isfinite(out[2])) & jnp.all(jnp.isfinite(out[3]))
  # The rerun as a loop of at most one trip: a loop's state stays in place, where a
  # lax.cond's result is a buffer of its own (the [n, d] gradient, copied). Its carry
  # varies over every axis the block varies over (inside shard_map, the rerun's fresh
  # values, its flag and l = 1, would not).
  carry = lambda c: vary_like(c, block.x, block.y, scale, out)
  return lax.while_loop(lambda c: c[0],
                        lambda c: carry((jnp.zeros((), bool), *exact(out[3].shape[1]))),
                        carry((~ok, *out)))[1:]


def _forward(spec, block: Block, scale, row_thr, *, bounded):
  """``forward``'s lap, with the backend's bounded or exact statistics."""
  be, axis, red = spec.backend, spec.axis_name, spec.reduction
  block = _local(spec, block)
  x = block.x
  size, me, shift = _ring(axis)
  n, m = x.shape[0], block.y.shape[0]

  def hop(h, visiting):
    src = (me - h) % size
    return be.fwd_stats(_visit(block, visiting, (me * n, src * m)), scale, row_thr=row_thr,
                        spec=spec, bounded=bounded)

  if size == 1:
    return _drop_max(spec, hop(0, _columns(block)))

  def step(h, carry, send):
    y_vis, yt_vis, ym_vis, lse_row, lse_col, max_row, max_col = carry
    travel = (y_vis, yt_vis, ym_vis)
    y_next, yt_next, ym_next = shift(travel) if send else travel
    r, c, r_max, c_max = _drop_max(spec, hop(h, travel))
    lse_row = red.merge(lse_row, r)
    if spec.want_max:
      max_row = jnp.maximum(max_row, r_max)
    if spec.two_sided:   # the column partials ride with their block and arrive home
      lse_col, max_col = shift((red.merge(lse_col, c),
                                jnp.maximum(max_col, c_max) if spec.want_max else None))
    return y_next, yt_next, ym_next, lse_row, lse_col, max_row, max_col

  k = () if spec.dims is None else (len(spec.dims),)
  full = lambda size_, v: _carry(jnp.full(k + (size_,), v, glue_dtype(x.dtype)), axis, block)
  cols = full(m, red.empty) if spec.two_sided else None   # the merge's identity
  maxima = (full(n, -jnp.inf), full(m, -jnp.inf) if spec.two_sided else None)
  maxima = maxima if spec.want_max else (None, None)
  # (what travels varies over the ring once sent, device-invariant columns too)
  init = _carry(_columns(block), axis, block) + (full(n, red.empty), cols) + maxima
  return _lap(size, step, init)[3:]


def _drop_max(spec, stats):
  """A backend's statistics with the maxima None unless ``spec.want_max``."""
  return stats if spec.want_max else (*stats[:2], None, None)


def backward(spec, need: Need, block: Block, scale, row, col):
  """``(dx, dy, dscale, dx_tab, dy_tab, dbias)``; None where ``need`` says no.

  block: this device's shard of both towers, as ``forward`` took it. row: this
  device's row-role ``Side``; col: its column-role ``Side`` (two-sided blocks). A
  symmetric block sends its rows' Side round with the block instead: each device then
  computes only its own rows' gradient, both roles folded.
  """
  be, axis, sym = spec.backend, spec.axis_name, spec.symmetric
  block = _local(spec, block)
  if sym:
    col = row
  x, y, x_tab, y_tab = block.x, block.y, block.x_tab, block.y_tab
  size, me, shift = _ring(axis)
  n, m = x.shape[0], y.shape[0]
  want_y = (not sym) and (need.y or need.y_tab)
  want_x = need.x or need.x_tab or ((need.scale or need.bias) and not want_y)
  # In the input dtype on one device; summed in the glue dtype over a ring, or when the
  # caller takes it so (``spec.cast``).
  wide = size > 1 or spec.cast is not None
  acc = glue_dtype(x.dtype) if wide else x.dtype
  # sum_j c_ij s_ij feeds the temperature's and the tables' gradients: from the x
  # pass when it runs, else from the y pass.
  cs_x = want_x and (need.scale or need.x_tab)
  cs_y = want_y and ((need.scale and not want_x) or need.y_tab)
  # sum_j c_ij feeds the bias's, alike.
  c1_x, c1_y = want_x and need.bias, want_y and need.bias and not want_x

  dy_dtype = glue_dtype(y.dtype) if wide else y.dtype
  # Both towers from one set of coefficients, where the backend can (tiled slabs).
  paired = want_x and want_y and be.pairs(x, y, spec)

  def grads(visiting, col_vis, src):   # (dx, sx, dy, sy, ux, uy) of one block
    hop = _visit(block, visiting, (me * n, src * m))
    if paired:   # (the rows' sums of c come from the x side: c1_y is False)
      out = tuple(be.bwd_pair(hop, scale, row=row, col=col_vis, spec=spec,
                              want_cs=(cs_x, cs_y), out_dtype=(acc, dy_dtype)))
      return out[:4] + ((out[4] if c1_x else None), None)
    none = (None, None, None)
    gx = none if not want_x else _bwd3(be.bwd(   # rows of x: dx, sum_j c_ij s_ij (and c_ij)
        hop, scale, row=row, col=col_vis, spec=spec, want_cs=cs_x, out_dtype=acc), c1_x)
    gy = none if not want_y else _bwd3(be.bwd(   # rows of y: the transposed block
        hop.transposed(), scale, row=col_vis, col=row, spec=spec, want_cs=cs_y,
        out_dtype=dy_dtype), c1_y)
    return gx[:2] + gy[:2] + (gx[2], gy[2])

  if size == 1:
    dx, sx, dy, sy, ux, uy = grads(_columns(block), col, 0)
  else:
    zeros = lambda shape: _carry(jnp.zeros(shape, glue_dtype(x.dtype)), axis, block, col)
    k = () if spec.dims is None else (len(spec.dims),)

    add = lambda a, b: None if a is None else a + b

    def step(h, carry, send):
      y_vis, yt_vis, ym_vis, col_vis, dx, sx, dy, sy, ux, uy = carry
      src = (me - h) % size
      travel = (y_vis, yt_vis, ym_vis, col_vis)
      nxt = shift(travel) if send else travel
      d, c, d_y, c_y, u, u_y = grads(travel[:3], col_vis, src)
      if want_x:
        dx, sx, ux = dx + d, add(sx, c), add(ux, u)
      if want_y:   # the visiting block's gradient rides with it and arrives home
        dy, sy, uy = shift((dy + d_y, add(sy, c_y), add(uy, u_y)))
      return (*nxt, dx, sx, dy, sy, ux, uy)

    init = (*_carry(_columns(block) + (col,), axis, block, col),
            zeros(x.shape) if want_x else None, zeros(k + (n,)) if cs_x else None,
            zeros(y.shape) if want_y else None, zeros(k + (m,)) if cs_y else None,
            zeros(k + (n,)) if c1_x else None, zeros(k + (m,)) if c1_y else None)
    _, _, _, _, dx, sx, dy, sy, ux, uy = _lap(size, step, init)

  dscale = dx_tab = dy_tab = dbias = None
  if need.scale:
    # sum_ij c_ij s_ij; a symmetric pass counts every pair from both of its rows.
    # (summed over the devices by the op's bwd, where the temperature is replicated)
    dscale = jnp.sum(sx if sx is not None else sy) * (0.5 if sym else 1.0)
  if need.bias:   # sum_ij c_ij, alike
    dbias = jnp.sum(ux if ux is not None else uy) * (0.5 if sym else 1.0)
  if need.x_tab:
    dx_tab = scale * sx / x_tab
  if need.y_tab:
    dy_tab = scale * sy / y_tab
  dx = dx.astype(x.dtype if spec.cast is None else acc) if need.x else None
  dy = dy.astype(y.dtype if spec.cast is None else dy_dtype) if (need.y and not sym) else None
  return dx, dy, dscale, dx_tab, dy_tab, dbias


def _bwd3(out, want_csum):
  """A backend's ``bwd`` result as ``(dx, cs, csum)``: csum (a biased block's sums of
  c) where wanted, else None."""
  out = tuple(out) + (None,) * (3 - len(out))
  return out[:2] + (out[2] if want_csum else None,)
