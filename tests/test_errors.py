"""Bad input raises a clear ValueError / TypeError at trace time, naming the argument:
shapes, ranges and config a ValueError, types and dtypes a TypeError. Every public
entry: the losses, Matryoshka, where=, sharded and the ring, the reference,
grad_cache, KernelConfig, the memeff classes and the Flax modules. Values only known
at run time give NaN instead: tests/test_catalogue.py."""

import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import memeff_jax as mj
from memeff_jax import KernelConfig, grad_cache, reference
from memeff_jax import classes as C
from memeff_jax import clip_loss, lit_loss, lit_qwen3_loss, qwen3_loss
from memeff_jax.config import RoleTiles
from tests.support import data, towers
from tests.support.families import ALL_BACKENDS
from tests.support.towers import FEAT

x = jnp.ones((4, 8), jnp.float32)
PAIR = [clip_loss, lit_loss, qwen3_loss, lit_qwen3_loss]


def _names(fn):
  return (("image_features", "text_features") if fn is clip_loss else
          ("text_features", "image_features") if fn is lit_loss else
          ("query_features", "doc_features"))


# --- the towers, the hard negatives and the options of the four losses ---------------

@pytest.mark.parametrize("fn", PAIR)
@pytest.mark.parametrize("a,b,err,pattern", [
    (jnp.ones((4, 8, 1)), x, ValueError, "{0} must be rank 2.*shape=\\(4, 8, 1\\)"),
    (x, jnp.ones((8,)), ValueError, "{1} must be rank 2.*shape=\\(8,\\)"),
    (x, jnp.ones((5, 8)), ValueError, "same batch size.*\\(4, 8\\).*\\(5, 8\\)"),
    (x, jnp.ones((4, 7)), ValueError, "same feature dim.*\\(4, 8\\).*\\(4, 7\\)"),
    (jnp.ones((4, 8), jnp.int32), jnp.ones((4, 8), jnp.int32), TypeError,
     "{0} must be a floating array.*int32"),
    (x, jnp.ones((4, 8), jnp.bfloat16), TypeError, "same dtype.*float32.*bfloat16"),
    (jnp.ones((0, 8)), jnp.ones((0, 8)), ValueError, "at least one row"),
])
def test_bad_towers(fn, a, b, err, pattern):
  with pytest.raises(err, match=pattern.format(*_names(fn))):
    fn(a, b, backend="blockwise")


@pytest.mark.parametrize("fn", PAIR)
@pytest.mark.parametrize("kwargs,err,pattern", [
    (dict(temperature=0.0), ValueError, "temperature must be > 0, got temperature=0.0"),
    (dict(temperature=-1.0), ValueError, "temperature must be > 0"),
    (dict(temperature=jnp.ones(2)), ValueError, "temperature must be a scalar.*\\(2,\\)"),
    (dict(temperature=jnp.ones((), jnp.int32)), TypeError, "temperature must be floating"),
    (dict(tau_plus=1.0), ValueError, "tau_plus must be \\[0.0, 1.0\\), got tau_plus=1.0"),
    (dict(tau_plus=-0.1), ValueError, "tau_plus must be"),
    (dict(tau_plus=jnp.ones(3)), ValueError, "per-row tau_plus must have shape.*\\(4,\\).*\\(3,\\)"),
    (dict(tau_plus=jnp.ones(4, jnp.int32)), TypeError, "tau_plus must be floating"),
    (dict(label_smoothing=1.0), ValueError, "label_smoothing must be \\[0.0, 1.0\\)"),
    (dict(label_smoothing=-0.5), ValueError, "label_smoothing must be"),
    (dict(lse_square_scale=-1e-3), ValueError, "lse_square_scale must be \\[0.0, inf\\)"),
    (dict(lse_square_scale=float("inf")), ValueError,
     "lse_square_scale must be \\[0.0, inf\\), got lse_square_scale=inf"),
    # finite as a Python float, inf in the float32 computation (an inf loss, NaN gradients)
    (dict(lse_square_scale=1e39), ValueError,
     "lse_square_scale must be a finite float32 number.*lse_square_scale=1e\\+39"),
    # finite in float64, not normal numbers (t or 1 / t) in the float32 computation
    (dict(temperature=1e39), ValueError,
     "temperature and 1 / temperature must be normal float32.*temperature=1e\\+39"),
    (dict(temperature=1e-40), ValueError, "must be normal float32.*temperature=1e-40"),
    # numpy values are known on the host: checked as Python numbers are
    (dict(temperature=np.asarray(0.0)), ValueError, "temperature must be > 0, got temperature=0.0"),
    (dict(temperature=np.asarray(np.inf)), ValueError, "temperature must be finite"),
    (dict(tau_plus=np.asarray(1.0)), ValueError, "tau_plus must be \\[0.0, 1.0\\), got tau_plus=1.0"),
    (dict(tau_plus=np.array([0.1, 0.2, 1.0, 0.0])), ValueError,
     "tau_plus must be \\[0.0, 1.0\\), got tau_plus=0.0 .. 1.0 \\(per row\\)"),
    (dict(label_smoothing=np.asarray(-0.5)), ValueError, "label_smoothing must be"),
    (dict(lse_square_scale=np.asarray(np.nan)), ValueError, "lse_square_scale must be"),
    (dict(backend="cuda"), ValueError, "backend='cuda'; expected one of"),
    (dict(axis_name="batch"), ValueError, "axis_name='batch' is not bound"),
])
def test_bad_options(fn, kwargs, err, pattern):
  kwargs.setdefault("backend", "blockwise")
  with pytest.raises(err, match=pattern):
    fn(x, x, **kwargs)


