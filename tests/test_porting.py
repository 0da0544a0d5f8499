"""Porting from sentence-transformers: every MultipleNegativesRankingLoss ``directions``
subset under both ``partition_mode``s, with and without hard negatives in its layout,
GTE's bidirectional loss, and shared negative columns, against ``st_reference`` (a
float64 transcription of sentence-transformers 6.3.0, checked against the library) and
a dense float64 formula for the shared columns: every backend, the ring, ``where``,
Matryoshka. float64: 1e-10 relative (the bar); the interpreter computes in fp32:
tests.support.tolerances.FP32."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import memeff_jax as mj
from tests.support import st_reference as st
from tests.support.check import checkerboard, compare, sampled
from tests.support.data import qwen3_batch, where_mask
from tests.support.tolerances import FP32

_FLAGS = {"query_to_query": "use_qq_negatives", "doc_to_query": "use_dq_negatives",
          "doc_to_doc": "use_dd_negatives"}
# Every configuration sentence-transformers accepts: query_to_doc plus any subset of the
# other three, joint; query_to_doc alone or with doc_to_query, per_direction.
CONFIGS = [(("query_to_doc",) + extra, "joint") for r in range(4)
           for extra in itertools.combinations(list(_FLAGS), r)] + [
               (("query_to_doc",), "per_direction"),
               (("query_to_doc", "doc_to_query"), "per_direction")]
SCALE = 20.0   # sentence-transformers' default: temperature 0.05


def _kwargs(directions, partition):
  """The memeff_jax keywords of an MNRL configuration (no false-negative mask: margin 2)."""
  return dict({_FLAGS[d]: True for d in directions[1:]}, partition=partition,
              temperature=1.0 / SCALE, margin=2.0, stable=False, share_hard_negatives=True)


def _batch(b, d, k, seed, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(keys[0], (b, d), dtype)
  doc = q + 0.7 * jax.random.normal(keys[1], (b, d), dtype)
  h = jax.random.normal(keys[2], (b, k, d), dtype)
  return q, doc, h


def _st(directions, partition, k, dims=None, weights=None):
  """sentence-transformers' loss of (q, d, h), and its MatryoshkaLoss around it (each
  dim's truncated embeddings, re-normalized by the inner cosine, weighted sum)."""
  def one(q, d, h):
    return st.mnrl(q, d, [h[:, j] for j in range(k)], scale=SCALE, directions=directions,
                   partition_mode=partition)
  if dims is None:
    return one
  return lambda q, d, h: sum(w * one(q[:, :m], d[:, :m], h[..., :m])
                             for m, w in zip(dims, weights))


def _value_and_grads(f, arrays):
  return jax.jit(jax.value_and_grad(f, argnums=tuple(range(len(arrays)))))(*arrays)


def _assert_close(got, want, tol):
  (v, g), (wv, wg) = got, want
  assert abs(float(v) - float(wv)) <= tol * abs(float(wv)), (float(v), float(wv))
  for a, b in zip(g, wg):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale, err = float(np.max(np.abs(b))), float(np.max(np.abs(a - b)))
    assert err <= tol * max(scale, 1e-300), (err, scale)


def _f64_case(directions, partition, k, backend, **extra):
  kw = dict(_kwargs(directions, partition), **extra)
  with jax.enable_x64(True):
    q, d, h = _batch(6, 8, k, seed=len(directions) + 3 * k, dtype=jnp.float64)
    arrays = [q, d, h] if k else [q, d]
    hard = (lambda a: a[2]) if k else (lambda a: None)
    got = _value_and_grads(lambda *a: mj.qwen3_loss(a[0], a[1], hard(a), backend=backend,
                                                    **kw), arrays)
    want = _value_and_grads(lambda *a: _st(directions, partition, k)(
        a[0], a[1], a[2] if k else None), arrays)
    _assert_close(got, want, 1e-10)


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("backend", ["reference", "blockwise"])
@pytest.mark.parametrize("directions,partition", CONFIGS)
def test_every_mnrl_configuration_float64(directions, partition, backend, k):
  _f64_case(directions, partition, k, backend)


