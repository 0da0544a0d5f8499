"""Benchmark plumbing: warm-up, block_until_ready, median timing, compiled memory, CSV.

Each bench_* script defines its setups and providers and reads sizes from the CLI.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import sys
import time
from typing import Callable

import jax


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


def time_jax(fn: Callable, *args, reps: int = 10, warmup: int = 2) -> list[float]:
  """Milliseconds of ``reps`` calls after ``warmup`` (each waits for its outputs)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return times


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
  """Appends results to a CSV (and echoes a compact line) as they come."""

  def __init__(self, path: str | None):
    self.path, self.rows = path, []

  def add(self, r: Result) -> None:
    self.rows.append(r)
    print("RESULT " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                  for k, v in dataclasses.asdict(r).items()}), flush=True)
    if self.path:
      with open(self.path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in dataclasses.fields(Result)])
        w.writeheader()
        for row in self.rows:
          w.writerow(dataclasses.asdict(row))


def guarded(writer: Writer, r: Result, body: Callable[[], Result]) -> None:
  """Run one measurement; an OOM or failure is recorded, not fatal."""
  try:
    writer.add(body())
  except Exception as e:  # pylint: disable=broad-except
    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    r.note = "OOM" if "RESOURCE_EXHAUSTED" in msg or "out of memory" in msg.lower() else msg
    writer.add(r)
    print(f"  ({r.bench} {r.provider} B={r.batch} D={r.dim}: {r.note})", file=sys.stderr)
