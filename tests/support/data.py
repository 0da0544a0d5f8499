"""Test data: every generator the tests share, each written once.

All are deterministic in their seed, so a case draws the same numbers on every run.
"""

import jax
import jax.numpy as jnp
import numpy as np


def unit(v):
  """Rows scaled to unit length (numpy; no epsilon: the generators never draw zeros)."""
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def features(seed, shapes, dtype):
  """Independent standard-normal arrays of ``shapes`` (drawn in float32, then cast)."""
  keys = jax.random.split(jax.random.key(seed), len(shapes))
  return [jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(keys, shapes)]


def towers(b, d, seed=0, *, noise, k=0, hard_noise=1.0, tau_max=None, numpy_tau=False):
  """Paired towers for small API tests: ``x`` standard normal ``[b, d]``, ``y = x +
  noise * N``, then (``k > 0``) hard negatives ``h = y[:, None] + hard_noise * N`` of
  shape ``[b, k, d]``, then (``tau_max``) a per-row ``tau_plus`` uniform on ``[0,
  tau_max)``, drawn in that order from one numpy generator. Returns the list ``[x, y,
  (h), (tau)]`` as float32 jax arrays; ``numpy_tau`` keeps tau the numpy float64 draw."""
  r = np.random.default_rng(seed)
  x = r.standard_normal((b, d))
  y = x + noise * r.standard_normal((b, d))
  out = [jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)]
  if k:
    out.append(jnp.asarray(y[:, None] + hard_noise * r.standard_normal((b, k, d)), jnp.float32))
  if tau_max is not None:
    tau = r.uniform(0.0, tau_max, b)
    out.append(tau if numpy_tau else jnp.asarray(tau, jnp.float32))
  return out


