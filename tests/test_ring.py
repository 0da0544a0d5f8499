"""The ring on 1, 2, 4 and 8 forced host devices equals one device on the concatenated
batch: values and gradients of every loss and option, with jax.grad taken outside
shard_map (``sharded``) and inside it; per-device memory stays O(local batch)."""

import functools
import itertools
import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import memeff_jax as mj
from memeff_jax.backends.triton import backend as launch
from memeff_jax.config.defaults import default_config
from tests.support.check import checkerboard, kernel_path_config, sampled
from tests.support.data import ring_batch
from tests.support.oracle import block_lse64
from tests.support.tolerances import grad_err, rel_err

B, D, K = 24, 12, 2


CASES = {
    "clip": (mj.clip_loss, 2, dict(label_smoothing=0.1, lse_square_scale=1e-2)),
    "clip_tau_rows": (mj.clip_loss, 2, dict(tau_plus="rows", stable=False)),
    "lit": (mj.lit_loss, 2, dict(tau_plus=0.1, label_smoothing=0.05)),
    "lit_tau_rows": (mj.lit_loss, 2, dict(tau_plus="rows", lse_square_scale=1e-2)),
    "qwen3": (mj.qwen3_loss, 3, dict(use_qq_negatives=True, use_dd_negatives=True,
                                     label_smoothing=0.1, margin=0.05)),
    "qwen3_tau_rows": (mj.qwen3_loss, 3, dict(use_dd_negatives=True, tau_plus="rows",
                                              lse_square_scale=1e-2)),
    "qwen3_plain": (mj.qwen3_loss, 2, dict()),
    "lit_qwen3": (mj.lit_qwen3_loss, 3, dict(use_qq_negatives=True, tau_plus=0.05,
                                             label_smoothing=0.1)),
}


def _setup(case, backend):
  fn, n_arrays, opts = CASES[case]
  q, d, h, tau = ring_batch(B, D, K)
  arrays = [q, d, h][:n_arrays]
  kw = dict(opts, backend=backend)
  if kw.get("tau_plus") == "rows":
    kw["tau_plus"] = tau
  return fn, arrays, kw


def _single(fn, arrays, kw):
  g = lambda *a: fn(*a[:-1], temperature=a[-1], **kw)
  return jax.jit(jax.value_and_grad(g, argnums=tuple(range(len(arrays) + 1))))(
      *arrays, jnp.float32(0.07))


def _assert_same(got, want):
  # Both sides are fp32 sums in different orders. The temperature's gradient cancels
  # (sum_ij c_ij s_ij): compiled at XLA's lowest CPU optimization level
  # (tests/conftest.py), one device's is 3.1e-5 from float64 for qwen3_plain, the
  # ring's 2.8e-6.
  (v, g), (rv, rg) = got, want
  assert rel_err(v, rv) <= 2e-6, (float(v), float(rv))
  for a, b in zip(g, rg):
    assert a.shape == b.shape
    tol = 6e-5 if a.ndim == 0 else 2e-5
    assert grad_err(a, b) <= tol, grad_err(a, b)


def _mesh(n):
  return Mesh(np.array(jax.devices()[:n]), ("batch",))


# The cases that run by default, by (backend, devices): every case on 2 devices with
# blockwise, two on 8, two on 1 and two on 4; the interpreter on 1, 2, 4 and 8 devices
# for one case each. The rest: slow.
_DEFAULT = {("blockwise", 2): tuple(CASES),
            ("blockwise", 8): ("lit_tau_rows", "qwen3_tau_rows"),
            ("blockwise", 1): ("clip", "qwen3"), ("blockwise", 4): ("lit", "qwen3_plain"),
            ("interpret", 8): ("clip_tau_rows",), ("interpret", 4): ("clip",),
            ("interpret", 2): ("clip",), ("interpret", 1): ("qwen3",)}
RING_PARAMS = sampled(
    [("blockwise", n, c) for n in (1, 2, 4, 8) for c in CASES] +
    [("interpret", n, c) for n in (4, 8) for c in CASES] +
    [("interpret", n, c) for n in (1, 2) for c in ("clip", "qwen3")],
    lambda i, p: p[2] in _DEFAULT[p[:2]])


