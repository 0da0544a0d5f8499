"""The reduction seam (docs/math.md §12). A pairwise-sigmoid statistic, defined here,
runs through the block op's custom_vjp, the ring and the chain's shared glue as they
stand, on 1, 2 and 4 host devices, and matches big_vision's dense SigLIP formula in
float64, in value and in the gradients of x, y and the temperature.

The backends compute the softmax only, so the tiles come from a small blockwise-style
backend written against ``spec.reduction`` (the shape a backend takes once it reads
the reduction). Run with the forced host devices of tests/conftest.py.
"""

import dataclasses
import functools
import inspect
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import memeff_jax as mj
from memeff_jax import _chain, _core, backends
from memeff_jax._reduction import SOFTMAX, Softmax
from memeff_jax.backends.blockwise import BlockwiseBackend

B, D = 12, 8
BIAS = -2.0            # static here: a traced (learnable) bias is not part of the seam
TEMPERATURE = 0.3


@dataclasses.dataclass(frozen=True)
class Sigmoid:
  """SigLIP's negatives: r_i = sum_j keep_ij log sigmoid(-(z_ij + bias)) (label -1; the
  positive, label +1, joins in the glue as the softmax families' does)."""

  bias: float
  name: ClassVar[str] = "sigmoid"
  empty: ClassVar[float] = 0.0
  biased: ClassVar[bool] = False   # (its bias is static, part of the reduction)
  local: ClassVar[bool] = True     # (no backend here fuses: the generic gradient runs)

  def tile(self, z, keep, axis=-1):
    return jnp.sum(jnp.where(keep, jax.nn.log_sigmoid(-(z + self.bias)), 0.0), axis=axis)

  def merge(self, a, b):
    return a + b

  def residual(self, stat):
    return stat

  def coefficient(self, z, stat, g):   # d/dz log sigmoid(-(z + b)) = -sigmoid(z + b)
    del stat
    return -g * jax.nn.sigmoid(z + self.bias)

  def term(self, stat, pos_logit, *, n_neg, tau, scale, bias=None):
    del n_neg, tau, scale, bias
    return -(jax.nn.log_sigmoid(pos_logit + self.bias) + stat), stat


SIGMOID = Sigmoid(BIAS)


@dataclasses.dataclass(frozen=True)
class Tiles:
  """``fwd_stats`` / ``bwd`` (blockwise.BlockwiseBackend's contract) over column tiles,
  every statistic and coefficient from ``spec.reduction``; no prefix dims, no
  thresholds."""

  tile: int = 2
  name: str = "tiles"

  def fwd_floor(self, x, scale, spec):
    return None

  def pairs(self, x, y, spec):
    return False

  def fuses(self, x, y, spec):
    return False

  def fuses_rows(self, x, y, spec, *, y_trains):
    return False

  def fwd_stats(self, block, scale, *, row_thr, spec, bounded=False):
    assert row_thr is None and block.x_tab is None and not bounded
    red, x, n = spec.reduction, block.x, block.x.shape[0]
    stat = jnp.full((n,), red.empty, x.dtype)
    mx = jnp.full((n,), -jnp.inf, x.dtype)
    cols = []
    for j0, z, keep, _ in self._tiles(block, scale, spec):
      stat = red.merge(stat, red.tile(z, keep, axis=-1))
      mx = jnp.maximum(mx, jnp.max(jnp.where(keep, z, -jnp.inf), axis=-1))
      cols.append((red.tile(z, keep, axis=0), jnp.max(jnp.where(keep, z, -jnp.inf), axis=0)))
    if not spec.two_sided:
      return stat, None, mx, None
    stat_col, max_col = (jnp.concatenate(c) for c in zip(*cols))
    return stat, stat_col, mx, max_col

  def bwd(self, block, scale, *, row, col, spec, want_cs, out_dtype):
    red, x, y = spec.reduction, block.x, block.y
    dx, cs = jnp.zeros(x.shape, x.dtype), jnp.zeros(x.shape[:1], x.dtype)
    for j0, z, keep, s in self._tiles(block, scale, spec):
      j1 = j0 + z.shape[1]
      coef = jnp.zeros_like(z)
      if row is not None:
        coef += jnp.where(keep, red.coefficient(z, row.lse[:, None], row.g[:, None]), 0.0)
      if col is not None:
        coef += jnp.where(keep, red.coefficient(z, col.lse[None, j0:j1], col.g[None, j0:j1]),
                          0.0)
      cs = cs + jnp.sum(coef * s, axis=-1)
      dx = dx + scale * coef @ y[j0:j1]
    return dx.astype(out_dtype), (cs if want_cs else None)

  def _tiles(self, block, scale, spec):
    """(first column, z, keep, s) of each column tile; the last may be narrower."""
    x, y, masks, offsets = block.x, block.y, block.masks, block.offsets
    rows = offsets[0] + jnp.arange(x.shape[0])
    for j0 in range(0, y.shape[0], self.tile):
      y_t = y[j0:j0 + self.tile]
      s = x @ y_t.T                                      # [n, d] @ [d, t] -> [n, t]
      keep = jnp.ones(s.shape, bool)
      if spec.exclude_self:
        keep &= rows[:, None] != offsets[1] + j0 + jnp.arange(y_t.shape[0])[None, :]
      if masks is not None:
        keep &= masks[0][:, None] & masks[1][None, j0:j0 + self.tile]
      yield j0, scale * s, keep, s


