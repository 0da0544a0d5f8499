"""Tile sweep and time split for the Triton backend (one GPU, one process).

For each feature size and KernelConfig: CLIP (``clip``), LiT (``lit``), Qwen3 (``qwen3``),
SigLIP (``siglip``; paired, its gradient comes from the forward pass) or fused
Matryoshka with dims (d/8, d/4, d/2, d) (``clip_mrl``, ...) fwd+bwd (with its
compiled extra memory) and forward-only time at one batch, so the defaults in
config.py come from measurements and the backward's share of the time is visible
(bwd = fwd+bwd - fwd). Candidate 0 is the default (config=None). ``--set slab``: the
tiled (coefficient-slab) gradient at several slab heights instead of the tile list;
``--set siglip``: SigLIP's fused gradient by slab height, tile and warps. ``--learned``:
the temperature (SigLIP's: and bias) is an input with a gradient, as CLIP and
big_vision train it: the gradient passes then also sum c s. ``--where``: the last tenth
of the rows removed (``where=``, a padded batch, as bench_losses.py's ``*_where``).

  python benchmarks/bench_configs.py --batch 65536 --dims 512 --out configs.csv
  python benchmarks/bench_configs.py --losses clip_mrl --dims 512 --out configs_mrl.csv
  python benchmarks/bench_configs.py --set slab --losses clip,qwen3 --dims 512
"""

from __future__ import annotations

import argparse
import functools
import itertools

import jax
import jax.numpy as jnp

import memeff_jax as mj
from benchmarks._harness import Result, Writer, compiled_extra_gib, guarded, summarize, time_jax
from memeff_jax.backends.registry import resolve
from memeff_jax.config.kernel import RoleTiles, grouped

# Overrides of the Triton backend's default config (bf16) in KernelConfig's flat names
# (short, and what the CSVs' notes hold; applied through the groups, ``kernel.grouped``);
# "bwd" tuples are (block_m, block_n, warps, stages).
def _f(m, n, w, st, **kw):
  return dict(fwd_block_m=m, fwd_block_n=n, fwd_num_warps=w, fwd_num_stages=st, **kw)


def _b(m, n, w, st, **kw):
  return dict(bwd_block_m=m, bwd_block_n=n, bwd_num_warps=w, bwd_num_stages=st, **kw)


def _tf(m, n, k, w, st, **kw):   # tiled forward: GEMM tile (m, n), feature chunk k
  return dict(fwd_tiled=True, fwd_block_m=m, fwd_block_n=n, fwd_block_d=k, fwd_num_warps=w,
              fwd_num_stages=st, **kw)


def _tb(m, n, k, w, st, **kw):   # tiled gradient: coefficient tile (m, n), chunk k
  return dict(bwd_tiled=True, bwd_block_m=m, bwd_block_n=n, bwd_block_d=k, bwd_num_warps=w,
              bwd_num_stages=st, **kw)


