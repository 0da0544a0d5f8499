"""Dense, obviously correct jnp versions of every loss (docs/math.md).

They materialize the [n, c] logits and call ``jax.nn.logsumexp``: O(B^2) memory,
no tricks. Tests, docs and ``backend="reference"`` use them; they define each loss.
``matryoshka`` (the eager wrapper, re-exported) around them is the eager Matryoshka
definition, ``matryoshka_fused`` the fused one.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from memeff_jax._checkify import value_checks
from memeff_jax._compat import standard_numpy
from memeff_jax._terms import (MARGIN_TIE, ContrastiveStats, SigLIPStats, glue_dtype, in_dtype,
                               is_zero, normalize, poison, poison_flag, stable_scale, upcast)
from memeff_jax._validation import (check_dims, check_negatives, check_partition,
                                    check_weights)
from memeff_jax.matryoshka import matryoshka

__all__ = ["clip_loss", "clip_loss_with_stats", "lit_loss", "lit_loss_with_stats", "qwen3_loss",
           "qwen3_loss_with_stats", "lit_qwen3_loss", "lit_qwen3_loss_with_stats",
           "siglip_loss", "siglip_loss_with_stats",
           "matryoshka", "matryoshka_fused", "matryoshka_fused_with_stats", "ContrastiveStats",
           "normalize"]

_HI = lax.Precision.HIGHEST


def _acc(dtype):
  return jnp.promote_types(dtype, jnp.float32)   # fp32 accumulation (fp64 for fp64)


def _sims(u, v):
  # [n, d] @ [d, m] -> [n, m] raw similarities
  return jnp.dot(u, v.T, preferred_element_type=_acc(u.dtype), precision=_HI)


def _scaled_lse(raw, keep, scale):
  """log sum over the kept entries of exp(scale raw), along the last axis, shifted in
  raw units: with m the largest kept raw, scale (raw - m) is exactly 0 at m's entry
  however the product is rounded. (``jax.nn.logsumexp(scale * raw)`` under jit can see
  its maximum and its shifted entries rounded apart, XLA contracting the product into
  an FMA in one fusion and not in the other: at t = 1e-12, 1 / 2 ulp of a logit is
  3e4, and exp overflowed.)"""
  m = lax.stop_gradient(jnp.max(jnp.where(keep, raw, -jnp.inf), axis=-1, keepdims=True))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  z = jnp.where(keep, scale * (raw - m), -jnp.inf)
  return scale * m[..., 0] + jax.nn.logsumexp(z, axis=-1)


def _softmaxes(raw, nominal, keep, is_pos, scale, *, n_neg, tau, eps):
  """Row softmaxes over candidate similarities ``raw`` [n, c].

  nominal: the row's candidate set (the smoothing target's support); keep: the
  candidates that enter the denominator; is_pos: each row's positive.
  Returns (ell [n] incl. smoothing, lse [n] = log Den).
  """
  logits = scale * raw
  pos = jnp.sum(jnp.where(is_pos, logits, 0.0), axis=-1)
  if tau is None:
    lse = _scaled_lse(raw, keep, scale)
  else:
    if isinstance(n_neg, int):   # with ``where`` it is traced (none: NaN, in _finish)
      check_negatives(tau, n_neg, raw.shape[0])
    else:   # (below 1: poisoned, or no kept row, whose gradients stay zero, not 0 * NaN)
      n_neg = jnp.maximum(n_neg, 1)
    tau = in_dtype(tau, logits.dtype)
    # Debiased denominator, Chuang et al. 2020 (M = 1), in unshifted logits:
    # Den = pos + N * max((sum_neg / N - tau * pos) / (1 - tau), exp(-1/t)).
    neg = _scaled_lse(raw, keep & ~is_pos, scale)
    shift = lax.stop_gradient(jnp.maximum(neg, pos))   # keeps exp() in fp32 range
    g = (jnp.exp(neg - shift) / n_neg - tau * jnp.exp(pos - shift)) / (1.0 - tau)
    floor = jnp.exp(-scale - shift)
    lse = shift + jnp.log(jnp.exp(pos - shift) + n_neg * jnp.where(g < floor, floor, g))
  eps = in_dtype(eps, logits.dtype)
  nominal = jnp.broadcast_to(nominal, raw.shape)
  n_cand = jnp.sum(nominal, axis=-1).astype(logits.dtype)
  # Smoothed target (F.cross_entropy convention) over the nominal candidates:
  # T = (1 - eps) [c = pos] + eps / C; a masked candidate keeps its eps / C share.
  target = (1.0 - eps) * is_pos + jnp.where(nominal, eps / n_cand[:, None], 0.0)
  ell = lse - jnp.sum(target * jnp.where(nominal, logits, 0.0), axis=-1)
  return ell, lse


def _mean(v, valid):
  """Mean over the rows (the last axis), or over the kept ones."""
  if valid is None:
    return jnp.mean(v, axis=-1)
  return jnp.sum(jnp.where(valid, v, 0), axis=-1) / jnp.sum(valid, dtype=v.dtype)


def _accuracy(raw, keep, is_pos, scale, valid):
  """In-batch top-1: the fraction of rows whose positive beats every kept negative by
  more than ``MARGIN_TIE`` in similarity (a tie within rounding is a miss)."""
  logits = scale * raw
  pos = jnp.sum(jnp.where(is_pos, logits, 0.0), axis=-1)
  top_neg = jnp.max(jnp.where(keep & ~is_pos, logits, -jnp.inf), axis=-1)
  return lax.stop_gradient(_mean((pos > top_neg + MARGIN_TIE * scale).astype(jnp.float32),
                                 valid))


def _finish(ells, lses, *, batch, temperature, stable, lse_square_scale, arrays, valid,
            no_negatives=None, **hyper):
  """Average the softmax directions (over the kept rows), add the z-loss, apply the
  stable factor.

  Non-finite ``arrays`` (name -> array) or traced hyperparameters out of range make
  the loss and every gradient NaN (``_terms.poison``), as on every backend; so does
  a traced ``no_negatives`` (debiasing with no negatives).
  """
  loss = sum(_mean(e, valid) for e in ells) / len(ells)
  # A Python 0 switches the z-loss off, as on every backend (``is_zero``), so that lse^2
  # overflowing at a tiny temperature cannot give 0 * inf.
  # (a removed row's lse is -inf where no row is kept: squared after the mask, so that
  # its zero cotangent meets no infinite slope)
  z = (jnp.zeros((), loss.dtype) if is_zero(lse_square_scale) else
       in_dtype(lse_square_scale, loss.dtype)
       * sum(_mean(jnp.square(_stat(l, valid)), valid) for l in lses)
       / len(lses))
  hyper.update(temperature=temperature, lse_square_scale=lse_square_scale)
  ok = value_checks(arrays, hyper)
  if no_negatives is not None:
    ok = ~no_negatives if ok is None else ok & ~no_negatives
  loss = poison(loss + z, poison_flag(ok), [*arrays.values(), *hyper.values()])
  loss = stable_scale(loss, stable=stable, batch=batch, temperature=temperature)
  return loss, z


def _rows(where, b, *arrays):
  """(mask or None, the global batch: the kept rows, the arrays with removed rows
  zeroed). ``where``: None or a bool [b] mask."""
  if where is None:
    return None, b, arrays
  where = jnp.asarray(where)
  zero = lambda a: None if a is None else jnp.where(
      where.reshape((b,) + (1,) * (a.ndim - 1)), a, 0)
  return where, jnp.sum(where), tuple(zero(a) for a in arrays)


def _stat(lse, valid):
  return lse if valid is None else jnp.where(valid, lse, 0.0)


def _debias_inputs(tau_plus, valid, n_neg, b):
  """Per-row tau_plus of removed rows set to 0; with a traced n_neg, whether debiasing
  has nothing to debias (poisons the loss): kept rows (b of them) but no negative
  (with none kept, every gradient stays zero, docs/math.md §7.6)."""
  if valid is not None and jnp.ndim(tau_plus) == 1:
    tau_plus = jnp.where(valid, tau_plus, 0.0)
  tau = _tau(tau_plus)
  none = None if (tau is None or isinstance(n_neg, int)) else (n_neg <= 0) & (b > 0)
  return tau_plus, tau, none


def _scale(temperature, x):
  """1 / t in fp32, or in fp64 for fp64 features (float64 oracles)."""
  dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
  return 1.0 / jnp.asarray(temperature, dtype)


def _tau(tau):
  if isinstance(tau, (int, float)):
    return None if tau == 0.0 else float(tau)
  tau = jnp.asarray(tau)
  return lax.stop_gradient(tau.astype(jnp.promote_types(tau.dtype, jnp.float32)))


def _with_shared(s, cols, eye, x, shared):
  """A row direction's candidates with the shared negative columns appended:
  (similarities, candidate mask, positive mask, N)."""
  if shared is None:
    return s, cols, eye, 0
  n, m = s.shape[0], shared.shape[0]
  cols = jnp.broadcast_to(cols, s.shape)
  return (jnp.concatenate([s, _sims(x, shared)], axis=1),
          jnp.concatenate([cols, jnp.ones((n, m), bool)], axis=1),
          jnp.concatenate([eye, jnp.zeros((n, m), bool)], axis=1), m)


def _pair(x, y, shared, *, two_sided, temperature, normalized_inputs, stable, tau_plus,
          label_smoothing, lse_square_scale, where, arrays):
  """CLIP (two_sided) and LiT: the rows' softmax over the columns and the shared
  negatives, and (two_sided) the columns' over the rows."""
  valid, b, (x, y) = _rows(where, x.shape[0], x, y)
  arrays = dict(zip(arrays, (x, y, shared)))
  if not normalized_inputs:
    x, y = normalize(x), normalize(y)
    shared = None if shared is None else normalize(shared)
  scale = _scale(temperature, x)
  s = _sims(x, y)                                   # [b, b]
  eye = jnp.eye(x.shape[0], dtype=bool)
  cols = True if valid is None else valid[None, :]   # the candidates that are there
  raw, cand, pos, m = _with_shared(s, cols, eye, x, shared)
  # (the columns' softmax has the fewer negatives: no negatives to debias there first)
  tau_plus, tau, none = _debias_inputs(tau_plus, valid, b - 1 if two_sided else b - 1 + m, b)
  ells, lses = zip(_softmaxes(raw, cand, cand, pos, scale, n_neg=b - 1 + m, tau=tau,
                              eps=label_smoothing))
  acc = [_accuracy(raw, cand, pos, scale, valid)]
  if two_sided:
    ell_c, lse_c = _softmaxes(s.T, cols, cols, eye, scale, n_neg=b - 1, tau=tau,
                              eps=label_smoothing)
    ells, lses, acc = ells + (ell_c,), lses + (lse_c,), acc + [_accuracy(s.T, cols, eye,
                                                                        scale, valid)]
  loss, z = _finish(list(ells), list(lses), batch=b, temperature=temperature,
                    stable=stable, lse_square_scale=lse_square_scale, arrays=arrays,
                    valid=valid, no_negatives=none, tau_plus=tau_plus,
                    label_smoothing=label_smoothing)
  return loss, ContrastiveStats(z, _stat(lses[0], valid),
                                _stat(lses[1], valid) if two_sided else None,
                                accuracy_row=acc[0], accuracy_col=acc[1] if two_sided else None)


