"""CLIP: the symmetric InfoNCE loss, both towers trained (MATH 2, 6)."""

from __future__ import annotations

from typing import Hashable, Literal

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from memeff_jax import _dispatch, _validation, reference
from memeff_jax._core import BlockSpec, block_lse
from memeff_jax._terms import (ContrastiveStats, as_scale, global_sum, is_zero, normalize,
                               reduce_terms, ring_size, softmax_terms, stable_scale)
from memeff_jax.config import KernelConfig
from memeff_jax.ring import check_axis

Backend = Literal["auto", "triton", "interpret", "blockwise", "reference"]


def pair_loss(x, y, *, names, two_sided, temperature, normalized_inputs, stable, tau_plus,
              label_smoothing, lse_square_scale, axis_name, backend, config):
  """CLIP (two_sided) or LiT (rows only, y locked): the shared glue."""
  n, _ = _validation.check_towers(names, x, y)
  temperature = _validation.check_temperature(temperature)
  tau = _validation.check_tau_plus(tau_plus, n)
  eps = _validation.check_range("label_smoothing", label_smoothing, 0.0, 1.0)
  z_scale = _validation.check_range("lse_square_scale", lse_square_scale, 0.0, None)
  be = _dispatch.resolve(backend)
  check_axis(axis_name)
  opts = dict(temperature=temperature, normalized_inputs=normalized_inputs, stable=stable,
              tau_plus=tau_plus, label_smoothing=label_smoothing,
              lse_square_scale=lse_square_scale)
  if be is None:
    if axis_name is not None:
      raise ValueError("backend='reference' is single-device: it has no axis_name ring")
    fn = reference.clip_loss_with_stats if two_sided else reference.lit_loss_with_stats
    return fn(x, y, **opts)
  if not two_sided:
    y = lax.stop_gradient(y)                                   # the locked tower
  if not normalized_inputs:
    x, y = normalize(x), normalize(y)
  batch = n * ring_size(axis_name)
  scale = as_scale(temperature)
  # One fp32 copy per tower for all the O(B D) glue: its cotangents then sum in fp32
  # and round to the input dtype once (the smoothing terms cancel to ~0).
  x32, y32 = x.astype(jnp.float32), y.astype(jnp.float32)
  pos = jnp.sum(x32 * y32, axis=-1)                                    # s_ii, fp32
  spec = BlockSpec(backend=be, two_sided=two_sided, exclude_self=True, axis_name=axis_name,
                   config=config)
  # Negatives only (the diagonal is excluded); the positive joins in the log domain.
  lse_row, lse_col = block_lse(x, y, scale, spec=spec)
  soft = dict(n_neg=batch - 1, tau=tau, scale=scale)
  terms = [softmax_terms(lse_row, scale * pos, **soft)]
  if two_sided:   # column j: the softmax over images for text j; prior tau_j
    terms.append(softmax_terms(lse_col, scale * pos, **soft))
  loss, z = reduce_terms(terms, batch=batch, z_scale=z_scale, axis_name=axis_name)
  if not is_zero(eps):
    # Smoothed targets, C = B: Corr = eps/(B t) * (tr(X Y^T) - <sum X, sum Y> / B), both
    # directions alike (MATH 6.2).
    sum_x = global_sum(jnp.sum(x32, axis=0), axis_name)
    sum_y = global_sum(jnp.sum(y32, axis=0), axis_name)
    trace = global_sum(jnp.sum(pos), axis_name)
    loss = loss + eps * scale / batch * (trace - jnp.dot(sum_x, sum_y) / batch)
  loss = stable_scale(loss + z, stable=stable, batch=batch, temperature=temperature)
  stats = ContrastiveStats(z, terms[0][1], terms[1][1] if two_sided else None)
  return loss, stats


