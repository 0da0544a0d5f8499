"""Where one kernel launch's time goes, read from the GPU's hardware counters with Nsight
Compute (``ncu``): how often each scheduler issues, how many warps are eligible a cycle,
each pipe's use (the tensor cores, MUFU's exponentials (``xu``), FMA, ALU, shared
memory), the cycles a warp stalls per issued instruction by reason, and on which SASS
instructions the sampled warps sit. It answers what the timings cannot: why a Gluon pass
takes about its GEMM time plus its epilogue's issue time rather than the larger of the
two (docs/notes/matryoshka.md, "Pipelined across tiles").

  # on the GPU machine (ncu reads the counters there: the device tool's KINDS.md)
  python benchmarks/ncu_kernels.py profile --name wide_chain --kernel _wide_kernel \\
      --skip 1 --out $OUT/ncu -- python benchmarks/bench_gluon_small.py --reps 1 \\
      --variant-timeout 600 --variants small3_wide_chain
  python benchmarks/ncu_kernels.py summary $OUT/ncu --csv $OUT/ncu_summary.csv

``profile`` runs the command under ncu (``--set full``; the clocks left alone) for
``--count`` launches of the kernels whose name matches the regular expression
``--kernel``, after ``--skip`` of them (a probe's check launch comes first), and writes
NAME.ncu-rep with two pages of it: NAME.raw.csv (a column a metric, then a row of units,
then a row a launch) and NAME.sass.csv (a row a SASS instruction with its sampled warps).
``summary`` keeps the metrics matching ``KEEP`` from each raw page and adds each launch's
sampled warps by opcode from its SASS page (``sampled:OP``) and their stall reasons
(``stall:REASON``, the page's ``stall_*`` columns) without the samples on ``NOP``: the
warps that pad a warp-specialized kernel to whole warp groups idle there in barrier
stall (a quarter of every Gluon pass's samples, 2026-12-05), which the raw page's
per-instruction stall ratios count in. One CSV row a (profile, launch, metric); it
prints a short table a launch and writes NAME.sass_top.txt (the instructions the most
warps were sampled on).
"""

from __future__ import annotations

import argparse
import collections
import csv
import pathlib
import re
import shutil
import subprocess
import sys

KEEP = (r"gpu__time_duration\.sum",
        r"sm__throughput\.avg\.pct_of_peak_sustained_elapsed",
        r"smsp__issue_active\.avg\.(pct_of_peak_sustained_active|per_cycle_active)",
        r"smsp__warps_(eligible|active)\.avg\.per_cycle_active",
        r"smsp__average_warp_latency_per_inst_issued\.ratio",
        r"smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
        r"sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active",
        r"sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active",
        r"smsp__inst_executed\.sum",
        r"launch__(registers_per_thread|block_size|grid_size)",
        r"(lts__t_bytes|dram__bytes)\.sum\.per_second")
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")
SAMPLES = "Warp Stall Sampling (All"   # the SASS page's column of every sampled warp


def ncu_binary() -> str:
  """ncu on PATH, else the newest under /opt/nvidia or /usr/local/cuda*."""
  found = shutil.which("ncu") or sorted(
      [*pathlib.Path("/opt/nvidia").glob("nsight-compute*/ncu"),
       *pathlib.Path("/opt/nvidia").glob("nsight-compute*/*/ncu"),   # (a version's folder)
       *pathlib.Path("/usr/local").glob("cuda*/bin/ncu")])
  if not found:
    sys.exit("ncu not found (PATH, /opt/nvidia/nsight-compute*, /usr/local/cuda*/bin)")
  return str(found if isinstance(found, str) else found[-1])


