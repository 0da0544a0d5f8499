"""Train a dual encoder (Flax NNX) at a batch its plain step does not fit, with
``memeff_jax.nnx.grad_cache``.

Two towers embed synthetic "images" (16 x 16 patterns) and "texts" (8 tokens) that
share a hidden latent: a convolution-free image MLP with dropout and BatchNorm, and a
token-embedding text tower. The loss is ``CLIPLoss`` with a learnable temperature, on
the global batch of ``BATCH`` pairs: every row competes with every other row. The
plain step (``nnx.value_and_grad`` over the whole batch) keeps every activation of the
batch; grad_cache keeps one chunk's. The script compiles both, prints their memory
against ``BUDGET_MIB``, trains with grad_cache only, and reports in-batch retrieval on
held-out pairs before and after. On 2 CPU cores it takes about a minute.

Run from the checkout (``pip install -e ".[examples]"``):
  python examples/large_batch_nnx.py [STEPS]
"""

import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import memeff_jax
from memeff_jax import nnx as mnnx

LATENT, SIDE, TOKENS, VOCAB = 16, 16, 8, 64
HIDDEN, EMBED = 512, 64
BATCH, CHUNK, BUDGET_MIB = 8192, 512, 160
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30

world = jax.random.split(jax.random.key(42), 2)
IMAGE_MAP = jax.random.normal(world[0], (LATENT, SIDE * SIDE)) / LATENT ** 0.5
TEXT_MAP = jax.random.normal(world[1], (LATENT, TOKENS))


def make_batch(key, n):
  """``n`` pairs: image i and text i come from latent i."""
  kz, ki = jax.random.split(key)
  z = jax.random.normal(kz, (n, LATENT))
  images = jnp.tanh(z @ IMAGE_MAP) + 0.3 * jax.random.normal(ki, (n, SIDE * SIDE))
  # Each token is one projection of the latent, quantized into VOCAB bins.
  tokens = jnp.clip(((z @ TEXT_MAP) / 8 + 0.5) * VOCAB, 0, VOCAB - 1).astype(jnp.int32)
  return {"images": images.reshape(n, SIDE, SIDE), "tokens": tokens}


class DualEncoder(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.image_in = nnx.Linear(SIDE * SIDE, HIDDEN, use_bias=False, rngs=rngs)
    self.image_norm = nnx.BatchNorm(HIDDEN, rngs=rngs)
    self.image_hidden = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
    self.image_out = nnx.Linear(HIDDEN, EMBED, rngs=rngs)
    self.token_embed = nnx.Embed(VOCAB * TOKENS, HIDDEN, rngs=rngs)
    self.text_hidden = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
    self.text_out = nnx.Linear(HIDDEN, EMBED, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    self.loss = mnnx.CLIPLoss(temperature=0.1)   # logit_scale: an nnx.Param

  def embed(self, batch):
    """{"images": [n, SIDE, SIDE], "tokens": [n, TOKENS]} -> two [n, EMBED] arrays."""
    h = self.image_in(batch["images"].reshape(-1, SIDE * SIDE))
    h = self.dropout(jax.nn.gelu(self.image_norm(h)))
    x = self.image_out(jax.nn.gelu(self.image_hidden(h)))
    # A token's id says its position too, so the mean over tokens keeps word order.
    t = self.token_embed(batch["tokens"] + VOCAB * jnp.arange(TOKENS)).mean(axis=1)
    t = self.dropout(jax.nn.gelu(self.text_hidden(jax.nn.gelu(t))))
    return {"images": x, "texts": self.text_out(t)}


embed_fn = lambda model, chunk: model.embed(chunk)
loss_fn = lambda model, e: model.loss(e["images"], e["texts"])
cached = mnnx.grad_cache(embed_fn, loss_fn, chunk_size=CHUNK)


def plain(model, batch):
  return nnx.value_and_grad(lambda m: loss_fn(m, embed_fn(m, batch)))(model)


@nnx.jit
def train_step(model, optimizer, batch):
  loss, grads = cached(model, batch)
  optimizer.update(model, grads)
  return loss


@nnx.jit
def retrieval(model, batch):
  """Top-1 accuracy of image -> text retrieval among the batch, without dropout."""
  e = embed_fn(model, batch)
  _, stats = memeff_jax.clip_loss_with_stats(e["images"], e["texts"])
  return stats.accuracy_row


def compiled_mib(step, model, batch):
  """Temporary memory XLA plans for one step (arguments and outputs excluded)."""
  graphdef, state = nnx.split(model)
  pure = lambda state, batch: step(nnx.merge(graphdef, state), batch)
  return jax.jit(pure).lower(state, batch).compile().memory_analysis() \
      .temp_size_in_bytes / 2**20


def main():
  model = DualEncoder(rngs=nnx.Rngs(0, dropout=1))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  shapes = jax.eval_shape(lambda: make_batch(jax.random.key(0), BATCH))
  need_plain, need_cached = compiled_mib(plain, model, shapes), compiled_mib(cached, model, shapes)
  print(f"batch {BATCH}: plain step needs {need_plain:.0f} MiB of temporaries, grad_cache "
        f"(chunks of {CHUNK}) {need_cached:.0f} MiB; budget {BUDGET_MIB} MiB")
  assert need_cached <= BUDGET_MIB < need_plain, "the budget should separate the two"

  held_out = make_batch(jax.random.key(1), 1024)
  model.eval()
  before = float(retrieval(model, held_out))
  model.train()
  for step in range(STEPS):
    loss = train_step(model, optimizer, make_batch(jax.random.fold_in(jax.random.key(2), step),
                                                   BATCH))
    if step % 10 == 0 or step == STEPS - 1:
      print(f"step {step:3d}: loss {float(loss):.3f}, "
            f"temperature {float(model.loss.current_temperature()):.4f}")
  model.eval()
  after = float(retrieval(model, held_out))
  print(f"held-out retrieval top-1 among 1024: {before:.3f} before, {after:.3f} after")


if __name__ == "__main__":
  main()
