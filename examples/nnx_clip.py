"""Train a tiny CLIP-style dual encoder (Flax NNX) with ``memeff_jax.clip_loss``.

Two MLP towers embed synthetic "images" and "texts" that share a hidden latent;
the log-temperature is a learnable ``nnx.Param`` that the loss differentiates. The
loss never builds the B x B logits matrix: ``backend="auto"`` picks the Triton
kernels on a GPU (with jax-triton) and the pure-JAX blockwise backend elsewhere, so
this script runs on a laptop CPU in seconds. A small z-loss (``lse_square_scale``) keeps the
log-normalizers in check; ``clip_loss_with_stats`` reports it.

Run from the checkout, with the package and its extras installed
(``pip install -e ".[examples]"``): python examples/nnx_clip.py
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import memeff_jax

LATENT, IMAGE_DIM, TEXT_DIM = 8, 32, 24
HIDDEN, EMBED = 64, 16
BATCH, STEPS = 256, 200
Z_LOSS = 1e-4

# The synthetic world: a shared latent z seen through two fixed random maps.
world = jax.random.split(jax.random.key(42), 2)
IMAGE_MAP = jax.random.normal(world[0], (LATENT, IMAGE_DIM))
TEXT_MAP = jax.random.normal(world[1], (LATENT, TEXT_DIM))


@jax.jit
def make_batch(key):
  """``batch`` paired views of ``batch`` latents: image i and text i match."""
  kz, ki, kt = jax.random.split(key, 3)
  z = jax.random.normal(kz, (BATCH, LATENT))
  images = jnp.tanh(z @ IMAGE_MAP) + 0.3 * jax.random.normal(ki, (BATCH, IMAGE_DIM))
  texts = z @ TEXT_MAP + 0.3 * jax.random.normal(kt, (BATCH, TEXT_DIM))
  return images, texts


class Tower(nnx.Module):
  """Linear -> gelu -> Linear."""

  def __init__(self, din: int, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(din, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, EMBED, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.gelu(self.hidden(x)))


class DualEncoder(nnx.Module):
  """Image and text towers plus a learnable log-temperature (CLIP init: 0.07)."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.image_tower = Tower(IMAGE_DIM, rngs=rngs)
    self.text_tower = Tower(TEXT_DIM, rngs=rngs)
    self.log_temperature = nnx.Param(jnp.log(jnp.float32(0.07)))

  def temperature(self):
    # A traced 0-d array: the loss returns its gradient, and new values never recompile.
    # Clipped like CLIP's logit scale (at most 100 = 1 / 0.01).
    return jnp.exp(jnp.maximum(self.log_temperature[...], jnp.log(0.01)))

  def __call__(self, images, texts):
    # Unnormalized features: clip_loss L2-normalizes them (normalized_inputs=False).
    return self.image_tower(images), self.text_tower(texts)


model = DualEncoder(rngs=nnx.Rngs(0))
# Weight decay on the matrices only (OpenCLIP's rule): decaying the log-temperature
# would pull the temperature towards 1, and biases are not decayed either.
decay_matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
optimizer = nnx.Optimizer(model, optax.adamw(3e-3, weight_decay=1e-4, mask=decay_matrices),
                          wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, batch):
  images, texts = batch

  def loss_fn(model):
    x, y = model(images, texts)
    return memeff_jax.clip_loss_with_stats(
        x, y, temperature=model.temperature(), lse_square_scale=Z_LOSS, backend="auto")

  (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)  # in place: nothing to return but the metrics
  return loss, stats


print(f"devices: {jax.devices()}  batch={BATCH}  embed={EMBED}  z-loss scale={Z_LOSS}")
losses = []
for step, key in enumerate(jax.random.split(jax.random.key(1), STEPS)):
  loss, stats = train_step(model, optimizer, make_batch(key))
  losses.append(loss)  # kept on device: no host sync in the loop
  if step % 20 == 0 or step == STEPS - 1:
    print(f"step {step:4d}  loss {loss:.4f}  temperature {model.temperature():.4f}  "
          f"z_loss {stats.z_loss:.5f}  mean lse_row {stats.lse_row.mean():.2f}")

# Evaluate on a fresh batch: how often is the matching text the nearest one?
images, texts = make_batch(jax.random.key(123))
x, y = model(images, texts)
x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
y = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
accuracy = jnp.mean(jnp.argmax(x @ y.T, axis=-1) == jnp.arange(BATCH))
print(f"held-out image->text top-1 accuracy: {accuracy:.3f} (chance {1 / BATCH:.4f})")

print(f"loss: first {losses[0]:.4f} -> final {losses[-1]:.4f}")
assert losses[-1] < losses[0], "the loss should decrease"
