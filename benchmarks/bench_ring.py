"""Multi-GPU scaling of every loss through ``memeff_jax.sharded`` (the ppermute ring),
bf16 fwd+bwd, and a check that the ring gives one device's loss and gradients.

  python benchmarks/bench_ring.py --batch 65536,131072 --check --out ring.csv   # 1 and all GPUs
  python benchmarks/bench_ring.py --batch 65536 --weak 65536 --out ring_weak.csv
  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
      python benchmarks/bench_ring.py --batch 64 --dims 32 --reps 1 --check --check-batch 128 \\
      --backend blockwise --devices 1,4

devices = 1 is the plain single-device call (no shard_map); n > 1 is
``sharded(loss, Mesh(jax.devices()[:n], ("batch",)), "batch")`` with the global inputs
laid out over the mesh before timing. Series: "strong" (one global batch on 1..n
devices), "weak" (--weak rows per device on 1, 2, 4, ... and all devices), "check".
Efficiency is _harness.scaling_efficiency against the 1-device time. Memory per GPU:
extra_gib from the compiled step's memory_analysis (temporaries + outputs, as in
bench_losses.py); peak_gib from device.memory_stats() where the step raised a device's
peak (JAX cannot reset the peak, so a step below an earlier one's peak leaves it blank).
TFLOP/s are per GPU, with bench_losses.py's GEMM counts.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):   # run as a file: python benchmarks/bench_ring.py
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import memeff_jax as mj
from benchmarks._harness import (RingResult, Writer, compiled_extra_gib, guarded,
                                 scaling_efficiency, summarize, time_jax)
from benchmarks.bench_losses import LOSSES, _with_ladder, inputs

DEFAULT_LOSSES = "clip,lit,qwen3_qqdd,lit_qwen3,clip_mrl"
LOSS_ABS_TOL = 1e-3   # |loss_ring - loss_one|: both reduce float32 statistics of the same inputs
GRAD_REL_TOL = 2e-2   # max |g_ring - g_one| / max |g_one|: bf16 gradients, a few ulps apart


def step(name: str, n: int, d: int, backend: str):
  """jit(value_and_grad) of one loss w.r.t. its trained arrays, on one device or n."""
  fn, _, _, argnums, kw, _ = LOSSES[name]
  loss = _with_ladder(fn, kw, d)   # the loss's keywords, Matryoshka dims resolved for d
  if n == 1:
    f = lambda *a: loss(*a, backend=backend)
  else:
    mesh = Mesh(np.array(jax.devices()[:n]), ("batch",))
    f = mj.sharded(lambda *a, axis_name: loss(*a, axis_name=axis_name, backend=backend),
                   mesh, "batch")
  return jax.jit(jax.value_and_grad(f, argnums=argnums))


def place(args, n: int):
  """The global arrays on device 0, or split along the batch over the first n devices."""
  if n == 1:
    return [jax.device_put(a, jax.devices()[0]) for a in args]
  sharding = NamedSharding(Mesh(np.array(jax.devices()[:n]), ("batch",)), P("batch"))
  return [jax.device_put(a, sharding) for a in args]


def peaks(n: int) -> list[int | None]:
  stats = [dev.memory_stats() for dev in jax.devices()[:n]]
  return [s.get("peak_bytes_in_use") if s else None for s in stats]


def bench(writer, t1, series, name, n, b, d, dtype, reps, backend):
  r = RingResult(series, name, "memeff_jax", n, b, d, jnp.dtype(dtype).name,
                 mem_source="compiled")

  def body():
    if b % n:   # equal shards only, as memeff needs (sharded would pad and mask)
      r.note = f"batch {b} does not split over {n} devices"
      return r
    args = place(inputs(name, b, d, dtype), n)
    f = step(name, n, d, backend)
    before = peaks(n)
    r.extra_gib = compiled_extra_gib(f, *args)
    times = time_jax(f, *args, reps=reps, warmup=1 if b // n >= 262144 else 2)
    rose = [a for a, p in zip(peaks(n), before) if a is not None and p is not None and a > p]
    r.peak_gib = max(rose) / 2**30 if rose else None
    val = float(f(*args)[0])
    if not np.isfinite(val):
      r.note = f"non-finite loss {val}"
    summarize(r, times, LOSSES[name][5] * 2.0 * b * b * d / n)
    if n == 1:
      t1[(name, d, b)] = r.ms
    r.efficiency = scaling_efficiency(series, n, t1.get((name, d, b if series == "strong"
                                                         else b // n)), r.ms)
    return r

  guarded(writer, r, body)


def check(writer, name, n, b, d, dtype, backend):
  """The ring on n devices against the plain call on one, same inputs: loss and grads."""
  r = RingResult("check", name, "memeff_jax", n, b, d, jnp.dtype(dtype).name)

  def body():
    args = inputs(name, b, d, dtype, seed=1)
    loss_one, grads_one = step(name, 1, d, backend)(*place(args, 1))
    loss_ring, grads_ring = step(name, n, d, backend)(*place(args, n))
    loss_err = abs(float(loss_ring) - float(loss_one))
    host = lambda g: np.asarray(g.astype(jnp.float32))   # the two live on different devices
    grad_err = max(float(np.max(np.abs(host(gr) - host(go))) / np.max(np.abs(host(go))))
                   for gr, go in zip(grads_ring, grads_one))
    ok = loss_err <= LOSS_ABS_TOL and grad_err <= GRAD_REL_TOL   # False on a NaN too
    r.note = (f"{'PASS' if ok else 'FAIL'} loss_err={loss_err:.2e} (tol {LOSS_ABS_TOL:g}) "
              f"grad_rel_err={grad_err:.2e} (tol {GRAD_REL_TOL:g})")
    return r

  guarded(writer, r, body)


def device_counts(spec: str, total: int) -> list[int]:
  counts = sorted({total if c == "all" else int(c) for c in spec.split(",")})
  if counts[-1] > total:
    raise SystemExit(f"--devices {spec}: only {total} devices are visible")
  return counts


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--losses", default=DEFAULT_LOSSES, help="names of bench_losses.LOSSES")
  p.add_argument("--batch", default="65536,131072", help="global batches")
  p.add_argument("--dims", default="512")
  p.add_argument("--devices", default="1,all", help="device counts (1: the plain call)")
  p.add_argument("--weak", type=int, default=None,
                 help="rows per device of a weak-scaling series on 1, 2, 4, ... all devices")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--backend", default="auto")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--check", action="store_true",
                 help="ring vs one device (loss and gradients) on each device count > 1")
  p.add_argument("--check-batch", type=int, default=8192)
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  writer, t1 = Writer(a.out), {}
  total = len(jax.devices())
  counts = device_counts(a.devices, total)
  weak = sorted({min(2**i, total) for i in range(total.bit_length() + 1)})
  dtype = jnp.dtype(a.dtype)
  print(f"{total} devices: {jax.devices()[0].device_kind}; backend={a.backend}", flush=True)
  for name in a.losses.split(","):
    for d in map(int, a.dims.split(",")):
      if a.check:
        for n in (c for c in counts if c > 1):
          check(writer, name, n, a.check_batch, d, dtype, a.backend)
      for b in map(int, a.batch.split(",")):
        for n in counts:
          bench(writer, t1, "strong", name, n, b, d, dtype, a.reps, a.backend)
      if a.weak:
        for n in weak:
          bench(writer, t1, "weak", name, n, a.weak * n, d, dtype, a.reps, a.backend)
  return writer


if __name__ == "__main__":
  main()
