"""The options table: one row per keyword option of the losses.

A row holds the option's name, default, trace-time check, traced range, the type a
wrapper attribute holds, its ``Args:`` entry and what its check raises. Everything
else reads it: the chain checks a call's options by walking the table (``check``), the
traced-value checks take their ranges from it (``_checkify.value_checks``), the
docstrings' ``Args:`` and ``Raises:`` sections are assembled from it (``_docs``), and
the wrappers (``classes``, ``nnx``, ``linen``) take their defaults from it. The public
signatures spell the defaults out (for IDEs); tests/test_options.py checks that they
match. Adding an option is one row here plus its use (a family head, the chain).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import jax.numpy as jnp

from memeff_jax import backends
from memeff_jax._validation import (Backend, check_axis, check_config, check_dims,
                                    check_finite, check_flag, check_partition, check_range,
                                    check_tau_plus, check_temperature, check_weights,
                                    check_where)
from memeff_jax.config import KernelConfig
from memeff_jax.config.matryoshka import per_dim_choice


class Call(NamedTuple):
  """What a trace-time check may look at: one call's sizes and arrays, and the options
  checked before it (rows run in table order)."""

  n: int                        # local batch
  d: int                        # feature size
  dtype: Any                    # the glue's dtype: fp32, fp64 for fp64 features
  arrays: tuple                 # (name, array or None) pairs, shapes and dtypes checked
  backend: str                  # ``backend`` as passed
  got: dict                     # name -> checked value of the rows before this one


class Range(NamedTuple):
  """A traced value's range: ``ok(v)`` elementwise, and what the message says must hold."""

  ok: Callable[[Any], Any]
  what: str


@dataclasses.dataclass(frozen=True)
class Option:
  """One keyword option of the losses."""

  name: str
  default: Any
  doc: str                                       # the ``Args:`` entry
  check: Callable[[Any, Call], Any] | None = None   # trace time: the value the chain uses
  traced: Range | None = None                    # a traced value's range (None: not traced)
  type: Any = Any                                # what a wrapper's attribute holds
  raises: tuple[tuple[type, str], ...] = ()      # the ``Raises:`` fragments of ``check``


def _flag(name: str, default: bool, doc: str) -> Option:
  return Option(name, default, doc, check=lambda v, c: check_flag(name, v), type=bool,
                raises=((TypeError, "non-bool flags"),))


def _unit(name: str, doc: str) -> Option:
  """A Python float or a traced array in [0, 1)."""
  return Option(name, 0.0, doc, check=lambda v, c: check_range(name, v, 0.0, 1.0),
                traced=Range(lambda v: (v >= 0) & (v < 1), "in [0, 1)"), type=float,
                raises=((ValueError, f"``{name}`` outside [0, 1)"),))


def _weights(v, c: Call):
  dims = c.got["matryoshka_dims"]
  if dims is None:
    if v is not None:
      raise ValueError(f"matryoshka_weights needs matryoshka_dims, got "
                       f"matryoshka_weights={v!r} and matryoshka_dims=None")
    return (1.0,)
  return check_weights("matryoshka_weights", v, len(dims), c.dtype)


def _per_dim(v, c: Call) -> bool:
  """Whether the blocks run one per Matryoshka dim (``config.matryoshka.per_dim_choice``:
  the keyword, else the backend's default or a config choosing otherwise)."""
  v = check_flag("matryoshka_per_dim", v, allow_none=True)
  if c.got["matryoshka_dims"] is None:
    if v is not None:
      raise ValueError(f"matryoshka_per_dim needs matryoshka_dims, got "
                       f"matryoshka_per_dim={v!r} and matryoshka_dims=None")
    return False
  be = c.got["backend"]
  if isinstance(be, backends.DenseBackend):   # the dense reference runs no blocks: same loss
    return False
  default = be.default_config(c.d, c.arrays[0][1].dtype).matryoshka_per_dim
  return per_dim_choice(v, c.got["config"], default)


