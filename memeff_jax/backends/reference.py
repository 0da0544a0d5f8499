"""The dense reference as a backend: ``backend="reference"``.

A whole loss, not a block, is its unit: ``dense_loss`` runs the family's dense
``*_with_stats`` oracle (``memeff_jax.reference``: materialized logits, plain
``jax.nn.logsumexp``; docs/math.md §4-§8) on the validated call, so the chain runs
none of its blockwise glue and the oracle has forward-mode derivatives. Its block
methods, for callers of ``_core.block_lse``, materialize the block's logits too: the
blockwise backend's scan with one tile of every column.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from memeff_jax import reference
from memeff_jax.backends.base import Block
from memeff_jax.backends.blockwise import BlockwiseBackend

# One tile of every column: the block's logits materialized at once.
_DENSE = BlockwiseBackend(tile=2**31 - 1)


@dataclasses.dataclass(frozen=True)
class ReferenceBackend:
  """Dense, O(B^2) memory, any platform and dtype; single-device (no ring)."""

  name: str = "reference"

  def default_config(self, d: int, dtype):
    return _DENSE.default_config(d, dtype)

  def fwd_floor(self, x, scale, spec):   # pylint: disable=unused-argument
    return None

  def pairs(self, x, y, spec) -> bool:   # pylint: disable=unused-argument
    return False

  def fwd_stats(self, block: Block, scale, *, row_thr, spec, bounded=False):
    return _DENSE.fwd_stats(block, scale, row_thr=row_thr, spec=spec, bounded=bounded)

  def bwd(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    return _DENSE.bwd(block, scale, row=row, col=col, spec=spec, want_cs=want_cs,
                      out_dtype=out_dtype)

  def bwd_pair(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype):
    raise NotImplementedError("backend='reference' has no paired gradient (pairs is False)")

  def fuses(self, x, y, spec) -> bool:   # pylint: disable=unused-argument
    return False

  def fwd_grad(self, block: Block, scale, *, spec, want_cs):
    raise NotImplementedError("backend='reference' has no fused gradient (fuses is False)")

  def fuses_rows(self, x, y, spec, *, y_trains) -> bool:   # pylint: disable=unused-argument
    return False

  def fwd_rows(self, block: Block, scale, *, row_thr, spec, want_cs):
    raise NotImplementedError("backend='reference' forms no gradient in its forward "
                              "(fuses_rows is False)")

  def dense_loss(self, oracle: Callable, arrays, *, dims, weights, axis_name, **options):
    """``(loss, stats)`` of the family's dense ``*_with_stats`` ``oracle`` on the
    validated ``arrays``: ``options`` are its keywords (``normalized_inputs``,
    ``temperature``, ``where``, ...); with Matryoshka ``dims``, the fused reference
    over the prefixes, weighted by ``weights``."""
    if axis_name is not None:
      raise ValueError("backend='reference' is single-device: it has no axis_name ring")
    normalized_inputs = options.pop("normalized_inputs")
    shared = {k: options.pop(k) for k in ("shared_negatives",) if k in options}
    ref = functools.partial(oracle, **options)
    if dims is None:
      return ref(*arrays, normalized_inputs=normalized_inputs, **shared)
    return reference.matryoshka_fused_with_stats(
        ref, *arrays, dims=dims, weights=weights, normalized_inputs=normalized_inputs, **shared)
