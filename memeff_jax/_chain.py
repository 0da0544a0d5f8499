"""The loss layer's shared chain: every public loss is a ``Family`` (which arrays, which
are locked, and a ``head`` that builds its negatives' statistics) run through ``run``.

The chain, once for every family: validate, pick the backend, lock towers, normalize,
build the Matryoshka prefix tables (and, with one block per dim, each dim's renormalized
prefixes), upcast one fp32 copy per array for the O(B D) glue, call the family's head,
turn each softmax direction into loss terms (debiasing in the log domain), add label
smoothing and the z-loss per Matryoshka dim, weight the dims, apply ``stable``. Without
``matryoshka_dims`` everything runs with one "dim" (K = 1) and no renormalization, so
each option is written once (docs/math.md §3, §7, §8).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
from typing import Callable, NamedTuple, ParamSpec

import jax
import jax.numpy as jnp
from jax import lax

from memeff_jax import _checkify, _compat, _options, _terms, _validation
from memeff_jax._core import BlockSpec, block_lse
from memeff_jax._reduction import SOFTMAX, Reduction
from memeff_jax._terms import (MARGIN_TIE, ContrastiveStats, as_scale, global_sum, in_dtype,
                               normalize, is_zero, poison, poison_flag, pow2_scale, ring_size,
                               stable_scale, taint, upcast)
from memeff_jax.backends.base import DenseBackend

_P = ParamSpec("_P")
# Set (at trace time) while a loss function (``value_only``) runs its ``*_with_stats``
# twin: the stats are thrown away, so the kernels skip the in-batch accuracy's maxima.
_LOSS_ONLY = contextvars.ContextVar("memeff_jax_loss_only", default=False)
SHARED = _options.SHARED


class Tower(NamedTuple):
  """One feature array as the glue sees it."""

  v: jax.Array                  # normalized, input dtype: what the kernels read
  v32: jax.Array                # its fp32 copy, fp64 for fp64 (cotangents sum there, round once)
  tab: jax.Array | None         # [K, ...rows] prefix inverse norms (Matryoshka), else None
  pre: tuple | None = None      # one block per dim: each dim's renormalized prefixes
  pre32: tuple | None = None    # and their fp32 copies (the glue's: cotangents round once)
  mask_repeat: int | None = 1   # ``where`` on its rows: each batch row's entry repeated
                                # (a hard negatives' run); None: not batch rows, all kept


class Ctx(NamedTuple):
  """Static and traced context of one call, handed to the family's head."""

  scale: jax.Array              # 1 / t, 0-d, fp32 (fp64 for fp64 features)
  batch: int | jax.Array        # global batch B (with ``where``: the rows kept, traced)
  dims: tuple[int, ...] | None  # Matryoshka dims (None: one plain "dim")
  spec: Callable[..., BlockSpec]   # BlockSpec factory with backend, ring axis, config
  axis_name: object
  mask: jax.Array | None = None    # ``where``: bool [n], this device's kept rows

  def gsum(self, v):
    return global_sum(v, self.axis_name)

  def sims(self, a: Tower, b: Tower, axis: str = "id,id->i") -> jax.Array:
    """[K, ...] similarities of paired rows, per prefix dim (fp32 glue); with one block
    per dim, from the blocks' own rounded prefixes (the positives and the margin's
    thresholds round as the blocks' similarities do)."""
    if a.pre is not None:
      return jnp.stack([jnp.einsum(axis, u, w, precision=lax.Precision.HIGHEST)
                        for u, w in zip(a.pre32, b.pre32)])
    return _prefix_dots(a, b, self.dims, axis)

  def block(self, x: Tower, y: Tower | None, row_thr=None, bias=None, **spec) -> tuple:
    """(lse_row, lse_col, max_row, max_col) of a kernel block, each [K, rows] (the column
    ones None unless two_sided); ``spec`` may name the ``reduction`` (and its ``bias``)."""
    if row_thr is not None and self.dims is None:
      row_thr = row_thr[0]
    y_mask = None if (y is None or self.mask is None) else (
        jnp.ones(y.v.shape[:1], bool) if y.mask_repeat is None else
        jnp.repeat(self.mask, y.mask_repeat))
    if x.pre is not None:   # one plain block per dim, on its renormalized prefixes
      outs = [block_lse(xk, None if y is None else y.pre[k], self.scale,
                        None if row_thr is None else row_thr[k], None, None, self.mask, y_mask,
                        bias, spec=self.spec(dims=None, **spec)) for k, xk in enumerate(x.pre)]
      return tuple(None if o[0] is None else jnp.stack(o) for o in zip(*outs))
    # 16-bit prefix blocks take fp32 rows and give fp32 gradients: in float16 a zero
    # row's tables (1e12) scale its gradient beyond float16, and in both a short
    # prefix's gradient is mostly along the prefix, which normalization's gradient then
    # cancels, so rounding it first loses the rest (docs/math.md §2).
    wide = self.dims is not None and jnp.dtype(x.v.dtype).itemsize == 2
    v = lambda t: None if t is None else (t.v32 if wide else t.v)
    out = block_lse(v(x), v(y), self.scale, row_thr, x.tab, None if y is None else y.tab,
                    self.mask, y_mask, bias, spec=self.spec(
                        dims=self.dims, cast=x.v.dtype if wide else None, **spec))
    return tuple(None if o is None else (o if self.dims else o[None]) for o in out)

  def row_sum(self, v: jax.Array) -> jax.Array:
    """Global sum over the kept rows (the last axis) of a per-row quantity."""
    return self.gsum(jnp.sum(v if self.mask is None else jnp.where(self.mask, v, 0), axis=-1))

  def tower_sum(self, t: Tower) -> jax.Array:
    """[K, D] global sum of the unit (prefix) rows, zero past each dim."""
    if self.dims is None:
      return self.gsum(jnp.sum(t.v32, axis=0))[None]
    d = t.v32.shape[-1]
    if t.pre is not None:   # the blocks' own rounded prefixes, as ``sims`` reads them
      s = jnp.stack([jnp.pad(jnp.sum(p, axis=0), (0, d - p.shape[-1])) for p in t.pre32])
      return self.gsum(s)
    s = jnp.einsum("kn,nd->kd", t.tab, t.v32, precision=lax.Precision.HIGHEST)
    return self.gsum(s * _prefix_mask(self.dims, d))

  def self_sum(self, t: Tower) -> jax.Array:
    """[K] global sum of the unit (prefix) rows' squared norms."""
    return self.gsum(jnp.sum(self.sims(t, t), axis=-1))