def _normal_with_inverse(t):
  """A traced temperature's range, as a Python one's (``check_temperature_range``): t
  and 1 / t normal numbers of t's dtype (at least fp32). Outside it 1 / t or the
  logits overflow or go subnormal, and a loss could come out finite beside NaN
  gradients."""
  t = jnp.asarray(t, jnp.promote_types(jnp.result_type(t), jnp.float32))
  tiny = jnp.finfo(t.dtype).tiny
  return (t >= tiny) & (t <= 1 / tiny)


# Rows in the order the chain checks them (an error names the first bad option).
TABLE = (
    Option("temperature", 0.07, """float > 0 or a traced 0-d float array (learnable: it gets a
      gradient, and a new value never recompiles). Default {default}. A Python float
      above 1 warns: a logit scale s (OpenCLIP, sentence-transformers) is
      ``temperature = 1 / s``.""",
           check=lambda v, c: check_temperature(v, c.dtype),
           traced=Range(_normal_with_inverse, "> 0 and, with 1 / temperature, a normal "
                                              "number of its dtype"), type=float,
           raises=((ValueError, "``temperature <= 0`` or it or its inverse not a normal "
                                "number of the compute dtype, or not 0-d"),
                   (TypeError, "a ``temperature`` that is no float"))),
    Option("tau_plus", 0.0, """debiasing prior in [0, 1) (Chuang et al.); a Python 0.0 is the
      plain loss; a [batch] array (numpy or jax) gives per-row priors and a 0-d array
      one traced prior, both always debias (docs/math.md §7.1). Needs negatives: a
      global batch of 1 without hard negatives raises.""",
           check=lambda v, c: check_tau_plus(v, c.n, c.dtype),
           traced=Range(lambda v: (v >= 0) & (v < 1), "in [0, 1)"), type=float,
           raises=((ValueError, "``tau_plus`` outside [0, 1), not [batch], or without "
                                "negatives"),
                   (TypeError, "a ``tau_plus`` that is no float"))),
    Option("where", None, """optional bool [batch] mask (numpy or jax; inside a ring this device's
      [local batch]): the rows to keep. A removed row is gone entirely: not an anchor,
      not a candidate, not in the mean nor in ``stable``'s B, so the loss equals the
      loss of the kept rows alone and the removed rows' gradients are exactly zero. For
      padded last batches under jit and uneven shards (:func:`memeff_jax.sharded`
      pads and masks by itself). Its ``lse_row`` / ``lse_col`` entries are 0; no kept
      row at all gives a NaN loss and zero gradients (docs/math.md §7.6).""",
           check=lambda v, c: check_where(v, c.n),
           raises=((ValueError, "a ``where`` that is not [batch]"),
                   (TypeError, "a ``where`` that is not a bool array"))),
    _unit("label_smoothing", """in [0, 1): ``F.cross_entropy``'s smoothed targets over the
      softmax's nominal candidates (docs/math.md §7.2)."""),
    Option("lse_square_scale", 0.0, """z-loss weight >= 0: adds ``lse_square_scale * mean(lse^2)``,
      lse the natural log of each softmax's denominator (docs/math.md §7.3).""",
           check=lambda v, c: check_range("lse_square_scale", v, 0.0, float("inf"), c.dtype),
           traced=Range(lambda v: jnp.isfinite(v) & (v >= 0), "finite and >= 0"), type=float,
           raises=((ValueError, "``lse_square_scale`` < 0, or not finite in the compute dtype"),)),
    Option("matryoshka_dims", None, """fused Matryoshka: strictly increasing positive ints ending
      at the feature size d (any ladder, e.g. (64, 128, 256, 512) or (16, 72, 200)).
      The loss becomes ``sum_k w_k L_k``, L_k this loss on the renormalized first
      m_k features (every prefix renormalized, the last too), every option applied
      per dim (docs/math.md §8): on a GPU as one plain block per dim, else in one
      pass over the features (``matryoshka_per_dim``). None: off.""",
           check=lambda v, c: None if v is None else check_dims("matryoshka_dims", v, c.d,
                                                                last_equals_d=True),
           type=tuple[int, ...] | None,
           raises=((ValueError, "bad ``matryoshka_dims`` / ``matryoshka_weights``"),
                   (TypeError, "non-int ``matryoshka_dims``, non-number "
                               "``matryoshka_weights``"))),
    Option("matryoshka_weights", None, """one float per Matryoshka dim (default 1.0 each; not
      normalized). Needs ``matryoshka_dims``.""", check=_weights,
           type=tuple[float, ...] | None),
    _flag("normalized_inputs", False, """skip the L2 normalization (otherwise computed in fp32,
      fp64 for fp64 inputs, and rounded once to the input dtype; docs/math.md §2).
      Matryoshka prefixes are renormalized either way."""),
    _flag("stable", True, """multiply the whole gradient (the temperature's too) by sqrt(B t), B
      the global batch, t held constant in the factor; the value is unchanged. Default
      True, as in memeff; ``stable=False`` gives ``jax.grad`` of the value
      (docs/math.md §7.5)."""),
    _flag("deterministic", False, """accepted and changes nothing: every backend is
      deterministic already (no atomics, fixed reduction orders)."""),
    Option("backend", "auto", """"auto" (Triton on a GPU where jax-triton imports, else blockwise;
      on a GPU without the kernels it warns once, naming why), "triton", "interpret"
      (the Triton kernels under Triton's CPU interpreter), "blockwise" (pure JAX, any
      platform) or "reference" (dense, O(B^2) memory).
      float64 features (with ``jax_enable_x64``) run in float64 on "blockwise" and
      "reference" ("auto" picks blockwise); the Triton kernels take fp16, bf16 and
      fp32, and have first-order gradients only (no ``vmap``, no grad-of-grad).""",
           # The backend object (None: the dense reference).
           check=lambda v, c: backends.resolve(v, c.arrays[0][1].dtype,
                                               c.arrays[0][1].shape), type=Backend,
           raises=((ValueError, "an unknown backend"),
                   (ValueError, "a symbolic array size (``jax.export``) on a backend other "
                    "than \"reference\""),
                   (TypeError, "float64 on the Triton backends"))),
    Option("config", None, """optional :class:`memeff_jax.KernelConfig` (tiles, precision of fp32
      dots); None picks :func:`memeff_jax.default_config`. Not with
      ``backend="reference"``, which runs no kernels.""",
           check=lambda v, c: check_config(v, c.backend), type=KernelConfig | None,
           raises=((ValueError, "a ``config`` with ``backend=\"reference\"``"),
                   (TypeError, "a ``config`` that is not a KernelConfig"))),
    Option("matryoshka_per_dim", None, """how fused Matryoshka runs, same loss (docs/math.md
      §8.1): True, one plain block per dim on that dim's renormalized prefixes (copies,
      sum(m_k) / d of each tower; one plain ring per dim); False, one block whose
      feature walk serves every dim (O(K batch) extra; one ring trip). None: the
      backend's default: True on a GPU for 16-bit inputs and for fp32 up to a padded d
      of 256, else False ("blockwise", "interpret"). Needs ``matryoshka_dims``; the
      dense "reference" ignores it. Replaces ``KernelConfig.algorithm.matryoshka_per_dim``
      (deprecated: with None here, a config whose value differs from the backend's
      default still decides, with a DeprecationWarning).""",
           check=_per_dim, type=bool | None,
           raises=((ValueError, "``matryoshka_per_dim`` without ``matryoshka_dims`` or "
                                "contradicting the config's field"),
                   (TypeError, "a ``matryoshka_per_dim`` that is no bool or None"))),
    Option("axis_name", None, """inside ``jax.shard_map`` (``check_vma=True``, JAX's default):
      the mesh axis (or tuple of axes) the batch is sharded over. The arrays are this
      device's contiguous shard; every device returns the global loss, and the
      gradients are the local rows of the global loss's gradient (docs/math.md §9).
      ``shared_negatives`` are this device's shard of the global columns too; a traced
      0-d temperature (bias, margin, ``tau_plus``) is one value on every device
      (replicated). :func:`memeff_jax.sharded` does this for global arrays.""",
           check=lambda v, c: check_axis(v, *c.arrays, mask=c.got.get("where")) or v,
           type=Hashable | None,
           raises=((ValueError, "an unbound ``axis_name``, replicated arrays or a 0-d "
                                "option that varies over it, or ``check_vma=False``"),)),
    # Qwen3's own options (the flags, the partition, then the margin).
    _flag("use_qq_negatives", False,
          """add the other queries to row i's candidates (q-q block)."""),
    _flag("use_dd_negatives", False, """add the other documents, compared with d_i, to row i's
      candidates (d-d block; with ``shared_negatives``, those too)."""),
    _flag("use_dq_negatives", False, """add every query compared with d_i, q_i included (its
      pair with d_i then counts twice in the denominator), to row i's candidates (d-q
      block: sentence-transformers' doc_to_query, GTE's third group). With
      ``partition="per_direction"`` it is a softmax of its own instead."""),
    _flag("share_hard_negatives", False, """the hard negatives as sentence-transformers lays them
      out: every row's are candidates of every row (global columns in a ring; d_i's
      d-d candidates exclude its own row's, and the d-q group has none), instead of
      row i's k competing in row i only; without hard negatives it changes nothing."""),
    Option("partition", "joint", """"joint": one softmax per row over every group (default);
      "per_direction": the q->d softmax (with the hard and shared negatives) and, with
      ``use_dq_negatives``, a d->q softmax over the queries, averaged
      (sentence-transformers' ``partition_mode``; no q-q or d-d groups there; without
      ``use_dq_negatives`` it is the joint softmax, as there).""",
           check=lambda v, c: check_partition(v, c.got.get("use_qq_negatives"),
                                              c.got.get("use_dd_negatives")), type=str,
           raises=((ValueError, "an unknown ``partition`` or q-q / d-d groups with "
                                "``partition=\"per_direction\"``"),)),
    Option("margin", 0.1, """>= 0 (float or 0-d array), raw-cosine units: an entry of row i is
      dropped as a presumed false negative iff its similarity exceeds
      s(q_i, d_i) + margin + 2^-10 (a tie tolerance: an exact duplicate of the
      positive is kept), with row i's threshold on every group (docs/math.md §6).
      For unit-norm inputs margin >= 2 disables the mask. Default 0.1.""",
           check=lambda v, c: check_range("margin", v, 0.0, None),
           traced=Range(lambda v: v >= 0, ">= 0 (not NaN)"), type=float,
           raises=((ValueError, "``margin < 0``"),)),
    # SigLIP's own option.
    Option("bias", -10.0, """the logit bias b (float or traced 0-d array, learnable: it gets a
      gradient): the logits are ``s / t + b``. Default -10.0, big_vision's
      initialization.""",
           check=lambda v, c: check_finite("bias", v, c.dtype),
           traced=Range(jnp.isfinite, "finite"), type=float,
           raises=((ValueError, "a ``bias`` not finite in the compute dtype"),
                   (TypeError, "a ``bias`` that is no float or 0-d array"))),
)
OPTIONS = {o.name: o for o in TABLE}

