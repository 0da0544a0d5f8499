"""New temperature / margin values cause no recompilation (they are traced arrays)."""

import jax
import jax.numpy as jnp
import pytest

from memeff_jax import clip_loss, qwen3_loss


@pytest.mark.parametrize("backend", ["blockwise", "interpret"])
def test_temperature_and_margin_do_not_recompile(backend):
  x = jax.random.normal(jax.random.key(0), (9, 16))

  traces = []

  @jax.jit
  def step(x, t, m):
    traces.append(1)   # runs once per trace: a new value that retraced would add one
    f = lambda x, t: clip_loss(x, x[::-1], temperature=t, backend=backend) + qwen3_loss(
        x, x[::-1], temperature=t, margin=m, use_qq_negatives=True, backend=backend)
    return jax.value_and_grad(f, argnums=(0, 1))(x, t)

  values = [step(x, jnp.float32(t), jnp.float32(m)) for t, m in [(0.07, 0.1), (0.5, 0.3),
                                                                 (0.02, 0.0)]]
  assert len(traces) == 1
  assert len({float(v[0]) for v in values}) == 3   # the new values really were used
