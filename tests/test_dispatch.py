"""Backend resolution and its errors; the losses under the caller's vmap and numpy
promotion settings."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import memeff_jax as mj
from memeff_jax import backends, clip_loss
from memeff_jax.backends.blockwise import BlockwiseBackend
from memeff_jax.backends.reference import ReferenceBackend


def test_auto_is_blockwise_without_gpu():
  assert jax.default_backend() == "cpu"
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # silently: on a CPU blockwise is the choice
    assert isinstance(backends.resolve("auto"), BlockwiseBackend)
  assert isinstance(backends.resolve("reference"), ReferenceBackend)


def test_auto_on_a_gpu_without_the_kernels_warns_once(monkeypatch):
  # A GPU whose jax-triton does not import: "auto" runs blockwise, which is several times
  # slower there, so it says so (once a reason, a RuntimeWarning naming the cause); on
  # a CPU it stays silent (the test above).
  def no_jax_triton():
    raise ImportError("No module named 'jax_triton'")
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(mj._compat, "jax_triton", no_jax_triton)
  backends.registry._warn_auto_blockwise.cache_clear()
  with pytest.warns(RuntimeWarning, match=r"backend='auto' runs the pure-JAX blockwise "
                    r"backend on this GPU.*jax-triton does not import.*No module named"):
    assert isinstance(backends.resolve("auto"), BlockwiseBackend)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert isinstance(backends.resolve("auto"), BlockwiseBackend)    # once
    assert isinstance(backends.resolve("auto", jnp.float64), BlockwiseBackend)  # by choice
  backends.registry._warn_auto_blockwise.cache_clear()


def test_triton_without_gpu_is_a_clear_error():
  with pytest.raises(ValueError, match="backend='triton' is unavailable: it needs a CUDA GPU"):
    clip_loss(jnp.ones((2, 4)), jnp.ones((2, 4)), backend="triton")


def test_unknown_backend():
  with pytest.raises(ValueError, match="backend='xla'; expected one of \\('auto', 'triton', "
                     "'interpret', 'blockwise', 'reference'\\)"):
    clip_loss(jnp.ones((2, 4)), jnp.ones((2, 4)), backend="xla")


def test_vmap_over_interpret_raises():
  # triton_call (GPU) and the interpreter's pure_callback have no batching rule.
  x = jnp.ones((3, 2, 4))
  with pytest.raises(NotImplementedError):
    jax.vmap(lambda a: clip_loss(a, a, backend="interpret"))(x)


def test_vmap_over_blockwise_works():
  x = jax.random.normal(jax.random.key(0), (3, 5, 4))
  got = jax.vmap(lambda a: clip_loss(a, a[::-1], backend="blockwise"))(x)
  want = jnp.stack([clip_loss(a, a[::-1], backend="reference") for a in x])
  assert jnp.allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("case", ["temperatures", "image_batches", "siglip_biases"])
def test_grad_of_a_sum_over_vmap_wrt_an_unbatched_input(case):
  # jax.grad of a sum over jax.vmap on the blockwise backend, with respect to features
  # the vmap does not batch: the sum of the members' gradients, each taken alone on the
  # reference backend. (The NaN-gradient check's flag varies over the members where the
  # features do not; their summed cotangent came back once a member, N times too big.)
  k1, k2 = jax.random.split(jax.random.key(0))
  x, y = jax.random.normal(k1, (16, 8)), jax.random.normal(k2, (16, 8))
  if case == "temperatures":
    f = lambda be, x, t: mj.clip_loss(x, y, temperature=t, backend=be)
    members = jnp.array([0.05, 0.07, 0.1, 0.2])
  elif case == "image_batches":
    f = lambda be, y, a: mj.clip_loss(a, y, temperature=0.07, backend=be)
    members, x = jnp.stack([x, 2 * x + 1, -x]), y
  else:
    f = lambda be, x, b: mj.siglip_loss(x, y, temperature=0.1, bias=b, backend=be)
    members = jnp.array([-10.0, -5.0, 0.0])
  got = jax.grad(lambda v: jax.vmap(lambda m: f("blockwise", v, m))(members).sum())(x)
  want = sum(jax.grad(f, argnums=1)("reference", x, m) for m in members)
  assert jnp.max(jnp.abs(got - want)) <= 2e-5 * jnp.max(jnp.abs(want)), (
      float(jnp.linalg.norm(got) / jnp.linalg.norm(want)))


# (loss, backend, dtype): every family on blockwise (16-bit: the library's fp32
# statistics against the features) and on the dense reference in float32 (its masks
# against floats), the Triton glue under the interpreter, and float16.
_B = 12
_TAU = np.full((_B,), 0.05, np.float32)   # per-row: a [B] array against [K, B] blocks
_WHERE = np.arange(_B) % 4 != 0
_LOSSES = {
    "clip": lambda x, y, h, be: mj.clip_loss(x, y, tau_plus=_TAU, where=_WHERE,
                                             label_smoothing=0.1, lse_square_scale=1e-3,
                                             backend=be),
    "clip_mrl": lambda x, y, h, be: mj.clip_loss(x, y, tau_plus=_TAU,
                                                 matryoshka_dims=(8, 16), backend=be),
    "lit": lambda x, y, h, be: mj.lit_loss(x, y, tau_plus=_TAU, backend=be),
    "qwen3": lambda x, y, h, be: mj.qwen3_loss(x, y, h, use_qq_negatives=True,
                                               use_dd_negatives=True, tau_plus=_TAU,
                                               where=_WHERE, backend=be),
    "lit_qwen3": lambda x, y, h, be: mj.lit_qwen3_loss(x, y, h, use_qq_negatives=True,
                                                       backend=be),
    "siglip": lambda x, y, h, be: mj.siglip_loss(x, y, where=_WHERE, matryoshka_dims=(8, 16),
                                                 backend=be),
    "stats": lambda x, y, h, be: mj.clip_loss_with_stats(x, y, backend=be)[1].lse_row.sum(),
    "eager_mrl": lambda x, y, h, be: mj.matryoshka(mj.qwen3_loss, (8, 16))(x, y, h,
                                                                          backend=be),
    "reference_module": lambda x, y, h, be: (
        mj.reference.clip_loss(x, y, tau_plus=_TAU) + mj.reference.siglip_loss(x, y)
        + mj.reference.qwen3_loss(x, y, h, use_qq_negatives=True)),
}
_PROMOTION_CASES = (
    [(name, "blockwise", "bfloat16") for name in _LOSSES if name != "reference_module"]
    + [(name, "reference", "float32") for name in _LOSSES if name != "reference_module"]
    + [("clip", "interpret", "bfloat16"), ("qwen3", "interpret", "bfloat16"),
       ("siglip", "interpret", "bfloat16"), ("clip", "blockwise", "float16"),
       ("reference_module", "-", "bfloat16"), ("reference_module", "-", "float32")])


@pytest.mark.parametrize("name,backend,dtype", _PROMOTION_CASES)
def test_strict_promotion_and_rank_promotion_raise_are_the_callers(name, backend, dtype):
  # jax_numpy_dtype_promotion="strict" and jax_numpy_rank_promotion="raise" set by the
  # caller rule the caller's code, not the library's arithmetic: the value and every
  # gradient (traced under the settings, backward rules included) equal, bit for bit,
  # those of the same call under JAX's defaults (which the other tests compare with
  # float64).
  ks = jax.random.split(jax.random.key(0), 3)
  x, y = (jax.random.normal(k, (_B, 16)).astype(dtype) for k in ks[:2])
  h = jax.random.normal(ks[2], (_B, 2, 16)).astype(dtype)
  step = lambda: jax.jit(jax.value_and_grad(
      lambda *a: _LOSSES[name](*a, backend).astype(jnp.float32), argnums=(0, 1, 2)))(x, y, h)
  want = step()
  with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
    got = step()
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(g, w)