@standard_numpy
def clip_loss_with_stats(image_features, text_features, shared_negatives=None, *,
                         temperature=0.07, normalized_inputs=False, stable=True, tau_plus=0.0,
                         label_smoothing=0.0, lse_square_scale=0.0, where=None):
  """Dense CLIP: 0.5 * (CE(S/t, diag) + CE(S^T/t, diag)) plus options (docs/math.md §4, §7).
  ``where``: bool [b], the rows kept (the others are in no softmax and no mean);
  ``shared_negatives`` [m, d]: more columns of the rows' softmax."""
  return _pair(image_features, text_features, shared_negatives, two_sided=True,
               temperature=temperature, normalized_inputs=normalized_inputs, stable=stable,
               tau_plus=tau_plus, label_smoothing=label_smoothing,
               lse_square_scale=lse_square_scale, where=where,
               arrays=("image_features", "text_features", "shared_negatives"))


def clip_loss(image_features, text_features, shared_negatives=None, **kwargs):
  return clip_loss_with_stats(image_features, text_features, shared_negatives, **kwargs)[0]


@standard_numpy
def lit_loss_with_stats(text_features, image_features, shared_negatives=None, *,
                        temperature=0.07, normalized_inputs=False, stable=True, tau_plus=0.0,
                        label_smoothing=0.0, lse_square_scale=0.0, where=None):
  """Dense LiT: CE(S/t, diag) over rows; the image tower (and the shared negatives)
  locked (docs/math.md §5)."""
  shared = None if shared_negatives is None else lax.stop_gradient(shared_negatives)
  return _pair(text_features, lax.stop_gradient(image_features), shared, two_sided=False,
               temperature=temperature, normalized_inputs=normalized_inputs, stable=stable,
               tau_plus=tau_plus, label_smoothing=label_smoothing,
               lse_square_scale=lse_square_scale, where=where,
               arrays=("text_features", "image_features", "shared_negatives"))


