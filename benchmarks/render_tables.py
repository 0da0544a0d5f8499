"""Render the benchmark tables and plots of the README and docs/benchmarks.md from the CSVs
of the device runs.

  python benchmarks/render_tables.py --results benchmarks/results \
      --readme README.md --benchmarks docs/benchmarks.md

Every generated part of those files sits between markers, <!-- KIND:NAME --> and
<!-- /KIND:NAME -->, and is rewritten from the CSVs, so no number there is typed by hand.
A marker may appear in either file (the README keeps the headline, docs/benchmarks.md has
every section):

  table:headline        every loss at B = 65536, D = 512: memeff_jax vs memeff
  table:llm, llm16k     every loss at the feature sizes of LLM-based embedders (2560, 4096),
                        B = 65536 and 16384
  text:headline-more    B = 16384 against the dense XLA loss, and B = 1,048,576
  table:bxd-clip/-lit   B x D, every provider (bench_losses.py's table stage)
  text:bxd-before       the cells a later run replaced (marked *), as first measured
  plot:bxd              time vs batch, log-log, one panel per loss and D
  table:mrl             render_mrl.py's Matryoshka table
  table:fast            the paired gradient with taller slabs (memory for speed)
  table:ring, plot:ring multi-GPU scaling (bench_ring.py, bench_ring_memeff.py)
  table:grad-cache, plot:grad-cache   training steps with grad_cache (bench_grad_cache.py)

Inputs are <prefix>_<stage>*.csv in --results (prefix "h200": the GPU); the plots go to
<results>/plots, linked relative to each file. A marker's name may end in @PREFIX: its
section is then rendered from <PREFIX>_<stage>*.csv (the same GPU on another software
stack, e.g. table:headline@h200_jt04 from h200_jt04_headline_*.csv; plots in
<plots>/<PREFIX>). A section whose CSVs are missing keeps its text (ring: a
placeholder). --check writes nothing and exits 1 when a file is not up to date.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import sys
import textwrap

if __package__ in (None, ""):   # run as a file: python benchmarks/render_tables.py
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import render_mrl
from benchmarks._harness import scaling_efficiency

LABELS = {"clip": "CLIP", "lit": "LiT", "qwen3": "Qwen3", "qwen3_qqdd": "Qwen3 + q-q + d-d",
          "qwen3_k7": "Qwen3, K=7 hard negatives", "lit_qwen3": "LiT-Qwen3",
          "clip_mrl": "Matryoshka CLIP (fused)", "lit_mrl": "Matryoshka LiT (fused)",
          "qwen3_mrl": "Matryoshka Qwen3 (fused)", "lit_qwen3_mrl": "Matryoshka LiT-Qwen3 (fused)",
          "clip_mrl_eager": "Matryoshka CLIP (eager)",
          "clip_mrl_one": "Matryoshka CLIP (fused, one block)", "siglip": "SigLIP"}
NO_TFLOPS = {"qwen3_k7"}   # the flop count leaves out the hard negatives' work
# The B x D cells, in this order: ours (with its TFLOP/s), then the others that ran.
BXD_PROVIDERS = ("triton", "blockwise", "dense", "reference", "memeff")
PLOT_PROVIDERS = {"triton": "memeff_jax (Triton)", "memeff": "memeff 0.3.1 (PyTorch)",
                  "dense": "dense XLA"}
MARKER = re.compile(r"<!-- (\w+):([\w@-]+) -->(.*?)<!-- /\1:\2 -->", re.S)


def read(*paths: str) -> list[dict]:
  """The rows of every CSV, numbers parsed. (bench_losses.py's CSVs name our Triton path
  "triton", after its backend; the ring CSVs "memeff_jax".)"""
  rows = []
  for path in paths:
    with open(path) as f:
      for row in csv.DictReader(f):
        for k, v in row.items():
          if k in ("batch", "dim", "devices"):
            row[k] = int(v)
          elif k not in ("bench", "provider", "dtype", "note", "series", "mem_source"):
            row[k] = float(v) if v else None
        rows.append(row)
  return rows


def fmt_ms(v: float) -> str:
  """About three significant figures: 0.40, 4.06, 18.3, 386, 1590."""
  return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def by_key(rows, *keys) -> dict:
  return {tuple(r[k] for k in keys): r for r in rows}


def order(name: str) -> tuple:
  """Losses in LABELS' order, unknown names after them."""
  return (list(LABELS).index(name) if name in LABELS else len(LABELS), name)


