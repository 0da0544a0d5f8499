"""Backend resolution and its errors."""

import jax
import jax.numpy as jnp
import pytest

import memeff_jax as mj
from memeff_jax import backends, clip_loss
from memeff_jax.backends.blockwise import BlockwiseBackend
from memeff_jax.backends.reference import ReferenceBackend


def test_auto_is_blockwise_without_gpu():
  assert jax.default_backend() == "cpu"
  assert isinstance(backends.resolve("auto"), BlockwiseBackend)
  assert isinstance(backends.resolve("reference"), ReferenceBackend)


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
