"""memeff_jax.nnx and memeff_jax.linen: the loss modules train with optax, their
learnable temperature gets a gradient and moves, and each module's loss equals the
functional loss at the module's temperature; SigLIPLoss's temperature and bias, values
and gradients, equal the float64 reference's. Small shapes, blockwise backend only."""

import functools
import math
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

flax = pytest.importorskip("flax")
from flax import nnx  # noqa: E402  pylint: disable=g-import-not-at-top
import flax.linen as nn  # noqa: E402  pylint: disable=g-import-not-at-top

import memeff_jax as mj  # noqa: E402  pylint: disable=g-import-not-at-top
from memeff_jax import _wrappers  # noqa: E402  pylint: disable=g-import-not-at-top
from memeff_jax import linen as mlinen  # noqa: E402  pylint: disable=g-import-not-at-top
from memeff_jax import nnx as mnnx  # noqa: E402  pylint: disable=g-import-not-at-top
from tests.support.data import towers  # noqa: E402  pylint: disable=g-import-not-at-top
from tests.support.families import FAMILIES  # noqa: E402  pylint: disable=g-import-not-at-top

B, D, K = 8, 16, 2
STEPS = 3

# family -> its loss module's non-default options (a dropped or renamed one shows: in the
# value, or for ``stable=``, which scales the gradients alone, in the gradients; on this
# data every margin from 0.05 up masks the same pairs as the default 0.1, 0.02 fewer).
OPTIONS = {
    "clip": dict(tau_plus=0.05, label_smoothing=0.1, lse_square_scale=1e-3),
    "lit": dict(label_smoothing=0.05, stable=False),
    "qwen3": dict(margin=0.02, use_qq_negatives=True, use_dd_negatives=True),
    "lit_qwen3": dict(use_qq_negatives=True, lse_square_scale=1e-3),
}
FRAMEWORKS = ("nnx", "linen")


# x, y, hard negatives [B, K, D] and a per-row tau_plus.
_data = functools.partial(towers, B, D, noise=1.0, k=K, tau_max=0.3)


def _spec(family):
  """(module name, *_with_stats function, number of arrays, options) of ``family``."""
  f = FAMILIES[family]
  return f"{f.class_name}Loss", f.with_stats, f.n_arrays, OPTIONS[family]


def _assert_tree_close(a, b, rtol=1e-6):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-7)


# --- NNX ------------------------------------------------------------------------------


class NnxModel(nnx.Module):
  """A linear encoder per tower and the loss module holding the temperature."""

  def __init__(self, loss: nnx.Module, *, rngs: nnx.Rngs):
    self.x_proj = nnx.Linear(D, D, rngs=rngs)
    self.y_proj = nnx.Linear(D, D, rngs=rngs)
    self.loss = loss

  def __call__(self, x, y, *rest):
    return self.loss.with_stats(self.x_proj(x), self.y_proj(y), *[self.y_proj(h) for h in rest])


@nnx.jit
def _nnx_step(model, optimizer, arrays):
  (loss, _), grads = nnx.value_and_grad(lambda m: m(*arrays), has_aux=True)(model)
  optimizer.update(model, grads)
  return loss, grads


def _nnx_loss(family, **kw):
  name, _, _, opts = _spec(family)
  return getattr(mnnx, name)(**dict(opts, backend="blockwise", **kw))