def label(name: str) -> str:
  return LABELS.get(name, name)


# ---------------------------------------------------------------- single GPU


def headline(rows: list[dict]) -> str:
  get = by_key(rows, "bench", "provider")
  b, d = rows[0]["batch"], rows[0]["dim"]
  out = []
  for name in ("clip", "lit", "qwen3", "qwen3_qqdd", "qwen3_k7", "lit_qwen3"):
    ours, theirs = get.get((name, "triton")), get.get((name, "memeff"))
    if ours:
      out.append([LABELS[name], *versus(name, ours, theirs, lambda v: f"{v:.1f}")])
  return table([f"B={b}, D={d}", "memeff_jax", "memeff", "memeff / memeff_jax"], out)


def versus(name: str, ours: dict, theirs: dict | None, ms) -> list[str]:
  """A loss's cells against memeff: ours (time by ``ms``, TFLOP/s, extra memory), memeff's
  (time, memory) and the ratio of the times; "-" where memeff did not run."""
  flops = "" if name in NO_TFLOPS else f"{ours['tflops']:.0f} TFLOP/s, "
  cells = [f"{ms(ours['ms'])} ms, {flops}{ours['extra_gib']:.2f} GiB"]
  if theirs and theirs["ms"]:
    return cells + [f"{ms(theirs['ms'])} ms, {theirs['extra_gib']:.2f} GiB",
                    f"{theirs['ms'] / ours['ms']:.2f}x"]
  return cells + ["-", "-"]


def by_dim(rows: list[dict]) -> str:
  """Every loss at each feature size of the rows (one batch): memeff_jax's time, TFLOP/s
  and extra memory against memeff's (bench_losses.py at --dims D1,D2,...)."""
  get = by_key(rows, "bench", "provider", "dim")
  out = []
  for name in sorted({r["bench"] for r in rows}, key=order):
    for d in sorted({r["dim"] for r in rows}):
      ours, theirs = get.get((name, "triton", d)), get.get((name, "memeff", d))
      if ours:
        out.append([label(name), str(d), *versus(name, ours, theirs, fmt_ms)])
  return table([f"B={rows[0]['batch']}", "D", "memeff_jax", "memeff", "memeff / memeff_jax"],
               out)


def headline_more(rows16k: list[dict], rows1m: list[dict]) -> str:
  get = by_key(rows16k, "bench", "provider")
  clip, lit = ({p: get[(n, p)] for p in ("triton", "dense", "memeff")} for n in ("clip", "lit"))
  b, d = clip["triton"]["batch"], clip["triton"]["dim"]
  text = (f"B={b}, D={d}, one call: CLIP {fmt_ms(clip['triton']['ms'])} ms vs the plain dense "
          f"XLA loss (`--providers dense`: logits, two log-softmaxes) "
          f"{fmt_ms(clip['dense']['ms'])} ms / {clip['dense']['extra_gib']:.1f} GiB and memeff "
          f"{fmt_ms(clip['memeff']['ms'])} ms; LiT " +
          " vs ".join(fmt_ms(lit[p]["ms"]) for p in ("triton", "dense", "memeff")) + " ms.")
  for r in rows1m:
    finite = "finite" if "finite=True" in r["note"] else "NON-FINITE"
    text += (f" B={r['batch']:,}, D={r['dim']} {label(r['bench'])}: {r['ms'] / 1e3:.1f} s a "
             f"step, {finite} loss and gradients, {r['extra_gib']:.1f} GiB extra (`bench_1m.py`).")
  return textwrap.fill(text, 88)