def test_gte_is_the_four_directions_joint():
  # GTE's improved contrastive loss (sentence-transformers' own spelling of it).
  with jax.enable_x64(True):
    q, d, _ = _batch(7, 8, 0, seed=5, dtype=jnp.float64)
    got = _value_and_grads(lambda q, d: mj.qwen3_loss(
        q, d, use_qq_negatives=True, use_dq_negatives=True, use_dd_negatives=True,
        temperature=0.01, margin=2.0, stable=False, backend="blockwise"), [q, d])
    want = _value_and_grads(lambda q, d: st.gte(q, d, scale=100.0), [q, d])
    _assert_close(got, want, 1e-10)


INTERPRET = sampled([(c, k) for c in CONFIGS for k in (0, 2)],
                    lambda i, p: checkerboard((p[0], CONFIGS), (p[1], (0, 2)), mod=3))


@pytest.mark.parametrize("config,k", INTERPRET)
def test_mnrl_on_the_triton_interpreter(config, k):
  # The Triton kernels (fp32) against sentence-transformers in float64.
  directions, partition = config
  q, d, h = _batch(70, 24, k, seed=11)
  arrays = [q, d, h] if k else [q, d]
  hard = (lambda a: a[2]) if k else (lambda a: None)
  got = _value_and_grads(lambda *a: mj.qwen3_loss(
      a[0], a[1], hard(a), backend="interpret", **_kwargs(directions, partition)), arrays)
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in arrays]
    want = _value_and_grads(lambda *a: _st(directions, partition, k)(
        a[0], a[1], a[2] if k else None), a64)
  _assert_close(got, want, FP32[0])


def _mesh(n):
  return Mesh(np.array(jax.devices()[:n]), ("batch",))


RING = sampled([(c, n, be) for c in (CONFIGS[7], CONFIGS[4], CONFIGS[-1], CONFIGS[3])
                for n in (2, 4) for be in ("blockwise", "interpret")],
               lambda i, p: (p[2] == "blockwise" and p[1] == 2) or (
                   p[0] == CONFIGS[7] and p[1] == 4))


@pytest.mark.parametrize("config,n_dev,backend", RING)
def test_mnrl_ring_is_gather_across_devices(config, n_dev, backend):
  # Each device's rows are its anchors; the columns (documents, every row's hard
  # negatives, queries) are global, as gather_across_devices: the global batch's loss.
  directions, partition = config
  q, d, h = _batch(16, 8, 2, seed=n_dev)
  loss = mj.sharded(lambda q, d, h, axis_name: mj.qwen3_loss(
      q, d, h, axis_name=axis_name, backend=backend, **_kwargs(directions, partition)),
      _mesh(n_dev), "batch")
  got = _value_and_grads(loss, [q, d, h])
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in (q, d, h)]
    want = _value_and_grads(_st(directions, partition, 2), a64)
  _assert_close(got, want, FP32[0])


@pytest.mark.parametrize("backend", ["blockwise", "interpret"])
def test_mnrl_with_where_is_the_kept_rows_loss(backend):
  directions, partition = CONFIGS[7]   # all four directions, joint
  q, d, h = _batch(12, 8, 2, seed=3)
  keep = np.arange(12) % 4 != 1
  got = _value_and_grads(lambda q, d, h: mj.qwen3_loss(
      q, d, h, where=keep, backend=backend, **_kwargs(directions, partition)), [q, d, h])
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in (q, d, h)]
    v, g = _value_and_grads(lambda q, d, h: _st(directions, partition, 2)(
        q[keep], d[keep], h[keep]), a64)
  _assert_close(got, (v, g), FP32[0])
  assert all(float(jnp.max(jnp.abs(a[~keep]))) == 0.0 for a in got[1])


@pytest.mark.parametrize("backend,per_dim", [("blockwise", None), ("interpret", True),
                                             ("interpret", False)])
def test_mnrl_matryoshka(backend, per_dim):
  # MatryoshkaLoss(model, MNRL(...), matryoshka_dims=[16, 8], weights=[1, 0.5]).
  directions, partition = CONFIGS[5]   # q-d, d-q and d-d, joint
  dims, weights = (8, 16), (0.5, 1.0)
  q, d, h = _batch(24, 16, 2, seed=8)
  got = _value_and_grads(lambda q, d, h: mj.qwen3_loss(
      q, d, h, backend=backend, matryoshka_dims=dims, matryoshka_weights=weights,
      matryoshka_per_dim=per_dim, **_kwargs(directions, partition)), [q, d, h])
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in (q, d, h)]
    want = _value_and_grads(_st(directions, partition, 2, dims, weights), a64)
  _assert_close(got, want, FP32[0])