class Head(NamedTuple):
  """What a family adds: its directions' statistics and its smoothing targets."""

  lse_neg: list                 # per direction: [K, n] log-sum-exp over the kept negatives
                                # (the reduction's statistic: ctx.block(..., reduction=))
  max_neg: list                 # per direction: [K, n] their largest logit (-inf if none)
  pos: jax.Array                # [K, n] the positive's similarity
  n_neg: int | list             # nominal negatives N per softmax (C = N + 1 candidates);
                                # a list: one per direction
  cross: Callable[[], jax.Array]   # [K] sum over rows of every candidate's similarity,
                                   # positives included (label smoothing's A); a list
                                   # per direction where n_neg is one
  reduction: Reduction = SOFTMAX   # turns each direction into its loss terms (.term)
  bias: jax.Array | None = None    # the reduction's logit bias (the sigmoid's), or None


@dataclasses.dataclass(frozen=True)
class Family:
  """A loss family: its arrays, its locked ones, its head and its dense reference."""

  name: str
  arrays: tuple[str, ...]           # positional names; the third (if any) is optional
  locked: tuple[int, ...]           # indices of arrays under stop_gradient
  head: Callable[..., Head]         # head(ctx, towers, **family_options)
  reference: Callable               # reference *_with_stats
  options: tuple[str, ...] = ()     # the family's own keywords (rows of the options table)
  shared: tuple[str, ...] = SHARED  # the shared keywords it takes (the others: defaults)
  stats: Callable | None = None     # stats(pieces) -> its stats; None: ContrastiveStats
  negatives: bool = False           # takes ``shared_negatives=`` (columns of every row;
                                    # locked with the second array)


