"""The catalogue of bad inputs (issue 11): each one and what it gives.

Static values raise at trace time, naming the argument (tests/test_errors.py). Values
only known at run time (traced hyperparameters, non-finite features) give a NaN loss
and NaN gradients, the same on blockwise, interpret and reference and through the ring,
never a finite value, and under checkify an error naming the argument. Tiny shapes,
mostly eager (the op cache keeps the cases fast).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from jax.sharding import Mesh

import memeff_jax as mj
from memeff_jax import KernelConfig, reference
from tests.support.data import towers
from tests.support.families import ALL_BACKENDS

# Triton's interpreter computes on NaN on purpose here.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

B, D, K = 6, 8, 2

# x, y and hard negatives [B, K, D]; _data(seed).
_data = functools.partial(towers, B, D, noise=0.5, k=K, hard_noise=0.7)


def _mesh(n, name="batch"):
  return Mesh(np.array(jax.devices()[:n]), (name,))


# --- edge cases that are no error -----------------------------------------------------

def test_tau_plus_batch_one_with_hard_negatives_is_fine():
  x, y, h = (v[:1] for v in _data())
  got = mj.qwen3_loss(x, y, h, tau_plus=0.1, temperature=1.0, backend="blockwise")
  want = reference.qwen3_loss(x, y, h, tau_plus=0.1, temperature=1.0)
  assert want > 1e-3
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_numpy_float64_under_grad_without_x64():
  # jax.grad converts only the differentiated argument; the loss converts the others
  # alike, so no "must have the same dtype" error, and the result is the fp32 one.
  x, y, _ = (np.asarray(v, np.float64) for v in _data())
  g = jax.grad(lambda a: mj.clip_loss(a, y, backend="blockwise"))(x)
  want = jax.grad(lambda a: mj.clip_loss(a, jnp.asarray(y, jnp.float32),
                                         backend="blockwise"))(jnp.asarray(x, jnp.float32))
  assert g.dtype == jnp.float32
  np.testing.assert_allclose(g, want, rtol=1e-6)
  mj.qwen3_loss(x, y, np.zeros((B, K, D)), backend="reference")   # three numpy arrays


# --- run time: NaN loss and NaN gradients, never a finite value -----------------------

def _set(i, idx, value):
  return lambda arrays: [a.at[idx].set(value) if j == i else a for j, a in enumerate(arrays)]


_KEEP = lambda arrays: arrays
# name -> (loss, number of arrays, how to corrupt them, traced keywords, locked arrays)
POISON = {
    "temperature<0": (mj.clip_loss, 2, _KEEP, dict(temperature=-1.0), ()),
    "temperature=nan": (mj.qwen3_loss, 3, _KEEP, dict(temperature=np.nan), ()),
    "temperature=inf": (mj.lit_loss, 2, _KEEP, dict(temperature=np.inf), (1,)),
    "margin<0": (mj.qwen3_loss, 3, _KEEP, dict(margin=-3.0), ()),
    "margin=nan": (mj.lit_qwen3_loss, 3, _KEEP, dict(margin=np.nan), (1, 2)),
    "tau_rows<0": (mj.clip_loss, 2, _KEEP, dict(tau_plus=np.r_[[0.1] * 2, -0.01, [0.1] * 3]), ()),
    "tau_rows_nan": (mj.lit_loss, 2, _KEEP, dict(tau_plus=np.r_[np.nan, [0.1] * 5]), (1,)),
    "tau_0d=1": (mj.qwen3_loss, 3, _KEEP, dict(tau_plus=np.ones(())), ()),
    "smoothing=1": (mj.clip_loss, 2, _KEEP, dict(label_smoothing=1.0), ()),
    "z_scale<0": (mj.lit_loss, 2, _KEEP, dict(lse_square_scale=-1.0), (1,)),
    "x_nan": (mj.clip_loss, 2, _set(0, (3, 1), np.nan), {}, ()),
    "locked_inf": (mj.lit_loss, 2, _set(1, (4, 2), np.inf), {}, (1,)),
    "hard_negative_nan": (mj.qwen3_loss, 3, _set(2, (1, 1, 3), np.nan), {}, ()),
    "locked_hard_negative_nan": (mj.lit_qwen3_loss, 3, _set(2, (5, 0, 0), np.nan), {}, (1, 2)),
    "matryoshka_temperature<0": (mj.clip_loss, 2, _KEEP, dict(temperature=-0.5), ()),
}
# Matryoshka rides along with the last case.
_EXTRA = {"matryoshka_temperature<0": dict(matryoshka_dims=(4, D))}


def _value_and_grads(fn, arrays, traced, backend, dtype=jnp.float32, **static):
  n, names = len(arrays), list(traced)
  f = lambda *a: fn(*a[:n], backend=backend, **dict(zip(names, a[n:])), **static)
  values = [jnp.asarray(v, dtype) for v in traced.values()]
  return jax.value_and_grad(f, argnums=tuple(range(n + len(values))))(*arrays, *values)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("case", list(POISON))
def test_nan_loss_and_nan_gradients(backend, case):
  fn, n, corrupt, traced, locked = POISON[case]
  arrays = corrupt(_data()[:n])
  loss, grads = _value_and_grads(fn, arrays, traced, backend, **_EXTRA.get(case, {}))
  assert np.isnan(loss), float(loss)
  for i, g in enumerate(grads):
    if i in locked:   # a locked tower keeps its exact zero gradient
      assert np.all(np.asarray(g) == 0), (i, g)
    else:
      assert np.all(np.isnan(g)), (i, g)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("fn,n,traced", [
    (mj.qwen3_loss, 3, dict(margin=np.inf, temperature=0.05)),   # inf margin: no mask
    (mj.clip_loss, 2, dict(tau_plus=np.linspace(0.0, 0.9, B), label_smoothing=0.1,
                           lse_square_scale=0.0)),
    (mj.lit_qwen3_loss, 3, dict(tau_plus=np.zeros(()), margin=0.0)),
])
def test_in_range_traced_values_stay_finite(backend, fn, n, traced):
  arrays = _data()[:n]
  loss, grads = _value_and_grads(fn, arrays, traced, backend)
  with jax.enable_x64(True):   # the float64 reference (so not backend="reference" itself)
    wide = [jnp.asarray(a, jnp.float64) for a in arrays]
    ref, ref_grads = _value_and_grads(fn, wide, traced, "reference", dtype=jnp.float64)
  np.testing.assert_allclose(loss, ref, rtol=2e-5)
  for g, r in zip(grads, ref_grads):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5)


def test_nan_under_jit():
  x, y, h = _data()
  h = h.at[2, 0, 1].set(np.nan)
  for backend in ALL_BACKENDS:
    f = jax.jit(jax.value_and_grad(
        lambda q, d, hh, m: mj.qwen3_loss(q, d, hh, margin=m, backend=backend), (0, 1, 2, 3)))
    loss, grads = f(x, y, h, jnp.float32(0.1))
    assert np.isnan(loss) and all(np.all(np.isnan(g)) for g in grads), backend


def test_concrete_jax_arrays_are_run_time_values():
  # The README ("Use"): bad values in Python numbers and NumPy arrays raise, naming the
  # argument; in JAX arrays, even concrete ones passed eagerly, they are run-time
  # values (no host sync to read them): a NaN loss.
  x, y = _data()[:2]
  for name, bad in [("temperature", -0.1), ("temperature", np.float32(-0.1)),
                    ("tau_plus", np.full(B, 1.5, np.float32))]:
    with pytest.raises(ValueError, match=name):
      mj.clip_loss(x, y, backend="blockwise", **{name: bad})
    assert np.isnan(mj.clip_loss(x, y, backend="blockwise", **{name: jnp.asarray(bad)}))


def test_nan_through_the_ring():
  # A bad value on one device poisons every device's loss and every gradient shard.
  x, y, h = _data(1)
  x, y, h = (jnp.concatenate([v, v]) for v in (x, y, h))     # 12 rows
  tau = np.full(2 * B, 0.1)
  tau[7] = -0.5
  ring = mj.sharded(lambda *a, tau_plus, axis_name: mj.qwen3_loss(
      *a, tau_plus=tau_plus, axis_name=axis_name, backend="blockwise"), _mesh(4), "batch")
  for arrays, t in [((x, y, h.at[9, 1, 2].set(np.nan)), np.full(2 * B, 0.1)),
                    ((x, y, h), tau)]:
    loss, grads = jax.value_and_grad(lambda *a: ring(*a, tau_plus=t), (0, 1, 2))(*arrays)
    assert np.isnan(loss) and all(np.all(np.isnan(g)) for g in grads)


@pytest.mark.parametrize("backend,fn,n,traced,pattern", [
    ("blockwise", mj.clip_loss, 2, dict(temperature=-0.1),
     "temperature must be > 0 and, with 1 / temperature, a normal number of its dtype, "
     "got temperature=-0.1"),
    ("reference", mj.qwen3_loss, 3, dict(margin=np.nan),
     "margin must be >= 0 \\(not NaN\\), got margin=nan"),
    ("interpret", mj.lit_loss, 2, dict(tau_plus=np.r_[0.1, 1.5, [0.1] * 4]),
     "tau_plus must be in \\[0, 1\\)"),
    ("blockwise", mj.clip_loss, 2, dict(label_smoothing=0.1, lse_square_scale=np.inf),
     "lse_square_scale must be finite"),
])
def test_checkify_names_the_argument(backend, fn, n, traced, pattern):
  arrays = _data()[:n]
  values = [jnp.asarray(v, jnp.float32) for v in traced.values()]
  f = lambda *a: fn(*a[:n], backend=backend, **dict(zip(traced, a[n:])))
  with mj.checkify_checks():
    err, loss = checkify.checkify(f)(*arrays, *values)
    assert np.isnan(loss)
    with pytest.raises(checkify.JaxRuntimeError, match=pattern):
      err.throw()
    assert np.isnan(f(*arrays, *values))   # a no-op without checkify: a NaN loss
  # Outside the block the trace has no checks: checkify finds nothing to name.
  err, loss = checkify.checkify(f)(*arrays, *values)
  assert np.isnan(loss) and err.get() is None


@pytest.mark.parametrize("fn,n", [(mj.clip_loss, 2), (mj.qwen3_loss, 3)])
def test_no_effects_outside_checkify_checks(fn, n):
  """A loss step without the checks has no effects (JAX's C++ dispatch path: an
  effect costs ~1.3 ms a call); inside checkify_checks it carries checkify's."""
  args = (*_data()[:n], jnp.float32(0.1))
  # a fresh function per trace: JAX caches traces by function (the switch is read
  # when a loss is traced)
  effects = lambda: jax.make_jaxpr(lambda *a: jax.value_and_grad(
      lambda *b: fn(*b, temperature=a[-1], backend="blockwise"))(*a[:-1]))(*args).effects
  assert not effects()
  with mj.checkify_checks():
    assert effects()
    with mj.checkify_checks(False):
      assert not effects()
    assert effects()
  assert not effects()
  with pytest.raises(TypeError, match="enabled must be a bool"):
    with mj.checkify_checks("yes"):
      pass