def profile(a) -> int:
  ncu, out = ncu_binary(), pathlib.Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  rep = out / a.name
  cmd = [ncu, "--set", "full", "--import-source", "no", "--clock-control", "none",
         "--target-processes", "all", "--kernel-name", f"regex:{a.kernel}",
         "--launch-skip", str(a.skip), "--launch-count", str(a.count), "-f", "-o", str(rep),
         *a.command]
  print(" ".join(cmd), flush=True)
  rc = subprocess.call(cmd)
  for page, suffix, extra in (("raw", "raw.csv", []),
                              ("source", "sass.csv", ["--print-source", "sass"])):
    with open(out / f"{a.name}.{suffix}", "w") as f:
      subprocess.call([ncu, "-i", f"{rep}.ncu-rep", "--page", page, "--csv", "--print-units",
                       "base", *extra], stdout=f)
  return rc


def number(text: str) -> float | None:
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return None


def raw_rows(path) -> list[dict]:
  """The launches of a raw page: [{column: (unit, value)}]. The header is the first row
  naming "Kernel Name" (ncu may print lines before it); a row with that cell empty right
  after it holds the units; every later row naming a kernel is a launch."""
  rows = list(csv.reader(open(path, newline="")))
  at = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
  if at is None:
    return []
  header = rows[at]
  name = header.index("Kernel Name")
  nxt = rows[at + 1] if at + 1 < len(rows) else []
  units = nxt if len(nxt) == len(header) and not nxt[name].strip() else [""] * len(header)
  return [{h: (u, v) for h, u, v in zip(header, units, r)} for r in rows[at + 1:]
          if len(r) == len(header) and r[name].strip()]


def opcode(source: str) -> str:
  """A SASS line's opcode with its first modifier: '@!P0 MUFU.EX2 R1, R2 ;' -> 'MUFU.EX2'."""
  words = source.split()
  if words and words[0].startswith("@"):
    words = words[1:]
  return ".".join(words[0].split(".")[:2]) if words else "?"


def sass_launches(path) -> list[list[tuple[str, str, float, dict]]]:
  """A SASS page's instructions, launch by launch: [(address, source, samples, {stall
  reason: samples})] (the page's ``stall_*`` columns, where it has them); a launch starts
  at each header row (one holding 'Source' and the samples' column)."""
  out, cols, reasons = [], None, {}
  for r in csv.reader(open(path, newline="")):
    if "Source" in r and any(c.startswith(SAMPLES) for c in r):
      cols = (r.index("Source"), next(i for i, c in enumerate(r) if c.startswith(SAMPLES)),
              next((i for i, c in enumerate(r) if "Address" in c), None))
      reasons = {c[len("stall_"):]: i for i, c in enumerate(r)
                 if c.startswith("stall_") and "(" not in c}
      out.append([])
    elif cols and len(r) > max(c for c in cols if c is not None):
      samples = number(r[cols[1]])
      if samples is not None:
        stalls = {k: number(r[i]) or 0.0 for k, i in reasons.items() if i < len(r)}
        out[-1].append(("" if cols[2] is None else r[cols[2]], r[cols[0]], samples, stalls))
  return out


def summarize(folder) -> list[dict]:
  """One row a (profile, launch, metric): KEEP's metrics, then the sampled warps'
  share by opcode (metric 'sampled:OPCODE', value a fraction of the launch's samples)."""
  keep = re.compile("|".join(f"(?:{k})" for k in KEEP) + "$")
  rows = []
  for raw in sorted(pathlib.Path(folder).glob("*.raw.csv")):
    name = raw.name[:-len(".raw.csv")]
    launches = raw_rows(raw)
    sass = raw.with_name(f"{name}.sass.csv")
    per_op = sass_launches(sass) if sass.exists() else []
    for k, launch in enumerate(launches):
      kernel = launch.get("Kernel Name", ("", "?"))[1]
      for metric, (unit, value) in launch.items():
        v = number(value)
        if keep.match(metric) and v is not None:
          rows.append(dict(profile=name, launch=k, kernel=kernel, metric=metric, unit=unit,
                           value=v))
      if k < len(per_op) and per_op[k]:
        total = sum(s for _, _, s, _ in per_op[k]) or 1.0
        by_op, working = collections.Counter(), collections.Counter()
        for _, src, s, stalls in per_op[k]:
          op = opcode(src)
          by_op[op] += s
          if op != "NOP":   # (warps padding a warp-specialized kernel idle on one)
            working.update(stalls)
        for op, s in by_op.most_common():
          rows.append(dict(profile=name, launch=k, kernel=kernel, metric=f"sampled:{op}",
                           unit="fraction", value=round(s / total, 5)))
        busy = sum(working.values()) or 1.0
        for reason, s in working.most_common():
          rows.append(dict(profile=name, launch=k, kernel=kernel, metric=f"stall:{reason}",
                           unit="fraction", value=round(s / busy, 5)))
    with open(raw.with_name(f"{name}.sass_top.txt"), "w") as f:
      for k, instrs in enumerate(per_op):
        total = sum(s for _, _, s, _ in instrs) or 1.0
        f.write(f"== launch {k}: {len(instrs)} instructions, {total:.0f} samples\n")
        for addr, src, s, _ in sorted(instrs, key=lambda t: -t[2])[:40]:
          f.write(f"{s / total:7.2%}  {addr:>8}  {src}\n")
  return rows