def _data(dtype=jnp.float64):
  r = np.random.default_rng(0)
  x = r.standard_normal((B, D))
  y = x + 0.8 * r.standard_normal((B, D))
  return jnp.asarray(x, dtype), jnp.asarray(y, dtype)


def _unit(v):
  return v / jnp.linalg.norm(v, axis=-1, keepdims=True)


def _dense_siglip(x, y, temperature, keep=None):
  """big_vision's sigmoid loss, -(1/B) sum_ij log sigmoid(label_ij (s_ij / t + b)), over
  the kept rows."""
  if keep is not None:
    x, y = x[keep], y[keep]
  z = _unit(x) @ _unit(y).T / temperature + BIAS         # [b, d] @ [d, b] -> [b, b]
  labels = 2.0 * jnp.eye(x.shape[0]) - 1.0               # +1 on the diagonal, -1 off it
  return -jnp.sum(jax.nn.log_sigmoid(labels * z)) / x.shape[0]


def _block_siglip(x, y, temperature, where=None, *, two_sided, axis_name=None):
  """SigLIP through the block op: the negatives' statistic over the ring, the positives
  in the glue. Two-sided, each pair's term is half in its row's and half in its
  column's statistic."""
  x, y = _unit(x), _unit(y)
  scale = 1.0 / temperature
  spec = _core.BlockSpec(backend=Tiles(), two_sided=two_sided, exclude_self=True,
                         axis_name=axis_name, reduction=SIGMOID)
  r_row, r_col, _, _ = _core.block_stats(x, y, scale, None, None, None, where,
                                         None if where is None else where, spec=spec)
  neg = r_row if not two_sided else 0.5 * (r_row + r_col)
  ell, _ = SIGMOID.term(neg, scale * jnp.sum(x * y, axis=-1), n_neg=None, tau=None,
                        scale=scale)
  batch = x.shape[0] if where is None else jnp.sum(where)
  if where is not None:
    ell = jnp.where(where, ell, 0.0)
  total = jnp.sum(ell)
  if axis_name is not None:
    total, batch = jax.lax.psum(total, axis_name), jax.lax.psum(batch, axis_name)
  return total / batch


def _on_devices(fn, n_dev, n_arrays):
  """fn(*arrays, temperature, axis_name=) over global arrays: one device without an
  axis, else split over an n_dev ring (the temperature replicated)."""
  if n_dev == 1:
    return fn
  mesh = Mesh(np.array(jax.devices()[:n_dev]), ("batch",))
  # check_vma=True: the ring's psum of a replicated temperature's gradient needs it.
  return jax.shard_map(functools.partial(fn, axis_name="batch"), mesh=mesh, in_specs=(P("batch"),) * n_arrays + (P(),),
                       out_specs=P(), check_vma=True)


def _value_and_grads(fn, arrays, temperature):
  f = lambda a, t: fn(*a, t)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(arrays, temperature)


def _assert_matches(got, want):
  (v, (gxy, gt)), (v_ref, (gxy_ref, gt_ref)) = got, want
  np.testing.assert_allclose(v, v_ref, rtol=1e-12)
  for g, g_ref in zip(list(gxy) + [gt], list(gxy_ref) + [gt_ref]):
    np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("red", [SOFTMAX, SIGMOID], ids=["softmax", "sigmoid"])
