"""Pure-JAX backend: the same statistics and gradients as the Triton kernels, as a
``lax.scan`` over column tiles with an online log-sum-exp. O(n * tile) memory.

It runs on CPU, TPU and GPU, is the fallback where Triton is unavailable, and is an
independent check on the kernels. Readable rather than fast.

Conventions shared with the kernels (see ``_core``; the operands come as a
``backends.base.Block``): the block is ``z_ij = scale * s_ij`` with
``s_ij = <x_i, y_j>`` (or, with prefix ``dims``, ``s^k_ij = a_ik b_jk <x_i[:m_k], y_j[:m_k]>``),
entry (i, j) is kept iff ``s_ij <= row_thr_i`` (when given), with ``exclude_self``
global row index != global column index, and with the ``where`` masks row i and
column j are both kept.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from memeff_jax._compat import vary_like
from memeff_jax._terms import glue_dtype
from memeff_jax.backends.base import Block
from memeff_jax.config import KernelConfig

_HI = lax.Precision.HIGHEST


def _dot(u, v):
  # [n, d] @ [d, t] -> [n, t], fp32 accumulation (fp64 for fp64)
  return jnp.dot(u, v.T, preferred_element_type=glue_dtype(u.dtype), precision=_HI)


def _sims(x, y_t, x_tab, y_tab_t, dims):
  """[K, n, t] similarities of the rows against one column tile (K = 1 without dims)."""
  if dims is None:
    return _dot(x, y_t)[None]
  return jnp.stack([_dot(x[:, :m], y_t[:, :m]) * x_tab[k][:, None] * y_tab_t[k][None, :]
                    for k, m in enumerate(dims)])


def _keep(s, rows, cols, row_ok, col_ok, row_thr, col_thr, exclude_self):
  """[K, n, t] entries that enter the softmaxes; thresholds are [K, n] / [K, t], row_ok
  [n] (or None) and col_ok [t] the rows and columns that are there."""
  keep = jnp.broadcast_to(col_ok[None, None, :], s.shape)
  if row_ok is not None:
    keep = keep & row_ok[None, :, None]
  if exclude_self:
    keep = keep & (rows[:, None] != cols[None, :])[None]
  if row_thr is not None:
    keep = keep & (s <= row_thr[:, :, None])
  if col_thr is not None:
    keep = keep & (s <= col_thr[:, None, :])
  return keep


def _tiles(tile, m, *cols):
  """Pad each [.., m, ..] column-indexed array (axis -2 for features, -1 for stats)
  to a multiple of ``tile`` and split it into [num_tiles, ...] scan inputs."""
  num = -(-m // tile)
  out = []
  for a, axis in cols:
    if a is None:
      out.append(None)
      continue
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, num * tile - m)
    a = jnp.pad(a, pad)
    a = jnp.moveaxis(a.reshape(a.shape[:axis % a.ndim] + (num, tile) + a.shape[axis % a.ndim + 1:]),
                     axis % a.ndim, 0)
    out.append(a)
  starts = jnp.arange(num, dtype=jnp.int32) * tile
  return starts, out


def _k(v, dims):
  """Stats get a leading K axis internally (K = 1 without dims)."""
  return None if v is None else (v[None] if dims is None else v)


@dataclasses.dataclass(frozen=True)
class BlockwiseBackend:
  """``fwd_stats`` / ``bwd`` over column tiles; see ``_core`` for the contract.

  tile: the column tile; None: the config's ``blockwise.tile`` (512 by default)."""

  tile: int | None = None
  name: str = "blockwise"

  def default_config(self, d: int, dtype) -> KernelConfig:   # pylint: disable=unused-argument
    """The config with ``config=None`` (its ``blockwise_tile``; Matryoshka in one block)."""
    return KernelConfig()

  def fwd_floor(self, x, scale, spec):   # pylint: disable=unused-argument
    """None: the blockwise forward is exact only (``ring.forward``)."""
    return None

  def fwd_stats(self, block: Block, scale, *, row_thr, spec, bounded=False):
    assert not bounded, "the blockwise forward is exact only"
    red = spec.reduction
    x, y, x_tab, y_tab, x_ok, y_ok, offsets, bias = block
    dims, (n, m) = spec.dims, (x.shape[0], y.shape[0])
    tile = min(self._tile(spec), m)
    row_thr = _k(row_thr, dims)
    rows = offsets[0] + jnp.arange(n, dtype=jnp.int32)
    starts, (y_s, yt_s, ok_s) = _tiles(tile, m, (y, -2), (y_tab, -1), (y_ok, -1))

    def body(carry, inp):
      lse_row, max_row = carry
      j0, y_t, yt_t, ok_t = inp
      cols = j0 + jnp.arange(tile, dtype=jnp.int32)
      s = _sims(x, y_t, x_tab, yt_t, dims)
      keep = _keep(s, rows, offsets[1] + cols, x_ok, _col_ok(cols, m, ok_t), row_thr, None,
                   spec.exclude_self)
      z = jnp.where(keep, scale * s, -jnp.inf)
      zb = z if bias is None else z + bias   # (the reduction's logits; maxima unbiased)
      # An all-masked tile or row: the reduction's empty value with a zero tangent.
      lse_row = red.merge(lse_row, red.tile(zb, keep, axis=-1))
      max_row = jnp.maximum(max_row, jnp.max(z, axis=-1))
      col = (red.tile(zb, keep, axis=-2), jnp.max(z, axis=-2)) if spec.two_sided else None
      return (lse_row, max_row), col

    k = 1 if dims is None else len(dims)
    empty = jnp.full((k, n), -jnp.inf, glue_dtype(x.dtype))
    init = vary_like((jnp.full((k, n), red.empty, empty.dtype), empty), x, y, scale, offsets[0],
                     offsets[1])
    (lse_row, max_row), col = lax.scan(body, init, (starts, y_s, yt_s, ok_s))
    lse_col = max_col = None
    if spec.two_sided:   # [tiles, K, tile] -> [K, m]
      lse_col, max_col = (_unk(jnp.moveaxis(c, 0, 1).reshape(k, -1)[:, :m], dims) for c in col)
    return _unk(lse_row, dims), lse_col, _unk(max_row, dims), max_col

  def pairs(self, x, y, spec) -> bool:   # one gradient pass per tower: no bwd_pair
    return False

  def bwd_pair(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    raise NotImplementedError("the blockwise backend has no paired gradient (pairs is False)")

  def fuses(self, x, y, spec) -> bool:   # the gradient from the saved statistics only
    return False

  def fwd_grad(self, block: Block, scale, *, spec, want_cs):
    raise NotImplementedError("the blockwise backend has no fused gradient (fuses is False)")

  def fuses_rows(self, x, y, spec, *, y_trains) -> bool:   # pylint: disable=unused-argument
    return False

  def fwd_rows(self, block: Block, scale, *, row_thr, spec, want_cs):
    raise NotImplementedError("the blockwise backend forms no gradient in its forward "
                              "(fuses_rows is False)")

  def _tile(self, spec) -> int:
    return self.tile if self.tile is not None else _config(spec).blockwise.tile

  def bwd(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    x, y, x_tab, y_tab, x_ok, y_ok, offsets, bias = block
    red = spec.reduction
    dims, (n, m), d = spec.dims, (x.shape[0], y.shape[0]), x.shape[1]
    tile = min(self._tile(spec), m)
    rows = offsets[0] + jnp.arange(n, dtype=jnp.int32)
    r_lse, r_g, r_thr = (_k(v, dims) for v in row) if row is not None else (None,) * 3
    c_lse, c_g, c_thr = (_k(v, dims) for v in col) if col is not None else (None,) * 3
    starts, (y_s, yt_s, cl_s, cg_s, ct_s, ok_s) = _tiles(
        tile, m, (y, -2), (y_tab, -1), (c_lse, -1), (c_g, -1), (c_thr, -1), (y_ok, -1))

    def body(carry, inp):
      dx, cs, csum = carry
      j0, y_t, yt_t, cl_t, cg_t, ct_t, ok_t = inp
      cols = j0 + jnp.arange(tile, dtype=jnp.int32)
      col_ok = _col_ok(cols, m, ok_t)
      s = _sims(x, y_t, x_tab, yt_t, dims)
      z = scale * s if bias is None else scale * s + bias
      coef = jnp.zeros_like(s)
      if row is not None:   # row role: g_i dr_i/dz_ij (the softmax's g_i P_ij)
        keep = _keep(s, rows, offsets[1] + cols, x_ok, col_ok, r_thr, None, spec.exclude_self)
        coef += jnp.where(keep, red.coefficient(jnp.where(keep, z, 0.0), r_lse[:, :, None],
                                                r_g[:, :, None]), 0.0)
      if col is not None:   # column role: g_j dr_j/dz_ij (the softmax's g_j P_ji)
        keep = _keep(s, rows, offsets[1] + cols, x_ok, col_ok, None, ct_t, spec.exclude_self)
        coef += jnp.where(keep, red.coefficient(jnp.where(keep, z, 0.0), cl_t[:, None, :],
                                                cg_t[:, None, :]), 0.0)
      cs = cs + jnp.sum(coef * s, axis=-1)
      csum = csum + jnp.sum(coef, axis=-1)
      if dims is None:
        dx = dx + scale * jnp.dot(coef[0], y_t, preferred_element_type=dx.dtype,
                                  precision=_HI)
      else:
        for kk, mk in enumerate(dims):
          c = coef[kk] * x_tab[kk][:, None] * yt_t[kk][None, :]
          part = jnp.dot(c, y_t[:, :mk], preferred_element_type=dx.dtype, precision=_HI)
          dx = dx.at[:, :mk].add(scale * part)
      return (dx, cs, csum), None

    k = 1 if dims is None else len(dims)
    acc = glue_dtype(x.dtype)   # fp32 accumulators, fp64 for fp64
    init = vary_like((jnp.zeros((n, d), acc), jnp.zeros((k, n), acc), jnp.zeros((k, n), acc)),
                     x, y, scale, offsets[0], offsets[1])
    (dx, cs, csum), _ = lax.scan(body, init, (starts, y_s, yt_s, cl_s, cg_s, ct_s, ok_s))
    out = dx.astype(out_dtype), (_unk(cs, dims) if want_cs else None)
    if bias is None:
      return out
    return out + (_unk(csum, dims),)


def _col_ok(cols, m, ok_t):
  """The tile's columns that are there: in range and (with ``where``) kept."""
  return (cols < m) if ok_t is None else (cols < m) & ok_t


def _unk(v, dims):
  return v[0] if dims is None else v


def _config(spec) -> KernelConfig:
  return spec.config if spec.config is not None else KernelConfig()
