"""CLIP: the symmetric InfoNCE loss, both towers trained (docs/math.md §4)."""

from __future__ import annotations

import functools
from typing import Hashable, Sequence

import jax
from jax.typing import ArrayLike

from memeff_jax import _chain, _docs, reference
from memeff_jax._terms import ContrastiveStats
from memeff_jax._validation import Backend
from memeff_jax.config import KernelConfig

CLIP = _chain.Family(name="clip_loss", arrays=("image_features", "text_features"), locked=(),
                     head=functools.partial(_chain.pair_head, two_sided=True),
                     reference=reference.clip_loss_with_stats, negatives=True)


def clip_loss_with_stats(
    image_features: ArrayLike, text_features: ArrayLike,
    shared_negatives: ArrayLike | None = None, *, temperature: ArrayLike = 0.07,
    normalized_inputs: bool = False, stable: bool = True, tau_plus: ArrayLike = 0.0,
    label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    matryoshka_per_dim: bool | None = None, where: ArrayLike | None = None,
    axis_name: Hashable | None = None,
    backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, ContrastiveStats]:
  return _chain.run(CLIP, **locals())


clip_loss_with_stats.__doc__ = _docs.STATS.format(name="clip_loss")

clip_loss = _chain.value_only(clip_loss_with_stats, "clip_loss", r"""Memory-efficient CLIP loss: symmetric InfoNCE over a batch of pairs.

With unit features ``x_i`` (images), ``y_j`` (texts) and ``s_ij = <x_i, y_j>``,

.. math::
  L = \frac{1}{2B} \sum_i \Big[ \log \sum_j e^{s_{ij}/t} - \frac{s_{ii}}{t}
      + \log \sum_j e^{s_{ji}/t} - \frac{s_{ii}}{t} \Big]

computed without the B x B matrix: the kernels stream tiles and keep O(B)
log-sum-exp statistics. Every backend is deterministic.

""" + _docs.args(clip_loss_with_stats, {
    "image_features": "[batch, d] float array (fp32, fp16 or bf16); the softmax rows.",
    "text_features": "[batch, d], same dtype; the softmax columns.",
    "shared_negatives": _docs.SHARED_NEGATIVES + """ The rows' (image -> text)
      softmax only: the columns' keeps its B candidates."""}) + """

""" + _docs.RETURNS + """

Gradient differences from ``jax.grad(reference.clip_loss)``: none beyond ``stable``.

""" + _docs.raises(clip_loss_with_stats) + """

References:
  Radford et al., `Learning Transferable Visual Models From Natural Language
  Supervision <https://arxiv.org/abs/2103.00020>`_, 2021.
  Chuang et al., `Debiased Contrastive Learning <https://arxiv.org/abs/2007.00224>`_,
  2020.
  Kusupati et al., `Matryoshka Representation Learning
  <https://arxiv.org/abs/2205.13147>`_, 2022.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from memeff_jax import clip_loss, reference
  >>> kx, ky = jax.random.split(jax.random.key(0))
  >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
  >>> loss = clip_loss(x, y, temperature=0.1, backend="blockwise")
  >>> bool(jnp.allclose(loss, reference.clip_loss(x, y, temperature=0.1), atol=1e-5))
  True
  >>> mrl = clip_loss(x, y, matryoshka_dims=(4, 8, 16), backend="blockwise")
""")

# doctest finds a function by its globals, and clip_loss's are _chain's.
__test__ = {"clip_loss": clip_loss}
