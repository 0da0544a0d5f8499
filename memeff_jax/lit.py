"""LiT: one softmax direction, the second tower locked (MATH 3)."""

from __future__ import annotations

from typing import Hashable

import jax
from jax.typing import ArrayLike

from memeff_jax._terms import ContrastiveStats
from memeff_jax.clip import Backend, pair_loss
from memeff_jax.config import KernelConfig


def lit_loss_with_stats(
    text_features: ArrayLike, image_features: ArrayLike, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  """:func:`lit_loss` and its :class:`ContrastiveStats` (``lse_col`` is None)."""
  del deterministic  # every backend is deterministic
  return pair_loss(text_features, image_features, names=("text_features", "image_features"),
                   two_sided=False, temperature=temperature,
                   normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
                   label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                   axis_name=axis_name, backend=backend, config=config)


def lit_loss(
    text_features: ArrayLike, image_features: ArrayLike, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    axis_name: Hashable | None = None, backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> jax.Array:
  r"""Memory-efficient LiT loss: text -> image InfoNCE with a locked image tower.

  .. math::
    L = \frac{1}{B} \sum_i \Big[ \log \sum_j e^{s_{ij}/t} - \frac{s_{ii}}{t} \Big],
    \quad s_{ij} = \langle x_i, y_j \rangle

  The **first** argument is the trained tower; the second is locked
  (``stop_gradient``): its gradient is exactly zero and no kernel computes it. Options
  as for :func:`memeff_jax.clip_loss` (one direction: N = C - 1 = B - 1; the z-loss
  averages the rows). Every backend is deterministic.

  Args:
    text_features: [batch, d] float array, trained (the softmax rows).
    image_features: [batch, d] float array, same dtype, locked (the candidates).
    temperature, normalized_inputs, stable, tau_plus, label_smoothing,
    lse_square_scale, axis_name, backend, deterministic, config: as for
      :func:`memeff_jax.clip_loss`.

  Returns:
    float32 scalar: the mean loss.

  Gradient differences from ``jax.grad(reference.lit_loss)``: none beyond ``stable``
  (the reference locks the image tower the same way).

  Raises:
    ValueError, TypeError: as for :func:`memeff_jax.clip_loss`.

  References:
    Zhai et al., `LiT: Zero-Shot Transfer with Locked-image text Tuning
    <https://arxiv.org/abs/2111.07991>`_, 2022.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from memeff_jax import lit_loss, reference
    >>> kx, ky = jax.random.split(jax.random.key(0))
    >>> t = jax.random.normal(kx, (8, 16)); i = jax.random.normal(ky, (8, 16))
    >>> g = jax.grad(lambda i: lit_loss(t, i, backend="blockwise"))(i)
    >>> bool((g == 0).all())
    True
  """
  return lit_loss_with_stats(
      text_features, image_features, temperature=temperature,
      normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
      label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
      axis_name=axis_name, backend=backend, deterministic=deterministic, config=config)[0]