def test_checkify_names_the_non_finite_array():
  checked = jax.jit(checkify.checkify(jax.grad(
      lambda *a: mj.qwen3_loss(*a, backend="blockwise"))))
  for i, name in enumerate(["query_features", "doc_features", "hard_negatives"]):
    with mj.checkify_checks():   # jit traces on the first call: inside the block
      err, _ = checked(*_set(i, (0, 0) if i < 2 else (0, 0, 0), np.nan)(_data()))
    with pytest.raises(checkify.JaxRuntimeError, match=f"{name} must be finite"):
      err.throw()


def test_checkify_through_sharded():
  x, y, _ = _data()
  ring = mj.sharded(mj.clip_loss, _mesh(2), "batch")
  with mj.checkify_checks():
    err, loss = checkify.checkify(lambda a, b: ring(a, b, backend="blockwise"))(
        x, y.at[4, 0].set(np.nan))
  assert np.isnan(loss)
  with pytest.raises(checkify.JaxRuntimeError, match="text_features must be finite"):
    err.throw()


# --- second order and transformations ------------------------------------------------

def test_qwen3_hessian_with_a_fully_masked_row():
  # Row 0's positive is -1 and margin 0 masks every negative; tiles of 2 columns also
  # leave fully masked tiles in other rows. The Hessian is finite and the reference's.
  x, y, _ = (v[:5, :4] for v in _data())
  y = y.at[0].set(-x[0])
  kw = dict(margin=0.0, use_qq_negatives=True)
  hess = lambda f: jax.jit(jax.hessian(f))(x)
  got = hess(lambda a: mj.qwen3_loss(a, y, backend="blockwise",
                                     config=KernelConfig().evolve(blockwise=dict(tile=2)), **kw))
  want = hess(lambda a: reference.qwen3_loss(a, y, **kw))
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, atol=2e-5 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("transform,pattern", [
    ("vmap", "cannot run under jax.vmap"),
    ("jacrev", "cannot run under jax.vmap or jax.jacrev"),
    ("grad_of_grad", "has first-order gradients only"),
])
def test_interpret_transforms_are_clear_errors(transform, pattern):
  x, y, _ = _data()
  f = lambda a: mj.clip_loss(a, y, backend="interpret")
  run = {"vmap": lambda: jax.vmap(f)(jnp.stack([x, x])),
         "jacrev": lambda: jax.jacrev(lambda a: jnp.stack([f(a), 2 * f(a)]))(x),
         "grad_of_grad": lambda: jax.grad(lambda a: jnp.sum(jax.grad(f)(a) ** 2))(x)}[transform]
  with pytest.raises(NotImplementedError, match=f"backend='interpret' {pattern}"):
    run()