@pytest.mark.parametrize("family", FAMILIES)
def test_nnx_trains_the_temperature(family):
  arrays = _data()[:_spec(family)[2]]
  model = NnxModel(_nnx_loss(family), rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
  t0 = float(model.loss.current_temperature())
  assert math.isclose(t0, 0.07, rel_tol=1e-6)
  losses = []
  for _ in range(STEPS):
    loss, grads = _nnx_step(model, optimizer, arrays)
    g = grads["loss"]["logit_scale"][...]
    assert np.isfinite(g) and g != 0
    losses.append(float(loss))
  assert losses[-1] < losses[0]
  assert abs(float(model.loss.current_temperature()) - t0) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_nnx_equals_function(family):
  name, fn, n, opts = _spec(family)
  x, y, h, tau = _data()
  arrays = [x, y, h][:n]
  loss = getattr(mnnx, name)(temperature=0.1, **opts, backend="blockwise")
  loss.logit_scale[...] = jnp.float32(math.log(1 / 0.08))   # as if trained

  @nnx.jit
  def run(loss, arrays, tau):
    t = loss.current_temperature()
    value, grads = jax.value_and_grad(lambda a: loss(*a))(arrays)
    want, want_grads = jax.value_and_grad(
        lambda a: fn(*a, temperature=t, **opts, backend="blockwise"), has_aux=True)(arrays)
    return (t, value, loss.with_stats(*arrays), loss(*arrays, tau_plus=tau), want,
            fn(*arrays, temperature=t, **dict(opts, tau_plus=tau), backend="blockwise"),
            grads, want_grads)

  t, value, (value_s, stats), value_tau, want, want_tau, grads, want_grads = run(
      loss, arrays, tau)
  np.testing.assert_allclose(t, 0.08, rtol=1e-6)
  np.testing.assert_allclose(value, want[0], rtol=1e-6)
  np.testing.assert_allclose(value_s, want[0], rtol=1e-6)
  _assert_tree_close(stats, want[1])
  np.testing.assert_allclose(value_tau, want_tau[0], rtol=1e-6)
  _assert_tree_close(grads, want_grads, rtol=1e-5)


def test_nnx_fixed_temperature():
  x, y, _, _ = _data()
  model = NnxModel(_nnx_loss("clip", temperature=0.05, learnable=False), rngs=nnx.Rngs(0))
  assert not isinstance(model.loss.logit_scale, nnx.Param)
  assert "logit_scale" not in nnx.state(model.loss, nnx.Param)
  optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
  for _ in range(2):
    _, grads = _nnx_step(model, optimizer, (x, y))
  assert "loss" not in grads   # the loss module has no Param left to differentiate
  np.testing.assert_allclose(model.loss.current_temperature(), 0.05, rtol=1e-6)


def test_nnx_matryoshka_options_are_forwarded():
  x, y, _, _ = _data()
  loss = mnnx.CLIPLoss(matryoshka_dims=[8, 16], matryoshka_weights=[1.0, 0.5],
                       backend="blockwise")
  assert loss.matryoshka_dims == (8, 16)

  @nnx.jit
  def run(loss):
    return loss(x, y), mj.clip_loss(x, y, temperature=loss.current_temperature(),
                                    matryoshka_dims=(8, 16), matryoshka_weights=(1.0, 0.5),
                                    backend="blockwise")

  got, want = run(loss)
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --- Linen ----------------------------------------------------------------------------


class LinenModel(nn.Module):
  """A linear encoder per tower and the loss module as a submodule."""

  loss: nn.Module

  @nn.compact
  def __call__(self, x, y, *rest):
    x_proj, y_proj = nn.Dense(D, name="x_proj"), nn.Dense(D, name="y_proj")
    return self.loss.with_stats(x_proj(x), y_proj(y), *[y_proj(h) for h in rest])


def _linen_loss(family, **kw):
  name, _, _, opts = _spec(family)
  return getattr(mlinen, name)(**dict(opts, backend="blockwise", **kw))


def _linen_train(model, arrays, steps=STEPS):
  params = jax.jit(model.init)(jax.random.key(0), *arrays)["params"]
  tx = optax.adam(3e-2)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    (loss, _), grads = jax.value_and_grad(
        lambda p: model.apply({"params": p}, *arrays), has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  history = []
  for _ in range(steps):
    params, opt_state, loss, grads = step(params, opt_state)
    history.append((float(loss), grads))
  return params, history


@pytest.mark.parametrize("family", FAMILIES)
def test_linen_trains_the_temperature(family):
  arrays = _data()[:_spec(family)[2]]
  loss_module = _linen_loss(family)
  params, history = _linen_train(LinenModel(loss_module), arrays)
  for _, grads in history:
    g = grads["loss"]["logit_scale"]
    assert np.isfinite(g) and g != 0
  assert history[-1][0] < history[0][0]
  t = loss_module.apply({"params": params["loss"]}, method="current_temperature")
  assert abs(float(t) - 0.07) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_linen_equals_function(family):
  name, fn, n, opts = _spec(family)
  x, y, h, tau = _data()
  arrays = [x, y, h][:n]
  loss = getattr(mlinen, name)(temperature=0.1, **opts, backend="blockwise")
  variables = {"params": {"logit_scale": jnp.float32(math.log(1 / 0.08))}}  # as if trained

  @jax.jit
  def run(variables, arrays, tau):
    t = loss.apply(variables, method="current_temperature")
    value, grads = jax.value_and_grad(lambda a: loss.apply(variables, *a))(arrays)
    want, want_grads = jax.value_and_grad(
        lambda a: fn(*a, temperature=t, **opts, backend="blockwise"), has_aux=True)(arrays)
    return (t, value, loss.apply(variables, *arrays, method="with_stats"),
            loss.apply(variables, *arrays, tau_plus=tau), want,
            fn(*arrays, temperature=t, **dict(opts, tau_plus=tau), backend="blockwise"),
            grads, want_grads)

  t, value, (value_s, stats), value_tau, want, want_tau, grads, want_grads = run(
      variables, arrays, tau)
  np.testing.assert_allclose(t, 0.08, rtol=1e-6)
  np.testing.assert_allclose(value, want[0], rtol=1e-6)
  np.testing.assert_allclose(value_s, want[0], rtol=1e-6)
  _assert_tree_close(stats, want[1])
  np.testing.assert_allclose(value_tau, want_tau[0], rtol=1e-6)
  _assert_tree_close(grads, want_grads, rtol=1e-5)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_loss_has_the_features_dtype(framework):
  # The modules' docstrings: a float32 scalar, float64 for float64 features (the
  # parameters stay float32). Each against the dense reference at the module's
  # temperature (and bias) in float64: 1e-12.
  x, y = _data()[:2]
  with jax.enable_x64(True):
    for name in ("CLIPLoss", "SigLIPLoss"):
      for dtype in (jnp.float32, jnp.float64):
        a, b = (jnp.asarray(v, dtype) for v in (x, y))
        if framework == "nnx":
          module = getattr(mnnx, name)(backend="blockwise")
          value, (value_s, _) = module(a, b), module.with_stats(a, b)
          t = module.current_temperature()
          params = {"bias": module.logit_bias[...]} if name == "SigLIPLoss" else {}
        else:
          module = getattr(mlinen, name)(backend="blockwise")
          variables = module.init(jax.random.key(0), a, b)
          value = module.apply(variables, a, b)
          value_s, _ = module.apply(variables, a, b, method="with_stats")
          t = module.apply(variables, method="current_temperature")
          params = ({"bias": variables["params"]["logit_bias"]} if name == "SigLIPLoss"
                    else {})
        ref = mj.reference.siglip_loss if name == "SigLIPLoss" else mj.reference.clip_loss
        want = ref(*(jnp.asarray(v, jnp.float64) for v in (a, b)),
                   temperature=jnp.float64(t),
                   **{k: jnp.float64(v) for k, v in params.items()})
        for got in (value, value_s):
          assert got.dtype == dtype, (name, dtype, got.dtype)
          np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == jnp.float64 else 1e-5,
                                     err_msg=f"{name} {dtype}")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_param_dtype(framework):
  # param_dtype=float64 (x64): the parameters, the temperature and their gradients are
  # float64, and the gradients equal those of the dense float64 reference at the same
  # parameters (1e-12), where float32 parameters round the log-scale (the default stays
  # float32). A dtype that is no float raises at construction, naming it.
  x, y = _data()[:2]
  with jax.enable_x64(True):
    a, b = (jnp.asarray(v, jnp.float64) for v in (x, y))
    for name, ref in (("CLIPLoss", mj.reference.clip_loss),
                      ("SigLIPLoss", mj.reference.siglip_loss)):
      for dtype in (jnp.float64, jnp.float32):
        kw = dict(backend="blockwise", temperature=0.07, **({} if dtype == jnp.float32 else
                                                             dict(param_dtype=dtype)))
        if framework == "nnx":
          module = getattr(mnnx, name)(**kw)
          params = {k: v[...] for k, v in nnx.state(module, nnx.Param).items()}
          grads = nnx.grad(lambda m: m(a, b))(module)
          grads = {k: v[...] for k, v in grads.items()}
        else:
          module = getattr(mlinen, name)(**kw)
          params = module.init(jax.random.key(0), a, b)["params"]
          grads = jax.grad(lambda p: module.apply({"params": p}, a, b))(params)

        def want(p):
          extra = {"bias": p["logit_bias"]} if name == "SigLIPLoss" else {}
          return ref(a, b, temperature=jnp.exp(-p["logit_scale"]), **extra)
        want_grads = jax.grad(want)({k: jnp.float64(v) for k, v in params.items()})
        if framework == "nnx":
          assert module.param_dtype == dtype
        for k in params:
          assert params[k].dtype == grads[k].dtype == dtype, (name, k, dtype)
          np.testing.assert_allclose(grads[k], want_grads[k],
                                     rtol=1e-12 if dtype == jnp.float64 else 1e-5,
                                     err_msg=f"{name} {k} {dtype}")
  make = (mnnx if framework == "nnx" else mlinen).CLIPLoss
  for bad in (jnp.int32, None, True, "int8"):
    with pytest.raises(TypeError, match="param_dtype must be a float dtype"):
      make(param_dtype=bad)


def test_matryoshka_lists_kept_as_tuples():
  # Lists given for matryoshka_dims / weights are kept as the checked tuples in both
  # frameworks: a Linen module holding a list was unhashable ("Failed to hash Flax
  # Module"), so jax.jit could not take it as a static argument. Against the loss
  # function with the same options (exact: the same call).
  x, y = _data()[:2]
  kw = dict(matryoshka_dims=[8, 16], matryoshka_weights=[1, 2], backend="blockwise")
  want = mj.clip_loss(x, y, temperature=0.07, **{k: tuple(v) if isinstance(v, list) else v
                                               for k, v in kw.items()})
  linen_module, nnx_module = mlinen.CLIPLoss(**kw), mnnx.CLIPLoss(**kw)
  for m in (linen_module, nnx_module):
    assert m.matryoshka_dims == (8, 16) and m.matryoshka_weights == (1.0, 2.0)
  variables = linen_module.init(jax.random.key(0), x, y)
  got = jax.jit(lambda m, a, b: m.apply(variables, a, b), static_argnums=0)(linen_module, x, y)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(nnx.jit(lambda m, a, b: m(a, b))(nnx_module, x, y), want,
                             rtol=1e-6)


def test_linen_fixed_temperature():
  x, y, _, _ = _data()
  loss_module = _linen_loss("clip", temperature=0.05, learnable=False)
  params, history = _linen_train(LinenModel(loss_module), (x, y), steps=2)
  assert "loss" not in params   # no parameter at all: a constant
  assert "loss" not in history[0][1]
  np.testing.assert_allclose(loss_module.apply({}, method="current_temperature"), 0.05,
                             rtol=1e-6)


def test_linen_tabulate():
  # Flax's tabulate intercepts every wrapped method, and the modules' construction
  # check ran one before the module had a scope (a bare AssertionError). The table
  # lists the loss and its logit_scale parameter, as for any Linen module.
  x, y, _, _ = _data()
  table = _linen_loss("clip", temperature=0.05).tabulate(jax.random.key(0), x, y)
  assert "logit_scale" in table and "CLIPLoss" in table
  table = LinenModel(_linen_loss("clip")).tabulate(jax.random.key(0), x, y)
  assert "CLIPLoss" in table, table


# --- both -----------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bound_clamps(framework):
  # A log-scale past the bound (1/t = 200 > 100, as training may take it): the loss
  # uses t = 1/100.
  x, y, _, _ = _data()
  kw = dict(temperature=0.01, backend="blockwise")
  if framework == "nnx":
    bounded, free = mnnx.CLIPLoss(**kw), mnnx.CLIPLoss(max_logit_scale=None, **kw)
    for m in (bounded, free):
      m.logit_scale[...] = jnp.float32(math.log(200.0))
    value = nnx.jit(lambda m: (m.current_temperature(), m(x, y)))
    (t, got), (t_free, _) = value(bounded), value(free)
  else:
    v = {"params": {"logit_scale": jnp.float32(math.log(200.0))}}
    bounded, free = mlinen.CLIPLoss(**kw), mlinen.CLIPLoss(max_logit_scale=None, **kw)
    t, got = bounded.apply(v, method="current_temperature"), bounded.apply(v, x, y)
    t_free = free.apply(v, method="current_temperature")
  np.testing.assert_allclose(t, 0.01, rtol=1e-6)
  np.testing.assert_allclose(t_free, 0.005, rtol=1e-6)
  # rtol: a loss of ~1e-8 (t = 0.01 separates this batch), jit vs eager fusion.
  np.testing.assert_allclose(got, mj.clip_loss(x, y, temperature=t, backend="blockwise"),
                             rtol=1e-5)
  with pytest.raises(ValueError, match="max_logit_scale"):
    (mnnx if framework == "nnx" else mlinen).CLIPLoss(max_logit_scale=0.0)


def test_bound_gradient_only_brings_the_scale_back():
  bound = 100.0
  grad_t = lambda s: jax.vjp(lambda s: _wrappers.temperature_from_log_scale(s, bound), s)
  below, above = jnp.float32(math.log(50.0)), jnp.float32(math.log(200.0))
  t, vjp = grad_t(below)
  np.testing.assert_allclose(vjp(jnp.float32(1.0))[0], -t, rtol=1e-6)   # dt/ds = -t
  t, vjp = grad_t(above)
  np.testing.assert_allclose(t, 1 / bound, rtol=1e-6)
  # Above the bound: a descent step along -g must lower s, so g > 0 passes, g < 0 not.
  assert vjp(jnp.float32(-1.0))[0] > 0      # dL/dt < 0 -> dL/ds = -t dL/dt > 0: passes
  assert vjp(jnp.float32(1.0))[0] == 0      # would push s further up: blocked


def test_import_memeff_jax_does_not_import_flax():
  code = ("import sys, memeff_jax, memeff_jax.classes; "
          "bad = sorted(m for m in sys.modules if m == 'flax' or m.startswith('flax.')); "
          "assert not bad, bad; print(memeff_jax.__version__)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip()


@pytest.mark.parametrize("module", ["memeff_jax.nnx", "memeff_jax.linen"])
def test_without_flax_the_modules_say_how_to_install_it(module):
  # flax is an extra: importing the Flax modules without it raised a bare
  # "No module named 'flax'". (sys.modules["flax"] = None makes it unimportable.)
  code = (f"import sys; sys.modules['flax'] = None\n"
          f"try:\n  import {module}\nexcept ImportError as e:\n  print(e)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == (f"{module} needs flax (and optax to train): pip install flax "
                                f"optax, or from the checkout pip install -e '.[flax]'")


# --- SigLIP: a learnable temperature and bias -----------------------------------------
# Each compared with the dense float64 reference on the same float32 features; rtol
# 1e-5: the module runs the blockwise backend in float32.

SIGLIP_INITS = [None, (0.05, -3.0)]   # None: the defaults (big_vision's t = 0.1, b = -10)


def _siglip_init(init):
  """(constructor keywords, t, b) of an init point."""
  if init is None:
    return {}, 0.1, -10.0
  t, b = init
  return dict(temperature=t, bias=b), t, b


def _siglip_reference(x, y, t, b, *, grads=False, **kw):
  """reference.siglip_loss_with_stats in float64 at (t, b): ``(loss, stats)``, or
  (``grads``) the loss's gradients w.r.t. ``t`` and ``b``; numpy float64 leaves."""
  with jax.enable_x64(True):
    x64, y64 = (jnp.asarray(np.asarray(v), jnp.float64) for v in (x, y))
    fn = lambda t, b: mj.reference.siglip_loss_with_stats(x64, y64, temperature=t, bias=b,
                                                          **kw)
    t, b = jnp.float64(t), jnp.float64(b)
    out = jax.grad(lambda t, b: fn(t, b)[0], argnums=(0, 1))(t, b) if grads else fn(t, b)
    return jax.tree.map(np.asarray, out)


def _siglip_linen(x, y, **kw):
  """A Linen SigLIPLoss and its initial variables."""
  module = mlinen.SigLIPLoss(backend="blockwise", **kw)
  return module, jax.jit(module.init)(jax.random.key(0), x, y)


def _siglip_value(framework, x, y, **kw):
  """(logit_scale, logit_bias, loss, (loss, stats)) of a fresh module at its init."""
  if framework == "nnx":
    module = mnnx.SigLIPLoss(backend="blockwise", **kw)
    params = module.logit_scale[...], module.logit_bias[...]
    return (*params, *nnx.jit(lambda m: (m(x, y), m.with_stats(x, y)))(module))
  module, variables = _siglip_linen(x, y, **kw)
  params = variables["params"]["logit_scale"], variables["params"]["logit_bias"]
  run = jax.jit(lambda v: (module.apply(v, x, y), module.apply(v, x, y, method="with_stats")))
  return (*params, *run(variables))


@pytest.mark.parametrize("init", SIGLIP_INITS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_siglip_value_at_init_equals_reference(framework, init):
  x, y = _data()[:2]
  kw, t, b = _siglip_init(init)
  scale, bias, value, (value_s, stats) = _siglip_value(framework, x, y, **kw)
  np.testing.assert_allclose(scale, math.log(1 / t), rtol=1e-6)
  np.testing.assert_allclose(bias, b, rtol=1e-6)
  want, want_stats = _siglip_reference(x, y, t, b)
  np.testing.assert_allclose(value, want, rtol=1e-5)
  np.testing.assert_allclose(value_s, want, rtol=1e-5)
  assert isinstance(stats, mj.SigLIPStats)
  # The parts, each to fp32 rounding (the positives' part is computed on its own, not
  # as the loss minus the negatives': at (0.05, -3) it is ~1e-5 of the loss).
  for part in ("loss_positive", "loss_negative"):
    np.testing.assert_allclose(getattr(stats, part), getattr(want_stats, part), rtol=1e-5,
                               err_msg=part)


@pytest.mark.parametrize("init", SIGLIP_INITS)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_siglip_parameter_gradients_equal_reference(framework, init):
  # stable=False: the plain gradients; d t / d logit_scale = -t (chain rule, by hand).
  x, y = _data()[:2]
  kw, t, b = _siglip_init(init)
  if framework == "nnx":
    module = mnnx.SigLIPLoss(stable=False, backend="blockwise", **kw)
    grads = nnx.jit(nnx.grad(lambda m: m(x, y)))(module)
    g_scale, g_bias = grads["logit_scale"][...], grads["logit_bias"][...]
  else:
    module, variables = _siglip_linen(x, y, stable=False, **kw)
    grads = jax.jit(jax.grad(lambda v: module.apply(v, x, y)))(variables)["params"]
    g_scale, g_bias = grads["logit_scale"], grads["logit_bias"]
  g_t, g_b = _siglip_reference(x, y, t, b, grads=True, stable=False)
  np.testing.assert_allclose(g_scale, -t * g_t, rtol=1e-5)
  np.testing.assert_allclose(g_bias, g_b, rtol=1e-5)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_siglip_where_equals_reference_on_kept_rows(framework):
  x, y = _data()[:2]
  keep = np.arange(B) % 3 != 1   # rows 1, 4, 7 removed
  if framework == "nnx":
    module = mnnx.SigLIPLoss(backend="blockwise")
    value, (value_s, _) = nnx.jit(
        lambda m, w: (m(x, y, where=w), m.with_stats(x, y, where=w)))(module, keep)
  else:
    module, variables = _siglip_linen(x, y)
    value, (value_s, _) = jax.jit(lambda v, w: (
        module.apply(v, x, y, where=w),
        module.apply(v, x, y, where=w, method="with_stats")))(variables, keep)
  want, _ = _siglip_reference(x[keep], y[keep], 0.1, -10.0)
  np.testing.assert_allclose(value, want, rtol=1e-5)
  np.testing.assert_allclose(value_s, want, rtol=1e-5)


def test_nnx_siglip_optimizer_step_moves_both_parameters():
  x, y = _data()[:2]
  model = NnxModel(mnnx.SigLIPLoss(backend="blockwise"), rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
  before = model.loss.logit_scale[...], model.loss.logit_bias[...]
  _, grads = _nnx_step(model, optimizer, (x, y))
  for name, old in zip(("logit_scale", "logit_bias"), before):
    assert np.isfinite(grads["loss"][name][...]) and grads["loss"][name][...] != 0
    # adam's first step moves each parameter by ~ its learning rate
    assert abs(float(getattr(model.loss, name)[...]) - float(old)) > 1e-2, name


def test_nnx_siglip_fixed_parameters():
  x, y = _data()[:2]
  model = NnxModel(mnnx.SigLIPLoss(temperature=0.05, bias=-3.0, learnable=False,
                                   backend="blockwise"), rngs=nnx.Rngs(0))
  for name in ("logit_scale", "logit_bias"):
    assert not isinstance(getattr(model.loss, name), nnx.Param), name
  assert not nnx.state(model.loss, nnx.Param)
  optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)
  for _ in range(2):
    _, grads = _nnx_step(model, optimizer, (x, y))
  assert "loss" not in grads   # the loss module has no Param left to differentiate
  np.testing.assert_allclose(model.loss.current_temperature(), 0.05, rtol=1e-6)
  np.testing.assert_allclose(model.loss.logit_bias[...], -3.0, rtol=1e-6)


def test_linen_siglip_optimizer_step_moves_both_parameters():
  x, y = _data()[:2]
  model = LinenModel(mlinen.SigLIPLoss(backend="blockwise"))
  init = jax.jit(model.init)(jax.random.key(0), x, y)["params"]["loss"]
  params, history = _linen_train(model, (x, y), steps=1)
  assert set(params["loss"]) == {"logit_scale", "logit_bias"}
  for name in ("logit_scale", "logit_bias"):
    g = history[0][1]["loss"][name]
    assert np.isfinite(g) and g != 0
    # adam's first step moves each parameter by ~ its learning rate
    assert abs(float(params["loss"][name]) - float(init[name])) > 1e-2, name


def test_linen_siglip_fixed_parameters():
  x, y = _data()[:2]
  loss_module = mlinen.SigLIPLoss(temperature=0.05, bias=-3.0, learnable=False,
                                  backend="blockwise")
  params, history = _linen_train(LinenModel(loss_module), (x, y), steps=2)
  assert "loss" not in params   # no parameter at all: constants
  assert "loss" not in history[0][1]
  np.testing.assert_allclose(loss_module.apply({}, method="current_temperature"), 0.05,
                             rtol=1e-6)
  # The constant bias is the one in use: the loss equals the reference at (0.05, -3).
  want, _ = _siglip_reference(x, y, 0.05, -3.0)
  np.testing.assert_allclose(loss_module.apply({}, x, y), want, rtol=1e-5)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_initial_temperature(framework):
  # The modules check their initial temperature as the losses check theirs: t and 1 / t
  # normal float32 numbers (1e-300 would start the log-scale at 690.8, whose exp(-)
  # is 0 in float32: a NaN loss without the bound).
  cls = (mnnx if framework == "nnx" else mlinen).CLIPLoss
  make = (lambda **k: cls(**k)) if framework == "nnx" else (
      lambda **k: cls(**k).init(jax.random.key(0), jnp.ones((2, 4)), jnp.ones((2, 4))))
  for t, match in [(1e-300, "must be normal float32"), (1e39, "must be normal float32"),
                   (0.0, "must be > 0"), (float("nan"), "must be > 0"),
                   (float("inf"), "must be finite")]:
    with pytest.raises(ValueError, match=match):
      make(temperature=t, max_logit_scale=None)
  with pytest.raises(TypeError, match="temperature must be a Python float"):
    make(temperature=jnp.float32(0.07))
  make(temperature=1e-30, max_logit_scale=None)   # a normal float32 still starts
  if framework == "nnx":   # keyword-only, and the error names the class
    with pytest.raises(TypeError, match=r"CLIPLoss\.__init__\(\) takes 1 positional"):
      cls(0.07)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_initial_temperature_against_the_bound_and_one(framework):
  # Below 1 / max_logit_scale the loss would use the bound from the first step: refused,
  # naming both (it was clamped silently). Above 1 (a logit scale passed as one?) it
  # warns as the loss functions do, at the user's line, once: not again from Flax's
  # clones of a Linen module in init and apply.
  cls = (mnnx if framework == "nnx" else mlinen).CLIPLoss
  for t, bound in [(0.005, 100.0), (0.019, 50.0)]:
    with pytest.raises(ValueError, match=f"temperature={t} is below 1 / max_logit_scale"):
      cls(temperature=t, max_logit_scale=bound)
  for t, bound in [(0.01, 100.0), (0.02, 50.0), (0.005, None)]:   # at the bound, or none
    cls(temperature=t, max_logit_scale=bound)
  x = jnp.ones((2, 4))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loss = cls(temperature=5.0, max_logit_scale=None, backend="blockwise")
    if framework == "linen":
      loss.apply(loss.init(jax.random.key(0), x, x), x, x)
    else:
      loss(x, x)
  assert [(w.category, pathlib.Path(w.filename).name) for w in caught] == [
      (UserWarning, "test_flax.py")], [(w.filename, str(w.message)) for w in caught]
  assert "temperature=5.0 > 1 looks like a logit scale" in str(caught[0].message)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    cls(temperature=1.0)   # 1 itself is a temperature


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_siglip_bad_initial_bias(framework):
  cls = (mnnx if framework == "nnx" else mlinen).SigLIPLoss
  with pytest.raises(ValueError, match="bias must be finite"):
    cls(bias=float("inf"))
  with pytest.raises(ValueError, match="bias must be a finite float32 number"):
    cls(bias=1e39)   # (the parameter is float32: it would start at inf)
  with pytest.raises(TypeError, match="bias must be a Python float"):
    cls(bias=jnp.float32(-10.0))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
def test_shared_negatives_reach_the_loss(framework, family):
  # A call's shared_negatives (after the family's arrays) go to the function.
  name, fn, n, opts = _spec(family)
  x, y, h, _ = _data()
  cols = jax.random.normal(jax.random.key(3), (5, D))
  arrays = [x, y, h][:n] + ([None] if n == 2 else []) if "qwen3" in family else [x, y]
  kw = dict(opts, backend="blockwise")
  want = fn(*arrays, cols, temperature=0.1, **kw)[0]
  plain = fn(*arrays, temperature=0.1, **kw)[0]
  if framework == "nnx":
    got = getattr(mnnx, name)(temperature=0.1, **kw)(*arrays, cols)
  else:
    module = getattr(mlinen, name)(temperature=0.1, **kw)
    got = module.apply(module.init(jax.random.key(0), *arrays, cols), *arrays, cols)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert abs(float(want) - float(plain)) > 1e-3   # the columns count