@pytest.mark.parametrize("fn", [qwen3_loss, lit_qwen3_loss])
@pytest.mark.parametrize("h,err,pattern", [
    (jnp.ones((4, 8)), ValueError, "hard_negatives must be \\[batch=4, k, features=8\\].*\\(4, 8\\)"),
    (jnp.ones((3, 2, 8)), ValueError, "hard_negatives must be.*\\(3, 2, 8\\)"),
    (jnp.ones((4, 2, 7)), ValueError, "hard_negatives must be.*\\(4, 2, 7\\)"),
    (jnp.ones((4, 2, 8), jnp.bfloat16), TypeError, "hard_negatives must have the towers' dtype"),
])
def test_bad_hard_negatives(fn, h, err, pattern):
  with pytest.raises(err, match=pattern):
    fn(x, x, h, backend="blockwise")


@pytest.mark.parametrize("fn", [qwen3_loss, lit_qwen3_loss])
def test_negative_margin(fn):
  with pytest.raises(ValueError, match="margin must be >= 0.0, got margin=-0.1"):
    fn(x, x, margin=-0.1, backend="blockwise")


def test_errors_raise_at_trace_time():
  # Under jit the checks fire while tracing (no host sync), with the same messages.
  with pytest.raises(ValueError, match="same batch size"):
    jax.jit(lambda a, b: clip_loss(a, b, backend="blockwise")).lower(x, jnp.ones((5, 8)))
  with pytest.raises(ValueError, match="per-row tau_plus"):
    jax.jit(lambda a, t: clip_loss(a, a, tau_plus=t, backend="blockwise")).lower(x, jnp.ones(5))


def test_hard_negatives_k0_allowed():
  v = qwen3_loss(x, x, jnp.ones((4, 0, 8)), backend="blockwise")
  assert jnp.isfinite(v)


@pytest.mark.parametrize("fn", PAIR)
def test_logit_scale_as_temperature_warns(fn):
  # OpenCLIP's / sentence-transformers' scale 20 passed as the temperature.
  with pytest.warns(UserWarning, match="temperature=20.0 > 1 looks like a logit scale.*"
                                       "temperature = 1 / scale \\(here 0.05\\)"):
    fn(x, x, temperature=20.0, backend="blockwise")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    fn(x, x, temperature=1.0, backend="blockwise")               # 1 is a temperature
    fn(x, x, temperature=jnp.float32(20.0), backend="blockwise")  # traced: no check


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
@pytest.mark.parametrize("fn", [clip_loss, lit_qwen3_loss])
def test_forward_mode_is_a_clear_error(fn, transform):
  f = lambda a: fn(a, x + 1.0, backend="blockwise")
  run = {"jvp": lambda: jax.jvp(f, (x,), (x,)),
         "jacfwd": lambda: jax.jacfwd(f)(x)}[transform]
  with pytest.raises(TypeError, match=f"{fn.__name__} does not support forward-mode "
                                      f"differentiation \\(jax.jvp, jax.jacfwd\\)"):
    run()


def test_linearize_gives_the_value_and_a_transposable_function():
  # jax.linearize traces as jax.grad does (JAX's reverse mode goes through it), so the
  # loss cannot refuse it: its value and its transpose are right, and calling the
  # linear function (forward mode) raises JAX's TypeError at that call (docs/math.md §1).
  a, b = jax.random.normal(jax.random.key(0), (2, 6, 8))
  value, lin = jax.linearize(lambda u: clip_loss(u, b, backend="blockwise"), a)
  np.testing.assert_allclose(value, clip_loss(a, b, backend="reference"), rtol=1e-6)
  (back,) = jax.linear_transpose(lin, a)(jnp.float32(1.0))
  want = jax.grad(lambda u: clip_loss(u, b, backend="reference"))(a)
  np.testing.assert_allclose(back, want, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(want))))
  with pytest.raises(TypeError, match="forward-mode"):
    lin(a)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float16])
