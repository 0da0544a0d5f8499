"""Glue shared by the object wrappers (``classes``, ``nnx``, ``linen``) over the losses.

The wrappers are built from one spec per family (``SPECS``: its loss, arrays, own
options, the shared options it takes, those a Flax module learns, and docs) and the
options table (``_options``: every option's default and type), so no wrapper repeats a
loss's signature. Flax-free on purpose: ``memeff_jax.classes`` uses it too, and
importing ``memeff_jax`` must never import flax.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from memeff_jax import clip, lit, qwen3, siglip
from memeff_jax._options import OPTIONS, SHARED, defaults
from memeff_jax._validation import (check_dims, check_finite, check_temperature_range,
                                    check_weights, warn_logit_scale)

# Default bound on the learnable logit scale 1 / t, as OpenCLIP clamps it.
MAX_LOGIT_SCALE = 100.0


# memeff's names of our arrays (its forward's hard_negative_features; the memeff-named
# classes take them).
MEMEFF_ARRAYS = {"hard_negatives": "hard_negative_features"}
# The arrays a call may leave out (None), after the required ones.
OPTIONAL_ARRAYS = ("hard_negatives", *MEMEFF_ARRAYS.values(), "shared_negatives")
_SHARED_DOC = "optional [n, d]: columns every row competes with (docs/math.md §6.1)."


@dataclasses.dataclass(frozen=True)
class Spec:
  """One loss family as the wrappers see it."""

  tag: str                        # class names: MemoryEfficient<tag>Loss, <tag>Loss
  loss: Callable                  # the loss function, and its ``*_with_stats`` twin
  with_stats: Callable
  section: str                    # its docs/math.md section
  arrays: dict[str, str]          # the arrays of a call -> their doc (OPTIONAL_ARRAYS: =None)
  what: str                       # what a call's loss is of
  about: str = ""                 # who is trained, who is locked
  options: tuple[str, ...] = ()   # the family's own options (rows of the options table)
  shared: tuple[str, ...] = SHARED   # the shared options it takes (its _chain.Family's)
  params: tuple[str, ...] = ()    # own options a Flax module learns, as ``logit_<name>``

  @property
  def function(self) -> str:
    return self.loss.__name__

  @property
  def module_shared(self) -> tuple[str, ...]:
    """The shared options a Flax module holds (its temperature is a parameter, ``where``
    is per call), in signature order."""
    return tuple(n for n in self.shared if n not in ("temperature", "where"))

  @property
  def module_options(self) -> tuple[str, ...]:
    """A Flax module's loss-option fields after ``max_logit_scale``: the shared ones,
    then the family's own (a learned one holds its parameter's initial value)."""
    return self.module_shared + self.options

  @property
  def forwarded(self) -> tuple[str, ...]:
    """The module fields passed to the loss as they are at every call."""
    return tuple(n for n in self.module_options if n not in self.params)

  @property
  def call_keywords(self) -> tuple[str, ...]:
    """A call's keywords: a ``tau_plus`` override (where the family takes one), ``where``."""
    return tuple(n for n in ("tau_plus", "where") if n in self.shared)


SPECS = (
    Spec("CLIP", clip.clip_loss, clip.clip_loss_with_stats, "§4",
         {"image_features": "[batch, d], the softmax rows.",
          "text_features": "[batch, d], the softmax columns.",
          "shared_negatives": _SHARED_DOC + " The rows' softmax only."},
         "image and text features"),
    Spec("LiT", lit.lit_loss, lit.lit_loss_with_stats, "§5",
         {"text_features": "[batch, d], trained.", "image_features": "[batch, d], locked.",
          "shared_negatives": _SHARED_DOC + " Locked."},
         "text (trained) and image (locked) features",
         "The first argument (text) is trained; the second (image) is locked and gets an "
         "exact zero gradient (memeff: ``None``)."),
    Spec("Qwen3", qwen3.qwen3_loss, qwen3.qwen3_loss_with_stats, "§6",
         {"query_features": "[batch, d].",
          "doc_features": "[batch, d]; document i is query i's positive.",
          "hard_negatives": "optional [batch, k, d].", "shared_negatives": _SHARED_DOC},
         "queries, documents and optional hard negatives",
         options=qwen3.QWEN3.options),
    Spec("LiTQwen3", qwen3.lit_qwen3_loss, qwen3.lit_qwen3_loss_with_stats, "§6",
         {"query_features": "[batch, d], trained.", "doc_features": "[batch, d], locked.",
          "hard_negatives": "optional [batch, k, d], locked.",
          "shared_negatives": _SHARED_DOC + " Locked."},
         "queries (trained), documents and hard negatives (locked)",
         "Only the queries are trained; documents and hard negatives are locked. No "
         "``use_dd_negatives``.", options=qwen3.LIT_QWEN3.options),
    Spec("SigLIP", siglip.siglip_loss, siglip.siglip_loss_with_stats, "§13",
         {"image_features": "[batch, d], the rows.",
          "text_features": "[batch, d], the columns; text i is image i's positive."},
         "image and text features (one sigmoid per pair)",
         options=siglip.SIGLIP.options, shared=siglip.SIGLIP.shared, params=("bias",)),
)

