"""Qwen3-Embedding InfoNCE and LiT-Qwen3: a q->d row softmax with the false-negative
mask, optional q-q / d-d in-batch negatives and row-specific hard negatives (MATH 4-6)."""

from __future__ import annotations

import textwrap
from typing import Hashable

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from memeff_jax import _dispatch, _validation, reference
from memeff_jax._core import BlockSpec, block_lse
from memeff_jax._terms import (ContrastiveStats, as_scale, global_sum, is_zero, masked_lse,
                               normalize, reduce_terms, ring_size, softmax_terms, stable_scale)
from memeff_jax.clip import Backend
from memeff_jax.config import KernelConfig
from memeff_jax.ring import check_axis


def _qwen3(q, d, h, *, lit, temperature, margin, use_qq, use_dd, normalized_inputs, stable,
           tau_plus, label_smoothing, lse_square_scale, axis_name, backend, config):
  n, dim = _validation.check_towers(("query_features", "doc_features"), q, d)
  if h is not None:
    _validation.check_hard_negatives(h, n, dim, q.dtype)
  temperature = _validation.check_temperature(temperature)
  margin = _validation.check_range("margin", margin, 0.0, None)
  tau = _validation.check_tau_plus(tau_plus, n)
  eps = _validation.check_range("label_smoothing", label_smoothing, 0.0, 1.0)
  z_scale = _validation.check_range("lse_square_scale", lse_square_scale, 0.0, None)
  be = _dispatch.resolve(backend)
  check_axis(axis_name)
  if be is None:
    if axis_name is not None:
      raise ValueError("backend='reference' is single-device: it has no axis_name ring")
    opts = dict(temperature=temperature, margin=margin, use_qq_negatives=use_qq,
                normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
                label_smoothing=label_smoothing, lse_square_scale=lse_square_scale)
    if lit:
      return reference.lit_qwen3_loss_with_stats(q, d, h, **opts)
    return reference.qwen3_loss_with_stats(q, d, h, use_dd_negatives=use_dd, **opts)
  if h is not None and h.shape[1] == 0:
    h = None
  if lit:   # documents and hard negatives locked
    d = lax.stop_gradient(d)
    h = None if h is None else lax.stop_gradient(h)
  if not normalized_inputs:
    q, d = normalize(q), normalize(d)
    h = None if h is None else normalize(h)
  k = 0 if h is None else h.shape[1]
  batch = n * ring_size(axis_name)
  scale = as_scale(temperature)
  f32 = jnp.float32
  # One fp32 copy per tower for all the O(B D) glue: cotangents sum in fp32 and
  # round to the input dtype once.
  q32, d32 = q.astype(f32), d.astype(f32)
  h32 = None if h is None else h.astype(f32)
  pos = jnp.sum(q32 * d32, axis=-1)                              # s(q_i, d_i), fp32
  # Row i keeps an entry iff s <= pos_i + margin (raw cosine, non-strict), with row
  # i's threshold on every group; the mask carries no gradient. margin >= 0 always
  # keeps the positive, which joins in the log domain (softmax_terms).
  thr = lax.stop_gradient(pos + margin)
  block = lambda **kw: BlockSpec(backend=be, exclude_self=True, axis_name=axis_name,
                                 config=config, **kw)
  parts = [block_lse(q, d, scale, thr, spec=block())[0]]           # q-d, j != i
  if use_qq:   # q-q, j != i: one symmetric block, both roles folded in its gradient
    parts.append(block_lse(q, None, scale, thr, spec=block(symmetric=True))[0])
  if use_dd:   # d-d, j != i, with query i's threshold on row i
    parts.append(block_lse(d, None, scale, thr, spec=block(symmetric=True))[0])
  if k:        # row-specific hard negatives: O(n k d) plain JAX
    s_h = jnp.einsum("id,ikd->ik", q32, h32)
    parts.append(masked_lse(scale * s_h, s_h <= thr[:, None]))
  lse_neg = parts[0] if len(parts) == 1 else masked_lse(jnp.stack(parts), True, axis=0)
  n_neg = (batch - 1) * (1 + int(use_qq) + int(use_dd)) + k
  ell, lse = softmax_terms(lse_neg, scale * pos, n_neg=n_neg, tau=tau, scale=scale)
  loss, z = reduce_terms([(ell, lse)], batch=batch, z_scale=z_scale, axis_name=axis_name)
  if not is_zero(eps):
    # Smoothed targets over the C = N + 1 nominal candidates; the mask does not
    # reshape them (MATH 6.2): Corr = eps/(B t) * (tr(Q D^T) - A / C).
    gsum = lambda v: global_sum(v, axis_name)
    sum_q, sum_d = gsum(jnp.sum(q32, axis=0)), gsum(jnp.sum(d32, axis=0))
    a = jnp.dot(sum_q, sum_d)
    if use_qq:
      a += jnp.dot(sum_q, sum_q) - gsum(jnp.sum(q32 * q32))
    if use_dd:
      a += jnp.dot(sum_d, sum_d) - gsum(jnp.sum(d32 * d32))
    if k:
      a += gsum(jnp.sum(s_h))
    loss = loss + eps * scale / batch * (gsum(jnp.sum(pos)) - a / (n_neg + 1))
  loss = stable_scale(loss + z, stable=stable, batch=batch, temperature=temperature)
  return loss, ContrastiveStats(z, lse, None)