@pytest.mark.parametrize("backend,n_dev,case", RING_PARAMS)
def test_grad_outside_shard_map(backend, n_dev, case):
  fn, arrays, kw = _setup(case, backend)
  tau = kw.pop("tau_plus", 0.0)
  per_shard = lambda *a, temperature, tau_plus, axis_name: fn(
      *a, temperature=temperature, tau_plus=tau_plus, axis_name=axis_name, **kw)
  loss = mj.sharded(per_shard, _mesh(n_dev), "batch")
  g = lambda *a: loss(*a[:-1], temperature=a[-1], tau_plus=tau)
  got = jax.jit(jax.value_and_grad(g, argnums=tuple(range(len(arrays) + 1))))(
      *arrays, jnp.float32(0.07))
  _assert_same(got, _single(fn, arrays, dict(kw, tau_plus=tau)))


# Each case on one backend, alternating (the rest: slow).
@pytest.mark.parametrize("backend,case", sampled(
    [(be, c) for c in ("clip", "lit_tau_rows", "qwen3", "lit_qwen3")
     for be in ("blockwise", "interpret")], lambda i, c: i in (0, 3, 4, 7)))
def test_grad_inside_shard_map(backend, case):
  # jax.grad inside shard_map: each device gets the local rows of the global gradient
  # (no doubling, no halving), and the replicated temperature its full gradient.
  fn, arrays, kw = _setup(case, backend)
  n = len(arrays)
  tau = kw.pop("tau_plus", 0.0)
  rows = [tau] if np.ndim(tau) else []    # a per-row prior is sharded like the rows

  def per_device(t, *a):
    f = lambda *b: fn(*b[:-1], temperature=b[-1], tau_plus=a[n] if rows else tau,
                      axis_name="batch", **kw)
    return jax.value_and_grad(f, argnums=tuple(range(n + 1)))(*a[:n], t)

  run = jax.shard_map(per_device, mesh=_mesh(4), in_specs=(P(),) + (P("batch"),) * (n + len(rows)),
                      out_specs=(P(), tuple([P("batch")] * n + [P()])), check_vma=True)
  got = jax.jit(run)(jnp.float32(0.07), *arrays, *rows)
  _assert_same(got, _single(fn, arrays, dict(kw, tau_plus=tau)))


@pytest.mark.parametrize("case,path", [("clip", "tiled"), ("qwen3", "tiled"),
                                       ("clip", "tiled_paired_cols")])
def test_tiled_path_on_the_ring(case, path):
  # The tiled kernels' slab loops inside shard_map (varying carries), 2 devices; paired
  # slabs in column blocks (40 columns a device: a block of 32, then one of 8), each at
  # its global column offset (the self pairs' test).
  fn, arrays, kw = _setup(case, "interpret")
  kw["config"] = kernel_path_config(path, D, jnp.float32)
  if path == "tiled_paired_cols":
    arrays = list(ring_batch(80, D, K)[:len(arrays)])
    kw["config"] = kw["config"].evolve(budgets=dict(pair_block_cols=32))
  tau = kw.pop("tau_plus", 0.0)
  per_shard = lambda *a, temperature, axis_name: fn(
      *a, temperature=temperature, tau_plus=tau, axis_name=axis_name, **kw)
  loss = mj.sharded(per_shard, _mesh(2), "batch")
  g = lambda *a: loss(*a[:-1], temperature=a[-1])
  got = jax.jit(jax.value_and_grad(g, argnums=tuple(range(len(arrays) + 1))))(
      *arrays, jnp.float32(0.07))
  _assert_same(got, _single(fn, arrays, dict(kw, tau_plus=tau)))


