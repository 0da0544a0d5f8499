"""The default table: tiles and switches by feature size and dtype, measured on an H200
with Triton 3.6 (docs/benchmarks.md, "Backends and the default tiles";
benchmarks/bench_configs.py)."""

from __future__ import annotations

import numpy as np

from memeff_jax.config.kernel import (Algorithm, Budgets, BwdTiles, FwdTiles, KernelConfig,
                                      RoleTiles, is_int)
from memeff_jax.config.smem import (TILED_FORWARD, check_arch, check_smem_kib, fit_smem,
                                    pow2)


# Feature sizes (d_pad) whose 16-bit bounded forward is stats_gluon's kernel where the
# Gluon Hopper kernels can be launched. B = 65536, jax-triton 0.4.1 + Triton 3.9, fwd+bwd,
# against the Triton forward: CLIP D = 512 42.1 -> 40.6 ms, LiT 24.8 -> 23.6, Qwen3 43.8 ->
# 42.5; D = 256 CLIP 21.3 -> 19.5, LiT 12.1 -> 10.7; D = 128 CLIP 13.2 -> 11.6, LiT 7.2 ->
# 6.5 (h200_gluon_fwd_lib.csv runs 3 and 4); D = 64 CLIP 9.89 -> 8.80, LiT 2.90 -> 2.77
# (forward alone: CLIP 4.08 -> 2.98; h200_jt04_d64.csv, Matryoshka's smallest per-dim
# block at D = 512). Above 512, x's rows do not fit shared memory.
GLUON_FWD = (64, 128, 256, 512)
_FLOATS = ("float16", "bfloat16", "float32", "float64")   # (bfloat16: ml_dtypes, through jax)