def fast(rows: list[dict]) -> str:
  """The default config against bwd_pair with slabs of R rows (``<loss>_rows<R>``), and
  memeff, for every (loss, B, D) that ran: ms and extra GiB, and memeff's time over
  the fastest."""
  get = by_key(rows, "bench", "provider", "batch", "dim")
  variants = sorted({int(r["bench"].rsplit("_rows", 1)[1]) for r in rows
                     if "_rows" in r["bench"]})
  cell = lambda r: f"{fmt_ms(r['ms'])} ms, {r['extra_gib']:.2f} GiB" if r and r["ms"] else "-"
  body = []
  for name, b, d in sorted({(r["bench"], r["batch"], r["dim"]) for r in rows
                            if r["provider"] == "triton" and "_rows" not in r["bench"]},
                           key=lambda k: (order(k[0]), k[2], -k[1])):
    ours = [get.get((name, "triton", b, d))] + [get.get((f"{name}_rows{v}", "triton", b, d))
                                                 for v in variants]
    theirs, dense = (get.get((name, p, b, d)) for p in ("memeff", "dense"))
    best = min((r["ms"] for r in ours if r and r["ms"]), default=None)
    ratio = lambda r: f"{best / r['ms']:.2f}x" if best and r and r["ms"] else "-"
    body.append([f"{label(name)}, B={b}, D={d}"] + [cell(r) for r in ours] +
                [cell(theirs), ratio(theirs), cell(dense), ratio(dense)])
  return table(["workload", "default"] + [f"`bwd_pair`, {v}-row slabs" for v in variants] +
               ["memeff", "fastest / memeff", "dense XLA", "fastest / dense"], body)


def bxd_cells(rows: list[dict], later: list[dict]) -> tuple[dict, dict]:
  """(bench, provider, batch, dim) -> row, the later rows replacing the table run's, and
  the replaced rows (for the footnote)."""
  cells = by_key(rows, "bench", "provider", "batch", "dim")
  replaced = {}
  for r in later:
    key = (r["bench"], r["provider"], r["batch"], r["dim"])
    if key in cells and key not in replaced:
      replaced[key] = cells[key]   # as the table run measured it
    cells[key] = dict(r, later=True)
  return cells, replaced


def bxd(cells: dict, name: str) -> str:
  batches = sorted({k[2] for k in cells if k[0] == name})
  dims = sorted({k[3] for k in cells if k[0] == name})
  out = []
  for b in batches:
    row = [str(b)]
    for d in dims:
      parts = []
      for prov in BXD_PROVIDERS:
        r = cells.get((name, prov, b, d))
        if not r or not r["ms"]:
          continue
        s = fmt_ms(r["ms"])
        if prov == "triton" and r["tflops"]:
          s += f" ({r['tflops']:.0f})"
        parts.append(s + ("*" if r.get("later") else ""))
      row.append(" / ".join(parts) or "-")
    out.append(row)
  return table(["B \\ D"] + [str(d) for d in dims], out)


def bxd_before(replaced: dict) -> str:
  """memeff_jax's replaced cells as first measured: "25.0 (65536 x 128), ... ms for CLIP
  and ..." (memeff's replaced cells are the same code measured again)."""
  names = sorted({k[0] for k in replaced if k[1] == "triton"}, key=order)
  return " and ".join(
      ", ".join(f"{fmt_ms(replaced[k]['ms'])} ({k[2]} x {k[3]})" for k in sorted(replaced)
                if k[0] == name and k[1] == "triton") + f" ms for {label(name)}"
      for name in names)


def pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")   # files only, no display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_bxd(cells: dict, path: str, title: str) -> None:
  plt = pyplot()
  names = [n for n in ("clip", "lit") if any(k[0] == n for k in cells)]
  dims = sorted({k[3] for k in cells})
  fig, axes = plt.subplots(len(names), len(dims), figsize=(4 * len(dims), 3.3 * len(names)),
                           squeeze=False, sharex=True)
  for i, name in enumerate(names):
    for j, d in enumerate(dims):
      ax = axes[i][j]
      for prov, legend in PLOT_PROVIDERS.items():
        pts = sorted((k[2], r["ms"]) for k, r in cells.items()
                     if k[0] == name and k[1] == prov and k[3] == d and r["ms"])
        if pts:
          ax.plot(*zip(*pts), marker="o", label=legend)
      ax.set(yscale="log", title=f"{label(name)}, D = {d}")
      ax.set_xscale("log", base=2)
      ax.grid(True, which="both", alpha=0.3)
      if i == len(names) - 1:
        ax.set_xlabel("batch B")
      if j == 0:
        ax.set_ylabel("fwd+bwd ms")
  axes[0][0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  save(fig, path)


def save(fig, path: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=100, metadata={"Software": None})   # no version: same CSVs, same bytes
  pyplot().close(fig)


# ---------------------------------------------------------------- multi GPU


def with_efficiency(rows: list[dict]) -> list[dict]:
  """Fill each row's efficiency from the 1-device rows of any of the CSVs (memeff's
  1- and N-process runs are separate files)."""
  t1 = {(r["provider"], r["bench"], r["dim"], r["batch"]): r["ms"]
        for r in rows if r["devices"] == 1 and r["ms"] and r["series"] != "check"}
  for r in rows:
    if r["efficiency"] is None and r["series"] != "check":
      b = r["batch"] if r["series"] == "strong" else r["batch"] // r["devices"]
      r["efficiency"] = scaling_efficiency(r["series"], r["devices"],
                                           t1.get((r["provider"], r["bench"], r["dim"], b)),
                                           r["ms"])
  return rows


def ring_cell(r: dict | None, memory: bool = True) -> str:
  if not r:
    return "-"
  if not r["ms"]:
    return r["note"].replace("|", "\\|") or "-"   # OOM, or why it did not run
  eff = f" ({r['efficiency']:.0%})" if r["devices"] > 1 and r["efficiency"] else ""
  return f"{fmt_ms(r['ms'])} ms{eff}" + (f", {r['extra_gib']:.2f} GiB" if memory else "")


def ring(rows: list[dict]) -> str:
  """Strong scaling: a row per loss and global batch, a column per provider and GPU
  count. Weak scaling: a row per loss and provider, a column per GPU count. Then the
  check's verdicts."""
  rows = with_efficiency(rows)
  get = by_key(rows, "series", "bench", "provider", "devices", "batch", "dim")
  provs = ("memeff_jax", "memeff")
  gpus = lambda n: f"{n} GPU" + ("s" if n > 1 else "")
  out = []
  strong = [r for r in rows if r["series"] == "strong"]
  if strong:
    columns = sorted({(r["provider"], r["devices"]) for r in strong},
                     key=lambda c: (provs.index(c[0]), c[1]))
    # memeff / memeff_jax on the most GPUs both ran on
    both = max((n for p, n in columns if all((q, n) in columns for q in provs)), default=None)
    body = []
    for name, d, b in sorted({(r["bench"], r["dim"], r["batch"]) for r in strong},
                             key=lambda k: (order(k[0]),) + k[1:]):
      ours, theirs = (get.get(("strong", name, p, both, b, d)) for p in provs)
      ratio = (f"{theirs['ms'] / ours['ms']:.2f}x" if ours and theirs and ours["ms"]
               and theirs["ms"] else "-")
      body.append([label(name) + ("" if d == 512 else f", D={d}"), str(b)] +
                  [ring_cell(get.get(("strong", name, p, n, b, d))) for p, n in columns] +
                  ([ratio] if both else []))
    header = (["loss", "global B"] + [f"{p}, {gpus(n)}" for p, n in columns] +
              ([f"memeff / memeff_jax, {gpus(both)}"] if both else []))
    out += [textwrap.fill("Strong scaling (one global batch over more GPUs): ms (efficiency), "
                          "extra GiB per GPU.", 88), "", table(header, body), ""]
    one = [r for r in strong if r["provider"] == "memeff" and r["devices"] == 1 and r["ms"]]
    if one:   # what memeff's own efficiency is measured against
      r = min(one, key=lambda r: (order(r["bench"]), r["batch"]))
      out += [textwrap.fill(
          f"memeff on 1 GPU is its `Distributed*` class in one process under torchrun (e.g. "
          f"{label(r['bench'])}, B = {r['batch']}: {fmt_ms(r['ms'])} ms), its efficiency is "
          f"against that; its single-GPU class is faster (the headline table above), so "
          f"against that baseline memeff's multi-GPU step scales far less.", 88), ""]
  weak = [r for r in rows if r["series"] == "weak"]
  if weak:
    counts = sorted({r["devices"] for r in weak})
    body = []
    for name, d, per_gpu, p in sorted({(r["bench"], r["dim"], r["batch"] // r["devices"],
                                        r["provider"]) for r in weak},
                                      key=lambda k: (order(k[0]), k[1], k[2], provs.index(k[3]))):
      body.append([label(name) + ("" if d == 512 else f", D={d}"), str(per_gpu), p] +
                  [ring_cell(get.get(("weak", name, p, n, per_gpu * n, d)), memory=False)
                   for n in counts])
    out += [textwrap.fill("Weak scaling (fixed rows per GPU, global batch = GPUs x rows; "
                          "ideal: the time grows with the GPUs, each GPU's rows meeting "
                          "every column): ms (efficiency).", 88), "",
            table(["loss", "rows per GPU", "provider"] + [gpus(n) for n in counts], body), ""]
  checks = [r for r in rows if r["series"] == "check"]
  if checks:
    b, n = checks[0]["batch"], max(r["devices"] for r in checks)
    tols = re.findall(r"tol ([\d.e+-]+)", checks[0]["note"]) or ["?", "?"]
    failed = [f"{label(r['bench'])} on {r['devices']}: {r['note']}" for r in checks
              if not r["note"].startswith("PASS")]
    text = (f"Ring vs one device (`--check`, B = {b}, up to {n} GPUs; loss within {tols[0]}, "
            f"gradients within {tols[-1]} of max |g|): {len(checks) - len(failed)} of "
            f"{len(checks)} pass" + (f". Failing: {'; '.join(failed)}." if failed else "."))
    out.append(textwrap.fill(text, 88))
  return "\n".join(out).strip()


def plot_ring(rows: list[dict], path: str, title: str) -> None:
  """A panel per global batch (time vs GPUs) and one for weak scaling (efficiency);
  color: the loss, solid: memeff_jax, dashed: memeff."""
  plt = pyplot()
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  rows = [r for r in with_efficiency(rows) if r["ms"] and r["series"] != "check"]
  panels = sorted({("strong", r["batch"]) for r in rows if r["series"] == "strong"})
  panels += [("weak", None)] if any(r["series"] == "weak" for r in rows) else []
  fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels) + 2.2, 3.6), squeeze=False)
  names = sorted({r["bench"] for r in rows}, key=order)
  colors = {n: f"C{i}" for i, n in enumerate(names)}
  styles = {"memeff_jax": "-", "memeff": "--"}
  counts = sorted({r["devices"] for r in rows})
  for ax, (series, b) in zip(axes[0], panels):
    for name in names:
      for prov, style in styles.items():
        pts = sorted((r["devices"], r["ms"] if series == "strong" else r["efficiency"])
                     for r in rows if r["series"] == series and r["bench"] == name
                     and r["provider"] == prov and (b is None or r["batch"] == b)
                     and (series == "strong" or r["efficiency"]))
        if pts:
          ax.plot(*zip(*pts), style, marker="o", color=colors[name])
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("GPUs")
    if series == "strong":
      ax.set(yscale="log", ylabel="fwd+bwd ms", title=f"strong scaling, global B = {b}")
    else:
      ax.set(ylabel="efficiency", title="weak scaling: n t1(b) / tn(n b)", ylim=(0, 1.1))
    ax.grid(True, which="both", alpha=0.3)
  handles = ([Line2D([], [], color=colors[n], marker="o", label=label(n)) for n in names] +
             [Line2D([], [], color="gray", linestyle=st, label=p) for p, st in styles.items()])
  fig.legend(handles=handles, loc="center right", fontsize=8)
  fig.suptitle(title)
  fig.tight_layout(rect=(0, 0, 1 - 2.2 / (4 * len(panels) + 2.2), 1))
  save(fig, path)


