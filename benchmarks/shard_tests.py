"""Split GPU test ids into shards of about equal time, for run_device.sh's tests stage.

Compiling dominates the GPU tests (up to ~2 minutes an id with 14 processes sharing the
machine), so shards of equal id counts finish far apart and a time limit loses whole
tails. Here each id's expected seconds come from ``h200_gpu_test_durations.csv`` (the
``call`` durations of earlier runs' ``--durations=0`` logs; ``--record`` adds a log's);
an id without one gets the median of its test function's, else of all. Longest first,
each id goes to the shard with the least time so far. ``--calls K --call I``: the
shards of device call I (from 0) of K, which split the ids into K equal parts.

The whole file takes about four device calls for both stacks, so its runs are kept
in a ledger, ``gpu_tests_ledger.csv``: a row an id, stack and commit (the tree
tested: its library and tests/test_gpu.py), with the outcome its logs give (passed,
failed, error, skipped, xfailed, xpassed) or "not run" (cut at the time limit). An id
passed at a commit and stack keeps that row when a later run at the same commit and
stack did not reach it. ``--pending``: the ids not yet passed at a commit and stack,
the next run's ``TEST_IDS``. ``unrun``: the ids with no run that held on a stack at
any commit (tests/test_tooling.py checks none of test_gpu.py's on the README's stacks).
``--edited``: the ids that held on a stack only in an earlier form of their test
function (a digest of its syntax tree, kept in each row's ``form``, taken from the
commit through git), the ids a test edit leaves to re-run there (tests/test_tooling.py
checks none of test_gpu.py's on the README's stacks).

  python benchmarks/shard_tests.py --ids ids.txt --shards 14 --calls 2 --call 0 --out DIR
  python benchmarks/shard_tests.py --record gpu_tests.log   # (here, after a run)
  python benchmarks/shard_tests.py --ledger gpu_tests.log --ids ids.txt --commit C \
      --stack "jax-triton 0.4.1 + Triton 3.9.0" --gpu "NVIDIA H100 80GB HBM3"
  python benchmarks/shard_tests.py --pending --ids ids.txt --commit C --stack "..." > todo
  python benchmarks/shard_tests.py --edited --ids ids.txt --stack "..." > todo

(ids.txt, all of them, here as on the GPU machine: ``MEMEFF_TEST_GPU=1 python -m pytest
--collect-only -q -m gpu tests/test_gpu.py -o addopts="" | grep ::``.)
"""

from __future__ import annotations

import argparse
import ast
import csv
import datetime
import hashlib
import pathlib
import re
import statistics
import subprocess

DURATIONS = pathlib.Path(__file__).parent / "results" / "h200_gpu_test_durations.csv"
LEDGER = pathlib.Path(__file__).parent / "results" / "gpu_tests_ledger.csv"
ROOT = pathlib.Path(__file__).parents[1]   # the repository
README = ROOT / "README.md"
GPU_TESTS = "tests/test_gpu.py"   # (relative to ROOT: ``git show C:`` takes it)
_CALL = re.compile(r"^([0-9.]+)s call +(\S+)$")
_OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_FIELDS = ["date", "commit", "stack", "gpu", "id", "outcome", "seconds", "form"]


def read_durations(path=DURATIONS) -> dict[str, float]:
  if not pathlib.Path(path).exists():
    return {}
  with open(path, newline="") as f:
    return {r["id"]: float(r["seconds"]) for r in csv.DictReader(f)}


def read_logs(logs) -> tuple[dict[str, str], dict[str, float]]:
  """Pytest -v --durations=0 logs' outcome of each id (passed, failed, error, skipped,
  xfailed, xpassed) and its call seconds."""
  outcome, seconds = {}, {}
  for log in logs:
    for line in pathlib.Path(log).read_text(errors="replace").splitlines():
      if m := _OUTCOME.match(line.strip()):
        outcome[m.group(1)] = {"XFAIL": "xfailed", "XPASS": "xpassed"}.get(
            m.group(2), m.group(2).lower())
      elif m := _CALL.match(line.strip()):
        seconds[m.group(2)] = float(m.group(1))
  return outcome, seconds


def record(logs, path=DURATIONS) -> int:
  """Adds (or replaces) the ids' call durations found in pytest logs; returns how many."""
  found = read_logs(logs)[1]
  rows = read_durations(path) | found
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "seconds"])
    w.writerows((i, f"{s:.2f}") for i, s in sorted(rows.items()))
  return len(found)


def read_ledger(path=LEDGER) -> list[dict]:
  if not pathlib.Path(path).exists():
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def function_forms(source: str) -> dict[str, str]:
  """Each test function of a module's source, by name: a digest of its syntax tree
  (decorators and parametrization included; comments and layout not)."""
  return {node.name: hashlib.sha1(ast.dump(node).encode()).hexdigest()[:12]
          for node in ast.parse(source).body
          if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def forms_at(commit: str, *, repo=ROOT, tests=GPU_TESTS) -> dict[str, str]:
  """``function_forms`` of ``tests`` at ``commit`` (``git show``); {} where git cannot
  show it."""
  out = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{tests}"],
                       capture_output=True, text=True, check=False)
  return function_forms(out.stdout) if out.returncode == 0 else {}


def _function(test_id: str) -> str:
  return test_id.split("::")[-1].split("[")[0]


