"""Glue shared by the object wrappers (``classes``, ``nnx``, ``linen``) over the losses.

Flax-free on purpose: ``memeff_jax.classes`` uses it too, and importing
``memeff_jax`` must never import flax.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from memeff_jax._validation import check_dims, check_weights

# Default bound on the learnable logit scale 1 / t, as OpenCLIP clamps it.
MAX_LOGIT_SCALE = 100.0


def call_loss(fn: Callable, arrays: tuple, *, temperature, options: dict[str, Any],
              tau_plus=None, where=None):
  """``fn(*arrays, temperature=..., **options)`` with a per-call ``tau_plus`` override
  and a per-call ``where`` mask.

  ``tau_plus=None`` keeps the value in ``options``. The Matryoshka keywords are left
  out while both are None, so a plain loss call never depends on them.
  """
  opts = dict(options)
  if tau_plus is not None:
    opts["tau_plus"] = tau_plus
  if where is not None:
    opts["where"] = where
  if opts.get("matryoshka_dims") is None and opts.get("matryoshka_weights") is None:
    opts.pop("matryoshka_dims", None)
    opts.pop("matryoshka_weights", None)
  elif opts.get("matryoshka_dims") is not None:
    opts["matryoshka_dims"] = tuple(opts["matryoshka_dims"])
  return fn(*arrays, temperature=temperature, **opts)


def initial_log_scale(temperature: float) -> float:
  """``log(1 / t)`` of a Python temperature, checked here: a parameter starts from it."""
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
    raise TypeError(f"temperature must be a Python float (the initial value), got "
                    f"{temperature!r}")
  if not (math.isfinite(temperature) and temperature > 0):
    raise ValueError(f"temperature must be finite and > 0, got {temperature=}")
  return math.log(1.0 / temperature)


def matryoshka_options(dims, weights) -> tuple:
  """A module's ``(matryoshka_dims, matryoshka_weights)`` as tuples (None stays None),
  checked at construction so that errors name them; the feature size is checked at
  the call."""
  if dims is not None:
    dims = check_dims("matryoshka_dims", dims)
  if weights is not None:   # without dims the count is checked at the call
    k = len(dims) if dims is not None else getattr(weights, "__len__", lambda: 0)()
    weights = check_weights("matryoshka_weights", weights, k)
  return dims, weights


def check_max_logit_scale(max_logit_scale: float | None) -> float | None:
  if max_logit_scale is None:
    return None
  if isinstance(max_logit_scale, bool) or not isinstance(max_logit_scale, (int, float)):
    raise TypeError(f"max_logit_scale must be a Python float or None, got {max_logit_scale!r}")
  if not max_logit_scale > 0:
    raise ValueError(f"max_logit_scale must be > 0, got {max_logit_scale=}")
  return float(max_logit_scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _clamp_above(s, bound):
  return jnp.minimum(s, bound)


def _clamp_above_fwd(s, bound):
  return jnp.minimum(s, bound), s > bound


def _clamp_above_bwd(bound, above, g):
  del bound
  # Above the bound only a gradient that moves s back down (descent: g > 0) passes,
  # so the parameter never gets stuck there; below it the gradient is the identity.
  return (jnp.where(above & (g < 0), jnp.zeros_like(g), g),)


_clamp_above.defvjp(_clamp_above_fwd, _clamp_above_bwd)


def temperature_from_log_scale(log_scale: ArrayLike, max_logit_scale: float | None) -> jax.Array:
  """``t = exp(-min(s, log max_logit_scale))`` from the stored log-scale ``s = log(1/t)``.

  Value: the clamp of OpenCLIP's ``logit_scale.clamp_(0, log(100))``, applied in the
  forward pass. Gradient: ``d t / d s = -t`` below the bound; above it only the part
  that moves ``s`` back under the bound passes (a projected step, so the parameter
  can leave the bound as soon as the loss asks for a smaller scale).
  """
  s = jnp.asarray(log_scale, jnp.float32)
  if max_logit_scale is not None:
    s = _clamp_above(s, math.log(max_logit_scale))
  return jnp.exp(-s)