# ---------------------------------------------------------------- training steps


def read_grad_cache(path: str) -> list[dict]:
  with open(path) as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    r["batch"] = int(r["batch"])
    for k in ("ms", "images_per_s", "compiled_gib"):
      r[k] = float(r[k]) if r[k] else None
  return rows


def grad_cache(rows: list[dict]) -> str:
  """Per global batch: the plain step and grad_cache's, memory and images/s, against the
  plain step at the largest batch that ran."""
  ran = [r for r in rows if r["method"] == "plain" and r["images_per_s"]]
  best = max(ran, key=lambda r: r["batch"]) if ran else None
  out = []
  for r in sorted(rows, key=lambda r: (r["batch"], r["method"] != "plain")):
    step = (f"chunks of {r['chunk']}" if r["method"] == "cached" else "plain value_and_grad")
    mem = f"{r['compiled_gib']:.1f}" if r["compiled_gib"] else "-"
    if r["images_per_s"]:
      speed = f"{r['images_per_s']:.0f}"
      rel = f"{r['images_per_s'] / best['images_per_s']:.2f}x" if best else "-"
      ms = fmt_ms(r["ms"])
    else:
      speed, rel, ms = "does not fit", "-", "-"
    out.append([f"{r['batch']:,}", step, mem, ms, speed, rel])
  return table(["global batch", "step", "memory GiB (compiled)", "ms / step", "images / s",
                f"vs plain at {best['batch']:,}" if best else "vs plain"], out)


