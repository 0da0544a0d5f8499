"""qwen3_loss / lit_qwen3_loss vs the dense reference: values and gradients w.r.t.
queries, documents, hard negatives and temperature, under jit, over backend x dtype x
shape x group combination x option."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memeff_jax import (lit_qwen3_loss, lit_qwen3_loss_with_stats, qwen3_loss,
                        qwen3_loss_with_stats, reference)
from tests.support.check import checkerboard, compare, kernel_path_config, sampled
from tests.support.data import decisive_margin, qwen3_batch, with_exact_ties
from tests.support.families import BACKENDS

DTYPES = (jnp.float32, jnp.bfloat16)


def _call(lit, backend, **opts):
  fn = lit_qwen3_loss if lit else qwen3_loss
  return lambda *a, **k: fn(*a, backend=backend, **opts, **k)


def _ref(lit, **opts):
  fn = reference.lit_qwen3_loss if lit else reference.qwen3_loss
  return lambda *a, **k: fn(*a, **opts, **k)


GROUPS = [(qq, dd) for qq in (False, True) for dd in (False, True)]


# By default two thirds of group x k x margin, a checkerboard third on each backend,
# so that each backend sees every group, k and margin (the other third: slow).
_FAMILY_GROUPS = [(False, qq, dd) for qq, dd in GROUPS] + [
    (True, qq, False) for qq in (False, True)]   # LiT-Qwen3: no d-d
_KS, _MARGINS = (0, 1, 5), (0.05, 0.1, 2.0)
_GROUP_CASES = [(be, lit, qq, dd, k, margin) for be in BACKENDS
                for lit, qq, dd in _FAMILY_GROUPS for k in _KS for margin in _MARGINS]


@pytest.mark.parametrize("backend,lit,qq,dd,k,margin", sampled(
    _GROUP_CASES, lambda i, c: checkerboard(
        (c[1:4], _FAMILY_GROUPS), (c[4], _KS), (c[5], _MARGINS), mod=6,
        residue=3 * BACKENDS.index(c[0]))))
def test_groups(backend, lit, qq, dd, k, margin):
  q, doc, h = qwen3_batch(k, 33, 24, k)
  opts = dict(margin=margin, use_qq_negatives=qq)
  if not lit:
    opts["use_dd_negatives"] = dd
  args = [q, doc] + ([h] if k else [])
  compare(_call(lit, backend, **opts), _ref(lit, **opts), args)


# By default half of the product, each value of each factor in it (the rest: slow).
@pytest.mark.parametrize("lit,k,dtype", sampled(
    list(itertools.product([False, True], [0, 3], DTYPES)),
    lambda i, c: checkerboard((c[0], [False, True]), (c[1], [0, 3]), (c[2], DTYPES))))
def test_tiled_path(lit, k, dtype):
  # The tiled forward and gradient (slabs of GEMM tiles) on every group, thresholds
  # and the symmetric q-q / d-d blocks, over several slabs.
  q, doc, h = qwen3_batch(7 + k, 70, 40, k, dtype)
  opts = dict(margin=0.05, use_qq_negatives=True, tau_plus=0.05, label_smoothing=0.1)
  if not lit:
    opts["use_dd_negatives"] = True
  cfg = kernel_path_config("tiled", 40, dtype)
  fn = lit_qwen3_loss if lit else qwen3_loss
  compare(lambda *a, **kw: fn(*a, backend="interpret", config=cfg, **opts, **kw),
          _ref(lit, **opts), [q, doc] + ([h] if k else []), dtype=dtype)


def _tau_rows(b):
  return jnp.asarray(np.random.default_rng(b).uniform(0.0, 0.6, b), jnp.float32)


OPTIONS = {
    "tau": dict(tau_plus=0.1),
    "tau_rows": dict(tau_plus="rows"),
    "tau_rows_zero": dict(tau_plus="zeros"),
    "smoothing": dict(label_smoothing=0.1),
    "tau_smooth": dict(tau_plus=0.05, label_smoothing=0.2),
    "zloss": dict(lse_square_scale=1e-3),
    "no_stable": dict(stable=False),
    "t_small": dict(temperature=0.01),
    "all": dict(tau_plus="rows", label_smoothing=0.1, lse_square_scale=1e-2, temperature=0.05),
}


# By default each (family, option, margin) on one backend, as a checkerboard.
_OPTION_FACTORS = (BACKENDS, [False, True], OPTIONS, [0.05, 2.0])


@pytest.mark.parametrize("backend,lit,option,margin", sampled(
    list(itertools.product(*_OPTION_FACTORS)),
    lambda i, c: checkerboard(*zip(c, _OPTION_FACTORS), mod=3)))
def test_options(backend, lit, option, margin):
  b = 40
  q, doc, h = qwen3_batch(7, b, 24, 3)
  opts = dict(OPTIONS[option])
  if opts.get("tau_plus") == "rows":
    opts["tau_plus"] = _tau_rows(b)
  elif opts.get("tau_plus") == "zeros":
    opts["tau_plus"] = jnp.zeros((b,), jnp.float32)
  t = opts.pop("temperature", 0.07)
  opts.update(margin=margin, use_qq_negatives=True)
  if not lit:
    opts["use_dd_negatives"] = True
  compare(_call(lit, backend, **opts), _ref(lit, **opts), [q, doc, h], temperature=t)


SHAPES = [(b, d) for b, d in itertools.product([1, 7, 129], [1, 16, 40, 72, 384])] + [
    (1000, 16), (1000, 384)]


# By default a third of the (backend, dtype, shape) product as a checkerboard; the
# interpreter at b = 1000 (20-120 s each on CPU) is slow (test_tiled_path runs several
# tiles and slabs of every group).
@pytest.mark.parametrize("backend,dtype,b,d", sampled(
    [(be, dt, b, d) for be in BACKENDS for dt in DTYPES for b, d in SHAPES],
    lambda i, c: not (c[0] == "interpret" and c[2] == 1000) and checkerboard(
        (c[0], BACKENDS), (c[1], DTYPES), ((c[2], c[3]), SHAPES), mod=3)))
def test_shapes(backend, dtype, b, d):
  q, doc, h = qwen3_batch(b + d, b, d, 2, dtype)
  # (no candidate within 16-bit rounding of the threshold: at the default margin, 0.1,
  # b = 1000, d = 16 has 25 within 2e-3, and the plain bf16 formula is off by 0.19 of
  # the largest gradient entry)
  opts = dict(use_qq_negatives=True, use_dd_negatives=True,
              margin=decisive_margin(q, doc, h, (d,), 0.1))
  compare(_call(False, backend, **opts), _ref(False, **opts), [q, doc, h], dtype=dtype,
          grad_floor=1 / 0.07 if d == 1 else 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_locked_gradients_are_exactly_zero(backend):
  q, doc, h = qwen3_batch(3, 30, 16, 4)
  gd, gh = jax.jit(jax.grad(lambda q, d, h: lit_qwen3_loss(
      q, d, h, use_qq_negatives=True, label_smoothing=0.1, backend=backend),
                            argnums=(1, 2)))(q, doc, h)
  np.testing.assert_array_equal(gd, 0.0)
  np.testing.assert_array_equal(gh, 0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats(backend):
  q, doc, h = qwen3_batch(5, 30, 16, 2)
  kw = dict(use_qq_negatives=True, tau_plus=0.1, lse_square_scale=0.01)
  (loss, st), (rloss, rst) = (qwen3_loss_with_stats(q, doc, h, backend=backend, **kw),
                              reference.qwen3_loss_with_stats(q, doc, h, **kw))
  np.testing.assert_allclose(loss, rloss, rtol=2e-5)
  np.testing.assert_allclose(st.z_loss, rst.z_loss, rtol=2e-5)
  np.testing.assert_allclose(st.lse_row, rst.lse_row, rtol=2e-5)
  assert st.lse_col is None
  l2, _ = lit_qwen3_loss_with_stats(q, doc, h, backend=backend, **kw)
  np.testing.assert_allclose(l2, reference.lit_qwen3_loss(q, doc, h, **kw), rtol=2e-5)


def test_mask_matters():
  # The batch has near-duplicates: margins that keep and drop them differ.
  q, doc, h = qwen3_batch(0, 33, 24, 2)
  a = qwen3_loss(q, doc, h, margin=0.05, use_qq_negatives=True, backend="blockwise")
  b = qwen3_loss(q, doc, h, margin=2.0, use_qq_negatives=True, backend="blockwise")
  assert float(a) < float(b) - 1e-2


# (backend, lit, dtype, dims, per_dim): margin = 0 keeps every exact tie (docs/math.md §6:
# s <= p + margin + 2^-10) on every backend, as the float64 reference does.
@pytest.mark.parametrize("backend,lit,dtype,dims,per_dim", [
    ("blockwise", True, jnp.float32, None, False),
    ("interpret", False, jnp.float32, None, False),
    ("blockwise", False, jnp.float32, None, False),
    ("interpret", True, jnp.float32, (8, 24), False),
    ("blockwise", False, jnp.float32, (8, 24), True),
    ("interpret", True, jnp.bfloat16, (8, 24), True),
])
def test_exact_ties_with_the_positive_are_kept(backend, lit, dtype, dims, per_dim):
  q, doc, h = with_exact_ties(12, 24, dtype)
  kw = dict(margin=0.0, use_qq_negatives=True, matryoshka_dims=dims)
  per = dict(matryoshka_per_dim=True) if per_dim else {}
  fn = lit_qwen3_loss if lit else qwen3_loss
  compare(lambda *a, **k: fn(*a, backend=backend, **per, **kw, **k),
          lambda *a, **k: fn(*a, backend="reference", **kw, **k), [q, doc, h], dtype=dtype)
