"""Where memeff's arithmetic breaks (docs/math.md §10, items 1-2) ours must not: small
temperatures and debiasing with dominant positives, against float64 references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memeff_jax import clip_loss, clip_loss_with_stats, lit_loss, qwen3_loss, reference
from memeff_jax.backends.triton import backend as launch
from memeff_jax.backends.triton.backward import SHARED_SPAN
from tests.support.check import kernel_path_config, sampled
from tests.support.data import (BOUNDED_CASES, debias_ratios, decisive_tau_plus, features,
                                graded_rows)
from tests.support.elementwise import sigmoid_softplus_errors
from tests.support.families import BACKENDS, FAMILIES
from tests.support.oracle import block_lse64
from tests.support.tolerances import FP32, LOW, grad_err, rel_err


def _unit(v):
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _f64(fn, arrays, argnums, **kw):
  with jax.enable_x64(True):
    arrs = [jnp.asarray(np.asarray(a, np.float64)) for a in arrays]
    val, grads = jax.value_and_grad(lambda *a: fn(*a, **kw), argnums=argnums)(*arrs)
    return float(val), [np.asarray(g) for g in grads]


def _check(fn, ref, arrays, *, val_rtol, grad_tol, **kw):
  argnums = tuple(range(len(arrays)))
  val, grads = jax.jit(jax.value_and_grad(lambda *a: fn(*a, **kw), argnums=argnums))(*arrays)
  rval, rgrads = _f64(ref, arrays, argnums, **kw)
  assert np.isfinite(float(val)) and float(val) >= 0.0
  assert abs(float(val) - rval) <= val_rtol * abs(rval), (float(val), rval)
  for g, r in zip(grads, rgrads):
    assert np.all(np.isfinite(np.asarray(g))), "non-finite gradient"
    assert grad_err(g, r) <= grad_tol, grad_err(g, r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [0.01, 0.02, 0.07, 0.3, 1.0])
def test_small_temperature_cold_rows(backend, t):
  # Row 0 of x has every cosine (its positive included) below 0.1: memeff's fixed shift
  # exp((s - 1)/t) underflows to Den = 0 there at t = 0.01 (-inf loss, NaN gradients).
  r = np.random.default_rng(0)
  b, d = 24, 32
  y = _unit(r.standard_normal((b, d)))
  x = _unit(y + 0.3 * r.standard_normal((b, d)))
  x[0] = _unit(np.linalg.svd(y)[2][-1])   # orthogonal to the span of y (b < d)
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  assert float(jnp.max(x[0] @ y.T)) < 0.1
  for fn, ref in [(clip_loss, reference.clip_loss), (lit_loss, reference.lit_loss)]:
    _check(lambda a, b: fn(a, b, temperature=t, backend=backend, normalized_inputs=True),
           lambda a, b: ref(a, b, temperature=t, normalized_inputs=True), [x, y],
           val_rtol=1e-5, grad_tol=1e-4)


def _dominant(seed, b, d, noise):
  r = np.random.default_rng(seed)
  x = _unit(r.standard_normal((b, d)))
  y = _unit(x + noise * r.standard_normal((b, d)))
  return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


# (seed, batch, dim, noise, value rtol, tau). Positives dominating every row (cos ~ 0.999 vs ~0):
# the clamp fires, the true loss is ~1e-9 and memeff's (S - p) returns a negative loss
# with gradients off by 100%. Ordinary cosines (~0.5, t = 0.07): a plain fp32
# transcription is off by ~20% there.
DEBIAS_CASES = ([(1, 64, 48, 0.02, 1e-3, tau) for tau in (0.01, 0.1, 0.5)] +   # dominant
                [(2, 96, 32, 1.7, 1e-5, tau) for tau in (0.05, 0.2)])         # ordinary


# By default every case on the interpreter and one dominant case on blockwise (whose
# float64 cases take 20-30 s on CPU; the rest: slow).
@pytest.mark.parametrize("backend,seed,b,d,noise,val_rtol,tau", sampled(
    [(be, *case) for be in BACKENDS for case in DEBIAS_CASES],
    lambda i, c: c[0] == "interpret" or c[1:] == DEBIAS_CASES[2]))
def test_debias_accuracy(backend, seed, b, d, noise, val_rtol, tau):
  x, y = _dominant(seed, b, d, noise)
  for fn, ref in [(clip_loss, reference.clip_loss), (lit_loss, reference.lit_loss)]:
    _check(lambda a, b: fn(a, b, tau_plus=tau, backend=backend),
           lambda a, b: ref(a, b, tau_plus=tau), [x, y], val_rtol=val_rtol, grad_tol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_debias_qwen3_masked_and_clamped(backend):
  # Masking plus a per-row prior: some rows clamp, their negatives get no gradient.
  x, y = _dominant(3, 48, 32, 0.05)
  tau = jnp.asarray(np.random.default_rng(3).uniform(0, 0.5, 48), jnp.float32)
  h = jnp.asarray(_unit(np.asarray(y)[:, None, :] + 0.3 *
                        np.random.default_rng(4).standard_normal((48, 3, 32))), jnp.float32)
  kw = dict(margin=0.05, use_qq_negatives=True, use_dd_negatives=True)
  _check(lambda a, b, c: qwen3_loss(a, b, c, tau_plus=tau, backend=backend, **kw),
         lambda a, b, c: reference.qwen3_loss(a, b, c, tau_plus=jnp.asarray(tau), **kw),
         [x, y, h], val_rtol=1e-3, grad_tol=1e-3)


def test_sigmoid_softplus_to_fp32_rounding():
  # The kernels' sigmoid and softplus (SigLIP's coefficient and loss terms) under the
  # interpreter, against float64 over every fp32 u that matters, +-inf and -0: within
  # 4 ulp (4.8e-7) relative (tests.support.elementwise); the GPU's approximate
  # exponential and division in test_gpu.py::test_sigmoid_softplus_triton.
  assert sigmoid_softplus_errors(interpret=True, tol=4.8e-7) <= 1.0


def test_tiny_loss_is_accurate():
  # ell = log1p(sum_neg / pos): a loss of ~1e-9 keeps its digits (no 1 + tiny - 1).
  q = np.linalg.qr(np.random.default_rng(5).standard_normal((16, 16)))[0]   # orthonormal
  x, y = jnp.asarray(q, jnp.float32), jnp.asarray(_unit(q + 1e-3), jnp.float32)
  for backend in BACKENDS:
    v = float(lit_loss(x, y, temperature=0.05, backend=backend))
    ref, _ = _f64(reference.lit_loss, [x, y], (0,), temperature=0.05)
    assert 0 < ref < 1e-6 and abs(v - ref) <= 1e-4 * ref, (v, ref)


def _lse_span(x, y, t):
  # Largest minus smallest row and column log2-sum-exp over the negatives (the kernels'
  # statistics; the positives are added outside them) of z = s / t * log2(e): what
  # decides whether a gradient tile holding all of them shares one exponential.
  z = np.asarray(x, np.float64) @ np.asarray(y, np.float64).T / t / np.log(2)
  np.fill_diagonal(z, -np.inf)
  lse = np.concatenate([np.log2(np.sum(np.exp2(z), a)) for a in (0, 1)])
  return lse.max() - lse.min()


# (cos_lo, cos_hi, t): lse spans over the block of 49 and 63 (one exponential per entry
# shared by both softmax roles; at 63 the weakest rows' terms sit near 2^-126) and 375
# (two exponentials; sharing would give NaN). The span is asserted, so each case keeps
# testing its branch. path: the FlashAttention-shaped gradient (one check for the
# block), the paired tiled one with one tile for the block (the tile's own check, the
# same branch), and with 32 x 32 tiles (each tile its own branch).
# (At t = 0.005 the interpreter's dot meets NaN coefficients in rows 48-63 of the 64-row
# tile, past the block's 48 rows: lanes the store masks, as the passing check shows.)
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("path", ["default", "paired", "tiled_paired"])
@pytest.mark.parametrize("cos_lo,cos_hi,t,shared", [(0.4, 0.8, 0.01, True),
                                                    (0.25, 0.8, 0.01, True),
                                                    (-0.9, 0.9, 0.005, False)])
def test_gradient_shared_exponential(cos_lo, cos_hi, t, shared, path):
  x, y = graded_rows(6, 48, 64, cos_lo, cos_hi)
  assert (_lse_span(x, y, t) <= SHARED_SPAN) == shared, _lse_span(x, y, t)
  cfg = None if path == "default" else kernel_path_config(path, 64, jnp.float32)
  for fn, ref in [(clip_loss, reference.clip_loss), (lit_loss, reference.lit_loss)]:
    _check(lambda a, b: fn(a, b, temperature=t, backend="interpret", normalized_inputs=True,
                           config=cfg),
           lambda a, b: ref(a, b, temperature=t, normalized_inputs=True), [x, y],
           val_rtol=1e-5, grad_tol=1e-4)


@pytest.mark.parametrize("rows,t,exact", BOUNDED_CASES)
def test_forward_bounded_shift(rows, t, exact):
  cos_lo, cos_hi, length = rows
  x, y = (length * v for v in graded_rows(7, 48, 64, cos_lo, cos_hi))
  cfg = kernel_path_config("tiled", 64, jnp.float32)
  assert cfg.fwd_bounded
  lse_r, lse_c, _, _ = launch.lse_fwd(x, y, jnp.float32(1 / t), None, (0, 0), two_sided=True,
                                      exclude_self=True, config=cfg, interpret=True,
                                      bounded=True, want_max=False)
  ref_r, ref_c = block_lse64(x, y, t)
  close = lambda a, b: np.allclose(np.asarray(a, np.float64), b, rtol=1e-5)
  assert (close(lse_r, ref_r) and close(lse_c, ref_c)) == exact
  for fn, ref in [(clip_loss, reference.clip_loss), (lit_loss, reference.lit_loss)]:
    _check(lambda a, b: fn(a, b, temperature=t, backend="interpret", normalized_inputs=True,
                           config=cfg),
           lambda a, b: ref(a, b, temperature=t, normalized_inputs=True), [x, y],
           val_rtol=1e-5, grad_tol=1e-4)


# --- normalization is scale-invariant for every finite row -----------------------------

# (dtype, scale): the sum of squares of such a row overflows the dtype. bf16's scale is
# 2^100 ~ 1.3e30 so that c * x is exact in bf16 (1e30 * x would round differently from x).
HUGE = {"float32": 1e20, "bfloat16": 2.0**100, "float64": 1e200}
# Qwen3 with its query-query group and a margin, so the mask sees the huge rows too.
_QWEN3_OPTIONS = dict(use_qq_negatives=True, margin=0.2)


# (family, dtype, backend, matryoshka_dims, normalized_inputs, per_dim): a sample over
# the backends, dtypes, and the three places rows are normalized (the plain rows, the
# fused prefixes' tables, one block per dim's prefixes); only the Matryoshka prefixes
# are renormalized with normalized_inputs=True.
@pytest.mark.parametrize("family,dtype,backend,dims,normalized,per_dim", [
    ("clip", "float32", "reference", None, False, False),
    ("clip", "float32", "blockwise", None, False, False),
    ("qwen3", "float32", "interpret", None, False, False),
    ("lit", "bfloat16", "interpret", None, False, False),
    ("qwen3", "bfloat16", "blockwise", (8, 24), False, False),
    ("clip", "float32", "interpret", (8, 24), True, False),
    ("clip", "float32", "blockwise", (8, 24), False, True),
    ("qwen3", "float32", "reference", (8, 24), True, False),
    ("clip", "float64", "blockwise", (8, 24), False, False),
    ("qwen3", "float64", "reference", None, False, False),
])
def test_huge_rows_are_scale_invariant(family, dtype, backend, dims, normalized, per_dim):
  # Bar: c * rows give the loss of the rows, and gradients g / c (checked as c * grad).
  c = HUGE[dtype]
  n_arr = 3 if family == "qwen3" else 2
  shapes = [(6, 24), (6, 24), (6, 2, 24)][:n_arr]
  r = np.random.default_rng(7)
  arrays = [r.standard_normal(s) for s in shapes]
  if normalized:
    arrays = [_unit(a) for a in arrays]
  kw = dict(backend=backend, matryoshka_dims=dims, normalized_inputs=normalized)
  if per_dim:
    kw["matryoshka_per_dim"] = True
  opts = _QWEN3_OPTIONS if family == "qwen3" else {}
  fn = lambda *a: FAMILIES[family].loss(*a, **opts, **kw)
  with jax.enable_x64(dtype == "float64"):
    small = [jnp.asarray(a, dtype) for a in arrays]
    big = [jnp.asarray(c * np.asarray(a, np.float64), dtype) for a in small]
    assert all(np.isfinite(np.asarray(b, np.float64)).all() for b in big)
    run = jax.jit(jax.value_and_grad(fn, argnums=tuple(range(n_arr))))
    (val, grads), (val_c, grads_c) = run(*small), run(*big)
    v_tol, g_tol = {"float32": FP32, "float64": (1e-12, 1e-10)}.get(
        dtype, LOW[jnp.dtype(jnp.bfloat16)][:2])
    assert rel_err(val_c, val) <= v_tol, (float(val_c), float(val))
    for g, g_c in zip(grads, grads_c):
      g_c = c * np.asarray(g_c, np.float64)
      assert np.all(np.isfinite(g_c))
      assert grad_err(g_c, g) <= g_tol, grad_err(g_c, g)


# Matryoshka with one block per dim (the GPU default), in one block for every dim (whose
# prefix tables, 1e12 for a zero row, scale its gradient inside the block) and on the
# reference.
@pytest.mark.parametrize("backend,dims,per_dim", [
    ("reference", None, False), ("blockwise", None, False), ("interpret", None, False),
    ("blockwise", (8, 24), True), ("blockwise", (8, 24), False), ("interpret", (8, 24), False),
    ("reference", (8, 24), False)])
def test_float16_zero_row_has_finite_gradient(backend, dims, per_dim):
  # docs/math.md §2: a zero row is divided by 1e-12, its gradient is g / 1e-12; in float16
  # that is rounded saturating (+-65504), not to inf. Oracle: the float32 gradient on the
  # same inputs, saturated for the zero row; the other rows within float16's tolerance.
  r = np.random.default_rng(3)
  x, y = (r.standard_normal((6, 24)) for _ in range(2))
  x[2] = 0.0
  big = float(jnp.finfo(jnp.float16).max)
  kw = dict(matryoshka_per_dim=True) if per_dim else {}
  grad = lambda dt: np.asarray(jax.jit(jax.grad(lambda a, b: clip_loss(
      a, b, backend=backend, matryoshka_dims=dims, **kw), argnums=(0, 1)))(
          jnp.asarray(x, dt), jnp.asarray(y, dt))[0], np.float64)
  g16, g32 = grad(jnp.float16), grad(jnp.float32)
  assert np.all(np.isfinite(g16))
  assert np.abs(g32[2]).max() > big    # the float32 gradient is out of float16's range
  np.testing.assert_array_equal(g16[2], np.clip(g32[2], -big, big))
  rest = np.arange(6) != 2
  assert grad_err(g16[rest], g32[rest]) <= LOW[jnp.dtype(jnp.float16)][1]


@pytest.mark.parametrize("backend,per_dim", [
    ("reference", False), ("blockwise", False), ("blockwise", True), ("interpret", False)])
def test_float16_zero_prefix_has_finite_gradient(backend, per_dim):
  # A row whose first Matryoshka prefix is zero (the rest not): its prefix tables (1e12)
  # scale its gradient there beyond float16. The uses of the unit rows sum their
  # cotangents in fp32 and round once, saturating (docs/math.md §2): finite, with the
  # float32 gradient's signs on the prefix, and within float16's tolerance elsewhere.
  # (The seed gives a feature whose cotangents from the two dims overflow float16 with
  # opposite signs: summed in float16 they made inf - inf, a NaN.)
  r = np.random.default_rng(5)
  x, y = (r.standard_normal((6, 24)) for _ in range(2))
  x[2, :8] = 0.0
  big = float(jnp.finfo(jnp.float16).max)
  kw = dict(matryoshka_per_dim=per_dim) if backend != "reference" else {}
  grad = lambda dt: np.asarray(jax.jit(jax.grad(lambda a, b: clip_loss(
      a, b, backend=backend, matryoshka_dims=(8, 24), **kw), argnums=(0, 1)))(
          jnp.asarray(x, dt), jnp.asarray(y, dt))[0], np.float64)
  g16, g32 = grad(jnp.float16), grad(jnp.float32)
  assert np.all(np.isfinite(g16))
  assert np.abs(g32[2, :8]).min() > big    # beyond float16's range on the whole prefix
  np.testing.assert_array_equal(np.sign(g16[2, :8]), np.sign(g32[2, :8]))
  # (one block: saturated at the unit rows, then normalization's 1 / ||x_2||; per dim:
  # at the raw rows; each within float16's rounding)
  assert np.abs(g16[2, :8]).min() >= 0.999 * big / np.linalg.norm(x[2])
  rest = np.ones_like(g16, bool)
  rest[2, :8] = False
  assert np.abs(g16[rest] - g32[rest]).max() <= LOW[jnp.dtype(jnp.float16)][1] * np.abs(
      g32[rest]).max()


@pytest.mark.parametrize("dims", [(1, 16), (2, 16)])
def test_bfloat16_short_prefix_one_block_gradient(dims):
  # One block for every dim, bfloat16: a short prefix's gradient is mostly along the
  # prefix (for one feature wholly: its unit prefix is +-1), which normalization's
  # gradient cancels. The block now takes fp32 rows and gives fp32 gradients (docs/math.md
  # §2), so only the inputs' rounding is left: within 2^-7 of float64 on the same bf16
  # inputs, as one block per dim is (rounded to bfloat16 first, dims (1, 16) were 7.8e-2
  # off; (2, 16) stays within the bound either way).
  r = np.random.default_rng(0)
  x, y = (jnp.asarray(r.standard_normal((8, 16)), jnp.bfloat16) for _ in range(2))
  f = lambda a, b, **kw: clip_loss(a, b, temperature=0.1, stable=False, matryoshka_dims=dims,
                                   **kw)
  with jax.enable_x64(True):
    want = np.asarray(jax.grad(lambda a: f(a, y.astype(jnp.float64), backend="reference"))(
        x.astype(jnp.float64)))
  for per_dim in (False, True):
    got = np.asarray(jax.grad(lambda a: f(a, y, backend="blockwise",
                                          matryoshka_per_dim=per_dim))(x), np.float64)
    assert np.linalg.norm(got - want) <= 2.0**-7 * np.linalg.norm(want), per_dim


# Rows whose Matryoshka prefix (or whole row) has a norm at or below the 1e-12 clamp:
# (name, normalized_inputs, edit of x). Row 2 is the degenerate one.
_DEGENERATE = [
    ("tiny_prefix", False, lambda x: x.at[2, :4].multiply(1e-13).at[2, 4:].multiply(100.0)),
    ("zero_prefix", False, lambda x: x.at[2, :4].set(0.0)),
    ("zero_row", False, lambda x: x.at[2].set(0.0)),
    ("tiny_row_normalized", True, lambda x: x.at[2].multiply(1e-14)),
    ("tiny_prefix_normalized", True, lambda x: x.at[2, :4].multiply(1e-13)),
    ("huge_row_tiny_prefix_normalized", True,
     lambda x: x.at[2, :4].multiply(1e-13).at[2, 4:].multiply(1e20)),
]


@pytest.mark.parametrize("family", ["clip", "qwen3"])
@pytest.mark.parametrize("name,normalized,edit", _DEGENERATE, ids=[c[0] for c in _DEGENERATE])
def test_matryoshka_clamp_is_one_definition(family, name, normalized, edit):
  # docs/math.md §8.1: u^k = v[:m_k] / max(||v[:m_k]||, 1e-12), v the rows after §2 (the
  # unit rows, or the rows as given with normalized_inputs): every form clamps that
  # norm, not the raw prefix's (one block per dim) nor the power-of-two-scaled row's
  # (one block with normalized_inputs). Oracle: the float64 dense definition
  # (reference.matryoshka_fused_with_stats); bar: float32's tolerance.
  del name
  fam = FAMILIES[family]
  r = np.random.default_rng(11)
  shapes = [(8, 8), (8, 8), (8, 2, 8)][:3 if family == "qwen3" else 2]
  arrays = [jnp.asarray(r.standard_normal(s), jnp.float32) for s in shapes]
  arrays[0] = edit(arrays[0])
  opts = dict(fam.options, **(_QWEN3_OPTIONS if family == "qwen3" else {}))
  kw = dict(matryoshka_dims=(4, 8), normalized_inputs=normalized, stable=False)
  ref = lambda *a, **k: reference.matryoshka_fused_with_stats(
      fam.reference_with_stats, *a, dims=(4, 8), normalized_inputs=normalized, stable=False,
      **opts, **k)[0]
  argnums = tuple(range(len(arrays)))
  want, want_g = _f64(ref, arrays, argnums)
  for backend, per_dim in (("blockwise", True), ("blockwise", False), ("interpret", True)):
    run = jax.jit(jax.value_and_grad(lambda *a: fam.loss(
        *a, backend=backend, matryoshka_per_dim=per_dim, **opts, **kw), argnums=argnums))
    val, grads = run(*arrays)
    assert rel_err(val, want) <= FP32[0], (backend, per_dim, float(val), want)
    for g, w in zip(grads, want_g):
      assert grad_err(g, w) <= FP32[1], (backend, per_dim, grad_err(g, w))


@pytest.mark.parametrize("backend", ["reference", "blockwise"])
def test_tiny_temperature_without_z_loss(backend):
  # t = 1e-20 (in range): lse^2 overflows float32, and a z-loss switched off by its
  # Python 0 default must not turn that into 0 * inf. Oracle: CLIP's two cross-entropies
  # in float64 numpy on the float32-rounded unit rows.
  r = np.random.default_rng(2)
  x, y = (r.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
  t = 1e-20
  loss, stats = clip_loss_with_stats(jnp.asarray(x), jnp.asarray(y), temperature=t,
                                     backend=backend, stable=False)
  u, v = (np.asarray(reference.normalize(jnp.asarray(a)), np.float64) for a in (x, y))
  s = u @ v.T / t
  ce = lambda z: np.mean(np.log(np.sum(np.exp(z - z.max(1, keepdims=True)), 1))
                         + z.max(1) - np.diag(z))
  want = (ce(s) + ce(s.T)) / 2
  assert rel_err(loss, want) <= FP32[0], (float(loss), want)
  assert float(stats.z_loss) == 0.0


def test_debiased_16bit_cases_clear_of_the_clamp():
  # compare's 16-bit bound is twice the plain bf16 formula's gradient error plus an
  # atol, at most LOW's cap (tests.support.check). A softmax near the debiased clamp
  # (tau_plus N e^(s_pos/t) ~ sum_neg) multiplies the formula's rounding error by
  # 1 / (1 - tau_plus ratio): test_gpu.py's CLIP case at B = 2085, d = 72 has one 1.8%
  # from it at tau_plus = 0.1, which puts that bound past the cap; decisive_tau_plus's
  # tau_plus keeps every softmax 0.3 (log units) clear, and the bound under the cap.
  x, y = features(2085 + 72, [(2085, 72), (2085, 72)], jnp.bfloat16)
  _, atol, cap = LOW[jnp.dtype(jnp.bfloat16)]

  def bound(tau):
    loss = lambda x, y, t: reference.clip_loss(x, y, temperature=t, tau_plus=tau)
    low = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y, jnp.float32(0.07))
    _, want = _f64(loss, [x.astype(jnp.float32), y.astype(jnp.float32)], (0, 1), t=0.07)
    return max(2 * grad_err(a, r) + atol for a, r in zip(low, want))

  tau = decisive_tau_plus(x, y, 0.07, 0.1, True)
  ratios = tau * debias_ratios(x, y, 0.07, True)
  assert tau < 0.1 and np.min(np.abs(np.log(ratios))) >= 0.3, tau
  assert bound(tau) < cap < bound(0.1), (bound(tau), bound(0.1))