_ARGS_DOC = """
  Args:
    query_features: [batch, d] float array (fp32, fp16 or bf16).
    doc_features: [batch, d], same dtype; document i is query i's positive.
    hard_negatives: optional [batch, k, d], same dtype; row i's k hard negatives
      compete only in row i (k = 0 allowed).
    temperature: float > 0 or a traced 0-d array (learnable). Default 0.07.
    margin: >= 0 (float or 0-d array), raw-cosine units: an entry of row i is dropped
      as a presumed false negative iff its similarity exceeds s(q_i, d_i) + margin.
      For unit-norm inputs margin >= 2 disables the mask.
    normalized_inputs: skip the L2 normalization (done in the input dtype otherwise).
    stable: multiply the whole gradient by sqrt(B * t); the value is unchanged.
    tau_plus: debiasing prior in [0, 1) or a per-row [batch] array, with the nominal
      N = (B - 1) * (1 + qq + dd) + k; masked entries keep their place in N.
    label_smoothing: in [0, 1); targets over the C = N + 1 nominal candidates.
    lse_square_scale: z-loss weight >= 0.
    axis_name: the shard_map axis of the ring (see :func:`memeff_jax.clip_loss`);
      hard negatives and per-row tau stay on their query's device.
    backend, deterministic, config: as for :func:`memeff_jax.clip_loss`.

  Returns:
    float32 scalar: the mean loss.

  Raises:
    ValueError: bad shapes (hard negatives not [batch, k, d]), a Python margin < 0,
      or any error of :func:`memeff_jax.clip_loss`.
    TypeError: non-floating or mismatched dtypes.

  References:
    Zhang et al., `Qwen3 Embedding: Advancing Text Embedding and Reranking Through
    Foundation Models <https://arxiv.org/abs/2506.05176>`_, 2025.
"""


