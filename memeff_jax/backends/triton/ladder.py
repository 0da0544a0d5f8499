"""The Matryoshka ladder: prefix dims as the kernels walk them (docs/math.md §8)."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax.numpy as jnp

from memeff_jax.backends.triton.call import cdiv
from memeff_jax.config import ladder_chunk


class Ladder(NamedTuple):
  """Matryoshka dims as the kernels walk them: feature segments [m_{k-1}, m_k), each
  padded with zero features to a multiple of ``chunk`` (a no-op for aligned ladders
  such as (64, 128, 256, 512)), so every dim ends on a chunk boundary."""

  dims: tuple[int, ...]     # the user's dims
  ends: tuple[int, ...]     # their ends in the padded layout
  chunk: int                # the kernels' feature chunk

  @classmethod
  def of(cls, dims, block: int) -> "Ladder":
    chunk = ladder_chunk(dims, block)
    ends = tuple(itertools.accumulate(cdiv(hi - lo, chunk) * chunk
                                      for lo, hi in zip((0,) + dims[:-1], dims)))
    return cls(tuple(dims), ends, chunk)

  @property
  def segs(self) -> int:
    """The kernels' SEGS: dim k ends after chunk ``(SEGS >> 16 k) & 0xFFFF``."""
    assert self.ends[-1] // self.chunk < 2**16
    return sum((e // self.chunk) << (16 * k) for k, e in enumerate(self.ends))

  def _pairs(self):
    return zip((0,) + self.dims[:-1], self.dims, (0,) + self.ends[:-1])

  def pad(self, v):
    if self.ends == self.dims:
      return v
    segs = [v[:, lo:hi] for lo, hi, _ in self._pairs()]
    widths = [e - p for e, (_, _, p) in zip(self.ends, self._pairs())]
    return jnp.concatenate([jnp.pad(sg, ((0, 0), (0, w - sg.shape[1])))
                            for sg, w in zip(segs, widths)], axis=1)

  def unpad(self, g):
    if self.ends == self.dims:
      return g
    return jnp.concatenate([g[:, p:p + hi - lo] for lo, hi, p in self._pairs()], axis=1)
