"""``KernelConfig``: the kernels' tiles per pass, the algorithm switches, the memory
budgets, and the blockwise backend's tile, each a small frozen dataclass.

The flat spellings of earlier releases (``KernelConfig(fwd_block_m=128,
matryoshka_per_dim=True, blockwise_tile=256)``, and ``dataclasses.replace`` with
them) still construct the same config, with a DeprecationWarning; reading a flat name
(``cfg.fwd_block_m``) gives the grouped field's value. ``matryoshka_per_dim`` is a
loss keyword now; the config's field is deprecated (``config.matryoshka.per_dim_choice``).
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from typing import Any, Literal

Precision = Literal["tf32", "tf32x3", "ieee"]


def is_int(value) -> bool:
  """An int as the API's sizes and counts take one: a Python or NumPy integer, not a
  bool (the argument checks of the fitting functions, ``default_config``'s d,
  ``matryoshka_dims``, ``grad_cache``'s chunk_size and the config groups' fields)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class _Group:
  """Validation shared by the groups: ``_FLAT`` is the prefix of the fields' flat
  (pre-group) names, which the error messages also give."""

  _FLAT = ""
  _POW2: tuple[str, ...] = ()     # tile fields: powers of two >= 16 (tl.dot)
  _BOOLS: tuple[str, ...] = ()
  _OPTIONAL: tuple[str, ...] = ()  # may be None
  _ZERO_OK: tuple[str, ...] = ()   # ints >= 0 (others >= 1)
  _NESTED: dict = {}               # fields holding a group of their own: its class

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v, name = getattr(self, f.name), self._name(f.name)
      if f.name == "precision":
        if v not in ("tf32", "tf32x3", "ieee"):
          raise ValueError(f"precision={v!r}; expected 'tf32', 'tf32x3' or 'ieee'")
      elif f.name in self._OPTIONAL and v is None:
        continue
      elif f.name in self._NESTED:
        if not isinstance(v, self._NESTED[f.name]):
          raise TypeError(f"{name} must be a {self._NESTED[f.name].__name__}, got {v!r}")
      elif f.name in self._BOOLS:
        if not isinstance(v, bool):
          raise TypeError(f"{name} must be a bool, got {v!r}")
      elif not is_int(v):
        raise TypeError(f"{name} must be an int, got {v!r}")
      else:
        object.__setattr__(self, f.name, v := int(v))   # a NumPy integer as a Python int
        if v < 0 and f.name in self._ZERO_OK:
          raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if v < 1 and f.name not in self._ZERO_OK:
          raise ValueError(f"{name} must be a positive int, got {v!r}")
    for field in self._POW2:
      v = getattr(self, field)
      if v is not None and (v < 16 or v & (v - 1)):
        raise ValueError(f"{self._name(field)} must be a power of two >= 16 (tl.dot), got {v}")

  def _name(self, field: str) -> str:
    return f"{type(self).__name__}.{field} (KernelConfig.{self._FLAT}{field})"


@dataclasses.dataclass(frozen=True)
class FwdTiles(_Group):
  """The statistics (forward) kernel's tiles and launch settings.

  Attributes:
    block_m, block_n: row / column tile.
    block_d: feature chunk of the similarity dot; ``>= d`` keeps the row tile resident
      for the whole column sweep, smaller values walk the features in chunks.
    num_warps, num_stages: launch settings.
    one_sided_warps: warps of the tiled forward on blocks that need only row
      statistics (LiT, Qwen3); None: ``num_warps``.
    gluon: the bounded forward runs as a warp-specialized Gluon kernel (a TMA
      producer warp and two wgmma consumer warp groups, its own 128-row programs and
      128-column tiles) where it can: 16-bit inputs, d <= 512, no Matryoshka tables, no
      sigmoid, compute capability 9.x, jax-triton >= 0.4 with Triton >= 3.9; elsewhere
      (and the exact forward) as the fields above say.
  """

  _FLAT = "fwd_"
  _POW2 = ("block_m", "block_n", "block_d")
  _BOOLS = ("gluon",)
  _OPTIONAL = ("one_sided_warps",)

  block_m: int = 64
  block_n: int = 64
  block_d: int = 64
  num_warps: int = 4
  num_stages: int = 2
  one_sided_warps: int | None = None
  gluon: bool = False


