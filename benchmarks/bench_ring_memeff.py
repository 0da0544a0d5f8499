"""The PyTorch baseline of bench_ring.py: memeff 0.3.1's Distributed* losses, one process
per GPU, every rank holding its contiguous shard of the global batch (memeff's DDP
convention). Rank 0 writes rows of bench_ring.py's CSV schema (provider "memeff").

  torchrun --standalone --nproc_per_node=1 benchmarks/bench_ring_memeff.py --out m1.csv
  torchrun --standalone --nproc_per_node=8 benchmarks/bench_ring_memeff.py \\
      --baseline m1.csv --out m8.csv

memeff assembles the whole column tower on every rank (P2P sends around a ring) and
reduce-scatters the column gradient; its forward returns this rank's share of the loss.
The timed step is forward + backward of that share (the all-reduce of the value is
logging, left out). Every rep starts behind a barrier and is timed with CUDA events on
each rank; a row's time is the slowest rank's. Memory: the allocator's peak during one
step (reset before it), the largest rank's: extra_gib above what was allocated before
the step, peak_gib in all. Efficiency needs 1-GPU times: this run's own when it has
one process, else those of --baseline (the CSV of a 1-process run).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import pathlib
import statistics
import sys

if __package__ in (None, ""):   # run as a file: torchrun benchmarks/bench_ring_memeff.py
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

import memeff
from benchmarks._harness import RingResult, Writer, scaling_efficiency, time_torch
from benchmarks.bench_losses import LOSSES, ladder
from benchmarks.bench_ring import DEFAULT_LOSSES

# bench_losses.LOSSES name -> memeff's distributed class (Matryoshka: its fused form).
CLASSES = {
    "clip": "DistributedMemoryEfficientCLIPLoss",
    "lit": "DistributedMemoryEfficientLiTLoss",
    "qwen3": "DistributedMemoryEfficientQwen3Loss",
    "qwen3_qqdd": "DistributedMemoryEfficientQwen3Loss",
    "qwen3_k7": "DistributedMemoryEfficientQwen3Loss",
    "lit_qwen3": "DistributedMemoryEfficientLiTQwen3Loss",
    "clip_mrl": "DistributedMemoryEfficientMatryoshkaCLIPLoss",
    "lit_mrl": "DistributedMemoryEfficientMatryoshkaLiTLoss",
    "qwen3_mrl": "DistributedMemoryEfficientMatryoshkaQwen3Loss",
    "lit_qwen3_mrl": "DistributedMemoryEfficientMatryoshkaLiTQwen3Loss",
}


def make_loss(name: str, d: int):
  kw = dict(LOSSES[name][4])   # memeff_jax's keywords; memeff spells the q-q/d-d flags alike
  if kw.pop("matryoshka_dims", None):
    kw["dims"] = ladder(d)
  return getattr(memeff, CLASSES[name])(temperature=0.07, **kw)


def shard(name: str, b: int, d: int, world: int, rank: int) -> list[torch.Tensor]:
  """This rank's rows of the global inputs (the same seed on every rank), bf16."""
  _, _, n, argnums, _, _ = LOSSES[name]
  g = torch.Generator(device="cuda").manual_seed(0)
  shapes = [(b, d), (b, d), (b, 7, d)][:n]
  rows = slice(rank * (b // world), (rank + 1) * (b // world))
  return [torch.randn(s, device="cuda", generator=g)[rows].to(torch.bfloat16).contiguous()
          .requires_grad_(i in argnums) for i, s in enumerate(shapes)]


def slowest(values: list[float]) -> list[float]:
  t = torch.tensor(values, device="cuda", dtype=torch.float64)
  dist.all_reduce(t, op=dist.ReduceOp.MAX)
  return t.tolist()


def bench(series, name, b, d, reps, world, rank) -> RingResult:
  r = RingResult(series, name, "memeff", world, b, d, "bfloat16", mem_source="allocator")
  if b % world:
    r.note = f"batch {b} does not split over {world} devices"
    return r
  try:
    loss_fn, xs = make_loss(name, d), shard(name, b, d, world, rank)
    times, val, before, peak = time_torch(loss_fn, xs, reps=reps, barrier=dist.barrier)
    times = slowest(times)
    dist.all_reduce(val)   # the global loss: the ranks' shares summed
    extra, peak = slowest([(peak - before) / 2**30, peak / 2**30])
    r.ms, r.ms_min, r.extra_gib, r.peak_gib = statistics.median(times), min(times), extra, peak
    r.tflops = LOSSES[name][5] * 2.0 * b * b * d / world / (r.ms * 1e-3) / 1e12
    if not torch.isfinite(val):
      r.note = f"non-finite loss {val.item()}"
  except Exception as e:  # pylint: disable=broad-except
    # Every rank runs the same shapes, so an OOM hits them all and none waits on the others.
    msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    r.note = "OOM" if "out of memory" in msg.lower() else msg
  torch.cuda.empty_cache()
  return r


def one_device_times(path: str | None) -> dict:
  """(loss, dim, batch) -> ms of the 1-device rows of a CSV."""
  if not path:
    return {}
  with open(path) as f:
    return {(row["bench"], int(row["dim"]), int(row["batch"])): float(row["ms"])
            for row in csv.DictReader(f) if row["devices"] == "1" and row["ms"]}


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--losses", default=DEFAULT_LOSSES)
  p.add_argument("--batch", default="65536,131072", help="global batches")
  p.add_argument("--dims", default="512")
  p.add_argument("--weak", type=int, default=None, help="rows per device of a weak-scaling row")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--baseline", default=None, help="CSV of a 1-process run, for the efficiency")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  local_rank = int(os.environ.get("LOCAL_RANK", 0))
  torch.cuda.set_device(local_rank)
  dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                          timeout=datetime.timedelta(minutes=5))
  world, rank = dist.get_world_size(), dist.get_rank()
  writer, t1 = Writer(a.out if rank == 0 else None), one_device_times(a.baseline)
  if rank == 0:
    print(f"{world} ranks: {torch.cuda.get_device_name()}; memeff {memeff.__version__}",
          flush=True)
  for name in a.losses.split(","):
    for d in map(int, a.dims.split(",")):
      runs = [("strong", b) for b in map(int, a.batch.split(","))]
      runs += [("weak", a.weak * world)] if a.weak else []
      for series, b in runs:
        r = bench(series, name, b, d, a.reps, world, rank)
        if world == 1 and r.ms:
          t1[(name, d, b)] = r.ms
        r.efficiency = scaling_efficiency(
            series, world, t1.get((name, d, b if series == "strong" else b // world)), r.ms)
        if rank == 0:
          writer.add(r)
  dist.destroy_process_group()


if __name__ == "__main__":
  main()