def test_forward_mode_on_the_reference(dtype):
  # The reference has no custom VJP and takes jvp, but for float16: its normalization's
  # cotangent saturates in a custom VJP (README "Transformations").
  a, b, v = (jax.random.normal(jax.random.key(k), (6, 8)).astype(dtype) for k in range(3))
  f = lambda u: clip_loss(u, b, backend="reference", stable=False)
  if dtype == jnp.float16:
    with pytest.raises(TypeError, match="backend='reference' on features other than float16"):
      jax.jvp(f, (a,), (v,))
    return
  _, tangent = jax.jvp(f, (a,), (v,))
  # against float32 reverse mode on the same (rounded) values, <grad, v>; bfloat16 rounds
  # the unit rows once more (2^-8 relative)
  up = lambda z: z.astype(jnp.float32)
  g = jax.grad(lambda u: clip_loss(u, up(b), backend="reference", stable=False))(up(a))
  want = jnp.vdot(g, up(v))
  assert abs(tangent - want) <= (2.0**-8 if dtype == jnp.bfloat16 else 1e-6) * jnp.linalg.norm(g) \
      * jnp.linalg.norm(up(v)), (tangent, want)


def test_unknown_keyword_names_the_loss():
  with pytest.raises(TypeError, match="^lit_qwen3_loss\\(\\) got an unexpected keyword "
                                      "argument 'use_dd_negatives'"):
    lit_qwen3_loss(x, x, use_dd_negatives=True, backend="blockwise")


# --- static options of every loss, on every backend --------------------------------

@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("fn,kwargs,err,pattern", [
    # flags are bools ("False" is truthy; None is not False)
    (mj.clip_loss, dict(normalized_inputs="False"), TypeError,
     "normalized_inputs must be a bool, got normalized_inputs='False'"),
    (mj.lit_loss, dict(stable="no"), TypeError, "stable must be a bool"),
    (mj.clip_loss, dict(stable=None), TypeError, "stable must be a bool, got stable=None"),
    (mj.clip_loss, dict(deterministic=1), TypeError, "deterministic must be a bool"),
    (mj.qwen3_loss, dict(use_qq_negatives="no"), TypeError, "use_qq_negatives must be a bool"),
    (mj.qwen3_loss, dict(use_dd_negatives=None), TypeError, "use_dd_negatives must be a bool"),
    (mj.lit_qwen3_loss, dict(use_qq_negatives=np.bool_(True)), TypeError,
     "use_qq_negatives must be a bool"),
    # config is a KernelConfig or None
    (mj.clip_loss, dict(config={"blockwise_tile": 8}), TypeError,
     "config must be a memeff_jax.KernelConfig or None, got dict"),
    (mj.qwen3_loss, dict(config="fast"), TypeError, "config must be a memeff_jax.KernelConfig"),
    # Python numbers out of range, NaN and inf included
    (mj.clip_loss, dict(temperature=float("nan")), ValueError, "temperature must be > 0"),
    (mj.clip_loss, dict(temperature=float("inf")), ValueError, "temperature must be finite"),
    (mj.qwen3_loss, dict(margin=float("nan")), ValueError, "margin must be >= 0.0"),
    (mj.lit_loss, dict(tau_plus=float("nan")), ValueError, "tau_plus must be \\[0.0, 1.0\\)"),
    (mj.clip_loss, dict(label_smoothing=float("nan")), ValueError, "label_smoothing must be"),
    (mj.clip_loss, dict(lse_square_scale=float("nan")), ValueError, "lse_square_scale must be"),
])
def test_static_values_raise(backend, fn, kwargs, err, pattern):
  with pytest.raises(err, match=pattern):
    fn(x, x, backend=backend, **kwargs)


def test_config_with_reference_raises():
  # The dense reference runs no kernels: a config would be silently ignored.
  with pytest.raises(ValueError, match="config has no effect with backend='reference'"):
    mj.clip_loss(x, x, backend="reference", config=KernelConfig())


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("fn,arrays", [
    (mj.clip_loss, [(1, 8), (1, 8)]),
    (mj.lit_loss, [(1, 8), (1, 8)]),
    (mj.qwen3_loss, [(1, 8), (1, 8)]),
])
@pytest.mark.parametrize("tau", [0.1, "rows"])
def test_tau_plus_without_negatives_raises(backend, fn, arrays, tau):
  # A global batch of 1 has no negatives to debias (it used to give NaN or 0.0).
  a = [jnp.ones(s, jnp.float32) for s in arrays]
  tau = jnp.full((1,), 0.1) if tau == "rows" else tau
  with pytest.raises(ValueError, match="tau_plus needs negatives, but at a global batch of 1"):
    fn(*a, tau_plus=tau, backend=backend)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_tau_plus_without_negatives_in_one_direction_raises(backend):
  # Hard negatives join the queries' softmax only: per direction, the documents' softmax
  # over queries (use_dq_negatives) of a batch of 1 has no negatives.
  q, d, h = jnp.ones((1, 8)), jnp.ones((1, 8)), jnp.ones((1, 2, 8))
  assert jnp.isfinite(mj.qwen3_loss(q, d, h, tau_plus=0.1, backend=backend))
  with pytest.raises(ValueError, match="softmax of this loss has none"):
    mj.qwen3_loss(q, d, h, tau_plus=0.1, use_dq_negatives=True, partition="per_direction",
                  backend=backend)


