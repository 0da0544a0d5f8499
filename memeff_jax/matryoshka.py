"""The eager Matryoshka wrapper: any loss, summed over prefixes of its feature arrays.

Fused Matryoshka (one statistics chain for all dims: one plain block per dim, or one
block for every dim, the ``matryoshka_per_dim=`` keyword) is the ``matryoshka_dims=``
option of every loss; this wrapper is for losses that lack it (your own, or a
``sharded`` one) and for checking the fused losses.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from memeff_jax._validation import check_dims, check_loss, check_weights


def matryoshka(loss_fn: Callable[..., jax.Array], dims: Sequence[int],
               weights: Sequence[float] | None = None) -> Callable[..., jax.Array]:
  r"""Eager Matryoshka: ``sum_k w_k loss_fn(features[..., :m_k])`` (docs/math.md §8.3).

  .. math::
    L = \sum_k w_k \, \mathrm{loss\_fn}(x_{:, :m_k}, y_{:, :m_k}, \ldots)

  Every feature array is sliced to its first ``m_k`` features: the positional arrays
  of rank >= 2 and ``hard_negatives=`` / ``shared_negatives=`` (and memeff's
  ``hard_negative_features=``, which its classes take) when passed by keyword.
  Everything else passes through unchanged, a per-row ``tau_plus`` included (it is
  never sliced). The base loss normalizes each raw slice itself, so
  ``normalized_inputs=True`` is refused: then the value equals the fused
  ``matryoshka_dims`` loss in exact math. It calls the loss K times (K passes over the
  batch); it works around any loss, the ring (``axis_name=`` or
  :func:`memeff_jax.sharded`) included.

  Args:
    loss_fn: a loss taking feature arrays ``[batch, d]`` (and ``[batch, k, d]``).
    dims: strictly increasing positive ints; ``dims[-1]`` at most d (the features
      past it get no gradient).
    weights: one finite float per dim (default 1.0 each; not normalized).

  Returns:
    A function with ``loss_fn``'s arguments returning the weighted sum (a float32 scalar;
    float64 for float64 features).

  Raises:
    ValueError: empty, non-increasing or non-positive ``dims``; ``dims[-1] > d``
      (when called); ``weights`` of the wrong length or non-finite;
      ``normalized_inputs=True`` (passed, or bound by ``functools.partial`` or a
      class field).
    TypeError: a ``loss_fn`` that is not callable, non-int dims, non-number weights;
      a ``loss_fn`` that returns no scalar (a ``*_with_stats`` function).

  References:
    Kusupati et al., `Matryoshka Representation Learning
    <https://arxiv.org/abs/2205.13147>`_, 2022.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import memeff_jax as mj
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 8, 16))
    >>> eager = mj.matryoshka(mj.clip_loss, dims=(4, 16))(x, y, backend="blockwise")
    >>> fused = mj.clip_loss(x, y, matryoshka_dims=(4, 16), backend="blockwise")
    >>> bool(jnp.allclose(eager, fused, rtol=1e-4))
    True
  """
  check_loss("loss_fn", loss_fn)
  dims = check_dims("dims", dims)
  weights = check_weights("weights", weights, len(dims))
  # normalized_inputs=True bound into the loss: a partial's keyword or a class field
  bound = (getattr(loss_fn, "keywords", None) or {}).get(
      "normalized_inputs", getattr(loss_fn, "normalized_inputs", False))
  _check_normalizes(bound, "loss_fn.normalized_inputs")

  try:
    sig = inspect.signature(loss_fn)
  except (TypeError, ValueError):
    sig = None
  name = getattr(loss_fn, "__name__", "loss_fn")

  def loss(*features, **kwargs):
    if sig is not None:   # feature arrays passed by name are sliced as positional ones
      try:
        call = sig.bind(*features, **kwargs)
      except TypeError as e:
        raise TypeError(f"{name}() {e}") from None
      features, kwargs = call.args, call.kwargs
    _check_normalizes(kwargs.get("normalized_inputs", False), "normalized_inputs")
    if not features:
      raise TypeError(f"{name}() takes its feature arrays positionally or by name; got none")
    if not hasattr(features[0], "shape"):
      first = next(iter(sig.parameters)) if sig is not None else "the first feature array"
      raise TypeError(f"{first} must be an array, got {type(features[0]).__name__}")
    check_dims("dims", dims, features[0].shape[-1])
    total = 0.0
    for m, w in zip(dims, weights):
      cut = lambda f: f[..., :m] if getattr(f, "ndim", 0) >= 2 else f
      kw = {k: cut(v) if k in _FEATURE_KEYWORDS and v is not None else v
            for k, v in kwargs.items()}
      value = loss_fn(*[cut(f) for f in features], **kw)
      if getattr(value, "shape", None) != ():
        raise TypeError(f"loss_fn must return the loss, a scalar array, got "
                        f"{type(value).__name__}: wrap a loss function (clip_loss), not a "
                        f"*_with_stats one")
      total = total + w * value
    # (the weights multiplied in the losses' dtype: finite there too, checked now it is known)
    check_weights("weights", weights, len(dims), jnp.result_type(total))
    return total

  if sig is not None:   # loss_fn's parameters, so that sharded() finds shared_negatives
    loss.__signature__ = sig
  return loss


# The losses' feature arrays that may come by keyword (sliced like the positional ones).
# (hard_negative_features: memeff's name, _wrappers.MEMEFF_ARRAYS; importing that here
# would cycle: _wrappers -> the losses -> reference -> this module.)
_FEATURE_KEYWORDS = ("hard_negatives", "shared_negatives", "hard_negative_features")


def _check_normalizes(normalized_inputs, where: str) -> None:
  if normalized_inputs is True:
    raise ValueError(f"matryoshka needs normalized_inputs=False: the base loss "
                     f"renormalizes every prefix slice itself; got {where}=True")