def test_bounded_forward_reruns_on_every_device():
  # At t = 0.005 some devices hold rows or columns below the bounded forward's floor and
  # one does not (asserted): all four rerun the exact forward together (its ring's
  # collectives must match), and the result is the one-device result.
  t = 0.005
  fn, arrays, kw = _setup("clip", "interpret")
  kw["config"] = kernel_path_config("tiled", D, jnp.float32)
  lse_r, lse_c = block_lse64(*arrays, t)
  low = (np.minimum(lse_r, lse_c) < launch.fwd_floor(1 / t)).reshape(4, -1).any(axis=1)
  assert low.any() and not low.all(), low
  loss = mj.sharded(lambda *a, temperature, axis_name: fn(
      *a, temperature=temperature, axis_name=axis_name, **kw), _mesh(4), "batch")
  value_and_grad = lambda f: jax.jit(jax.value_and_grad(
      lambda *a: f(*a[:-1], temperature=a[-1]), argnums=(0, 1, 2)))(*arrays, jnp.float32(t))
  _assert_same(value_and_grad(loss), value_and_grad(functools.partial(fn, **kw)))


def _clip_per_device(check_vma):
  """CLIP on a 4-device ring inside shard_map, each device's loss as one entry."""
  return jax.jit(jax.shard_map(lambda a, b: mj.clip_loss(a, b, axis_name="batch",
                                                         backend="blockwise")[None],
                               mesh=_mesh(4), in_specs=(P("batch"), P("batch")),
                               out_specs=P("batch"), check_vma=check_vma))


def test_every_device_returns_the_global_loss():
  q, d, _, _ = ring_batch(B, D, K)
  per_device = _clip_per_device(check_vma=True)(q, d)
  np.testing.assert_allclose(per_device, mj.clip_loss(q, d, backend="blockwise"), rtol=2e-6)


@pytest.mark.parametrize("backend,case", [("blockwise", "clip"), ("blockwise", "qwen3"),
                                          ("blockwise", "lit_tau_rows"), ("interpret", "clip")])
def test_ring_beside_a_data_parallel_axis(backend, case):
  # A 2 x 2 mesh: the ring over "batch", and "dp" data-parallel (each dp group its own
  # 12 rows, so the shards vary over both axes). Each group gets its own rows' loss
  # and gradients, as one device on those rows, and the replicated temperature the sum
  # of the groups' gradients (the ring's carries varied over its own axis only: a scan
  # carry type error at trace time).
  fn, arrays, kw = _setup(case, backend)
  n = len(arrays)
  tau = kw.pop("tau_plus", 0.0)
  rows = [tau] if np.ndim(tau) else []
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "batch"))

  def per_device(t, *a):
    f = lambda *b: fn(*b[:-1], temperature=b[-1], tau_plus=a[n] if rows else tau,
                      axis_name="batch", **kw)
    v, g = jax.value_and_grad(f, argnums=tuple(range(n + 1)))(*a[:n], t)
    return v[None], g[:n], g[n]

  shard = P(("dp", "batch"))
  run = jax.shard_map(per_device, mesh=mesh, in_specs=(P(),) + (shard,) * (n + len(rows)),
                      out_specs=(P("dp"), (shard,) * n, P()), check_vma=True)
  v, g, gt = jax.jit(run)(jnp.float32(0.07), *arrays, *rows)
  half, want_t = B // 2, 0.0
  for group in range(2):
    part = lambda a: a[group * half:(group + 1) * half]
    want = _single(fn, [part(a) for a in arrays],
                   dict(kw, tau_plus=part(tau) if rows else tau))
    _assert_same((v[group], tuple(part(a) for a in g)), (want[0], want[1][:n]))
    want_t = want_t + want[1][n]
  assert grad_err(gt, want_t) <= 6e-5, (float(gt), float(want_t))


@pytest.mark.parametrize("backend,family", [("blockwise", "clip"), ("interpret", "clip"),
                                            ("blockwise", "siglip"), ("interpret", "siglip")])
