"""Backend resolution and its errors."""

import jax
import jax.numpy as jnp
import pytest

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