def lit_loss(text_features, image_features, shared_negatives=None, **kwargs):
  return lit_loss_with_stats(text_features, image_features, shared_negatives, **kwargs)[0]


def _qwen3(q, d, h, shared, *, temperature, margin, use_qq, use_dd, use_dq, partition,
           share_hard, normalized_inputs, stable, tau_plus, label_smoothing, lse_square_scale,
           where):
  n = q.shape[0]
  valid, b, (q, d, h) = _rows(where, n, q, d, h)
  arrays = dict(query_features=q, doc_features=d, hard_negatives=h, shared_negatives=shared)
  if not normalized_inputs:
    q, d = normalize(q), normalize(d)
    h = None if h is None else normalize(h)
    shared = None if shared is None else normalize(shared)
  k = 0 if h is None else h.shape[1]
  m = 0 if shared is None else shared.shape[0]
  spread = None
  if k and share_hard:   # every row's hard negatives, row i's k in a run: columns of all
    spread, k = h.reshape(n * k, -1), 0
    runs = jnp.repeat(jnp.ones((n,), bool) if valid is None else valid, h.shape[1])[None, :]
    own = jnp.repeat(jnp.eye(n, dtype=bool), h.shape[1], axis=1)   # d_i's own run
  scale = _scale(temperature, q)
  cols = jnp.ones((n, n), bool) if valid is None else jnp.broadcast_to(valid[None, :], (n, n))
  eye = jnp.eye(n, dtype=bool)
  not_self = cols & ~eye                               # q-q / d-d exclude the self pair
  s_qd = _sims(q, d)
  joint = partition == "joint"
  # Row i: [ q_i.d_j | q_i.s_l | q_i.q_j (j != i) | d_i.d_j (j != i) | d_i.s_l |
  #          d_i.q_j (every j: joint) | q_i.h_ik ]
  blocks, nominal, dup = [s_qd], [cols], [jnp.zeros((n, n), bool)]

  def add(sims, nom, copy=False):   # a group: similarities, candidates, positive's copies
    blocks.append(sims)
    nominal.append(nom)
    dup.append(eye if copy else jnp.zeros(sims.shape, bool))
  if m:
    add(_sims(q, shared), jnp.ones((n, m), bool))
  if spread is not None:
    add(_sims(q, spread), jnp.broadcast_to(runs, own.shape))
  if use_qq:
    add(_sims(q, q), not_self)
  if use_dd:
    add(_sims(d, d), not_self)
    if m:
      add(_sims(d, shared), jnp.ones((n, m), bool))
    if spread is not None:
      add(_sims(d, spread), runs & ~own)
  if use_dq and joint:   # d_i.q_i is the positive's logit once more
    add(_sims(d, q), cols, copy=True)
  if k:
    add(jnp.einsum("id,ikd->ik", q, h, preferred_element_type=_acc(q.dtype), precision=_HI),
        jnp.ones((n, k), bool))
  raw, nominal = jnp.concatenate(blocks, axis=-1), jnp.concatenate(nominal, axis=-1)
  dup = jnp.concatenate(dup, axis=-1)
  pos = jnp.diagonal(s_qd)
  # raw cosine units, no gradient; non-strict, with the tie tolerance: drop only
  # s > pos + margin + MARGIN_TIE
  threshold = lax.stop_gradient(pos + margin + MARGIN_TIE)
  keep = nominal & (raw <= threshold[:, None])
  is_pos = jnp.zeros(raw.shape, bool).at[:, :n].set(eye)
  n_neg = (b - 1) * (1 + int(use_qq) + int(use_dd)) + k + m * (1 + int(use_dd))
  n_neg = n_neg + (b if use_dq and joint else 0)
  if spread is not None:
    n_neg = n_neg + h.shape[1] * (b + int(use_dd) * (b - 1))
  per_dir = use_dq and not joint      # d_i's own softmax over the queries
  tau_plus, tau, none = _debias_inputs(tau_plus, valid, b - 1 if per_dir else n_neg, b)
  ell, lse = _softmaxes(raw, nominal, keep, is_pos, scale, n_neg=n_neg, tau=tau,
                        eps=label_smoothing)
  # (the positive's second copy is no rival of the in-batch accuracy)
  ells, lses, acc = [ell], [lse], [_accuracy(raw, keep & ~dup, is_pos, scale, valid)]
  if per_dir:
    s_dq = _sims(d, q)
    keep_dq = cols & (s_dq <= threshold[:, None])
    ell, lse = _softmaxes(s_dq, cols, keep_dq, eye, scale, n_neg=b - 1, tau=tau,
                          eps=label_smoothing)
    ells, lses = ells + [ell], lses + [lse]
    acc.append(_accuracy(s_dq, keep_dq, eye, scale, valid))
  loss, z = _finish(ells, lses, batch=b, temperature=temperature, stable=stable,
                    lse_square_scale=lse_square_scale, arrays=arrays, valid=valid,
                    no_negatives=none, tau_plus=tau_plus, label_smoothing=label_smoothing,
                    margin=margin)
  return loss, ContrastiveStats(z, _stat(lses[0], valid),
                                _stat(lses[1], valid) if per_dir else None,
                                accuracy_row=acc[0], accuracy_col=acc[1] if per_dir else None)


