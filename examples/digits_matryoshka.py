"""Matryoshka CLIP on real data: scikit-learn's digits, two augmented views per image.

Each 8x8 digit (``sklearn.datasets.load_digits``: 1,797 images, bundled, no download) is
seen through two random augmentations (a small rotation, scaling and shift, pixel noise,
random erasing); one shared Flax NNX MLP embeds both views into 64 dims, and the fused
Matryoshka CLIP loss (``matryoshka_dims=(8, 16, 32, 64)``: the sum of the CLIP losses on
the first 8, 16, 32 and 64 features, each prefix renormalized) pulls the two views of
an image together. ``memeff_jax.nnx.CLIPLoss`` holds the learnable temperature and
calls ``memeff_jax.clip_loss(x, y, temperature=t, matryoshka_dims=DIMS, stable=False,
backend="auto")``; ``stable=False``: the gradients are those of the printed loss.

On held-out images it then reports, at each Matryoshka dim (the prefix, renormalized):
retrieval top-1 between two augmented views, and the k-NN (k = 5, cosine) accuracy of
the digit labels against the train embeddings. It writes a PNG: accuracy vs embedding
dim, and the loss curves. About 30 s on 2 CPU cores.

Run from the checkout, with the package and its extras installed
(``pip install -e ".[examples]"``): python examples/digits_matryoshka.py [PNG]
The PNG goes to the path given, else to ``DIGITS_PNG``, else to
``digits_matryoshka.png`` in the temporary folder; the committed picture is rewritten
only when asked for (python examples/digits_matryoshka.py examples/digits_matryoshka.png).
``DIGITS_STEPS`` sets the training steps (default 1000).
"""

import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from memeff_jax import nnx as mnnx

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DIMS = (8, 16, 32, 64)
HIDDEN, BATCH, K = 256, 256, 5
STEPS = int(os.environ.get("DIGITS_STEPS", 1000))
PNG = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DIGITS_PNG")
       or os.path.join(tempfile.gettempdir(), "digits_matryoshka.png"))

digits = load_digits()
images = (digits.images / 16.0).astype(np.float32)  # [1797, 8, 8] in [0, 1]
x_train, x_test, y_train, y_test = train_test_split(
    images, digits.target, test_size=500, stratify=digits.target, random_state=0)
x_train, x_test = jnp.asarray(x_train), jnp.asarray(x_test)


def augment_one(key, image):
  """Rotate (+-15 deg), scale (0.9-1.1), shift (+-0.5 px), add noise, erase a patch (p=0.5)."""
  ka, ks, kt, kn, ke, kp = jax.random.split(key, 6)
  angle = jax.random.uniform(ka, minval=-0.26, maxval=0.26)
  scale = jax.random.uniform(ks, minval=0.9, maxval=1.1)
  shift = jax.random.uniform(kt, (2,), minval=-0.5, maxval=0.5)
  rows, cols = jnp.meshgrid(jnp.arange(8.0) - 3.5, jnp.arange(8.0) - 3.5, indexing="ij")
  cos, sin = jnp.cos(angle) / scale, jnp.sin(angle) / scale
  src = [cos * rows - sin * cols + 3.5 - shift[0], sin * rows + cos * cols + 3.5 - shift[1]]
  out = jax.scipy.ndimage.map_coordinates(image, src, order=1, mode="constant", cval=0.0)
  out = out + 0.05 * jax.random.normal(kn, out.shape)
  corner = jax.random.randint(kp, (2,), 0, 6)  # a 3x3 patch inside the image
  inside = ((rows + 3.5 >= corner[0]) & (rows + 3.5 < corner[0] + 3)
            & (cols + 3.5 >= corner[1]) & (cols + 3.5 < corner[1] + 3))
  return jnp.where(inside & jax.random.bernoulli(ke), 0.0, out)


@jax.jit
def two_views(key, images):
  """Two independent augmentations of each image, flattened: ([n, 64], [n, 64])."""
  keys = jax.random.split(key, 2 * images.shape[0]).reshape(2, images.shape[0])
  views = jax.vmap(jax.vmap(augment_one), in_axes=(0, None))(keys, images)
  return views[0].reshape(-1, 64), views[1].reshape(-1, 64)


@jax.jit
def make_batch(key):
  """``BATCH`` train images drawn without replacement, seen twice: view i matches view i."""
  kb, kv = jax.random.split(key)
  return two_views(kv, x_train[jax.random.choice(kb, x_train.shape[0], (BATCH,), replace=False)])


class Encoder(nnx.Module):
  """A shared MLP, 64 -> 256 -> 256 -> 64, and the Matryoshka CLIP loss with its temperature."""

  def __init__(self, *, rngs: nnx.Rngs):
    self.hidden1 = nnx.Linear(64, HIDDEN, rngs=rngs)
    self.hidden2 = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, DIMS[-1], rngs=rngs)
    self.loss = mnnx.CLIPLoss(temperature=0.1, matryoshka_dims=DIMS, stable=False, backend="auto")

  def __call__(self, x):
    x = nnx.gelu(self.hidden2(nnx.gelu(self.hidden1(x))))
    return self.out(x)  # unnormalized: the loss renormalizes every prefix