# --- float64 --------------------------------------------------------------------------

@pytest.mark.parametrize("fn,n,kw", [
    (mj.clip_loss, 2, dict(label_smoothing=0.1, lse_square_scale=1e-2, tau_plus="rows")),
    (mj.qwen3_loss, 3, dict(use_qq_negatives=True, use_dd_negatives=True, tau_plus=0.1,
                            matryoshka_dims=(4, D))),
])
def test_float64_in_float64(fn, n, kw):
  # With x64 on, float64 features give a float64 loss computed in float64 on the
  # blockwise and reference backends: they agree to ~1e-15, far below fp32 rounding.
  with jax.enable_x64(True):
    arrays = [jnp.asarray(np.asarray(a), jnp.float64) for a in _data(3)[:n]]
    if kw.get("tau_plus") == "rows":
      kw = dict(kw, tau_plus=jnp.linspace(0.0, 0.5, B))

    def both(*a):
      g = lambda be: jax.value_and_grad(lambda *b: fn(*b[:-1], temperature=b[-1], backend=be,
                                                      **kw), tuple(range(n + 1)))(*a)
      return g("blockwise"), g("reference")

    (loss, grads), (want, want_grads) = jax.jit(both)(*arrays, jnp.float64(0.5))
    assert loss.dtype == want.dtype == jnp.float64
    assert all(g.dtype == jnp.float64 for g in (*grads, *want_grads))
    np.testing.assert_allclose(loss, want, rtol=1e-13)
    for g, w in zip(grads, want_grads):
      np.testing.assert_allclose(g, w, rtol=0, atol=1e-13 * (1 + float(np.max(np.abs(w)))))
    f32 = [a.astype(jnp.float32) for a in arrays]   # float32 stays float32 with x64 on
    assert jax.eval_shape(lambda *a: fn(*a, backend="blockwise"), *f32).dtype == jnp.float32
    assert jax.eval_shape(lambda *a: fn(*a, backend="reference"), *f32).dtype == jnp.float32