CALL_DOC = """  tau_plus: per-call override of the constructor's prior: a float, or a
    per-row ``[batch]`` array (inside ``shard_map``: this device's rows).
  where: optional bool ``[batch]`` mask of the rows to keep (padding), as for the
    functions."""


def fill(text: str, indent: str = "  ") -> str:
  """A generated docstring paragraph, wrapped and indented (continuation lines too)."""
  return textwrap.fill(" ".join(text.split()), 88, initial_indent=indent,
                       subsequent_indent=indent)


def module_doc(spec: Spec, call: str, stats: str, first: str = "") -> str:
  """A Flax module's docstring head: what it is and how it is called (``call`` with
  ``first`` and the arrays, ``stats`` for the ``(loss, stats)`` form)."""
  learned = " and ".join(("temperature",) + spec.params)   # "temperature and bias"
  head = fill(f":func:`memeff_jax.{spec.function}` with a learnable {learned} "
              f"(docs/math.md {spec.section}, §7.4).", "  ").lstrip()
  about = f"\n\n{fill(spec.about)}" if spec.about else ""
  arrays = ", ".join(a + ("=None" if a in OPTIONAL_ARRAYS else "") for a in spec.arrays)
  keywords = "".join(f", {k}=None" for k in spec.call_keywords)
  keywords = f", *{keywords}" if keywords else ""   # keyword-only, as in __call__
  tau_plus = ("A per-call ``tau_plus`` (a float or a per-row ``[batch]`` array) overrides "
              "the module's; " if "tau_plus" in spec.call_keywords else "")
  use = fill(f"{call}({first}{arrays}{keywords})``: the loss, a float32 scalar (float64 for "
             f"float64 features); {stats}: "
             f"``(loss, stats)``. {tau_plus}``where`` (a bool ``[batch]`` mask) removes rows, "
             f"as for the functions.")
  return f"{head}{about}\n\n{use}\n"


def module_init_doc(spec: Spec, section: str, learnable: str) -> str:
  """A Flax module's ``section`` (``Args:`` / ``Attributes:``) head: the parameters'
  initial values and ``learnable`` (what True does; ``{names}``: the parameters,
  ``{them}``: a pronoun for them)."""
  t = defaults(["temperature"], spec.function)["temperature"]
  lines = [f"temperature: initial temperature (the fixed one if ``learnable=False``), a Python "
           f"float > 0; the parameter ``logit_scale = log(1 / t)``. Default {t}, the "
           f"function's."]
  lines += [f"{p}: initial {p} (the fixed one if ``learnable=False``), a Python float; the "
            f"parameter ``logit_{p}``. Default {OPTIONS[p].default}, the function's."
            for p in spec.params]
  params = module_params(spec)
  lines.append(learnable.format(names=" and ".join(f"``{n}``" for n in params),
                                them="them" if len(params) > 1 else "it"))
  lines.append(f"param_dtype: the dtype of {' and '.join(f'``{n}``' for n in params)} and "
               f"of the temperature the loss gets: float32 by default, jnp.float64 (with x64) "
               f"for float64 training. Any float dtype, but keep float32 under mixed "
               f"precision: in bfloat16 or float16 an optimizer's small steps round away "
               f"(bfloat16's spacing is 1/64 near log(1 / 0.07)) and the parameter never "
               f"moves.")
  body = "\n".join(textwrap.fill(" ".join(line.split()), 88, initial_indent="    ",
                                 subsequent_indent="      ") for line in lines)
  return f"\n  {section}:\n{body}\n"