@_compat.standard_numpy
def run(family: Family, **kwargs) -> tuple[jax.Array, ContrastiveStats]:
  """The chain for one call of a public ``*_with_stats`` loss (its ``locals()``).

  Reverse mode only (``jax.grad``, ``vjp``, ``jacrev``; ``hessian`` where the backend
  allows): the statistics are a ``jax.custom_vjp``, and JAX's forward-mode error is
  re-raised naming the loss (backend='reference' has none and takes jvp, but for float16
  features, whose normalization saturates its cotangent in a custom VJP)."""
  try:
    return _run(family, **kwargs)
  except TypeError as e:
    if "forward-mode autodiff" not in str(e):
      raise
    raise TypeError(
        f"{family.name} does not support forward-mode differentiation (jax.jvp, "
        f"jax.jacfwd): its gradient is a custom VJP (reverse mode: jax.grad, jax.vjp, "
        f"jax.jacrev). For a Jacobian use jax.jacrev; for a JVP, backend='reference' on "
        f"features other than float16") from e


def _run(family: Family, **o) -> tuple[jax.Array, ContrastiveStats]:
  arrays = [_validation.as_array(o.pop(a)) for a in family.arrays]
  shared = _validation.as_array(o.pop("shared_negatives")) if family.negatives else None
  if set(o) != set(family.shared + family.options):   # o: the options as passed
    raise TypeError(f"internal: {family.name} options {sorted(o)} != "
                    f"{sorted(family.shared + family.options)}")
  o.update(_options.defaults([k for k in SHARED if k not in family.shared]))
  n, d = _validation.check_towers(family.arrays[:2], *arrays[:2])
  _validation.check_devices(list(zip(family.arrays, arrays)) + [("shared_negatives", shared)]
                            + list(o.items()))
  if len(arrays) > 2 and arrays[2] is not None:
    _validation.check_hard_negatives(arrays[2], n, d, arrays[0].dtype)
  if shared is not None:
    _validation.check_shared_negatives(shared, d, arrays[0].dtype)
  acc = _terms.glue_dtype(arrays[0].dtype)
  # Every option checked by its row of the options table, in the table's order.
  named = tuple(zip(family.arrays, arrays)) + (
      (("shared_negatives", shared),) if shared is not None else ())
  opt = _options.check(o, _options.Call(n=n, d=d, dtype=acc, arrays=named,
                                        backend=o["backend"], got={}))
  temperature, tau, mask = opt["temperature"], opt["tau_plus"], opt["where"]
  tau_plus = _validation.as_array(o["tau_plus"])
  if mask is not None:
    # A removed row is zeros from here on (whatever it held: padding, NaN): its
    # gradient is exactly zero and it adds nothing to any sum; the kernels drop it.
    arrays = [None if a is None else jnp.where(mask.reshape((n,) + (1,) * (a.ndim - 1)), a, 0)
              for a in arrays]
    if jnp.ndim(tau_plus) == 1:
      tau_plus, tau = jnp.where(mask, tau_plus, 0), jnp.where(mask, tau, 0)
  eps, z_scale = opt["label_smoothing"], opt["lse_square_scale"]
  dims, weights = opt["matryoshka_dims"], opt["matryoshka_weights"]
  be, config, axis_name = opt["backend"], opt["config"], opt["axis_name"]
  _validation.check_replicated(axis_name, {k: opt[k] for k in _options.traced(SHARED +
                                                                             family.options)})
  own = {k: opt[k] for k in family.options}
  if isinstance(be, DenseBackend):   # backend="reference": the family's dense oracle
    given = dict(stable=o["stable"], tau_plus=tau_plus, label_smoothing=o["label_smoothing"],
                 lse_square_scale=o["lse_square_scale"])
    if shared is not None:
      own["shared_negatives"] = shared
    return be.dense_loss(family.reference, arrays, dims=dims, weights=weights,
                         axis_name=axis_name, **own, temperature=temperature,
                         **{k: v for k, v in given.items() if k in family.shared}, where=mask,
                         normalized_inputs=o["normalized_inputs"])

  if len(arrays) > 2 and arrays[2] is not None and arrays[2].shape[1] == 0:
    arrays[2] = None                                   # k = 0 hard negatives: none
  arrays = [lax.stop_gradient(a) if (i in family.locked and a is not None) else a
            for i, a in enumerate(arrays)]
  if shared is not None and shared.shape[0] == 0:
    shared = None                                      # N = 0 shared negatives: none
  if shared is not None and 1 in family.locked:
    shared = lax.stop_gradient(shared)
  # Traced values cannot raise: out of range or non-finite, they poison the loss and
  # its gradients with NaN (below); inside checkify_checks, checkify names them.
  used = dict(opt, tau_plus=tau_plus)   # the prior as given (masked), not its fp32 copy
  hyper = {k: used[k] for k in _options.traced(SHARED + family.options)}
  arrays.append(shared)   # (last: the shared negatives, or None)
  ok = _checkify.value_checks(dict(zip(family.arrays + ("shared_negatives",), arrays)), hyper)
  c = poison_flag(ok, axis_name)
  if c is not None:   # the feature arrays' NaN gradients; poison (below) does the rest
    arrays = [None if a is None else taint(a, c) for a in arrays]
  raw = list(arrays)
  scales = [None] * len(arrays)
  if not o["normalized_inputs"]:
    arrays = [None if a is None else normalize(a) for a in arrays]
  elif dims is not None:   # every prefix is renormalized: each row times a power of two
    # (exact, no change to the loss) keeps its prefix norms and dots in range
    scales = [None if a is None else pow2_scale(a) for a in arrays]
    arrays = [None if a is None else a * s for a, s in zip(arrays, scales)]
  # One plain block per dim (matryoshka_per_dim, resolved by its row: the keyword, else
  # the backend's default; the blocks' config is passed on as given)
  split = opt["matryoshka_per_dim"]
  towers = [None if a is None else _tower(a, dims, r if split else None, s,
                                          unit_rows=not o["normalized_inputs"])
            for a, r, s in zip(arrays, raw, scales)]
  *towers, shared = towers
  if family.negatives:
    own["shared"] = None if shared is None else shared._replace(mask_repeat=None)
  batch = n * ring_size(axis_name)
  if mask is not None:   # the global batch is the rows kept (traced)
    batch = global_sum(jnp.sum(mask, dtype=acc), axis_name)
  want_max = not _LOSS_ONLY.get()
  ctx = Ctx(scale=as_scale(temperature, acc), batch=batch, dims=dims, axis_name=axis_name,
            spec=functools.partial(BlockSpec, backend=be, axis_name=axis_name, config=config,
                                   want_max=want_max),
            mask=mask)
  head = family.head(ctx, towers, **own)
  # per direction: nominal negatives and label smoothing's A
  n_negs = head.n_neg if isinstance(head.n_neg, list) else [head.n_neg] * len(head.lse_neg)
  crosses = (head.cross if isinstance(head.n_neg, list) else
             lambda: [head.cross()] * len(head.lse_neg))
  late = None
  if mask is None:
    for n_neg in n_negs:
      _validation.check_negatives(tau, n_neg, ctx.batch)
  elif tau is not None:   # known at run time only: no negatives to debias -> NaN
    # (with no kept row at all the loss is NaN and every gradient zero, docs/math.md
    # §7.6, whatever the nominal count then is)
    late = functools.reduce(jnp.logical_and, [n_neg > 0 for n_neg in n_negs]) | (
        ctx.batch == 0)
  pos_logit = ctx.scale * head.pos
  terms = [head.reduction.term(lse, pos_logit, n_neg=n_neg, tau=tau, scale=ctx.scale,
                               bias=head.bias) for lse, n_neg in zip(head.lse_neg, n_negs)]
  per_dim = sum(ctx.row_sum(ell) for ell, _ in terms) / (len(terms) * ctx.batch)
  z = jnp.zeros_like(per_dim)
  if not is_zero(z_scale):
    z = in_dtype(z_scale, acc) * sum(ctx.row_sum(lse * lse) for _, lse in terms) / (
        len(terms) * ctx.batch)
  if not is_zero(eps):
    # Smoothed targets over the C = N + 1 nominal candidates (docs/math.md §7.2):
    # Corr = eps / (B t) * (sum_i s_ii - A / C), alike for every softmax direction.
    # (Removed rows are zeros: they add nothing to A.)
    # With no kept row (B' = 0) the mean above is NaN and these sums are 0: the
    # divisions take at least 1, so that the gradients stay zero (docs/math.md §7.6).
    at_least_1 = (lambda v: v) if mask is None else (lambda v: jnp.maximum(v, 1))
    trace = ctx.row_sum(head.pos)
    per_dim = per_dim + in_dtype(eps, acc) * ctx.scale / at_least_1(ctx.batch) * sum(
        trace - a / at_least_1(n_neg + 1) for a, n_neg in zip(crosses(), n_negs)) / len(n_negs)
  per_dim = per_dim + z
  w = jnp.asarray(weights, acc)
  c_late = poison_flag(late, axis_name)
  loss = poison(jnp.sum(w * per_dim), c, list(hyper.values()), axis_name)
  loss = poison(loss, c_late, raw + list(hyper.values()), axis_name)
  for flag in (c, c_late):   # each dim's loss (a statistic): NaN with the loss
    if flag is not None:
      per_dim = per_dim + lax.stop_gradient(flag).astype(per_dim.dtype)
  loss = stable_scale(loss, stable=o["stable"], batch=ctx.batch, temperature=temperature)
  unk = (lambda v: v) if dims else (lambda v: v[0])
  # In-batch top-1: the positive beats every kept negative by more than the tie
  # tolerance (from the kernels' maxima, whose tiles round apart from the positive's dot;
  # a loss function's call has none and drops the stats).
  beats = lambda mx: pos_logit > lax.stop_gradient(mx) + MARGIN_TIE * ctx.scale
  accuracy = [None if mx is None else
              unk(ctx.row_sum(beats(mx).astype(jnp.float32)) / ctx.batch).astype(jnp.float32)
              for mx in head.max_neg]
  if family.stats is not None:
    return loss, family.stats(ctx=ctx, head=head, terms=terms, per_dim=per_dim,
                              accuracy=accuracy, unk=unk)
  # Removed rows report lse 0.
  lse_stat = lambda lse: unk(lse if mask is None else jnp.where(mask, lse, 0.0))
  stats = ContrastiveStats(
      z_loss=jnp.sum(w * z), lse_row=lse_stat(terms[0][1]),
      lse_col=lse_stat(terms[1][1]) if len(terms) > 1 else None,
      matryoshka_losses=per_dim if dims else None, accuracy_row=accuracy[0],
      accuracy_col=accuracy[1] if len(accuracy) > 1 else None)
  return loss, stats


