"""Qwen3-Embedding InfoNCE and LiT-Qwen3: a q->d row softmax with the false-negative
mask, optional q-q / d-d in-batch negatives and row-specific hard negatives
(docs/math.md §6)."""

from __future__ import annotations

import functools
from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from memeff_jax import _chain, _docs, reference
from memeff_jax._terms import MARGIN_TIE, ContrastiveStats, masked_lse, ring_size
from memeff_jax._validation import Backend
from memeff_jax.config import KernelConfig


def _head(ctx: _chain.Ctx, towers, *, margin, use_qq_negatives: bool,
          use_dd_negatives: bool = False, use_dq_negatives: bool = False,
          partition: str = "joint", share_hard_negatives: bool = False,
          shared: _chain.Tower | None = None) -> _chain.Head:
  q, d, h = towers
  spread = spread_cols = None
  if h is not None and share_hard_negatives:   # the hard negatives as columns of every row
    h, spread = None, h
    spread_cols = _chain.flat(spread)
  pos = ctx.sims(q, d)                                          # [K, n] s(q_i, d_i)
  # Row i keeps an entry iff s <= pos_i + margin + MARGIN_TIE (raw cosine, non-strict;
  # the tie tolerance keeps exact duplicates of the positive whichever way they round),
  # with row i's threshold on every group; the mask carries no gradient. margin >= 0
  # always keeps the positive, which joins in the log domain.
  thr = lax.stop_gradient(pos + margin + MARGIN_TIE)
  row = lambda a, b, **kw: ctx.block(a, b, thr, **kw)[::2]      # (lse, max) of row i
  # (lse, max) of each group's kept negatives: q-d (j != i), the shared columns, q-q
  # and d-d (j != i, one symmetric block each, both roles in its gradient; d-d with
  # query i's threshold, and d_i against the shared columns).
  parts = [row(q, d, exclude_self=True)]
  if shared is not None:
    parts.append(row(q, shared))
  if spread is not None:   # every row's (one block), and d_i's but its own (one block each)
    parts.append(row(q, spread_cols))
  if use_qq_negatives:
    parts.append(row(q, None, exclude_self=True, symmetric=True))
  if use_dd_negatives:
    parts.append(row(d, None, exclude_self=True, symmetric=True))
    if shared is not None:
      parts.append(row(d, shared))
    if spread is not None:
      parts += [row(d, _chain.pick(spread, j), exclude_self=True)
                for j in range(spread.v.shape[1])]
  joint = partition == "joint"
  # d-q: d_i against every query. Its own pair is the positive's logit again: in the
  # joint softmax a second copy (added as a part, never the in-batch accuracy's rival),
  # in its own softmax the positive.
  dq = row(d, q, exclude_self=True) if use_dq_negatives else None
  if dq is not None and joint:
    parts += [dq, (ctx.scale * pos, None if dq[1] is None else jnp.full_like(pos, -jnp.inf))]
  k = 0
  if h is not None:      # row-specific hard negatives: O(n k d) plain JAX
    k = h.v.shape[1]
    s_h = ctx.sims(q, h, "id,ikd->ik")                          # [K, n, k]
    keep = s_h <= thr[..., None]
    z_h = ctx.scale * s_h
    parts.append((masked_lse(z_h, keep), jnp.max(jnp.where(keep, z_h, -jnp.inf), axis=-1)))
  lses, maxes = zip(*parts)
  lse_neg = lses[0] if len(parts) == 1 else masked_lse(jnp.stack(lses), True, axis=0)
  loss_only = any(mx is None for mx in maxes)   # a loss function: no maxima
  max_neg = None if loss_only else functools.reduce(jnp.maximum, maxes)
  n_shared = 0 if shared is None else shared.v.shape[0] * ring_size(ctx.axis_name)

  def cross():   # A = <S_q, S_d> + qq (|S_q|^2 - sum |q|^2) + dd (...) + sum s_h + shared
    sum_q, sum_d = ctx.tower_sum(q), ctx.tower_sum(d)
    a_qd = jnp.sum(sum_q * sum_d, axis=-1)
    a = a_qd
    for cols in (shared, spread_cols):
      if cols is not None:
        sum_c = ctx.tower_sum(cols)
        a += jnp.sum(sum_q * sum_c, axis=-1)
        if use_dd_negatives:
          a += jnp.sum(sum_d * sum_c, axis=-1)
    if spread is not None and use_dd_negatives:   # less d_i's own
      a -= ctx.gsum(jnp.sum(ctx.sims(d, spread, "id,ikd->ik"), axis=(-2, -1)))
    if use_qq_negatives:
      a += jnp.sum(sum_q * sum_q, axis=-1) - ctx.self_sum(q)
    if use_dd_negatives:
      a += jnp.sum(sum_d * sum_d, axis=-1) - ctx.self_sum(d)
    if h is not None:
      a += ctx.gsum(jnp.sum(s_h, axis=(-2, -1)))
    if dq is None:
      return a
    return a + a_qd if joint else [a, a_qd]   # d-q: <S_d, S_q>, its pairs included

  groups = 1 + int(use_qq_negatives) + int(use_dd_negatives)
  n_neg = (ctx.batch - 1) * groups + k + n_shared * (1 + int(use_dd_negatives))
  if spread is not None:
    k_s = spread.v.shape[1]
    n_neg += k_s * ctx.batch + int(use_dd_negatives) * k_s * (ctx.batch - 1)
  if dq is None:
    return _chain.Head([lse_neg], [max_neg], pos, n_neg, cross)
  if joint:
    return _chain.Head([lse_neg], [max_neg], pos, n_neg + ctx.batch, cross)
  return _chain.Head([lse_neg, dq[0]], [max_neg, dq[1]], pos, [n_neg, ctx.batch - 1], cross)