@pytest.mark.parametrize("fn", [mj.clip_loss, mj.qwen3_loss])
@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_float8_is_a_type_error(fn, dtype):
  a = jnp.ones((4, 8), dtype)
  with pytest.raises(TypeError, match=f"{_names(fn)[0]} must be float16, bfloat16, float32 or "
                     f"float64.*float8"):
    fn(a, a, backend="blockwise")


def test_float8_hard_negatives_is_a_type_error():
  with pytest.raises(TypeError, match="hard_negatives must be float16, bfloat16, float32"):
    mj.qwen3_loss(x, x, jnp.ones((4, 2, 8), jnp.float8_e4m3fn), backend="blockwise")


def test_float64_on_the_triton_backends_is_a_type_error():
  with jax.enable_x64(True):
    a = jnp.ones((4, 8), jnp.float64)
    with pytest.raises(TypeError, match="backend='interpret' computes in float16, bfloat16 or "
                       "float32, got float64"):
      mj.clip_loss(a, a, backend="interpret")


# --- sharded and the ring ----------------------------------------------------------

def _mesh(n, name="batch"):
  return Mesh(np.array(jax.devices()[:n]), (name,))


@pytest.mark.parametrize("axis", ["wrong", ("data", "model")])
def test_sharded_unknown_axis(axis):
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "fsdp"))
  with pytest.raises(ValueError, match=re.escape(f"axis_name={axis!r}: the mesh has axes "
                                                 f"('data', 'fsdp')")):
    mj.sharded(mj.clip_loss, mesh, axis)


@pytest.mark.parametrize("a,b,pattern", [
    ((16, 8), (8, 8), "same batch size, got image_features.shape=\\(16, 8\\) and "
                      "text_features.shape=\\(8, 8\\)"),
    ((16, 8), (16, 7), "same feature dim, got image_features.shape=\\(16, 8\\)"),
])
def test_sharded_errors_name_the_global_shapes(a, b, pattern):
  with pytest.raises(ValueError, match=pattern):
    mj.sharded(mj.clip_loss, _mesh(4), "batch")(jnp.ones(a), jnp.ones(b), backend="blockwise")


def test_sharded_where_error_names_the_global_shape():
  # (A global batch of 10 on 4 devices is no error: sharded pads it, tests/test_where.py.)
  x = jnp.ones((10, 8))
  with pytest.raises(ValueError, match="where must have shape \\(batch,\\)=\\(10,\\), got "
                     "where.shape=\\(8,\\)"):
    mj.sharded(mj.clip_loss, _mesh(4), "batch")(x, x, where=np.ones(8, bool),
                                                backend="blockwise")


def test_sharded_per_row_tau_error_names_the_global_shape():
  x = jnp.ones((16, 8))
  with pytest.raises(ValueError, match="tau_plus must have shape \\(batch,\\)=\\(16,\\), got "
                     "tau_plus.shape=\\(8,\\)"):
    mj.sharded(mj.clip_loss, _mesh(4), "batch")(x, x, tau_plus=np.full(8, 0.1),
                                                backend="blockwise")


@pytest.mark.parametrize("axis_name", ["batch", ("batch",)])
def test_replicated_inputs_with_axis_name(axis_name):
  # P() hands every device the whole batch: the ring would count it W times.
  x, y, _ = data.towers(6, 8, noise=0.5, k=2, hard_noise=0.7)
  run = jax.shard_map(lambda a, b: mj.clip_loss(a, b, axis_name=axis_name, backend="blockwise"),
                      mesh=_mesh(2), in_specs=(P(), P()), out_specs=P())
  with pytest.raises(ValueError, match="image_features is replicated over mesh axis 'batch'"):
    jax.jit(run)(x, y)


@pytest.mark.parametrize("fn,name", [(mj.clip_loss, "temperature"), (mj.siglip_loss, "bias"),
                                     (mj.qwen3_loss, "margin"), (mj.lit_loss, "tau_plus")])
