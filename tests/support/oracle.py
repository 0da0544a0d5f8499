"""The float64 oracles: numpy written straight from docs/math.md, independent of
memeff_jax's code.

``clip`` and ``qwen3`` are loops over rows (memeff's shifted exponentials
e(s) = exp((s - 1) / t), the debias formula with (S - p), the smoothing correction per
row); ``block_lse64`` gives the kernels' log-sum-exp statistics; ``count_pairs`` and
``count_qwen3`` count in-batch top-1 hits densely."""

import math

import numpy as np


def normalize(v):
  v = np.asarray(v, np.float64)
  return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def softmax_row(cands, keep, pos, t, n_neg, tau, eps):
  """One softmax. cands: the raw similarities of all nominal candidates, the positive
  first; keep: which enter the denominator. Returns (ell, lse = log Den unshifted)."""
  e = lambda s: math.exp((s - 1.0) / t)
  p = e(pos)
  # The positive is cands[0]; the negatives' sum S (docs/math.md §7.1) runs over the
  # rest, never as a total minus the positive (memeff's cancellation, §10 item 2).
  neg = sum(e(s) for s, k in zip(cands[1:], keep[1:]) if k)
  if tau is None:
    den = (p if keep[0] else 0.0) + neg
  elif n_neg == 0:
    den = p
  else:
    m_neg = neg / n_neg
    g = (m_neg - tau * p) / (1.0 - tau)
    f = math.exp(-2.0 / t)
    den = p + n_neg * (f if g < f else g)
  ell = -(pos - 1.0) / t + math.log(den)
  c = len(cands)
  ell += eps * (pos / t - sum(s / t for s in cands) / c)
  return ell, math.log(den) + 1.0 / t


def _finish(ells, lses, z_scale):
  loss = sum(np.mean(e) for e in ells) / len(ells)
  z = z_scale * sum(np.mean(np.square(l)) for l in lses) / len(lses)
  return loss + z, z


def clip(x, y, t, tau=None, eps=0.0, z_scale=0.0, normalized=False, lit=False):
  if not normalized:
    x, y = normalize(x), normalize(y)
  b = x.shape[0]
  taus = [tau] * b if (tau is None or np.ndim(tau) == 0) else list(tau)
  s = x @ y.T
  rows = [softmax_row([s[i, i]] + [s[i, j] for j in range(b) if j != i], [True] * b,
                      s[i, i], t, b - 1, taus[i], eps) for i in range(b)]
  dirs = [rows]
  if not lit:
    dirs.append([softmax_row([s[j, j]] + [s[i, j] for i in range(b) if i != j], [True] * b,
                             s[j, j], t, b - 1, taus[j], eps) for j in range(b)])
  return _finish([[r[0] for r in d] for d in dirs], [[r[1] for r in d] for d in dirs], z_scale)


def qwen3(q, d, h, t, margin, qq=False, dd=False, tau=None, eps=0.0, z_scale=0.0,
          normalized=False):
  if not normalized:
    q, d = normalize(q), normalize(d)
    h = None if h is None else normalize(h)
  b, k = q.shape[0], (0 if h is None else h.shape[1])
  taus = [tau] * b if (tau is None or np.ndim(tau) == 0) else list(tau)
  n_neg = (b - 1) * (1 + qq + dd) + k
  out = []
  for i in range(b):
    pos = float(q[i] @ d[i])
    cands = [pos] + [float(q[i] @ d[j]) for j in range(b) if j != i]
    if qq:
      cands += [float(q[i] @ q[j]) for j in range(b) if j != i]
    if dd:
      cands += [float(d[i] @ d[j]) for j in range(b) if j != i]
    cands += [float(q[i] @ h[i, kk]) for kk in range(k)]
    keep = [s <= pos + margin + 2.0**-10 for s in cands]   # the tie tolerance
    out.append(softmax_row(cands, keep, pos, t, n_neg, taus[i], eps))
  return _finish([[o[0] for o in out]], [[o[1] for o in out]], z_scale)


def block_lse64(x, y, t):
  """Row and column log-sum-exps (natural units) over CLIP's negatives of s / t, float64."""
  z = np.asarray(x, np.float64) @ np.asarray(y, np.float64).T / t
  np.fill_diagonal(z, -np.inf)
  lse = lambda a: np.log(np.sum(np.exp(z - z.max(a, keepdims=True)), a)) + z.max(a)
  return lse(1), lse(0)


def _unit(v):
  v = np.asarray(v, np.float64)
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def count_pairs(x, y):
  """Dense count: row i is a hit iff s_ii > s_ij + 2^-10 (the tie tolerance) for every
  j != i (rows; columns)."""
  s = _unit(x) @ _unit(y).T
  pos = np.diag(s)
  off = s - np.diag(np.full(len(s), np.inf))
  tie = 2.0**-10
  return (float(np.mean(pos > off.max(axis=1) + tie)),
          float(np.mean(pos > off.max(axis=0) + tie)))


def count_qwen3(q, d, h, margin, qq, dd):
  """Dense count of Qwen3's top-1 hits among the candidates its mask keeps."""
  q, d, h = _unit(q), _unit(d), _unit(h)
  b = len(q)
  pos = np.sum(q * d, axis=-1)
  hits = []
  for i in range(b):
    cands = [q[i] @ d[j] for j in range(b) if j != i]
    cands += [q[i] @ q[j] for j in range(b) if j != i and qq]
    cands += [d[i] @ d[j] for j in range(b) if j != i and dd]
    cands += list(h[i] @ q[i])
    kept = [c for c in cands if c <= pos[i] + margin + 2.0**-10]   # tie tolerance
    hits.append(not kept or pos[i] > max(kept) + 2.0**-10)
  return float(np.mean(hits))