def unit(z):
  return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def prefix(z, dim):
  """The first ``dim`` features, renormalized (what the loss sees for that dim)."""
  return unit(z[:, :dim])


def knn_accuracy(train, test):
  """Cosine k-NN (majority of the K nearest train labels) on the held-out images."""
  _, nearest = jax.lax.top_k(unit(test) @ unit(train).T, K)
  votes = jax.nn.one_hot(jnp.asarray(y_train)[nearest], 10).sum(axis=1)
  return float(jnp.mean(jnp.argmax(votes, axis=-1) == jnp.asarray(y_test)))


model = Encoder(rngs=nnx.Rngs(0))
# Weight decay on the matrices only: not on logit_scale (it would pull t towards 1) or
# the biases, as OpenCLIP.
decay_matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
optimizer = nnx.Optimizer(model, optax.adamw(2e-3, weight_decay=1e-4, mask=decay_matrices),
                          wrt=nnx.Param)


@nnx.jit
def train_step(model, optimizer, batch):
  view_a, view_b = batch

  def loss_fn(model):
    x, y = model(view_a), model(view_b)
    loss, stats = model.loss.with_stats(x, y)
    return loss, (stats, x, y)

  (loss, (stats, x, y)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  optimizer.update(model, grads)
  # In-batch top-1 at the full dim, counted densely (B x B) for this small batch; at scale
  # stats.accuracy_row (one per dim) gives it from the loss's own pass.
  x, y = unit(x), unit(y)
  accuracy = jnp.mean(jnp.argmax(x @ y.T, axis=-1) == jnp.arange(BATCH))
  return loss, stats.matryoshka_losses, accuracy


print(f"devices: {jax.devices()}  train {x_train.shape[0]} / held-out {x_test.shape[0]}  "
      f"batch={BATCH}  dims={DIMS}  steps={STEPS}")
losses, start = [], time.perf_counter()
tick, last = start, 0
for step, key in enumerate(jax.random.split(jax.random.key(1), STEPS)):
  loss, per_dim, accuracy = train_step(model, optimizer, make_batch(key))
  losses.append(per_dim)  # kept on device: the loss is their sum
  if step % 100 == 0 or step == STEPS - 1:
    now, elapsed = float(loss), time.perf_counter() - tick  # float() waits for the step
    speed = f"{(step - last) / elapsed:.0f} steps/s" if step else f"compiled in {elapsed:.1f} s"
    print(f"step {step:4d}  loss {now:.3f}  per dim {np.round(np.asarray(per_dim), 2)}  "
          f"in-batch top-1 {accuracy:.3f}  t {model.loss.current_temperature():.3f}  {speed}")
    tick, last = time.perf_counter(), step
print(f"trained in {time.perf_counter() - start:.1f} s (compilation included)")

view_a, view_b = map(model, two_views(jax.random.key(2), x_test))
train_z, test_z = model(x_train.reshape(-1, 64)), model(x_test.reshape(-1, 64))
retrieval, knn = [], []
for dim in DIMS:
  a, b = prefix(view_a, dim), prefix(view_b, dim)
  retrieval.append(float(jnp.mean(jnp.argmax(a @ b.T, axis=-1) == jnp.arange(len(a)))))
  knn.append(knn_accuracy(train_z[:, :dim], test_z[:, :dim]))
  print(f"dim {dim:3d}: held-out view retrieval top-1 {retrieval[-1]:.3f} "
        f"(chance {1 / len(a):.3f})  {K}-NN label accuracy {knn[-1]:.3f}")

pixels = knn_accuracy(x_train.reshape(-1, 64), x_test.reshape(-1, 64))
print(f"for reference, {K}-NN on the raw 64 pixels: {pixels:.3f}")

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
left.plot(DIMS, knn, "o-", label=f"{K}-NN digit accuracy")
left.plot(DIMS, retrieval, "s-", label="view retrieval top-1")
left.set_xscale("log", base=2)
left.set(xticks=DIMS, xticklabels=DIMS, ylim=(0, 1.02), ylabel="held-out accuracy",
         xlabel="embedding dim (prefix, renormalized)", title="accuracy vs embedding dim")
left.minorticks_off()
left.axhline(pixels, color="gray", ls=":", label=f"{K}-NN on raw pixels")
left.legend(loc="lower right")
left.grid(alpha=0.3)
losses = np.asarray(jnp.stack(losses))  # [steps, len(DIMS)]
for k, dim in enumerate(DIMS):
  right.plot(losses[:, k], lw=0.8, label=f"dim {dim}")
right.set(xlabel="step", ylabel="CLIP loss",
          title="training loss of each dim (the loss: their sum)")
right.legend()
right.grid(alpha=0.3)
fig.suptitle("Matryoshka CLIP on sklearn digits (two augmented views, NNX MLP)")
fig.tight_layout()
fig.savefig(PNG, dpi=100)
print(f"wrote {PNG}")
assert losses[-1].sum() < losses[0].sum(), "the loss should decrease"
