"""Kernel tile sizes and launch settings: the one place for their defaults."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal

import numpy as np

Precision = Literal["tf32", "tf32x3", "ieee"]


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Tile sizes and launch settings of the Triton kernels and the blockwise backend.

  Attributes:
    fwd_block_m, fwd_block_n: row/column tile of the statistics (forward) kernel.
    fwd_num_warps, fwd_num_stages: its launch settings.
    fwd_one_sided_warps: warps of the tiled forward on blocks that need only row
      statistics (LiT, Qwen3); None: ``fwd_num_warps``. (On an H200 at D = 512 the
      two-sided tile runs best with 4 warps, the one-sided one with 8.)
    bwd_block_m, bwd_block_n: row/column tile of the gradient kernel.
    bwd_num_warps, bwd_num_stages: its launch settings.
    fwd_block_d, bwd_block_d: feature chunk of each kernel's similarity dot.
      ``>= d`` keeps the row tile resident for the whole column sweep; smaller
      values walk the features in chunks (large ``d``).
    bwd_block_do: feature width of one gradient program's fp32 accumulator. Below
      ``d``, the grid gains a feature axis and each program recomputes its
      similarities (no atomics, still deterministic). Matryoshka's
      FlashAttention-shaped gradient ignores it (one launch, every chunk).
    max_programs: cap on forward programs when column statistics are needed;
      each keeps one fp32 partial per column, so this bounds that O(programs * m)
      buffer.
    min_programs: below this many row tiles the column sweep is split across
      programs (partials reduced in JAX) so small batches still fill the GPU.
    fwd_col_pass: two-sided blocks (CLIP) get their column statistics from a second
      row pass over the swapped block instead of per-program column partials.
    fwd_tiled: the forward as slabs of plain GEMM tiles (grid rows x columns), each
      with a row and a column partial log-sum-exp: both sides in one sweep.
    fwd_bounded: the tiled forward sums 2^(z - shift) against one shift per block
      (the logit scale, less a margin: unit rows bound every logit) instead of
      shifting by each row's and column's maximum: one exponential per entry for both
      sides and no max reductions (CLIP B = 65536 at D = 64: 6.5 -> 3.1 ms for the
      kernel). A statistic that comes out below the bound's exact range (a row of
      logits over ~115 below the scale, a fully masked row) or non-finite reruns
      the exact forward (``lax.cond``), so no term is ever lost. Its rounding is
      coarser: the exponent arguments z - shift reach ~96, so each term carries a
      relative error of ~2^-17, ~30x the exact forward's; below 16-bit inputs' own
      rounding, but visible in fp32 (debiased temperature gradients), so
      ``default_config`` turns it on for 16-bit inputs only (a bare
      ``KernelConfig`` has it on). The in-batch accuracy's maxima are then
      computed only for the ``*_with_stats`` losses.
    bwd_tiled: the gradient as slabs of coefficient tiles from GEMM-tile programs,
      multiplied into the gradient by an XLA dot (cuBLAS); otherwise the
      FlashAttention-shaped pass with the accumulator in registers.
    bwd_pair: (Triton backend) a block whose two towers both need a gradient (CLIP,
      Qwen3's query-doc block; not LiT) takes the tiled gradient and multiplies each
      coefficient slab into both towers (``c @ y`` and ``c^T @ x``, cuBLAS), instead
      of a pass per tower that recomputes the similarities. Its tiles are ``bwd_*`` where
      ``bwd_tiled``, else the tiled gradient's defaults (64 x 128, 4 warps, as many
      stages as fit). It costs a slab (rows x batch, input dtype) and an fp32
      accumulator for the columns' gradient, so it runs faster with taller slabs:
      on in the defaults where the gradient is tiled (16-bit, d_pad > 512), and the
      way to trade memory for speed at d = 512 (with ``min_slab_rows`` of 2048 or
      more; docs/benchmarks.md, "Trading memory for speed").
    bwd_pair_max_batch: blocks of at most this many columns (the batch, or one
      device's share of it through the ring) take ``bwd_pair`` even where it is off;
      0: none. The 16-bit defaults at d_pad = 512 pair up to 16384 columns (CLIP
      B = 16384 then takes 0.21 GiB extra, less than B = 65536 unpaired: 0.25).
    slab_kib: memory budget of one slab's buffers (KiB) for the tiled passes.
    min_slab_rows: the tiled gradient's coefficient slabs keep at least this many
      rows whatever ``slab_kib`` says (a thinner slab starves its XLA dot: at
      B = 262144, D = 1024, 128-row slabs ran at 60% of the speed of 512-row ones).
    matryoshka_per_dim: a Matryoshka loss runs one plain block per dim (through the
      ring: one plain ring per dim), on that dim's renormalized prefixes (copies:
      sum(m_k) / D of each tower, in its dtype), instead of one block whose feature
      walk serves every dim through prefix tables (no copies, O(K B) extra; through
      the ring its travelling block moves once for all dims). Same math; in 16-bit
      each prefix is rounded as the eager wrapper rounds it. On in the GPU defaults
      (fp32 only up to d_pad = 256; see ``default_config``). Off in the interpreter's
      defaults and for the blockwise backend with ``config=None``.
    precision: ``tl.dot`` input precision for fp32 inputs ("tf32" like JAX's
      default GPU matmul, "tf32x3", or "ieee"). 16-bit inputs ignore it.
    blockwise_tile: column tile of the pure-JAX blockwise backend.
  """

  fwd_block_m: int = 64
  fwd_block_n: int = 64
  fwd_num_warps: int = 4
  fwd_num_stages: int = 2
  fwd_one_sided_warps: int | None = None
  bwd_block_m: int = 64
  bwd_block_n: int = 64
  bwd_num_warps: int = 4
  bwd_num_stages: int = 2
  fwd_block_d: int = 64
  bwd_block_d: int = 64
  bwd_block_do: int = 64
  max_programs: int = 264
  min_programs: int = 264
  fwd_col_pass: bool = False
  fwd_tiled: bool = False
  fwd_bounded: bool = True
  bwd_tiled: bool = False
  bwd_pair: bool = False
  bwd_pair_max_batch: int = 0
  slab_kib: int = 65536
  min_slab_rows: int = 512
  matryoshka_per_dim: bool = False
  precision: Precision = "tf32"
  blockwise_tile: int = 512

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if f.name == "precision":
        if v not in ("tf32", "tf32x3", "ieee"):
          raise ValueError(f"precision={v!r}; expected 'tf32', 'tf32x3' or 'ieee'")
      elif f.name in ("fwd_col_pass", "fwd_tiled", "fwd_bounded", "bwd_tiled", "bwd_pair",
                      "matryoshka_per_dim"):
        if not isinstance(v, bool):
          raise ValueError(f"KernelConfig.{f.name} must be a bool, got {v!r}")
      elif f.name == "fwd_one_sided_warps" and v is None:
        continue
      elif f.name == "bwd_pair_max_batch":
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
          raise ValueError(f"KernelConfig.{f.name} must be an int >= 0, got {v!r}")
      elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"KernelConfig.{f.name} must be a positive int, got {v!r}")
    for name in ("fwd_block_m", "fwd_block_n", "bwd_block_m", "bwd_block_n", "fwd_block_d",
                 "bwd_block_d", "bwd_block_do"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"KernelConfig.{name} must be a power of two >= 16 (tl.dot), got {v}")


