"""The reduction seam: what the block op (``_core``) and the ring (``ring.py``) know about
a family's per-row statistic, and the softmax as its first implementation
(docs/math.md §12).

A reduction turns row i's kept logits ``z_ij`` into one statistic ``r_i`` that merges
across column tiles and ring hops, and gives the coefficient of the gradient pass from
the loss's cotangent ``g_i`` of ``r_i``:

    c_ij = g_i * d r_i / d z_ij      (dx_i = scale * sum_j c_ij y_j, and so on: _core)

A two-sided block's column statistics are the same with i and j swapped. The maxima
(the in-batch accuracy's largest kept logit) belong to every reduction and merge with
``max``; they are not part of this interface.

    reduction      r_i                               empty   merge         c_ij
    SOFTMAX        log sum_j keep_ij exp(z_ij)        -inf   log_add_exp   g_i exp(z_ij - r_i)
    SIGMOID        sum_j keep_ij softplus(z_ij + b)      0   +             g_i sigmoid(z_ij + b)

A reduction is a frozen dataclass: it rides on the static ``BlockSpec`` (hashable), so
traced values are not part of it: the sigmoid's logit bias ``b`` (learnable) is an
input of the block op (``_core.block_stats(..., bias=)``) that the backends add to the
logits before ``tile`` and ``coefficient``; its gradient is ``sum_ij c_ij``. The maxima
(accuracy) stay on the unbiased logits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Protocol

import jax
import jax.numpy as jnp

from memeff_jax._terms import log_add_exp, masked_lse, softmax_terms


class Reduction(Protocol):
  """The per-row statistic of a block, its merge and its gradient coefficient."""

  name: str     # the op's profile scope: memeff/block_<name>
  empty: float  # the statistic of no kept entry: the merge's identity (ring accumulators)
  biased: bool  # whether the block op takes a logit bias (added before tile / coefficient)
  local: bool   # whether ``coefficient`` reads g and z only (not the statistic): the
                # gradient can then be formed in the forward pass (``_core``)

  def tile(self, z: jax.Array, keep: jax.Array, axis: int = -1) -> jax.Array:
    """The statistic of one tile: over the kept entries of ``z`` along ``axis``
    (``empty`` where none is kept)."""

  def merge(self, a: jax.Array, b: jax.Array) -> jax.Array:
    """The statistic of the union of two disjoint sets of entries (tiles, ring hops)."""

  def residual(self, stat: jax.Array | None) -> jax.Array | None:
    """The statistic as the gradient pass reads it (``_core.Side.lse``); None stays None."""

  def coefficient(self, z: jax.Array, stat: jax.Array, g: jax.Array) -> jax.Array:
    """``c = g * d stat / d z`` at a kept entry; ``stat`` is the ``residual``, and it and
    ``g`` come broadcast against ``z``. The caller zeroes the entries not kept."""

  def term(self, stat: jax.Array, pos_logit: jax.Array, *, n_neg, tau, scale, bias=None):
    """``(ell, lse)``: a row's loss term from its negatives' statistic and its positive's
    logit (``bias``: the logit bias, None for none), and the statistic the stats report
    (``_chain.run``)."""


@dataclasses.dataclass(frozen=True)
class Softmax:
  """The softmax's log-sum-exp (docs/math.md §3): exact online merges in the log
  domain; an empty softmax (-inf) gets an infinite residual, so its coefficients are
  exact zeros."""

  name: ClassVar[str] = "lse"
  empty: ClassVar[float] = -math.inf
  biased: ClassVar[bool] = False
  local: ClassVar[bool] = False

  def tile(self, z, keep, axis=-1):
    return masked_lse(z, keep, axis=axis)

  def merge(self, a, b):
    return log_add_exp(a, b)

  def residual(self, stat):
    # exp(z - lse) with lse = -inf must be 0: only masked entries can meet it.
    return None if stat is None else jnp.where(stat == -jnp.inf, jnp.inf, stat)

  def coefficient(self, z, stat, g):
    return g * jnp.exp(z - stat)

  def term(self, stat, pos_logit, *, n_neg, tau, scale, bias=None):
    assert bias is None, "a softmax is shift-invariant: it takes no logit bias"
    return softmax_terms(stat, pos_logit, n_neg=n_neg, tau=tau, scale=scale)


@dataclasses.dataclass(frozen=True)
class Sigmoid:
  """Pairwise sigmoids (SigLIP, docs/math.md §13): a row's statistic is its negatives'
  loss ``sum_j softplus(z_ij + b)`` (= ``-sum_j log sigmoid(-(z_ij + b))``), a plain sum:
  tiles and ring hops add, an empty row is 0, and no statistic enters its gradient."""

  name: ClassVar[str] = "sigmoid"
  empty: ClassVar[float] = 0.0
  biased: ClassVar[bool] = True
  local: ClassVar[bool] = True

  def tile(self, z, keep, axis=-1):
    return jnp.sum(jnp.where(keep, jax.nn.softplus(jnp.where(keep, z, 0.0)), 0.0), axis=axis)

  def merge(self, a, b):
    return a + b

  def residual(self, stat):
    return stat

  def coefficient(self, z, stat, g):
    del stat
    return g * jax.nn.sigmoid(z)

  def term(self, stat, pos_logit, *, n_neg, tau, scale, bias=None):
    del n_neg, scale
    assert tau is None, "the sigmoid loss has no debiasing"
    z = pos_logit if bias is None else pos_logit + bias
    return stat + jax.nn.softplus(-z), stat


SOFTMAX = Softmax()
SIGMOID = Sigmoid()
