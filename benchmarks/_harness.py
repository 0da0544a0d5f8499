"""Benchmark plumbing: warm-up, block_until_ready, median timing, compiled memory, CSV.

Each bench_* script defines its setups and providers and reads sizes from the CLI.
jax is imported where it is used: the PyTorch baseline (bench_ring_memeff.py) and the
renderer use only the rows and the CSV writer.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import sys
import time
from typing import Callable


@dataclasses.dataclass
class Result:
  bench: str
  provider: str
  batch: int
  dim: int
  dtype: str
  ms: float | None = None          # median fwd+bwd wall time
  ms_min: float | None = None
  extra_gib: float | None = None   # loss-only extra memory: temporaries + outputs (grads)
  tflops: float | None = None
  note: str = ""


@dataclasses.dataclass
class RingResult:
  """One row of the multi-GPU benchmarks (bench_ring.py, bench_ring_memeff.py)."""
  series: str                      # "strong" (fixed global batch), "weak" (fixed per GPU), "check"
  bench: str
  provider: str                    # "memeff_jax" or "memeff"
  devices: int
  batch: int                       # global batch
  dim: int
  dtype: str
  ms: float | None = None          # median fwd+bwd wall time
  ms_min: float | None = None
  efficiency: float | None = None  # scaling_efficiency against the 1-device time
  extra_gib: float | None = None   # per GPU: memory on top of the inputs, gradients included
  mem_source: str = ""             # how extra_gib was read: "compiled" or "allocator"
  peak_gib: float | None = None    # per GPU: the allocator's peak in use, inputs included
  tflops: float | None = None      # per GPU
  note: str = ""


def scaling_efficiency(series: str, devices: int, t1: float | None,
                       tn: float | None) -> float | None:
  """Strong scaling (one global batch B): t1(B) / (n tn(B)). Weak scaling (b rows per
  device): n t1(b) / tn(n b), since each device's work, b rows against n b columns,
  grows n-fold. t1 is the 1-device time; 1.0 is perfect scaling."""
  if not t1 or not tn:
    return None
  return t1 / (devices * tn) if series == "strong" else devices * t1 / tn


def clip_pairs(key, n: int, d: int):
  """CLIP-like bf16 pairs [n, d]: unit rows, y_i a noisy copy of x_i, so that at t = 0.07
  each row's softmax leans on its positive (the kernel probes' inputs)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  kx, ky = jax.random.split(key)
  x = jax.random.normal(kx, (n, d), jnp.float32)
  y = x + 0.5 * jax.random.normal(ky, (n, d), jnp.float32)
  unit = lambda v: (v / jnp.linalg.norm(v, axis=1, keepdims=True)).astype(jnp.bfloat16)
  return unit(x), unit(y)


def time_jax(fn: Callable, *args, reps: int = 10, warmup: int = 2) -> list[float]:
  """Milliseconds of ``reps`` calls after ``warmup`` (each waits for its outputs)."""
  import jax  # pylint: disable=g-import-not-at-top
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return times


def time_torch(loss_fn: Callable, xs: list, *, reps: int,
               barrier: Callable[[], None] | None = None):
  """The PyTorch counterpart of time_jax, for memeff: ``loss_fn(*xs)`` forward and
  backward (the gradients of the tensors in ``xs`` that require one), two warm-up
  steps, one step measured for memory, then ``reps`` steps timed with CUDA events, each
  after ``barrier()`` if given. Returns (milliseconds per step, the measured step's
  loss as an fp32 tensor, bytes allocated before that step, the allocator's peak
  during it)."""
  import torch  # pylint: disable=g-import-not-at-top

  def step():
    for x in xs:
      x.grad = None
    out = loss_fn(*xs)
    out.backward()
    return out

  for _ in range(2):
    step()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  before = torch.cuda.memory_allocated()
  val = step().detach().float()
  torch.cuda.synchronize()
  peak = torch.cuda.max_memory_allocated()
  times = []
  for _ in range(reps):
    if barrier is not None:
      barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    step()
    e.record()
    torch.cuda.synchronize()
    times.append(s.elapsed_time(e))
  return times, val, before, peak


def compiled_extra_gib(jitted, *args) -> float:
  """XLA's temporaries plus outputs of the compiled step: the memory the loss adds on
  top of its inputs (the gradients included), Triton kernels' outputs included."""
  mem = jitted.lower(*args).compile().memory_analysis()
  return (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**30


def summarize(r: Result, times: list[float], flops: float | None) -> Result:
  r.ms, r.ms_min = statistics.median(times), min(times)
  if flops:
    r.tflops = flops / (r.ms * 1e-3) / 1e12
  return r


class Writer:
  """Appends results to a CSV (and echoes a compact line) as they come. The rows are
  of one dataclass (Result or RingResult); its fields are the CSV's columns."""

  def __init__(self, path: str | None):
    self.path, self.rows = path, []

  def add(self, r: Result | RingResult) -> None:
    self.rows.append(r)
    print("RESULT " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                  for k, v in dataclasses.asdict(r).items()}), flush=True)
    if self.path:
      with open(self.path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(r)])
        w.writeheader()
        for row in self.rows:
          w.writerow(dataclasses.asdict(row))


def guarded(writer: Writer, r: Result | RingResult, body: Callable[[], Result]) -> None:
  """Run one measurement; an OOM or failure is recorded, not fatal."""
  try:
    writer.add(body())
  except Exception as e:  # pylint: disable=broad-except
    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    r.note = "OOM" if "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower() else msg
    writer.add(r)
    print(f"  ({r.bench} {r.provider} B={r.batch} D={r.dim}: {r.note})", file=sys.stderr)
