"""Flax NNX loss modules that hold a learnable temperature (and SigLIP's bias).

One module per loss family: :class:`CLIPLoss`, :class:`LiTLoss`, :class:`Qwen3Loss`,
:class:`LiTQwen3Loss`, :class:`SigLIPLoss`. Each stores the log of the logit scale,
``s = log(1 / t)`` (OpenCLIP's ``logit_scale``), as an ``nnx.Param`` initialized from
``temperature`` (SigLIPLoss also ``logit_bias``, initialized from ``bias``: big_vision's
``t = 0.1``, ``b = -10``), keeps every other loss option given at construction as an
attribute, and takes the arrays at call: ``module(x, y)`` is the loss,
``module.with_stats(x, y)`` the loss and its :class:`memeff_jax.ContrastiveStats`
(:class:`memeff_jax.SigLIPStats`).

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

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp

from memeff_jax import _compat

try:
  from flax import nnx
except ImportError as e:   # flax is an extra
  raise _compat.flax_missing(__name__) from e

from memeff_jax._options import defaults
from memeff_jax._validation import check_flag
from memeff_jax._wrappers import (MAX_LOGIT_SCALE, SPECS, Spec, call_loss, check_max_logit_scale,
                                  check_param_dtype, initial_params, matryoshka_options, module_doc,
                                  module_init_doc, module_methods, module_options_doc,
                                  temperature_from_log_scale)
from memeff_jax.grad_caching import cached_value_and_grad, check_chunk_size

__all__ = ["CLIPLoss", "LiTLoss", "LiTQwen3Loss", "Qwen3Loss", "SigLIPLoss", "grad_cache"]

_LEARNABLE_DOC = """learnable: keep {names} as ``nnx.Param`` (trained by ``nnx.Optimizer(...,
  wrt=nnx.Param)``). False stores {them} as plain ``nnx.Variable``: no gradient, never
  updated."""


class _LossModule(nnx.Module):
  """A loss function and its learnable log-scale (and learned options: SigLIP's bias);
  the families differ in their arrays (``_spec``) and options."""

  _spec: Spec

  def __init__(self, *, learnable: bool = True,
               max_logit_scale: float | None = MAX_LOGIT_SCALE, param_dtype=jnp.float32,
               **options):
    spec = self._spec
    # The loss options: the table's defaults, and only the family's (as a signature would).
    names = ("temperature",) + spec.module_options
    for name in options:
      if name not in names:
        raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword "
                        f"argument {name!r}")
    options = defaults(names, spec.function) | options
    check_flag("learnable", learnable)
    self.max_logit_scale = check_max_logit_scale(max_logit_scale)
    self.param_dtype = dtype = check_param_dtype(param_dtype)
    variable = nnx.Param if learnable else nnx.Variable
    # (the user's frame: here <- the family's __init__ <- nnx's object construction (3))
    for name, init in initial_params(spec, options, self.max_logit_scale, 6, dtype).items():
      setattr(self, name, variable(jnp.asarray(init, dtype)))
    self.learnable = bool(learnable)
    options = {name: options[name] for name in spec.forwarded}
    options["matryoshka_dims"], options["matryoshka_weights"] = matryoshka_options(
        options["matryoshka_dims"], options["matryoshka_weights"])
    check_flag("matryoshka_per_dim", options["matryoshka_per_dim"], allow_none=True)
    for name, value in options.items():
      setattr(self, name, value)

  def current_temperature(self) -> jax.Array:
    """The temperature the loss uses now: ``exp(-min(logit_scale, log max))``, 0-d in
    ``param_dtype``."""
    return temperature_from_log_scale(self.logit_scale[...], self.max_logit_scale)

  def _stats(self, *arrays, tau_plus=None, where=None, stats=True) -> Any:
    """``(loss, stats)``, or (``stats=False``) the loss alone: the loss function,
    which skips the in-batch accuracy's work."""
    spec = self._spec
    fn = spec.with_stats if stats else spec.loss
    options = {name: getattr(self, name) for name in spec.forwarded}
    options.update({p: getattr(self, f"logit_{p}")[...] for p in spec.params})
    return call_loss(fn, arrays, temperature=self.current_temperature(), options=options,
                     tau_plus=tau_plus, where=where)


def _module(spec: Spec) -> type:
  """The NNX module of one family: ``module(arrays)`` and ``module.with_stats(arrays)``."""
  doc = (module_doc(spec, "Call it as ``module", "``module.with_stats(...)``") +
         module_init_doc(spec, "Args", _LEARNABLE_DOC) + module_options_doc(spec))
  name = f"{spec.tag}Loss"
  call, with_stats = module_methods(spec, _LossModule._stats, name)

  def __init__(self, **options):
    _LossModule.__init__(self, **options)

  __init__.__qualname__ = f"{name}.__init__"   # (named so in a TypeError's message)
  # The constructor's signature, for help() and inspect: the table's (family's) defaults.
  P = inspect.Parameter
  options = defaults(("temperature",) + spec.module_options, spec.function)
  __init__.__signature__ = inspect.Signature(
      [P("self", P.POSITIONAL_OR_KEYWORD),
       P("temperature", P.KEYWORD_ONLY, default=options.pop("temperature")),
       P("learnable", P.KEYWORD_ONLY, default=True),
       P("max_logit_scale", P.KEYWORD_ONLY, default=MAX_LOGIT_SCALE),
       P("param_dtype", P.KEYWORD_ONLY, default=jnp.float32)] +
      [P(n, P.KEYWORD_ONLY, default=d) for n, d in options.items()])
  # The metaclass of nnx.Module builds the class (a plain type() would skip its __init__).
  return type(_LossModule)(name, (_LossModule,), dict(
      __module__=__name__, __qualname__=name, __doc__=doc, _spec=spec,
      __init__=__init__, __call__=call, with_stats=with_stats))


_CLIP, _LIT, _QWEN3, _LIT_QWEN3, _SIGLIP = SPECS
CLIPLoss = _module(_CLIP)
LiTLoss = _module(_LIT)
Qwen3Loss = _module(_QWEN3)
LiTQwen3Loss = _module(_LIT_QWEN3)
SigLIPLoss = _module(_SIGLIP)


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
    TypeError, ValueError: as :func:`memeff_jax.grad_cache`.
    ValueError: at trace time, ``embed_fn`` adding or removing state (``Module.sow``'s
      intermediates): the chunks are embedded in one loop, whose state keeps its
      structure (``loss_fn`` may sow).

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
      e, new = run(embed_fn, p, st, chunk)
      if jax.tree.structure(new) != jax.tree.structure(st):
        raise ValueError(
            "embed_fn changed the structure of the model's state (a Variable added or "
            "removed, as Module.sow does): grad_cache embeds the chunks in one loop, "
            "whose state keeps its structure; sow from loss_fn, or return such values "
            "with the embeddings")
      return e, new

    loss = lambda p, st, e: run(loss_fn, p, st, e)
    out, grads, state = cached_value_and_grad(embed, loss, params, state, batch,
                                              chunk_size, has_aux)
    nnx.update(model, state)
    return out, grads

  return step
