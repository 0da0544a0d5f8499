"""Split GPU test ids into shards of about equal time, for run_device.sh's tests stage.

Compiling dominates the GPU tests (up to ~2 minutes an id with 14 processes sharing the
machine), so shards of equal id counts finish far apart and a time limit loses whole
tails. Here each id's expected seconds come from ``h200_gpu_test_durations.csv`` (the
``call`` durations of earlier runs' ``--durations=0`` logs; ``--record`` adds a log's);
an id without one gets the median of its test function's, else of all. Longest first,
each id goes to the shard with the least time so far. ``--calls K --call I``: the
shards of device call I (from 0) of K, which split the ids into K equal parts.

  python benchmarks/shard_tests.py --ids ids.txt --shards 14 --calls 2 --call 0 --out DIR
  python benchmarks/shard_tests.py --record gpu_tests.log   # (here, after a run)
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import re
import statistics

DURATIONS = pathlib.Path(__file__).parent / "results" / "h200_gpu_test_durations.csv"
_CALL = re.compile(r"^([0-9.]+)s call +(\S+)$")


def read_durations(path=DURATIONS) -> dict[str, float]:
  if not pathlib.Path(path).exists():
    return {}
  with open(path, newline="") as f:
    return {r["id"]: float(r["seconds"]) for r in csv.DictReader(f)}


def record(logs, path=DURATIONS) -> int:
  """Adds (or replaces) the ids' call durations found in pytest logs; returns how many."""
  found = {}
  for log in logs:
    for line in pathlib.Path(log).read_text(errors="replace").splitlines():
      m = _CALL.match(line.strip())
      if m:
        found[m.group(2)] = float(m.group(1))
  rows = read_durations(path) | found
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "seconds"])
    w.writerows((i, f"{s:.2f}") for i, s in sorted(rows.items()))
  return len(found)


def expected(ids, known: dict[str, float]) -> dict[str, float]:
  """Seconds per id: recorded, else its test function's median, else all ids' median."""
  by_fn = {}
  for i, s in known.items():
    by_fn.setdefault(i.split("[")[0], []).append(s)
  fallback = statistics.median(known.values()) if known else 1.0
  return {i: known.get(i, statistics.median(by_fn.get(i.split("[")[0], [fallback])))
          for i in ids}


def shards(ids, seconds: dict[str, float], n: int) -> list[list[str]]:
  """``ids`` in n lists of about equal total ``seconds`` (longest first, least loaded)."""
  load, out = [0.0] * n, [[] for _ in range(n)]
  for i in sorted(ids, key=lambda i: (-seconds[i], i)):
    k = min(range(n), key=lambda b: (load[b], b))
    out[k].append(i)
    load[k] += seconds[i]
  return out


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--ids", help="a file of test ids, one a line")
  p.add_argument("--shards", type=int, default=4, help="processes a call")
  p.add_argument("--calls", type=int, default=1)
  p.add_argument("--call", type=int, default=0)
  p.add_argument("--out", help="folder for the shard files (shard.0, shard.1, ...)")
  p.add_argument("--record", nargs="+", metavar="LOG", help="add these logs' durations")
  a = p.parse_args(argv)
  if a.record:
    print(f"recorded {record(a.record)} durations in {DURATIONS}")
    return
  ids = [l.strip() for l in open(a.ids) if l.strip()]
  seconds = expected(ids, read_durations())
  lists = shards(ids, seconds, a.calls * a.shards)[a.call::a.calls]
  out = pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  for k, ids_k in enumerate(lists):
    (out / f"shard.{k}").write_text("".join(f"{i}\n" for i in ids_k))
  print(f"call {a.call} of {a.calls}: {sum(map(len, lists))} ids, expected seconds a shard "
        f"{[round(sum(seconds[i] for i in l)) for l in lists]}")


if __name__ == "__main__":
  main()