def test_per_device_losses_with_a_replicated_temperature(backend, family):
  # No ring: inside shard_map each of 4 devices takes its own rows' loss, the
  # temperature (and SigLIP's bias) replicated. Each device's row gradients are its
  # loss's; the replicated options' gradients are summed over the devices, as JAX sums
  # them for any replicated input (the op's bwd returned them varying: a custom_vjp
  # type error at trace time). SigLIP on the Triton kernels in bf16 takes the
  # gradient formed in the forward (``_core._scaled``), the others the ring's pass.
  x, y, _, _ = ring_batch(B, D, K)
  if backend == "interpret" and family == "siglip":
    x, y = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
  fn = {"clip": mj.clip_loss, "siglip": mj.siglip_loss}[family]
  opts = [jnp.float32(0.07)] + ([jnp.float32(-2.0)] if family == "siglip" else [])
  names = ["temperature", "bias"][:len(opts)]

  def loss(a, b, *o):
    return fn(a, b, backend=backend, **dict(zip(names, o)))

  def per_device(a, b, *o):
    v, g = jax.value_and_grad(loss, argnums=tuple(range(2 + len(o))))(a, b, *o)
    return v[None], g

  run = jax.shard_map(per_device, mesh=Mesh(np.array(jax.devices()[:4]), ("dp",)),
                      in_specs=(P("dp"), P("dp")) + (P(),) * len(opts),
                      out_specs=(P("dp"), (P("dp"), P("dp")) + (P(),) * len(opts)),
                      check_vma=True)
  v, g = jax.jit(run)(x, y, *opts)
  q = B // 4
  wants = [jax.value_and_grad(loss, argnums=tuple(range(2 + len(opts))))(
      x[i * q:(i + 1) * q], y[i * q:(i + 1) * q], *opts) for i in range(4)]
  tol = 2e-5 if x.dtype == jnp.float32 else 1e-2   # bf16 gradients: one rounding step
  for i, (wv, wg) in enumerate(wants):
    assert rel_err(v[i], wv) <= 2e-6, (i, float(v[i]), float(wv))
    for a, b in zip(g[:2], wg[:2]):
      assert grad_err(a[i * q:(i + 1) * q], b) <= tol, grad_err(a[i * q:(i + 1) * q], b)
  for j in range(2, 2 + len(opts)):
    want = sum(wg[j] for _, wg in wants)
    assert grad_err(g[j], want) <= 6e-5, (names[j - 2], float(g[j]), float(want))


@pytest.mark.parametrize("t", [0.07, 0.005])
def test_rows_forward_per_device_with_a_replicated_temperature(monkeypatch, t):
  # LiT in bf16 on the Triton kernels (interpreted) with the rows' gradient formed in
  # the forward (Algorithm.fwd_row_grad, the 16-bit GPU default; ring.forward_rows),
  # per device inside shard_map over "dp": its exact rerun is a loop whose fresh carry
  # (the flag, l = 1) did not vary over "dp" (a while_loop type error at trace time on
  # the GPU). At t = 0.005 the bounded floor fails and the rerun runs. Each device's
  # loss and gradients are its rows' loss's on one device; dL/dt their sum.
  from memeff_jax import ring
  from memeff_jax.backends.triton import forward
  x, y, _, _ = ring_batch(B, 16, K)
  x, y = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
  cfg = launch.TritonBackend(interpret=True).default_config(16, jnp.bfloat16).evolve(
      algorithm=dict(fwd_row_grad=True, fwd_tiled=True))
  calls = []
  rows = ring.forward_rows
  monkeypatch.setattr(ring, "forward_rows", lambda *a: calls.append(1) or rows(*a))
  loss = lambda a, b, u: mj.lit_loss(a, b, temperature=u, backend="interpret", config=cfg)
  grads = lambda a, b, u: jax.value_and_grad(loss, argnums=(0, 1, 2))(a, b, u)

  def per_device(a, b, u):
    v, g = grads(a, b, u)
    return v[None], g

  run = jax.shard_map(per_device, mesh=Mesh(np.array(jax.devices()[:4]), ("dp",)),
                      in_specs=(P("dp"), P("dp"), P()),
                      out_specs=(P("dp"), (P("dp"), P("dp"), P())), check_vma=True)
  jax.clear_caches()
  v, g = jax.jit(run)(x, y, jnp.float32(t))
  assert calls, "the rows' forward did not run"
  q, want_t = B // 4, 0.0
  # the rerun runs where a row's lse (float64 here) is below the bounded floor
  unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
  xs, ys = (unit(np.asarray(a, np.float64)).reshape(4, q, -1) for a in (x, y))
  lse = np.log(np.exp(np.einsum("kid,kjd->kij", xs, ys) / t).sum(-1))
  assert np.any(lse < forward.fwd_floor(1 / t)) == (t < 0.01), (lse.min(), t)
  for i in range(4):
    part = lambda a: a[i * q:(i + 1) * q]
    wv, wg = grads(part(x), part(y), jnp.float32(t))
    assert rel_err(v[i], wv) <= 2e-6, (i, float(v[i]), float(wv))
    assert grad_err(part(g[0]), wg[0]) <= 1e-2, grad_err(part(g[0]), wg[0])   # bf16
    assert not np.any(np.asarray(part(g[1]), np.float32))   # LiT's locked tower
    want_t = want_t + wg[2]
  assert grad_err(g[2], want_t) <= 6e-5, (float(g[2]), float(want_t))