@standard_numpy
def qwen3_loss_with_stats(query_features, doc_features, hard_negatives=None,
                          shared_negatives=None, *, temperature=0.07, margin=0.1,
                          use_qq_negatives=False, use_dd_negatives=False,
                          use_dq_negatives=False, partition="joint",
                          share_hard_negatives=False, normalized_inputs=False, stable=True, tau_plus=0.0, label_smoothing=0.0,
                          lse_square_scale=0.0, where=None):
  """Dense Qwen3-Embedding InfoNCE with the false-negative mask, the shared negatives,
  the q-q / d-d / d-q groups and the partitions (docs/math.md §6)."""
  check_partition(partition, use_qq_negatives, use_dd_negatives)
  return _qwen3(query_features, doc_features, hard_negatives, shared_negatives,
                temperature=temperature, margin=margin, use_qq=use_qq_negatives,
                use_dd=use_dd_negatives, use_dq=use_dq_negatives, partition=partition,
                share_hard=share_hard_negatives, normalized_inputs=normalized_inputs, stable=stable, tau_plus=tau_plus,
                label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                where=where)


def qwen3_loss(query_features, doc_features, hard_negatives=None, shared_negatives=None,
               **kwargs):
  return qwen3_loss_with_stats(query_features, doc_features, hard_negatives, shared_negatives,
                               **kwargs)[0]