def grad_cache_text(rows: list[dict]) -> str:
  """The README's sentence: the largest plain step, and grad_cache at the largest batch."""
  plain = [r for r in rows if r["method"] == "plain"]
  ran = max((r for r in plain if r["images_per_s"]), key=lambda r: r["batch"])
  over = min((r for r in plain if not r["images_per_s"] and r["compiled_gib"]),
             key=lambda r: r["batch"], default=None)
  big = max((r for r in rows if r["method"] == "cached" and r["images_per_s"]),
            key=lambda r: (r["batch"], r["images_per_s"]))
  return textwrap.fill(
      f"plain `value_and_grad` fits at most B = {ran['batch']:,} ({ran['compiled_gib']:.0f} GiB, "
      f"{ran['images_per_s']:.0f} images/s)"
      + (f"; B = {over['batch']:,} would need {over['compiled_gib']:.0f} GiB" if over else "")
      + f". `grad_cache` with chunks of {big['chunk']} runs B = {big['batch']:,} in "
      f"{big['compiled_gib']:.0f} GiB at {big['images_per_s']:.0f} images/s, "
      f"{big['images_per_s'] / ran['images_per_s']:.2f}x the plain step's throughput "
      "(the ideal is 0.75: one more forward).", 88)


def plot_grad_cache(rows: list[dict], path: str, title: str) -> None:
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  for method, legend in (("plain", "plain value_and_grad"), ("cached", "grad_cache")):
    pts = sorted((r["batch"], r["compiled_gib"], r["images_per_s"]) for r in rows
                 if r["method"] == method and r["compiled_gib"])
    if pts:
      axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=legend)
    ran = [p for p in pts if p[2]]
    if ran:
      axes[1].plot([p[0] for p in ran], [p[2] for p in ran], marker="o", label=legend)
  axes[0].set(yscale="log", ylabel="compiled step memory, GiB", title="memory")
  axes[1].set(ylabel="images / s", title="throughput", ylim=(0, None))
  for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch")
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  save(fig, path)