# Shared negative columns: sentence-transformers' hard-negative columns of every row
# without their rows (no d-d group: its mask is by row), checked against MNRL with
# the columns split into [B, D] pieces; then, for every family, against a dense
# float64 formula with any number of columns.
@pytest.mark.parametrize("backend", ["reference", "blockwise"])
@pytest.mark.parametrize("directions,partition", [c for c in CONFIGS if "doc_to_doc" not in c[0]])
def test_shared_negatives_are_mnrl_columns(directions, partition, backend):
  kw = dict(_kwargs(directions, partition), share_hard_negatives=False)
  with jax.enable_x64(True):
    q, d, h = _batch(6, 8, 2, seed=2, dtype=jnp.float64)
    cols = jnp.concatenate([h[:, 0], h[:, 1]])
    got = _value_and_grads(lambda q, d, c: mj.qwen3_loss(q, d, shared_negatives=c,
                                                         backend=backend, **kw), [q, d, cols])
    want = _value_and_grads(lambda q, d, c: st.mnrl(
        q, d, [c[:6], c[6:]], scale=SCALE, directions=directions, partition_mode=partition),
        [q, d, cols])
    _assert_close(got, want, 1e-10)


def _unit(v):
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _dense(family, x, y, cols, t, dd=False):
  """float64 numpy: the rows' softmax over y and the shared columns (positive y_i),
  plus CLIP's columns' softmax over x; Qwen3 with d-d: d_i against the other documents
  and the shared columns joins row i's denominator."""
  x, y, cols = _unit(x), _unit(y), _unit(cols)
  lse = lambda z: np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
  s = x @ y.T / t
  z = np.concatenate([s, x @ cols.T / t], axis=1)
  if dd:
    s_dd = y @ y.T / t
    np.fill_diagonal(s_dd, -np.inf)
    z = np.concatenate([z, s_dd, y @ cols.T / t], axis=1)
  rows = np.mean(lse(z) - np.diag(s))
  if family != "clip":
    return rows
  return 0.5 * (rows + np.mean(lse(s.T) - np.diag(s)))


SHARED = sampled([(f, be, n) for f in ("clip", "lit", "qwen3", "qwen3_dd", "lit_qwen3")
                  for be in ("blockwise", "interpret") for n in (5, 40)],
                 lambda i, p: checkerboard((p[0], ("clip", "lit", "qwen3", "qwen3_dd",
                                                   "lit_qwen3")), (p[1], ("blockwise",
                                                                          "interpret")),
                                           (p[2], (5, 40))))


@pytest.mark.parametrize("family,backend,n_cols", SHARED)
def test_shared_negatives_every_family(family, backend, n_cols):
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "qwen3": mj.qwen3_loss,
        "qwen3_dd": functools.partial(mj.qwen3_loss, use_dd_negatives=True),
        "lit_qwen3": mj.lit_qwen3_loss}[family]
  kw = dict(margin=2.0) if "qwen3" in family else {}
  x, y, _ = _batch(20, 16, 0, seed=n_cols)
  cols = jax.random.normal(jax.random.key(n_cols), (n_cols, 16), jnp.float32)
  v, g = _value_and_grads(lambda x, y, c: fn(x, y, shared_negatives=c, temperature=0.1,
                                             stable=False, backend=backend, **kw), [x, y, cols])
  arrs = [np.asarray(a, np.float64) for a in (x, y, cols)]
  want = _dense("clip" if family == "clip" else "rows", *arrs, 0.1, dd=family == "qwen3_dd")
  assert abs(float(v) - want) <= FP32[0] * abs(want)
  # Gradients: central differences of the float64 formula, entry by entry (a slope along
  # the computed gradient alone would see an error across it only to second order).
  locked = {"lit": (1, 2), "lit_qwen3": (1, 2)}.get(family, ())
  for i, gi in enumerate(g):
    gi = np.asarray(gi, np.float64)
    if i in locked:
      assert not gi.any()
      continue

    def shift(e, at):
      moved = arrs[i].copy()
      moved[at] += e
      return _dense("clip" if family == "clip" else "rows",
                    *[moved if j == i else a for j, a in enumerate(arrs)], 0.1,
                    dd=family == "qwen3_dd")

    want_g = np.zeros_like(gi)
    for at in np.ndindex(gi.shape):
      want_g[at] = (shift(1e-6, at) - shift(-1e-6, at)) / 2e-6
    np.testing.assert_allclose(gi, want_g, rtol=0, atol=FP32[1] * np.max(np.abs(want_g)))