@dataclasses.dataclass(frozen=True)
class RoleTiles(_Group):
  """``BwdTiles`` fields for the gradient passes of one softmax role (``BwdTiles.row_role``,
  ``BwdTiles.col_role``); None keeps ``BwdTiles``'s own.

  Attributes:
    tma, block_n, num_stages, gluon: as ``BwdTiles``'s.
  """

  _POW2 = ("block_n",)
  _BOOLS = ("tma", "gluon")
  _OPTIONAL = ("tma", "block_n", "num_stages", "gluon")

  tma: bool | None = None
  block_n: int | None = None
  num_stages: int | None = None
  gluon: bool | None = None

  def _name(self, field: str) -> str:
    return f"RoleTiles.{field}"


# The FlashAttention-shaped gradient's passes of one softmax role, (rows' softmax,
# columns'), and the ``BwdTiles`` field holding their ``RoleTiles``.
ROLES = {(True, False): "row_role", (False, True): "col_role"}


@dataclasses.dataclass(frozen=True)
class BwdTiles(_Group):
  """The gradient kernel's tiles and launch settings.

  Attributes:
    block_m, block_n: row / column tile.
    block_d: feature chunk of the similarity dot (as ``FwdTiles.block_d``).
    block_do: feature width of one FlashAttention-shaped program's fp32 accumulator;
      below ``d`` the grid gains a feature axis and each program recomputes its
      similarities (no atomics). Matryoshka's gradient ignores it.
    num_warps, num_stages: launch settings.
    tma: the FlashAttention-shaped gradient loads its tiles through TMA tensor
      descriptors where it can (a power-of-two feature size in one chunk, no
      Matryoshka tables, compute capability >= 9.0 and jax-triton >= 0.4; elsewhere
      pointer loads, as with False).
    row_role, col_role: ``RoleTiles`` of the FlashAttention-shaped gradient's passes
      of the rows' softmax alone (LiT's; Qwen3's queries) and of the columns' alone
      (Qwen3's documents); passes of both (CLIP's) take the fields above.
    gluon: the FlashAttention-shaped gradient runs as a warp-specialized Gluon kernel
      (a TMA producer warp and two wgmma consumer warp groups, its own 64 x 128 tiles)
      where it can: d = 512, 16-bit inputs, no Matryoshka tables, no sigmoid, compute
      capability 9.x, jax-triton >= 0.4 with Triton >= 3.9; elsewhere as the fields
      above say.
  """

  _FLAT = "bwd_"
  _POW2 = ("block_m", "block_n", "block_d", "block_do")
  _BOOLS = ("tma", "gluon")
  _NESTED = {"row_role": RoleTiles, "col_role": RoleTiles}

  block_m: int = 64
  block_n: int = 64
  block_d: int = 64
  block_do: int = 64
  num_warps: int = 4
  num_stages: int = 2
  tma: bool = False
  row_role: RoleTiles = RoleTiles()
  col_role: RoleTiles = RoleTiles()
  gluon: bool = False

  def for_pass(self, has_row: bool, has_col: bool) -> BwdTiles:
    """The tiles of a pass with the rows' softmax (``has_row``), the columns'
    (``has_col``) or both: a one-role pass's ``RoleTiles`` fields in place of these,
    where set (the result has no role tiles left)."""
    name = ROLES.get((has_row, has_col))   # (None: both roles)
    role = RoleTiles() if name is None else getattr(self, name)
    own = lambda v, base: base if v is None else v
    return dataclasses.replace(
        self, tma=own(role.tma, self.tma), block_n=own(role.block_n, self.block_n),
        num_stages=own(role.num_stages, self.num_stages), gluon=own(role.gluon, self.gluon),
        row_role=RoleTiles(), col_role=RoleTiles())