def test_hyperparameters_varying_over_the_ring_raise(fn, name):
  # A 0-d temperature (bias, margin, tau_plus) that differs between the ring's devices
  # defines no global loss: each device scaled its own logits, and the gradient differed
  # by device. Replicated, the same value is the single-device loss; a per-row tau_plus
  # sharded with the batch stays a shard.
  x, y = data.features(0, [(8, 8), (8, 8)], jnp.float32)
  value = dict(temperature=0.07, bias=-2.0, margin=0.1, tau_plus=0.1)[name]
  call = lambda a, b, v: fn(a, b, **{name: v}, axis_name="batch", backend="blockwise")[None]
  varying = jax.shard_map(lambda a, b, v: call(a, b, v[0]), mesh=_mesh(2),
                          in_specs=(P("batch"),) * 3, out_specs=P("batch"))
  with pytest.raises(ValueError, match=f"{name} varies over mesh axis 'batch', but the ring's "
                                       f"loss takes one {name} on every device"):
    varying(x, y, jnp.asarray([value, 2 * value], jnp.float32))
  replicated = jax.shard_map(call, mesh=_mesh(2), in_specs=(P("batch"), P("batch"), P()),
                             out_specs=P("batch"))
  got = replicated(x, y, jnp.float32(value))
  want = fn(x, y, **{name: jnp.float32(value)}, backend="blockwise")
  np.testing.assert_allclose(got, [want, want], rtol=1e-6)


def test_replicated_shared_negatives_with_axis_name():
  # A memory bank copied to every device would count each column once a device: the
  # error says they are shards of the global columns.
  x, y = data.features(0, [(8, 8), (8, 8)], jnp.float32)
  run = jax.shard_map(lambda a, b, s: mj.clip_loss(a, b, s, axis_name="batch",
                                                   backend="blockwise")[None],
                      mesh=_mesh(2), in_specs=(P("batch"), P("batch"), P()),
                      out_specs=P("batch"))
  with pytest.raises(ValueError, match=r"shared_negatives is replicated over mesh axis "
                     r"'batch'.*its own shard of the shared columns"):
    run(x, y, x[:4])


def test_sharded_names_what_it_splits():
  # A wrapper's other array arguments (a positional s, parameters) are split along the
  # batch too: the error says only shared_negatives is not, and to close over the rest.
  x = jnp.ones((13, 8))
  loss = mj.sharded(lambda a, b, s, **k: mj.clip_loss(a, b, s, **k), _mesh(2), "batch")
  with pytest.raises(ValueError, match=r"s with shape \(8, 8\) does not share the leading "
                     r"batch axis of the other arrays \(13\): every array argument is split "
                     r"along the batch but shared_negatives"):
    loss(x, x, jnp.ones((8, 8)), backend="blockwise")


def test_unbound_axis_in_a_tuple():
  with pytest.raises(ValueError, match="axis_name=\\('batch', 'model'\\) is not bound"):
    jax.shard_map(lambda a: mj.clip_loss(a, a, axis_name=("batch", "model"),
                                         backend="blockwise"),
                  mesh=_mesh(2), in_specs=P("batch"), out_specs=P())(jnp.ones((4, 8)))


# --- where= -------------------------------------------------------------------------

def test_where_validation():
  x, y = data.features(0, [(19, 24), (19, 24)], jnp.float32)
  with pytest.raises(TypeError, match="where must be a bool"):
    mj.clip_loss(x, y, where=np.ones(19, np.float32), backend="blockwise")
  with pytest.raises(ValueError, match=r"where must have shape \(batch,\)"):
    mj.clip_loss(x, y, where=np.ones(20, bool), backend="blockwise")
  with pytest.raises(TypeError, match="where must be a bool"):
    mj.clip_loss(x, y, where=[True] * 19, backend="blockwise")


def test_sharded_uneven_batch_needs_where():
  def loss(x, y, *, axis_name=None):
    return mj.clip_loss(x, y, axis_name=axis_name, backend="blockwise")

  x, y = data.features(0, [(9, 24), (9, 24)], jnp.float32)
  mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
  with pytest.raises(ValueError, match="takes no where="):
    mj.sharded(loss, mesh, "batch")(x, y)


def test_sharded_shared_negatives_must_split_evenly():
  # The README: sharded pads an uneven batch, not the shared negative columns.
  x, y = data.features(0, [(9, 24), (9, 24)], jnp.float32)
  mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
  with pytest.raises(ValueError, match=r"shared_negatives with shape \(3, 24\) does not "
                     r"split into 2 equal shards"):
    mj.sharded(mj.clip_loss, mesh, "batch")(x, y, x[:3], backend="blockwise")


@pytest.mark.parametrize("fn,extra", [
    (mj.clip_loss, "temperature"), (mj.siglip_loss, "bias"),
    (mj.qwen3_loss, "hard_negatives"), (mj.lit_qwen3_loss, "shared_negatives"),
    (mj.lit_loss, "where")])
def test_arrays_on_different_devices_are_named(fn, extra):
  # Committed to different devices, the arrays raise naming them (JAX's error named
  # the library's internal "stack"); an uncommitted array follows the others.
  d0, d1 = jax.devices()[:2]
  q, k = data.features(0, [(6, 8), (6, 8)], jnp.float32)
  values = dict(temperature=jnp.float32(0.1), bias=jnp.float32(-1.0),
                hard_negatives=jnp.ones((6, 2, 8)), shared_negatives=jnp.ones((3, 8)),
                where=jnp.arange(6) < 5)
  call = lambda a, b, v: fn(a, b, **{extra: v})
  on = lambda a, dev: jax.device_put(a, dev)
  with pytest.raises(ValueError, match=r"\w+_features and \w+_features are on different "
                                       r"devices .*device ids \[0\].*\[1\]"):
    call(on(q, d0), on(k, d1), values[extra])
  with pytest.raises(ValueError, match=rf"_features and {extra} are on different devices"):
    call(on(q, d1), on(k, d1), on(values[extra], d0))
  want = call(q, k, values[extra])
  got = call(on(q, d1), k, values[extra])   # k, the extra: uncommitted
  assert got.devices() == {d1}
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --- Matryoshka: the fused options, the eager wrapper, the reference ----------------