def test_shared_negatives_ring_splits_them():
  # sharded splits shared_negatives over the devices by their own rows: global columns.
  q, d, _ = _batch(16, 8, 0, seed=4)
  cols = jax.random.normal(jax.random.key(9), (12, 8), jnp.float32)
  kw = dict(use_dd_negatives=True, use_dq_negatives=True, margin=0.3, temperature=0.1)
  loss = mj.sharded(lambda q, d, shared_negatives, axis_name: mj.qwen3_loss(
      q, d, shared_negatives=shared_negatives, axis_name=axis_name, backend="blockwise", **kw),
      _mesh(4), "batch")
  got = _value_and_grads(lambda q, d, c: loss(q, d, shared_negatives=c), [q, d, cols])
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in (q, d, cols)]
    want = _value_and_grads(lambda q, d, c: mj.reference.qwen3_loss(
        q, d, shared_negatives=c, **kw), a64)
  _assert_close(got, want, FP32[0])
  with pytest.raises(ValueError, match="shared_negatives with shape"):
    loss(q, d, shared_negatives=cols[:10])


def test_porting_errors():
  q, d, h = _batch(4, 8, 1, seed=0)
  with pytest.raises(ValueError, match="per_direction"):
    mj.qwen3_loss(q, d, use_qq_negatives=True, partition="per_direction")
  with pytest.raises(ValueError, match="partition must be"):
    mj.qwen3_loss(q, d, partition="separate")
  with pytest.raises(ValueError, match="shared_negatives must be"):
    mj.clip_loss(q, d, shared_negatives=h)
  with pytest.raises(TypeError, match="shared_negatives must have the towers' dtype"):
    mj.lit_loss(q, d, shared_negatives=d.astype(jnp.bfloat16))
  with pytest.raises(TypeError, match="share_hard_negatives"):
    mj.qwen3_loss(q, d, h, share_hard_negatives=1)


_GROUPS = [dict(use_dq_negatives=True), dict(use_dq_negatives=True, partition="per_direction"),
           dict(use_qq_negatives=True, use_dd_negatives=True, use_dq_negatives=True,
                share_hard_negatives=True),
           dict(use_dd_negatives=True, share_hard_negatives=True, shared=True),
           dict(use_dq_negatives=True, partition="per_direction", shared=True)]
OPTIONS = sampled([(g, o, be, lit) for g in range(len(_GROUPS))
                   for o in ("tau_ls_z", "where", "dims") for be in ("blockwise", "interpret")
                   for lit in (False, True)],
                  lambda i, p: checkerboard((p[0], range(len(_GROUPS))),
                                            (p[1], ("tau_ls_z", "where", "dims")),
                                            (p[2], ("blockwise", "interpret")), (p[3], (False, True)),
                                            mod=4))


@pytest.mark.parametrize("group,option,backend,lit", OPTIONS)
def test_new_groups_with_every_option(group, option, backend, lit):
  # The d-q group, the partitions, spread hard negatives and shared columns with the
  # false-negative mask and the other options, against the dense reference (float64).
  kw = dict(_GROUPS[group], margin=0.05)
  if lit:
    if "use_dd_negatives" in kw:
      kw.pop("use_dd_negatives")
    fn, ref = mj.lit_qwen3_loss, mj.reference.lit_qwen3_loss
  else:
    fn, ref = mj.qwen3_loss, mj.reference.qwen3_loss
  shared = kw.pop("shared", False)
  q, d, h = qwen3_batch(3, 45, 24, 2)
  arrays = [q, d, h] + ([jax.random.normal(jax.random.key(1), (13, 24))] if shared else [])
  if option == "tau_ls_z":
    kw.update(tau_plus=0.05, label_smoothing=0.1, lse_square_scale=1e-3)
  elif option == "where":
    kw["where"] = where_mask(45)
  else:   # (the reference's fused Matryoshka over the same options)
    ref = functools.partial(mj.reference.matryoshka_fused, ref, dims=(8, 24))
    fn = functools.partial(fn, matryoshka_dims=(8, 24))
  compare(lambda *a, **k: fn(*a, backend=backend, **k), ref, arrays, temperature=0.1, **kw)
