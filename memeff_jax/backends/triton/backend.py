"""``TritonBackend``: the Triton kernels behind the ``Backend`` Protocol, and the plan
each block's launches follow.

A block's plan (its configs and Matryoshka ladder) is resolved once per distinct
(user config, dims, feature size, dtype, GPU) by ``resolve_plan`` and shared by the
methods that launch or decide for the block (``fwd_floor``, ``fwd_stats``, ``pairs``,
``bwd``, ``bwd_pair``, ``fuses``, ``fwd_grad``, ``fuses_rows``, ``fwd_rows``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from memeff_jax import _compat
from memeff_jax.backends.base import Block, Side
from memeff_jax.backends.triton.backward import lse_bwd, lse_fwd_rows
from memeff_jax.backends.triton.forward import fwd_floor, lse_fwd
from memeff_jax.backends.triton.ladder import Ladder
from memeff_jax.config import KernelConfig, default_config, matryoshka_config, paired_config
from memeff_jax.config.smem import fewer_stages, smem_bytes, smem_limit


@functools.cache
def _device_arch() -> int | None:
  """The first GPU's compute capability major (9: Hopper), None without one: what the
  default tiles are fitted to beside the shared memory (``config.smem.TCGEN05_ARCHS``),
  and the TMA tiles' condition (Hopper's alone)."""
  found = _compat.compute_capability()
  return None if found is None else found[0]


@functools.cache
def _device_smem_kib() -> int:
  """Shared memory one block may use on the first GPU (KiB): the driver's figure
  (``_compat.max_shared_bytes``), else by compute capability."""
  found = _compat.max_shared_bytes()
  if found:
    return found // 1024
  capability = _compat.compute_capability()
  if capability is None:
    return 227
  major, minor = capability
  if major in (9, 10):   # H100/H200, B200
    return 227
  if (major, minor) in ((8, 0), (8, 7)):   # A100, Orin
    return 163
  if major == 7:   # V100; T4
    return 96 if minor == 0 else 64
  return 99   # consumer Ampere/Ada/Blackwell


@dataclasses.dataclass(frozen=True)
class PlanKey:
  """Everything a block's plan depends on (hashable: plans are cached by it)."""

  interpret: bool
  config: KernelConfig | None   # the user's ``config=`` (None: none passed)
  dims: tuple[int, ...] | None  # Matryoshka prefix dims of the block (None: plain)
  d: int                        # feature size
  dtype: jnp.dtype              # input dtype
  smem_kib: int | None          # the GPU's shared memory a block (None: interpreter)
  tma: bool = False             # the GPU and jax-triton take TMA descriptors
  gluon: bool = False           # and Gluon Hopper kernels (``_compat.gluon_kernels``)
  arch: int | None = None       # the GPU's compute capability major (None: interpreter)


@dataclasses.dataclass(frozen=True)
class Plan:
  """One block's launches, resolved once: ``config`` for the forward and the gradient,
  ``paired`` for ``bwd_pair``, ``fused`` for ``fwd_grad``, the Matryoshka ``ladder``
  (None: plain block), and
  ``user_tiles``: whether the user's config keeps its own tiles (a config equal to
  ``default_config``, whatever its ``matryoshka_per_dim``, counts as none passed:
  Matryoshka then retiles it)."""

  config: KernelConfig
  paired: KernelConfig
  fused: KernelConfig
  ladder: Ladder | None
  user_tiles: bool

  @property
  def bounded(self) -> bool:
    """Whether the forward runs bounded (``fwd_floor`` applies)."""
    alg = self.config.algorithm
    return alg.fwd_bounded and (alg.fwd_tiled or self.ladder is not None)

  def pairs(self, m: int) -> bool:
    """Whether a block of ``m`` columns takes ``bwd_pair``."""
    return self.config.algorithm.bwd_pair or m <= self.config.budgets.bwd_pair_max_batch


