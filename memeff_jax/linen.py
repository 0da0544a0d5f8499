"""Flax Linen loss modules that hold a learnable temperature.

One module per loss family: :class:`CLIPLoss`, :class:`LiTLoss`, :class:`Qwen3Loss`,
:class:`LiTQwen3Loss`. Each declares the parameter ``logit_scale = log(1 / t)``
(OpenCLIP's), initialized from the ``temperature`` attribute; every other attribute
is a loss option, forwarded to the function at each call. ``module.apply(variables,
x, y)`` is the loss; ``method="with_stats"`` gives ``(loss, stats)`` and
``method="current_temperature"`` the temperature in use.

flax is an optional dependency (in the checkout: ``pip install -e ".[flax]"``); ``import
memeff_jax`` never imports it, this module does::

  from memeff_jax import linen as mlinen

With the default ``stable=True`` every gradient, the temperature's included, is
scaled by ``sqrt(B t)`` (docs/math.md §7.5).

Example:
  >>> import jax
  >>> from memeff_jax import linen as mlinen
  >>> kx, ky = jax.random.split(jax.random.key(0))
  >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
  >>> loss_fn = mlinen.CLIPLoss(temperature=0.07, backend="blockwise")
  >>> variables = loss_fn.init(jax.random.key(1), x, y)
  >>> grads = jax.grad(lambda v: loss_fn.apply(v, x, y))(variables)
  >>> bool(grads["params"]["logit_scale"] != 0)
  True

Large batches: :func:`grad_cache` (the functional :func:`memeff_jax.grad_cache`,
re-exported here) takes the parameters as one pytree, so a ``TrainState`` holds the
towers' and the loss module's together and dropout keys come from the step's ``rng``
(docs/math.md §11). Mutable collections (``batch_stats``) are not threaded through
the chunks: towers with BatchNorm belong in :func:`memeff_jax.nnx.grad_cache`::

  >>> import flax.linen as nn, optax
  >>> from flax.training import train_state
  >>> class Tower(nn.Module):
  ...   @nn.compact
  ...   def __call__(self, x, train=True):
  ...     return nn.Dense(8)(nn.Dropout(0.1, deterministic=not train)(x))
  >>> image, text = Tower(), Tower()
  >>> batch = {"img": x, "txt": y}
  >>> params = {"image": image.init(jax.random.key(2), x, train=False)["params"],
  ...           "text": text.init(jax.random.key(3), y, train=False)["params"],
  ...           "loss": variables["params"]}
  >>> def embed(p, chunk, key):
  ...   k1, k2 = jax.random.split(key)
  ...   return {"img": image.apply({"params": p["image"]}, chunk["img"], rngs={"dropout": k1}),
  ...           "txt": text.apply({"params": p["text"]}, chunk["txt"], rngs={"dropout": k2})}
  >>> def loss(p, e):
  ...   return loss_fn.apply({"params": p["loss"]}, e["img"], e["txt"])
  >>> step = mlinen.grad_cache(embed, loss, chunk_size=4)
  >>> state = train_state.TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-3))
  >>> @jax.jit
  ... def train_step(state, batch, rng):
  ...   value, grads = step(state.params, batch, jax.random.fold_in(rng, state.step))
  ...   return state.apply_gradients(grads=grads), value
  >>> state, value = train_step(state, batch, jax.random.key(4))
  >>> int(state.step)
  1
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

import memeff_jax
from memeff_jax._validation import check_flag
from memeff_jax._wrappers import (MAX_LOGIT_SCALE, call_loss, check_max_logit_scale,
                                  initial_log_scale, matryoshka_options,
                                  temperature_from_log_scale)
from memeff_jax.backends.registry import BackendName as Backend
from memeff_jax.config import KernelConfig
from memeff_jax.grad_caching import grad_cache


__all__ = ["CLIPLoss", "LiTLoss", "LiTQwen3Loss", "Qwen3Loss", "grad_cache"]

# Attributes that are not loss options (Linen's own, and the temperature's).
_NOT_OPTIONS = frozenset({"parent", "name", "temperature", "learnable", "max_logit_scale"})

_ATTRS_DOC = """
  Attributes:
    temperature: initial temperature (the fixed one if ``learnable=False``), a
      Python float > 0. Default 0.07 (CLIP's init).
    learnable: declare ``logit_scale = log(1 / t)`` as a parameter (collection
      ``"params"``). False uses a constant instead: no parameter, no gradient.
    max_logit_scale: upper bound on ``1 / t`` (t >= 1 / max_logit_scale), OpenCLIP's
      clamp at 100 by default; None for no bound. The forward pass uses the clamped
      value; above the bound the parameter only receives gradients that bring it back.
    normalized_inputs, stable, tau_plus, label_smoothing, lse_square_scale,
    matryoshka_dims, matryoshka_weights, axis_name, backend, deterministic, config:
      the loss options, forwarded unchanged to :func:`memeff_jax.{fn}` at every call
      (the Matryoshka ones only when set).{extra}
"""

_QWEN3_EXTRA = """
    margin, use_qq_negatives{dd}: the Qwen3 options (same defaults as the function)."""


class _LossModule(nn.Module):
  """A loss function and its learnable log-scale; the families differ in their arrays."""

  temperature: float = 0.07
  learnable: bool = True
  max_logit_scale: float | None = MAX_LOGIT_SCALE
  normalized_inputs: bool = False
  stable: bool = True
  tau_plus: float = 0.0
  label_smoothing: float = 0.0
  lse_square_scale: float = 0.0
  matryoshka_dims: tuple[int, ...] | None = None
  matryoshka_weights: tuple[float, ...] | None = None
  axis_name: Hashable | None = None
  backend: Backend = "auto"
  deterministic: bool = False
  config: KernelConfig | None = None

  _function = ""   # not annotated: a class constant, not a dataclass field

  def __post_init__(self):
    # Bad values raise at construction, as in the NNX modules, not at the first apply.
    initial_log_scale(self.temperature)
    check_flag("learnable", self.learnable)
    check_max_logit_scale(self.max_logit_scale)
    matryoshka_options(self.matryoshka_dims, self.matryoshka_weights)
    super().__post_init__()

  def setup(self):
    init = initial_log_scale(self.temperature)
    if self.learnable:
      self.logit_scale = self.param("logit_scale", nn.initializers.constant(init), (),
                                    jnp.float32)
    else:
      self.logit_scale = jnp.asarray(init, jnp.float32)

  def current_temperature(self) -> jax.Array:
    """The temperature the loss uses now: ``exp(-min(logit_scale, log max))``, f32 0-d."""
    return temperature_from_log_scale(self.logit_scale, self.max_logit_scale)

  def _stats(self, *arrays, tau_plus, where=None, stats=True) -> Any:
    """``(loss, stats)``, or (``stats=False``) the loss alone: the loss function,
    which skips the in-batch accuracy's work."""
    fn = getattr(memeff_jax, self._function + ("_with_stats" if stats else ""))
    options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in _NOT_OPTIONS}
    return call_loss(fn, arrays, temperature=self.current_temperature(), options=options,
                     tau_plus=tau_plus, where=where)