def _pow2(v: int) -> int:
  return max(16, 1 << (int(v) - 1).bit_length())


def _cfg(fwd, bwd, **kw) -> KernelConfig:
  (fm, fn, fw, fs), (bm, bn, bw, bs) = fwd, bwd
  return KernelConfig(fwd_block_m=fm, fwd_block_n=fn, fwd_num_warps=fw, fwd_num_stages=fs,
                      bwd_block_m=bm, bwd_block_n=bn, bwd_num_warps=bw, bwd_num_stages=bs,
                      **kw)


def smem_bytes(cfg: KernelConfig, d: int, itemsize: int) -> tuple[int, int]:
  """Estimated shared memory of the (forward, gradient) kernels ``cfg`` launches for
  feature size ``d``: the pipelined tiles, as Triton 3.6 allocates them on an H200
  (a resident row tile plus ``stages`` streamed tiles, or ``stages`` chunk pairs)."""
  d_pad = _pow2(d)

  def chunks(bm, bn, bk, st):   # GEMM tiles: the features walked in chunks
    return (bm + bn) * min(bk, d_pad) * itemsize * st

  def sweep(bm, bn, bd, st):   # a resident row tile, or chunks if bd < d
    return (bm + st * bn) * d_pad * itemsize if bd >= d_pad else chunks(bm, bn, bd, st)

  f = (cfg.fwd_block_m, cfg.fwd_block_n, cfg.fwd_block_d, cfg.fwd_num_stages)
  b = (cfg.bwd_block_m, cfg.bwd_block_n, cfg.bwd_block_d, cfg.bwd_num_stages)
  fwd = chunks(*f) if cfg.fwd_tiled else sweep(*f)
  if cfg.bwd_tiled:
    bwd = chunks(*b)
  else:   # plus the streamed gradient-feature tiles when they are not the similarity's
    bwd = sweep(*b) + (0 if min(cfg.bwd_block_d, cfg.bwd_block_do) >= d_pad else
                       cfg.bwd_block_n * min(cfg.bwd_block_do, d_pad) * itemsize * b[3])
  return fwd, bwd


