"""SigLIP (docs/math.md §13) against big_vision's dense sigmoid loss, written out here in
float64: values and the gradients of both towers, the temperature and the bias, on
every backend, with ``where=``, fused Matryoshka (both forms), ``stable`` and the ring
on 1, 2, 4 and 8 host devices; bf16 against the plain 16-bit formula's own error."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from memeff_jax import _core, backends, reference
from memeff_jax._reduction import SIGMOID
from tests.support.check import compare, kernel_path_config
from tests.support.tolerances import FP32
from tests.support.families import BACKENDS

B, D = 11, 24
T, BIAS = 0.2, -2.5   # logits s / t + b within a few units of 0: every pair matters


def _big_vision(x, y, t, b, keep=None, normalize=True):
  """-(1/B) sum_ij log sigmoid(label_ij (s_ij / t + b)), label +1 on the diagonal and -1
  off it, over the kept rows (big_vision's sigmoid_loss, float64); ``normalize=False``
  takes the rows as they are (unit rows, ``normalized_inputs=True``)."""
  if keep is not None:
    x, y = x[keep], y[keep]
  unit = ((lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)) if normalize else
          (lambda v: v))
  z = unit(x) @ unit(y).T / t + b                      # [b, d] @ [d, b] -> [b, b]
  labels = 2.0 * jnp.eye(x.shape[0]) - 1.0
  return -jnp.sum(jax.nn.log_sigmoid(labels * z)) / x.shape[0]


def _data(seed=0, b=B, d=D):
  r = np.random.default_rng(seed)
  x = r.standard_normal((b, d))
  y = x + 0.9 * r.standard_normal((b, d))              # positives lean on their pair
  return jnp.asarray(x), jnp.asarray(y)


def _value_and_grads(f, x, y, t=T, b=BIAS):
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(x, y, jnp.float64(t),
                                                               jnp.float64(b))


def _close(got, want, tol):
  (v, g), (v0, g0) = got, want
  assert abs(float(v) - float(v0)) <= tol * abs(float(v0)), (float(v), float(v0))
  for i, (a, c) in enumerate(zip(g, g0)):
    err = float(jnp.max(jnp.abs(a - c)) / jnp.maximum(jnp.max(jnp.abs(c)), 1e-30))
    assert err <= tol, (f"gradient {i}", err)


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True), warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)   # the interpreter's log2(0)
    yield


@pytest.mark.parametrize("normalized_inputs", [False, True])
@pytest.mark.parametrize("backend", ["reference", "blockwise"])
def test_float64_equals_big_vision(backend, normalized_inputs):
  # float64 end to end: exact to rounding (1e-12), value and all four gradients.
  x, y = _data()
  if normalized_inputs:
    x, y = mj.reference.normalize(x), mj.reference.normalize(y)
  f = lambda x, y, t, b: mj.siglip_loss(x, y, temperature=t, bias=b, stable=False,
                                        normalized_inputs=normalized_inputs, backend=backend)
  ref = lambda x, y, t, b: _big_vision(x, y, t, b, normalize=not normalized_inputs)
  _close(_value_and_grads(f, x, y), _value_and_grads(ref, x, y), 1e-12)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_low_precision_against_the_float64_reference(backend, dtype):
  # fp32: fixed bounds; bf16: 2x the plain bf16 formula's error (tests.support.check).
  with jax.enable_x64(False):
    x, y = (v.astype(dtype) for v in _data(1, 37, 40))
    compare(lambda *a, **k: mj.siglip_loss(*a, backend=backend, **k),
            reference.siglip_loss, [x, y], temperature=T, dtype=dtype, bias=BIAS)


@pytest.mark.parametrize("path,option", [("tiled", None), ("partials", "dims"),
                                         ("paired", "where"), ("paired", None),
                                         ("tiled", "dims+where"), ("tiled_paired", "dims"),
                                         ("tiled_paired_cols", "where"),
                                         ("epilogue_halves", "where"),
                                         ("epilogue_quarters", None)])
def test_kernels_under_the_interpreter(path, option):
  # The Triton kernels' sigmoid epilogues (tiled forward; FlashAttention-shaped, tiled,
  # paired and Matryoshka gradients; paired plain blocks compute the gradient in the
  # forward pass, _core._fuses, in 1, 2 or 4 column chunks a tile) on tiles small
  # enough for several per block, fp32
  # against the float64 formula on the same inputs: value and the gradients of x, y,
  # t and b within tests.support.tolerances.FP32.
  b, d = 45, 40
  x64, y64 = _data(3, b, d)
  x, y = x64.astype(jnp.float32), y64.astype(jnp.float32)
  keep = np.random.default_rng(3).uniform(size=b) > 0.3 if "where" in (option or "") else None
  dims = (8, 40) if "dims" in (option or "") else None
  kw = dict(stable=False, backend="interpret", config=kernel_path_config(path, d, jnp.float32))
  if keep is not None:
    kw["where"] = keep
  if dims is not None:
    kw.update(matryoshka_dims=dims, matryoshka_weights=(0.5, 1.0))

  def want(x, y, t, bias):
    prefix = dims or (d,)
    w = (0.5, 1.0) if dims else (1.0,)
    return sum(wk * _big_vision(x[:, :m], y[:, :m], t, bias, keep) for m, wk in zip(prefix, w))

  with jax.enable_x64(False):
    got = jax.value_and_grad(lambda x, y, t, bias: mj.siglip_loss(
        x, y, temperature=t, bias=bias, **kw), argnums=(0, 1, 2, 3))(
            x, y, jnp.float32(T), jnp.float32(BIAS))
  v0, g0 = _value_and_grads(want, x.astype(jnp.float64), y.astype(jnp.float64))
  assert abs(float(got[0]) - float(v0)) <= FP32[0] * abs(float(v0))
  for i, (a, c) in enumerate(zip(got[1], g0)):
    err = float(jnp.max(jnp.abs(a - c)) / jnp.max(jnp.abs(c)))
    assert err <= FP32[1], (f"gradient {i}", err)


def test_the_gradient_from_the_forward_takes_one_cotangent_over_the_kept_rows():
  # A plain sigmoid block whose towers both train, on the paired gradient, computes its
  # gradient in the forward pass for a unit cotangent on every row and scales it in the
  # backward (_core._scaled): for a cotangent that is one value over the kept rows (any
  # value on the removed ones: the families' case) it equals the blockwise backend's
  # gradient (FP32); for any other it is NaN, not a wrong number.
  b, d = 40, 24
  x64, y64 = _data(5, b, d)
  x, y = (v / jnp.linalg.norm(v, axis=1, keepdims=True) for v in (x64, y64))
  x, y = x.astype(jnp.float32), y.astype(jnp.float32)
  keep = np.random.default_rng(5).uniform(size=b) > 0.25
  cfg = kernel_path_config("paired", d, jnp.float32)
  spec = lambda name: _core.BlockSpec(backend=backends.resolve(name), exclude_self=True,
                                      reduction=SIGMOID, config=cfg)
  assert spec("interpret").backend.fuses(x, y, spec("interpret"))

  def grads(name, w):
    def f(x, y, scale, bias):
      r = _core.block_stats(x, y, scale, x_mask=keep, y_mask=keep, bias=bias,
                            spec=spec(name))[0]
      return jnp.sum(jnp.asarray(w, jnp.float32) * r)
    with jax.enable_x64(False):
      return jax.grad(f, argnums=(0, 1, 2, 3))(x, y, jnp.float32(3.0), jnp.float32(-1.5))

  one = np.where(keep, 0.25, 7.0)
  for got, want in zip(grads("interpret", one), grads("blockwise", one)):
    err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
    assert err <= FP32[1], err
  for g in grads("interpret", np.where(keep, np.linspace(0.1, 1.0, b), 7.0)):
    assert bool(jnp.all(jnp.isnan(g)))


def test_stable_scales_every_gradient_by_sqrt_bt():
  x, y = _data()
  f = lambda stable: _value_and_grads(lambda x, y, t, b: mj.siglip_loss(
      x, y, temperature=t, bias=b, stable=stable, backend="blockwise"), x, y)
  (v1, g1), (v0, g0) = f(True), f(False)
  assert float(v1) == float(v0)
  for a, c in zip(g1, g0):
    np.testing.assert_allclose(a, np.sqrt(B * T) * c, rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", ["reference", "blockwise"])
def test_where_is_the_loss_of_the_kept_rows(backend):
  x, y = _data()
  keep = np.ones(B, bool)
  keep[[0, 4, B - 1]] = False
  x_bad = x.at[4].set(jnp.nan)   # a removed row may hold anything
  f = lambda x, y, t, b: mj.siglip_loss(x, y, temperature=t, bias=b, stable=False,
                                        where=keep, backend=backend)
  got = _value_and_grads(f, x_bad, y)
  want = _value_and_grads(lambda x, y, t, b: _big_vision(x, y, t, b, keep), x, y)
  _close(got, want, 1e-12)
  assert not np.any(got[1][0][~keep]) and not np.any(got[1][1][~keep])


@pytest.mark.parametrize("per_dim", [False, True])
def test_matryoshka_is_the_weighted_sum_over_prefixes(per_dim):
  # Every prefix renormalized: L = sum_k w_k L(x[:, :m_k], y[:, :m_k]).
  x, y = _data()
  dims, w = (8, 16, 24), (0.5, 1.0, 2.0)
  f = lambda x, y, t, b: mj.siglip_loss(x, y, temperature=t, bias=b, stable=False,
                                        matryoshka_dims=dims, matryoshka_weights=w,
                                        matryoshka_per_dim=per_dim, backend="blockwise")
  want = lambda x, y, t, b: sum(wk * _big_vision(x[:, :m], y[:, :m], t, b)
                                for m, wk in zip(dims, w))
  _close(_value_and_grads(f, x, y), _value_and_grads(want, x, y), 1e-12)
  loss, stats = mj.siglip_loss_with_stats(x, y, temperature=T, bias=BIAS, matryoshka_dims=dims,
                                          matryoshka_weights=w, backend="blockwise")
  per = [float(_big_vision(x[:, :m], y[:, :m], T, BIAS)) for m in dims]
  np.testing.assert_allclose(stats.matryoshka_losses, per, rtol=1e-12)
  np.testing.assert_allclose(stats.loss_positive + stats.loss_negative, per, rtol=1e-12)


@pytest.mark.parametrize("n_dev", [1, 2, 4, 8])
def test_ring_equals_one_device(n_dev):
  # Global loss on every device; the gradients of the shards are the rows of the
  # one-device gradient; the temperature's and the bias's are summed over the ring.
  b = 16
  x, y = _data(2, b, D)
  mesh = Mesh(np.array(jax.devices()[:n_dev]), ("batch",))
  f = mj.sharded(lambda x, y, temperature, bias, **k: mj.siglip_loss(
      x, y, temperature=temperature, bias=bias, stable=False, backend="blockwise", **k),
      mesh, "batch")
  got = _value_and_grads(lambda x, y, t, b: f(x, y, temperature=t, bias=b), x, y)
  _close(got, _value_and_grads(_big_vision, x, y), 1e-12)


def test_stats_split_the_loss_and_count_hits():
  x, y = _data()
  loss, st = mj.siglip_loss_with_stats(x, y, temperature=T, bias=BIAS, backend="blockwise")
  np.testing.assert_allclose(st.loss_positive + st.loss_negative, loss, rtol=1e-12)
  unit = lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)
  z = np.asarray(unit(x) @ unit(y).T / T + BIAS)
  pos = -np.log(1 / (1 + np.exp(-np.diag(z))))
  np.testing.assert_allclose(st.loss_positive, np.mean(pos), rtol=1e-12)
  off = np.where(np.eye(B, dtype=bool), -np.inf, z)
  # (a hit beats every negative by more than the tie tolerance, 2^-10 in similarity)
  assert float(st.accuracy_row) == pytest.approx(
      np.mean(np.diag(z) > off.max(axis=1) + 2.0**-10 / T))


def test_errors_name_the_argument():
  x, y = _data()
  with pytest.raises(ValueError, match="bias must be finite"):
    mj.siglip_loss(x, y, bias=float("inf"))
  # finite as a Python float, not in float32: it was an inf loss beside finite gradients
  for b in (1e39, -1e39):
    with pytest.raises(ValueError, match="bias must be a finite float32 number"):
      mj.siglip_loss(x.astype(jnp.float32), y.astype(jnp.float32), bias=b)
  assert np.isfinite(mj.siglip_loss(x, y, bias=1e39))   # float64 features: finite there
  with pytest.raises(TypeError, match="bias"):
    mj.siglip_loss(x, y, bias="a")
  with pytest.raises(TypeError, match="tau_plus"):
    mj.siglip_loss(x, y, tau_plus=0.1)   # no softmax options: no such keyword
  # a traced bias out of range: NaN, never a finite answer
  v, g = jax.value_and_grad(lambda b: mj.siglip_loss(x, y, bias=b, backend="blockwise"))(
      jnp.float64(jnp.inf))
  assert np.isnan(v) and np.isnan(g)