def clip_loss_with_stats(
    image_features: ArrayLike, text_features: ArrayLike, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  """:func:`clip_loss` and its :class:`ContrastiveStats` (z-loss, log-normalizers)."""
  del deterministic  # every backend is deterministic (see clip_loss)
  return pair_loss(image_features, text_features, names=("image_features", "text_features"),
                   two_sided=True, temperature=temperature, normalized_inputs=normalized_inputs,
                   stable=stable, tau_plus=tau_plus, label_smoothing=label_smoothing,
                   lse_square_scale=lse_square_scale, axis_name=axis_name, backend=backend,
                   config=config)


def clip_loss(
    image_features: ArrayLike, text_features: ArrayLike, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> jax.Array:
  r"""Memory-efficient CLIP loss: symmetric InfoNCE over a batch of pairs.

  With unit features ``x_i`` (images), ``y_j`` (texts) and ``s_ij = <x_i, y_j>``,

  .. math::
    L = \frac{1}{2B} \sum_i \Big[ \log \sum_j e^{s_{ij}/t} - \frac{s_{ii}}{t}
        + \log \sum_j e^{s_{ji}/t} - \frac{s_{ii}}{t} \Big]

  computed without the B x B matrix: the kernels stream tiles and keep O(B)
  log-sum-exp statistics. Options: ``tau_plus`` replaces each softmax's negatives by
  the debiased estimate of Chuang et al.; ``label_smoothing`` uses the
  ``F.cross_entropy`` targets (C = B); ``lse_square_scale`` adds the z-loss
  ``lse_square_scale * mean(lse^2)`` (rows and columns averaged, lse the natural log of
  each softmax's denominator actually used).

  Every backend is deterministic (no atomics; fixed reduction orders), so
  ``deterministic`` changes nothing; it is accepted for API parity.

  Args:
    image_features: [batch, d] float array (fp32, fp16 or bf16); the softmax rows.
    text_features: [batch, d], same dtype; the softmax columns.
    temperature: float > 0 or a traced 0-d array (learnable: it gets a gradient; a
      new value never recompiles). Default 0.07.
    normalized_inputs: skip the L2 normalization (done in the input dtype otherwise).
    stable: multiply the whole gradient by ``sqrt(B * t)`` (B global, t held constant
      in the factor); the value is unchanged. Default True, as in memeff.
    tau_plus: debiasing prior in [0, 1); a Python 0.0 is the plain loss; a [batch]
      array gives per-sample priors (row i and column i use tau_i) and always debiases.
    label_smoothing: in [0, 1).
    lse_square_scale: z-loss weight >= 0.
    axis_name: inside ``jax.shard_map``: the mesh axis the batch is sharded over. The
      inputs are this device's contiguous shard; every device returns the global
      loss, and gradients are the local rows of the global loss's gradient.
    backend: "auto" (Triton on GPU when jax-triton imports, else blockwise),
      "triton", "interpret" (the Triton kernels under Triton's CPU interpreter),
      "blockwise" (pure JAX, any platform) or "reference" (dense).
    deterministic: accepted; see above.
    config: optional :class:`KernelConfig` (tiles, precision of fp32 dots).

  Returns:
    float32 scalar: the mean loss (plus smoothing and z terms).

  Gradient differences from ``jax.grad(reference.clip_loss)``: none beyond ``stable``.

  Raises:
    ValueError: bad shapes, a Python ``temperature <= 0``, ``tau_plus``,
      ``label_smoothing`` or ``lse_square_scale`` out of range, unknown backend,
      unbound ``axis_name``.
    TypeError: non-floating or mismatched dtypes.

  References:
    Radford et al., `Learning Transferable Visual Models From Natural Language
    Supervision <https://arxiv.org/abs/2103.00020>`_, 2021.
    Chuang et al., `Debiased Contrastive Learning <https://arxiv.org/abs/2007.00224>`_,
    2020.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from memeff_jax import clip_loss, reference
    >>> kx, ky = jax.random.split(jax.random.key(0))
    >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
    >>> loss = clip_loss(x, y, temperature=0.1, backend="blockwise")
    >>> bool(jnp.allclose(loss, reference.clip_loss(x, y, temperature=0.1), atol=1e-5))
    True
  """
  return clip_loss_with_stats(
      image_features, text_features, temperature=temperature,
      normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
      label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
      axis_name=axis_name, backend=backend, deterministic=deterministic, config=config)[0]
