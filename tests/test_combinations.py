"""Random combinations of a family's options, shapes and masks, drawn from a fixed seed:
the blockwise backend (and, for some, ``sharded`` on two devices) against the dense
reference in float64 (docs/math.md), every statistic and every gradient (the arrays',
the traced temperature's, SigLIP's traced bias and Qwen3's traced margin, whose
gradient is zero). The per-option tests take options one at a time or in chosen
pairs; these take them as a user might stack them. Eight draws run by default, the
rest with -m slow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from tests.support.check import sampled

N_DRAWS = 64
RTOL = 1e-10   # float64 on both sides: the blockwise sums against the dense ones


def _draw(i):
  """Draw i: (family, arrays as numpy float64, keyword options, through sharded?)."""
  r = np.random.default_rng(1000 + i)
  family = ["clip", "lit", "qwen3", "lit_qwen3", "siglip"][i % 5]
  b, d = int(r.integers(3, 33)), int(r.integers(2, 41))
  x = r.standard_normal((b, d))
  arrays = [x, x + r.uniform(0.3, 2.0) * r.standard_normal((b, d))]
  kw = dict(temperature=float(r.uniform(0.02, 1.0)), stable=bool(r.integers(2)))
  if r.random() < 0.3:   # a traced temperature (gets a gradient below either way)
    kw["temperature"] = jnp.float64(kw["temperature"])
  if r.random() < 0.35:
    dims = sorted(set(r.integers(1, d, size=int(r.integers(1, 4))).tolist()) | {d})
    kw.update(matryoshka_dims=tuple(dims),
              matryoshka_per_dim=[True, False, None][int(r.integers(3))])
    if r.random() < 0.5:
      kw["matryoshka_weights"] = tuple(r.uniform(0.1, 2.0, len(dims)).tolist())
  if r.random() < 0.3:   # at least 3 kept rows: negatives to debias
    keep = r.random(b) < 0.7
    keep[r.permutation(b)[:3]] = True
    kw["where"] = jnp.asarray(keep)
  if r.random() < 0.2:
    arrays = [a / np.linalg.norm(a, axis=-1, keepdims=True) for a in arrays]
    kw["normalized_inputs"] = True
  if family == "siglip":
    kw["bias"] = float(r.uniform(-10.0, 2.0))
    if r.random() < 0.5:
      kw["bias"] = jnp.float64(kw["bias"])
  else:
    if r.random() < 0.35:
      kw["tau_plus"] = (float(r.uniform(0.0, 0.4)) if r.random() < 0.6 else
                        jnp.asarray(r.uniform(0.0, 0.4, b)))
    if r.random() < 0.3:
      kw["label_smoothing"] = float(r.uniform(0.0, 0.5))
    if r.random() < 0.3:
      kw["lse_square_scale"] = float(r.uniform(0.0, 0.1))
    if r.random() < 0.25:
      kw["shared_negatives"] = r.standard_normal((int(r.integers(1, 21)), d))
  if family in ("qwen3", "lit_qwen3"):
    k = int(r.integers(0, 4))
    arrays.append(arrays[1][:, None] + r.standard_normal((b, k, d)) if k else None)
    kw["margin"] = float(r.uniform(0.0, 0.5))
    if r.random() < 0.3:
      kw["margin"] = jnp.float64(kw["margin"])
    flags = ["use_qq_negatives", "use_dq_negatives"] + (
        ["use_dd_negatives"] if family == "qwen3" else [])
    kw.update({f: bool(r.integers(2)) for f in flags})
    if not (kw["use_qq_negatives"] or kw.get("use_dd_negatives")) and r.random() < 0.5:
      kw["partition"] = "per_direction"
    kw["share_hard_negatives"] = bool(r.integers(2))
  ring = b >= 4 and r.random() < 0.25 and "where" not in kw
  if ring and "shared_negatives" in kw:   # sharded pads the batch, not these: even rows
    kw["shared_negatives"] = kw["shared_negatives"][:len(kw["shared_negatives"]) // 2 * 2]
  return family, arrays, kw, ring


def _draws():
  return [(i,) for i in range(N_DRAWS)]


def _traced(kw):
  """The options whose traced values get a gradient (here, jnp arrays)."""
  return {k: v for k, v in kw.items()
          if k in ("temperature", "bias", "margin") and isinstance(v, jax.Array)}


def _run(family, arrays, kw, backend, ring=False):
  fn = getattr(mj, f"{family}_loss_with_stats")
  if ring:
    fn = mj.sharded(fn, Mesh(np.array(jax.devices()[:2]), ("batch",)), "batch")
  given = [a for a in arrays if a is not None]
  positions = [i for i, a in enumerate(arrays) if a is not None]
  shared = kw.pop("shared_negatives", None)
  traced = _traced(kw)

  def loss(given, traced, shared):
    full = list(arrays)
    for i, a in zip(positions, given):
      full[i] = a
    extra = {} if shared is None else {"shared_negatives": shared}
    return fn(*full, **{**kw, **traced}, **extra, backend=backend)

  (value, stats), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
      [jnp.asarray(a) for a in given], traced, None if shared is None else jnp.asarray(shared))
  kw["shared_negatives"] = shared
  return value, stats, grads


@pytest.mark.parametrize("i", sampled(_draws(), lambda i, c: i % 8 == 0))
def test_random_combination_equals_the_reference(i):
  with jax.enable_x64(True):
    family, arrays, kw, ring = _draw(i)
    want = _run(family, arrays, dict(kw), "reference")
    got = _run(family, arrays, dict(kw), "blockwise", ring)
  note = f"draw {i}: {family} B={arrays[0].shape} ring={ring} {kw}"
  # (atol: a loss near 0 is a difference of terms up to 1 / t ~ 50: cancellation)
  np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=1e-12, err_msg=note)
  for name, a, b in zip(want[1]._fields, got[1], want[1]):
    assert (a is None) == (b is None), (name, note)
    if b is not None:
      # (the accuracies are float32 counts over the batch: one rounding apart at most)
      rtol = RTOL if jnp.asarray(b).dtype == jnp.float64 else 2e-7
      np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-12, err_msg=f"{name} {note}")
  flat_got, flat_want = jax.tree.leaves(got[2]), jax.tree.leaves(want[2])
  assert len(flat_got) == len(flat_want), note
  for g, w in zip(flat_got, flat_want):
    assert np.all(np.isfinite(g)), note
    scale = max(float(np.max(np.abs(w))), 1e-300)
    assert float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) <= RTOL * 10 * scale, note