@standard_numpy
def lit_qwen3_loss_with_stats(query_features, doc_features, hard_negatives=None,
                              shared_negatives=None, *, temperature=0.07, margin=0.1,
                              use_qq_negatives=False, use_dq_negatives=False,
                              partition="joint", share_hard_negatives=False,
                              normalized_inputs=False, stable=True,
                              tau_plus=0.0, label_smoothing=0.0, lse_square_scale=0.0,
                              where=None):
  """Dense LiT-Qwen3: documents, hard and shared negatives locked, no d-d group
  (docs/math.md §6)."""
  check_partition(partition, use_qq_negatives, False)
  lock = lambda v: None if v is None else lax.stop_gradient(v)
  return _qwen3(query_features, lock(doc_features), lock(hard_negatives),
                lock(shared_negatives), temperature=temperature, margin=margin,
                use_qq=use_qq_negatives, use_dd=False, use_dq=use_dq_negatives,
                partition=partition, share_hard=share_hard_negatives, normalized_inputs=normalized_inputs, stable=stable,
                tau_plus=tau_plus, label_smoothing=label_smoothing,
                lse_square_scale=lse_square_scale, where=where)


def lit_qwen3_loss(query_features, doc_features, hard_negatives=None, shared_negatives=None,
                   **kwargs):
  return lit_qwen3_loss_with_stats(query_features, doc_features, hard_negatives,
                                   shared_negatives, **kwargs)[0]


