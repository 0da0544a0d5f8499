"""reference.py against hand-computed values, float64 loops written from docs/math.md, and
literal definitions (smoothed cross-entropy, the debias formula, the z-loss)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import memeff_jax as mj
from memeff_jax import reference
from tests.support import oracle
from tests.support.check import sampled


def _rand(seed, *shape):
  return np.random.default_rng(seed).standard_normal(shape)


def test_clip_and_lit_by_hand():
  # Unit rows; s = [[1, 0.6], [0, 0.8]], t = 0.5 -> logits [[2, 1.2], [0, 1.6]].
  x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  y = jnp.array([[1.0, 0.0], [0.6, 0.8]])
  row0 = math.log(math.exp(2) + math.exp(1.2)) - 2
  row1 = math.log(math.exp(0) + math.exp(1.6)) - 1.6
  col0 = math.log(math.exp(2) + math.exp(0)) - 2
  col1 = math.log(math.exp(1.2) + math.exp(1.6)) - 1.6
  lit = (row0 + row1) / 2
  clip = (row0 + row1 + col0 + col1) / 4
  np.testing.assert_allclose(reference.lit_loss(x, y, temperature=0.5), lit, rtol=1e-6)
  np.testing.assert_allclose(reference.clip_loss(x, y, temperature=0.5), clip, rtol=1e-6)
  # z-loss: lse of row 0 is log(e^2 + e^1.2), etc.
  z = 0.1 * (math.log(math.exp(2) + math.exp(1.2)) ** 2 + math.log(1 + math.exp(1.6)) ** 2) / 2
  _, stats = reference.lit_loss_with_stats(x, y, temperature=0.5, lse_square_scale=0.1)
  np.testing.assert_allclose(stats.z_loss, z, rtol=1e-6)


CLIP_OPTS = [dict(), dict(tau=0.1), dict(tau="rows"), dict(eps=0.1), dict(z_scale=1e-2),
             dict(tau=0.3, eps=0.2, z_scale=1e-3), dict(normalized=True)]


@pytest.mark.parametrize("lit", [False, True])
@pytest.mark.parametrize("opts", CLIP_OPTS)
@pytest.mark.parametrize("b,d,t", [(1, 3, 0.07), (6, 5, 0.1), (9, 4, 0.5)])
def test_clip_lit_vs_loops(lit, opts, b, d, t):
  x, y = _rand(0, b, d), _rand(1, b, d)
  tau = opts.get("tau")
  if tau == "rows":
    tau = np.random.default_rng(2).uniform(0, 0.5, b)
  fn = reference.lit_loss_with_stats if lit else reference.clip_loss_with_stats
  if b == 1 and tau is not None:   # no negatives to debias (tests/test_catalogue.py)
    with pytest.raises(ValueError, match="tau_plus needs negatives"):
      fn(jnp.asarray(x), jnp.asarray(y), tau_plus=tau)
    return
  expect, z = oracle.clip(x, y, t, tau=tau, eps=opts.get("eps", 0.0),
                          z_scale=opts.get("z_scale", 0.0),
                          normalized=opts.get("normalized", False), lit=lit)
  with jax.enable_x64(True):
    loss, stats = fn(jnp.asarray(x), jnp.asarray(y), temperature=t,
                     tau_plus=0.0 if tau is None else (tau if np.ndim(tau) == 0 else
                                                       jnp.asarray(tau)),
                     label_smoothing=opts.get("eps", 0.0),
                     lse_square_scale=opts.get("z_scale", 0.0),
                     normalized_inputs=opts.get("normalized", False))
    np.testing.assert_allclose(loss, expect, rtol=1e-10)
    np.testing.assert_allclose(stats.z_loss, z, rtol=1e-10, atol=1e-300)


QWEN_OPTS = [dict(), dict(qq=True), dict(dd=True), dict(qq=True, dd=True, k=3),
             dict(k=1, margin=0.05), dict(k=5, margin=2.0), dict(qq=True, tau=0.1, k=2),
             dict(dd=True, tau="rows", eps=0.1), dict(qq=True, dd=True, eps=0.2, z_scale=0.01),
             dict(k=0, margin=0.0, tau=0.05)]


# Every other case by default (the rest: slow).
@pytest.mark.parametrize("lit,opts", sampled(
    [(lit, o) for lit in (False, True) for o in QWEN_OPTS
     if not (lit and o.get("dd"))], lambda i, c: i % 2 == 0))   # LiT-Qwen3: no d-d
def test_qwen3_vs_loops(lit, opts):
  b, d, t, margin = 7, 6, 0.1, opts.get("margin", 0.1)
  q = _rand(0, b, d)
  doc = q + 0.7 * _rand(1, b, d)   # correlated pairs: the mask has work to do
  k = opts.get("k")
  h = None if k is None else _rand(3, b, k, d)
  tau = opts.get("tau")
  if tau == "rows":
    tau = np.random.default_rng(2).uniform(0, 0.5, b)
  expect, _ = oracle.qwen3(q, doc, h, t, margin, qq=opts.get("qq", False),
                           dd=opts.get("dd", False), tau=tau, eps=opts.get("eps", 0.0),
                           z_scale=opts.get("z_scale", 0.0))
  with jax.enable_x64(True):
    kw = dict(temperature=t, margin=margin, use_qq_negatives=opts.get("qq", False),
              tau_plus=0.0 if tau is None else (tau if np.ndim(tau) == 0 else jnp.asarray(tau)),
              label_smoothing=opts.get("eps", 0.0), lse_square_scale=opts.get("z_scale", 0.0))
    hh = None if h is None else jnp.asarray(h)
    if lit:
      loss = reference.lit_qwen3_loss(jnp.asarray(q), jnp.asarray(doc), hh, **kw)
    else:
      loss = reference.qwen3_loss(jnp.asarray(q), jnp.asarray(doc), hh,
                                  use_dd_negatives=opts.get("dd", False), **kw)
    np.testing.assert_allclose(loss, expect, rtol=1e-10)


def test_qwen3_mask_drops_entries():
  # Duplicate documents: d_1 == d_0 makes q_0 . d_1 = pos_0 (kept, non-strict) and a
  # near-copy above pos + margin (dropped); the loss equals the loop's.
  q = np.eye(3)
  doc = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.3, 0.3, 0.9]])
  with jax.enable_x64(True):
    full = reference.qwen3_loss(jnp.asarray(q), jnp.asarray(doc), temperature=0.1, margin=2.0)
    masked = reference.qwen3_loss(jnp.asarray(q), jnp.asarray(doc), temperature=0.1, margin=0.0)
  np.testing.assert_allclose(masked, oracle.qwen3(q, doc, None, 0.1, 0.0)[0], rtol=1e-10)
  np.testing.assert_allclose(full, oracle.qwen3(q, doc, None, 0.1, 2.0)[0], rtol=1e-10)
  # row 1's positive (0 cosine) sits below q_1 . d_0: masked
  assert float(masked) < float(full) - 1e-3


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_smoothing_is_the_smoothed_cross_entropy(eps):
  # F.cross_entropy with label_smoothing, written out over the B candidates.
  b, t = 6, 0.2
  x, y = jnp.asarray(_rand(0, b, 4)), jnp.asarray(_rand(1, b, 4))
  with jax.enable_x64(True):
    x, y = x.astype(jnp.float64), y.astype(jnp.float64)
    xn = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    yn = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
    logits = xn @ yn.T / t
    target = (1 - eps) * jnp.eye(b) + eps / b
    ce = lambda z: jnp.mean(-jnp.sum(target * jax.nn.log_softmax(z, axis=-1), axis=-1))
    np.testing.assert_allclose(reference.lit_loss(x, y, temperature=t, label_smoothing=eps),
                               ce(logits), rtol=1e-12)
    np.testing.assert_allclose(reference.clip_loss(x, y, temperature=t, label_smoothing=eps),
                               (ce(logits) + ce(logits.T)) / 2, rtol=1e-12)


def test_debias_formula_written_out():
  # Chuang et al. (M = 1) in unshifted logits, including a row where the clamp fires.
  t, tau = 0.5, 0.1
  x = y = jnp.array([[1.0, 0.0], [0.9, 0.1 * math.sqrt(19)], [-1.0, 0.0]])
  with jax.enable_x64(True):
    x, y = (jnp.asarray(oracle.normalize(np.asarray(v))) for v in (x, y))
    s = x @ y.T
    n = 2
    ells, clamped = [], []
    for i in range(3):
      pos = math.exp(float(s[i, i]) / t)
      neg = sum(math.exp(float(s[i, j]) / t) for j in range(3) if j != i)
      g = (neg / n - tau * pos) / (1 - tau)
      floor = math.exp(-1 / t)
      clamped.append(g < floor)
      ells.append(math.log(pos + n * max(g, floor)) - float(s[i, i]) / t)
    assert any(clamped) and not all(clamped)
    np.testing.assert_allclose(reference.lit_loss(x, y, temperature=t, tau_plus=tau),
                               np.mean(ells), rtol=1e-12)


@pytest.mark.parametrize("family,kw", [("clip", {}), ("lit", {}), ("clip", dict(tau_plus=0.1)),
                                       ("qwen3", dict(use_qq_negatives=True))])
def test_jit_at_a_tiny_temperature(family, kw):
  # t = 1e-12 (in range: t and 1 / t normal floats): logits near 1e12, where half an ulp
  # is 3e4. Under jit XLA had contracted scale * raw into an FMA in one fusion of
  # logsumexp and not in the other, so the row's maximum and its shifted entries were
  # rounded apart and exp overflowed (NaN). The reference under jit agrees with itself
  # eagerly and with the blockwise backend (an independent formulation) to float32's
  # rounding of such logits.
  n, d = 12, 8
  args = [jnp.asarray(_rand(i, n, d), jnp.float32) for i in range(2)]
  if family == "qwen3":
    args.append(jnp.asarray(_rand(2, n, 2, d), jnp.float32))
  ref = lambda *a: getattr(reference, f"{family}_loss")(*a, temperature=1e-12, **kw)
  other = lambda *a: getattr(mj, f"{family}_loss")(*a, temperature=1e-12, backend="blockwise",
                                                  **kw)
  got = jax.jit(jax.value_and_grad(ref, argnums=(0, 1)))(*args)
  for want in (jax.value_and_grad(ref, argnums=(0, 1))(*args),
               jax.jit(jax.value_and_grad(other, argnums=(0, 1)))(*args)):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for g, w in zip(got[1], want[1]):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(w))))


def test_stable_scales_every_gradient():
  b, t = 5, 0.07
  x, y = jnp.asarray(_rand(0, b, 3), jnp.float32), jnp.asarray(_rand(1, b, 3), jnp.float32)
  f = lambda stable: lambda x, y, t: reference.clip_loss(x, y, temperature=t, stable=stable,
                                                        label_smoothing=0.1)
  v1, g1 = jax.value_and_grad(f(True), argnums=(0, 1, 2))(x, y, t)
  v0, g0 = jax.value_and_grad(f(False), argnums=(0, 1, 2))(x, y, t)
  np.testing.assert_allclose(v1, v0, rtol=1e-7)
  for a, c in zip(g1, g0):
    np.testing.assert_allclose(a, math.sqrt(b * t) * c, rtol=2e-5, atol=1e-7)


def test_temperature_gradient_matches_math():
  # docs/math.md §7.4: d ell_i / dt = (s_ii - sum_j P_ij s_ij) / t^2 for the row loss.
  b, t = 6, 0.3
  x, y = jnp.asarray(_rand(0, b, 4)), jnp.asarray(_rand(1, b, 4))
  with jax.enable_x64(True):
    x, y = x.astype(jnp.float64), y.astype(jnp.float64)
    g = jax.grad(lambda t: reference.lit_loss(x, y, temperature=t, stable=False))(t)
    xn, yn = oracle.normalize(np.asarray(x)), oracle.normalize(np.asarray(y))
    s = xn @ yn.T
    p = np.exp(s / t) / np.exp(s / t).sum(1, keepdims=True)
    expect = np.mean((np.diag(s) - (p * s).sum(1)) / t**2)
    np.testing.assert_allclose(g, expect, rtol=1e-10)


def test_normalize_zero_vector_gradient():
  v = jnp.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]])
  gout = jnp.array([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]])
  out, vjp = jax.vjp(reference.normalize, v)
  (gv,) = vjp(gout)
  np.testing.assert_array_equal(out[0], 0.0)
  np.testing.assert_allclose(gv[0], gout[0] / 1e-12, rtol=1e-6)   # clamped norm: no radial term
  u = np.array([0.6, 0.8, 0.0])
  np.testing.assert_allclose(gv[1], (gout[1] - gout[1] @ u * u) / 5.0, rtol=1e-6)


def test_reference_gradients_numerically():
  x, y = jnp.asarray(_rand(0, 4, 3)), jnp.asarray(_rand(1, 4, 3))
  h = jnp.asarray(_rand(2, 4, 2, 3))
  with jax.enable_x64(True):
    x, y, h = x.astype(jnp.float64), y.astype(jnp.float64), h.astype(jnp.float64)
    # stable=False: stable=True deliberately scales the gradient by sqrt(B t).
    check_grads(lambda x, y: reference.clip_loss(x, y, temperature=0.3, tau_plus=0.2,
                                                 label_smoothing=0.1, lse_square_scale=0.1,
                                                 stable=False),
                (x, y), order=1, modes=["rev"])
    check_grads(lambda q, d, h: reference.qwen3_loss(q, d, h, temperature=0.3, margin=0.5,
                                                     use_qq_negatives=True, stable=False,
                                                     use_dd_negatives=True),
                (x, y, h), order=1, modes=["rev"])


def _prefix_unit(v, m):
  return oracle.normalize(np.asarray(v, np.float64)[..., :m])


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
def test_matryoshka_fused_and_eager(family):
  b, d, dims, w = 6, 8, (2, 5, 8), (1.0, 0.5, 0.25)
  x, y, h = _rand(0, b, d), _rand(1, b, d), _rand(2, b, 2, d)
  fn = getattr(reference, f"{family}_loss")
  hq = family in ("qwen3", "lit_qwen3")
  with jax.enable_x64(True):
    args = [jnp.asarray(x), jnp.asarray(y)] + ([jnp.asarray(h)] if hq else [])
    kw = dict(temperature=0.2)
    fused = reference.matryoshka_fused(fn, *args, dims=dims, weights=w, **kw)
    eager = reference.matryoshka(fn, dims, w)(*args, **kw)
    # Fused: every prefix of the normalized features renormalized; eager: the raw slices
    # normalized by the base loss. Equal in exact math.
    per_dim = sum(wk * fn(*[jnp.asarray(_prefix_unit(oracle.normalize(a), m)) for a in args],
                          normalized_inputs=True, **kw) for m, wk in zip(dims, w))
    np.testing.assert_allclose(fused, per_dim, rtol=1e-12)
    np.testing.assert_allclose(eager, fused, rtol=1e-12)


def test_matryoshka_fused_renormalizes_even_normalized_inputs():
  x, y = jnp.asarray(_rand(0, 5, 4)) * 3, jnp.asarray(_rand(1, 5, 4))
  with jax.enable_x64(True):
    fused = reference.matryoshka_fused(reference.clip_loss, x, y, dims=(4,),
                                       normalized_inputs=True)
    plain = reference.clip_loss(x, y, normalized_inputs=True)
    renorm = reference.clip_loss(x, y)
  np.testing.assert_allclose(fused, renorm, rtol=1e-12)
  assert abs(float(fused) - float(plain)) > 1e-3


