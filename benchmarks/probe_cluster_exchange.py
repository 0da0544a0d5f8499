"""Device-free probe: how Gluon (the installed Triton) moves data between the two CTAs of a
cluster on sm_90, the exchange a 2-CTA Matryoshka gradient pass would need every tile
(docs/notes/matryoshka.md: each CTA half of the features, the partial dots summed across
the pair).

Gluon has no explicit remote shared-memory store; a tensor whose ``cga_layout`` splits an
axis across the cluster is the way to name the other CTA's data, and a reduction over
that axis moves it. Here a [2, 64, 64] fp32 tile (one partial S a CTA) is summed over its
first axis, once in a plain kernel and once inside a ``gl.warp_specialize`` partition (the
library's gradient shape), both compiled for sm_90 with two CTAs a cluster. Printed per
variant: the PTX's distributed shared-memory loads (``ld.shared::cluster``), address
mappings (``mapa``), cluster-wide barriers (``barrier.cluster``) and CTA-local barriers,
and ptxas's registers. NOTES.md 2026-12-05 ("the cluster shape") has the result for
Triton 3.9.

  python benchmarks/probe_cluster_exchange.py
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys

if __package__ in (None, ""):   # run as a file: python benchmarks/probe_cluster_exchange.py
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from benchmarks import _gluon


@gluon.jit
def _pair_sum(src, dst):
  """dst[64, 64] = src[0] + src[1], src's first axis one a CTA."""
  lay: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 4, 8], [1, 4, 1], [2, 1, 0],
                                       cga_layout=[[1, 0, 0]])
  i0 = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, lay)))
  i1 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(2, lay)))
  i2 = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, lay)))
  s = gl.sum(gl.load(src + i0[:, None, None] * 4096 + i1[None, :, None] * 64
                     + i2[None, None, :]), axis=0)
  out: gl.constexpr = s.type.layout
  rows = gl.arange(0, 64, layout=gl.SliceLayout(1, out))
  cols = gl.arange(0, 64, layout=gl.SliceLayout(0, out))
  gl.store(dst + rows[:, None] * 64 + cols[None, :], s)


@gluon.jit
def _idle(src, dst):
  pass


@gluon.jit
def _plain_kernel(src, dst):
  _pair_sum(src, dst)


@gluon.jit
def _specialized_kernel(src, dst):
  gl.warp_specialize([(_pair_sum, (src, dst)), (_idle, (src, dst))], [1], [24])


_OPS = {"ld.shared::cluster": r"ld\.shared::cluster", "mapa": r"mapa\.",
        "barrier.cluster": r"barrier\.cluster\.(arrive|wait)", "bar.sync (CTA)":
        r"\b(bar|barrier)\.sync\b"}


def main() -> None:
  for name, kernel in (("plain", _plain_kernel), ("warp_specialize", _specialized_kernel)):
    out = _gluon.compile_sm90(kernel, dict(src="*fp32", dst="*fp32"), ("src", "dst"), {},
                              warps=4, stages=1, ctas=2)
    counts = collections.Counter()
    for line in out["ptx"].splitlines():
      for op, pat in _OPS.items():
        counts[op] += bool(re.search(pat, line))
    regs = _gluon.ptxas(out["ptx"]).get("registers")
    print(f"RESULT {name}: " + ", ".join(f"{op} {counts[op]}" for op in _OPS)
          + f", registers {regs}")


if __name__ == "__main__":
  main()