# ---------------------------------------------------------------- the files


class Link(str):
  """A plot's image link, its path made relative to the file it is rendered into."""

  def __new__(cls, png: str, alt: str):
    out = super().__new__(cls, png)
    out.alt = alt
    return out

  def relative_to(self, directory: str) -> str:
    return f"![{self.alt}]({os.path.relpath(str(self), directory)})"


STACKS = {"jt04": "jax-triton 0.4.1 + Triton 3.9"}   # a prefix's stack tag -> its name


def gpu_label(prefix: str) -> str:
  """A plot title's GPU: "h200" -> "H200", "h100_jt04" -> "H100, jax-triton 0.4.1 + Triton 3.9"."""
  gpu, _, stack = prefix.partition("_")
  return gpu.upper() + (f", {STACKS.get(stack, stack)}" if stack else "")


def sections(results: str, prefix: str, plots: str, later: list[str],
             draw: bool) -> dict[str, str]:
  """"kind:name" of a marker -> its new content, for the sections whose CSVs exist."""
  path = lambda name: os.path.join(results, f"{prefix}_{name}.csv")
  have = lambda *names: all(os.path.exists(path(n)) for n in names)
  link = Link
  gpu = gpu_label(prefix)
  out = {}
  if have("headline_triton", "headline_memeff"):
    out["table:headline"] = headline(read(path("headline_triton"), path("headline_memeff")))
  if have("headline16k_triton", "headline16k_memeff"):
    out["text:headline-more"] = headline_more(
        read(path("headline16k_triton"), path("headline16k_memeff")),
        read(path("1m")) if have("1m") else [])
  for stage in ("llm", "llm16k"):   # (B = 65536; 16384)
    if have(f"{stage}_triton"):
      out[f"table:{stage}"] = by_dim(read(path(f"{stage}_triton"), *(
          [path(f"{stage}_memeff")] if have(f"{stage}_memeff") else [])))
  tables = sorted(glob.glob(path("table_*")))
  if tables:
    cells, replaced = bxd_cells(read(*tables),
                                read(*[os.path.join(results, f) for f in later]))
    out["table:bxd-clip"], out["table:bxd-lit"] = bxd(cells, "clip"), bxd(cells, "lit")
    out["text:bxd-before"] = bxd_before(replaced)
    png = os.path.join(plots, "bxd.png")
    if draw:
      plot_bxd(cells, png, f"{gpu}, bf16, loss fwd+bwd, one GPU")
    out["plot:bxd"] = link(png, "fwd+bwd time vs batch, CLIP and LiT, each feature size: "
                      "memeff_jax, memeff and the dense XLA loss")
  if have("mrl_triton", "mrl_memeff"):
    out["table:mrl"] = render_mrl.main(path("mrl_triton"), path("mrl_memeff"),
                                       path("mrl_one_block") if have("mrl_one_block") else None)
  fasts = sorted(glob.glob(path("fast*")))
  if fasts:
    out["table:fast"] = fast(read(*fasts))
  if have("grad_cache"):
    rows = read_grad_cache(path("grad_cache"))
    out["table:grad-cache"] = grad_cache(rows)
    out["text:grad-cache"] = grad_cache_text(rows)
    png = os.path.join(plots, "grad_cache.png")
    if draw:
      plot_grad_cache(rows, png, f"{gpu}: ViT-S/16 + 6-layer text tower, bf16, "
                      "loss and gradients")
    out["plot:grad-cache"] = link(png, "step memory and images/s vs batch, plain and "
                                  "grad_cache")
  rings = sorted(glob.glob(os.path.join(results, f"{prefix}_ring*.csv")))
  if rings:
    rows = read(*rings)
    out["table:ring"] = ring(rows)
    png = os.path.join(plots, "ring.png")
    if draw:
      plot_ring(rows, png, f"{gpu}, bf16, loss fwd+bwd, D = "
                + ", ".join(str(d) for d in sorted({r["dim"] for r in rows})))
    out["plot:ring"] = link(png, "multi-GPU scaling: fwd+bwd time vs GPUs, memeff_jax "
                            "(solid) and memeff (dashed)")
  else:
    out["table:ring"] = textwrap.fill(
        "*Not measured yet*: `STAGES=ring bash benchmarks/run_device.sh` on a machine with "
        f"several GPUs, then its `ring_*.csv` as `{results}/{prefix}_ring_*.csv`, and this "
        "renderer again.", 88)
    out["plot:ring"] = ""
  return out


