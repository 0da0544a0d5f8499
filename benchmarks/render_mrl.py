"""Render the Matryoshka table of docs/benchmarks.md from the CSVs of one GPU run (and,
optionally, the one-block rows of another: their column says so).

  python benchmarks/render_mrl.py benchmarks/results/h200_mrl_triton.csv \
      benchmarks/results/h200_mrl_memeff.csv [benchmarks/results/h200_mrl_one_block.csv]
"""

from __future__ import annotations

import csv
import sys


def main(triton_csv: str, memeff_csv: str, one_block_csv: str | None = None) -> str:
  rows = {}
  for path in (triton_csv, memeff_csv, one_block_csv):
    if path is None:
      continue
    with open(path) as f:
      for r in csv.DictReader(f):
        rows[(r["bench"], r["provider"])] = r
  cell = lambda r: "-" if r is None or not r["ms"] else (
      f"{float(r['ms']):.1f} ms, {float(r['extra_gib']):.2f} GiB")
  one = " (one block)" if one_block_csv is None else " (one block, another call)"
  out = ["| loss | memeff_jax plain | memeff_jax fused | fused / plain | memeff_jax fused"
         f"{one} | memeff_jax eager | memeff fused | memeff eager |",
         "|---|---|---|---|---|---|---|---|"]
  for fam in ("clip", "lit", "qwen3", "lit_qwen3"):
    get = lambda name, prov: rows.get((name, prov))
    plain, fused = get(fam, "triton"), get(f"{fam}_mrl", "triton")
    ratio = (f"{float(fused['ms']) / float(plain['ms']):.2f}x"
             if plain and fused and plain["ms"] and fused["ms"] else "-")
    out.append(f"| {fam} | {cell(plain)} | {cell(fused)} | {ratio} | "
               f"{cell(get(f'{fam}_mrl_one', 'triton'))} | "
               f"{cell(get(f'{fam}_mrl_eager', 'triton'))} | {cell(get(f'{fam}_mrl', 'memeff'))} | "
               f"{cell(get(f'{fam}_mrl_eager', 'memeff'))} |")
  return "\n".join(out)


if __name__ == "__main__":
  print(main(*sys.argv[1:4]))