CANDIDATES = {
    # d = 64: Matryoshka's smallest per-dim block (dims d/8..d at D = 512).
    64: [_b(128, 128, 4, 3), _b(128, 128, 8, 3), _b(64, 64, 4, 3), _b(64, 128, 4, 3),
         _b(128, 64, 8, 3), _b(256, 64, 8, 3), _b(128, 64, 4, 4), _b(128, 32, 4, 3),
         _tf(128, 256, 64, 8, 3), _tf(256, 128, 64, 8, 3), _tf(128, 128, 64, 4, 4),
         # the bounded forward as stats_gluon's kernel (jax-triton 0.4; not the default here)
         dict(fwd_gluon=True),
         # a one-sided block's rows' gradient as a pass, not from its forward (the default)
         dict(fwd_row_grad=False)],
    128: [_b(128, 64, 4, 3), dict(_tf(128, 128, 64, 4, 3), **_b(128, 64, 4, 3)),
          dict(_tf(128, 128, 128, 4, 2), **_b(128, 64, 4, 3)),
          dict(_tf(128, 128, 64, 4, 4), **_b(128, 64, 4, 3)),
          _b(128, 64, 4, 2), _b(128, 64, 4, 4), _b(128, 32, 4, 3), _b(128, 128, 4, 3),
          _b(256, 64, 8, 3), _b(64, 128, 4, 2), _b(64, 128, 4, 4), _b(64, 64, 4, 3),
          _b(64, 128, 8, 3), dict(bwd_tma=True), _b(128, 64, 4, 3, bwd_tma=True),
          dict(bwd_tma=False), _b(64, 128, 4, 3, bwd_tma=False),
          _b(128, 64, 8, 3), _b(128, 64, 8, 3, bwd_tma=True),
          _b(128, 64, 8, 2, bwd_tma=True),
          # no spills on Triton 3.9 with a learned temperature (sm_90 compiles; as
          # _b(64, 64, 4, 3) above, cfg24 of h200_role_tiles.csv run 2)
          _b(128, 128, 8, 2), _b(128, 128, 8, 2, bwd_tma=True),
          _b(64, 128, 4, 2, bwd_tma=True),
          # forward tiles with the default gradient (Triton 3.9's forward at D = 128
          # took 4.25 ms a CLIP step against 3.6's 3.91 with the same registers)
          _tf(128, 128, 128, 4, 3), _tf(128, 128, 64, 8, 3), _tf(128, 256, 64, 8, 3),
          _tf(256, 128, 64, 8, 3), _tf(64, 128, 64, 4, 3), _tf(128, 64, 64, 4, 3),
          # CLIP's columns from a second one-sided tiled pass (twice the GEMMs, no sum
          # across a tile's rows: Triton 3.9 lowers that one in eight shared-memory rounds)
          dict(fwd_col_pass=True),
          # the bounded forward as stats_gluon's kernel, or the Triton one (jax-triton 0.4)
          dict(fwd_gluon=False), dict(fwd_gluon=True),
          # a one-sided block's rows' gradient as a pass, not from its forward (the default)
          dict(fwd_row_grad=False)],
    512: [_tf(128, 128, 64, 4, 3), _tf(128, 128, 64, 4, 2), _tf(128, 128, 128, 4, 2),
          _b(64, 64, 8, 2), _b(64, 32, 8, 2),
          _tf(128, 128, 64, 8, 3), _tf(128, 128, 64, 8, 4), _tf(128, 256, 64, 8, 3),
          _tf(256, 128, 64, 8, 3), _tf(64, 128, 64, 4, 4), _tf(128, 128, 128, 8, 2),
          _tb(128, 128, 64, 8, 3), _tb(128, 128, 64, 8, 4), _tb(64, 128, 64, 4, 4),
          _tb(128, 128, 64, 8, 3, bwd_pair=False),
          _tb(128, 64, 64, 4, 4), _tb(128, 128, 64, 8, 3, slab_kib=131072),
          _tb(128, 128, 64, 8, 3, slab_kib=32768), _b(64, 32, 8, 3), dict(bwd_tma=True),
          dict(bwd_tma=False),
          # one softmax role (LiT, Qwen3): one stage (ptxas serializes the wgmma chain of
          # two-stage one-role passes on Triton 3.9), pointers or descriptors
          _b(64, 64, 8, 1), _b(64, 64, 8, 1, bwd_tma=True),
          _b(64, 128, 8, 1, bwd_tma=True),
          _b(64, 64, 8, 2, bwd_tma=True), dict(fwd_col_pass=True),
          # grad_gluon's kernel in every pass (the defaults: the rows' softmax alone), and
          # in none (the Triton kernels' tiles of jax-triton 0.4)
          dict(bwd_gluon=True), dict(bwd_row_role=RoleTiles(block_n=128, num_stages=1)),
          dict(fwd_gluon=False), dict(fwd_gluon=True),
          # a one-sided block's rows' gradient from its forward (the Gluon default), or not
          dict(fwd_row_grad=True), dict(fwd_row_grad=False),
          # one softmax role in one stage with pointer loads (jax-triton 0.3.1 on Triton
          # 3.9: no descriptors), rows', columns' or both, and the rows' 128 columns wide
          dict(bwd_row_role=RoleTiles(num_stages=1)),
          dict(bwd_col_role=RoleTiles(num_stages=1)),
          dict(bwd_row_role=RoleTiles(num_stages=1), bwd_col_role=RoleTiles(num_stages=1)),
          dict(bwd_row_role=RoleTiles(block_n=128, num_stages=1),
               bwd_col_role=RoleTiles(num_stages=1))],
    256: [dict(_tf(128, 128, 64, 4, 3), **_b(64, 64, 4, 2)),
          dict(_tf(128, 128, 64, 4, 3), **_b(128, 64, 8, 2)),
          _tf(128, 128, 64, 4, 3), _tf(128, 128, 64, 8, 3), _b(64, 64, 4, 2), _b(64, 64, 4, 3),
          _b(64, 32, 4, 3), _b(128, 64, 8, 2), _b(128, 32, 8, 2), dict(bwd_tma=True),
          dict(bwd_tma=False), dict(fwd_gluon=False), dict(fwd_gluon=True),
          dict(fwd_row_grad=False)],
    1024: [_tf(128, 128, 64, 4, 3), _tb(128, 128, 64, 8, 3),
           _tb(64, 128, 64, 4, 4, slab_kib=131072),
           _tb(128, 64, 64, 4, 4), dict(bwd_pair=False), dict(fwd_gluon=False),
           dict(fwd_gluon=True)],
}
# The tiled gradient, paired (both towers from one slab), by slab height (min_slab_rows
# above what the 64 MiB slab budget gives), tile and warps.
_S = lambda rows, *t: _tb(*t, bwd_pair=True, min_slab_rows=rows)
SLAB_CANDIDATES = [_S(1024, 64, 128, 64, 4, 4), _S(2048, 64, 128, 64, 4, 4),
                   _S(4096, 64, 128, 64, 4, 4), _S(2048, 128, 128, 64, 8, 3),
                   _S(2048, 128, 64, 64, 4, 4), _S(2048, 64, 128, 64, 8, 4),
                   _S(2048, 64, 64, 64, 4, 4), _S(2048, 64, 256, 64, 8, 3),
                   dict(bwd_pair_max_batch=0)]   # (last: no pairing, whatever the batch)