def pair_head(ctx: Ctx, towers, *, two_sided: bool, shared: Tower | None = None) -> Head:
  """CLIP (two_sided: rows and columns) and LiT (rows): one block, diagonal excluded;
  the positive joins in the log domain. C = B candidates per softmax, and the rows
  also compete with the ``shared`` negative columns (N more: one more block)."""
  x, y = towers
  lse_row, lse_col, max_row, max_col = ctx.block(x, y, two_sided=two_sided, exclude_self=True)
  a = lambda: jnp.sum(ctx.tower_sum(x) * ctx.tower_sum(y), axis=-1)   # <sum x, sum y>
  if shared is None:
    if two_sided:
      return Head([lse_row, lse_col], [max_row, max_col], ctx.sims(x, y), ctx.batch - 1, a)
    return Head([lse_row], [max_row], ctx.sims(x, y), ctx.batch - 1, a)
  lse_s, _, max_s, _ = ctx.block(x, shared)
  lse_row = _terms.masked_lse(jnp.stack([lse_row, lse_s]), True, axis=0)
  max_row = None if max_row is None else jnp.maximum(max_row, max_s)
  n_row = ctx.batch - 1 + shared.v.shape[0] * ring_size(ctx.axis_name)

  def crosses():   # the rows' A also over the shared columns; the columns' without
    sum_x = ctx.tower_sum(x)
    a_xy = jnp.sum(sum_x * ctx.tower_sum(y), axis=-1)
    a_row = a_xy + jnp.sum(sum_x * ctx.tower_sum(shared), axis=-1)
    return [a_row, a_xy] if two_sided else [a_row]

  if two_sided:
    return Head([lse_row, lse_col], [max_row, max_col], ctx.sims(x, y),
                [n_row, ctx.batch - 1], crosses)
  return Head([lse_row], [max_row], ctx.sims(x, y), [n_row], crosses)


