"""In-batch top-1 accuracy in every ``*_with_stats`` (``accuracy_row``, CLIP's
``accuracy_col``) against a dense numpy count: on every backend and kernel path,
with the Qwen3 mask and hard negatives, per Matryoshka dim, and through the ring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from tests.support.check import kernel_path_config
from tests.support.data import qwen3_batch
from tests.support.oracle import count_pairs, count_qwen3


def _unit(v):
  v = np.asarray(v, np.float64)
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _pairs(seed, b, d, noise):
  """Pairs whose positives win about half the time at this noise level."""
  r = np.random.default_rng(seed)
  x = r.standard_normal((b, d))
  y = x + noise * r.standard_normal((b, d))
  return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


CONFIGS = ["blockwise", "reference", "interpret", "partials", "col_pass", "tiled",
           "tiled_col_pass"]


def _backend(which, d):
  if which in ("blockwise", "reference", "interpret"):
    return dict(backend=which)
  return dict(backend="interpret", config=kernel_path_config(which, d, jnp.float32))


@pytest.mark.parametrize("which", CONFIGS)
def test_clip_and_lit(which):
  x, y = _pairs(0, 45, 24, 1.2)
  want_row, want_col = count_pairs(x, y)
  assert 0.2 < want_row < 0.9   # the test can fail both ways
  _, st = mj.clip_loss_with_stats(x, y, **_backend(which, 24))
  np.testing.assert_allclose([st.accuracy_row, st.accuracy_col], [want_row, want_col])
  _, st = mj.lit_loss_with_stats(x, y, **_backend(which, 24))
  np.testing.assert_allclose(st.accuracy_row, want_row)
  assert st.accuracy_col is None


@pytest.mark.parametrize("which", ["blockwise", "reference", "interpret", "tiled"])
@pytest.mark.parametrize("margin,qq,dd", [(0.05, True, True), (2.0, True, False),
                                          (0.1, False, False)])
def test_qwen3(which, margin, qq, dd):
  q, d, h = qwen3_batch(3, 40, 24, 3)
  want = count_qwen3(q, d, h, margin, qq, dd)
  _, st = mj.qwen3_loss_with_stats(q, d, h, margin=margin, use_qq_negatives=qq,
                                   use_dd_negatives=dd, **_backend(which, 24))
  np.testing.assert_allclose(st.accuracy_row, want)
  _, st = mj.lit_qwen3_loss_with_stats(q, d, h, margin=margin, use_qq_negatives=qq,
                                       **_backend(which, 24))
  np.testing.assert_allclose(st.accuracy_row, count_qwen3(q, d, h, margin, qq, False))


@pytest.mark.parametrize("which", ["blockwise", "reference", "interpret"])
def test_matryoshka_per_dim(which):
  x, y = _pairs(1, 33, 40, 1.0)
  dims = (8, 24, 40)
  _, st = mj.clip_loss_with_stats(x, y, matryoshka_dims=dims, **_backend(which, 40))
  want = np.array([count_pairs(x[:, :m], y[:, :m]) for m in dims])
  np.testing.assert_allclose(st.accuracy_row, want[:, 0])
  np.testing.assert_allclose(st.accuracy_col, want[:, 1])


@pytest.mark.parametrize("backend,n_dev", [("blockwise", 4), ("blockwise", 8), ("interpret", 2)])
def test_through_the_ring(backend, n_dev):
  x, y = _pairs(2, 32, 16, 1.1)
  mesh = Mesh(np.array(jax.devices()[:n_dev]), ("batch",))
  f = mj.sharded(lambda a, b, axis_name: mj.clip_loss_with_stats(
      a, b, axis_name=axis_name, backend=backend), mesh, "batch")
  _, st = jax.jit(f)(x, y)
  np.testing.assert_allclose([st.accuracy_row, st.accuracy_col], count_pairs(x, y))
  q, d, h = qwen3_batch(4, 32, 16, 2)
  g = mj.sharded(lambda a, b, c, axis_name: mj.qwen3_loss_with_stats(
      a, b, c, use_qq_negatives=True, margin=0.05, axis_name=axis_name, backend=backend),
      mesh, "batch")
  _, st = jax.jit(g)(q, d, h)
  np.testing.assert_allclose(st.accuracy_row, count_qwen3(q, d, h, 0.05, True, False))


@pytest.mark.parametrize("which", ["blockwise", "reference", "interpret", "tiled"])
def test_duplicates_tie_on_every_backend(which):
  # Duplicate columns and rows, and columns within the tie tolerance (1e-4 apart): a
  # tie is a miss wherever the kernels' tiles and the positive's dot round apart (they
  # did: blockwise and interpret counted some duplicates as hits). Oracle: the dense
  # count with the tolerance; the near ties make it differ from the strict count.
  x, y = _pairs(6, 24, 16, 0.6)
  r = np.random.default_rng(6)
  y = y.at[5].set(y[4]).at[9].set(y[8])
  for i in (12, 18, 20):
    y = y.at[i + 1].set(y[i] + 1e-4 * jnp.asarray(r.standard_normal(16), jnp.float32))
  x = x.at[15].set(x[14])
  want = count_pairs(x, y)
  s = _unit(x) @ _unit(y).T
  strict = np.mean(np.diag(s) > np.max(s - np.diag(np.full(24, np.inf)), axis=1))
  assert want[0] < min(0.9, strict), (want, strict)
  _, st = mj.clip_loss_with_stats(x, y, temperature=0.05, **_backend(which, 16))
  np.testing.assert_allclose([st.accuracy_row, st.accuracy_col], want)
  if which != "tiled":
    _, st = mj.siglip_loss_with_stats(x, y, temperature=1.0, bias=-2.0, **_backend(which, 16))
    np.testing.assert_allclose(st.accuracy_row, want[0])
  q, d, h = qwen3_batch(7, 20, 16, 2)
  d = d.at[3].set(d[2])
  _, st = mj.qwen3_loss_with_stats(q, d, h, margin=0.0, **_backend(which, 16))
  np.testing.assert_allclose(st.accuracy_row, count_qwen3(q, d, h, 0.0, False, False))


def test_no_gradient_through_accuracy():
  x, y = _pairs(5, 16, 8, 1.0)
  g = jax.grad(lambda a: mj.clip_loss_with_stats(a, y, backend="blockwise")[1].accuracy_row)(x)
  np.testing.assert_array_equal(g, 0.0)
