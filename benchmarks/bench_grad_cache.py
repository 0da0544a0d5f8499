"""Large-batch training steps with grad_cache against plain value_and_grad, on one GPU.

A ViT-S/16-sized image tower (224 x 224 images, 16 x 16 patches, 12 layers, width 384,
6 heads) and a 6-layer text transformer (32 tokens, width 384), both in bf16 with
float32 parameters, projected to 512-d features; the loss is memeff_jax's CLIP loss
(learnable temperature, backend "auto"). One step is the loss and every parameter's
gradient (no optimizer). For each global batch:

  plain   jax.value_and_grad of the whole step (runs only where it fits);
  cached  memeff_jax.grad_cache with --chunk rows per encoder call.

Memory is the compiled step's (XLA's arguments + temporaries + outputs; the batch of
uint8 images is an argument); "fits" compares it with the device's limit. Throughput is
images per second over the median step.

  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python benchmarks/bench_grad_cache.py \
      --plain 1024,2048 --cached 1024,4096,16384,65536 --chunks 512 --out grad_cache.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

if __package__ in (None, ""):   # run as a file
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._harness import Writer, time_jax

IMG, PATCH, WIDTH, HEADS, IMG_LAYERS = 224, 16, 384, 6, 12
TXT_LEN, TXT_LAYERS, VOCAB, EMB = 32, 6, 32000, 512


@dataclasses.dataclass
class Row:
  method: str                      # "plain" or "cached"
  batch: int                       # global batch
  chunk: int | None = None         # rows per encoder call (cached)
  ms: float | None = None          # median step time
  images_per_s: float | None = None
  compiled_gib: float | None = None   # arguments + temporaries + outputs of the step
  fits: bool | None = None
  note: str = ""


def init(key):
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-imports
  ks = iter(jax.random.split(key, 32))
  dense = lambda *shape: jax.random.normal(next(ks), shape, jnp.float32) / shape[-2] ** 0.5

  def blocks(n):
    return {"ln1": jnp.ones((n, WIDTH)), "qkv": dense(n, WIDTH, 3 * WIDTH),
            "o": dense(n, WIDTH, WIDTH), "ln2": jnp.ones((n, WIDTH)),
            "fc1": dense(n, WIDTH, 4 * WIDTH), "fc2": dense(n, 4 * WIDTH, WIDTH)}

  tokens = (IMG // PATCH) ** 2 + 1
  return {
      "image": {"patch": dense(PATCH * PATCH * 3, WIDTH), "cls": dense(1, WIDTH),
                "pos": dense(tokens, WIDTH), "blocks": blocks(IMG_LAYERS),
                "ln": jnp.ones((WIDTH,)), "proj": dense(WIDTH, EMB)},
      "text": {"embed": dense(VOCAB, WIDTH), "pos": dense(TXT_LEN, WIDTH),
               "blocks": blocks(TXT_LAYERS), "ln": jnp.ones((WIDTH,)),
               "proj": dense(WIDTH, EMB)},
      "log_scale": jnp.log(1 / 0.07),
  }


def encoder(p, h):
  """Pre-LN transformer blocks over [b, t, WIDTH] bf16 tokens (layers scanned)."""
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-imports
  bf = lambda w: w.astype(jnp.bfloat16)

  def norm(x, g):
    x32 = x.astype(jnp.float32)
    x32 = (x32 - x32.mean(-1, keepdims=True)) * jax.lax.rsqrt(x32.var(-1, keepdims=True) + 1e-6)
    return (x32 * g).astype(jnp.bfloat16)

  def block(h, w):
    b, t, _ = h.shape
    q, k, v = jnp.split(norm(h, w["ln1"]) @ bf(w["qkv"]), 3, axis=-1)
    heads = lambda a: a.reshape(b, t, HEADS, WIDTH // HEADS)
    a = jax.nn.dot_product_attention(heads(q), heads(k), heads(v)).reshape(b, t, WIDTH)
    h = h + a @ bf(w["o"])
    return h + jax.nn.gelu(norm(h, w["ln2"]) @ bf(w["fc1"])) @ bf(w["fc2"]), None

  return jax.lax.scan(block, h, p["blocks"])[0]


def embed(p, chunk, key):
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-imports
  del key
  bf = lambda w: w.astype(jnp.bfloat16)
  img = chunk["image"]   # [b, IMG, IMG, 3] uint8
  b, g = img.shape[0], IMG // PATCH
  patches = img.reshape(b, g, PATCH, g, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
  patches = patches.reshape(b, g * g, PATCH * PATCH * 3).astype(jnp.bfloat16) / 255
  pi = p["image"]
  h = jnp.concatenate([jnp.broadcast_to(bf(pi["cls"]), (b, 1, WIDTH)),
                       patches @ bf(pi["patch"])], axis=1) + bf(pi["pos"])
  h = encoder(pi, h)
  x = (h[:, 0].astype(jnp.float32) * pi["ln"]).astype(jnp.bfloat16) @ bf(pi["proj"])
  pt = p["text"]
  h = jnp.take(bf(pt["embed"]), chunk["text"], axis=0) + bf(pt["pos"])
  h = encoder(pt, h)
  y = (h.mean(1).astype(jnp.float32) * pt["ln"]).astype(jnp.bfloat16) @ bf(pt["proj"])
  return {"image": x, "text": y}


def loss(p, e):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import memeff_jax  # pylint: disable=g-import-not-at-top
  return memeff_jax.clip_loss(e["image"], e["text"], temperature=jnp.exp(-p["log_scale"]))


def data(key, n):
  import jax, jax.numpy as jnp  # pylint: disable=g-import-not-at-top,multiple-imports
  k1, k2 = jax.random.split(key)
  pool = jax.random.randint(k1, (min(n, 4096), IMG, IMG, 3), 0, 256, jnp.int32).astype(jnp.uint8)
  return {"image": jnp.tile(pool, (-(-n // pool.shape[0]), 1, 1, 1))[:n],
          "text": jax.random.randint(k2, (n, TXT_LEN), 0, VOCAB, jnp.int32)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--plain", default="1024,2048", help="global batches, plain step")
  ap.add_argument("--cached", default="1024,4096,16384,65536", help="global batches, grad_cache")
  ap.add_argument("--chunks", default="512", help="grad_cache's chunk sizes")
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  import memeff_jax  # pylint: disable=g-import-not-at-top
  writer = Writer(args.out)
  limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit", float("inf"))
  print(f"device {jax.devices()[0].device_kind}, limit {limit / 2**30:.1f} GiB", flush=True)
  params = init(jax.random.key(0))
  ints = lambda text: [int(v) for v in text.split(",") if v]
  runs = [("plain", n, None) for n in ints(args.plain)] + [
      ("cached", n, c) for n in ints(args.cached) for c in ints(args.chunks)]
  batches = {}
  for method, n, chunk in sorted(runs, key=lambda r: (r[1], r[0] != "plain", r[2] or 0)):
    r = Row(method, n, chunk)
    try:
      step = jax.jit(jax.value_and_grad(lambda p, b: loss(p, embed(p, b, None)))
                     if method == "plain" else memeff_jax.grad_cache(embed, loss, chunk_size=chunk))
      shapes = jax.eval_shape(lambda: data(jax.random.key(1), n))
      mem = step.lower(params, shapes).compile().memory_analysis()
      need = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
      r.compiled_gib, r.fits = need / 2**30, need < 0.95 * limit
      if r.fits:
        batches = batches if n in batches else {n: data(jax.random.key(1), n)}   # one at a time
        times = time_jax(step, params, batches[n], reps=args.reps, warmup=1)
        r.ms = statistics.median(times)
        r.images_per_s = n / (r.ms * 1e-3)
      else:
        r.note = "out of memory (compiled)"
    except Exception as e:  # pylint: disable=broad-except
      msg = str(e).splitlines()[0][:160]
      r.note = "OOM" if "RESOURCE_EXHAUSTED" in msg or "memory" in msg.lower() else msg
    writer.add(r)


if __name__ == "__main__":
  main()