def module_params(spec: Spec) -> tuple[str, ...]:
  """A Flax module's parameter names: ``logit_scale``, then ``logit_<name>`` per param."""
  return ("logit_scale",) + tuple(f"logit_{p}" for p in spec.params)


def initial_params(spec: Spec, values: dict[str, Any], max_logit_scale: float | None,
                   stacklevel: int | None, dtype=jnp.float32) -> dict[str, float]:
  """A Flax module's parameters, name -> initial Python float, checked here, from the
  initial ``values`` by option name (the temperature and the spec's params) and the
  module's checked ``max_logit_scale`` and ``param_dtype`` (``dtype``). ``stacklevel``:
  the user's frame, seen from here, for the warnings (None: none, the values were
  checked before)."""
  inits = [initial_log_scale(values["temperature"], max_logit_scale,
                             None if stacklevel is None else stacklevel + 1)]
  inits += [initial_value(p, values[p], dtype) for p in spec.params]
  return dict(zip(module_params(spec), inits))


def check_param_dtype(dtype) -> jnp.dtype:
  """A Flax module's ``param_dtype``: a float dtype (float64 needs x64 enabled, as for
  any Flax parameter; without it JAX stores float32)."""
  try:
    out = None if dtype is None or isinstance(dtype, bool) else jnp.dtype(dtype)
  except TypeError:
    out = None
  if out is None or not jnp.issubdtype(out, jnp.floating):
    raise TypeError(f"param_dtype must be a float dtype (jnp.float32, jnp.float64, ...), "
                    f"got param_dtype={dtype!r}")
  return out


def module_options_doc(spec: Spec) -> str:
  """The loss options' lines of a Flax module's ``Args:`` / ``Attributes:``."""
  own, options = "", [o for o in spec.options if o not in spec.params]
  if options:
    own = "\n" + fill(f"{', '.join(options)}: the family's own options (same defaults "
                       f"as the function).", "    ")
  return f"""    max_logit_scale: upper bound on ``1 / t`` (t >= 1 / max_logit_scale), OpenCLIP's
      clamp at 100 by default; None for no bound. The forward pass uses the clamped
      value; above the bound the parameter only receives gradients that bring it back.
      An initial ``temperature`` below ``1 / max_logit_scale`` raises a ValueError.
{fill(", ".join(spec.module_shared) + f": the loss options, forwarded unchanged to "
      f":func:`memeff_jax.{spec.function}` at every call (the Matryoshka ones only when "
      f"set).", "    ")}{own}
"""


def module_methods(spec: Spec, stats: Callable, owner: str) -> tuple[Callable, Callable]:
  """A Flax module's ``__call__`` (the loss) and ``with_stats`` (``(loss, stats)``), both
  ``call_method``s of ``stats(self, *arrays, stats: bool = True, ...)``."""
  call = call_method(spec, functools.partial(stats, stats=False), "__call__",
                     f"The loss of {spec.what}: a float32 scalar (float64 for float64 "
                     "features).", owner)
  with_stats = call_method(spec, stats, "with_stats", f"``(loss, stats)`` as "
                           f":func:`memeff_jax.{spec.function}_with_stats` returns them.", owner,
                           returns="tuple[jax.Array, ContrastiveStats]")
  return call, with_stats