@pytest.mark.parametrize("fn", [mj.clip_loss, mj.lit_qwen3_loss])
@pytest.mark.parametrize("kwargs,err,pattern", [
    (dict(matryoshka_dims=()), ValueError, "matryoshka_dims must not be empty"),
    (dict(matryoshka_dims=(4, 4, 8)), ValueError, "matryoshka_dims must be strictly increasing"),
    (dict(matryoshka_dims=(4, 2, 8)), ValueError, "matryoshka_dims must be strictly increasing"),
    (dict(matryoshka_dims=(0, 8)), ValueError, "matryoshka_dims must be strictly increasing "
     "positive"),
    (dict(matryoshka_dims=(-4, 8)), ValueError, "positive ints"),
    (dict(matryoshka_dims=(2, 4)), ValueError, "matryoshka_dims must end at the feature size 8"),
    (dict(matryoshka_dims=(4, 16)), ValueError, "must end at the feature size 8"),
    (dict(matryoshka_dims=(4.0, 8)), TypeError, "matryoshka_dims must hold ints"),
    (dict(matryoshka_dims=8), TypeError, "matryoshka_dims must be a sequence"),
    (dict(matryoshka_dims=jnp.array([4.0, 8.0])), TypeError, "matryoshka_dims must hold ints"),
    (dict(matryoshka_dims=np.array([[4, 8]])), TypeError,
     "matryoshka_dims must be a sequence of ints, got matryoshka_dims.shape=\\(1, 2\\)"),
    (dict(matryoshka_dims=jnp.array([2, 4])), ValueError, "must end at the feature size 8"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(1.0,)), ValueError,
     "matryoshka_weights must have one entry per dim \\(2\\), got 1"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(1.0, float("nan"))), ValueError,
     "matryoshka_weights must be finite"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(1.0, float("inf"))), ValueError,
     "matryoshka_weights must be finite"),
    # finite as Python floats, inf in the float32 computation (an inf loss)
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(1.0, -1e39)), ValueError,
     "matryoshka_weights must be a finite float32 number.*-1.e\\+39"),
    (dict(matryoshka_weights=(1.0,)), ValueError, "matryoshka_weights needs matryoshka_dims"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(True, False)), TypeError,
     "matryoshka_weights must hold numbers"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=("a", "b")), TypeError,
     "matryoshka_weights must hold numbers"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=("1.0", "2")), TypeError,
     "matryoshka_weights must hold numbers"),   # (float("2") would accept it)
])
def test_matryoshka_options_validation(fn, kwargs, err, pattern):
  x = jnp.ones((4, 8), jnp.float32)
  with pytest.raises(err, match=pattern):
    fn(x, x, backend="blockwise", **kwargs)
  with pytest.raises(err, match=pattern):   # at trace time, under jit
    jax.jit(lambda a: fn(a, a, backend="blockwise", **kwargs)).lower(x)


