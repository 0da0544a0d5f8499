"""Matryoshka retiling: the config of a block with prefix dims (one feature walk with
an epilogue per dim; docs/math.md §8), and the feature chunk its ladder is laid out in.
The timings behind the tiles are in docs/benchmarks.md ("Why the default tiles")."""

from __future__ import annotations

import functools
import math

from memeff_jax.config.kernel import KernelConfig
from memeff_jax.config.smem import fewer_stages, pow2, smem_limit, tiled


def ladder_chunk(dims, block: int) -> int:
  """The feature chunk the kernels walk a Matryoshka ladder in: ``block``, or where a
  dim is no multiple of it the largest power of two dividing every dim (at least 16;
  the segments are then zero-padded to it)."""
  if all(m % block == 0 for m in dims):
    return block
  g = functools.reduce(math.gcd, dims)
  return max(16, min(block, g & -g))


def matryoshka_config(cfg: KernelConfig, dims, itemsize: int, smem_kib: int | None = None,
                      *, retile: bool = True, interpret: bool = False) -> KernelConfig:
  """The config of a Matryoshka block with prefix ``dims``: the tiled forward (one
  feature walk with an epilogue per dim) and, where it compiles without spilling,
  the FlashAttention-shaped gradient, else the tiled one; one feature chunk for both
  passes (the ladder is laid out in chunks).

  retile (the GPU defaults, from sm_90 compiles and H200 timings): the forward 128 x 64
  with 4 warps for 16-bit inputs, 64 x 64 with 4 warps for fp32 (128 x 64 spills
  there); the FlashAttention-shaped gradient, 32 x 64 with 8 warps and 3 stages, for
  16-bit inputs, d_pad <= 512 and a ladder of 64-feature chunks (narrower chunks and
  64-row tiles spill); otherwise the tiled gradient, 64 x 64 with 8 warps. The
  interpreter takes the FlashAttention-shaped gradient wherever it is not tiled. A
  user's config keeps its tiles (the Triton backend's plan counts ``default_config``,
  whatever its ``matryoshka_per_dim``, as none); an untiled forward, and an untiled
  gradient where the rule above says tiled, are switched to the tiled kernels, fitted
  to ``smem_kib`` (None: the H100's 227 KiB); so is a FlashAttention-shaped gradient
  that does not fit it with 2 stages (an A100 keeps it with 2; a 99 KiB GPU takes the
  tiled one).
  """
  bk = 64 if itemsize < 4 else 32
  fa = interpret or (itemsize < 4 and pow2(dims[-1]) <= 512 and ladder_chunk(dims, bk) == bk)
  if retile:
    cfg = cfg.evolve(
        fwd=dict(block_m=128 if itemsize < 4 else 64, block_n=64, block_d=bk, num_warps=4,
                 one_sided_warps=None, num_stages=3),
        bwd=dict(block_m=32 if fa else 64, block_n=64, block_d=bk, num_warps=8,
                 num_stages=3),
        algorithm=dict(fwd_tiled=True, bwd_tiled=not fa))
  limit = smem_limit(smem_kib)
  if fa and not interpret and not cfg.algorithm.bwd_tiled:
    # Its pipeline buffers hold a column tile's every chunk: (stages - 1) x BLOCK_N x
    # d_pad, plus ~40 KiB (Triton 3.6 for sm_80, 32 x 64 at D = 512, bf16: 167 KiB with
    # 3 stages, over an A100's 163; 102 with 2). Fewer stages, else the tiled gradient.
    need = lambda c: ((c.bwd.num_stages - 1) * c.bwd.block_n * pow2(dims[-1]) * itemsize
                      + 40 * 2**10)
    cfg = fewer_stages(cfg, need, limit)
    fa = need(cfg) <= limit
  for pass_, switch in (("fwd", not cfg.algorithm.fwd_tiled),
                        ("bwd", not cfg.algorithm.bwd_tiled and not fa)):
    if switch:
      chunk = min(bk, getattr(cfg, pass_).block_d)
      cfg = tiled(cfg, pass_, chunk, chunk, itemsize, limit)
  block = min(cfg.fwd.block_d, cfg.bwd.block_d)
  return cfg.evolve(fwd=dict(block_d=block), bwd=dict(block_d=block))
