"""Flax Linen loss modules that hold a learnable temperature (and SigLIP's bias).

One module per loss family: :class:`CLIPLoss`, :class:`LiTLoss`, :class:`Qwen3Loss`,
:class:`LiTQwen3Loss`, :class:`SigLIPLoss`. Each declares the parameter ``logit_scale =
log(1 / t)`` (OpenCLIP's), initialized from the ``temperature`` attribute (SigLIPLoss
also ``logit_bias``, from the ``bias`` attribute: big_vision's ``t = 0.1``, ``b =
-10``); every other attribute is a loss option, forwarded to the function at each
call. ``module.apply(variables, x, y)`` is the loss; ``method="with_stats"`` gives
``(loss, stats)`` and ``method="current_temperature"`` the temperature in use.

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

from typing import Any

import jax
import jax.numpy as jnp

from memeff_jax import _compat

try:
  import flax.linen as nn
  from flax.core.scope import Scope
except ImportError as e:   # flax is an extra
  raise _compat.flax_missing(__name__) from e

from memeff_jax._options import OPTIONS, defaults
from memeff_jax._validation import check_flag
from memeff_jax._wrappers import (MAX_LOGIT_SCALE, SPECS, Spec, call_loss, check_max_logit_scale,
                                  check_param_dtype, initial_params, matryoshka_options, module_doc,
                                  module_init_doc, module_methods, module_options_doc,
                                  temperature_from_log_scale)
from memeff_jax.grad_caching import grad_cache

__all__ = ["CLIPLoss", "LiTLoss", "LiTQwen3Loss", "Qwen3Loss", "SigLIPLoss", "grad_cache"]

_LEARNABLE_DOC = """learnable: declare {names} in the ``"params"`` collection. False makes
  {them} constant: no parameter, no gradient."""


def _fields(names, family: str) -> dict:
  """A Linen class body's loss-option attributes: annotations and the table's defaults
  (``family``'s, a loss's name)."""
  return dict(__annotations__={n: OPTIONS[n].type for n in names}, **defaults(names, family))


class _Temperature(nn.Module):
  """The temperature's attributes (the first fields); each family's module adds its loss
  options (``_module``)."""

  temperature: float = OPTIONS["temperature"].default
  learnable: bool = True
  max_logit_scale: float | None = MAX_LOGIT_SCALE
  param_dtype: Any = jnp.float32


class _LossModule(_Temperature):
  """A loss function and its learnable log-scale (and learned options: SigLIP's bias);
  the families differ in their arrays (``_spec``) and options, the fields that follow."""

  _spec = None   # not annotated: a class constant, not a dataclass field

  def __post_init__(self):
    # Bad values raise at construction, as in the NNX modules, not at the first apply.
    check_max_logit_scale(self.max_logit_scale)
    # Warnings for the user's construction (here <- the dataclass's __init__ <- Flax's
    # keyword wrapper <- theirs), not for Flax's clones of it (bound to a scope in init
    # and apply; tabulate's, to None).
    clone = self.parent is None or isinstance(self.parent, Scope)
    self._initial_params(stacklevel=None if clone else 4)
    check_flag("learnable", self.learnable)
    # Kept as the checked tuples, as the NNX modules keep them: a list would leave the
    # module unhashable (jax.jit's static arguments, nn.jit).
    for name, value in zip(("matryoshka_dims", "matryoshka_weights"),
                           matryoshka_options(self.matryoshka_dims, self.matryoshka_weights)):
      object.__setattr__(self, name, value)
    check_flag("matryoshka_per_dim", self.matryoshka_per_dim, allow_none=True)
    super().__post_init__()

  @nn.nowrap   # called in __post_init__, before the module has a scope (tabulate)
  def _initial_params(self, stacklevel: int | None = None) -> dict[str, float]:
    names = ("temperature",) + self._spec.params
    return initial_params(self._spec, {n: getattr(self, n) for n in names},
                          self.max_logit_scale, None if stacklevel is None else stacklevel + 1,
                          check_param_dtype(self.param_dtype))

  def setup(self):
    dtype = check_param_dtype(self.param_dtype)
    for name, init in self._initial_params().items():
      if self.learnable:
        value = self.param(name, nn.initializers.constant(init), (), dtype)
      else:
        value = jnp.asarray(init, dtype)
      setattr(self, name, value)

  def current_temperature(self) -> jax.Array:
    """The temperature the loss uses now: ``exp(-min(logit_scale, log max))``, 0-d in
    ``param_dtype``."""
    return temperature_from_log_scale(self.logit_scale, self.max_logit_scale)

  def _stats(self, *arrays, tau_plus=None, where=None, stats=True) -> Any:
    """``(loss, stats)``, or (``stats=False``) the loss alone: the loss function,
    which skips the in-batch accuracy's work."""
    spec = self._spec
    fn = spec.with_stats if stats else spec.loss
    options = {name: getattr(self, name) for name in spec.forwarded}
    options.update({p: getattr(self, f"logit_{p}") for p in spec.params})
    return call_loss(fn, arrays, temperature=self.current_temperature(), options=options,
                     tau_plus=tau_plus, where=where)


def _module(spec: Spec) -> type:
  """The Linen module of one family: ``apply(variables, arrays)`` and
  ``method="with_stats"``; its loss options are the fields after ``param_dtype``
  (the family's own last), its ``temperature`` field takes the family's default."""
  doc = (module_doc(spec, "``apply", '``method="with_stats"``', "variables, ") +
         module_init_doc(spec, "Attributes", _LEARNABLE_DOC) + module_options_doc(spec))
  name = f"{spec.tag}Loss"
  call, with_stats = module_methods(spec, _LossModule._stats, name)
  # Through Linen's metaclass, with the methods in the body: Linen wraps them there.
  # (``temperature`` redeclared keeps its place, first, with the family's default.)
  return type(_LossModule)(name, (_LossModule,), dict(
      _fields(("temperature",) + spec.module_options, spec.function), __module__=__name__,
      __qualname__=name, __doc__=doc, _spec=spec, __call__=call, with_stats=with_stats))


_CLIP, _LIT, _QWEN3, _LIT_QWEN3, _SIGLIP = SPECS
CLIPLoss = _module(_CLIP)
LiTLoss = _module(_LIT)
Qwen3Loss = _module(_QWEN3)
LiTQwen3Loss = _module(_LIT_QWEN3)
SigLIPLoss = _module(_SIGLIP)
