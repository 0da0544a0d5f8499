"""How far the rows' gradient formed in the forward (``Algorithm.fwd_row_grad``) moves
bf16 gradients off float64, against the gradient pass, on ``test_porting_triton``'s
shared-column cases (B = 2085, D = 512, 777 shared columns, bf16, t = 0.07): each
gradient's error relative to its largest entry, next to compare's bound (2x the plain
bf16 formula's error + LOW's atol; check.low_grad_bounds). Four configs: the plain
default tiles (the Triton kernels) without and with ``fwd_row_grad``, and the backend's
default (the Gluon kernels where jax-triton 0.4 runs on Hopper) with and without it.
GPU only; one line a family and config:

  python benchmarks/probe_rows_forward_accuracy.py [--out results.csv]
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

if __package__ in (None, ""):   # run as a file
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from memeff_jax.backends.triton import backend as launch
from memeff_jax.config import default_config
from tests.support.check import _value_and_grads, low_grad_bounds
from tests.support.families import shared_columns_case, shared_columns_loss
from tests.support.tolerances import grad_err


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  b, d, dtype, t = 2085, 512, jnp.bfloat16, 0.07
  plain = default_config(d, dtype)
  back = launch.TritonBackend().default_config(d, dtype)
  with_rows = lambda cfg, on: cfg.evolve(algorithm=dict(fwd_row_grad=on))
  cfgs = {"plain-rows": with_rows(plain, False), "plain+rows": with_rows(plain, True),
          "backend-rows": with_rows(back, False), "backend+rows": with_rows(back, True)}
  rows = []
  for family in ("lit_qwen3", "qwen3", "lit"):
    ref, arrays, kw = shared_columns_case(family, b, d, dtype)
    with jax.enable_x64(True):
      to64 = lambda v: jnp.asarray(np.asarray(v, np.float64))
      _, want = _value_and_grads(ref, [to64(v.astype(jnp.float32)) for v in arrays],
                                 jnp.float64(t), kw)
    _, low = _value_and_grads(ref, arrays, jnp.float32(t), kw)
    tols = low_grad_bounds(low, want, dtype, [1e-6] * len(want))
    for name, cfg in cfgs.items():
      _, got = _value_and_grads(shared_columns_loss(family, cfg), arrays,
                                jnp.float32(t), kw)
      errs = [grad_err(g, r) for g, r in zip(got, want)]
      row = dict(family=family, config=name, fwd_row_grad=cfg.algorithm.fwd_row_grad,
                 gluon=cfg.bwd.gluon, **{f"err{i}": e for i, e in enumerate(errs)},
                 **{f"bound{i}": tl for i, tl in enumerate(tols)})
      rows.append(row)
      print("DIAG", family, name, "rows" if row["fwd_row_grad"] else "pass",
            "gluon" if row["gluon"] else "triton",
            " ".join(f"g{i} {e:.5f}/{tl:.5f}{' OVER' if e > tl else ''}"
                     for i, (e, tl) in enumerate(zip(errs, tols))), flush=True)
  if a.out:
    with open(a.out, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=list(rows[0]))
      w.writeheader()
      w.writerows(rows)


if __name__ == "__main__":
  main()
