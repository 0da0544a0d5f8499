"""The CLIP loss over a device mesh: ``memeff_jax.sharded`` and the ring.

The global batch is split along the mesh axis ``"batch"``; each device keeps only
its shard of both towers. Inside the loss the text shards travel around the ring
(``lax.ppermute``), so no device ever holds the B x B logits or the whole text
tower, yet every device gets the global loss and the gradient of its own rows.

On a CPU-only machine the script simulates 8 devices with
``--xla_force_host_platform_device_count=8``. It first checks that the sharded
loss and gradients equal the single-device ``clip_loss`` on the same global arrays,
then trains two tiny linear projections and a learnable temperature with optax.

Run from the checkout, with the package and its extras installed
(``pip install -e ".[examples]"``): python examples/sharded_clip.py
"""

import os

# Must happen before jax is imported. On a real multi-GPU/TPU host it is harmless:
# the flag only affects the CPU platform.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import memeff_jax  # noqa: E402

LATENT, IMAGE_DIM, TEXT_DIM, EMBED = 8, 32, 24, 16
# BATCH: the global batch. `sharded` takes any size (an uneven batch is padded with
# removed rows through where=); make_batch below lays the batch out on the mesh with
# jax.device_put, which needs a multiple of the device count.
BATCH, STEPS = 512, 100

mesh = Mesh(np.array(jax.devices()), ("batch",))
print(f"{len(jax.devices())} devices, mesh {dict(mesh.shape)}, global batch {BATCH} "
      f"({BATCH // mesh.size} rows per device)")
rows = NamedSharding(mesh, P("batch"))  # rows split over the devices
replicated = NamedSharding(mesh, P())   # parameters: a full copy on every device

# Synthetic pairs that share a latent z, laid out on the mesh.
k_img, k_txt, k_data, k_init = jax.random.split(jax.random.key(0), 4)
IMAGE_MAP = jax.random.normal(k_img, (LATENT, IMAGE_DIM))
TEXT_MAP = jax.random.normal(k_txt, (LATENT, TEXT_DIM))


def make_batch(key):
  kz, ki, kt = jax.random.split(key, 3)
  z = jax.random.normal(kz, (BATCH, LATENT))
  images = jnp.tanh(z @ IMAGE_MAP) + 0.3 * jax.random.normal(ki, (BATCH, IMAGE_DIM))
  texts = z @ TEXT_MAP + 0.3 * jax.random.normal(kt, (BATCH, TEXT_DIM))
  return jax.device_put(images, rows), jax.device_put(texts, rows)


ki, kt = jax.random.split(k_init)
params = jax.device_put({
    "w_image": jax.random.normal(ki, (IMAGE_DIM, EMBED)) / np.sqrt(IMAGE_DIM),
    "w_text": jax.random.normal(kt, (TEXT_DIM, EMBED)) / np.sqrt(TEXT_DIM),
    "log_temperature": jnp.log(jnp.float32(0.07)),
}, replicated)

# `sharded` wraps the loss in jax.shard_map over `mesh`: arrays with a batch axis are
# split along "batch", 0-d arrays (the temperature) are replicated, and the loss
# comes back replicated. Inside your own jax.shard_map (with per-device shards in
# hand) call the loss directly instead:
#   memeff_jax.clip_loss(x_shard, y_shard, temperature=t, axis_name="batch")
ring_clip_loss = memeff_jax.sharded(memeff_jax.clip_loss, mesh, "batch")


def make_loss_fn(clip_loss):
  def loss_fn(params, images, texts):
    x = images @ params["w_image"]  # [BATCH, EMBED], still sharded along "batch"
    y = texts @ params["w_text"]
    t = jnp.exp(params["log_temperature"])  # traced and learnable
    return clip_loss(x, y, temperature=t, backend="auto")
  return loss_fn


ring_loss_fn = make_loss_fn(ring_clip_loss)
dense_loss_fn = make_loss_fn(memeff_jax.clip_loss)  # one device sees everything

# Check once: the ring gives the single-device loss and gradients.
images, texts = make_batch(k_data)
ring_loss, ring_grads = jax.jit(jax.value_and_grad(ring_loss_fn))(params, images, texts)
images_1, texts_1 = jax.device_get((images, texts))  # plain host arrays, no mesh
params_1 = jax.device_get(params)
loss_1, grads_1 = jax.jit(jax.value_and_grad(dense_loss_fn))(params_1, images_1, texts_1)
loss_diff = float(jnp.abs(ring_loss - loss_1))
print(f"sharded loss {float(ring_loss):.6f}  single-device loss {float(loss_1):.6f}  "
      f"|diff| {loss_diff:.2e}")
assert loss_diff < 1e-5, loss_diff
for name in params:  # fp32 sums in a different order: compare relative to the gradient's size
  g_ring, g_1 = ring_grads[name], grads_1[name]
  rel = float(jnp.max(jnp.abs(g_ring - g_1)) / jnp.max(jnp.abs(g_1)))
  print(f"grad {name:16s} max |g| {float(jnp.max(jnp.abs(g_1))):.3e}  max rel diff {rel:.2e}")
  assert rel < 1e-5, (name, rel)

# Train with optax. jit sees sharded inputs and replicated parameters; the ring
# loss and its custom gradient run per device.
# (weight decay on the matrices only: a decayed log-temperature pulls t towards 1)
tx = optax.adamw(1e-2, weight_decay=1e-4, mask=lambda p: jax.tree.map(lambda v: v.ndim >= 2, p))
opt_state = tx.init(params)


@jax.jit
def train_step(params, opt_state, images, texts):
  loss, grads = jax.value_and_grad(ring_loss_fn)(params, images, texts)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


losses = []
for step, key in enumerate(jax.random.split(jax.random.key(1), STEPS)):
  params, opt_state, loss = train_step(params, opt_state, *make_batch(key))
  losses.append(loss)
  if step % 10 == 0 or step == STEPS - 1:
    print(f"step {step:3d}  loss {loss:.4f}  "
          f"temperature {jnp.exp(params['log_temperature']):.4f}")

print(f"images sharding: {images.sharding.spec}, loss sharding: {loss.sharding.spec}")
print(f"loss: first {losses[0]:.4f} -> final {losses[-1]:.4f}")
assert losses[-1] < losses[0], "the loss should decrease"