def test_matryoshka_eager_validation():
  x = jnp.ones((4, 8), jnp.float32)
  for dims, weights, err, pattern in [
      ((), None, ValueError, "dims must not be empty"),
      ((4, 2), None, ValueError, "dims must be strictly increasing"),
      ((0, 4), None, ValueError, "positive"),
      ((2, 4), (1.0,), ValueError, "weights must have one entry per dim"),
      ((2, 4), (1.0, float("nan")), ValueError, "weights must be finite")]:
    with pytest.raises(err, match=pattern):
      mj.matryoshka(mj.clip_loss, dims, weights)
  # finite as Python floats, inf where they multiply the float32 losses: refused at the
  # call, which knows the losses' dtype (float64 features keep float64's range)
  with pytest.raises(ValueError, match="weights must be a finite float32 number"):
    mj.matryoshka(mj.clip_loss, (4, 8), (1e39, 1.0))(x, x, backend="blockwise")
  with jax.enable_x64(True):
    x64 = jnp.asarray(jax.random.normal(jax.random.key(0), (4, 8)), jnp.float64)
    want = 1e39 * mj.clip_loss(x64[:, :4], x64[:, :4], backend="reference")
    got = mj.matryoshka(mj.clip_loss, (4, 8), (1e39, 0.0))(x64, x64, backend="blockwise")
    np.testing.assert_allclose(got, want, rtol=1e-12)
  with pytest.raises(ValueError, match="dims must not exceed the feature size 8"):
    mj.matryoshka(mj.clip_loss, (4, 16))(x, x, backend="blockwise")
  with pytest.raises(ValueError, match="normalized_inputs=False"):
    mj.matryoshka(mj.clip_loss, (4, 8))(x, x, normalized_inputs=True, backend="blockwise")
  # A call the loss would refuse is refused as the loss refuses it, naming the argument
  # (were an IndexError and an AttributeError).
  eager = mj.matryoshka(mj.clip_loss, (4, 8))
  with pytest.raises(TypeError, match="image_features must be an array, got list"):
    eager(np.ones((4, 8)).tolist(), x, backend="blockwise")
  with pytest.raises(TypeError, match="clip_loss\\(\\) missing a required argument: "
                                      "'text_features'"):
    eager(image_features=x, backend="blockwise")
  with pytest.raises(TypeError, match="clip_loss\\(\\) got an unexpected keyword argument 'bogus'"):
    eager(x, x, bogus=1)
  # A loss that is no callable, at once (was "'int' object is not callable" at the call).
  with pytest.raises(TypeError, match="loss_fn must be a callable loss, got str"):
    mj.matryoshka("clip_loss", (4, 8))
  with pytest.raises(TypeError, match="base_loss must be a callable loss, got int"):
    C.MatryoshkaLoss(3, (4, 8))


def test_matryoshka_dims_as_arrays():
  # A numpy or concrete jax array of ints is the tuple it holds (the dims set the
  # kernels' shapes, so a traced one is refused). Reference: the dense fused loss, fp32.
  x, y = (jax.random.normal(k, (6, 8), jnp.float32) for k in jax.random.split(jax.random.key(3)))
  want = reference.matryoshka_fused(reference.clip_loss, x, y, dims=(4, 8))
  for dims in (np.array([4, 8]), jnp.array([4, 8], jnp.int32)):
    np.testing.assert_allclose(mj.clip_loss(x, y, matryoshka_dims=dims, backend="blockwise"),
                               want, rtol=1e-5)
    np.testing.assert_allclose(mj.matryoshka(mj.clip_loss, dims)(x, y, backend="blockwise"),
                               want, rtol=1e-5)
  with pytest.raises(TypeError, match="matryoshka_dims must be static.*got a traced array"):
    jax.jit(lambda d: mj.clip_loss(x, y, matryoshka_dims=d, backend="blockwise"))(
        jnp.array([4, 8]))


def test_matryoshka_eager_refuses_bound_normalized_inputs_and_stats_functions():
  x = jnp.ones((4, 8), jnp.float32)
  with pytest.raises(ValueError, match="got loss_fn.normalized_inputs=True"):
    mj.matryoshka(functools.partial(mj.clip_loss, normalized_inputs=True), (4, 8))
  with pytest.raises(TypeError, match="loss_fn must return the loss, a scalar array, got "
                                      "tuple.*not a \\*_with_stats one"):
    mj.matryoshka(mj.clip_loss_with_stats, (4, 8))(x, x, backend="blockwise")


def test_reference_matryoshka_validation():
  with pytest.raises(ValueError, match="strictly increasing"):
    reference.matryoshka(reference.clip_loss, (4, 2))
  with pytest.raises(ValueError, match="one entry per dim"):
    reference.matryoshka(reference.clip_loss, (2, 4), weights=(1.0,))
  x = jnp.ones((2, 4))
  with pytest.raises(ValueError, match="dims must not exceed the feature size 4"):
    reference.matryoshka(reference.clip_loss, (2, 8))(x, x)
  with pytest.raises(ValueError, match="normalized_inputs"):
    reference.matryoshka(reference.clip_loss, (2, 4))(x, x, normalized_inputs=True)
  with pytest.raises(ValueError, match="dims must end at the feature size 4"):
    reference.matryoshka_fused(reference.clip_loss, x, x, dims=(2,))
  with pytest.raises(ValueError, match="weights must be a finite float32 number"):
    reference.matryoshka_fused(reference.clip_loss, x, x, dims=(2, 4), weights=(1.0, 1e39))


# --- KernelConfig ------------------------------------------------------------------

# A value of the wrong type raises TypeError, a right-typed value out of range ValueError
# (STYLE.md §3), as the losses' own keywords do.
@pytest.mark.parametrize("field,value,error", [
    ("fwd_tiled", 1, TypeError), ("bwd_tiled", "yes", TypeError),
    ("slab_kib", 0, ValueError), ("min_slab_rows", -1, ValueError),
    ("fwd_block_m", 48, ValueError), ("fwd_one_sided_warps", 0, ValueError),
    ("bwd_num_warps", True, TypeError), ("matryoshka_per_dim", 1, TypeError),
    ("bwd_pair_max_batch", -1, ValueError), ("bwd_pair_max_batch", 2.0, TypeError),
    ("pair_block_cols", "8192", TypeError), ("bwd_row_role", (128, 1), TypeError)])