class CLIPLoss(_LossModule):
  """:func:`memeff_jax.clip_loss` with a learnable temperature (docs/math.md §4, §7.4).

  ``apply(variables, image_features, text_features, tau_plus=None, where=None)``: the loss, a
  float32 scalar; ``method="with_stats"``: ``(loss, stats)``. A per-call ``tau_plus``
  (a float or a per-row ``[batch]`` array) overrides the attribute; ``where`` (a bool
  ``[batch]`` mask) removes rows, as for the functions.
  """

  _function = "clip_loss"

  def __call__(self, image_features: ArrayLike, text_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of ``[batch, d]`` image and text features: a float32 scalar."""
    return self._stats(image_features, text_features, tau_plus=tau_plus, where=where, stats=False)

  def with_stats(self, image_features: ArrayLike, text_features: ArrayLike, *,
                 tau_plus: ArrayLike | None = None,
                 where: ArrayLike | None = None):
    """``(loss, stats)`` as :func:`memeff_jax.clip_loss_with_stats` returns them."""
    return self._stats(image_features, text_features, tau_plus=tau_plus, where=where)


class LiTLoss(_LossModule):
  """:func:`memeff_jax.lit_loss` with a learnable temperature (docs/math.md §5, §7.4).

  ``apply(variables, text_features, image_features, tau_plus=None, where=None)``: the text tower
  (first) is trained, the image tower locked. ``method="with_stats"``: ``(loss, stats)``.
  """

  _function = "lit_loss"

  def __call__(self, text_features: ArrayLike, image_features: ArrayLike, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of ``[batch, d]`` text (trained) and image (locked) features."""
    return self._stats(text_features, image_features, tau_plus=tau_plus, where=where, stats=False)

  def with_stats(self, text_features: ArrayLike, image_features: ArrayLike, *,
                 tau_plus: ArrayLike | None = None,
                 where: ArrayLike | None = None):
    """``(loss, stats)`` as :func:`memeff_jax.lit_loss_with_stats` returns them."""
    return self._stats(text_features, image_features, tau_plus=tau_plus, where=where)


class _Qwen3Module(_LossModule):
  margin: float = 0.1
  use_qq_negatives: bool = False

  def __call__(self, query_features: ArrayLike, doc_features: ArrayLike,
               hard_negatives: ArrayLike | None = None, *,
               tau_plus: ArrayLike | None = None,
               where: ArrayLike | None = None) -> jax.Array:
    """The loss of ``[batch, d]`` queries and documents and optional ``[batch, k, d]``
    hard negatives: a float32 scalar."""
    return self._stats(query_features, doc_features, hard_negatives,
                       tau_plus=tau_plus, where=where, stats=False)

  def with_stats(self, query_features: ArrayLike, doc_features: ArrayLike,
                 hard_negatives: ArrayLike | None = None, *,
                 tau_plus: ArrayLike | None = None,
                 where: ArrayLike | None = None):
    """``(loss, stats)`` as the ``*_with_stats`` function returns them."""
    return self._stats(query_features, doc_features, hard_negatives, tau_plus=tau_plus, where=where)


class Qwen3Loss(_Qwen3Module):
  """:func:`memeff_jax.qwen3_loss` with a learnable temperature (docs/math.md §6, §7.4).

  ``apply(variables, query_features, doc_features, hard_negatives=None,
  tau_plus=None, where=None)``; ``method="with_stats"``: ``(loss, stats)``.
  """

  use_dd_negatives: bool = False

  _function = "qwen3_loss"


class LiTQwen3Loss(_Qwen3Module):
  """:func:`memeff_jax.lit_qwen3_loss` with a learnable temperature (docs/math.md §6,
  §7.4): the queries are trained, documents and hard negatives locked.

  ``apply(variables, query_features, doc_features, hard_negatives=None,
  tau_plus=None, where=None)``; ``method="with_stats"``: ``(loss, stats)``.
  """

  _function = "lit_qwen3_loss"


for _cls, _extra in ((CLIPLoss, ""), (LiTLoss, ""),
                     (Qwen3Loss, _QWEN3_EXTRA.format(dd=", use_dd_negatives")),
                     (LiTQwen3Loss, _QWEN3_EXTRA.format(dd=""))):
  _cls.__doc__ += _ATTRS_DOC.format(fn=_cls._function, extra=_extra)
