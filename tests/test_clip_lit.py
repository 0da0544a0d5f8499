"""clip_loss / lit_loss vs the dense reference: values and gradients w.r.t. both towers
and the temperature, under jit, over backend x dtype x shape x option."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memeff_jax import (_compat, clip_loss, clip_loss_with_stats, lit_loss, lit_loss_with_stats,
                        qwen3_loss, reference)
from tests.support.check import checkerboard, compare, kernel_path_config, sampled
from tests.support.data import decisive_margin, decisive_tau_plus, features, qwen3_batch
from tests.support.families import BACKENDS

LOSSES = {"clip": (clip_loss, reference.clip_loss), "lit": (lit_loss, reference.lit_loss)}
DTYPES = [jnp.float32, jnp.bfloat16]
BS, DS = [1, 7, 129, 1000], [1, 16, 40, 72, 384]
SHAPES = list(itertools.product(BS, DS))


# By default a checkerboard quarter of the product: on blockwise each loss and dtype sees
# every batch and feature size, on the interpreter every batch below 1000 and three or
# four of the five feature sizes. The interpreter at b = 1000 (8-35 s a case on CPU)
# runs one of its twenty cases; the rest are slow.
@pytest.mark.parametrize("loss,backend,dtype,b,d", sampled(
    [(loss, be, dt, b, d) for loss, be, dt, (b, d) in
     itertools.product(LOSSES, BACKENDS, DTYPES, SHAPES)],
    lambda i, c: c[0::2] == ("lit", jnp.bfloat16, 16) if (
        c[1] == "interpret" and c[3] == 1000) else checkerboard(
            (c[0], LOSSES), (c[1], BACKENDS), (c[2], DTYPES), (c[3], BS), (c[4], DS),
            mod=4)))
def test_shapes(loss, backend, dtype, b, d):
  fn, ref = LOSSES[loss]
  x, y = features(b * 1000 + d, [(b, d), (b, d)], dtype)
  compare(lambda *a, **k: fn(*a, backend=backend, **k), ref, [x, y], dtype=dtype,
          grad_floor=1 / 0.07 if d == 1 else 1e-6)


def _tau_rows(b):
  return jnp.asarray(np.random.default_rng(b).uniform(0.0, 0.6, b), jnp.float32)


OPTIONS = {
    "plain": {},
    "no_stable": dict(stable=False),
    "normalized": dict(normalized_inputs=True),
    "tau": dict(tau_plus=0.1),
    "tau_rows": dict(tau_plus="rows"),
    "tau_rows_zero": dict(tau_plus="zeros"),   # an array of zeros still debiases
    "smoothing": dict(label_smoothing=0.1),
    "zloss": dict(lse_square_scale=1e-3),
    "t_small": dict(temperature=0.01),
    "t_one": dict(temperature=1.0),
    "tau_smooth": dict(tau_plus=0.2, label_smoothing=0.2),
    "all": dict(tau_plus="rows", label_smoothing=0.05, lse_square_scale=1e-2, stable=False,
                temperature=0.05),
}


def _options(opts, b):
  opts = dict(opts)
  if opts.get("tau_plus") == "rows":
    opts["tau_plus"] = _tau_rows(b)
  elif opts.get("tau_plus") == "zeros":
    opts["tau_plus"] = jnp.zeros((b,), jnp.float32)
  return opts


# Every option of each loss on blockwise at b = 129 and on the interpreter at b = 7
# (the rest: slow).
@pytest.mark.parametrize("loss,backend,option,b,d", sampled(
    [(loss, be, opt, b, d) for loss, be, opt, (b, d) in
     itertools.product(LOSSES, BACKENDS, OPTIONS, [(7, 16), (129, 72)])],
    lambda i, c: c[3] == (129 if c[1] == "blockwise" else 7)))
def test_options(loss, backend, option, b, d):
  fn, ref = LOSSES[loss]
  opts = _options(OPTIONS[option], b)
  t = opts.pop("temperature", 0.07)
  x, y = features(b + d, [(b, d), (b, d)], jnp.float32)
  if opts.get("normalized_inputs"):
    x, y = x / jnp.linalg.norm(x, axis=-1, keepdims=True), y / jnp.linalg.norm(y, axis=-1,
                                                                                 keepdims=True)
  compare(lambda *a, **k: fn(*a, backend=backend, **k), ref, [x, y], temperature=t, **opts)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("option", ["tau_rows", "smoothing", "all"])
def test_options_low_precision(backend, dtype, option):
  b, d = 129, 72
  opts = _options(OPTIONS[option], b)
  t = opts.pop("temperature", 0.07)
  x, y = features(3, [(b, d), (b, d)], dtype)
  compare(lambda *a, **k: clip_loss(*a, backend=backend, **k), reference.clip_loss, [x, y],
          temperature=t, dtype=dtype, **opts)


def test_paired_fp16():
  # fp16 coefficient slabs (the paired default for 16-bit at d_pad > 512) into both
  # towers, with every option and several slabs, against the float64 reference.
  b, d = 129, 72
  opts = _options(OPTIONS["all"], b)
  t = opts.pop("temperature", 0.07)
  x, y = features(4, [(b, d), (b, d)], jnp.float16)
  cfg = kernel_path_config("paired", d, jnp.float16)
  compare(lambda *a, **k: clip_loss(*a, backend="interpret", config=cfg, **k),
          reference.clip_loss, [x, y], temperature=t, dtype=jnp.float16, **opts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lit_image_gradient_is_exactly_zero(backend):
  x, y = features(0, [(33, 24), (33, 24)], jnp.float32)
  g = jax.jit(jax.grad(lambda x, y: lit_loss(x, y, backend=backend, tau_plus=0.1,
                                              label_smoothing=0.1), argnums=1))(x, y)
  np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats(backend):
  x, y = features(1, [(50, 24), (50, 24)], jnp.float32)
  kw = dict(tau_plus=0.1, lse_square_scale=0.01)
  for fn, ref in [(clip_loss_with_stats, reference.clip_loss_with_stats),
                  (lit_loss_with_stats, reference.lit_loss_with_stats)]:
    (loss, st), (rloss, rst) = fn(x, y, backend=backend, **kw), ref(x, y, **kw)
    np.testing.assert_allclose(loss, rloss, rtol=2e-5)
    np.testing.assert_allclose(st.z_loss, rst.z_loss, rtol=2e-5)
    np.testing.assert_allclose(st.lse_row, rst.lse_row, rtol=2e-5)
    if rst.lse_col is None:
      assert st.lse_col is None
    else:
      np.testing.assert_allclose(st.lse_col, rst.lse_col, rtol=2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stable_factor(backend):
  b, t = 40, 0.05
  x, y = features(2, [(b, 16), (b, 16)], jnp.float32)
  f = lambda stable: jax.grad(lambda x, y, t: clip_loss(x, y, temperature=t, stable=stable,
                                                        backend=backend), argnums=(0, 1, 2))
  on, off = f(True)(x, y, t), f(False)(x, y, t)
  for a, c in zip(on, off):
    np.testing.assert_allclose(a, np.sqrt(b * t) * np.asarray(c), rtol=1e-4, atol=1e-8)
  # The largest temperature accepted, whose B t passes the largest float32 (the factor
  # sqrt(B t) = 5.7e19 does not): the value stays the loss's own (was NaN from inf * 0).
  t = 8e37
  with pytest.warns(UserWarning, match="looks like a logit scale"):
    on, off = (clip_loss(x, y, temperature=t, stable=s, backend=backend) for s in (True, False))
  assert np.isfinite(off) and on == off, (on, off)
  # Near the smallest temperature accepted the blockwise CLIP loss overflows to inf
  # (its two directions' row sums pass the largest float32 before the mean; the
  # reference's is 5.4e37): stable keeps that value too (was NaN from inf - inf).
  on, off = (clip_loss(x, y, temperature=2e-38, stable=s, backend=backend)
             for s in (True, False))
  assert not np.isnan(off) and on == off, (on, off)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["clip", "lit", "qwen3"])
def test_tma_descriptor_loads(monkeypatch, loss, dtype):
  # The FlashAttention-shaped gradient with its tiles loaded through TMA descriptors
  # (the default on Hopper with jax-triton >= 0.4): both softmax roles in a pass
  # (CLIP), the rows' only (LiT), the rows' then the columns' (Qwen3), the rows' alone
  # on their own wider column tiles, ragged last tiles (the copy engine's zero fill),
  # against the dense reference. Every softmax clear of the debiased clamp (at tau_plus
  # 0.1 CLIP's dense bf16 formula is 1.6x its largest gradient entry off float64) and,
  # for Qwen3, of the threshold (random pairs at the default margin, 0.1: 0.05).
  made = []

  class Tiles(_compat.Tiles):
    def __init__(self, base, block):
      super().__init__(base, block)
      made.append(block)

  monkeypatch.setattr(_compat, "Tiles", Tiles)
  fn, ref = {**LOSSES, "qwen3": (qwen3_loss, reference.qwen3_loss)}[loss]
  cfg = kernel_path_config("tma", 32, dtype)
  if loss == "qwen3":   # (queries with near-duplicates, so that the mask drops some)
    x, y = qwen3_batch(5, 150, 32, 0, dtype)[:2]
    kw = dict(margin=decisive_margin(x, y, None, (32,), 0.1))
  else:
    x, y = features(5, [(150, 32), (150, 32)], dtype)
    kw = dict(tau_plus=decisive_tau_plus(x, y, 0.07, 0.1, loss == "clip"))
  compare(lambda *a, **k: fn(*a, backend="interpret", config=cfg, **k), ref, [x, y],
          dtype=dtype, **kw)
  # (the descriptors were used, on each pass's tiles)
  assert set(made) == {(32, 32)} | ({(64, 32)} if loss != "clip" else set()), made


_PATHS = ("partials", "col_pass", "tiled", "tiled_paired", "paired", "tiled_col_pass",
          "tiled_paired_cols")
_PATH_SHAPES = ((1, 16), (150, 40))


# By default a checkerboard quarter: each path on both losses, dtypes and shapes.
@pytest.mark.parametrize("path,loss,dtype,b,d", sampled(
    [(p, loss, dt, b, d) for p, loss, dt, (b, d) in
     itertools.product(_PATHS, LOSSES, DTYPES, _PATH_SHAPES)],
    lambda i, c: checkerboard((c[0], _PATHS), (c[1], list(LOSSES)), (c[2], DTYPES),
                              (c[3:], _PATH_SHAPES), mod=4)))
def test_kernel_paths(path, loss, dtype, b, d):
  # Column log-normalizers from per-program partials, from a second row pass over the
  # swapped block (sweep or tiled), or from tiled slabs (row and column partials of
  # each GEMM tile, and a gradient from coefficient slabs times an XLA dot, both
  # towers' from the same slabs or each from its own, the slabs in column blocks; or
  # paired slabs under the FlashAttention-shaped defaults): the same numbers.
  fn, ref = LOSSES[loss]
  x, y = features(11 + b, [(b, d), (b, d)], dtype)
  cfg = kernel_path_config(path, d, dtype)
  # b = 1: no negatives to debias (tau_plus is then a ValueError, test_catalogue.py).
  compare(lambda *a, **k: fn(*a, backend="interpret", config=cfg, **k), ref, [x, y],
          dtype=dtype, tau_plus=0.1 if b > 1 else 0.0, label_smoothing=0.1,
          lse_square_scale=1e-3)