def default_config(d: int, dtype, *, interpret: bool = False,
                   smem_kib: int | None = None, tma: bool = False,
                   gluon: bool = False, arch: int | None = None) -> KernelConfig:
  """Default tiles for feature size ``d`` and input ``dtype`` on an H100/H200, fitted
  to ``smem_kib`` of shared memory a block on a GPU of compute capability major
  ``arch`` (None: the H100's 227 KiB and sm_90; the Triton backend passes its GPU's,
  see ``fit_smem``).

  16-bit inputs get the tiled forward (128 x 128 GEMM tiles, 64-feature chunks, both
  sides in one sweep, bounded) and a FlashAttention-shaped gradient up to d_pad = 512
  with tiles as large as its fp32 accumulator allows in registers; above that the
  gradient is tiled and paired (``Algorithm.bwd_pair``). At d_pad = 512 blocks of up
  to 16384 columns pair (``Budgets.bwd_pair_max_batch``). fp32 inputs keep the sweep
  forward, half-height tiles and no bounded forward. ``Algorithm.matryoshka_per_dim``
  holds the default of the losses' ``matryoshka_per_dim=`` keyword: one plain block
  per dim except fp32 at d_pad > 256 (the interpreter: one block for every dim).
  16-bit inputs form a one-sided block's rows' gradient in its forward
  (``Algorithm.fwd_row_grad``; bfloat16 only, ``TritonBackend.fuses_rows``). The
  measurements behind each row are in docs/benchmarks.md.

  ``interpret``: the tiles of Triton's CPU interpreter (the "interpret" backend): the
  whole padded feature size a chunk and few programs, since every program runs in
  Python; no shared memory is fitted.

  ``tma``: the GPU and jax-triton load tiles through TMA descriptors (compute
  capability >= 9.0, jax-triton >= 0.4, so Triton >= 3.7): the 16-bit
  FlashAttention-shaped gradient then takes them at d_pad = 256 and 512; at 512 a
  pass of the rows' softmax alone (LiT's; Qwen3's queries) streams 128-column tiles
  in one stage (with two, ptxas serializes the wgmma chain of Triton 3.9's code for
  it), and one of the columns' alone (Qwen3's documents) keeps pointer loads. The
  Triton backend passes True on Hopper alone (compute capability 9.x), where these
  tiles were measured.

  ``arch``: on a data-center Blackwell GPU (``config.smem.TCGEN05_ARCHS``) the 16-bit
  gradient at d_pad = 512 does not fit 227 KiB with the H200's tile: it is tiled there.

  ``gluon``: the Gluon Hopper kernels can be launched (``_compat.gluon_kernels``): the
  16-bit FlashAttention-shaped gradient at d = 512 then runs as ``grad_gluon``'s
  warp-specialized kernel (``BwdTiles.gluon``, set at d_pad = 512: other sizes keep the
  Triton kernel; 224 KiB of shared memory a block), and the 16-bit bounded forward at
  d_pad = 64 to 512 as ``stats_gluon``'s (``FwdTiles.gluon``; ``GLUON_FWD``).
  """
  if not is_int(d):
    raise TypeError(f"d must be an int (the feature size), got {d!r}")
  if d < 1:
    raise ValueError(f"d must be >= 1 (the feature size), got d={d}")
  check_smem_kib(smem_kib)   # (here too: the interpreter's return below fits nothing)
  check_arch(arch)
  try:
    floating = dtype is not None and np.dtype(dtype).name in _FLOATS
  except TypeError:
    floating = False
  if not floating:
    raise TypeError(f"dtype must be float16, bfloat16, float32 or float64 (the features'), "
                    f"got dtype={dtype!r}")
  d_pad = pow2(d)
  wide = np.dtype(dtype).itemsize >= 4
  if interpret:
    # The interpreter runs every program in Python: few, large tiles are fastest.
    return KernelConfig(fwd=FwdTiles(block_d=d_pad), bwd=BwdTiles(block_d=d_pad,
                                                                  block_do=d_pad),
                        algorithm=Algorithm(precision="ieee", fwd_bounded=not wide),
                        budgets=Budgets(max_programs=4, min_programs=1))
  # fwd_row_grad (16-bit, the FlashAttention-shaped gradient): B = 65536, fwd+bwd, the
  # one-sided block's rows' gradient from its forward (saved in float16 by row scales)
  # against a gradient pass, Triton 3.6: LiT D = 64 5.42 -> 2.73 ms, 128 7.06 -> 4.70,
  # 256 12.09 -> 8.39, 512 26.59 -> 21.79; Qwen3 12.37 -> 9.19, 17.07 -> 14.10, 27.74 ->
  # 23.92, 50.36 -> 45.26 (Triton 3.9, D <= 256: LiT 5.46 -> 2.95, 6.55 -> 4.20, 10.88
  # -> 6.84; Qwen3 10.70 -> 7.66, 16.01 -> 13.23, 20.11 -> 16.08); memory unchanged; the
  # gradients within every 16-bit test's bound (h200_fwd_row_grad.csv run 6,
  # h200_rows_forward_accuracy.csv). Above d_pad = 512 the tiled gradient's coefficient
  # slabs form it (one H100, both stacks: LiT D = 1024 64.1 -> 40.9 ms, D = 768 49.5 ->
  # 33.3, LiT-Qwen3 64.4 -> 41.4 and 50.9 -> 33.8, LiT at B = 16384, D = 1024 3.79 ->
  # 2.80 on Triton 3.9, the same within 2% on 3.6; memory unchanged;
  # h100_rows_forward_tiled.csv).
  cfg = _h100_config(d_pad, wide).evolve(
      algorithm=dict(fwd_bounded=not wide, matryoshka_per_dim=not wide or d_pad <= 256,
                     fwd_row_grad=not wide))
  if tma and not wide and d_pad in (256, 512):
    # B = 65536, jax-triton 0.4.1 + Triton 3.9, fwd+bwd: CLIP D = 512 51.4 -> 44.9 ms,
    # D = 256 22.3 -> 21.0 (LiT 12.7 -> 11.8). One role at 512 on these tiles: LiT
    # 30.4 -> 34.1, Qwen3 52.5 -> 60.5. The rows' softmax alone on 64 x 128 tiles in
    # one stage: LiT 30.1 -> 27.2 ms, with a learned temperature 37.2 -> 28.9; the
    # columns' alone so too made Qwen3 slower (52.1 -> 54.5), on its own tiles and
    # pointers 49.1, learned 58.7 -> 50.7 (Triton 3.6: LiT 27.2 / 28.7, Qwen3 49.3 /
    # 51.4; h200_role_tiles.csv). D = 128: 15.3 on its 64 x 128 tiles; 12.4 on 128 x
    # 64, which spill (h200_tma.csv; docs/benchmarks.md "TMA loads").
    roles = dict(row_role=RoleTiles(block_n=128, num_stages=1),
                 col_role=RoleTiles(tma=False)) if d_pad == 512 else {}
    cfg = cfg.evolve(bwd=dict(tma=True, **roles))
  if gluon and not wide and (smem_kib is None or smem_kib >= 225):
    if d_pad in GLUON_FWD:
      cfg = cfg.evolve(fwd=dict(gluon=True))
    if d_pad == 512:
      # B = 65536, jax-triton 0.4.1 + Triton 3.9, fwd+bwd, against the Triton kernels:
      # CLIP 44.8 -> 42.4 ms, LiT 27.3 -> 24.9, Qwen3 49.2 -> 44.1 (h200_gluon_roles.csv
      # runs 0 and 3; docs/benchmarks.md "The Gluon gradient"). The same kernel forms a
      # one-sided block's rows' gradient in its forward (``Algorithm.fwd_row_grad``).
      cfg = cfg.evolve(bwd=dict(gluon=True))
  if smem_kib is None and arch is None:
    return cfg
  return fit_smem(cfg, d, np.dtype(dtype).itemsize, smem_kib, arch)