def _tiled(cfg: KernelConfig, pass_: str, bk: int, d: int, itemsize: int,
           limit: int) -> KernelConfig:
  """``cfg`` with its forward (pass_="fwd") or gradient ("bwd") switched to the tiled
  kernel with the H200's tiled tiles and ``bk``-feature chunks, with the most
  pipeline stages whose shared memory for feature size d fits ``limit`` bytes."""
  tiles = (dict(fwd_tiled=True, fwd_block_m=128, fwd_block_n=128, fwd_block_d=bk,
                fwd_num_warps=8) if pass_ == "fwd" else
           dict(bwd_tiled=True, bwd_block_m=64, bwd_block_n=128, bwd_block_d=bk,
                bwd_num_warps=4))
  for st in ((3, 2) if pass_ == "fwd" else (4, 3, 2)):
    cfg = dataclasses.replace(cfg, **tiles, **{f"{pass_}_num_stages": st})
    if smem_bytes(cfg, d, itemsize)[pass_ == "bwd"] <= limit:
      break
  return cfg


def _smem_limit(smem_kib: int | None) -> int:
  """Bytes of shared memory a launch may use: ``smem_kib`` (None: the H100's 227 KiB)
  less 8 KiB kept free for Triton's scratch."""
  return ((227 if smem_kib is None else smem_kib) - 8) * 2**10


def _fewer_stages(cfg: KernelConfig, need, limit: int) -> KernelConfig:
  """``cfg`` with its FlashAttention-shaped gradient's pipeline stages dropped, down
  to 2, until ``need(cfg)`` (its shared memory, bytes) is at most ``limit``."""
  while need(cfg) > limit and cfg.bwd_num_stages > 2:
    cfg = dataclasses.replace(cfg, bwd_num_stages=cfg.bwd_num_stages - 1)
  return cfg


def fit_smem(cfg: KernelConfig, d: int, itemsize: int, smem_kib: int) -> KernelConfig:
  """``cfg``, fitted where a launch would exceed ``smem_kib`` (8 KiB kept free for
  Triton's scratch): a FlashAttention-shaped gradient first drops pipeline stages (down
  to 2), then the forward and/or gradient switch to the tiled kernels (whose chunked
  tiles need far less shared memory). An H100/H200 (227 KiB) never needs it; an A100
  (163 KiB) or a consumer GPU (99 KiB) can (the 16-bit gradient at d_pad = 128 keeps
  its tile there with 2 stages). Not measured on those GPUs."""
  limit = _smem_limit(smem_kib)
  if not cfg.bwd_tiled:
    cfg = _fewer_stages(cfg, lambda c: smem_bytes(c, d, itemsize)[1], limit)
  fwd, bwd = smem_bytes(cfg, d, itemsize)
  bk = 64 if itemsize < 4 else 32
  if fwd > limit:
    cfg = _tiled(cfg, "fwd", bk, d, itemsize, limit)
  if bwd > limit:
    cfg = _tiled(cfg, "bwd", bk, d, itemsize, limit)
  return cfg