_TRACED = {"clip": (mj.clip_loss, 2, {}), "lit": (mj.lit_loss, 2, {}),
           "qwen3": (mj.qwen3_loss, 2, {}),
           "qwen3_qqdd": (mj.qwen3_loss, 3, dict(use_qq_negatives=True,
                                                  use_dd_negatives=True)),
           "lit_qwen3": (mj.lit_qwen3_loss, 3, {}), "siglip": (mj.siglip_loss, 2, {})}
_TRACE_AXES = (list(_TRACED), ["bfloat16", "float16", "float32"], [64, 512, 1024],
               [False, True], [False, True], ["default", "paired"])
_TRACE_CASES = [c for c in itertools.product(*_TRACE_AXES)
                if not (c[5] == "paired" and c[1] == "float32")]


@pytest.mark.parametrize("family,dtype,d,mrl,ring,cfg", sampled(
    _TRACE_CASES, lambda i, c: checkerboard(*zip(c, _TRACE_AXES), mod=5)))
def test_gpu_configs_trace_inside_shard_map(family, dtype, d, mrl, ring, cfg):
  # Every family with the GPU's default configs (and the paired gradient's), traced
  # inside shard_map with check_vma on a 4-device mesh, per device over a
  # data-parallel axis ("dp") or on a ring over "batch" beside it, with the gradient
  # of every input and the temperature: the kernel paths the CPU's interpreter
  # defaults do not take (the rows' gradient in the forward and its exact rerun, the
  # slab loops of 8192 rows a device, the paired slabs, Matryoshka per dim) each type
  # their loop carries and branches by the mesh axes (LiT's rows' rerun did not:
  # a while_loop type error on the GPU). Traced only (jax.eval_shape): the loss and a
  # gradient for each input, of its shape and dtype.
  fn, k, kw = _TRACED[family]
  dtype = jnp.dtype(dtype)
  config = default_config(d, dtype)
  # (the GPU's Matryoshka form as the loss's keyword: the interpreter's default is one
  # block, and a config choosing otherwise is deprecated)
  per_dim = config.algorithm.matryoshka_per_dim
  config = config.evolve(algorithm=dict(matryoshka_per_dim=False))
  if cfg == "paired":
    config = config.evolve(algorithm=dict(bwd_pair=True, fwd_row_grad=False))
  opts = dict(kw, backend="interpret", config=config)
  if mrl:
    opts.update(matryoshka_dims=(d // 4, d // 2, d), matryoshka_per_dim=per_dim)
  n = 4 * 8192
  arrays = [jax.ShapeDtypeStruct((n, d), dtype)] * 2
  if k == 3:
    arrays.append(jax.ShapeDtypeStruct((n, 2, d), dtype))
  if ring:
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "batch"))
    spec, axis = P(("dp", "batch")), "batch"
  else:
    mesh, spec, axis = Mesh(np.array(jax.devices()[:4]), ("dp",)), P("dp"), None

  def per_device(t, *a):
    f = lambda *b: fn(*b[:-1], temperature=b[-1], axis_name=axis, **opts)
    v, g = jax.value_and_grad(f, argnums=tuple(range(k + 1)))(*a, t)
    return v[None], g

  run = jax.shard_map(per_device, mesh=mesh, in_specs=(P(),) + (spec,) * k,
                      out_specs=(spec, (spec,) * k + (P(),)), check_vma=True)
  t = jax.ShapeDtypeStruct((), jnp.float32)
  v, g = jax.eval_shape(jax.jit(run), t, *arrays)
  assert (v.shape, v.dtype) == ((4,), jnp.float32), v
  assert [(a.shape, a.dtype) for a in g] == [(a.shape, a.dtype) for a in arrays + [t]], g


