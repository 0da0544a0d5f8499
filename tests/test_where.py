"""``where=``: a loss with rows removed equals the loss of the kept rows alone.

The oracle is the float64 dense reference run on ``x[where], y[where]`` (numpy boolean
indexing, outside any jit): values and gradients (the removed rows' exactly zero), on
every backend, with every option, Matryoshka, hard negatives, through the ring and
through ``sharded`` with uneven global batches (padded and masked by ``sharded``).

The full product (family x option x backend) is marked ``slow``; a fixed sample,
covering each family, option and backend, runs by default.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from memeff_jax import reference
from tests.support.check import kernel_path_config
from tests.support.data import qwen3_batch, where_mask
from tests.support.families import ALL_BACKENDS, FAMILIES
from tests.support.tolerances import FP32, grad_err, rel_err

OPTIONS = {
    "plain": {},
    "tau_rows": dict(tau_plus="rows", label_smoothing=0.1),
    "zloss": dict(lse_square_scale=1e-2, stable=False, temperature=0.05),
    "mrl": dict(matryoshka_dims=(8, 24), matryoshka_weights=(0.5, 1.0), tau_plus=0.1,
                label_smoothing=0.05),
}
B, D = 19, 24


def _arrays(family, b, d=D, seed=0):
  if "qwen3" in family:
    return list(qwen3_batch(seed, b, d, 2, jnp.float32))
  keys = jax.random.split(jax.random.key(seed), 2)
  x = jax.random.normal(keys[0], (b, d))
  return [x, x + 0.7 * jax.random.normal(keys[1], (b, d))]


def _opts(option, b):
  opts = dict(OPTIONS[option])
  if opts.get("tau_plus") == "rows":
    opts["tau_plus"] = np.random.default_rng(b).uniform(0.0, 0.4, b).astype(np.float32)
  return opts


def _value_and_grads(fn, arrays, t, kw):
  n = len(arrays)
  f = lambda *a: fn(*a[:n], temperature=a[n], **kw)
  return jax.jit(jax.value_and_grad(f, argnums=tuple(range(n + 1)), has_aux=True))(*arrays, t)


def _oracle(family, arrays, t, opts, w):
  """float64 reference on the kept rows: (loss, stats), grads (scattered back)."""
  ref, fam_kw = FAMILIES[family].reference_with_stats, FAMILIES[family].options
  opts = dict(opts)
  dims, weights = opts.pop("matryoshka_dims", None), opts.pop("matryoshka_weights", None)
  if np.ndim(opts.get("tau_plus", 0.0)) == 1:
    opts["tau_plus"] = opts["tau_plus"][w]
  fn = lambda *a, **k: ref(*a, **fam_kw, **k)
  if dims is not None:
    fn = lambda *a, **k: reference.matryoshka_fused_with_stats(
        lambda *b, **c: ref(*b, **fam_kw, **c), *a, dims=dims, weights=weights, **k)
  with jax.enable_x64(True):
    kept = [jnp.asarray(np.asarray(a, np.float64)[w]) for a in arrays]
    (val, stats), grads = _value_and_grads(fn, kept, jnp.float64(t), opts)
  full = []
  for a, g in zip(arrays, grads[:-1]):
    out = np.zeros(a.shape, np.float64)
    out[w] = g
    full.append(out)
  return val, stats, full + [grads[-1]]


def _check(family, option, backend, b=B, w=None):
  fn, fam_kw = FAMILIES[family].with_stats, FAMILIES[family].options
  opts = _opts(option, b)
  t = opts.pop("temperature", 0.07)
  arrays = _arrays(family, b)
  w = where_mask(b) if w is None else w
  (val, stats), grads = _value_and_grads(
      lambda *a, **k: fn(*a, where=w, backend=backend, **fam_kw, **k), arrays,
      jnp.float32(t), opts)
  ref_val, ref_stats, ref_grads = _oracle(family, arrays, t, opts, w)
  assert rel_err(val, ref_val) <= FP32[0], (float(val), float(ref_val))
  for g, rg in zip(grads, ref_grads):
    assert grad_err(g, rg) <= FP32[1], grad_err(g, rg)
  for g in grads[:len(arrays)]:   # removed rows: exactly zero
    assert not np.any(np.asarray(g)[~w]), "a removed row got a gradient"
  lse = np.asarray(stats.lse_row)
  np.testing.assert_array_equal(lse[..., ~w], 0.0)
  np.testing.assert_allclose(lse[..., w], ref_stats.lse_row, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(stats.accuracy_row, ref_stats.accuracy_row, atol=1e-6)


def _product():
  # A quarter of the product by default, and Matryoshka for each family on one backend
  # (rotating; 7-9 s a case on CPU); the rest: slow.
  cases = list(itertools.product(FAMILIES, OPTIONS, ALL_BACKENDS))
  mrl = lambda c: c[1] == "mrl" and ALL_BACKENDS.index(c[2]) == list(FAMILIES).index(
      c[0]) % len(ALL_BACKENDS)
  return [case if i % 4 == 0 or mrl(case) else pytest.param(*case, marks=pytest.mark.slow)
          for i, case in enumerate(cases)]


@pytest.mark.parametrize("family,option,backend", _product())
def test_where_equals_kept_rows(family, option, backend):
  _check(family, option, backend)


@pytest.mark.parametrize("backend", ["blockwise", "interpret", "interpret_col_pass"])
def test_where_across_tiles_and_slabs(backend):
  # 70 rows over several row and column tiles (tiled kernels, 1 KiB slabs) with runs of
  # removed rows that empty whole tiles; the tiled forward's columns from its tiles or
  # from a second pass over the swapped block (whose masks swap too).
  w = where_mask(70, seed=1)
  w[16:40] = False
  cfg = None
  if backend != "blockwise":
    cfg = kernel_path_config("tiled" if backend == "interpret" else "tiled_col_pass", D,
                             jnp.float32)
    backend = "interpret"
  fn = FAMILIES["clip"].with_stats
  arrays = _arrays("clip", 70)
  (val, _), grads = _value_and_grads(
      lambda *a, **k: fn(*a, where=w, backend=backend, config=cfg, **k), arrays,
      jnp.float32(0.07), dict(label_smoothing=0.1))
  ref_val, _, ref_grads = _oracle("clip", arrays, 0.07, dict(label_smoothing=0.1), w)
  assert rel_err(val, ref_val) <= FP32[0]
  for g, rg in zip(grads, ref_grads):
    assert grad_err(g, rg) <= FP32[1]


def test_where_all_kept_is_the_plain_loss():
  x, y = _arrays("clip", B)
  got = mj.clip_loss(x, y, where=np.ones(B, bool), backend="blockwise")
  assert rel_err(got, mj.clip_loss(x, y, backend="blockwise")) <= 1e-6


def test_removed_rows_may_hold_anything():
  # Padding rows full of NaN or huge values change nothing and get zero gradients.
  x, y = _arrays("clip", B)
  w = where_mask(B)
  bad_x = x.at[~w].set(jnp.nan)
  bad_y = y.at[~w].set(1e30)
  want = mj.clip_loss(x, y, where=w, backend="blockwise")
  val, grads = jax.value_and_grad(lambda a, b: mj.clip_loss(a, b, where=w, backend="blockwise"),
                                  (0, 1))(bad_x, bad_y)
  assert rel_err(val, want) <= 1e-6
  assert all(np.all(np.isfinite(g)) and not np.any(np.asarray(g)[~w]) for g in grads)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_nothing_kept_or_nothing_to_debias_is_nan(backend):
  x, y = _arrays("clip", B)
  none = np.zeros(B, bool)
  one = np.zeros(B, bool)
  one[3] = True
  # Nothing kept: the mean of no terms is NaN, and every gradient, the temperature's
  # and SigLIP's bias's too, is zero (docs/math.md §7.6: no term depends on them), with
  # label smoothing and the z-loss too (each divides by B' or squares an empty lse).
  # tau_plus too: with no row there is no softmax to debias (one hard negative leaves
  # the nominal count 0 there, none -1).
  both = dict(label_smoothing=0.1, lse_square_scale=0.1)
  q, d, h = _arrays("qwen3", B)
  for fn, arrays, extra, opts in (
      (mj.clip_loss, (x, y), {}, {}), (mj.clip_loss, (x, y), {}, both),
      (mj.clip_loss, (x, y), {}, dict(tau_plus=0.1)),
      (mj.siglip_loss, (x, y), dict(bias=jnp.float32(-2.0)), {}),
      (mj.qwen3_loss, (q, d, h), {}, dict(both, matryoshka_dims=(8, 24))),
      (mj.qwen3_loss, (q, d, h[:, :1]), {}, dict(tau_plus=0.1))):
    names = ("temperature",) + tuple(extra)
    val, g = jax.value_and_grad(
        lambda a, hyper: fn(*a, where=none, backend=backend, **hyper, **opts), argnums=(0, 1))(
            arrays, dict(temperature=jnp.float32(0.1), **extra))
    assert np.isnan(val), (fn, opts)
    for v in (*g[0], *(g[1][k] for k in names)):
      np.testing.assert_array_equal(v, 0.0, err_msg=f"{fn.__name__} {opts}")
  # One row left: no negatives, so tau_plus has nothing to debias (a ValueError when
  # the batch is 1 statically; known only at run time here).
  val, g = jax.value_and_grad(lambda a: mj.clip_loss(a, y, where=one, tau_plus=0.1,
                                                     backend=backend))(x)
  g = np.asarray(g)
  assert np.isnan(val) and np.all(np.isnan(g[one])) and not np.any(g[~one])
  # ... and each dim's loss, a statistic, is NaN with the loss, as the reference's (was
  # finite on the other backends: a weighted sum of finite terms reported beside NaN).
  for mode in (True, False):
    val, stats = mj.clip_loss_with_stats(x, y, where=one, tau_plus=jnp.float32(0.1),
                                         matryoshka_dims=(8, 24), matryoshka_per_dim=mode,
                                         backend=backend)
    assert np.isnan(val) and np.all(np.isnan(stats.matryoshka_losses)), (mode, stats)


def test_where_with_hard_negatives_and_matryoshka_wrapper():
  # Hard negatives of removed rows go too; the eager wrapper passes where= through.
  q, d, h = _arrays("qwen3", B)
  w = where_mask(B)
  dims = (8, 24)
  got = mj.matryoshka(mj.qwen3_loss, dims)(q, d, h, where=w, backend="blockwise")
  want = mj.matryoshka(mj.qwen3_loss, dims)(q[w], d[w], h[w], backend="blockwise")
  assert rel_err(got, want) <= 1e-5


def test_where_does_not_recompile():
  traces = []

  @jax.jit
  def step(x, y, w):
    traces.append(1)
    return mj.clip_loss(x, y, where=w, backend="blockwise")

  x, y = _arrays("clip", B)
  for seed in range(3):
    step(x, y, where_mask(B, seed))
  assert len(traces) == 1


# ------------------------------------------------------------------ the ring, sharded
def _sharded_check(family, devices, b, backend, option="plain"):
  fn, fam_kw = FAMILIES[family].with_stats, FAMILIES[family].options
  opts = _opts(option, b)
  t = opts.pop("temperature", 0.07)
  arrays = _arrays(family, b)
  w = where_mask(b, seed=devices)
  mesh = Mesh(np.array(jax.devices()[:devices]), ("batch",))
  f = mj.sharded(fn, mesh, "batch")
  (val, stats), grads = _value_and_grads(
      lambda *a, **k: f(*a, where=w, backend=backend, **fam_kw, **k), arrays, jnp.float32(t),
      opts)
  ref_val, ref_stats, ref_grads = _oracle(family, arrays, t, opts, w)
  assert rel_err(val, ref_val) <= FP32[0], (float(val), float(ref_val))
  for g, rg in zip(grads, ref_grads):
    assert g.shape == rg.shape and grad_err(g, rg) <= FP32[1], grad_err(g, rg)
  assert stats.lse_row.shape[-1] == b
  np.testing.assert_allclose(np.asarray(stats.lse_row)[..., w], ref_stats.lse_row, rtol=1e-5,
                             atol=1e-5)


def _ring_cases():
  cases = [(fam, n, b, be) for fam in FAMILIES for n, b in ((1, 19), (2, 19), (4, 21), (8, 37))
           for be in ("blockwise", "interpret")]
  return [c if i % 5 == 0 else pytest.param(*c, marks=pytest.mark.slow)
          for i, c in enumerate(cases)]


@pytest.mark.parametrize("family,devices,batch,backend", _ring_cases())
def test_sharded_uneven_batch_with_where(family, devices, batch, backend):
  # Batches that do not split evenly: sharded pads them with removed rows.
  _sharded_check(family, devices, batch, backend)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sharded_where_with_options(family):
  _sharded_check(family, 4, 21, "blockwise", option="mrl")


def test_sharded_1001_rows_on_8_devices():
  # The bar: a global batch of 1001 (not a multiple of 8) runs on 8 devices and equals
  # one device.
  b = 1001
  keys = jax.random.split(jax.random.key(3), 2)
  x = jax.random.normal(keys[0], (b, 16))
  y = x + jax.random.normal(keys[1], (b, 16))
  mesh = Mesh(np.array(jax.devices()[:8]), ("batch",))
  f = mj.sharded(mj.clip_loss, mesh, "batch")
  got = jax.jit(jax.value_and_grad(lambda a, c: f(a, c, backend="blockwise"), (0, 1)))(x, y)
  want = jax.value_and_grad(lambda a, c: mj.clip_loss(a, c, backend="blockwise"), (0, 1))(x, y)
  assert rel_err(got[0], want[0]) <= 2e-6
  for g, rg in zip(got[1], want[1]):
    assert g.shape == (b, 16) and grad_err(g, rg) <= 2e-5


def test_flax_modules_and_memeff_classes_take_where():
  from memeff_jax import nnx as mnnx  # pylint: disable=g-import-not-at-top
  x, y = _arrays("clip", B)
  w = where_mask(B)
  want = mj.clip_loss(x[w], y[w], backend="blockwise")
  module = mnnx.CLIPLoss(backend="blockwise")
  assert rel_err(module(x, y, where=w), want) <= 1e-6
  from memeff_jax.classes import MemoryEfficientCLIPLoss  # pylint: disable=g-import-not-at-top
  cls = MemoryEfficientCLIPLoss(backend="blockwise")
  assert rel_err(cls(x, y, where=w), want) <= 1e-6