@functools.lru_cache(maxsize=1024)
def resolve_plan(key: PlanKey) -> Plan:
  """The plan of a block (see ``Plan``); cached by ``key``."""
  itemsize = jnp.dtype(key.dtype).itemsize
  default = default_config(key.d, key.dtype, interpret=key.interpret, smem_kib=key.smem_kib,
                           tma=key.tma, gluon=key.gluon, arch=key.arch)
  cfg = key.config if key.config is not None else default
  user_tiles = key.config is not None and cfg.evolve(
      algorithm=dict(matryoshka_per_dim=default.algorithm.matryoshka_per_dim)) != default
  ladder = None
  if key.dims is not None:
    cfg = matryoshka_config(cfg, key.dims, itemsize, key.smem_kib,
                            retile=not user_tiles and not key.interpret,
                            interpret=key.interpret)
    ladder = Ladder.of(key.dims, cfg.fwd.block_d)
  paired = paired_config(cfg, key.d, itemsize, key.smem_kib)
  fused = paired
  if not user_tiles and key.interpret:
    # The sigmoid's forward epilogue keeps more of the tile live than the softmax's
    # (and c s for a learned temperature): at most 32 entries a thread.
    warps = max(paired.bwd.num_warps, paired.bwd.block_m * paired.bwd.block_n // 1024)
    fused = paired.evolve(bwd=dict(num_warps=warps))
  elif not user_tiles:
    # 128 x 128 tiles with 8 warps (the sigmoid epilogue in two column chunks of 32
    # entries a thread) and 512 MiB slabs (one pass writes every coefficient, so a thin
    # slab starves the XLA dots that follow): B = 65536, D = 512, learned t and b,
    # 4096-row slabs, 31.5 ms (64 x 64 tiles, 4 warps, 2048 rows: 36.9) for 1.18 GiB;
    # B = 16384 in one slab 2.20 ms (4096 rows: 2.47)
    # (benchmarks/results/h200_siglip_chunked_tiles.csv, docs/benchmarks.md "SigLIP").
    # Where the defaults count on TMA (jax-triton 0.4, Triton >= 3.7) 128 x 256 tiles:
    # Triton 3.9 30.4 -> 28.7 and 31.0 -> 29.2 ms, Triton 3.6 30.6 -> 31.5
    # (h200_siglip_tiles_jt04.csv). Fitted as the other tiles are: fewer stages where
    # the GPU's shared memory is less.
    # Its slabs span every column (pair_block_cols = 0): at D = 1024 on an H100 53.0 ms
    # and 1.81 GiB, against 64.3 and 1.14 with the paired plan's 64 MiB in 8192-column
    # blocks (h100_jt04_siglip_column_blocks.csv, docs/notes/gradient.md).
    fused = fewer_stages(
        paired.evolve(bwd=dict(block_m=128, block_n=256 if key.tma else 128, num_warps=8,
                               num_stages=3),
                      budgets=dict(slab_kib=max(2**19, paired.budgets.slab_kib),
                                   pair_block_cols=0)),
        lambda c: smem_bytes(c, key.d, itemsize, arch=key.arch)[1], smem_limit(key.smem_kib))
  return Plan(config=cfg, paired=paired, fused=fused, ladder=ladder, user_tiles=user_tiles)


@dataclasses.dataclass(frozen=True)
class TritonBackend:
  """The Triton kernels behind the ``Backend`` Protocol (``backends.base``)."""

  interpret: bool = False

  @property
  def name(self) -> str:
    return "interpret" if self.interpret else "triton"

  def _smem_kib(self) -> int | None:
    """The GPU's shared memory a block (KiB) the configs are fitted to; None (the
    H100's) for the interpreter."""
    return None if self.interpret else _device_smem_kib()

  def _arch(self) -> int | None:
    """The GPU's compute capability major the configs are fitted to; None for the
    interpreter."""
    return None if self.interpret else _device_arch()

  def _tma(self) -> bool:
    """Whether the default tiles may count on TMA descriptors: on Hopper, where their
    tiles were measured (never under the interpreter, whose default tiles are its
    own; other GPUs that take descriptors keep pointer loads by default)."""
    return not self.interpret and _compat.tma_descriptors(False) and self._arch() == 9

  def _gluon(self) -> bool:
    """Whether the default tiles may count on the Gluon Hopper kernels."""
    return not self.interpret and _compat.gluon_kernels(False)

  def default_config(self, d: int, dtype) -> KernelConfig:
    """The config a block of feature size ``d`` gets with ``config=None``."""
    return default_config(d, dtype, interpret=self.interpret, smem_kib=self._smem_kib(),
                          tma=self._tma(), gluon=self._gluon(), arch=self._arch())

  def plan(self, spec, x) -> Plan:
    """The plan of ``spec``'s block on rows ``x`` (``resolve_plan``, cached)."""
    return resolve_plan(PlanKey(self.interpret, spec.config, spec.dims, x.shape[1],
                                jnp.dtype(x.dtype), self._smem_kib(), self._tma(),
                                self._gluon(), self._arch()))

  def _setup(self, spec, block: Block):
    """(config, prefix or None) of the block: the prefix is Matryoshka's
    ``(x_tab, y_tab, ladder)``."""
    p = self.plan(spec, block.x)
    return p.config, (None if p.ladder is None else (block.x_tab, block.y_tab, p.ladder))

  def fwd_floor(self, x, scale, spec):
    """None where the block's forward is exact only; else the floor (natural log units)
    above which ``fwd_stats(bounded=True)``'s statistics are exact (every one of them
    that is kept must reach it, or the caller reruns the exact forward)."""
    bounded = self.plan(spec, x).bounded and spec.reduction.name == _SOFTMAX
    return fwd_floor(scale) if bounded else None   # (a sigmoid's forward is exact)

  def fwd_stats(self, block: Block, scale, *, row_thr, spec, bounded=False):
    cfg, prefix = self._setup(spec, block)
    x, y = block.x, block.y
    if prefix is not None:
      x, y = prefix[2].pad(x), prefix[2].pad(y)
    return lse_fwd(x, y, scale, row_thr, block.offsets, _bias(spec, block),
                   two_sided=spec.two_sided,
                   exclude_self=spec.exclude_self, config=cfg, interpret=self.interpret,
                   prefix=prefix, masks=block.masks, bounded=bounded, want_max=spec.want_max)

  def bwd(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    cfg, prefix = self._setup(spec, block)
    x, y = block.x, block.y
    if prefix is not None:
      x, y = prefix[2].pad(x), prefix[2].pad(y)
    out = lse_bwd(x, y, scale, block.offsets, row, col, _bias(spec, block),
                  exclude_self=spec.exclude_self, want_cs=want_cs, out_dtype=out_dtype,
                  config=cfg, interpret=self.interpret, prefix=prefix, masks=block.masks)
    return ((out[0] if prefix is None else prefix[2].unpad(out[0])),) + tuple(out[1:])

  def pairs(self, x, y, spec) -> bool:
    """Whether ``bwd_pair`` serves this block (when both its towers need a gradient):
    ``Algorithm.bwd_pair``, or at most ``bwd_pair_max_batch`` columns."""
    return self.plan(spec, x).pairs(y.shape[0])

  def fuses(self, x, y, spec) -> bool:
    """Whether ``fwd_grad`` serves this block: a plain one-sided sigmoid block that
    ``bwd_pair`` would serve, or any such block of 16-bit inputs under the default
    config (whatever its batch: one coefficient pass instead of three, for slabs
    within the slab budget; docs/benchmarks.md, SigLIP)."""
    if not (spec.reduction.name == "sigmoid" and spec.dims is None and not spec.two_sided
            and not spec.symmetric):
      return False
    p = self.plan(spec, x)
    return p.pairs(y.shape[0]) or (not p.user_tiles and jnp.dtype(x.dtype).itemsize == 2)

  def fwd_grad(self, block: Block, scale, *, spec, want_cs):
    """``fwd_stats``'s row statistics and ``bwd_pair``'s gradients for unit row
    cotangents from one set of coefficient slabs (the tiled gradient kernel's FWD
    epilogue): ``(lse_row, max_row, dx, cs, dy, csum)``, fp32."""
    x, y = block.x, block.y
    n, f32 = x.shape[0], jnp.float32
    unit = Side(jnp.zeros((n,), f32), jnp.ones((n,), f32), None)
    dx, cs, dy, _, csum, lse_row, max_row = lse_bwd(
        x, y, scale, block.offsets, unit, None, _bias(spec, block),
        exclude_self=spec.exclude_self, want_cs=want_cs, out_dtype=f32,
        config=self.plan(spec, x).fused, interpret=self.interpret, masks=block.masks,
        pair=(False, f32), fwd=True)
    return lse_row, max_row, dx, cs, dy, csum

  def fuses_rows(self, x, y, spec, *, y_trains) -> bool:
    """Whether ``fwd_rows`` serves this block: a plain one-sided softmax block of
    bfloat16 inputs whose config asks for it (``Algorithm.fwd_row_grad``, on in the
    16-bit defaults), bounded: the gradient's own kernel is the pass (the
    FlashAttention-shaped one, ``grad_gluon``'s, or the tiled gradient's coefficient
    slabs). (Its coefficients, up to 2^BOUND_HEADROOM before the rows' sums divide them
    out, overflow float16 tiles, whose exact rerun would then always run: float16 keeps
    the gradient pass.) Where the columns train too (``y_trains``), blocks of at most
    ``bwd_pair_max_batch`` columns take the paired pass instead, and larger ones this
    even with ``Algorithm.bwd_pair`` on: above d_pad = 512 and at large batches the rows'
    forward and the columns' pass beat the paired slabs (one H100, jax-triton 0.4.1 +
    Triton 3.9, Qwen3 B = 65536: D = 1024 103.6 -> 82.2 ms and 0.99 -> 0.61 GiB, D = 768
    80.3 -> 66.7, ``h100_jt04_qwen3_unpaired.csv``; D = 512 39.2 with 4096-row slabs
    against 30.2, ``h100_jt04_fast_triton.csv``), while at d_pad = 512 blocks of up to
    16384 columns pair faster (3.23 against 3.35 ms, ``h100_stacks_pair_dims.csv``)."""
    if not (spec.reduction.name == _SOFTMAX and spec.dims is None and not spec.two_sided
            and not spec.symmetric and jnp.dtype(x.dtype) == jnp.bfloat16
            and y.dtype == x.dtype):
      return False
    p = self.plan(spec, x)
    if y_trains and y.shape[0] <= p.config.budgets.bwd_pair_max_batch:
      return False
    return p.config.algorithm.fwd_row_grad and p.bounded

  def fwd_rows(self, block: Block, scale, *, row_thr, spec, want_cs):
    """The bounded row statistics and the rows' unit-cotangent gradient from one pass
    (``backward.lse_fwd_rows``): ``(lse_row, max_row, dx, cs, l)``."""
    return lse_fwd_rows(block.x, block.y, scale, row_thr, block.offsets,
                        exclude_self=spec.exclude_self, want_cs=want_cs,
                        want_max=spec.want_max, config=self.plan(spec, block.x).config,
                        interpret=self.interpret, masks=block.masks)

  def bwd_pair(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    """``bwd`` for the rows of x and, from the same coefficient slabs, for the rows of
    y (the transposed block): ``(dx, cs_x, dy, cs_y)``; ``want_cs`` and ``out_dtype``
    are pairs (x, y); a biased block's also ``csum``, the rows' sums of c."""
    x, y = block.x, block.y
    p = self.plan(spec, x)
    prefix = None if p.ladder is None else (block.x_tab, block.y_tab, p.ladder)
    if prefix is not None:
      x, y = p.ladder.pad(x), p.ladder.pad(y)
    out = lse_bwd(
        x, y, scale, block.offsets, row, col, _bias(spec, block), exclude_self=spec.exclude_self,
        want_cs=want_cs[0], out_dtype=out_dtype[0], config=p.paired, interpret=self.interpret,
        prefix=prefix, masks=block.masks, pair=(want_cs[1], out_dtype[1]))
    if prefix is not None:
      out = (p.ladder.unpad(out[0]), out[1], p.ladder.unpad(out[2])) + tuple(out[3:])
    return out


def _bias(spec, block: Block):
  """The block's logit bias where its reduction is the sigmoid (its kernels' epilogue),
  None for the softmax; another reduction has no kernels."""
  if spec.reduction.name == _SOFTMAX:
    return None
  if spec.reduction.name != "sigmoid" or spec.two_sided:
    raise NotImplementedError(f"the Triton kernels compute the softmax and the one-sided "
                              f"sigmoid, not a {spec.reduction.name} block")
  return block.bias


_SOFTMAX = "lse"   # the reduction these kernels compute (``_reduction.SOFTMAX.name``)