@dataclasses.dataclass(frozen=True)
class Algorithm(_Group):
  """Which kernels run, and how (docs/benchmarks.md explains each choice).

  Attributes:
    fwd_col_pass: two-sided blocks (CLIP) get their column statistics from a second
      row pass over the swapped block instead of per-program column partials (or,
      with ``fwd_tiled``, each tile's column sums: twice the GEMM work, no reduction
      across a tile's rows).
    fwd_tiled: the forward as slabs of plain GEMM tiles, each with a row and a column
      partial log-sum-exp: both sides in one sweep.
    fwd_bounded: the tiled forward sums 2^(z - shift) against one shift per block (unit
      rows bound every logit) instead of each row's and column's maximum; a statistic
      below the bound's exact range reruns the exact forward (docs/math.md §3). Its
      rounding is coarser (~2^-17 a term), so ``default_config`` turns it on for
      16-bit inputs only.
    bwd_tiled: the gradient as slabs of coefficient tiles multiplied in by an XLA dot;
      otherwise the FlashAttention-shaped pass with the accumulator in registers.
    bwd_pair: a block whose two towers both need a gradient takes the tiled gradient
      and multiplies each coefficient slab into both (``c @ y`` and ``c^T @ x``); a
      one-sided block whose rows' gradient its forward forms (``fwd_row_grad``, one
      device) does so only within ``Budgets.bwd_pair_max_batch`` (the rows' forward and
      a columns' pass are faster elsewhere): turn ``fwd_row_grad`` off to pair it.
    matryoshka_per_dim: deprecated, the losses' ``matryoshka_per_dim=`` keyword
      replaces it: a Matryoshka loss runs one plain block per dim on that dim's
      renormalized prefixes (copies), instead of one block whose feature walk serves
      every dim through prefix tables. Same math (docs/math.md §8). A value other than
      the backend's default still decides where the keyword is None, with a
      DeprecationWarning at the loss's call; ``default_config`` holds the default.
    fwd_row_grad: a one-sided block whose rows train (LiT's, Qwen3's queries), on one
      device, gets their gradient for a unit cotangent on every row from the forward's
      own tiles (the rows' gradient kernel with the bounded shift in place of the
      log-sum-exps: one similarity pass fewer); it is saved, O(n d), and the backward
      scales it by the rows' cotangents (docs/math.md §3). Where the backend has that
      kernel (the Triton backend: its FlashAttention-shaped gradient, ``grad_gluon``'s
      or ``grad_bwd``'s, or the tiled gradient's coefficient slabs with ``bwd_tiled``,
      for bfloat16 with the bounded forward); otherwise ignored. ``default_config``
      turns it on for 16-bit inputs (timed at d_pad 64-1024). The saved gradient is
      float16 by row scales (``backends.base.scale_rows``): rounded to 16 bits once, in
      the backward, as by the gradient pass.
    precision: ``tl.dot`` input precision for fp32 inputs ("tf32", "tf32x3" or
      "ieee"); 16-bit inputs ignore it.
  """

  _BOOLS = ("fwd_col_pass", "fwd_tiled", "fwd_bounded", "bwd_tiled", "bwd_pair",
            "matryoshka_per_dim", "fwd_row_grad")

  fwd_col_pass: bool = False
  fwd_tiled: bool = False
  fwd_bounded: bool = True
  bwd_tiled: bool = False
  bwd_pair: bool = False
  matryoshka_per_dim: bool = False
  fwd_row_grad: bool = False
  precision: Precision = "tf32"


@dataclasses.dataclass(frozen=True)
class Budgets(_Group):
  """Memory and parallelism budgets.

  Attributes:
    max_programs: cap on forward programs when column statistics are needed (each keeps
      one fp32 partial per column: an O(programs * m) buffer).
    min_programs: below this many row tiles the column sweep is split across programs
      (partials reduced in JAX) so small batches still fill the GPU.
    slab_kib: memory budget of one slab's buffers (KiB) for the tiled passes.
    min_slab_rows: the tiled gradient's slabs keep at least this many rows (a thinner
      slab starves its XLA dot).
    bwd_pair_max_batch: blocks of at most this many columns take ``bwd_pair`` even
      where it is off; 0: none.
    pair_block_cols: the paired tiled gradient's coefficient slabs span this many
      columns at a time (rounded down to whole column tiles), each slab of rows
      walking the columns block by block, so that the columns' fp32 gradient is read
      and written once a slab of rows and block, not once a thinner slab across every
      column; 0: every column at once.
  """

  _ZERO_OK = ("bwd_pair_max_batch", "pair_block_cols")

  max_programs: int = 264
  min_programs: int = 264
  slab_kib: int = 65536
  min_slab_rows: int = 512
  bwd_pair_max_batch: int = 0
  pair_block_cols: int = 0


@dataclasses.dataclass(frozen=True)
class BlockwiseOptions(_Group):
  """The pure-JAX blockwise backend's options. tile: its column tile."""

  _FLAT = "blockwise_"

  tile: int = 512


_GROUPS = {"fwd": FwdTiles, "bwd": BwdTiles, "algorithm": Algorithm, "budgets": Budgets,
           "blockwise": BlockwiseOptions}
# flat (pre-group) name -> (group, field)
FLAT = {f"{cls._FLAT}{f.name}": (group, f.name)
        for group, cls in _GROUPS.items() for f in dataclasses.fields(cls)}


def grouped(flat: dict[str, Any]) -> dict[str, dict]:
  """Values by flat name as ``KernelConfig.evolve``'s groups: {group: {field: value}}."""
  changes: dict[str, dict] = {}
  for k, v in flat.items():
    group, field = FLAT[k]
    changes.setdefault(group, {})[field] = v
  return changes


