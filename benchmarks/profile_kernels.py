"""Where a step's GPU time goes, kernel by kernel (one GPU, one process).

Runs jit(value_and_grad) of each loss three times under ``jax.profiler.trace`` (a
Perfetto trace: Chrome trace-event JSON), then sums the device events by kernel name:
milliseconds per step and launches per step, largest first. The Triton kernels keep
their Python names; cuBLAS's are ``nvjet_*`` and XLA's own fusions ``*_fusion*``.

  python benchmarks/profile_kernels.py --batch 65536 --losses siglip,clip --out prof.txt
  python benchmarks/profile_kernels.py --losses clip,clip_mrl --dim 512   # dims 64 ... 512
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import tempfile

import jax
import jax.numpy as jnp

import memeff_jax as mj
from benchmarks.bench_losses import ladder

REPS = 3


def _step(name, dim):
  if name == "siglip":   # learned temperature and bias, as big_vision trains them
    loss = lambda x, y, t, b: mj.siglip_loss(x, y, temperature=t, bias=b, backend="triton")
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
  base = name.removesuffix("_mrl")   # "<loss>_mrl": dims D/8, D/4, D/2, D
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "qwen3": mj.qwen3_loss}[base]
  kw = dict(matryoshka_dims=ladder(dim)) if base != name else {}
  loss = lambda x, y, t, b: fn(x, y, temperature=t, backend="triton", **kw)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def kernel_times(trace_dir: str) -> dict[str, list]:
  """name -> [launches, microseconds] of the device events in a profiler trace."""
  path = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
             and "/device:" in e["args"].get("name", "")}
  out = collections.defaultdict(lambda: [0, 0.0])
  for e in events:
    if e.get("ph") == "X" and e["pid"] in devices:
      out[e["name"][:90]][0] += 1
      out[e["name"][:90]][1] += e.get("dur", 0)
  return out


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--dim", type=int, default=512)
  p.add_argument("--losses", default="siglip,clip")
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  keys = jax.random.split(jax.random.key(0), 2)
  x, y = (jax.random.normal(k, (a.batch, a.dim), jnp.float32).astype(jnp.bfloat16)
          for k in keys)
  args = (x, y, jnp.float32(0.1), jnp.float32(-10.0))
  lines = []
  for name in a.losses.split(","):
    step = _step(name, a.dim)
    for _ in range(REPS):
      jax.block_until_ready(step(*args))
    with tempfile.TemporaryDirectory() as d:
      with jax.profiler.trace(d, create_perfetto_trace=True):
        for _ in range(REPS):
          jax.block_until_ready(step(*args))
      times = kernel_times(d)
    total = sum(us for _, us in times.values()) / REPS / 1e3
    lines.append(f"== {name} B={a.batch}: GPU total {total:.2f} ms per step")
    for k, (n, us) in sorted(times.items(), key=lambda kv: -kv[1][1])[:a.top]:
      lines.append(f"{us / REPS / 1e3:9.3f} ms  x{n // REPS:4d}  {k}")
  print("\n".join(lines))
  if a.out:
    with open(a.out, "w") as f:
      f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