def qwen3_loss_with_stats(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    *, temperature: ArrayLike = 0.07, margin: ArrayLike = 0.1, use_qq_negatives: bool = False,
    use_dd_negatives: bool = False, normalized_inputs: bool = False, stable: bool = True,
    tau_plus: ArrayLike = 0.0, label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  """:func:`qwen3_loss` and its :class:`ContrastiveStats` (``lse_col`` is None)."""
  del deterministic  # every backend is deterministic
  return _qwen3(query_features, doc_features, hard_negatives, lit=False,
                temperature=temperature, margin=margin, use_qq=use_qq_negatives,
                use_dd=use_dd_negatives, normalized_inputs=normalized_inputs, stable=stable,
                tau_plus=tau_plus, label_smoothing=label_smoothing,
                lse_square_scale=lse_square_scale, axis_name=axis_name, backend=backend,
                config=config)


def qwen3_loss(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    *, temperature: ArrayLike = 0.07, margin: ArrayLike = 0.1, use_qq_negatives: bool = False,
    use_dd_negatives: bool = False, normalized_inputs: bool = False, stable: bool = True,
    tau_plus: ArrayLike = 0.0, label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> jax.Array:
  return qwen3_loss_with_stats(
      query_features, doc_features, hard_negatives, temperature=temperature, margin=margin,
      use_qq_negatives=use_qq_negatives, use_dd_negatives=use_dd_negatives,
      normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
      label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
      axis_name=axis_name, backend=backend, deterministic=deterministic, config=config)[0]


def lit_qwen3_loss_with_stats(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    *, temperature: ArrayLike = 0.07, margin: ArrayLike = 0.1, use_qq_negatives: bool = False,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  """:func:`lit_qwen3_loss` and its :class:`ContrastiveStats`."""
  del deterministic  # every backend is deterministic
  return _qwen3(query_features, doc_features, hard_negatives, lit=True,
                temperature=temperature, margin=margin, use_qq=use_qq_negatives, use_dd=False,
                normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
                label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                axis_name=axis_name, backend=backend, config=config)


def lit_qwen3_loss(
    query_features: ArrayLike, doc_features: ArrayLike, hard_negatives: ArrayLike | None = None,
    *, temperature: ArrayLike = 0.07, margin: ArrayLike = 0.1, use_qq_negatives: bool = False,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> jax.Array:
  return lit_qwen3_loss_with_stats(
      query_features, doc_features, hard_negatives, temperature=temperature, margin=margin,
      use_qq_negatives=use_qq_negatives, normalized_inputs=normalized_inputs, stable=stable,
      tau_plus=tau_plus, label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
      axis_name=axis_name, backend=backend, deterministic=deterministic, config=config)[0]


qwen3_loss.__doc__ = r"""Qwen3-Embedding InfoNCE: q -> d softmax with a false-negative mask.

.. math::
  L = \frac{1}{B} \sum_i \Big[ \log Z_i - \frac{s(q_i, d_i)}{t} \Big], \quad
  Z_i = \sum_{c} [s_c \le s(q_i, d_i) + \mu]\, e^{s_c / t}

over row i's candidates: every document, other queries (``use_qq_negatives``),
other documents against d_i (``use_dd_negatives``) and row i's hard negatives.
The positive is always kept (margin >= 0). Every backend is deterministic.

Gradient differences from ``jax.grad(reference.qwen3_loss)``: none beyond
``stable``; the mask and its threshold carry no gradient in both.
""" + textwrap.dedent(_ARGS_DOC) + """
Examples:
  >>> import jax
  >>> from memeff_jax import qwen3_loss
  >>> kq, kd = jax.random.split(jax.random.key(0))
  >>> q = jax.random.normal(kq, (8, 16)); d = q + 0.1 * jax.random.normal(kd, (8, 16))
  >>> float(qwen3_loss(q, d, use_qq_negatives=True, backend="blockwise")) < 1.0
  True
"""
lit_qwen3_loss.__doc__ = """LiT-Qwen3: :func:`qwen3_loss` with the documents and hard negatives locked.

Only the queries are trained: the documents' and hard negatives' gradients are
exactly zero and no kernel computes them. There is no d-d option (its repulsion
would have nowhere to land).
""" + textwrap.dedent(_ARGS_DOC).replace(
    "  query_features: [batch, d] float array (fp32, fp16 or bf16).",
    "  query_features: [batch, d] float array (fp32, fp16 or bf16), trained.") + """
Examples:
  >>> import jax
  >>> from memeff_jax import lit_qwen3_loss
  >>> kq, kd = jax.random.split(jax.random.key(0))
  >>> q = jax.random.normal(kq, (8, 16)); d = jax.random.normal(kd, (8, 16))
  >>> g = jax.grad(lambda d: lit_qwen3_loss(q, d, backend="blockwise"))(d)
  >>> bool((g == 0).all())
  True
"""
