"""Fused Matryoshka (``matryoshka_dims``) on every loss and backend against the float64
reference (``reference.matryoshka_fused``), fused == eager in float64, ragged ladders,
bf16, the ring, the stats, validation, and the eager wrapper ``memeff_jax.matryoshka``.

The full product (family x option x ladder x backend) is marked ``slow``; a fixed
sample of it, covering every family, option, ladder and backend, runs by default.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from memeff_jax import reference
from tests.support.check import checkerboard, compare, jaxpr_eqns, kernel_path_config, sampled
from tests.support.data import features, qwen3_batch
from tests.support.families import BACKENDS, FAMILIES, eager_matryoshka

# (d, dims, weights): ragged ladders (no dim a multiple of 16), an aligned one with
# weights, a single dim (the whole vector, renormalized again).
LADDERS = {
    "48": (48, (8, 24, 48), None),
    "200": (200, (16, 72, 200), (0.5, 1.0, 2.0)),
    "64": (64, (16, 32, 64), (1.0, 0.25, 1.0)),
    "one": (40, (40,), None),
}
OPTIONS = {
    "plain": {},
    "tau": dict(tau_plus=0.1),
    "tau_rows": dict(tau_plus="rows"),
    "smoothing": dict(label_smoothing=0.1),
    "zloss": dict(lse_square_scale=1e-2),
    "normalized": dict(normalized_inputs=True),
    "all": dict(tau_plus="rows", label_smoothing=0.05, lse_square_scale=1e-2, stable=False,
                temperature=0.05),
}


def _arrays(family, b, d, dtype=jnp.float32, seed=0):
  if "qwen3" in family:
    q, doc, h = qwen3_batch(seed + d, b, d, 2, dtype)
    return [q, doc, h]
  return features(seed + d, [(b, d), (b, d)], dtype)


def _opts(option, b):
  opts = dict(OPTIONS[option])
  if opts.get("tau_plus") == "rows":
    opts["tau_plus"] = jnp.asarray(np.random.default_rng(b).uniform(0.0, 0.5, b), jnp.float32)
  return opts


def _fused(fn, dims, weights, **kw):
  return lambda *a, **k: fn(*a, matryoshka_dims=dims, matryoshka_weights=weights, **kw, **k)


def _ref(ref, dims, weights, **kw):
  return lambda *a, **k: reference.matryoshka_fused_with_stats(
      lambda *b, **c: ref(*b, **c), *a, dims=dims, weights=weights, **kw, **k)[0]


def _check(family, option, ladder, backend, dtype=jnp.float32, b=21, config=None,
           per_dim=False):
  fam = FAMILIES[family]
  fn, ref, fam_kw = fam.loss, fam.reference_with_stats, fam.options
  d, dims, weights = LADDERS[ladder]
  opts = _opts(option, b)
  t = opts.pop("temperature", 0.07)
  arrays = _arrays(family, b, d, dtype)
  if opts.get("normalized_inputs"):   # unit inputs; every prefix is renormalized anyway
    arrays = [reference.normalize(a) for a in arrays]
  kw = dict(matryoshka_per_dim=True) if per_dim else {}
  compare(_fused(fn, dims, weights, backend=backend, config=config, **kw, **fam_kw),
          (eager_matryoshka if per_dim else _ref)(ref, dims, weights, **fam_kw), arrays,
          temperature=t, dtype=dtype, **opts)


def _product():
  """Every (family, option, ladder, backend); by default a checkerboard eighth of them,
  in which each family, option, ladder and backend appears, and option "all" on ladder
  "48" for every family (on one backend each, alternating)."""
  return sampled(list(itertools.product(FAMILIES, OPTIONS, LADDERS, BACKENDS)),
                 lambda i, c: checkerboard((c[0], FAMILIES), (c[3], BACKENDS)) if c[1:3] == (
                     "all", "48") else checkerboard(
                         *zip(c, (FAMILIES, OPTIONS, LADDERS, BACKENDS)), mod=8))


@pytest.mark.parametrize("family,option,ladder,backend", _product())
def test_fused_vs_reference(family, option, ladder, backend):
  _check(family, option, ladder, backend)


# Two families, one on each backend (the rest: slow).
@pytest.mark.parametrize("family,backend", sampled(
    list(itertools.product(FAMILIES, BACKENDS)),
    lambda i, c: checkerboard(*zip(c, (FAMILIES, BACKENDS)), mod=4)))
def test_bf16(family, backend):
  _check(family, "smoothing", "64", backend, dtype=jnp.bfloat16, b=40)


@pytest.mark.parametrize("family", ["clip", "qwen3"])
def test_fp16_interpret(family):
  # fp16 on the FlashAttention-shaped gradient: the suffix-summed coefficients (scaled
  # by prefix tables >= 1) multiply in fp32, not cast to fp16.
  _check(family, "smoothing", "64", "interpret", dtype=jnp.float16, b=40)


# The paired paths only where both towers get a gradient (LiT would repeat another). By
# default each family and each path once (the rest: slow; 20-100 s a case on CPU).
_SEVERAL = {("clip", "tiled"), ("lit", "tiled"), ("lit_qwen3", "default"),
            ("qwen3", "tiled_paired"), ("clip", "paired"), ("clip", "tiled_paired_cols")}


@pytest.mark.parametrize("family,path", sampled(
    [(f, p) for f in FAMILIES for p in ("tiled", "default")] +
    [(f, p) for f in ("clip", "qwen3") for p in ("tiled_paired", "paired",
                                                  "tiled_paired_cols")],
    lambda i, c: c in _SEVERAL))
def test_interpret_several_tiles_and_slabs(family, path):
  # Batches spanning several row and column tiles and, with 1 KiB slabs, several slabs;
  # the ladder (16, 72, 200) is padded to 16-feature chunks. tiled_paired: both towers'
  # gradients from one set of coefficient slabs (suffix sums times x and y; _cols: the
  # slabs in column blocks); paired:
  # the same from the FlashAttention-shaped defaults (bwd_pair alone).
  fam = FAMILIES[family]
  fn, ref, fam_kw = fam.loss, fam.reference_with_stats, fam.options
  b, (d, dims, weights) = 70, LADDERS["200"]
  cfg = mj.default_config(d, jnp.float32, interpret=True)
  if path != "default":
    cfg = kernel_path_config(path, d, jnp.float32)
  compare(_fused(fn, dims, weights, backend="interpret", config=cfg, **fam_kw),
          _ref(ref, dims, weights, **fam_kw), _arrays(family, b, d), tau_plus=0.1,
          label_smoothing=0.1, lse_square_scale=1e-3)


# CLIP and LiT-Qwen3 by default (the rest: slow).
@pytest.mark.parametrize("family", sampled([(f,) for f in FAMILIES],
                                           lambda i, c: c[0] in ("clip", "lit_qwen3")))
def test_fused_equals_eager_in_float64(family):
  # Fused renormalizes the unit vectors' prefixes; eager normalizes the raw prefixes:
  # the same numbers in exact math, so equal to ~1e-12 in float64 (values and grads).
  fn, fam_kw = FAMILIES[family].loss, FAMILIES[family].options
  d, dims, weights = LADDERS["200"]
  kw = dict(fam_kw, backend="blockwise", tau_plus=0.1, label_smoothing=0.1,
            lse_square_scale=1e-2)
  with jax.enable_x64(True):
    arrays = [jnp.asarray(np.asarray(a, np.float64)) for a in _arrays(family, 13, d)]
    argnums = tuple(range(len(arrays)))
    fused = jax.value_and_grad(lambda *a: fn(*a, matryoshka_dims=dims,
                                             matryoshka_weights=weights, **kw),
                               argnums=argnums)(*arrays)
    eager = jax.value_and_grad(lambda *a: mj.matryoshka(fn, dims, weights)(*a, **kw),
                               argnums=argnums)(*arrays)
  # (measured, 2026-12-06: values within 4e-16 relative, gradients within 6.7e-16 of
  # their largest entry)
  np.testing.assert_allclose(fused[0], eager[0], rtol=1e-12)
  for a, b in zip(fused[1], eager[1]):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(np.max(np.abs(b)) + 1e-30))


def test_interpret_under_x64():
  # With jax_enable_x64 a launcher's single-slab offset (int32) met Python ints (int64)
  # in dynamic_update_slice and raised. Oracle: the float64 reference (compare).
  d, dims, weights = LADDERS["48"]
  with jax.enable_x64(True):
    compare(_fused(mj.clip_loss, dims, weights, backend="interpret"),
            _ref(reference.clip_loss_with_stats, dims, weights), _arrays("clip", 40, d))


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats(backend):
  d, dims, weights = LADDERS["64"]
  x, y = features(3, [(17, d), (17, d)], jnp.float32)
  kw = dict(tau_plus=0.1, lse_square_scale=1e-2, label_smoothing=0.1)
  loss, st = mj.clip_loss_with_stats(x, y, matryoshka_dims=dims, matryoshka_weights=weights,
                                     backend=backend, **kw)
  per_dim = [reference.clip_loss_with_stats(*[reference.normalize(reference.normalize(v)[:, :m])
                                              for v in (x, y)], **kw) for m in dims]
  np.testing.assert_allclose(st.matryoshka_losses, [l for l, _ in per_dim], rtol=2e-5)
  np.testing.assert_allclose(loss, np.dot(weights, st.matryoshka_losses), rtol=2e-6)
  np.testing.assert_allclose(st.z_loss, np.dot(weights, [s.z_loss for _, s in per_dim]),
                             rtol=2e-5)
  assert st.lse_row.shape == st.lse_col.shape == (len(dims), 17)
  np.testing.assert_allclose(st.lse_col, np.stack([s.lse_col for _, s in per_dim]), rtol=2e-5)
  assert mj.clip_loss_with_stats(x, y, backend=backend)[1].matryoshka_losses is None


def _mesh(n):
  return Mesh(np.array(jax.devices()[:n]), ("batch",))


# Every family on 2 devices with blockwise and the interpreter, CLIP also on 1, 4 and 8,
# by default (the rest: slow); the paired gradient where both towers get one, and one
# plain ring per dim, on 2 devices.
@pytest.mark.parametrize("family,n_dev,backend", sampled(
    [(f, n, be) for f in FAMILIES for n, be in [(1, "blockwise"), (2, "blockwise"),
                                                 (4, "blockwise"), (8, "blockwise"),
                                                 (2, "interpret")]] +
    [("clip", 2, "interpret_paired"), ("qwen3", 2, "interpret_paired")] +
    [("clip", 2, "blockwise_per_dim"), ("qwen3", 8, "blockwise_per_dim"),
     ("lit", 2, "interpret_per_dim"), ("lit_qwen3", 4, "interpret_per_dim")],
    lambda i, c: (c[1] == 2 or c[0] == "clip") if c[2] in ("blockwise", "interpret") else (
        c[1] == 2)))
def test_ring(family, n_dev, backend):
  # The travelling block carries its prefix tables; every device's loss and the
  # gradients equal one device's (interpret_paired: both towers' gradients of each hop
  # from one set of coefficient slabs; *_per_dim: one plain ring per dim).
  fn, fam_kw = FAMILIES[family].loss, FAMILIES[family].options
  d, dims, weights = LADDERS["48"]
  arrays = _arrays(family, 24, d)
  tau = jnp.asarray(np.random.default_rng(1).uniform(0.0, 0.4, 24), jnp.float32)
  kw = dict(fam_kw, backend=backend, matryoshka_dims=dims, matryoshka_weights=weights,
            label_smoothing=0.1, lse_square_scale=1e-2)
  if backend == "interpret_paired":
    kw.update(backend="interpret", config=kernel_path_config("tiled_paired", d, jnp.float32))
  elif backend.endswith("_per_dim"):
    be = backend.removesuffix("_per_dim")
    kw.update(backend=be, config=_base_config(be, d), matryoshka_per_dim=True)
  ring = mj.sharded(lambda *a, tau_plus, axis_name: fn(*a, tau_plus=tau_plus,
                                                       axis_name=axis_name, **kw),
                    _mesh(n_dev), "batch")
  argnums = tuple(range(len(arrays)))
  got = jax.jit(jax.value_and_grad(lambda *a: ring(*a, tau_plus=tau), argnums=argnums))(*arrays)
  want = jax.jit(jax.value_and_grad(lambda *a: fn(*a, tau_plus=tau, **kw),
                                    argnums=argnums))(*arrays)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-6)
  for a, b in zip(got[1], want[1]):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * float(np.max(np.abs(b)) + 1e-30))


def test_eager_slices_hard_negatives_by_keyword_and_not_tau():
  # memeff's two pitfalls: hard negatives passed by keyword were not sliced, a per-row
  # tau passed positionally was. Here: keyword hard negatives are sliced, tau never.
  q, doc, h = qwen3_batch(0, 12, 24, 3)
  tau = jnp.linspace(0.0, 0.3, 12)
  dims = (8, 24)
  kw = dict(backend="blockwise", use_qq_negatives=True, tau_plus=tau)
  got = mj.matryoshka(mj.qwen3_loss, dims)(q, doc, hard_negatives=h, **kw)
  want = sum(reference.qwen3_loss(q[:, :m], doc[:, :m], h[..., :m], use_qq_negatives=True,
                                  tau_plus=tau) for m in dims)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_eager_slices_every_feature_array_passed_by_name():
  # The towers by their parameter names are sliced as positional ones (they were passed
  # through whole, after an IndexError on the missing positional array); oracle: the
  # dense reference on each dim's slices.
  q, doc, h = qwen3_batch(1, 12, 24, 2)
  dims = (8, 24)
  got = mj.matryoshka(mj.qwen3_loss, dims)(query_features=q, doc_features=doc,
                                            hard_negatives=h, backend="blockwise")
  want = sum(reference.qwen3_loss(q[:, :m], doc[:, :m], h[..., :m]) for m in dims)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  got = mj.matryoshka(mj.clip_loss, dims)(q, text_features=doc, backend="blockwise")
  want = sum(reference.clip_loss(q[:, :m], doc[:, :m]) for m in dims)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_eager_slices_shared_negatives_by_keyword():
  # shared_negatives= (every query's extra columns, [n, d]) by keyword is sliced as it is
  # positionally; oracle: the dense reference on each dim's slices.
  x, y, sn = features(9, [(10, 24), (10, 24), (7, 24)], jnp.float32)
  dims = (8, 24)
  for fn, ref in ((mj.clip_loss, reference.clip_loss), (mj.qwen3_loss, reference.qwen3_loss)):
    got = mj.matryoshka(fn, dims)(x, y, shared_negatives=sn, backend="blockwise")
    want = sum(ref(x[:, :m], y[:, :m], shared_negatives=sn[:, :m]) for m in dims)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_eager_around_sharded_and_prefix_of_d():
  # The eager wrapper around the ring; dims[-1] < d leaves the tail without gradient.
  x, y = features(5, [(16, 24), (16, 24)], jnp.float32)
  ring = mj.sharded(lambda a, b, axis_name: mj.clip_loss(a, b, axis_name=axis_name,
                                                         backend="blockwise"), _mesh(4), "batch")
  f = mj.matryoshka(ring, (8, 16))
  got, g = jax.jit(jax.value_and_grad(f))(x, y)
  want = sum(reference.clip_loss(x[:, :m], y[:, :m]) for m in (8, 16))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_array_equal(g[:, 16:], 0.0)


def test_matryoshka_weights_scale_linearly():
  x, y = features(6, [(9, 16), (9, 16)], jnp.float32)
  f = lambda w: mj.clip_loss(x, y, matryoshka_dims=(4, 16), matryoshka_weights=w,
                             backend="blockwise")
  np.testing.assert_allclose(f((2.0, 0.0)) + f((0.0, 3.0)), f((2.0, 3.0)), rtol=1e-5)


def _base_config(backend, d, dtype=jnp.float32):
  return (mj.KernelConfig() if backend == "blockwise" else
          mj.default_config(d, dtype, interpret=True))


# One plain block per dim on each dim's renormalized prefixes (the GPU default),
# against the eager reference (see eager_matryoshka). Three of the first five run by
# default (each backend, the one-dim and the longest ladder).
@pytest.mark.parametrize("family,option,ladder,backend", sampled([
    ("clip", "all", "48", "interpret"), ("lit", "tau_rows", "200", "blockwise"),
    ("qwen3", "smoothing", "200", "interpret"), ("lit_qwen3", "zloss", "64", "interpret"),
    ("qwen3", "normalized", "one", "blockwise"), ("clip", "plain", "64", "blockwise"),
    ("lit", "all", "one", "interpret"), ("lit_qwen3", "tau", "48", "blockwise")],
    lambda i, _: i in (0, 1, 4)))
def test_per_dim_vs_reference(family, option, ladder, backend):
  _check(family, option, ladder, backend, config=_base_config(backend, LADDERS[ladder][0]),
         per_dim=True)


@pytest.mark.parametrize("family", ["clip", "qwen3"])
def test_per_dim_bf16(family):
  _check(family, "smoothing", "64", "interpret", dtype=jnp.bfloat16, b=40,
         config=_base_config("interpret", 64, jnp.bfloat16), per_dim=True)


def test_per_dim_equals_one_block_with_where_and_stats():
  # where= and every stat (per-dim losses, lse, accuracy) as the one-block path gives them.
  kw = FAMILIES["qwen3"].options
  d, dims, weights = LADDERS["200"]
  arrays = _arrays("qwen3", 30, d)
  w = np.ones(30, bool)
  w[5:9] = False
  run = lambda per_dim: jax.value_and_grad(
      lambda *a: mj.qwen3_loss_with_stats(
          *a, matryoshka_dims=dims, where=w, matryoshka_weights=weights, backend="blockwise",
          matryoshka_per_dim=per_dim, tau_plus=0.1, **kw),
      argnums=(0, 1, 2), has_aux=True)(*arrays)
  want, got = run(False), run(True)
  assert got[0][1].matryoshka_losses.shape == (len(dims),)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("per_dim,axis,blocks", [(False, None, 1), (True, None, 3),
                                                 (False, "batch", 1), (True, "batch", 3)])
def test_per_dim_block_count(per_dim, axis, blocks):
  # matryoshka_per_dim: K kernel blocks (rings with an axis), else one for all dims.
  x, y = features(0, [(8, 48), (8, 48)], jnp.float32)
  kw = dict(matryoshka_dims=LADDERS["48"][1], backend="blockwise",
            matryoshka_per_dim=per_dim)
  if axis is None:
    fn = lambda a, b: mj.clip_loss(a, b, **kw)
  else:
    mesh = Mesh(np.array(jax.devices()[:1]), (axis,))
    fn = mj.sharded(lambda a, b, axis_name: mj.clip_loss(a, b, axis_name=axis_name, **kw),
                    mesh, axis)
  # The block op is a jit named "op".
  eqns = jaxpr_eqns(jax.make_jaxpr(fn)(x, y).jaxpr)
  assert sum(e.params.get("name") == "op" for e in eqns) == blocks