@dataclasses.dataclass(frozen=True, init=False)
class KernelConfig:
  """Tile sizes and launch settings of the Triton kernels and the blockwise backend.

  Attributes:
    fwd: the forward kernel's tiles (``FwdTiles``).
    bwd: the gradient kernel's tiles (``BwdTiles``).
    algorithm: which kernels run (``Algorithm``): tiled / bounded / paired passes,
      fp32 dot precision (and the deprecated Matryoshka per dim).
    budgets: memory and parallelism budgets (``Budgets``).
    blockwise: the blockwise backend's options (``BlockwiseOptions``).

  ``KernelConfig(fwd=FwdTiles(block_m=128), algorithm=Algorithm(bwd_pair=True))``;
  ``cfg.evolve(fwd=dict(block_m=128))`` changes some fields of some groups. The flat
  names of earlier releases (``fwd_block_m``, ``matryoshka_per_dim``,
  ``blockwise_tile``, ...) still read, and still construct with a DeprecationWarning.
  ``algorithm.matryoshka_per_dim`` is deprecated for the losses' keyword.
  """

  fwd: FwdTiles
  bwd: BwdTiles
  algorithm: Algorithm
  budgets: Budgets
  blockwise: BlockwiseOptions

  def __init__(self, fwd: FwdTiles | None = None, bwd: BwdTiles | None = None,
               algorithm: Algorithm | None = None, budgets: Budgets | None = None,
               blockwise: BlockwiseOptions | None = None, **flat: Any):
    groups = dict(fwd=fwd, bwd=bwd, algorithm=algorithm, budgets=budgets,
                  blockwise=blockwise)
    for name, v in groups.items():
      if v is not None and not isinstance(v, _GROUPS[name]):
        raise TypeError(f"KernelConfig {name}= must be a {_GROUPS[name].__name__}, got "
                        f"{type(v).__name__}")
    unknown = sorted(set(flat) - set(FLAT))
    if unknown:
      raise TypeError(f"KernelConfig got unexpected keyword argument(s) {unknown}")
    if flat:
      # matryoshka_per_dim is a loss keyword now (its group field is deprecated too).
      keyword = ("; matryoshka_per_dim: pass it to the loss (matryoshka_per_dim=...)"
                 if "matryoshka_per_dim" in flat else "")
      warnings.warn(
          f"KernelConfig({', '.join(f'{k}=...' for k in flat)}): the flat spellings are "
          f"deprecated and go in a future release; use the groups ("
          f"{', '.join(sorted({f'{FLAT[k][0]}.{FLAT[k][1]}' for k in flat}))}){keyword}",
          DeprecationWarning, stacklevel=_caller_level())
    changes = grouped(flat)
    for name, cls in _GROUPS.items():
      base = groups[name] if groups[name] is not None else cls()
      object.__setattr__(self, name, dataclasses.replace(base, **changes.get(name, {})))

  def evolve(self, **groups: dict) -> "KernelConfig":
    """A copy with some fields of some groups changed:
    ``cfg.evolve(fwd=dict(block_m=128), algorithm=dict(fwd_tiled=True))``; a group
    may also be replaced whole (``fwd=FwdTiles(...)``). An unknown group or field (the
    flat names too: ``KernelConfig(...)`` takes those) raises TypeError."""
    unknown = sorted(set(groups) - set(_GROUPS))
    if unknown:
      raise TypeError(f"KernelConfig.evolve got unexpected group(s) {unknown}; the groups "
                      f"are {list(_GROUPS)}")
    new = {}
    for name, cls in _GROUPS.items():
      v = groups.get(name, {})
      if isinstance(v, cls):
        new[name] = v
      elif isinstance(v, dict):
        new[name] = dataclasses.replace(getattr(self, name), **v)
      else:
        raise TypeError(f"KernelConfig.evolve {name}= must be a dict of {cls.__name__}'s "
                        f"fields or a {cls.__name__}, got {type(v).__name__}")
    return KernelConfig(**new)

  def __getattr__(self, name: str):
    # The flat names of earlier releases, read from their group.
    if name in FLAT:
      group, field = FLAT[name]
      return getattr(object.__getattribute__(self, group), field)
    raise AttributeError(f"'KernelConfig' object has no attribute {name!r}")


def _caller_level() -> int:
  """The warning's stacklevel: the first frame outside this module and dataclasses."""
  import sys  # pylint: disable=g-import-not-at-top
  frame, level = sys._getframe(1), 1
  while frame is not None and frame.f_code.co_filename in (__file__, dataclasses.__file__):
    frame, level = frame.f_back, level + 1
  return level