_ARRAYS = ("query_features", "doc_features", "hard_negatives")
QWEN3 = _chain.Family(name="qwen3_loss", arrays=_ARRAYS, locked=(), head=_head,
                      reference=reference.qwen3_loss_with_stats,
                      options=("margin", "use_qq_negatives", "use_dd_negatives",
                               "use_dq_negatives", "partition", "share_hard_negatives"),
                      negatives=True)
LIT_QWEN3 = _chain.Family(name="lit_qwen3_loss", arrays=_ARRAYS, locked=(1, 2),
                          head=functools.partial(_head, use_dd_negatives=False),
                          reference=reference.lit_qwen3_loss_with_stats,
                          options=("margin", "use_qq_negatives", "use_dq_negatives",
                                   "partition", "share_hard_negatives"), negatives=True)


def qwen3_loss_with_stats(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    shared_negatives: ArrayLike | None = None, *, temperature: ArrayLike = 0.07,
    margin: ArrayLike = 0.1, use_qq_negatives: bool = False, use_dd_negatives: bool = False,
    use_dq_negatives: bool = False, partition: str = "joint",
    share_hard_negatives: bool = False, normalized_inputs: bool = False, stable: bool = True,
    tau_plus: ArrayLike = 0.0, label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    matryoshka_per_dim: bool | None = None, where: ArrayLike | None = None,
    axis_name: Hashable | None = None,
    backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  return _chain.run(QWEN3, **locals())


def lit_qwen3_loss_with_stats(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    shared_negatives: ArrayLike | None = None, *, temperature: ArrayLike = 0.07,
    margin: ArrayLike = 0.1, use_qq_negatives: bool = False, use_dq_negatives: bool = False,
    partition: str = "joint", share_hard_negatives: bool = False,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    matryoshka_per_dim: bool | None = None, where: ArrayLike | None = None,
    axis_name: Hashable | None = None,
    backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  return _chain.run(LIT_QWEN3, **locals())


_LSE_COL = (" ``lse_col`` / ``accuracy_col``: the d -> q softmax's with "
            "``partition=\"per_direction\"`` and ``use_dq_negatives``, else None.")
qwen3_loss_with_stats.__doc__ = _docs.STATS.format(name="qwen3_loss") + _LSE_COL
lit_qwen3_loss_with_stats.__doc__ = _docs.STATS.format(name="lit_qwen3_loss") + _LSE_COL

_ARRAY_DOCS = {
    "query_features": "[batch, d] float array (fp32, fp16 or bf16).",
    "doc_features": "[batch, d], same dtype; document i is query i's positive.",
    "hard_negatives": """optional [batch, k, d], same dtype; row i's k hard negatives
      compete only in row i (k = 0 allowed).""",
    "shared_negatives": _docs.SHARED_NEGATIVES,
}
_TAIL = """

""" + _docs.RETURNS + """

Gradient differences from ``jax.grad(reference.{name})``: none beyond ``stable``; the
mask and its threshold carry no gradient in both.

{raises}

References:
  Zhang et al., `Qwen3 Embedding: Advancing Text Embedding and Reranking Through
  Foundation Models <https://arxiv.org/abs/2506.05176>`_, 2025.
"""

qwen3_loss = _chain.value_only(qwen3_loss_with_stats, "qwen3_loss", r"""Qwen3-Embedding InfoNCE: q -> d softmax with a false-negative mask.

.. math::
  L = \frac{1}{B} \sum_i \Big[ \log Z_i - \frac{s(q_i, d_i)}{t} \Big], \quad
  Z_i = \sum_{c} [s_c \le s(q_i, d_i) + \mu + \delta]\, e^{s_c / t}

over row i's candidates: every document, the shared negatives, other queries
(``use_qq_negatives``), other documents and the shared negatives against d_i
(``use_dd_negatives``), every query against d_i (``use_dq_negatives``) and row i's
hard negatives; the nominal count N = (B - 1)(1 + qq + dd) + k + N_s (1 + dd) + B dq
for N_s shared negatives. ``partition="per_direction"`` makes the d-q group a softmax
of its own (d_i's positive q_i) and averages the two (docs/math.md §6.1). With
``margin=2.0`` (no mask) these are sentence-transformers' ``MultipleNegativesRankingLoss``
directions and partition modes, and GTE's improved contrastive loss is
``use_qq_negatives``, ``use_dq_negatives`` and ``use_dd_negatives`` together (README,
Porting). The positive is always kept
(margin >= 0). delta = 2^-10 is a tie tolerance: a candidate equal to the positive (a
duplicate row, or a hard negative equal to d_i) is kept at margin = 0 on every backend,
though its similarity and the positive's are computed apart and round differently.
Every backend is deterministic.

""" + _docs.args(qwen3_loss_with_stats, _ARRAY_DOCS) + _TAIL.format(
    name="qwen3_loss", raises=_docs.raises(qwen3_loss_with_stats)) + """
Examples:
  >>> import jax
  >>> from memeff_jax import qwen3_loss, reference
  >>> kq, kd = jax.random.split(jax.random.key(0))
  >>> q = jax.random.normal(kq, (8, 16)); d = q + 0.1 * jax.random.normal(kd, (8, 16))
  >>> loss = qwen3_loss(q, d, use_qq_negatives=True, backend="blockwise")
  >>> want = reference.qwen3_loss(q, d, use_qq_negatives=True)
  >>> bool(abs(loss - want) < 1e-5)
  True
""")

lit_qwen3_loss = _chain.value_only(lit_qwen3_loss_with_stats, "lit_qwen3_loss", """LiT-Qwen3: :func:`qwen3_loss` with the documents and hard negatives locked.

Only the queries are trained: the documents' and hard negatives' gradients are
exactly zero and no kernel computes them. There is no d-d option (its repulsion
would have nowhere to land).

""" + _docs.args(lit_qwen3_loss_with_stats, dict(
    _ARRAY_DOCS, query_features="[batch, d] float array (fp32, fp16 or bf16), trained.")) +
    _TAIL.format(name="lit_qwen3_loss", raises=_docs.raises(lit_qwen3_loss_with_stats)) + """
Examples:
  >>> import jax
  >>> from memeff_jax import lit_qwen3_loss
  >>> kq, kd = jax.random.split(jax.random.key(0))
  >>> q = jax.random.normal(kq, (8, 16)); d = jax.random.normal(kd, (8, 16))
  >>> g = jax.grad(lambda d: lit_qwen3_loss(q, d, backend="blockwise"))(d)
  >>> bool((g == 0).all())
  True
""")

# doctest finds a function by its globals, and these are _chain's.
__test__ = {"qwen3_loss": qwen3_loss, "lit_qwen3_loss": lit_qwen3_loss}