# SigLIP's fused gradient (coefficient slabs from the forward, learned t and b): slab
# height, tile, feature chunk, warps and stages (the epilogue runs in column chunks of
# at most 32 entries a thread).
_G = lambda rows, m, n, k, w, st: _tb(m, n, k, w, st, bwd_pair=True, min_slab_rows=rows)
SIGLIP_CANDIDATES = [_G(2048, 64, 64, 64, 4, 4), _G(4096, 64, 64, 64, 4, 4),
                     _G(2048, 128, 128, 64, 8, 3), _G(8192, 128, 128, 64, 8, 3),
                     _G(16384, 128, 128, 64, 8, 3), _G(4096, 128, 128, 64, 8, 4),
                     _G(4096, 128, 128, 128, 8, 2), _G(4096, 128, 128, 128, 8, 3),
                     _G(4096, 128, 256, 64, 8, 3), _G(4096, 64, 128, 64, 4, 4),
                     _G(4096, 256, 128, 64, 8, 2), dict(bwd_pair_max_batch=0)]
# Matryoshka: the tiled forward with the default 64 x 64 tiles, then gradient
# candidates (FlashAttention-shaped with several tiles; the tiled one unpaired and
# paired), then forward candidates.
_MF = _tf(64, 64, 64, 4, 3)
MRL_CANDIDATES = {
    512: [dict(_MF, **_b(32, 64, 8, 3)), dict(_MF, **_b(32, 64, 8, 2)),
          dict(_MF, **_b(32, 128, 8, 2)),
          dict(_MF, **_tb(64, 64, 64, 8, 3)), dict(_MF, **_tb(64, 64, 64, 8, 3, bwd_pair=True)),
          dict(_tf(128, 64, 64, 8, 3), **_b(32, 64, 8, 3)),
          dict(_tf(64, 64, 64, 4, 4), **_b(32, 64, 8, 3))],
}


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=65536)
  p.add_argument("--dims", default="128,512,1024")
  p.add_argument("--losses", default="clip")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--only", default=None, help="comma-separated candidate indices")
  p.add_argument("--set", choices=("tiles", "slab", "siglip"), default="tiles")
  p.add_argument("--learned", action="store_true",
                 help="a learned temperature (SigLIP: and bias): traced inputs with gradients")
  p.add_argument("--no-fwd", action="store_true", help="fwd+bwd only")
  p.add_argument("--where", action="store_true", help="where=: the last tenth removed")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  w = Writer(a.out)
  b = a.batch
  for d, name in itertools.product(map(int, a.dims.split(",")), a.losses.split(",")):
    mrl = name.endswith("_mrl")
    cands = [{}] + {"slab": SLAB_CANDIDATES, "siglip": SIGLIP_CANDIDATES}.get(
        a.set, (MRL_CANDIDATES if mrl else CANDIDATES).get(d, []))
    x, y = (jax.random.normal(k, (b, d), jnp.float32).astype(jnp.bfloat16)
            for k in jax.random.split(jax.random.key(0), 2))
    # The default the GPU's backend gives (its shared memory; TMA where jax-triton has it).
    base_cfg = resolve("triton", jnp.bfloat16).default_config(d, jnp.bfloat16)
    for i, t in enumerate(cands):
      if a.only is not None and str(i) not in a.only.split(","):
        continue
      cfg = None if i == 0 else base_cfg.evolve(**grouped(t))
      base = name.removesuffix("_mrl")
      fn = functools.partial({"clip": mj.clip_loss, "lit": mj.lit_loss,
                              "qwen3": mj.qwen3_loss, "siglip": mj.siglip_loss}[base],
                             **(dict(matryoshka_dims=(d // 8, d // 4, d // 2, d)) if mrl else {}),
                             **(dict(where=jnp.arange(b) < b - b // 10) if a.where else {}))
      argnums = (0,) if base == "lit" else (0, 1)
      gemms = 3 if base in ("lit", "siglip") else 5
      label = "default" if i == 0 else f"cfg{i}"
      note = str(t)
      args = (x, y)
      if a.learned and base == "siglip":   # t = 0.1, b = -10 as traced inputs
        args, argnums = (x, y, jnp.float32(0.1), jnp.float32(-10.0)), (0, 1, 2, 3)
        fn = functools.partial(lambda x, y, t, c, f, **k: f(x, y, temperature=t, bias=c, **k), f=fn)
      elif a.learned:   # t = 0.07 as a traced input: the gradient passes also sum c s
        args, argnums = (x, y, jnp.float32(0.07)), argnums + (2,)
        fn = functools.partial(lambda x, y, t, f, **k: f(x, y, temperature=t, **k), f=fn)
      full = jax.jit(jax.value_and_grad(
          lambda *v: fn(*v, backend="triton", config=cfg), argnums=argnums))
      fwd = jax.jit(lambda *v: fn(*v, backend="triton", config=cfg))
      tag = ("_learned" if len(args) > 2 else "") + ("_where" if a.where else "")
      r = Result(f"{name}{tag}_fwd+bwd", label, b, d, "bfloat16", note=note)
      def timed(r=r, full=full):
        r.extra_gib = compiled_extra_gib(full, *args)
        return summarize(r, time_jax(full, *args, reps=a.reps), gemms * 2.0 * b * b * d)
      guarded(w, r, timed)
      if a.no_fwd:
        continue
      r2 = Result(f"{name}{tag}_fwd", label, b, d, "bfloat16", note=note)
      guarded(w, r2, lambda: summarize(r2, time_jax(fwd, *args, reps=a.reps), 2.0 * b * b * d))


if __name__ == "__main__":
  main()