@pytest.mark.filterwarnings("ignore:KernelConfig.*flat spellings:DeprecationWarning")
def test_bad_config_fields_raise(field, value, error):
  # (the flat spellings on purpose: each still validates, naming its field)
  with pytest.raises(error, match=field):
    KernelConfig(**{field: value})


@pytest.mark.parametrize("field,value,error", [("block_n", 48, ValueError),
                                               ("num_stages", 0, ValueError),
                                               ("num_stages", 2.0, TypeError),
                                               ("tma", 1, TypeError)])
def test_bad_role_tiles_raise(field, value, error):
  with pytest.raises(error, match=f"RoleTiles.{field}"):
    RoleTiles(**{field: value})


# --- grad_cache --------------------------------------------------------------------

def test_grad_cache_validation():
  embed, loss_fn = towers.embed, towers.loss("clip")
  for bad in (0, -2):
    with pytest.raises(ValueError, match="chunk_size"):
      grad_cache(embed, loss_fn, chunk_size=bad)
  for bad in (2.0, True, None, "4"):
    with pytest.raises(TypeError, match="chunk_size"):
      grad_cache(embed, loss_fn, chunk_size=bad)
  step = grad_cache(embed, loss_fn, chunk_size=4)
  params = towers.params(jnp.float32)
  with pytest.raises(ValueError, match="batch"):
    step(params, {"a": jnp.ones((8, FEAT)), "b": jnp.ones((9, FEAT))})
  with pytest.raises(ValueError, match="batch"):
    step(params, {"a": jnp.ones((0, FEAT)), "b": jnp.ones((0, FEAT))})
  bad_embed = lambda p, c, k: {"a": towers.mlp(p["a"], c["a"])[:1], "b": towers.mlp(p["b"], c["b"])}
  with pytest.raises(ValueError, match="embed_fn"):
    jax.jit(grad_cache(bad_embed, loss_fn, chunk_size=4))(params, towers.batch(8, jnp.float32))


# --- the memeff classes (memeff_jax.classes) -----------------------------------------

DIMS = (8, 16)


def test_matryoshka_loss_refuses_normalized_inputs():
  with pytest.raises(ValueError, match="normalized_inputs"):
    C.MatryoshkaLoss(C.MemoryEfficientCLIPLoss(normalized_inputs=True), dims=DIMS)


def test_matryoshka_classes_check_dims_and_a_bound_normalized_inputs():
  with pytest.raises(ValueError, match="loss_fn.normalized_inputs=True"):
    C.MatryoshkaLoss(functools.partial(mj.clip_loss, normalized_inputs=True), dims=DIMS)
  for dims in (None, 8):
    with pytest.raises(TypeError, match=f"dims must be a sequence of ints, got dims={dims}"):
      C.MemoryEfficientMatryoshkaCLIPLoss(dims=dims)
  for weights in ((True, True), ("1", "2")):
    with pytest.raises(TypeError, match="weights must hold numbers"):
      C.MemoryEfficientMatryoshkaCLIPLoss(dims=(8, 16), weights=weights)


# --- the Flax modules (memeff_jax.nnx, memeff_jax.linen) ----------------------------

FRAMEWORKS = ("nnx", "linen")


def _flax_module(framework):
  pytest.importorskip("flax")
  from memeff_jax import linen as mlinen  # pylint: disable=g-import-not-at-top
  from memeff_jax import nnx as mnnx  # pylint: disable=g-import-not-at-top
  return mnnx if framework == "nnx" else mlinen


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_temperature(framework):
  module = _flax_module(framework).CLIPLoss
  with pytest.raises(ValueError, match="temperature"):
    module(temperature=0.0)
  with pytest.raises(TypeError, match="temperature"):
    module(temperature=jnp.float32(0.07))   # the initial value is a Python float


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("learnable", ["False", None, 0])
def test_learnable_must_be_a_bool(framework, learnable):
  module = _flax_module(framework).CLIPLoss
  with pytest.raises(TypeError, match=f"learnable must be a bool, got learnable={learnable!r}"):
    module(learnable=learnable)


@pytest.mark.parametrize("framework", ["nnx", "linen"])
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(matryoshka_dims=8), TypeError, "matryoshka_dims must be a sequence of ints"),
    (dict(matryoshka_dims=(8, 4)), ValueError, "matryoshka_dims must be strictly increasing"),
    (dict(matryoshka_dims=(4, 8), matryoshka_weights=(1.0,)), ValueError,
     "matryoshka_weights must have one entry per dim"),
    (dict(matryoshka_weights=0.5), TypeError, "matryoshka_weights must be a sequence")])
def test_matryoshka_options_named_at_construction(framework, kwargs, error, match):
  module = _flax_module(framework).CLIPLoss
  with pytest.raises(error, match=match):
    module(**kwargs)