def render(text: str, new: dict[str, str], directory: str) -> str:
  """``text`` with every marker's content replaced; plot links relative to ``directory``."""
  def sub(m):
    kind, name, old = m.groups()
    key = f"{kind}:{name}"
    if key not in new:
      print(f"  {key}: no CSVs, kept as it is", file=sys.stderr)
      return m.group(0)
    content = new[key].relative_to(directory) if isinstance(new[key], Link) else new[key]
    body = f"\n{content}\n" if old.startswith("\n") else content   # block or inline
    return f"<!-- {kind}:{name} -->{body}<!-- /{kind}:{name} -->"
  return MARKER.sub(sub, text)


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--results", default="benchmarks/results")
  p.add_argument("--readme", default="README.md")
  p.add_argument("--benchmarks", default="docs/benchmarks.md",
                 help="the full benchmark page (every section)")
  p.add_argument("--prefix", default="h200", help="the GPU the CSVs' names start with")
  p.add_argument("--plots", default=None, help="where the PNGs go (default <results>/plots)")
  p.add_argument("--later", default="{prefix}_d1024_min_slab_rows.csv,{prefix}_shared_exp.csv,"
                 "{prefix}_bxd_4warps.csv,{prefix}_bxd_paired.csv,{prefix}_bxd_bounded.csv,"
                 "{prefix}_bxd_paired_small.csv,{prefix}_bxd_d128_tile.csv,"
                 "{prefix}_bxd_2026-12-04.csv,{prefix}_bxd_rows_forward_tiled.csv,"
                 "{prefix}_bxd_column_blocks.csv",
                 help="CSVs (in --results) of B x D cells measured after the table run")
  p.add_argument("--check", action="store_true", help="exit 1 if a file is not current")
  a = p.parse_args(argv)
  plots = a.plots or os.path.join(a.results, "plots")
  new = {}
  texts = {}
  for path in (a.readme, a.benchmarks):
    with open(path) as f:
      texts[path] = f.read()
  others = {m.group(2).split("@", 1)[1] for t in texts.values() for m in MARKER.finditer(t)
            if "@" in m.group(2)}
  for prefix in [a.prefix] + sorted(others - {a.prefix}):
    later = [f.format(prefix=prefix) for f in a.later.split(",") if f]
    later = [f for f in later if os.path.exists(os.path.join(a.results, f))]
    at = "" if prefix == a.prefix else f"@{prefix}"
    got = sections(a.results, prefix, plots if not at else os.path.join(plots, prefix), later,
                   draw=not a.check)
    new.update({f"{key}{at}": v for key, v in got.items()})
  stale = []
  for path, old in texts.items():
    text = render(old, new, os.path.dirname(os.path.abspath(path)))
    if a.check:
      print(f"{path}: {'up to date' if text == old else 'not up to date'}")
      stale += [path] if text != old else []
    elif text != old:
      with open(path, "w") as f:
        f.write(text)
      print(f"{path}: rewritten")
    else:
      print(f"{path}: unchanged")
  if a.check:
    sys.exit(int(bool(stale)))


if __name__ == "__main__":
  main()
