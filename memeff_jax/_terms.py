"""Per-softmax algebra shared by every loss: normalization, the (debiased) softmax
term in the log domain, the stable gradient factor, and the stats record.

Everything here is O(batch) plain JAX on statistics the kernels produce.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

_NORM_EPS = 1e-12
# Qwen3's false-negative mask keeps s <= p + margin + MARGIN_TIE (docs/math.md §6): an
# exact duplicate of the positive (s = p in exact math) is kept on every backend, though
# its tile and the positive round differently (fp32 or tf32 GEMM tiles vs the fp32 dot
# of the positive: at most about 2^-10 apart for unit rows). The in-batch accuracy
# counts a hit only for p > s + MARGIN_TIE, so that such a tie is a miss everywhere.
MARGIN_TIE = 2.0**-10


class ContrastiveStats(NamedTuple):
  """Diagnostics returned by the ``*_with_stats`` losses. The fields' float32 is float64
  for float64 features, the accuracies excepted.

  Attributes:
    z_loss: float32 scalar, the z-loss term included in the loss,
      ``lse_square_scale * mean(lse**2)`` (CLIP: the mean of its row and column terms;
      Matryoshka: the weighted sum over the dims).
    lse_row: [n] float32, natural log of each row softmax's denominator in unshifted
      logits, ``log sum_c exp(s_c / t)`` over the candidates it really uses (the
      debiased denominator when ``tau_plus`` is on). Inside a ring: this device's rows.
    lse_col: [n] float32 for CLIP (the column softmaxes, one per text) and for Qwen3's
      d -> q softmaxes with ``partition="per_direction"`` and ``use_dq_negatives``;
      ``None`` for the row-only losses.
    matryoshka_losses: with ``matryoshka_dims``: [K] float32, the unweighted loss of
      each dim (smoothing and z-loss included; the loss is their weighted sum), and
      ``lse_row`` / ``lse_col`` are then [K, n]; ``None`` without dims.
    accuracy_row: float32, the in-batch top-1 accuracy of the row softmaxes: the
      fraction of rows whose positive beats every kept negative by more than
      ``MARGIN_TIE`` (2^-10) in similarity (a tie within rounding, such as a duplicate
      row's, is a miss on every backend; a row with no negative counts as a hit), over
      the global batch. [K] with Matryoshka dims.
    accuracy_col: the same for CLIP's column softmaxes (texts retrieving images) and
      Qwen3's separate d -> q softmaxes; ``None`` for the row-only losses.
  """

  z_loss: jax.Array
  lse_row: jax.Array
  lse_col: jax.Array | None
  matryoshka_losses: jax.Array | None = None
  accuracy_row: jax.Array | None = None
  accuracy_col: jax.Array | None = None


class SigLIPStats(NamedTuple):
  """Diagnostics returned by :func:`siglip_loss_with_stats` (float32 fields: float64 for
  float64 features, the accuracy excepted).

  Attributes:
    loss_positive: float32, the positives' part of the loss,
      ``-(1 / B) sum_i log sigmoid(z_ii)``; [K] with Matryoshka dims (unweighted).
    loss_negative: float32, the negatives' part, ``-(1 / B) sum_{i != j} log
      sigmoid(-z_ij)`` (the loss is the sum of the two); [K] with dims.
    matryoshka_losses: with ``matryoshka_dims``: [K] float32, each dim's loss (the
      loss is their weighted sum); ``None`` without dims.
    accuracy_row: float32, the in-batch top-1 accuracy of the images: the fraction
      of rows whose positive logit beats every kept negative's by more than
      ``MARGIN_TIE`` / t (a tie within rounding is a miss), over the global batch. [K]
      with dims; ``None`` from a call of :func:`siglip_loss`.
  """

  loss_positive: jax.Array
  loss_negative: jax.Array
  matryoshka_losses: jax.Array | None = None
  accuracy_row: jax.Array | None = None


def normalize(v: jax.Array) -> jax.Array:
  """``v / max(||v||, 1e-12)`` along the last axis, rounded once to ``v.dtype``.

  The norm and the quotient are computed in fp32 (fp64 for fp64 inputs), on the row
  scaled by a power of two (``pow2_scale``: exact), so the sum of squares neither
  overflows nor underflows: any finite row gives its unit vector (docs/math.md §2).
  A vector of norm <= 1e-12 is divided by 1e-12 (its gradient is ``g / 1e-12``, no
  radial term, saturated to the input dtype's finite range); the double ``where``
  keeps the gradient of a zero vector finite.
  """
  v32 = upcast(v)
  s = pow2_scale(v32)
  u = v32 * s                                       # exact; max |u| in [0.5, 1)
  sq = jnp.sum(u * u, axis=-1, keepdims=True)
  big = jnp.sqrt(sq) > _NORM_EPS * s                # ||v|| = sqrt(sq) / s > 1e-12
  unit = u / jnp.sqrt(jnp.where(big, sq, 1.0))
  return jnp.where(big, unit, v32 / _NORM_EPS).astype(v.dtype)


def pow2_scale(v: jax.Array) -> jax.Array:
  """[..., 1] a power of two s per row with max |s v| in [0.5, 1) (no gradient): the
  row times s is exact, and its sum of squares stays within range. Clipped to a
  normal, finite s (a row below the dtype's normal range is only scaled up to it)."""
  mx = lax.stop_gradient(jnp.max(jnp.abs(v), axis=-1, keepdims=True))
  _, e = jnp.frexp(mx)                              # mx = f 2^e, f in [0.5, 1); 0 -> e = 0
  fi = jnp.finfo(v.dtype)
  return jnp.ldexp(jnp.ones_like(mx), -jnp.clip(e, fi.minexp + 1, fi.maxexp - 2))


def upcast(v: jax.Array) -> jax.Array:
  """``v`` in the glue dtype (fp32, fp64 for fp64). A float16 array's cotangent is
  rounded back saturating (beyond +-65504: +-65504, not inf), so a zero row's gradient
  ``g / 1e-12`` stays finite; the other dtypes' ranges hold it (and keep forward mode)."""
  return _upcast_f16(v) if v.dtype == jnp.float16 else v.astype(glue_dtype(v.dtype))


@jax.custom_vjp
def _upcast_f16(v):
  return v.astype(jnp.float32)


def _upcast_f16_fwd(v):
  return v.astype(jnp.float32), None


def _upcast_f16_bwd(_, g):
  big = float(jnp.finfo(jnp.float16).max)
  return (jnp.clip(g, -big, big).astype(jnp.float16),)


_upcast_f16.defvjp(_upcast_f16_fwd, _upcast_f16_bwd)


def softmax_terms(lse_neg, pos_logit, *, n_neg: int, tau, scale):
  """One softmax per row: its loss term and its log-denominator, in the log domain.

  Args:
    lse_neg: [n] ``log sum exp(logit)`` over the row's kept negatives (-inf if none).
    pos_logit: [n] the positive's logit ``s_pos / t``.
    n_neg: the nominal negative count N (masked entries keep their place); traced
      with ``where`` (the kept rows set it).
    tau: None for the plain softmax, else the debiasing prior (float or [n]).
    scale: ``1 / t``.

  Returns:
    ``(ell, lse)``: ``ell = log Den - pos_logit`` and ``lse = log Den``, where Den is
    ``pos + sum_neg`` or, debiased (Chuang et al. 2020, M = 1),
    ``pos + N * max((sum_neg / N - tau * pos) / (1 - tau), exp(-1 / t))``.

  With ``u = N * max(g, f) / pos``, ``ell = softplus(log u)``: no ``S - p``
  cancellation, no overflow, and autodiff gives the accurate forms of the
  gradients (``rho - 1 = -u / (1 + u)``).
  """
  if tau is None:
    ell = jax.nn.softplus(lse_neg - pos_logit)            # log(1 + sum_neg / pos)
  else:
    if not isinstance(n_neg, int):
      # A traced count below 1 debiases nothing: the loss is poisoned (B' = 1) or has
      # no row (B' = 0), whose zero gradients must not meet a NaN log(N) as 0 * NaN.
      n_neg = jnp.maximum(n_neg, 1)
    has_neg = lse_neg > -jnp.inf
    d = jnp.where(has_neg, lse_neg - pos_logit, 0.0)     # log(sum_neg / pos)
    # c = N * tau * pos / sum_neg; g <= 0 (so clamped) once c >= 1.
    log_c = jnp.log(n_neg * jnp.asarray(tau, d.dtype)) - d
    ok = has_neg & (log_c < 0)
    c = jnp.exp(jnp.where(ok, log_c, -1.0))
    log_u_g = d + jnp.log1p(-c) - jnp.log1p(-jnp.asarray(tau, d.dtype))  # log(N g / pos)
    log_u_f = jnp.log(jnp.asarray(n_neg, d.dtype)) - scale - pos_logit    # log(N f / pos)
    clamped = ~ok | (log_u_g < log_u_f)                   # strict g < f, docs/math.md §7.1
    ell = jax.nn.softplus(jnp.where(clamped, log_u_f, log_u_g))
  return ell, pos_logit + ell


def is_zero(v) -> bool:
  """A Python 0 switches an optional term off (the z-loss, label smoothing); arrays
  always keep it."""
  return isinstance(v, (int, float)) and v == 0


def in_dtype(v, dtype):
  """An option in the loss's ``dtype``: a Python number stays one (weakly typed); an
  array or a numpy scalar (np.float64 is a float, but not weakly typed) is cast, so
  that a float64 option under x64 leaves a float32 loss float32."""
  return v if type(v) in (int, float) else jnp.asarray(v, dtype)


def stable_scale(loss, *, stable: bool, batch: int, temperature):
  """Value unchanged; gradient (all of it, the temperature's too) times sqrt(B * t).

  ``t`` is held constant inside the factor.
  """
  if not stable:
    return loss
  # (sqrt(B) sqrt(t): B t itself may pass the largest float where the factor does not)
  factor = jnp.sqrt(jnp.asarray(batch, loss.dtype)) * jnp.sqrt(
      lax.stop_gradient(jnp.asarray(temperature, loss.dtype)))
  # (an overflowed loss stays inf: inf - inf would make it NaN)
  return jnp.where(jnp.isfinite(loss),
                   loss + (factor - 1.0) * (loss - lax.stop_gradient(loss)), loss)


def poison(loss, c, inputs, axis_name=None):
  """``loss`` while the flag ``c`` (``poison_flag`` of this device's checks: 0, or NaN
  when a check failed on some device; None: no checks) is 0; else NaN, and NaN
  gradients for every array in ``inputs``.

  ``where(ok, loss, nan)`` would leave the gradients finite (a select passes no NaN
  to the untaken side), so with ``c = 0`` or ``NaN`` the loss gets
  ``c`` added (NaN even when no input is an array) and ``c * sum(v)`` per input, whose
  gradient is ``c`` everywhere. The chain gives the feature arrays their NaN
  gradients through ``taint`` instead (no second cotangent of their size). 0-d inputs
  enter as ``tanh(v)``, finite for an infinite margin (which is in range). Inputs
  under ``stop_gradient`` (locked towers) keep their zero gradient.
  """
  if c is None:
    return loss
  c = c.astype(loss.dtype)
  term = jnp.zeros((), loss.dtype)
  for v in inputs:
    if isinstance(v, (type(None), int, float)) or not jnp.issubdtype(v.dtype, jnp.floating):
      continue
    # (in the loss's dtype: a float64 input under x64 leaves a float32 loss float32)
    term = term + jnp.sum(c * (jnp.tanh(v) if jnp.ndim(v) == 0 else v)).astype(loss.dtype)
  return loss + c + global_sum(term, axis_name)


def poison_flag(ok, axis_name=None):
  """0 (fp32, 0-d) while ``ok`` holds on every device, else NaN; None for None."""
  if ok is None:
    return None
  bad = global_sum(jnp.logical_not(ok).astype(jnp.float32), axis_name)
  return jnp.where(bad == 0, 0.0, jnp.nan)


@jax.custom_vjp
def taint(v, c):
  """``v``, whose cotangent gets ``c`` (``poison_flag``) added: NaN gradients for a
  large input inside its cotangent's own elementwise pass, where ``poison``'s
  ``sum(c * v)`` adds a second cotangent of v's size (+128 MiB of XLA temporaries
  for LiT at B = 65536, D = 512).

  The value is ``v`` selected by ``c`` (XLA folds the select away), so that under
  ``jax.vmap`` with ``c`` batched (a batched temperature) and ``v`` not, the value is
  batched too: each member's cotangent then gets its own ``c``. Returned as ``v``
  itself, the summed cotangent would come back once a member (N times too large)."""
  return jnp.where(jnp.isnan(c), v, v)


def _taint_fwd(v, c):
  return jnp.where(jnp.isnan(c), v, v), c


def _taint_bwd(c, g):
  return g + c.astype(g.dtype), jnp.zeros_like(c)


taint.defvjp(_taint_fwd, _taint_bwd)


def global_sum(v, axis_name):
  """Sum over the ring's devices (identity off the ring)."""
  return v if axis_name is None else lax.psum(v, axis_name)


def as_scale(temperature, dtype=jnp.float32) -> jax.Array:
  """``1 / t`` as a 0-d array in ``dtype`` (the glue's: fp32, fp64 for fp64 features);
  a traced temperature stays differentiable."""
  return 1.0 / jnp.asarray(temperature, dtype)


def glue_dtype(dtype):
  """The dtype of the O(B D) glue and the statistics: fp32, fp64 for fp64 features."""
  return jnp.promote_types(dtype, jnp.float32)


def ring_size(axis_name) -> int:
  return 1 if axis_name is None else lax.axis_size(axis_name)


def log_add_exp(a, b):
  """``jnp.logaddexp``, but where both are -inf the tangent is 0, not NaN (an empty
  softmax merged with an empty tile stays differentiable to second order)."""
  both = (a == -jnp.inf) & (b == -jnp.inf)
  out = jnp.logaddexp(jnp.where(both, 0.0, a), jnp.where(both, 0.0, b))
  return jnp.where(both, -jnp.inf, out)


def masked_lse(z, keep, axis: int = -1):
  """``log sum exp`` over the kept entries; -inf (with zero gradient) where none is."""
  z = jnp.where(keep, z, -jnp.inf)
  mx = lax.stop_gradient(jnp.max(z, axis=axis, keepdims=True))
  any_kept = mx > -jnp.inf
  shift = jnp.where(any_kept, mx, 0.0)
  total = jnp.sum(jnp.where(keep, jnp.exp(z - shift), 0.0), axis=axis, keepdims=True)
  out = jnp.where(any_kept, shift + jnp.log(jnp.where(any_kept, total, 1.0)), -jnp.inf)
  return jnp.squeeze(out, axis)