def test_check_vma_off_is_refused():
  # shard_map(check_vma=False) tracks no varying axes, so jax.grad of the global loss
  # would return W times each input's gradient: refused at trace time, naming it.
  q, d, _, _ = ring_batch(B, D, K)
  with pytest.raises(ValueError, match="axis_name='batch' needs jax.shard_map.*check_vma=True"):
    _clip_per_device(check_vma=False)(q, d)


def test_with_stats_through_sharded():
  q, d, _, _ = ring_batch(B, D, K)
  f = mj.sharded(mj.clip_loss_with_stats, _mesh(4), "batch")
  (loss, stats) = jax.jit(lambda a, b: f(a, b, backend="blockwise", lse_square_scale=1e-2))(q, d)
  rloss, rstats = mj.clip_loss_with_stats(q, d, backend="blockwise", lse_square_scale=1e-2)
  np.testing.assert_allclose(loss, rloss, rtol=2e-6)
  np.testing.assert_allclose(stats.z_loss, rstats.z_loss, rtol=2e-6)
  np.testing.assert_allclose(stats.lse_row, rstats.lse_row, rtol=2e-6)
  np.testing.assert_allclose(stats.lse_col, rstats.lse_col, rtol=2e-6)


def test_unequal_shards_are_padded():
  # 10 rows on 4 devices: sharded pads each shard with removed rows (where=), so the
  # loss is the 10-row loss (tests/test_where.py checks gradients and every family).
  x, y = jax.random.normal(jax.random.key(0), (2, 10, 4))
  got = mj.sharded(mj.clip_loss, _mesh(4), "batch")(x, y, backend="blockwise")
  np.testing.assert_allclose(got, mj.clip_loss(x, y, backend="blockwise"), rtol=2e-6)


@pytest.mark.parametrize("case", ["clip", "lit", "qwen3"])
def test_memory_is_local(case):
  # The compiled per-device program at global batch 8b on 8 devices needs about the
  # temporaries of batch b on one device, not 8x: the travelling tower, its column
  # statistics and its gradient are never assembled.
  fn, n_arrays, opts = CASES[case]
  b, d = 512, 64

  def temp_bytes(n_dev):
    mesh = _mesh(n_dev)
    loss = mj.sharded(lambda *a, axis_name: fn(*a, axis_name=axis_name, backend="blockwise",
                                               **opts), mesh, "batch")
    shapes = [jax.ShapeDtypeStruct((b * n_dev, d), jnp.float32)] * 2
    if n_arrays == 3:
      shapes.append(jax.ShapeDtypeStruct((b * n_dev, K, d), jnp.float32))
    g = jax.jit(jax.grad(lambda *a: loss(*a), argnums=tuple(range(n_arrays))))
    return g.lower(*shapes).compile().memory_analysis().temp_size_in_bytes

  one, eight = temp_bytes(1), temp_bytes(8)
  assert eight < 2.0 * one, (one, eight)


def test_two_process_jax_distributed():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  worker = os.path.join(os.path.dirname(__file__), "support", "distributed_worker.py")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + sys.path))
  env.pop("XLA_FLAGS", None)
  procs = [subprocess.Popen([sys.executable, worker, str(port), str(i), "blockwise"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  for r in results:
    assert abs(r["loss"] - r["ref"]) <= 2e-6 * abs(r["ref"]), r
    assert r["grad_err"] <= 1e-5, r
  assert results[0]["loss"] == results[1]["loss"]