def call_method(spec: Spec, body: Callable, name: str, doc: str, owner: str,
                returns: str = "jax.Array") -> Callable:
  """The method ``owner.name(self, <spec's arrays>, *, tau_plus=None, where=None)``
  (the family's array names, ``OPTIONAL_ARRAYS`` defaulting to None; its call keywords: no
  ``tau_plus`` for SigLIP) returning ``body(self, *arrays, tau_plus=..., where=...)``.

  Written out and compiled, as ``dataclasses`` writes ``__init__``: a real signature,
  so a bad call raises Python's own TypeError naming the method and the argument.
  """
  arrays = [a + ("=None" if a in OPTIONAL_ARRAYS else "") for a in spec.arrays]
  keywords = spec.call_keywords
  source = (f"def {name}(self, {', '.join(arrays)}, *, "
            f"{', '.join(k + '=None' for k in keywords)}):\n"
            f"  return body(self, {', '.join(spec.arrays)}, "
            f"{', '.join(f'{k}={k}' for k in keywords)})\n")
  # __name__: the wrapper's module (a warning's stacklevel skips memeff_jax's frames)
  namespace = {"body": body, "__name__": getattr(body, "func", body).__module__}
  exec(source, namespace)   # pylint: disable=exec-used
  method = namespace[name]
  method.__qualname__ = f"{owner}.{name}"
  method.__module__ = getattr(body, "func", body).__module__   # the wrapper's module
  method.__doc__ = doc
  method.__annotations__ = {
      **{a: "ArrayLike | None" if a in OPTIONAL_ARRAYS else "ArrayLike" for a in spec.arrays},
      **{k: "ArrayLike | None" for k in keywords}, "return": returns}
  return method


def call_loss(fn: Callable, arrays: tuple, *, temperature, options: dict[str, Any],
              tau_plus=None, where=None):
  """``fn(*arrays, temperature=..., **options)`` with a per-call ``tau_plus`` override
  and a per-call ``where`` mask.

  ``tau_plus=None`` keeps the value in ``options``. The Matryoshka keywords are left
  out while they are None, so a plain loss call never depends on them.
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
  if opts.get("matryoshka_per_dim") is None:
    opts.pop("matryoshka_per_dim", None)
  return fn(*arrays, temperature=temperature, **opts)


def initial_log_scale(temperature: float, max_logit_scale: float | None,
                      stacklevel: int | None) -> float:
  """``log(1 / t)`` of a Python temperature, checked here as the losses check theirs
  (t and 1 / t normal float32 numbers; above 1 it warns): a parameter starts from it.
  One below ``1 / max_logit_scale`` raises: the loss would use the bound instead."""
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
    raise TypeError(f"temperature must be a Python float (the initial value), got "
                    f"{temperature!r}")
  t = check_temperature_range(float(temperature))
  if max_logit_scale is not None and 1.0 / t > max_logit_scale * (1 + 1e-12):
    raise ValueError(f"temperature={t} is below 1 / max_logit_scale = {1.0 / max_logit_scale:.4g}"
                     f": the loss would use {1.0 / max_logit_scale:.4g} from the first step; "
                     f"raise max_logit_scale (or pass None) to start from {t}")
  if stacklevel is not None:
    warn_logit_scale(t, stacklevel + 1)
  return math.log(1.0 / t)


def initial_value(name: str, value: float, dtype=jnp.float32) -> float:
  """A learned option's initial Python value (SigLIP's bias), checked: finite, in the
  parameter's ``dtype`` too, as the losses check theirs."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f"{name} must be a Python float (the initial value), got {value!r}")
  return float(check_finite(name, value, dtype))


def matryoshka_options(dims, weights, names=("matryoshka_dims", "matryoshka_weights"),
                       required: bool = False) -> tuple:
  """``(dims, weights)`` given at construction (a module's ``matryoshka_*`` options, a
  class's ``dims`` / ``weights``: ``names``) as checked tuples, None staying None
  unless ``required``; errors name them. The feature size is checked at the call."""
  if dims is not None or required:
    dims = check_dims(names[0], dims)
  if weights is not None:   # without dims the count is checked at the call
    k = len(dims) if dims is not None else getattr(weights, "__len__", lambda: 0)()
    weights = check_weights(names[1], weights, k)
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

  Value: the upper bound of OpenCLIP's ``logit_scale.clamp_(0, log(100))`` (no lower
  one: ``t`` may pass 1), applied in the forward pass. Gradient: ``d t / d s = -t``
  below the bound; above it only the part that moves ``s`` back under the bound passes
  (a projected step, so the parameter can leave the bound as soon as the loss asks for
  a smaller scale). ``t`` has the log-scale's float dtype (the module's ``param_dtype``).
  """
  s = jnp.asarray(log_scale)
  if not jnp.issubdtype(s.dtype, jnp.floating):
    s = s.astype(jnp.float32)
  if max_logit_scale is not None:
    s = _clamp_above(s, math.log(max_logit_scale))
  return jnp.exp(-s)