def value_only(with_stats: Callable[_P, tuple[jax.Array, ContrastiveStats]], name: str,
               doc: str) -> Callable[_P, jax.Array]:
  """The loss function of a ``*_with_stats`` one: same signature, the loss alone."""

  sig = inspect.signature(with_stats)

  @functools.wraps(with_stats)
  def loss(*args: _P.args, **kwargs: _P.kwargs) -> jax.Array:
    try:   # a bad argument is named with this function's name, not the twin's
      sig.bind(*args, **kwargs)
    except TypeError as e:
      raise TypeError(f"{name}() {e}") from None
    token = _LOSS_ONLY.set(True)
    try:
      return with_stats(*args, **kwargs)[0]
    finally:
      _LOSS_ONLY.reset(token)

  loss.__name__ = loss.__qualname__ = name
  loss.__doc__ = doc
  loss.__signature__ = sig.replace(return_annotation="jax.Array")
  return loss


def _tower(v: jax.Array, dims, raw: jax.Array | None = None, scale: jax.Array | None = None,
           *, unit_rows: bool = True) -> Tower:
  """raw (one block per dim): the array before normalization, whose prefixes are
  renormalized from an fp32 copy, rounded once (``_unit_prefixes``; the K prefixes'
  cotangents sum there and round once); unit_rows: v holds raw's unit rows. scale:
  ``pow2_scale`` of the rows that ``v`` holds scaled by it."""
  # (float16: the cotangent of every use sums in fp32 and rounds once, saturating, as
  # a zero prefix's tables (1e12) scale it beyond float16, docs/math.md §2)
  v32 = upcast(v)
  tab = None if dims is None else _inverse_norms(v32, dims, scale)
  pre = pre32 = None
  if raw is not None:
    pre = tuple(p.astype(v.dtype) for p in _unit_prefixes(upcast(raw), dims, unit_rows))
    pre32 = tuple(p.astype(v32.dtype) for p in pre)
  return Tower(v, v32, tab, pre, pre32)


