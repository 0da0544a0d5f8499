"""Bad input raises a clear ValueError / TypeError at trace time, naming the argument."""

import warnings

import jax
import jax.numpy as jnp
import pytest

from memeff_jax import clip_loss, lit_loss, lit_qwen3_loss, qwen3_loss

x = jnp.ones((4, 8), jnp.float32)
PAIR = [clip_loss, lit_loss, qwen3_loss, lit_qwen3_loss]


def _names(fn):
  return (("image_features", "text_features") if fn is clip_loss else
          ("text_features", "image_features") if fn is lit_loss else
          ("query_features", "doc_features"))


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
    # finite in float64, not normal numbers (t or 1 / t) in the float32 computation
    (dict(temperature=1e39), ValueError,
     "temperature and 1 / temperature must be normal float32.*temperature=1e\\+39"),
    (dict(temperature=1e-40), ValueError, "must be normal float32.*temperature=1e-40"),
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


def test_unknown_keyword_names_the_loss():
  with pytest.raises(TypeError, match="^lit_qwen3_loss\\(\\) got an unexpected keyword "
                                      "argument 'use_dd_negatives'"):
    lit_qwen3_loss(x, x, use_dd_negatives=True, backend="blockwise")