@standard_numpy
def siglip_loss_with_stats(image_features, text_features, *, temperature=0.1, bias=-10.0,
                           normalized_inputs=False, stable=True, where=None):
  """Dense SigLIP (docs/math.md §13): ``z = S / t + b``, ``-(1 / B) sum_ij log sigmoid(
  label_ij z_ij)`` with label +1 on the diagonal and -1 elsewhere (big_vision's
  ``sigmoid_loss``), over the kept rows and columns."""
  valid, b, (x, y) = _rows(where, image_features.shape[0], image_features, text_features)
  arrays = dict(image_features=x, text_features=y)
  if not normalized_inputs:
    x, y = normalize(x), normalize(y)
  scale = _scale(temperature, x)
  s = _sims(x, y)
  z = scale * s + jnp.asarray(bias, scale.dtype)
  eye = jnp.eye(x.shape[0], dtype=bool)
  cols = True if valid is None else valid[None, :]
  pos = -jax.nn.log_sigmoid(jnp.diagonal(z))                       # [b]
  neg = jnp.sum(jnp.where(~eye & cols, -jax.nn.log_sigmoid(-z), 0.0), axis=-1)
  loss = _mean(pos + neg, valid)
  ok = value_checks(arrays, dict(temperature=temperature, bias=bias))
  loss = poison(loss, poison_flag(ok), [*arrays.values(), temperature, bias])
  loss = stable_scale(loss, stable=stable, batch=b, temperature=temperature)
  return loss, SigLIPStats(_mean(pos, valid), _mean(neg, valid),
                           accuracy_row=_accuracy(s, cols, eye, scale, valid))


def siglip_loss(image_features, text_features, **kwargs):
  return siglip_loss_with_stats(image_features, text_features, **kwargs)[0]


@standard_numpy
def matryoshka_fused_with_stats(loss_fn: Callable, *features, dims: Sequence[int],
                                weights=None, normalized_inputs=False, shared_negatives=None,
                                **kwargs):
  """Fused Matryoshka semantics (docs/math.md §8.1): ``sum_k w_k loss_fn`` on fp32
  prefix unit vectors, with the per-dim stats stacked.

  The features are normalized once as every loss does (docs/math.md §2; unless
  ``normalized_inputs``), then **every** prefix, the full one included, is
  renormalized in fp32.
  ``dims[-1]`` must equal the feature size; ``shared_negatives`` (a keyword of the
  loss) is cut like the features. ``loss_fn`` is one of this module's
  ``*_with_stats`` losses; returns ``(loss, stats)``, its stats with every field
  stacked per dim (``lse_row`` / ``lse_col`` [K, n]), ``matryoshka_losses`` [K].
  """
  d = features[0].shape[-1]
  dims = check_dims("dims", dims, d, last_equals_d=True)
  weights = check_weights("weights", weights, len(dims), glue_dtype(features[0].dtype))
  # (one fp32 copy each: the prefixes' cotangents sum there and round once, saturating
  # for float16, docs/math.md §2)
  feats = [None if f is None else upcast(f if normalized_inputs else normalize(f))
           for f in features + (shared_negatives,)]
  cut = lambda m: [None if f is None else normalize(f[..., :m]) for f in feats]   # §8.1
  extra = lambda v: {} if shared_negatives is None else {"shared_negatives": v}
  outs = [loss_fn(*cut(m)[:-1], **extra(cut(m)[-1]), normalized_inputs=True, **kwargs)
          for m in dims]
  losses = jnp.stack([loss for loss, _ in outs])
  w = jnp.asarray(weights, losses.dtype)
  stack = lambda name: (None if getattr(outs[0][1], name) is None else
                        jnp.stack([getattr(st, name) for _, st in outs]))
  # Every field stacked per dim; the z-loss weighted and summed (it is in the loss).
  fields = {name: stack(name) for name in outs[0][1]._fields}
  fields["matryoshka_losses"] = losses
  if "z_loss" in fields:
    fields["z_loss"] = jnp.sum(w * fields["z_loss"])
  return jnp.sum(w * losses), type(outs[0][1])(**fields)


def matryoshka_fused(loss_fn: Callable, *features, dims: Sequence[int], weights=None,
                     normalized_inputs=False, **kwargs):
  """The loss of :func:`matryoshka_fused_with_stats` for a loss-only ``loss_fn``."""
  with_stats = lambda *a, **k: (loss_fn(*a, **k), ContrastiveStats(
      jnp.zeros(()), jnp.zeros(()), None))
  return matryoshka_fused_with_stats(with_stats, *features, dims=dims, weights=weights,
                                     normalized_inputs=normalized_inputs, **kwargs)[0]