def _cfg(fwd, bwd, *, fwd_d: int, bwd_d: int, bwd_do: int, one_sided_warps=None,
         **switches) -> KernelConfig:
  """A table row: forward and gradient (block_m, block_n, warps, stages), their
  feature chunks, and the ``Algorithm`` / ``Budgets`` fields in ``switches``."""
  (fm, fn, fw, fs), (bm, bn, bw, bs) = fwd, bwd
  budgets = {k: switches.pop(k) for k in list(switches)
             if k in ("bwd_pair_max_batch", "pair_block_cols")}
  return KernelConfig(
      fwd=FwdTiles(block_m=fm, block_n=fn, block_d=fwd_d, num_warps=fw, num_stages=fs,
                   one_sided_warps=one_sided_warps),
      bwd=BwdTiles(block_m=bm, block_n=bn, block_d=bwd_d, block_do=bwd_do, num_warps=bw,
                   num_stages=bs),
      algorithm=Algorithm(**switches), budgets=Budgets(**budgets))


def _h100_config(d_pad: int, wide: bool) -> KernelConfig:
  res = dict(fwd_d=d_pad, bwd_d=d_pad, bwd_do=d_pad, fwd_col_pass=True)
  tiled = dict(res, fwd_d=64, **TILED_FORWARD)   # 16-bit: the forward's GEMM tiles
  if d_pad <= 128:
    return _cfg((64, 64, 8, 3), (128, 64, 8, 3), **res) if wide else \
        _cfg((128, 128, 4, 3), (128, 64, 4, 3) if d_pad <= 64 else (64, 128, 4, 3), **tiled)
  if d_pad <= 256:
    return _cfg((64, 64, 8, 2), (64, 32, 8, 2), **res) if wide else \
        _cfg((128, 128, 4, 3), (64, 64, 4, 2), **tiled)
  if d_pad <= 512:
    return _cfg((32, 32, 8, 2), (32, 32, 8, 2), **res) if wide else \
        _cfg((128, 128, 4, 3), (64, 64, 8, 2), **tiled, one_sided_warps=8,
             bwd_pair_max_batch=16384)
  if not wide:
    # The paired slabs in blocks of 8192 columns: CLIP B = 65536, one H100, D = 1024
    # 96.5 -> 79.4 ms, D = 768 75.0 -> 62.5 (Triton 3.9; 3.6: 96.6 -> 81.0 at 1024).
    return _cfg((128, 128, 4, 3), (64, 128, 4, 4),
                **dict(tiled, bwd_d=64), bwd_tiled=True, bwd_pair=True, pair_block_cols=8192)
  chunked = dict(fwd_d=64, bwd_d=64, bwd_do=128, fwd_col_pass=True)
  return _cfg((64, 64, 8, 3), (64, 64, 8, 3), **chunked)
