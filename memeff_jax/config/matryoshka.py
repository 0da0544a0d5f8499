"""Matryoshka retiling: the config of a block with prefix dims (one feature walk with
an epilogue per dim; docs/math.md §8), the feature chunk its ladder is laid out in, and
which of the two forms a loss runs (``per_dim_choice``). The timings behind the tiles
are in docs/benchmarks.md ("Backends and the default tiles")."""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import warnings

from memeff_jax.config.kernel import Algorithm, KernelConfig, RoleTiles
from memeff_jax.config.smem import TILED_FORWARD, fewer_stages, pow2, smem_limit, tiled


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
                 num_stages=3, row_role=RoleTiles(), col_role=RoleTiles()),
        algorithm=dict(TILED_FORWARD, bwd_tiled=not fa))
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


_FORMS = {True: "one plain block per dim", False: "one block for every dim"}
# Algorithm.matryoshka_per_dim's own default: a config holding it may never have set it.
_FIELD_DEFAULT = {f.name: f.default for f in dataclasses.fields(Algorithm)}["matryoshka_per_dim"]


def per_dim_choice(keyword: bool | None, config: KernelConfig | None, default: bool) -> bool:
  """Whether fused Matryoshka runs one plain block per dim (True) or one block for every
  dim (False): the loss's ``matryoshka_per_dim`` keyword, else the backend's ``default``
  (its ``default_config``'s), but for a config that chooses otherwise.

  A config chooses where its ``algorithm.matryoshka_per_dim`` differs from ``default``
  (a config equal to the default chooses nothing, as for the tiles). That spelling is
  deprecated: with ``keyword=None`` the config's value still decides, with a
  DeprecationWarning naming the keyword. With a keyword, the keyword decides; a config
  value that neither ``default`` nor the field's own default (False) explains was set
  on purpose, and if the keyword disagrees, ValueError names both.
  """
  own = default if config is None else config.algorithm.matryoshka_per_dim
  if own == default:
    return default if keyword is None else keyword
  if keyword is None:
    warnings.warn(
        f"config.algorithm.matryoshka_per_dim={own} runs {_FORMS[own]} (this backend's "
        f"default: {_FORMS[default]}); choosing it in the config is deprecated and goes in "
        f"a future release: pass matryoshka_per_dim={own} to the loss",
        DeprecationWarning, stacklevel=_user_level())
    return own
  if keyword != own and own != _FIELD_DEFAULT:
    raise ValueError(
        f"matryoshka_per_dim={keyword} and config.algorithm.matryoshka_per_dim={own} "
        f"disagree; pass matryoshka_per_dim alone (the config's field is deprecated)")
  return keyword


def _user_level() -> int:
  """The warning's stacklevel: the first frame outside memeff_jax (the user's call of
  the loss, through the chain, the options table and a wrapper)."""
  frame, level = sys._getframe(1), 1   # pylint: disable=protected-access
  while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == \
      "memeff_jax":
    frame, level = frame.f_back, level + 1
  return level