def test_reduction_contract(red):
  """merge over any split of the columns == the statistic of the whole row; the
  coefficient == g * d(statistic)/dz; an empty row is ``empty``."""
  with jax.enable_x64(True):
    r = np.random.default_rng(1)
    z = jnp.asarray(r.standard_normal((3, 7)))
    keep = jnp.asarray(r.uniform(size=(3, 7)) < 0.7).at[2].set(False)   # row 2: empty
    whole = red.tile(z, keep)
    parts = functools.reduce(red.merge, [red.tile(z[:, a:b], keep[:, a:b])
                                         for a, b in ((0, 2), (2, 3), (3, 7))])
    np.testing.assert_allclose(parts, whole, rtol=1e-14)
    assert whole[2] == red.empty
    g = jnp.asarray([0.5, -2.0, 1.0])
    want = jax.grad(lambda z: jnp.sum(g * red.tile(z, keep)))(z)
    got = jnp.where(keep, red.coefficient(z, red.residual(whole)[:, None], g[:, None]), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_softmax_is_the_default():
  be = BlockwiseBackend()
  assert _core.BlockSpec(backend=be).reduction is SOFTMAX
  assert _core.BlockSpec(backend=be) == _core.BlockSpec(backend=be, reduction=Softmax())
  assert hash(_core.BlockSpec(backend=be)) == hash(_core.BlockSpec(backend=be,
                                                                   reduction=Softmax()))
  assert hash(_core.BlockSpec(backend=be, reduction=SIGMOID)) == hash(
      _core.BlockSpec(backend=be, reduction=Sigmoid(BIAS)))


@pytest.mark.parametrize("two_sided", [False, True])
def test_generic_tiles_are_the_softmax(two_sided):
  """The test backend with the softmax reduction gives blockwise's statistics and
  gradients (so the sigmoid below runs through the same generic code)."""
  with jax.enable_x64(True):
    x, y = (_unit(v) for v in _data())
    out = {}
    for be in (Tiles(), BlockwiseBackend()):
      spec = _core.BlockSpec(backend=be, two_sided=two_sided, exclude_self=True)
      f = lambda x, y, s: sum(jnp.sum(jnp.sin(v)) for v in
                              _core.block_stats(x, y, s, spec=spec)[:2] if v is not None)
      out[be.name] = jax.value_and_grad(f, argnums=(0, 1, 2))(x, y, jnp.float64(3.0))
    _assert_matches((out["tiles"][0], (out["tiles"][1][:2], out["tiles"][1][2])),
                    (out["blockwise"][0], (out["blockwise"][1][:2], out["blockwise"][1][2])))


@pytest.mark.parametrize("n_dev", [1, 2, 4])
@pytest.mark.parametrize("variant", ["rows", "two_sided", "where"])
def test_sigmoid_through_the_ring(n_dev, variant):
  """The block op and the ring, untouched, run a non-softmax reduction: rows only,
  two-sided (column statistics and column gradients riding the ring), and with
  removed rows (the columns' mask travelling)."""
  with jax.enable_x64(True):
    x, y = _data()
    t = jnp.float64(TEMPERATURE)
    keep = jnp.arange(B) % 5 != 3 if variant == "where" else None
    fn = functools.partial(_block_siglip, two_sided=variant == "two_sided")
    if keep is None:
      got = _value_and_grads(_on_devices(fn, n_dev, 2), (x, y), t)
    else:
      masked = lambda x, y, w, t, **kw: fn(x, y, t, w, **kw)
      run = _on_devices(masked, n_dev, 3)
      got = _value_and_grads(lambda x, y, t: run(x, y, keep, t), (x, y), t)
    want = _value_and_grads(functools.partial(_dense_siglip, keep=keep), (x, y), t)
    if keep is not None:   # removed rows: exactly zero gradients
      gx, gy = got[1][0]
      assert not jnp.any(gx[~keep]) and not jnp.any(gy[~keep])
    _assert_matches(got, want)


def _siglip_head(ctx, towers):
  """A family head naming its reduction: the block's statistic and the Head's terms."""
  x, y = towers
  r, _, mx, _ = ctx.block(x, y, exclude_self=True, reduction=SIGMOID)
  cross = lambda: jnp.sum(ctx.tower_sum(x) * ctx.tower_sum(y), axis=-1)
  return _chain.Head([r], [mx], ctx.sims(x, y), ctx.batch - 1, cross, reduction=SIGMOID)


SIGLIP = _chain.Family(name="siglip_test", arrays=("x", "y"), locked=(), head=_siglip_head,
                       reference=None)


@pytest.mark.parametrize("n_dev", [1, 4])
def test_sigmoid_family_through_the_chain(n_dev, monkeypatch):
  """The chain's shared glue (validation, normalization, ``where``, the global batch,
  the ring) runs a head that names its reduction, with the shared options at their
  defaults (``stable=False``: big_vision's gradients)."""
  monkeypatch.setattr(backends, "resolve", lambda *a, **k: Tiles())
  sig = inspect.signature(mj.clip_loss_with_stats).parameters
  opts = {k: sig[k].default for k in _chain.SHARED if k not in ("temperature", "where",
                                                                 "axis_name")}
  opts["stable"] = False

  def loss(x, y, where, temperature, axis_name=None):
    return _chain.run(SIGLIP, x=x, y=y, temperature=temperature, where=where,
                      axis_name=axis_name, **opts)[0]

  with jax.enable_x64(True):
    x, y = _data()
    t = jnp.float64(TEMPERATURE)
    keep = jnp.arange(B) % 5 != 3
    run = _on_devices(loss, n_dev, 3)
    got = _value_and_grads(lambda x, y, t: run(x, y, keep, t), (x, y), t)
    want = _value_and_grads(functools.partial(_dense_siglip, keep=keep), (x, y), t)
    _assert_matches(got, want)