def qwen3_batch(seed, b, d, k, dtype=jnp.float32):
  """Queries, positives and hard negatives with near-duplicates, so that the
  false-negative mask drops some entries of every group (decisively: the gaps to the
  threshold are ~0.01, far above rounding)."""
  r = np.random.default_rng(seed)
  q = unit(r.standard_normal((b, d)))
  doc = unit(q + 0.6 * unit(r.standard_normal((b, d))))
  dup = r.permutation(b)[: b // 3]           # rows that nearly copy another row
  src = r.integers(0, b, len(dup))
  q[dup] = unit(q[src] + 0.15 * unit(r.standard_normal((len(dup), d))))
  doc[dup] = unit(doc[src] + 0.15 * unit(r.standard_normal((len(dup), d))))
  h = unit(doc[:, None, :] + 0.5 * unit(r.standard_normal((b, k, d))))
  return [jnp.asarray(v, jnp.float32).astype(dtype) for v in (q, doc, h)]


def with_exact_ties(b, d, dtype, dims=(8, 24)):
  """qwen3_batch() with rows 1 and 5 duplicated (q and d) and every row's first hard
  negative equal to its positive: candidates whose similarity is the positive's in
  exact math. Every other candidate is >= 1e-2 away from its positive at every prefix
  (asserted): a 16-bit path rounds similarities by up to ~4e-3 (bf16 renormalized
  prefixes), which may move a near-tie across the margin, a discontinuity no tolerance
  covers (seed 4 of qwen3_batch() has one at 5e-4)."""
  q, doc, h = (np.array(v, np.float32) for v in qwen3_batch(0, b, d, 2))
  q[5], doc[5] = q[1], doc[1]
  h[:, 0] = doc
  out = [jnp.asarray(v).astype(dtype) for v in (q, doc, h)]
  for m in dims:
    unit = lambda v: v[..., :m] / np.linalg.norm(v[..., :m], axis=-1, keepdims=True)
    qu, du, hu = (unit(np.asarray(v, np.float64)) for v in out)
    p = np.sum(qu * du, -1)[:, None]
    for s in (qu @ du.T, qu @ qu.T, np.einsum("id,ikd->ik", qu, hu)):
      gap = np.abs(s - p)
      assert np.all((gap < 1e-9) | (gap >= 1e-2)), gap[gap >= 1e-9].min()
  return out


def margin_offsets(q, doc, h, dims, *, dq=False, shared_hard=False) -> np.ndarray:
  """Every negative's similarity minus its row's positive's, at every prefix dim, in
  float64 on the (rounded) inputs: the candidates of the q-d, q-q, d-d and hard-negative
  groups (``h`` may be None), the pairs i == j left out; ``dq``: the d-q group too
  (d_i . q_j), ``shared_hard``: every row's hard negatives offered to every query and
  to every other row's document (as with the d-d group). The margin mask keeps
  ``offset <= margin``."""
  off = ~np.eye(len(q), dtype=bool)
  q, doc, h = (None if v is None else np.asarray(jnp.asarray(v, jnp.float32), np.float64)
               for v in (q, doc, h))
  # shared_hard: d_i against the runs of the other rows (h_jk, j != i)
  others = np.repeat(off, h.shape[1], axis=1) if h is not None and shared_hard else None
  out = []
  for m in dims:
    qu, du = unit(q[:, :m]), unit(doc[:, :m])
    p = np.sum(qu * du, -1)[:, None]
    out += [(qu @ du.T - p)[off], (qu @ qu.T - p)[off], (du @ du.T - p)[off]]
    if dq:
      out.append((du @ qu.T - p)[off])
    if h is None:
      continue
    hu = unit(h[..., :m])
    if shared_hard:   # q_i and d_i against every run (d_i: not its own)
      runs = hu.reshape(-1, m).T
      out += [(qu @ runs - p).ravel(), (du @ runs - p)[others]]
    else:
      out.append((np.einsum("id,ikd->ik", qu, hu) - p).ravel())
  return np.concatenate(out)


def decisive_margin(q, doc, h, dims, margin=0.05, hi=0.6, **groups):
  """``margin`` if every candidate is at least a rounding gap from its threshold at
  every prefix, else the middle of the widest gap between candidates' offsets in
  [0, hi] (asserted >= 2 gaps wide, with candidates above it: the mask still drops
  some). The gap: 2e-3 for 16-bit inputs (a similarity of 16-bit unit vectors is off by
  ~1e-3), 1e-5 for fp32. A candidate nearer than that may cross the margin in one path
  and not in another, a discontinuity no tolerance covers; small prefixes (8 of 72
  features, B = 300) have candidates within 1e-5 of 0.05. ``groups``: margin_offsets'
  ``dq`` and ``shared_hard``."""
  gap = 1e-5 if jnp.dtype(q.dtype).itemsize >= 4 else 2e-3
  v = margin_offsets(q, doc, h, dims, **groups)
  if np.min(np.abs(v - margin)) >= gap:
    return margin
  w = np.sort(v[(v >= 0) & (v <= hi)])
  i = int(np.argmax(np.diff(w)))
  assert w[i + 1] - w[i] >= 2 * gap and np.any(v > w[i + 1]), (w[i], w[i + 1])
  return float(w[i] + w[i + 1]) / 2


def debias_ratios(x, y, temperature, two_sided, where=None, dims=None) -> np.ndarray:
  """Each softmax's N e^(s_pos / t) / sum_neg e^(s / t) (rows; with ``two_sided`` the
  columns' after them), at every prefix dim of ``dims`` (None: the whole features), in
  float64 on the (rounded) inputs' unit rows, ``where``'s rows alone: debiasing with
  ``tau_plus`` clamps a softmax whose ``tau_plus * ratio >= 1`` (docs/math.md §7.1),
  and its gradient grows as 1 / (1 - tau_plus * ratio) below."""
  x, y = (np.asarray(jnp.asarray(v, jnp.float32), np.float64) for v in (x, y))
  if where is not None:
    x, y = x[np.asarray(where)], y[np.asarray(where)]
  out = []
  for m in dims or (x.shape[-1],):
    s = unit(x[:, :m]) @ unit(y[:, :m]).T / temperature
    for a in ([s, s.T] if two_sided else [s]):
      e = np.exp(a - np.max(a, axis=1, keepdims=True))
      pos = np.diag(e)
      out.append((len(a) - 1) * pos / (e.sum(1) - pos))
  return np.concatenate(out)


def decisive_tau_plus(x, y, temperature, tau_plus, two_sided, where=None, dims=None, gap=0.3):
  """``tau_plus`` if every softmax's ``tau_plus * ratio`` (debias_ratios) is at least
  ``gap`` from 1 in log units, else the largest of ``tau_plus * 2^(-k / 4)``, k = 1..32,
  that is (asserted). Within that, 16-bit rounding of the similarities moves a
  softmax across the clamp or multiplies its error by 1 / (1 - tau_plus * ratio): the
  plain bf16 version is off by 0.17-0.20 of the largest gradient entry at B = 2085,
  d = 72, tau_plus = 0.1 (a softmax 1.8% from the clamp), and by 0.43 at B = 700,
  d = 512, t = 0.005, tau_plus = 0.05 (3%)."""
  log_r = np.log(debias_ratios(x, y, temperature, two_sided, where, dims))
  for k in range(33):
    tau = tau_plus * 2.0 ** (-k / 4)
    if np.min(np.abs(np.log(tau) + log_r)) >= gap:
      return float(tau)
  raise AssertionError(f"no tau_plus <= {tau_plus} keeps every softmax {gap} from the clamp")


def ring_batch(b, d, k):
  """Unit queries, documents (row 5 a near-duplicate of row 3, for the Qwen3 mask) and
  hard negatives, and a per-row tau_plus on [0, 0.4): float32 ``[q, d, h, tau]``."""
  r = np.random.default_rng(0)
  q = unit(r.standard_normal((b, d)))
  doc = unit(q + 0.5 * r.standard_normal((b, d)))
  doc[5] = unit(doc[3] + 0.1 * r.standard_normal(d))      # near-duplicates for the mask
  h = unit(doc[:, None] + 0.6 * r.standard_normal((b, k, d)))
  tau = r.uniform(0.0, 0.4, b)
  return [jnp.asarray(v, jnp.float32) for v in (q, doc, h, tau)]


def graded_rows(seed, b, d, cos_lo, cos_hi):
  """Rows whose log-sum-exps over their negatives spread apart: every text leans on one
  direction m (cos ~0.7); image i's cosine to m runs evenly over [cos_lo, cos_hi]."""
  r = np.random.default_rng(seed)
  m = unit(r.standard_normal(d))
  y = unit(0.7 * m + 0.7 * unit(r.standard_normal((b, d))))
  w = r.standard_normal((b, d))
  w = unit(w - (w @ m)[:, None] * m)
  c = np.linspace(cos_lo, cos_hi, b)[:, None]
  return (jnp.asarray(unit(c * m + np.sqrt(1 - c * c) * w), jnp.float32),
          jnp.asarray(y, jnp.float32))


# graded_rows cases ((cos_lo, cos_hi, length), t, exact): the tiled forward's bounded
# sums against one shift are exact for ordinary rows; for rows whose every logit lies far
# below the scale they underflow (cold), and rows longer than one (normalized_inputs=True,
# not unit) overflow: there the exact forward reruns. The tests assert the premise, so
# each case keeps its branch.
BOUNDED_CASES = [((0.4, 0.8, 1.0), 0.07, True), ((-0.9, 0.9, 1.0), 0.005, False),
                 ((0.4, 0.8, 3.0), 0.07, False)]


def where_mask(b, seed=0):
  """A ``where=`` mask with about a third of the rows removed, first and last included
  (edges of tiles), row 1 kept."""
  w = np.random.default_rng(seed).uniform(size=b) > 0.35
  w[0] = w[-1] = False
  w[1] = True
  return w