def _unit_prefixes(raw32, dims, unit_rows: bool) -> tuple:
  """Each dim's prefix u^k = w[:m_k] / max(||w[:m_k]||, 1e-12) of the rows w after
  docs/math.md §2 (unit_rows: w = raw / max(||raw||, 1e-12), else w = raw), as the one
  block's tables form it, clamp included, but from raw: u^k = raw[:m_k] /
  max(||raw[:m_k]||, 1e-12 max(||raw||, 1e-12)) with unit_rows (the same quotient), so
  no unit copy of the rows is made. Norms on the rows times ``pow2_scale`` (exact)."""
  s = pow2_scale(raw32)
  r = raw32 * s
  floor = 1e-12 * s[..., 0]                           # 1e-12 in raw's units
  if unit_rows:                                       # times max(||raw||, 1e-12)
    sq_row = jnp.sum(r * r, axis=-1)
    row_big = jnp.sqrt(sq_row) > floor
    floor = 1e-12 * jnp.where(row_big, jnp.sqrt(jnp.where(row_big, sq_row, 1.0)), floor)
  out = []
  for m in dims:
    p = r[..., :m]
    sq = jnp.sum(p * p, axis=-1, keepdims=True)
    big = jnp.sqrt(sq) > floor[..., None]
    out.append(p / jnp.where(big, jnp.sqrt(jnp.where(big, sq, 1.0)), floor[..., None]))
  return tuple(out)