def paired_config(cfg: KernelConfig, d: int, itemsize: int,
                  smem_kib: int | None = None) -> KernelConfig:
  """The config of a ``bwd_pair`` gradient: ``cfg`` where its gradient is tiled, else
  with the tiled gradient's tiles (as ``fit_smem`` picks them) in place of the
  FlashAttention-shaped ones, on cfg's feature chunk (at most 64, 32 for fp32)."""
  if cfg.bwd_tiled:
    return cfg
  chunk = min(cfg.bwd_block_d, 64 if itemsize < 4 else 32)
  return _tiled(cfg, "bwd", chunk, d, itemsize, _smem_limit(smem_kib))


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

  retile (the GPU defaults; sm_90 compile and H200 timings at K = 4, D = 512,
  benchmarks/NOTES.md): the forward 128 x 64 with 4 warps for 16-bit inputs (the kernel
  alone, bf16 bounded: 30.0 ms against 49.6 for 64 x 64 and 48.4 for 128 x 64 with 8
  warps: the K epilogues, not the GEMM, set its time), 64 x 64 with 4 warps for fp32
  (128 x 64 spills there: 142 against 80 ms). The
  FlashAttention-shaped gradient, 32 x 64 with 8 warps and 3 stages (no spills), for
  16-bit inputs, d_pad <= 512 and a ladder of 64-feature chunks (multiples of 64);
  narrower chunks (ragged ladders, fp32's 32) mean more, smaller accumulator tiles
  that spill 1-27 KB a thread, and 64-row tiles spill too. Otherwise the tiled
  gradient, 64 x 64 with 8 warps. The interpreter takes the FlashAttention-shaped
  gradient wherever it is not tiled. A user's config keeps its tiles (the launcher
  counts ``default_config``, whatever its ``matryoshka_per_dim``, as none); an untiled
  forward, and an untiled gradient where the rule above says tiled, are switched to
  the tiled kernels, fitted to ``smem_kib`` (None: the H100's 227 KiB); so is a
  FlashAttention-shaped gradient that does not fit it with 2 stages (an A100 keeps it
  with 2; a 99 KiB GPU takes the tiled one).
  """
  bk = 64 if itemsize < 4 else 32
  fa = interpret or (itemsize < 4 and _pow2(dims[-1]) <= 512 and ladder_chunk(dims, bk) == bk)
  if retile:
    cfg = dataclasses.replace(
        cfg, fwd_tiled=True, fwd_block_m=128 if itemsize < 4 else 64, fwd_block_n=64,
        fwd_block_d=bk, fwd_num_warps=4, fwd_one_sided_warps=None, fwd_num_stages=3,
        bwd_tiled=not fa, bwd_block_m=32 if fa else 64, bwd_block_n=64, bwd_block_d=bk,
        bwd_num_warps=8, bwd_num_stages=3)
  limit = _smem_limit(smem_kib)
  if fa and not interpret and not cfg.bwd_tiled:
    # Its pipeline buffers hold a column tile's every chunk: (stages - 1) x BLOCK_N x
    # d_pad, plus ~40 KiB (Triton 3.6 for sm_80, 32 x 64 at D = 512, bf16: 167 KiB with
    # 3 stages, over an A100's 163; 102 with 2). Fewer stages, else the tiled gradient.
    need = lambda c: ((c.bwd_num_stages - 1) * c.bwd_block_n * _pow2(dims[-1]) * itemsize
                      + 40 * 2**10)
    cfg = _fewer_stages(cfg, need, limit)
    fa = need(cfg) <= limit
  for pass_, switch in (("fwd", not cfg.fwd_tiled), ("bwd", not cfg.bwd_tiled and not fa)):
    if switch:
      chunk = min(bk, getattr(cfg, f"{pass_}_block_d"))
      cfg = _tiled(cfg, pass_, chunk, chunk, itemsize, limit)
  block = min(cfg.fwd_block_d, cfg.bwd_block_d)
  return dataclasses.replace(cfg, fwd_block_d=block, bwd_block_d=block)


def default_config(d: int, dtype, *, interpret: bool = False,
                   smem_kib: int | None = None) -> KernelConfig:
  """Default tiles for feature size ``d`` and input ``dtype`` on an H100/H200, fitted
  to ``smem_kib`` of shared memory a block (None: the H100's 227 KiB; the Triton
  backend passes its GPU's, see ``fit_smem``).

  Measured on an H200 with Triton 3.6 (benchmarks/bench_configs.py, NOTES.md):
  - 16-bit inputs: the forward is tiled (128 x 128 GEMM tiles, 64-feature chunks,
    3 stages: both sides in one sweep) with 4 warps. Two-sided at B = 65536, 4
    against 8 warps: 7.0 vs 12.9 ms at D = 128 (the kernel alone), 8.9 vs 14.8 at
    256, 11.8 vs 17.1 at 512; one-sided blocks keep 8 at d_pad = 512 (4 lose 8%).
  - The gradient is FlashAttention-shaped up to d_pad = 512 with tiles as large as
    its fp32 accumulator allows in registers: 128 x 64 with 4 warps at d_pad <= 64,
    64 x 128 with 4 warps at 128 (its pass 3.5 against 3.8 ms at B = 65536; 3.8 against
    7.7 when it also sums c s for a learnable temperature, which made 128 x 64 spill),
    64 x 64 with 4 warps at 256, 64 x 64 with 8 warps at 512 (the 64 x 512
    accumulator is 128 registers a thread); above, the accumulator no longer fits
    and the gradient is tiled (coefficient slabs times cuBLAS) and paired
    (``bwd_pair``: CLIP B = 32768 D = 1024 25.0 -> 21.6 ms, 0.36 -> 0.49 GiB for the
    columns' fp32 accumulator). At d_pad = 512 ``bwd_pair`` is faster but costs
    memory, so it is on for blocks of up to 16384 columns (``bwd_pair_max_batch``;
    CLIP B = 16384: 3.77 -> 2.99 ms, 0.13 -> 0.21 GiB; B = 32768: 13.4 -> 10.9 ms, but
    0.13 -> 0.39 GiB) and left to the user above (B = 65536: 53.9 ms, 0.25 GiB;
    2048-row slabs 44.9 ms, 0.74 GiB; docs/benchmarks.md, "Trading memory for speed").
  - fp32 inputs keep the sweep forward (resident row tile, online statistics, a
    second row sweep for the columns) and half-height tiles, and no bounded forward
    (``fwd_bounded``; the one-block Matryoshka forward is tiled, so it would be).
  - Matryoshka runs one plain block per dim (``matryoshka_per_dim``), each with the
    default tiles of its own prefix size, except fp32 at d_pad > 256, whose plain
    tiles are slow (fwd+bwd, CLIP, dims d/8..d: bf16 B = 65536 D = 128 50.8 ms against
    296 in one block, D = 512 110.7 against 231, B = 32768 D = 1024 49.8 against 111;
    fp32 B = 32768 D = 128 35.5 against 94.9, but D = 512 189 against 127).
  - Shared memory (``smem_bytes``: resident tile + stages * streamed tiles) must stay
    under 227 KB or the launch fails; fp32 tiles are half as tall.
  """
  d_pad = _pow2(d)
  wide = np.dtype(dtype).itemsize >= 4
  if interpret:
    # The interpreter runs every program in Python: few, large tiles are fastest.
    return KernelConfig(fwd_block_m=64, fwd_block_n=64, bwd_block_m=64, bwd_block_n=64,
                        fwd_block_d=d_pad, bwd_block_d=d_pad, bwd_block_do=d_pad,
                        precision="ieee", max_programs=4, min_programs=1,
                        fwd_bounded=not wide)
  cfg = dataclasses.replace(_h100_config(d_pad, wide), fwd_bounded=not wide,
                            matryoshka_per_dim=not wide or d_pad <= 256)
  return cfg if smem_kib is None else fit_smem(cfg, d, np.dtype(dtype).itemsize, smem_kib)


def _h100_config(d_pad: int, wide: bool) -> KernelConfig:
  res = dict(fwd_block_d=d_pad, bwd_block_d=d_pad, bwd_block_do=d_pad, fwd_col_pass=True)
  tiled = dict(res, fwd_block_d=64, fwd_tiled=True)   # 16-bit: the forward's GEMM tiles
  if d_pad <= 128:
    return _cfg((64, 64, 8, 3), (128, 64, 8, 3), **res) if wide else \
        _cfg((128, 128, 4, 3), (128, 64, 4, 3) if d_pad <= 64 else (64, 128, 4, 3), **tiled)
  if d_pad <= 256:
    return _cfg((64, 64, 8, 2), (64, 32, 8, 2), **res) if wide else \
        _cfg((128, 128, 4, 3), (64, 64, 4, 2), **tiled)
  if d_pad <= 512:
    return _cfg((32, 32, 8, 2), (32, 32, 8, 2), **res) if wide else \
        _cfg((128, 128, 4, 3), (64, 64, 8, 2), **tiled, fwd_one_sided_warps=8,
             bwd_pair_max_batch=16384)
  if not wide:
    return _cfg((128, 128, 4, 3), (64, 128, 4, 4),
                **dict(tiled, bwd_block_d=64, fwd_col_pass=False), bwd_tiled=True,
                bwd_pair=True)
  chunked = dict(fwd_block_d=64, bwd_block_d=64, bwd_block_do=128, fwd_col_pass=True)
  return _cfg((64, 64, 8, 3), (64, 64, 8, 3), **chunked)
