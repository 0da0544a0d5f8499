"""Flax NNX loss modules that hold a learnable temperature.

One module per loss family: :class:`CLIPLoss`, :class:`LiTLoss`, :class:`Qwen3Loss`,
:class:`LiTQwen3Loss`. Each stores the log of the logit scale, ``s = log(1 / t)``
(OpenCLIP's ``logit_scale``), as an ``nnx.Param`` initialized from ``temperature``,
keeps every other loss option given at construction as an attribute, and takes the
arrays at call: ``module(x, y)`` is the loss, ``module.with_stats(x, y)`` the loss
and its :class:`memeff_jax.ContrastiveStats`.

flax is an optional dependency (in the checkout: ``pip install -e ".[flax]"``); ``import
memeff_jax`` never imports it, this module does::

  from memeff_jax import nnx as mnnx

The temperature's gradient is the one of the function (docs/math.md §7.4), times the
chain rule ``d t / d s = -t``; with the default ``stable=True`` every gradient,
this one included, is scaled by ``sqrt(B t)`` (docs/math.md §7.5).

Example:
  >>> import jax, optax
  >>> from flax import nnx
  >>> from memeff_jax import nnx as mnnx
  >>> loss_fn = mnnx.CLIPLoss(temperature=0.07, backend="blockwise")
  >>> optimizer = nnx.Optimizer(loss_fn, optax.sgd(0.1), wrt=nnx.Param)
  >>> kx, ky = jax.random.split(jax.random.key(0))
  >>> x = jax.random.normal(kx, (8, 16)); y = jax.random.normal(ky, (8, 16))
  >>> grads = nnx.grad(lambda m: m(x, y))(loss_fn)
  >>> _ = optimizer.update(loss_fn, grads)
  >>> bool(loss_fn.current_temperature() != 0.07)
  True
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import ArrayLike

import memeff_jax
from memeff_jax._validation import check_flag
from memeff_jax._wrappers import (MAX_LOGIT_SCALE, call_loss, check_max_logit_scale,
                                  initial_log_scale, matryoshka_options,
                                  temperature_from_log_scale)
from memeff_jax.backends.registry import BackendName as Backend
from memeff_jax.config import KernelConfig
from memeff_jax.grad_caching import cached_value_and_grad, check_chunk_size


__all__ = ["CLIPLoss", "LiTLoss", "LiTQwen3Loss", "Qwen3Loss", "grad_cache"]

_INIT_DOC = """
  Args:
    temperature: initial temperature (the fixed one if ``learnable=False``), a
      Python float > 0. Default 0.07 (CLIP's init).
    learnable: keep ``logit_scale = log(1 / t)`` as an ``nnx.Param`` (trained by
      ``nnx.Optimizer(..., wrt=nnx.Param)``). False stores it as a plain
      ``nnx.Variable``: no gradient, never updated.
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


class _LossModule(nnx.Module):
  """A loss function and its learnable log-scale; the families differ in their arrays."""

  _function: str = ""
  _options: tuple[str, ...] = ("normalized_inputs", "stable", "tau_plus", "label_smoothing",
                               "lse_square_scale", "matryoshka_dims", "matryoshka_weights",
                               "axis_name", "backend", "deterministic", "config")

  def __init__(self, *, temperature: float = 0.07, learnable: bool = True,
               max_logit_scale: float | None = MAX_LOGIT_SCALE,
               normalized_inputs: bool = False, stable: bool = True,
               tau_plus: float = 0.0, label_smoothing: float = 0.0,
               lse_square_scale: float = 0.0,
               matryoshka_dims: Sequence[int] | None = None,
               matryoshka_weights: Sequence[float] | None = None,
               axis_name: Hashable | None = None, backend: Backend = "auto",
               deterministic: bool = False, config: KernelConfig | None = None):
    check_flag("learnable", learnable)
    log_scale = jnp.asarray(initial_log_scale(temperature), jnp.float32)
    self.logit_scale = nnx.Param(log_scale) if learnable else nnx.Variable(log_scale)
    self.learnable = bool(learnable)
    self.max_logit_scale = check_max_logit_scale(max_logit_scale)
    self.normalized_inputs = normalized_inputs
    self.stable = stable
    self.tau_plus = tau_plus
    self.label_smoothing = label_smoothing
    self.lse_square_scale = lse_square_scale
    self.matryoshka_dims, self.matryoshka_weights = matryoshka_options(matryoshka_dims,
                                                                       matryoshka_weights)
    self.axis_name = axis_name
    self.backend = backend
    self.deterministic = deterministic
    self.config = config

  def current_temperature(self) -> jax.Array:
    """The temperature the loss uses now: ``exp(-min(logit_scale, log max))``, f32 0-d."""
    return temperature_from_log_scale(self.logit_scale[...], self.max_logit_scale)

  def _stats(self, *arrays, tau_plus, where=None, stats=True) -> Any:
    """``(loss, stats)``, or (``stats=False``) the loss alone: the loss function,
    which skips the in-batch accuracy's work."""
    fn = getattr(memeff_jax, self._function + ("_with_stats" if stats else ""))
    options = {name: getattr(self, name) for name in self._options}
    return call_loss(fn, arrays, temperature=self.current_temperature(), options=options,
                     tau_plus=tau_plus, where=where)


class CLIPLoss(_LossModule):
  """:func:`memeff_jax.clip_loss` with a learnable temperature (docs/math.md §4, §7.4).

  Call it as ``module(image_features, text_features, tau_plus=None, where=None)``: the loss, a
  float32 scalar; ``module.with_stats(...)`` returns ``(loss, stats)``. A per-call
  ``tau_plus`` (a float or a per-row ``[batch]`` array) overrides the constructor's;
  ``where`` (a bool ``[batch]`` mask) removes rows, as for the functions.
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

  ``module(text_features, image_features, tau_plus=None, where=None)``: the text tower (first)
  is trained, the image tower locked. ``module.with_stats(...)``: ``(loss, stats)``.
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

  ``module(query_features, doc_features, hard_negatives=None, tau_plus=None, where=None)``;
  ``module.with_stats(...)``: ``(loss, stats)``.
  """

  _function = "qwen3_loss"
  _options = _LossModule._options + ("margin", "use_qq_negatives", "use_dd_negatives")

  def __init__(self, *, margin: float = 0.1, use_qq_negatives: bool = False,
               use_dd_negatives: bool = False, **options):
    super().__init__(**options)
    self.margin = margin
    self.use_qq_negatives = use_qq_negatives
    self.use_dd_negatives = use_dd_negatives


class LiTQwen3Loss(_Qwen3Module):
  """:func:`memeff_jax.lit_qwen3_loss` with a learnable temperature (docs/math.md §6,
  §7.4): the queries are trained, documents and hard negatives locked.

  ``module(query_features, doc_features, hard_negatives=None, tau_plus=None, where=None)``;
  ``module.with_stats(...)``: ``(loss, stats)``.
  """

  _function = "lit_qwen3_loss"
  _options = _LossModule._options + ("margin", "use_qq_negatives")

  def __init__(self, *, margin: float = 0.1, use_qq_negatives: bool = False, **options):
    super().__init__(**options)
    self.margin = margin
    self.use_qq_negatives = use_qq_negatives


for _cls, _extra in ((CLIPLoss, ""), (LiTLoss, ""),
                     (Qwen3Loss, _QWEN3_EXTRA.format(dd=", use_dd_negatives")),
                     (LiTQwen3Loss, _QWEN3_EXTRA.format(dd=""))):
  _cls.__doc__ += _INIT_DOC.format(fn=_cls._function, extra=_extra)


def grad_cache(embed_fn: Callable, loss_fn: Callable, *, chunk_size: int,
               has_aux: bool = False, wrt: Any = nnx.Param) -> Callable:
  """:func:`memeff_jax.grad_cache` for NNX modules: a large-batch step in one chunk's
  encoder memory (docs/math.md §11).

  ``step = grad_cache(embed_fn, loss_fn, chunk_size=c)`` returns ``step(model, batch)
  -> (loss, grads)`` (``((loss, aux), grads)`` with ``has_aux``), equal to
  ``nnx.value_and_grad(plain, argnums=nnx.DiffState(0, wrt))(model)`` with::

    def plain(model):
      E = concatenate([embed_fn(model, chunk_i) for each chunk], axis=0)
      return loss_fn(model, E)

  ``grads`` is the ``nnx.State`` of ``wrt`` (``nnx.Param``) that
  ``nnx.Optimizer.update`` takes. The model's other state is threaded as in ``plain``:
  RNG streams (dropout) advance chunk by chunk and batch statistics are updated once
  per chunk; each chunk's gradient pass replays the state its first pass saw, so its
  dropout masks are the same, and leaves no trace. After the step the model holds the
  state ``plain`` would have left. Put the loss module (its learnable temperature) in
  the model and call it from ``loss_fn``.

  Args:
    embed_fn: ``embed_fn(model, chunk) -> embeddings``, a pytree of ``[rows, ...]``
      arrays for a chunk of ``rows`` rows of ``batch``.
    loss_fn: ``loss_fn(model, embeddings) -> loss`` (``(loss, aux)`` with ``has_aux``)
      over the whole batch's embeddings.
    chunk_size: rows per encoder call, a positive int (the last chunk may be shorter).
    has_aux: ``loss_fn`` returns ``(loss, aux)``.
    wrt: the filter of the state that gets gradients (``nnx.Param``).

  Returns:
    ``step(model, batch)``; use it inside ``nnx.jit``.

  Raises:
    ValueError: as :func:`memeff_jax.grad_cache`.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from flax import nnx
    >>> from memeff_jax import nnx as mnnx
    >>> class DualEncoder(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.image = nnx.Linear(12, 8, rngs=rngs)
    ...     self.text = nnx.Linear(10, 8, rngs=rngs)
    ...     self.drop = nnx.Dropout(0.1, rngs=rngs)
    ...     self.loss = mnnx.CLIPLoss(temperature=0.07, backend="blockwise")
    >>> model = DualEncoder(nnx.Rngs(0, dropout=1))
    >>> optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    >>> step = mnnx.grad_cache(
    ...     lambda m, b: {"img": m.drop(m.image(b["img"])), "txt": m.text(b["txt"])},
    ...     lambda m, e: m.loss(e["img"], e["txt"]), chunk_size=16)
    >>> @nnx.jit
    ... def train_step(model, optimizer, batch):
    ...   loss, grads = step(model, batch)
    ...   optimizer.update(model, grads)
    ...   return loss
    >>> k1, k2 = jax.random.split(jax.random.key(0))
    >>> batch = {"img": jax.random.normal(k1, (40, 12)),
    ...          "txt": jax.random.normal(k2, (40, 10))}
    >>> bool(jnp.isfinite(train_step(model, optimizer, batch)))
    True
  """
  chunk_size = check_chunk_size(chunk_size)

  def step(model, batch):
    graphdef, params, state = nnx.split(model, wrt, ...)

    def run(fn, p, st, arg):   # fn on the merged module, and the state it leaves
      m = nnx.merge(graphdef, p, st, copy=True)   # fresh Variables in this trace
      out = fn(m, arg)
      return out, nnx.split(m, wrt, ...)[2]

    def embed(p, st, chunk, i):
      del i
      return run(embed_fn, p, st, chunk)

    loss = lambda p, st, e: run(loss_fn, p, st, e)
    out, grads, state = cached_value_and_grad(embed, loss, params, state, batch,
                                              chunk_size, has_aux)
    nnx.update(model, state)
    return out, grads

  return step
