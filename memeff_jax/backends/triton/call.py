"""One kernel launch from arrays (``jax_triton.triton_call``, or the interpreter), and
the shapes around it: feature chunks, column splits, row slabs, ``where`` biases and
the Matryoshka tables' arguments. The only module that calls ``triton_call``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from memeff_jax import _compat
from memeff_jax.backends.triton.interpreter import interpret_call
from memeff_jax.config import KernelConfig

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def chunks(d: int, block: int) -> tuple[int, int]:
  """(chunk width, number of chunks) covering d features (power-of-two width >= 16)."""
  d_pad = max(16, 1 << (d - 1).bit_length())
  width = min(block, d_pad)
  return width, cdiv(d, width)


def splits(m: int, block_n: int, programs: int, cfg: KernelConfig) -> tuple[int, int]:
  """Split the column sweep so at least ``cfg.budgets.min_programs`` programs run.

  Returns (splits, columns per split); a split is a whole number of column tiles.
  """
  col_tiles = cdiv(m, block_n)
  num = max(1, min(col_tiles, cdiv(cfg.budgets.min_programs, programs)))
  per_split = cdiv(col_tiles, num) * block_n
  return cdiv(m, per_split), per_split


def call(kernel, *args, out_shapes, grid, num_warps, num_stages, name, interpret,
         **constexprs):
  """``kernel``'s outputs for positional ``args`` (arrays and ints) and keyword
  constexprs; ``interpret``: under Triton's interpreter, on the host."""
  if interpret:
    outs = interpret_call(kernel, args, out_shapes, grid, constexprs)
  else:
    outs = _compat.triton_call(*args, kernel=kernel, out_shapes=out_shapes, grid=grid,
                               name=name, num_warps=num_warps, num_stages=num_stages,
                               **constexprs)
  # Inside shard_map the launch's outputs vary over the axes its inputs vary over.
  return _compat.vary_like(tuple(_compat.on_context_mesh(outs)), _compat.arrays(args))


def offsets(offs, *more) -> jax.Array:
  return jnp.stack([jnp.asarray(o, jnp.int32) for o in (*offs, *more)])


def slab_rows(n: int, block_m: int, row_bytes: int, config: KernelConfig,
              min_rows: int = 1) -> int:
  """Rows per slab of the tiled passes: a multiple of block_m whose per-slab buffers
  (row_bytes per row) fit config.budgets.slab_kib, at least min_rows, at most the (padded)
  batch; then evened out over the slabs that takes (n = 4100 in 2048-row slabs would
  run a third slab of 4 rows padded to 2048; three slabs of 1408 rows pad 124)."""
  budget = config.budgets.slab_kib * 2**10 // max(row_bytes, 1) // block_m * block_m
  rows = min(max(budget, cdiv(min_rows, block_m) * block_m, block_m), n)
  return cdiv(cdiv(n, cdiv(n, rows)), block_m) * block_m


def slab_loop(n: int, rows: int, body, init):
  """``body(r0, carry)`` over the slabs starting at rows 0, rows, 2 rows, ... < n. r0 has
  JAX's default int dtype (int64 under jax_enable_x64), as the fori_loop index and the
  Python ints it meets in the bodies' update indices do."""
  slabs = cdiv(n, rows)
  if slabs == 1:
    return body(jnp.asarray(0), init)
  return jax.lax.fori_loop(0, slabs, lambda k, c: body(k * rows, c), init)


def dot_precision(config: KernelConfig, dtype):
  if jnp.dtype(dtype).itemsize < 4 or config.algorithm.precision == "tf32":
    return jax.lax.Precision.DEFAULT
  return jax.lax.Precision.HIGHEST


def bias_args(masks, rows, cols):
  """The kernels' ``where`` arguments: (x bias, y bias, HAS_MASK), fp32 0 kept, -inf
  removed, padded (removed) to ``rows`` / ``cols`` entries: every index a program
  reads, so the kernels load them without bounds checks."""
  if masks is None:
    dummy = jnp.zeros((1,), jnp.float32)
    return dummy, dummy, False
  bias = lambda keep, size: jnp.pad(jnp.where(keep, 0.0, -jnp.inf).astype(jnp.float32),
                                    (0, size - keep.shape[0]), constant_values=-jnp.inf)
  return bias(masks[0], rows), bias(masks[1], cols), True


def prefix_args(prefix, num_k):
  """Kernel arguments of the Matryoshka tables: (K, SEGS, HAS_TAB, x_tab, y_tab)."""
  if prefix is None:
    dummy = jnp.zeros((1,), jnp.float32)
    return 1, num_k, False, dummy, dummy
  x_tab, y_tab, ladder = prefix
  return len(ladder.ends), ladder.segs, True, x_tab.astype(jnp.float32), y_tab.astype(
      jnp.float32)
