"""A Triton kernel returning ``_common.self_tiles`` for a batch of walks, and the tiles
``drop_pairs`` would test, found in Python, to check it against."""

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from memeff_jax.backends.triton._common import self_tiles
from memeff_jax.backends.triton.call import call


@triton.jit
def self_tiles_kernel(case_ptr, d0_ptr, d1_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """Walk i (case_ptr [i, 5]: row0, j_lo, j_hi, row_off, col_off): its [d0, d1), as fp32
  (exact here; the interpreter's outputs are floats)."""
  at = case_ptr + tl.program_id(0) * 5
  d0, d1 = self_tiles(tl.load(at), tl.load(at + 1), tl.load(at + 2), tl.load(at + 3),
                      tl.load(at + 4), BLOCK_M, BLOCK_N)
  tl.store(d0_ptr + tl.program_id(0), d0.to(tl.float32))
  tl.store(d1_ptr + tl.program_id(0), d1.to(tl.float32))


def self_tiles_on(cases: np.ndarray, block_m: int, block_n: int, interpret: bool):
  """``self_tiles`` of each walk of ``cases`` (int [k, 5], as the kernel reads them)."""
  shape = jnp.zeros((len(cases),), jnp.float32)
  d0, d1 = call(self_tiles_kernel, jnp.asarray(cases, jnp.int32), out_shapes=[shape] * 2,
                grid=(len(cases),), num_warps=1, num_stages=1, name="test/self_tiles",
                interpret=interpret, BLOCK_M=block_m, BLOCK_N=block_n)
  return np.asarray(d0).astype(int), np.asarray(d1).astype(int)


def tested_tiles(row0, j_lo, j_hi, row_off, col_off, block_m, block_n) -> list[int]:
  """The first columns of the walk's tiles holding a pair with global row index ==
  global column index, one pair at a time (not ``on_diagonal``'s formula)."""
  rows = range(row0 + row_off, row0 + row_off + block_m)
  return [j0 for j0 in range(j_lo, j_hi, block_n)
          if any(c in rows for c in range(j0 + col_off, j0 + col_off + block_n))]