def table(rows: list[dict]) -> str:
  """Per launch: duration, issue and warps, the eight largest stall reasons, the pipes
  over 1 %, the eight opcodes most sampled."""
  lines, by = [], collections.defaultdict(list)
  for r in rows:
    by[(r["profile"], r["launch"], r["kernel"])].append(r)
  for (name, k, kernel), rs in by.items():
    m = {r["metric"]: r["value"] for r in rs}
    lines.append(f"== {name} launch {k}: {kernel}")
    lines.append("   " + ", ".join(f"{label} {m[key]:.4g}" for label, key in (
        ("ns", "gpu__time_duration.sum"),
        ("issue %", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
        ("active warps", "smsp__warps_active.avg.per_cycle_active"),
        ("eligible", "smsp__warps_eligible.avg.per_cycle_active"),
        ("cycles/instr", "smsp__average_warp_latency_per_inst_issued.ratio")) if key in m))
    stalls = sorted(((STALL.match(x).group(1), v) for x, v in m.items() if STALL.match(x)),
                    key=lambda t: -t[1])[:8]
    lines.append("   stalls (cycles an instr): " + ", ".join(f"{s} {v:.3g}" for s, v in stalls))
    working = [(x[6:], v) for x, v in m.items() if x.startswith("stall:")][:8]
    if working:   # the sampled warps' stall reasons, those idle on a NOP left out
      lines.append("   working warps' samples: " + ", ".join(f"{s} {v:.1%}" for s, v in working))
    pipes = sorted(((x, v) for x, v in m.items()
                    if x.startswith(("sm__pipe_", "sm__inst_executed_pipe_")) and v > 1),
                   key=lambda t: -t[1])
    lines.append("   pipes %: " + ", ".join(f"{x.split('.')[0]} {v:.3g}" for x, v in pipes))
    ops = [(x[8:], v) for x, v in m.items() if x.startswith("sampled:")][:8]
    lines.append("   sampled: " + ", ".join(f"{o} {v:.1%}" for o, v in ops))
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser()
  sub = p.add_subparsers(dest="verb", required=True)
  q = sub.add_parser("profile")
  q.add_argument("--name", required=True)
  q.add_argument("--kernel", required=True, help="regular expression on the kernel's name")
  q.add_argument("--skip", type=int, default=0)
  q.add_argument("--count", type=int, default=1)
  q.add_argument("--out", required=True)
  q.add_argument("command", nargs=argparse.REMAINDER)
  s = sub.add_parser("summary")
  s.add_argument("folder")
  s.add_argument("--csv", required=True)
  a = p.parse_args(argv)
  if a.verb == "profile":
    a.command = a.command[1:] if a.command[:1] == ["--"] else a.command
    return profile(a)
  rows = summarize(a.folder)
  with open(a.csv, "w", newline="") as f:
    w = csv.DictWriter(f, ["profile", "launch", "kernel", "metric", "unit", "value"])
    w.writeheader()
    w.writerows(rows)
  print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