def flat(t: Tower) -> Tower:
  """[n, k, D] hard negatives as n k columns, row i's k in a run."""
  r = lambda a: None if a is None else a.reshape((-1,) + a.shape[2:])
  each = lambda ps: None if ps is None else tuple(map(r, ps))
  tab = None if t.tab is None else t.tab.reshape(t.tab.shape[0], -1)
  return Tower(r(t.v), r(t.v32), tab, each(t.pre), each(t.pre32), mask_repeat=t.v.shape[1])


def pick(t: Tower, j: int) -> Tower:
  """Hard negative j of every row ([n, k, D] -> [n, D]): a tower of batch rows."""
  each = lambda ps: None if ps is None else tuple(p[:, j] for p in ps)
  return Tower(t.v[:, j], t.v32[:, j], None if t.tab is None else t.tab[:, :, j],
               each(t.pre), each(t.pre32))


def _segments(dims, v):
  """Per-segment sums of ``v`` [..., D] over the features [m_{k-1}, m_k), cumulated
  into prefix sums: [K, ...]."""
  segs = [jnp.sum(v[..., lo:hi], axis=-1) for lo, hi in zip((0,) + dims[:-1], dims)]
  return jnp.cumsum(jnp.stack(segs), axis=0)


def _inverse_norms(v32, dims, scale=None):
  """[K, ...] a_k = 1 / max(||v[:m_k]||, 1e-12), differentiable (the renormalization's
  Jacobian then comes from autodiff through these tables; docs/math.md §8.2). scale
  ([..., 1], a power of two): ``v32`` holds the rows v times it, and a_k = 1 /
  max(||v32[:m_k]||, 1e-12 scale), so that v32 a_k is v's prefix clamped at its own norm
  (as ``normalize`` clamps; 1 / (1e-12 scale) capped at the largest finite value)."""
  sq = _segments(dims, v32 * v32)
  if scale is None:
    big = sq > 1e-24
    return jnp.where(big, lax.rsqrt(jnp.where(big, sq, 1.0)), 1e12)
  s = scale[..., 0].astype(v32.dtype)
  big = jnp.sqrt(sq) > 1e-12 * s
  floor = jnp.minimum(1e12 / s, jnp.finfo(v32.dtype).max)
  return jnp.where(big, lax.rsqrt(jnp.where(big, sq, 1.0)), floor)


def _prefix_dots(a: Tower, b: Tower, dims, eq: str) -> jax.Array:
  """[K, ...] <a, b> over each prefix, times both tables (the prefix cosines)."""
  if dims is None:
    return jnp.einsum(eq, a.v32, b.v32, precision=lax.Precision.HIGHEST)[None]
  prods = [jnp.einsum(eq, a.v32[..., lo:hi], b.v32[..., lo:hi], precision=lax.Precision.HIGHEST)
           for lo, hi in zip((0,) + dims[:-1], dims)]
  raw = jnp.cumsum(jnp.stack(prods), axis=0)
  ta = a.tab.reshape(a.tab.shape + (1,) * (raw.ndim - a.tab.ndim))
  tb = b.tab.reshape(b.tab.shape + (1,) * (raw.ndim - b.tab.ndim))
  return raw * ta * tb


def _prefix_mask(dims, d):
  return (jnp.arange(d)[None, :] < jnp.asarray(dims)[:, None]).astype(jnp.float32)