# Defaults of a family that differ from the table's (the loss's name -> option -> default).
FAMILY_DEFAULTS = {"siglip_loss": {"temperature": 0.1}}

# The keywords every loss takes, in signature order; families add their own (margin, ...).
SHARED = ("temperature", "normalized_inputs", "stable", "tau_plus", "label_smoothing",
          "lse_square_scale", "matryoshka_dims", "matryoshka_weights", "matryoshka_per_dim",
          "where", "axis_name", "backend", "deterministic", "config")


def check(values: dict, call: Call) -> dict:
  """Every option in ``values`` (name -> as passed) checked in table order: name ->
  the value the chain uses."""
  for opt in TABLE:
    if opt.name in values:
      v = values[opt.name]
      call.got[opt.name] = v if opt.check is None else opt.check(v, call)
  return call.got


def traced(names: Sequence[str]) -> tuple[str, ...]:
  """The options among ``names`` that may be traced values with a range, in table order."""
  return tuple(o.name for o in TABLE if o.traced is not None and o.name in names)


def defaults(names: Sequence[str], family: str | None = None) -> dict:
  """The defaults of ``names`` (``family``: a loss's name, for its own defaults)."""
  own = FAMILY_DEFAULTS.get(family, {})
  return {name: own.get(name, OPTIONS[name].default) for name in names}
