"""``matryoshka_per_dim``: a loss keyword (one plain block per Matryoshka dim, or one
block for every dim; None: the backend's default). The config's
``algorithm.matryoshka_per_dim`` still works for a release: it gives the same bits,
with a DeprecationWarning where it decides, and a ValueError where it contradicts the
keyword (docs/math.md §8.1, memeff_jax/config/matryoshka.py ``per_dim_choice``)."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import memeff_jax as mj
from memeff_jax import KernelConfig
from memeff_jax.config import Algorithm
from tests.support.check import checkerboard, jaxpr_eqns, sampled
from tests.support.data import features, qwen3_batch
from tests.support.families import BACKENDS, FAMILIES

D, DIMS = 24, (8, 24)
LOSSES = [mj.clip_loss, mj.lit_loss, mj.qwen3_loss, mj.lit_qwen3_loss]


def _arrays(family):
  if family == "qwen3":
    return list(qwen3_batch(1, 8, D, 2))
  return features(0, [(8, D), (8, D)], jnp.float32)


def _default(backend):
  return mj.default_config(D, jnp.float32, interpret=backend == "interpret")


def _run(family, backend, **kw):
  """The jitted loss, its stats and the gradients of every array, under ``kw``."""
  fam = FAMILIES[family]
  fn = lambda *a: fam.with_stats(*a, matryoshka_dims=DIMS, backend=backend, **fam.options,
                                 **kw)
  arrays = _arrays(family)
  return jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(arrays))), has_aux=True))(
      *arrays)


_SPELLINGS = ((True, "bare"), (True, "default"), (False, "default"))


# By default a checkerboard half: each spelling on both families and both backends.
@pytest.mark.parametrize("backend,family,per_dim,base", sampled(
    [(be, f, p, b) for be in BACKENDS for f in ("clip", "qwen3") for p, b in _SPELLINGS],
    lambda i, c: checkerboard((c[0], BACKENDS), (c[1], ("clip", "qwen3")),
                              (c[2:], _SPELLINGS))))
def test_keyword_equals_the_config_spelling_bit_for_bit(backend, family, per_dim, base):
  # bare: KernelConfig(algorithm=Algorithm(matryoshka_per_dim=...)) against the keyword
  # with KernelConfig() (the same tiles); default: the backend's default config with the
  # field replaced against the keyword alone (config=None).
  if base == "bare":
    old = KernelConfig(algorithm=Algorithm(matryoshka_per_dim=per_dim))
    new = dict(config=KernelConfig())
  else:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)   # the flat replace
      old = dataclasses.replace(_default(backend), matryoshka_per_dim=per_dim)
    new = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    want = _run(family, backend, config=old)
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)   # the keyword never warns
    got = _run(family, backend, matryoshka_per_dim=per_dim, **new)
  leaves = jax.tree.leaves(got)
  assert len(leaves) == len(jax.tree.leaves(want)) >= 6
  for a, b in zip(leaves, jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)


def _blocks(**kw):
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  fn = lambda a, b: mj.clip_loss(a, b, matryoshka_dims=DIMS, backend="blockwise", **kw)
  return sum(e.params.get("name") == "op" for e in jaxpr_eqns(jax.make_jaxpr(fn)(x, y).jaxpr))


def test_keyword_picks_the_form():
  # The block op is a jit named "op": one per dim, or one for every dim.
  assert _blocks(matryoshka_per_dim=True) == len(DIMS)
  assert _blocks(matryoshka_per_dim=False) == _blocks() == 1   # blockwise: one block
  # A config's field that the field's own default explains (False) gives way.
  assert _blocks(matryoshka_per_dim=True, config=KernelConfig()) == len(DIMS)


@pytest.mark.parametrize("spell", ["grouped", "evolve", "flat"])
def test_config_spelling_warns_where_it_decides(spell):
  cfg = {"grouped": lambda: KernelConfig(algorithm=Algorithm(matryoshka_per_dim=True)),
         "evolve": lambda: KernelConfig().evolve(algorithm=dict(matryoshka_per_dim=True)),
         "flat": lambda: KernelConfig(matryoshka_per_dim=True)}[spell]
  if spell == "flat":
    with pytest.warns(DeprecationWarning, match="flat spellings are deprecated.*pass it to "
                                                "the loss \\(matryoshka_per_dim=...\\)"):
      config = cfg()
  else:
    with warnings.catch_warnings():   # the grouped spellings still construct silently
      warnings.simplefilter("error", DeprecationWarning)
      config = cfg()
  with pytest.warns(DeprecationWarning, match="config.algorithm.matryoshka_per_dim=True runs "
                    "one plain block per dim.*pass matryoshka_per_dim=True to the loss") as rec:
    assert _blocks(config=config) == len(DIMS)   # the config still decides
  assert rec[0].filename == __file__   # the warning points at the loss's caller


@pytest.mark.parametrize("kw", [
    dict(matryoshka_per_dim=True),
    dict(config=KernelConfig()),   # blockwise's default value: the config chooses nothing
    # A config that chooses, agreeing with the keyword (the GPU default's True).
    dict(config=mj.default_config(D, jnp.float32), matryoshka_per_dim=True),
    dict(config=KernelConfig(algorithm=Algorithm(matryoshka_per_dim=True)),
         matryoshka_per_dim=True),
])
def test_no_warning_where_the_config_decides_nothing(kw):
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    _blocks(**kw)
    # Without matryoshka_dims the field has no effect: no warning either.
    x, y = features(0, [(8, D), (8, D)], jnp.float32)
    mj.clip_loss(x, y, backend="blockwise",
                 config=KernelConfig(algorithm=Algorithm(matryoshka_per_dim=True)))


@pytest.mark.parametrize("fn", LOSSES, ids=lambda f: f.__name__)
def test_conflict_with_the_config_raises_naming_both(fn):
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  with pytest.raises(ValueError, match="matryoshka_per_dim=False and "
                     "config.algorithm.matryoshka_per_dim=True disagree"):
    fn(x, y, matryoshka_dims=DIMS, matryoshka_per_dim=False, backend="blockwise",
       config=KernelConfig(algorithm=Algorithm(matryoshka_per_dim=True)))


@pytest.mark.parametrize("fn", LOSSES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [1, "True", np.bool_(True), jnp.asarray(True)])
def test_type_error_names_the_argument(fn, bad):
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  with pytest.raises(TypeError, match="matryoshka_per_dim must be a bool or None, got "
                                      "matryoshka_per_dim="):
    fn(x, y, matryoshka_dims=DIMS, matryoshka_per_dim=bad, backend="blockwise")


@pytest.mark.parametrize("fn", LOSSES, ids=lambda f: f.__name__)
def test_needs_matryoshka_dims(fn):
  # As matryoshka_weights: without dims the option means nothing, so it raises.
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  with pytest.raises(ValueError, match="matryoshka_per_dim needs matryoshka_dims, got "
                                       "matryoshka_per_dim=False"):
    fn(x, y, matryoshka_per_dim=False, backend="blockwise")
  fn(x, y, matryoshka_per_dim=None, backend="blockwise")   # None is the default


def test_reference_ignores_it():
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  run = lambda **kw: mj.clip_loss(x, y, matryoshka_dims=DIMS, backend="reference", **kw)
  np.testing.assert_array_equal(run(matryoshka_per_dim=True), run())


def test_flax_modules_take_it():
  pytest.importorskip("flax")
  from memeff_jax import linen, nnx  # pylint: disable=g-import-not-at-top
  x, y = features(0, [(8, D), (8, D)], jnp.float32)
  kw = dict(matryoshka_dims=DIMS, backend="blockwise")
  want = mj.clip_loss(x, y, matryoshka_per_dim=True, **kw)
  module = nnx.CLIPLoss(matryoshka_per_dim=True, learnable=False, **kw)
  np.testing.assert_array_equal(module(x, y), want)
  lin = linen.CLIPLoss(matryoshka_per_dim=True, learnable=False, **kw)
  np.testing.assert_array_equal(lin.apply(lin.init(jax.random.key(0), x, y), x, y), want)
  for cls in (nnx.CLIPLoss, linen.CLIPLoss):
    with pytest.raises(TypeError, match="matryoshka_per_dim must be a bool or None"):
      cls(matryoshka_per_dim="yes", **kw)


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
def test_one_full_dim_equals_the_plain_loss_in_bf16(family):
  # One dim equal to D: each block reads the same rounded unit vectors as the plain
  # loss, so the losses agree to fp32 rounding and the label-smoothing correction (a
  # difference of two sums, exactly zero for one pair) cancels as it does there: the
  # glue's sums read the blocks' own prefixes, and their cotangents round once. Before,
  # they read the full rows' rounding: 3.5% off in value for B = 1 (the GPU test
  # test_matryoshka_triton[...-1-16-...-bfloat16-...]), ~5% in the gradient.
  fam = FAMILIES[family]
  b = 1 if "lit" in family or family == "clip" else 2
  arrays = (list(qwen3_batch(b, b, 16, 2, jnp.bfloat16)) if "qwen3" in family else
            features(17, [(b, 16), (b, 16)], jnp.bfloat16))
  kw = dict(fam.options, temperature=0.07, label_smoothing=0.1, lse_square_scale=1e-3,
            backend="blockwise")
  n = len(arrays)
  go = lambda **k: jax.value_and_grad(lambda *a: fam.loss(*a, **kw, **k), argnums=tuple(
      range(n)))(*arrays)
  v0, g0 = go()
  v1, g1 = go(matryoshka_dims=(16,), matryoshka_weights=(1.0,), matryoshka_per_dim=True)
  assert abs(float(v1) - float(v0)) <= 1e-6 * abs(float(v0)), (float(v0), float(v1))
  for a, c in zip(g0, g1):   # one bf16 ulp of the largest entry
    a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
    assert np.max(np.abs(a - c)) <= 2 ** -8 * np.max(np.abs(a)), (a, c)