def ledger(logs, ids, *, date: str, commit: str, stack: str, gpu: str,
           path=LEDGER, repo=ROOT, tests=GPU_TESTS) -> dict[str, int]:
  """Adds one run (its pytest -v logs, the ``ids`` it was given) to the ledger, each
  row with its test function's form at ``commit`` (``forms_at``; "" where git cannot
  show it); returns how many ids got each outcome."""
  outcome, seconds = read_logs(logs)
  rows = {(r["commit"], r["stack"], r["id"]): r for r in read_ledger(path)}
  forms = forms_at(commit, repo=repo, tests=tests)
  counts = {}
  for i in ids:
    key, got = (commit, stack, i), outcome.get(i, "not run")
    if got == "not run" and rows.get(key, {}).get("outcome") == "passed":
      continue
    rows[key] = dict(date=date, commit=commit, stack=stack, gpu=gpu, id=i, outcome=got,
                     seconds=f"{seconds[i]:.2f}" if i in seconds else "",
                     form=forms.get(_function(i), ""))
    counts[got] = counts.get(got, 0) + 1
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, _FIELDS)
    w.writeheader()
    w.writerows(sorted(rows.values(), key=lambda r: (r["stack"], r["commit"], r["id"])))
  return counts


def pending(ids, *, commit: str, stack: str, path=LEDGER) -> list[str]:
  """``ids`` not passed at ``commit`` on ``stack`` (never run there included)."""
  passed = {r["id"] for r in read_ledger(path)
            if (r["commit"], r["stack"], r["outcome"]) == (commit, stack, "passed")}
  return [i for i in ids if i not in passed]


def tested_pairs(readme=README) -> list[tuple[str, str]]:
  """(jax-triton, Triton) of each GPU row of the README's "Tested" table, in its order
  (a ledger's stack: ``f"jax-triton {jt} + Triton {triton}"``)."""
  rows = [[c.strip() for c in line.split("|")[1:-1]]
          for line in pathlib.Path(readme).read_text().splitlines()
          if line.startswith("| GPU")]
  return [(r[3], r[4]) for r in rows]


def unrun(ids, *, stack: str, path=LEDGER) -> list[str]:
  """``ids`` that have not held on ``stack``: never passed or skipped there at any
  commit, or failed (or errored) on a date after their latest pass or skip. The ledger
  keeps a row per commit, so this is coverage, not freshness: a test edited since its
  last run still counts as run."""
  held, broke = {}, {}
  for r in read_ledger(path):
    if r["stack"] != stack:
      continue
    if r["outcome"] in ("passed", "skipped"):
      held[r["id"]] = max(held.get(r["id"], ""), r["date"])
    elif r["outcome"] in ("failed", "error"):
      broke[r["id"]] = max(broke.get(r["id"], ""), r["date"])
  return [i for i in ids if i not in held or broke.get(i, "") > held[i]]


def edited(ids, *, stack: str, path=LEDGER, repo=ROOT, tests=GPU_TESTS) -> list[str]:
  """``ids`` that passed or skipped on ``stack`` only in an earlier form of their test
  function: none of those rows has the function's form (the row's ``form``, or the
  ``tests`` file's at its commit, ``forms_at``: ast.dump differs between Pythons) as
  the working tree has it. An id with no such row is ``unrun``'s, not listed here; a
  row without a form at a commit git cannot show, and a function the working tree no
  longer has, count as another form. Only the test function is compared: a changed
  fixture, helper or library is not seen."""
  here = function_forms((pathlib.Path(repo) / tests).read_text())
  forms = {}

  def same(row, fn):
    if row.get("form") == here[fn]:
      return True
    if row["commit"] not in forms:   # (another Python's ast.dump, or no form)
      forms[row["commit"]] = forms_at(row["commit"], repo=repo, tests=tests)
    return forms[row["commit"]].get(fn) == here[fn]

  held, current = set(), set()
  for r in read_ledger(path):
    if r["stack"] == stack and r["outcome"] in ("passed", "skipped"):
      held.add(r["id"])
      fn = _function(r["id"])
      if r["id"] not in current and fn in here and same(r, fn):
        current.add(r["id"])
  return [i for i in ids if i in held and i not in current]


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
  p.add_argument("--ledger", nargs="+", metavar="LOG",
                 help="add these logs' outcomes for --ids to the ledger")
  p.add_argument("--pending", action="store_true", help="print --ids not passed yet")
  p.add_argument("--edited", action="store_true",
                 help="print --ids that held on --stack only in an earlier form")
  p.add_argument("--commit", help="the tree tested (--ledger, --pending)")
  p.add_argument("--stack", help='e.g. "jax-triton 0.4.1 + Triton 3.9.0"')
  p.add_argument("--gpu", default="", help="the GPU's name (--ledger)")
  p.add_argument("--date", default=str(datetime.date.today()), help="the run's date")
  p.add_argument("--ledger-file", default=LEDGER, help=argparse.SUPPRESS)
  p.add_argument("--repo", default=ROOT, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.record:
    print(f"recorded {record(a.record)} durations in {DURATIONS}")
    return
  ids = [l.strip() for l in open(a.ids) if l.strip()]
  if a.edited:
    if not a.stack:
      p.error("--edited takes --stack")
    print("".join(f"{i}\n" for i in edited(ids, stack=a.stack, path=a.ledger_file,
                                             repo=a.repo)), end="")
    return
  if a.ledger or a.pending:
    if not (a.commit and a.stack):
      p.error("--ledger and --pending take --commit and --stack")
    if a.pending:
      print("".join(f"{i}\n" for i in pending(ids, commit=a.commit, stack=a.stack,
                                                path=a.ledger_file)), end="")
    else:
      counts = ledger(a.ledger, ids, date=a.date, commit=a.commit, stack=a.stack, gpu=a.gpu,
                      path=a.ledger_file, repo=a.repo)
      print(f"ledger {a.ledger_file}: {counts}")
    return
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
