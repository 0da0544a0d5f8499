"""SigLIP: the pairwise sigmoid loss, both towers trained (docs/math.md §13)."""

from __future__ import annotations

from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from memeff_jax import _chain, _docs, reference
from memeff_jax._options import SHARED
from memeff_jax._reduction import SIGMOID
from memeff_jax._terms import SigLIPStats
from memeff_jax._validation import Backend
from memeff_jax.config import KernelConfig


def _head(ctx: _chain.Ctx, towers, *, bias) -> _chain.Head:
  """One block of every pair i != j (rows: images, columns: texts) summing
  softplus(z_ij + b); the positives' terms join in the glue (``Sigmoid.term``)."""
  x, y = towers
  b = jnp.asarray(bias, ctx.scale.dtype)
  lse_row, _, max_row, _ = ctx.block(x, y, bias=b, exclude_self=True, reduction=SIGMOID)
  return _chain.Head([lse_row], [max_row], ctx.sims(x, y), ctx.batch - 1, lambda: None,
                     reduction=SIGMOID, bias=b)


def _stats(*, ctx, head, terms, per_dim, accuracy, unk) -> SigLIPStats:
  (_, neg), = terms
  part = lambda v: unk(ctx.row_sum(v) / ctx.batch)
  pos = jax.nn.softplus(-(ctx.scale * head.pos + head.bias))   # (not ell - neg: no cancelling)
  return SigLIPStats(loss_positive=part(pos), loss_negative=part(neg),
                     matryoshka_losses=per_dim if ctx.dims else None, accuracy_row=accuracy[0])


_SHARED = tuple(k for k in SHARED if k not in ("tau_plus", "label_smoothing",
                                               "lse_square_scale"))
SIGLIP = _chain.Family(name="siglip_loss", arrays=("image_features", "text_features"),
                       locked=(), head=_head, reference=reference.siglip_loss_with_stats,
                       options=("bias",), shared=_SHARED, stats=_stats)


def siglip_loss_with_stats(
    image_features: ArrayLike, text_features: ArrayLike, *, temperature: ArrayLike = 0.1,
    bias: ArrayLike = -10.0, normalized_inputs: bool = False, stable: bool = True,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    matryoshka_per_dim: bool | None = None, where: ArrayLike | None = None,
    axis_name: Hashable | None = None,
    backend: Backend = "auto", deterministic: bool = False,
    config: KernelConfig | None = None) -> tuple[jax.Array, SigLIPStats]:
  return _chain.run(SIGLIP, **locals())


siglip_loss_with_stats.__doc__ = """:func:`siglip_loss` and its :class:`SigLIPStats` (the
loss's positive and negative parts, per-dim losses, in-batch accuracy)."""

siglip_loss = _chain.value_only(siglip_loss_with_stats, "siglip_loss", r"""Memory-efficient SigLIP loss: a sigmoid for every image-text pair.

With unit features ``x_i`` (images), ``y_j`` (texts), ``s_ij = <x_i, y_j>``, logits
``z_ij = s_ij / t + b`` and labels ``+1`` on the diagonal, ``-1`` elsewhere,

.. math::
  L = -\frac{1}{B} \sum_{i, j} \log \sigma(\pm z_{ij})

(big_vision's normalization: the sum over all B^2 pairs divided by B). The pairs
i != j are summed block by block, O(B) memory; the positives are B sigmoids.
``temperature`` and ``bias`` are learnable (traced 0-d arrays get gradients);
big_vision learns ``log(1 / t)`` from ``log 10`` and ``b`` from -10, as
``memeff_jax.nnx.SigLIPLoss`` / ``memeff_jax.linen.SigLIPLoss`` do. ``stable=True`` (the
default of every loss here) multiplies the gradients by sqrt(B t); pass
``stable=False`` for big_vision's gradients.

On the Triton backends the softmax kernels' tiled forward sums the softplus terms in
its epilogue, and the gradient kernels take the coefficients sigmoid(z + b) and sum
them for the bias; where both towers train (one device, 16-bit inputs by default), the
forward pass computes the gradient too, from the same tiles (docs/math.md §12).

""" + _docs.args(siglip_loss_with_stats, {
    "image_features": "[batch, d] float array (fp32, fp16 or bf16); the rows.",
    "text_features": "[batch, d], same dtype; the columns."}) + """

Returns:
  The loss, a float32 scalar (float64 for float64 features).

Gradient differences from ``jax.grad(reference.siglip_loss)``: none beyond ``stable``.

""" + _docs.raises(siglip_loss_with_stats) + """

References:
  Zhai et al., `Sigmoid Loss for Language Image Pre-Training
  <https://arxiv.org/abs/2303.15343>`_, 2023.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from memeff_jax import siglip_loss, reference
  >>> kx, ky = jax.random.split(jax.random.key(0))
  >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
  >>> loss = siglip_loss(x, y, temperature=0.1, bias=-10.0, backend="blockwise")
  >>> ref = reference.siglip_loss(x, y, temperature=0.1, bias=-10.0)
  >>> bool(jnp.allclose(loss, ref, atol=1e-5))
  True
""")

# doctest finds a function by its globals, and siglip_loss's are _chain's.
__test__ = {"siglip_loss": siglip_loss}
