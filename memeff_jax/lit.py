"""LiT: one softmax direction, the second tower locked (docs/math.md §5)."""

from __future__ import annotations

import functools
from typing import Hashable, Sequence

import jax
from jax.typing import ArrayLike

from memeff_jax import _chain, _docs, reference
from memeff_jax._terms import ContrastiveStats
from memeff_jax._validation import Backend
from memeff_jax.config import KernelConfig

LIT = _chain.Family(name="lit_loss", arrays=("text_features", "image_features"), locked=(1,),
                    head=functools.partial(_chain.pair_head, two_sided=False),
                    reference=reference.lit_loss_with_stats, negatives=True)


def lit_loss_with_stats(
    text_features: ArrayLike, image_features: ArrayLike,
    shared_negatives: ArrayLike | None = None, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    matryoshka_per_dim: bool | None = None, where: ArrayLike | None = None,
    axis_name: Hashable | None = None,
    backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  return _chain.run(LIT, **locals())


lit_loss_with_stats.__doc__ = _docs.STATS.format(name="lit_loss") + " ``lse_col`` is None."

lit_loss = _chain.value_only(lit_loss_with_stats, "lit_loss", r"""Memory-efficient LiT loss: text -> image InfoNCE with a locked image tower.

.. math::
  L = \frac{1}{B} \sum_i \Big[ \log \sum_j e^{s_{ij}/t} - \frac{s_{ii}}{t} \Big],
  \quad s_{ij} = \langle x_i, y_j \rangle

The **first** argument is the trained tower; the second is locked
(``stop_gradient``): its gradient is exactly zero and no kernel computes it. One
softmax direction: N = B - 1 negatives, C = B candidates.

""" + _docs.args(lit_loss_with_stats, {
    "text_features": "[batch, d] float array, trained (the softmax rows).",
    "image_features": "[batch, d] float array, same dtype, locked (the candidates).",
    "shared_negatives": _docs.SHARED_NEGATIVES}) + """

""" + _docs.RETURNS + """

Gradient differences from ``jax.grad(reference.lit_loss)``: none beyond ``stable``
(the reference locks the image tower the same way).

""" + _docs.raises(lit_loss_with_stats) + """

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
""")

# doctest finds a function by its globals, and lit_loss's are _chain's.
__test__ = {"lit_loss": lit_loss}
