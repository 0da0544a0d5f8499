"""GPU-only tests (``-m gpu``, run on the device): backend="triton" against the float64
reference, the launchers against dense jnp statistics, determinism, and the one-device
ring. fp32 runs with ``precision="ieee"`` dots (tf32 would cost ~3 digits)."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import memeff_jax as mj
from memeff_jax import _compat, _core, reference
from memeff_jax.config import RoleTiles, default_config
from memeff_jax.backends.triton import backend as launch
from tests.support import towers
from tests.support.check import compare, low_grad_bounds
from tests.support.data import (BOUNDED_CASES, decisive_margin, decisive_tau_plus, features,
                                graded_rows, qwen3_batch, where_mask, with_exact_ties)
from tests.support.elementwise import sigmoid_softplus_errors
from tests.support.families import (FAMILIES, eager_matryoshka, shared_columns_case,
                                     shared_columns_loss)
from tests.support.oracle import block_lse64, count_pairs, count_qwen3
from tests.support.rows_forward import check_rows_in_forward
from tests.support.tolerances import FP32

pytestmark = pytest.mark.gpu
# B = 1, and batches that are no multiple of any tile; every D for B = 300.
SHAPES = [(1, 16), (1, 1152)] + [(300, d) for d in (16, 72, 384, 768, 1152)] + [
    (2085, 72), (2085, 200), (2085, 384), (2085, 1152)]


def _cfg(d, dtype):
  cfg = default_config(d, dtype)
  return cfg.evolve(algorithm=dict(precision="ieee")) if dtype == jnp.float32 else cfg


@pytest.mark.parametrize("loss", ["clip", "lit"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("b,d", SHAPES)
def test_clip_lit_triton(loss, dtype, b, d):
  fn, ref = {"clip": (mj.clip_loss, reference.clip_loss),
             "lit": (mj.lit_loss, reference.lit_loss)}[loss]
  x, y = features(b + d, [(b, d), (b, d)], dtype)
  # (debiased for odd b > 1, every softmax clear of the clamp: at d = 72 tau_plus 0.1
  # leaves one within 1.8%, and the plain bf16 formula off by 0.17-0.20 of the largest
  # gradient entry)
  tau = decisive_tau_plus(x, y, 0.07, 0.1, loss == "clip") if b % 2 and b > 1 else 0.0
  compare(lambda *a, **k: fn(*a, backend="triton", config=_cfg(d, dtype), **k), ref, [x, y],
          dtype=dtype, tau_plus=tau, label_smoothing=0.1, lse_square_scale=1e-3)


def test_sigmoid_softplus_triton():
  # test_numerics.py's check on the GPU, whose exponential (ex2.approx of a rounded
  # exponent) and division (div.full) are approximate: within 8 ulp (9.6e-7) relative,
  # plus the exponent's 2^-24 |u| (tests.support.elementwise).
  assert sigmoid_softplus_errors(interpret=False, tol=9.6e-7) <= 1.0


@pytest.mark.parametrize("lit", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("b,d", [(1, 16), (300, 72), (2085, 384), (300, 768), (300, 1152)])
def test_qwen3_triton(lit, dtype, b, d):
  q, doc, h = qwen3_batch(b, b, d, 3, dtype)
  opts = dict(use_qq_negatives=True, margin=decisive_margin(q, doc, h, (d,), 0.05),
              tau_plus=0.05, label_smoothing=0.1)
  if not lit:
    opts["use_dd_negatives"] = True
  fn, ref = ((mj.lit_qwen3_loss, reference.lit_qwen3_loss) if lit else
             (mj.qwen3_loss, reference.qwen3_loss))
  compare(lambda *a, **k: fn(*a, backend="triton", config=_cfg(d, dtype), **k),
          lambda *a, **k: ref(*a, **k), [q, doc, h], dtype=dtype, **opts)


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("d", [16, 384, 1152])
@pytest.mark.parametrize("two_sided,masked", [(True, False), (False, True), (False, False)])
def test_launchers_vs_dense(tiled, d, two_sided, masked):
  # The block op's statistics and VJP against jax.vjp of the same dense formula on a
  # rectangular block (n != m), masked or two-sided, diagonal excluded.
  n, m = 777, 1029
  x, y = features(d, [(n, d), (m, d)], jnp.float32)
  x, y = mj.reference.normalize(x), mj.reference.normalize(y)
  scale = jnp.float32(1 / 0.05)
  thr = (x @ y[:n].T).diagonal() + 0.02 if masked else None
  cfg = _cfg(d, jnp.float32)
  if tiled:   # both tiled passes, 64-row slabs (n = 777 spans 13 of them)
    tiles = dict(block_m=64, block_n=64, block_d=32, num_stages=3)
    cfg = cfg.evolve(algorithm=dict(fwd_tiled=True, fwd_bounded=True, bwd_tiled=True),
                     fwd=tiles, bwd=tiles, budgets=dict(slab_kib=1, min_slab_rows=1))
  spec = _core.BlockSpec(backend=mj.backends.resolve("triton"), two_sided=two_sided,
                         exclude_self=True, config=cfg)
  row_off, col_off = 0, 0

  def dense(x, y, scale):
    s = jnp.dot(x, y.T, precision=jax.lax.Precision.HIGHEST)
    keep = jnp.arange(n)[:, None] + row_off != jnp.arange(m)[None, :] + col_off
    if masked:
      keep &= s <= thr[:, None]
    z = jnp.where(keep, scale * s, -jnp.inf)
    return jax.nn.logsumexp(z, axis=1), (jax.nn.logsumexp(z, axis=0) if two_sided else None)

  got, vjp = jax.vjp(lambda x, y, s: _core.block_lse(x, y, s, thr, spec=spec)[:2], x, y, scale)
  want, vjp_ref = jax.vjp(dense, x, y, scale)
  g = (jax.random.normal(jax.random.key(1), (n,)),
       jax.random.normal(jax.random.key(2), (m,)) if two_sided else None)
  # A log-sum-exp's rounding error is absolute (the sum's relative error), so values
  # near 0 get an atol: 1e-6 of the largest finite |lse|. (Masked, at d = 384 one row
  # keeps no column: its lse is -inf, which must match exactly, and must not set the atol.)
  for a, b in zip(got, want):
    if b is not None:
      top = float(jnp.max(jnp.where(jnp.isfinite(b), jnp.abs(b), 0.0)))
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * top)
  for a, b in zip(vjp(g), vjp_ref(g)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(b))))
  # The maxima (in-batch accuracy) against the dense masked maxima.
  s = jnp.dot(x, y.T, precision=jax.lax.Precision.HIGHEST)
  keep = jnp.arange(n)[:, None] != jnp.arange(m)[None, :]
  if masked:
    keep &= s <= thr[:, None]
  z = jnp.where(keep, scale * s, -jnp.inf)
  maxima = _core.block_lse(x, y, scale, thr, spec=spec)[2:]
  for a, b in zip(maxima, (jnp.max(z, axis=1), jnp.max(z, axis=0) if two_sided else None)):
    if b is not None:
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss,d", [("clip", 128), ("clip", 512), ("qwen3", 512),
                                    ("clip", 1024), ("lit", 1024), ("qwen3", 1024)])
def test_deterministic(loss, d):
  # d <= 512: tiled forward, FlashAttention-shaped gradient; d = 1024: both tiled, the
  # gradient paired (three coefficient slabs at this batch); LiT's and Qwen3's queries
  # at d = 1024: the rows' gradient from the forward's coefficient slabs (Qwen3's
  # documents: their own slabs).
  b = 8192 + 37
  x, y = features(0, [(b, d), (b, d)], jnp.bfloat16)
  fn = {"clip": lambda x, y: mj.clip_loss(x, y, backend="triton", deterministic=True),
        "qwen3": lambda x, y: mj.qwen3_loss(x, y, use_qq_negatives=True, use_dd_negatives=True,
                                            backend="triton", deterministic=True),
        "lit": lambda x, y: mj.lit_loss(x, y, backend="triton", deterministic=True)}[loss]
  step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
  runs = [jax.tree.map(np.asarray, step(x, y)) for _ in range(5)]
  for r in runs[1:]:
    for a, b in zip(jax.tree.leaves(r), jax.tree.leaves(runs[0])):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("loss,d", [("clip", 128), ("clip", 256), ("clip", 512), ("lit", 512),
                                    ("qwen3", 512)])
def test_tma_loads_triton(loss, d):
  # The FlashAttention-shaped gradient with its tiles loaded through TMA descriptors
  # (jax-triton >= 0.4; the tiles of that stack's defaults, a pass of the rows' softmax
  # alone on its own; every pass through descriptors) against the same tiles through
  # pointers (tested against the float64
  # reference by the tests above): bitwise equal; also through the float64 reference
  # on its own inputs.
  if not _compat.tma_descriptors(False):
    pytest.skip("no TMA descriptors with this GPU / jax-triton")
  b = 4096 + 37
  x, y = features(0, [(b, d), (b, d)], jnp.bfloat16)
  base = default_config(d, jnp.bfloat16, tma=True).evolve(budgets=dict(bwd_pair_max_batch=0))
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "qwen3": mj.qwen3_loss}[loss]
  step = lambda tma: jax.jit(jax.value_and_grad(
      lambda a, c, t: fn(a, c, temperature=t, backend="triton",
                         config=base.evolve(bwd=dict(tma=tma, col_role=RoleTiles(tma=tma)))),
      argnums=(0, 1, 2)))(x, y, jnp.float32(0.07))
  got, want = step(True), step(False)
  for a, c in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  compare(lambda *a, **k: fn(*a, backend="triton", config=base.evolve(
      bwd=dict(tma=True, col_role=RoleTiles(tma=True))), **k), getattr(reference, f"{loss}_loss"),
          [x, y], dtype=jnp.bfloat16)


@pytest.mark.parametrize("ws", [True, False])
def test_warp_specialized_kernel_launches(ws):
  # A GEMM tile whose feature loop Triton >= 3.9 warp-specializes on sm_90 (12 warps
  # compiled from the 4 passed; jax-triton launches with 4 unless _compat corrects it, and
  # CUDA refuses a launch narrower than the kernel's .reqntid) against XLA's float32 dot of
  # the same bf16 inputs (identical products, fp32 sums in another order: 1e-5 relative).
  if not _compat.tma_descriptors(False):
    pytest.skip("device-side tensor descriptors need jax-triton >= 0.4")
  from tests.support.ws_kernel import TILE, WARPS, ws_matmul  # pylint: disable=g-import-not-at-top
  n, m, d = 1000, 700, 256
  x, y = features(11, [(n, d), (m, d)], jnp.bfloat16)
  got = jax.jit(lambda a, b: _compat.triton_call(
      a, b, n, m, kernel=ws_matmul, out_shapes=[jax.ShapeDtypeStruct((n, m), jnp.float32)],
      grid=(-(-n // TILE["BM"]), -(-m // TILE["BN"])), name="ws_matmul", num_warps=WARPS,
      num_stages=3, D=d, WS=ws, **TILE)[0])(x, y)
  want = jnp.dot(x.astype(jnp.float32), y.astype(jnp.float32).T,
                 precision=jax.lax.Precision.HIGHEST)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-5 * float(jnp.max(jnp.abs(want))))


def test_config_over_the_gpus_shared_memory_is_a_value_error():
  # The forward's 128-column tiles of 512 fp32 features in 3 stages (0.8 MiB by
  # config.smem_bytes) exceed any GPU's shared memory: refused at jit time with a
  # ValueError naming config, where the launch used to fail inside XLA's custom call.
  # The driver's limit for an sm_90 GPU is the H100/H200's 227 KiB.
  x, y = features(0, [(300, 512), (300, 512)], jnp.float32)
  cfg = _cfg(512, jnp.float32).evolve(fwd=dict(block_n=128, num_stages=3))
  assert mj.config.smem_bytes(cfg, 512, 4)[0] > 3 * 227 * 1024
  with pytest.raises(ValueError, match=r"^config: kernel \S+ needs \d+ bytes of shared memory"):
    jax.jit(jax.value_and_grad(lambda a, b: mj.clip_loss(a, b, backend="triton", config=cfg)))(
        x, y)
  if str(jax.devices()[0].compute_capability).startswith("9."):
    assert _compat.max_shared_bytes() == 227 * 1024


def test_kernel_cache_gives_the_same_step(tmp_path):
  # The kept kernels (MEMEFF_JAX_KERNEL_CACHE, on by default) against kernels compiled
  # afresh: processes of their own run the same steps (tests/support/cache_step.py: CLIP
  # on the Gluon / TMA kernels where jax-triton 0.4 has them, fused Matryoshka CLIP),
  # without the cache, then filling it, then from it, then in a fresh folder bounded
  # below one entry (MEMEFF_JAX_KERNEL_CACHE_MAX_MB: each store drops the others). All
  # give the same losses and gradients bit for bit; the third compiles nothing (a kernel
  # compiled is written anew, a new file) and marks every entry it loads used (a later
  # mtime); the bounded folder ends with the last entry stored alone.
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  kept, bounded = tmp_path / "kernels", tmp_path / "bounded"
  entries = lambda d: {f: (f.stat().st_ino, f.stat().st_mtime_ns)
                       for f in d.rglob(_compat._KERNEL_FILE)} if d.exists() else {}
  runs, seen = [], []
  for i, (cache, bound) in enumerate((("0", "1024"), (str(kept), "1024"), (str(kept), "1024"),
                                      (str(bounded), "0.0001"))):
    env = dict(os.environ, MEMEFF_JAX_KERNEL_CACHE=cache, MEMEFF_JAX_KERNEL_CACHE_MAX_MB=bound)
    subprocess.run([sys.executable, "-m", "tests.support.cache_step", str(tmp_path / f"{i}.npz")],
                   env=env, cwd=root, check=True)
    runs.append(dict(np.load(tmp_path / f"{i}.npz")))
    seen.append(entries(kept))
  print("lowering seconds (no cache, filling, from it, bounded):",
        [float(r["lower_s"]) for r in runs])
  assert not seen[0] and seen[1] and seen[2].keys() == seen[1].keys()
  for f, (ino, used) in seen[2].items():
    assert ino == seen[1][f][0] and used > seen[1][f][1], f
  assert len(entries(bounded)) == 1 and len(list(bounded.iterdir())) == 1
  for run in runs[1:]:
    for name, value in runs[0].items():
      if name != "lower_s":
        np.testing.assert_array_equal(run[name], value, err_msg=name)


_TRITON_CACHE_STEP = """
import os, sys, jax, memeff_jax as mj
x, y = jax.random.normal(jax.random.key(0), (2, 300, 64), jax.numpy.bfloat16)
jax.block_until_ready(jax.jit(jax.grad(lambda a: mj.clip_loss(a, y, backend="triton")))(x))
from triton.runtime.cache import get_cache_manager
kept = get_cache_manager("ab" * 32).put(b"kept", "probe.bin", binary=True)
print("jax_triton" in sys.modules, os.environ.get("TRITON_CACHE_DIR"), kept)
"""


def test_jax_triton_import_keeps_triton_cache_dir(tmp_path):
  # jax-triton sets TRITON_CACHE_DIR to "" (0.3.1) or deletes it (0.4.1) as it is
  # imported; memeff_jax imports it leaving the variable as it was. After a CLIP step on
  # the triton backend, in a process of its own, the variable is the user's and
  # Triton's own cache (torch.compile's, say) keeps its entries in that folder.
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  folder = tmp_path / "users_triton_cache"
  env = dict(os.environ, TRITON_CACHE_DIR=str(folder))
  out = subprocess.run([sys.executable, "-c", _TRITON_CACHE_STEP], env=env, cwd=root,
                       check=True, capture_output=True, text=True).stdout.splitlines()[-1].split()
  assert out[:2] == ["True", str(folder)]
  assert pathlib.Path(out[2]).read_bytes() == b"kept" and folder in pathlib.Path(out[2]).parents


@pytest.mark.parametrize("loss", ["clip", "lit", "qwen3", "lit_qwen3"])
def test_one_device_ring_equals_plain(loss):
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "qwen3": mj.qwen3_loss,
        "lit_qwen3": mj.lit_qwen3_loss}[loss]
  kw = dict(use_qq_negatives=True) if "qwen3" in loss else {}
  x, y = features(3, [(1000, 128), (1000, 128)], jnp.bfloat16)
  mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
  ring = mj.sharded(lambda a, b, axis_name: fn(a, b, axis_name=axis_name, backend="triton",
                                               **kw), mesh, "batch")
  plain = lambda a, b: fn(a, b, backend="triton", **kw)
  got = jax.jit(jax.value_and_grad(ring, argnums=(0, 1)))(x, y)
  want = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(x, y)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for a, b in zip(got[1], want[1]):   # bf16 gradients: within one rounding step
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("loss", ["clip", "lit", "siglip"])
@pytest.mark.parametrize("ring", [False, True])
def test_replicated_temperature_beside_a_data_parallel_axis(loss, ring):
  # One GPU as a 1 x 1 mesh ("dp", "batch"): the shards vary over both axes and the
  # temperature over neither, so its gradient is summed over the axes the loss varies
  # over in the op's bwd, on every kernel path (CLIP's fused forward-gradient, LiT's
  # rows, SigLIP's gradient formed in the forward); with and without the ring over
  # "batch". Equal to the plain loss's.
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "siglip": mj.siglip_loss}[loss]
  x, y = features(4, [(1000, 128), (1000, 128)], jnp.bfloat16)
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "batch"))
  f = lambda a, b, t, axis: fn(a, b, temperature=t, axis_name=axis, backend="triton")

  def per_device(a, b, t):
    v, g = jax.value_and_grad(f, argnums=(0, 1, 2))(a, b, t, "batch" if ring else None)
    return v[None], g

  shard = P(("dp", "batch"))
  run = jax.shard_map(per_device, mesh=mesh, in_specs=(shard, shard, P()),
                      out_specs=(shard, (shard, shard, P())), check_vma=True)
  got = jax.jit(run)(x, y, jnp.float32(0.07))
  want = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)), static_argnums=3)(
      x, y, jnp.float32(0.07), None)
  np.testing.assert_allclose(got[0][0], want[0], rtol=1e-6)
  np.testing.assert_allclose(got[1][2], want[1][2], rtol=1e-5)
  for a, b in zip(got[1][:2], want[1][:2]):   # bf16 gradients: within one rounding step
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(b))))


def test_triton_does_not_recompile():
  x, y = features(0, [(512, 64), (512, 64)], jnp.bfloat16)
  traces = []

  def loss(x, t):
    traces.append(1)   # once per trace: a new temperature that retraced would add one
    return mj.clip_loss(x, y, temperature=t, backend="triton")

  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  for t in (0.07, 0.3, 0.01):
    step(x, jnp.float32(t))
  assert len(traces) == 1


MRL_CASES = [(1, 16, (16,)), (300, 72, (8, 40, 72)), (2085, 512, (64, 128, 256, 512)),
             (700, 1152, (96, 384, 1152))]


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("b,d,dims", MRL_CASES)
@pytest.mark.parametrize("one_block", [False, True])
def test_matryoshka_triton(family, dtype, b, d, dims, one_block):
  # Fused Matryoshka against the float64 reference, every option on: one plain block
  # per dim (the default; the eager reference, which rounds as it does in 16-bit), and
  # one block for every dim (the fused reference; ragged ladders padded per segment).
  # bf16: the default configs (one block: the FlashAttention-shaped gradient for the
  # 64-aligned ladder at d = 512, the tiled one for the others); fp32: ieee dots on the
  # plain configs' tiles (one block: the tiled gradient).
  fam = FAMILIES[family]
  fn, ref, kw = fam.loss, fam.reference_with_stats, dict(fam.options)
  arrays = (qwen3_batch(b, b, d, 3, dtype) if "qwen3" in family else
            features(b + d, [(b, d), (b, d)], dtype))
  if "margin" in kw:   # no candidate within 16-bit rounding of a threshold, at any prefix
    kw["margin"] = decisive_margin(*arrays, dims, kw["margin"])
  weights = tuple(np.linspace(0.5, 1.5, len(dims)))
  tau = 0.05 if b % 2 and b > 1 else 0.0
  if tau and "qwen3" not in family:   # every prefix's softmaxes clear of the debiased clamp
    tau = decisive_tau_plus(*arrays, 0.07, tau, family == "clip", dims=dims)
  opts = dict(tau_plus=tau, label_smoothing=0.1, lse_square_scale=1e-3)
  cfg = _cfg(d, dtype) if dtype == jnp.float32 else None
  per_dim = None   # (the default; fp32's above d_pad 256 is one block)
  if cfg is not None or one_block:
    cfg, per_dim = cfg or default_config(d, dtype), not one_block
  ref_fn = (eager_matryoshka(ref, dims, weights, **kw) if not one_block else
            lambda *a, **k: reference.matryoshka_fused_with_stats(
                ref, *a, dims=dims, weights=weights, **kw, **k)[0])
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, matryoshka_dims=dims,
                             matryoshka_weights=weights, matryoshka_per_dim=per_dim, **kw,
                             **k),
          ref_fn, arrays, dtype=dtype, **opts)


@pytest.mark.parametrize("loss", ["clip", "qwen3"])
def test_matryoshka_deterministic(loss):
  b, d, dims = 8192 + 37, 512, (64, 128, 256, 512)
  x, y = features(0, [(b, d), (b, d)], jnp.bfloat16)
  kw = dict(backend="triton", matryoshka_dims=dims)
  fn = {"clip": lambda x, y: mj.clip_loss(x, y, **kw),
        "qwen3": lambda x, y: mj.qwen3_loss(x, y, use_qq_negatives=True, **kw)}[loss]
  step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
  runs = [jax.tree.map(np.asarray, step(x, y)) for _ in range(3)]
  for r in runs[1:]:
    for a, b_ in zip(jax.tree.leaves(r), jax.tree.leaves(runs[0])):
      np.testing.assert_array_equal(a, b_)


@pytest.mark.parametrize("per_dim", [False, True])
def test_matryoshka_one_device_ring_equals_plain(per_dim):
  # Both forms (one block for all dims, one ring per dim) through a one-device ring.
  x, y = features(4, [(1000, 128), (1000, 128)], jnp.bfloat16)
  kw = dict(backend="triton", matryoshka_dims=(32, 64, 128), matryoshka_per_dim=per_dim,
            config=default_config(128, jnp.bfloat16))
  mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
  ring = mj.sharded(lambda a, b, axis_name: mj.clip_loss(a, b, axis_name=axis_name, **kw),
                    mesh, "batch")
  got = jax.jit(jax.value_and_grad(ring, argnums=(0, 1)))(x, y)
  want = jax.jit(jax.value_and_grad(lambda a, b: mj.clip_loss(a, b, **kw), argnums=(0, 1)))(x, y)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for a, b in zip(got[1], want[1]):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("d", [128, 512])
@pytest.mark.parametrize("case", ["clip", "lit", "qwen3", "siglip", "clip_mrl"])
def test_under_set_mesh_triton(case, d):
  # One GPU as a one-device mesh on Explicit axes, set by jax.set_mesh: the kernels'
  # outputs (built from shapes, on no mesh) meet loop carries that jnp makes on the
  # mesh. bf16, the backend's own tiles (the Gluon passes at d = 512 where they run);
  # the loss on its own and through sharded equal the jitted call with no mesh set.
  fn = {"clip": mj.clip_loss, "lit": mj.lit_loss, "qwen3": mj.qwen3_loss,
        "siglip": mj.siglip_loss, "clip_mrl": mj.clip_loss}[case]
  kw = dict(backend="triton")
  if case == "clip_mrl":
    kw.update(matryoshka_dims=(d // 4, d // 2, d))
  x, y = features(5, [(1000, d), (1000, d)], jnp.bfloat16)
  step = lambda f: jax.value_and_grad(lambda a, b: f(a, b, **kw), argnums=(0, 1))
  want = jax.jit(step(fn))(x, y)
  mesh = jax.make_mesh((1,), ("batch",), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    got = [jax.jit(step(fn))(x, y), step(mj.sharded(fn, mesh, "batch"))(x, y)]
  for v, g in got:
    np.testing.assert_allclose(v, want[0], rtol=1e-6)
    for a, b in zip(g, want[1]):   # bf16 gradients: within one rounding step
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rows,t,exact", BOUNDED_CASES)
def test_bounded_forward_triton(rows, t, exact, dtype):
  # tests/test_numerics.py's cases on the GPU, whose exp2 flushes subnormal terms to
  # zero: the bounded sums alone are exact or not as the case says (asserted), and the
  # losses match the float64 reference either way.
  cos_lo, cos_hi, length = rows
  x, y = (length * v.astype(dtype) for v in graded_rows(7, 1500, 64, cos_lo, cos_hi))
  cfg = _cfg(64, dtype).evolve(algorithm=dict(fwd_tiled=True, fwd_bounded=True))
  lse_r, lse_c, _, _ = launch.lse_fwd(x, y, jnp.float32(1 / t), None, (0, 0), two_sided=True,
                                      exclude_self=True, config=cfg, interpret=False,
                                      bounded=True, want_max=False)
  ref_r, ref_c = block_lse64(x.astype(jnp.float32), y.astype(jnp.float32), t)
  close = lambda a, b: np.allclose(np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-4)
  assert (close(lse_r, ref_r) and close(lse_c, ref_c)) == exact
  for fn, ref in [(mj.clip_loss, reference.clip_loss), (mj.lit_loss, reference.lit_loss)]:
    compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, **k), ref, [x, y],
            temperature=t, dtype=dtype, normalized_inputs=True)


@pytest.mark.parametrize("d,dtype", [(72, jnp.float32), (512, jnp.bfloat16), (1152, jnp.bfloat16)])
def test_accuracy_triton(d, dtype):
  # The kernels' maxima (sweep and tiled forwards) give the in-batch top-1 of a dense
  # count on the same (rounded) inputs.
  r = np.random.default_rng(d)
  x = r.standard_normal((1500, d))
  x, y = (jnp.asarray(v, jnp.float32).astype(dtype)
          for v in (x, x + 1.5 * r.standard_normal((1500, d))))
  want = count_pairs(np.asarray(mj.reference.normalize(x), np.float64),
                     np.asarray(mj.reference.normalize(y), np.float64))
  _, st = mj.clip_loss_with_stats(x, y, backend="triton", config=_cfg(d, dtype))
  # bf16: a near-tie may round either way; allow a handful of rows.
  tol = (2 if dtype == jnp.float32 else 5) / 1500
  np.testing.assert_allclose([st.accuracy_row, st.accuracy_col], want, atol=tol)
  q, doc, h = qwen3_batch(d, 700, d, 3, dtype)
  _, st = mj.qwen3_loss_with_stats(q, doc, h, use_qq_negatives=True, use_dd_negatives=True,
                                   margin=0.05, backend="triton", config=_cfg(d, dtype))
  want = count_qwen3(*(np.asarray(v.astype(jnp.float32), np.float64) for v in (q, doc, h)),
                     0.05, True, True)
  np.testing.assert_allclose(st.accuracy_row, want, atol=tol * 1500 / 700)


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
@pytest.mark.parametrize("path", ["sweep", "tiled", "mrl", "mrl_one_block"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_where_triton(family, path, dtype):
  # where= on the kernels (FlashAttention-shaped, tiled, Matryoshka per dim and in one
  # block) against the float64 reference on the kept rows (a static numpy mask indexes
  # them, so the reference's gradients scatter back with zeros on the removed rows).
  b, d = 1500, 384
  fn, ref, kw = (FAMILIES[family].with_stats, FAMILIES[family].reference_with_stats,
                 FAMILIES[family].options)
  cfg = _cfg(d, dtype).evolve(algorithm=dict(fwd_tiled=path != "sweep",
                                              bwd_tiled=path == "tiled"))
  dims = (64, 192, 384) if path.startswith("mrl") else None
  per_dim = path == "mrl" if dims else None
  arrays = (list(qwen3_batch(b, b, d, 3, dtype)) if "qwen3" in family else
            features(b + d, [(b, d), (b, d)], dtype))
  w = where_mask(b, seed=7)
  w[256:640] = False     # whole tiles removed
  # (no candidate within 16-bit rounding of a threshold or of the debiased clamp)
  if "margin" in kw:
    kw, tau = dict(kw, margin=decisive_margin(*arrays, dims or (d,), kw["margin"])), 0.05
  else:
    tau = decisive_tau_plus(*arrays, 0.07, 0.05, family == "clip", where=w, dims=dims)

  def ref_fn(*a, **k):
    kept = [v[w] for v in a]
    if dims is None:
      return ref(*kept, **kw, **k)[0]
    if path == "mrl":   # one block per dim: rounds as the eager wrapper does
      return eager_matryoshka(ref, dims, None, **kw)(*kept, **k)
    return reference.matryoshka_fused_with_stats(ref, *kept, dims=dims, **kw, **k)[0]

  compare(lambda *a, **k: fn(*a, where=w, backend="triton", config=cfg, matryoshka_dims=dims,
                             matryoshka_per_dim=per_dim, **kw, **k)[0],
          ref_fn, arrays, dtype=dtype, label_smoothing=0.1, tau_plus=tau)
  grads = jax.grad(lambda *a: fn(*a, where=w, backend="triton", config=cfg,
                                 matryoshka_dims=dims, matryoshka_per_dim=per_dim, **kw)[0],
                   argnums=tuple(range(len(arrays))))(*arrays)
  for g in grads:
    assert not np.any(np.asarray(g)[~w]), "a removed row got a gradient"


@pytest.mark.parametrize("family", ["clip", "qwen3"])
@pytest.mark.parametrize("b,d,dims,tiled", [(2085, 1152, None, True), (2085, 512, None, False),
                                            (2085, 512, (64, 128, 256, 512), True),
                                            (700, 1152, (96, 384, 1152), True)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_paired_gradient_triton(family, b, d, dims, tiled, dtype):
  # KernelConfig(bwd_pair=True): both towers' gradients from one set of coefficient
  # slabs (tiled gradient; Matryoshka's suffix sums in one block), against the float64
  # reference. tiled=False: bwd_pair on the FlashAttention-shaped defaults (the paired
  # gradient's own tiles, paired_config). fwd_row_grad off, so that Qwen3's one-sided
  # block pairs too.
  fn, ref, kw = {
      "clip": (mj.clip_loss, reference.clip_loss_with_stats, {}),
      "qwen3": (mj.qwen3_loss, reference.qwen3_loss_with_stats,
                dict(use_qq_negatives=True, margin=0.05))}[family]
  cfg = _cfg(d, dtype).evolve(algorithm=dict(bwd_tiled=tiled, bwd_pair=True,
                                              fwd_row_grad=False))
  per_dim = None if dims is None else False
  arrays = (qwen3_batch(b, b, d, 3, dtype) if family == "qwen3" else
            features(b + d, [(b, d), (b, d)], dtype))
  # (no candidate within 16-bit rounding of the threshold or of the debiased clamp)
  if family == "qwen3":
    kw, tau = dict(kw, margin=decisive_margin(*arrays, dims or (d,), kw["margin"])), 0.05
  else:
    tau = decisive_tau_plus(*arrays, 0.07, 0.05, True, dims=dims)
  ref_fn = (lambda *a, **k: ref(*a, **kw, **k)[0]) if dims is None else (
      lambda *a, **k: reference.matryoshka_fused_with_stats(ref, *a, dims=dims, **kw, **k)[0])
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, matryoshka_dims=dims,
                             matryoshka_per_dim=per_dim, **kw, **k),
          ref_fn, arrays, dtype=dtype, tau_plus=tau, label_smoothing=0.1)


@pytest.mark.parametrize("family", ["clip", "qwen3"])
@pytest.mark.parametrize("d", [512, 1152])
def test_paired_fp16_triton(family, d):
  # fp16 coefficient slabs into both towers: the default at d = 1152, bwd_pair on the
  # FlashAttention-shaped defaults at d = 512; debiased, smoothed, with z-loss, against the
  # float64 reference.
  fn, ref, kw = {
      "clip": (mj.clip_loss, reference.clip_loss, {}),
      "qwen3": (mj.qwen3_loss, reference.qwen3_loss, dict(use_qq_negatives=True))}[family]
  b = 2085
  cfg = default_config(d, jnp.float16).evolve(algorithm=dict(bwd_pair=True))
  arrays = features(b + d + 1, [(b, d), (b, d)], jnp.float16)
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, **kw, **k),
          lambda *a, **k: ref(*a, **kw, **k), arrays, dtype=jnp.float16, tau_plus=0.05,
          label_smoothing=0.1, lse_square_scale=1e-3)


@pytest.mark.parametrize("family,dims", [("clip", None), ("qwen3", None),
                                         ("clip", (96, 384, 1152)), ("siglip", None)])
def test_paired_column_blocks_triton(family, dims):
  # The paired tiled gradient (the default at d = 1152) with its slabs in column blocks
  # of 512 (Budgets.pair_block_cols; 2085 columns: four blocks and one of 37), bf16,
  # debiased and smoothed, against the float64 reference; Matryoshka in one block;
  # SigLIP's gradient from its forward on the same slabs.
  smoothed = dict(tau_plus=0.05, label_smoothing=0.1)
  fn, ref, kw = {
      "clip": (mj.clip_loss, reference.clip_loss_with_stats, smoothed),
      "qwen3": (mj.qwen3_loss, reference.qwen3_loss_with_stats,
                dict(smoothed, use_qq_negatives=True, use_dd_negatives=True, margin=0.05)),
      "siglip": (mj.siglip_loss, reference.siglip_loss_with_stats,
                 dict(bias=-5.0))}[family]
  b, d, dtype = 2085, 1152, jnp.bfloat16
  cfg = _cfg(d, dtype).evolve(algorithm=dict(bwd_pair=True, fwd_row_grad=False),
                              budgets=dict(pair_block_cols=512, slab_kib=1024))
  arrays = (qwen3_batch(b, b, d, 3, dtype) if family == "qwen3" else
            features(b + 7, [(b, d), (b, d)], dtype))
  ref_fn = (lambda *a, **k: ref(*a, **kw, **k)[0]) if dims is None else (
      lambda *a, **k: reference.matryoshka_fused_with_stats(ref, *a, dims=dims, **kw, **k)[0])
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, matryoshka_dims=dims,
                             matryoshka_per_dim=None if dims is None else False, **kw, **k),
          ref_fn, arrays, dtype=dtype)


@pytest.mark.parametrize("smem_kib", [163, 99])
def test_matryoshka_fitted_to_smaller_gpus_triton(monkeypatch, smem_kib):
  # One-block Matryoshka CLIP (bf16, D = 512) on the tiles an A100 (163 KiB a block:
  # its FlashAttention-shaped gradient with 2 stages) or a 99 KiB GPU (the tiled
  # gradient) gets, run here against the fused float64 reference.
  monkeypatch.setattr(launch, "_device_smem_kib", lambda: smem_kib)
  b, d, dims = 300, 512, (64, 128, 256, 512)
  backend = launch.TritonBackend()
  cfg = backend.default_config(d, jnp.bfloat16)
  fitted = backend.plan(_core.BlockSpec(backend=backend, config=cfg, dims=dims),
                        jnp.zeros((b, d), jnp.bfloat16)).config
  assert ((not fitted.algorithm.bwd_tiled and fitted.bwd.num_stages == 2) if smem_kib == 163
          else fitted.algorithm.bwd_tiled)
  arrays = features(b + d, [(b, d), (b, d)], jnp.bfloat16)
  weights = tuple(np.linspace(0.5, 1.5, len(dims)))
  compare(lambda *a, **k: mj.clip_loss(*a, backend="triton", config=cfg, matryoshka_dims=dims,
                                       matryoshka_weights=weights, matryoshka_per_dim=False,
                                       **k),
          lambda *a, **k: reference.matryoshka_fused_with_stats(
              reference.clip_loss_with_stats, *a, dims=dims, weights=weights, **k)[0],
          arrays, dtype=jnp.bfloat16, tau_plus=0.05, label_smoothing=0.1, lse_square_scale=1e-3)


@pytest.mark.parametrize("family", ["clip", "lit_qwen3"])
def test_grad_cache_triton(family):
  # grad_cache around the Triton loss equals plain value_and_grad around it, with
  # dropout and a remainder chunk. fp32 features, full-precision tower GEMMs and ieee
  # kernel dots: the two programs' embeddings may differ in an ulp (XLA fuses a scan and
  # an unrolled loop differently), which tf32's input rounding would amplify (lit_qwen3
  # erred 1.8e-5 so, h200 run of 2026-12-02); only the summation order then differs.
  params, batch = towers.params(jnp.float32), towers.batch(2085, jnp.float32, True)
  rng = jax.random.key(3)
  loss_fn = towers.loss(family, backend="triton", config=_cfg(8, jnp.float32))
  with jax.default_matmul_precision("highest"):
    got = jax.jit(mj.grad_cache(towers.embed, loss_fn, chunk_size=512))(params, batch, rng)
    want = jax.jit(towers.plain(towers.embed, loss_fn, 512))(params, batch, rng)
  towers.assert_close(got, want, 1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("lit,dims", [(False, None), (True, None), (True, (8, 24))])
def test_exact_ties_with_the_positive_are_kept_triton(lit, dims, dtype):
  # margin = 0 keeps every exact tie on the GPU's tiles as the float64 reference does
  # (the tolerance 2^-10 of docs/math.md §6).
  q, doc, h = with_exact_ties(12, 24, dtype)
  kw = dict(margin=0.0, use_qq_negatives=True, matryoshka_dims=dims)
  fn = mj.lit_qwen3_loss if lit else mj.qwen3_loss
  cfg = _cfg(24, dtype)   # fp32: ieee dots (the value tolerance is fp32's)
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, **kw, **k),
          lambda *a, **k: fn(*a, backend="reference", **kw, **k), [q, doc, h], dtype=dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("b,d,option", [(1, 16, None), (300, 72, None), (2085, 512, None),
                                        (700, 1152, None), (2085, 512, "dims"),
                                        (300, 72, "dims"), (2085, 384, "where"),
                                        (2085, 512, "default"), (300, 200, "default"),
                                        (2085, 1152, "default")])
def test_siglip_triton(b, d, option, dtype):
  # SigLIP's sigmoid epilogues against the float64 reference (the fused one for one
  # Matryoshka block): value and the gradients of x, y and t (compare), and the bias's
  # gradient (fp32: FP32's bound; bf16: compare's, low_grad_bounds).
  # "default": config=None, the backend's own tiles for this GPU and stack (16-bit: the
  # gradient from the forward on Plan.fused's tiles, 128 x 256 where TMA is counted on;
  # fp32: those tiles with "ieee" dots, as _cfg's, the default tf32 costing ~3 digits).
  x, y = features(b + d, [(b, d), (b, d)], dtype)
  kw = dict(bias=-5.0)
  ref, cfg = reference.siglip_loss, _cfg(d, dtype)
  if option == "default":
    cfg = None if dtype != jnp.float32 else launch.TritonBackend().default_config(
        d, dtype).evolve(algorithm=dict(precision="ieee"))
  if option == "dims":
    dims = (8, 40, 72) if d == 72 else (64, 128, 256, 512)
    kw.update(matryoshka_dims=dims, matryoshka_per_dim=False)
    cfg = cfg.evolve(algorithm=dict(matryoshka_per_dim=False))   # (the config agrees)
    ref = lambda *a, matryoshka_dims, matryoshka_per_dim, **k: reference.matryoshka_fused(
        reference.siglip_loss, *a, dims=matryoshka_dims, **k)
  if option == "where":
    kw["where"] = where_mask(b)
  fn = lambda *a, **k: mj.siglip_loss(*a, backend="triton", config=cfg, **k)
  compare(fn, ref, [x, y], dtype=dtype, temperature=0.1, **kw)
  db = lambda f, a, t: jax.grad(lambda v: f(*a, temperature=t, **dict(kw, bias=v)))
  got = float(db(fn, [x, y], jnp.float32(0.1))(jnp.float32(-5.0)))
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(v, np.float64)) for v in (x, y)]
    want = float(db(ref, a64, 0.1)(jnp.float64(-5.0)))
  if dtype == jnp.float32:
    tol = FP32[1]
  else:
    low = float(db(ref, [x, y], jnp.float32(0.1))(jnp.float32(-5.0)))
    tol, = low_grad_bounds([low], [want], dtype, [1e-6])
  assert abs(got - want) <= tol * abs(want), (got, want, tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("d", [2560, 4096])
@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3", "siglip"])
def test_llm_embedding_sizes_triton(family, d, dtype):
  # The feature sizes of LLM-based embedders (Qwen3-Embedding-4B's 2560, -8B's 4096), far
  # past the tests' 1152, on the backend's own tiles for this GPU and stack (config=None;
  # fp32: those tiles with "ieee" dots, the default tf32 costing ~3 digits): every family
  # against the float64 reference, value and gradients (compare).
  b = 700
  cfg = None if dtype != jnp.float32 else launch.TritonBackend().default_config(
      d, dtype).evolve(algorithm=dict(precision="ieee"))
  if family in ("qwen3", "lit_qwen3"):
    q, doc, h = qwen3_batch(b, b, d, 3, dtype)
    opts = dict(use_qq_negatives=True, margin=decisive_margin(q, doc, h, (d,), 0.05),
                label_smoothing=0.1)
    if family == "qwen3":
      opts["use_dd_negatives"] = True
    arrays, t = [q, doc, h], 0.07
  else:
    arrays, t = features(b + d, [(b, d), (b, d)], dtype), 0.07
    opts = (dict(bias=-5.0) if family == "siglip" else
            dict(label_smoothing=0.1, lse_square_scale=1e-3))
    if family == "siglip":
      t = 0.1
  fn = getattr(mj, f"{family}_loss")
  compare(lambda *a, **k: fn(*a, backend="triton", config=cfg, **k),
          getattr(reference, f"{family}_loss"), arrays, dtype=dtype, temperature=t, **opts)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", ["st_joint", "st_per_direction", "gte_where", "shared_qwen3",
                                  "shared_lit_qwen3", "shared_clip", "shared_lit", "st_dims"])
def test_porting_triton(case, dtype):
  # sentence-transformers' layouts, the d-q group and shared columns on the kernels,
  # against the float64 reference (with the false-negative mask where it drops
  # entries: qwen3_batch's near-duplicates; tests/test_porting.py ties the reference
  # to sentence-transformers itself).
  b, d = (700, 384) if dtype == jnp.float32 else (2085, 512)
  q, doc, h = qwen3_batch(b, b, d, 3, dtype)
  qwen3 = lambda *a, **k: mj.qwen3_loss(*a, backend="triton", config=_cfg(d, dtype), **k)
  kw, arrays, fn, ref, t = {}, [q, doc, h], qwen3, reference.qwen3_loss, 0.07
  # (no candidate within 16-bit rounding of the threshold: at 0.05 st_joint's plain bf16
  # formula is off by 0.68 of the hard negatives' largest gradient entry)
  margin = lambda: decisive_margin(q, doc, h, (d,), 0.05, dq=True, shared_hard=True)
  if case == "st_joint":
    kw = dict(use_qq_negatives=True, use_dq_negatives=True, use_dd_negatives=True,
              share_hard_negatives=True, margin=margin(), label_smoothing=0.1)
  elif case == "st_per_direction":
    kw = dict(use_dq_negatives=True, partition="per_direction", share_hard_negatives=True,
              margin=margin(), tau_plus=0.05)
    t = 0.5   # (a loss far from 0: debiasing the near-duplicates would cancel it)
  elif case == "gte_where":
    kw = dict(use_qq_negatives=True, use_dq_negatives=True, use_dd_negatives=True,
              margin=2.0, where=where_mask(b))
    arrays = [q, doc]
  elif case == "st_dims":   # MatryoshkaLoss around MNRL (no mask): one block per dim,
    # against the eager reference, which rounds each 16-bit prefix as that path does
    dims = (64, 128, 256, d)
    own = dict(use_dq_negatives=True, use_dd_negatives=True, share_hard_negatives=True,
               margin=2.0)
    fn = lambda *a, **k: qwen3(*a, matryoshka_dims=dims, **own, **k)
    ref = eager_matryoshka(reference.qwen3_loss_with_stats, dims, (1.0,) * 4, **own)
  else:
    family = case.removeprefix("shared_")
    ref, arrays, kw = shared_columns_case(family, b, d, dtype)
    fn = shared_columns_loss(family, _cfg(d, dtype))
  compare(fn, ref, arrays, dtype=dtype, temperature=t, **kw)


@pytest.mark.parametrize("family", ["lit", "lit_qwen3"])
@pytest.mark.parametrize("kernel", ["backend", "triton"])
def test_rows_in_forward_shared_columns_accuracy_triton(family, kernel):
  # test_porting_triton's shared-column cases (bf16, b = 2085, d = 512, 777 shared
  # columns) with the rows' gradient formed in the forward (Algorithm.fwd_row_grad), on
  # the backend's default kernel (grad_gluon's where jax-triton 0.4 runs on Hopper) and on
  # grad_bwd's: within compare's bounds. Saved in bfloat16, the gradient's second
  # rounding took LiT-Qwen3's queries to 3.93e-2 of the largest entry against 3.90e-2
  # (H200, h200_rows_forward_accuracy.csv, 2026-12-04); saved in float16 by row scales
  # (backends.base.scale_rows) it is rounded to 16 bits once, as by the gradient pass.
  cfg = launch.TritonBackend().default_config(512, jnp.bfloat16).evolve(
      algorithm=dict(fwd_row_grad=True))
  if kernel == "triton":
    if not cfg.bwd.gluon:
      pytest.skip("the backend's default kernel here is grad_bwd's: the 'backend' case")
    cfg = cfg.evolve(bwd=dict(gluon=False))
  ref, arrays, kw = shared_columns_case(family, 2085, 512, jnp.bfloat16)
  compare(shared_columns_loss(family, cfg), ref, arrays, dtype=jnp.bfloat16,
          temperature=0.07, **kw)


def _gluon_case(monkeypatch, family, b, d, masked, dtype):
  """The Gluon kernels' and the rows-in-the-forward tests' case: the family, its arrays,
  the where= mask (or None), the float64 reference on the kept rows, and the list the
  launches' names go to."""
  fam = FAMILIES[family]
  arrays = (list(qwen3_batch(b, b, d, 3, dtype)) if "qwen3" in family else
            features(b + d, [(b, d), (b, d)], dtype))
  if "margin" in fam.options:   # no candidate within 16-bit rounding of a threshold
    fam = fam._replace(options=dict(fam.options, margin=decisive_margin(
        *arrays, (d,), fam.options["margin"])))
  w = where_mask(b, seed=3) if masked else None
  names = []
  call = _compat.triton_call
  monkeypatch.setattr(_compat, "triton_call", lambda *a, **k: names.append(k["name"]) or
                      call(*a, **k))
  jax.clear_caches()

  def ref_fn(*a, **k):
    return fam.reference_with_stats(*(a if w is None else [v[w] for v in a]), **fam.options,
                                    **k)[0]
  return fam, arrays, w, ref_fn, names


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
@pytest.mark.parametrize("b,masked", [(2085, False), (300, True)])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gluon_gradient_triton(monkeypatch, family, b, masked, dtype):
  # The FlashAttention-shaped gradient as grad_gluon's warp-specialized kernel (d = 512,
  # the defaults where jax-triton >= 0.4 runs on Hopper) against the float64 reference:
  # every softmax role (CLIP's both on one shift, LiT's rows, Qwen3's queries and
  # documents with the false-negative thresholds and q-q / d-d pairs, self pairs
  # dropped), a batch of no whole tile (2085), column splits (300 rows: 5 row tiles),
  # where=, a learned temperature (the sums c s), fp16. None pairs here
  # (bwd_pair_max_batch: blocks this small would); its launches are counted.
  if not _compat.gluon_kernels(False):
    pytest.skip("no Gluon Hopper kernels with this GPU / jax-triton / Triton")
  d = 512
  cfg = launch.TritonBackend().default_config(d, dtype)
  assert cfg.bwd.gluon
  # (the rows' gradient as a gradient pass, not from the forward: fwd_row_grad's own test)
  cfg = cfg.evolve(budgets=dict(bwd_pair_max_batch=0), algorithm=dict(fwd_row_grad=False))
  fam, arrays, w, ref_fn, names = _gluon_case(monkeypatch, family, b, d, masked, dtype)

  compare(lambda *a, **k: fam.with_stats(*a, where=w, backend="triton", config=cfg,
                                         **fam.options, **k)[0],
          ref_fn, arrays, dtype=dtype, label_smoothing=0.1, tau_plus=0.05)
  assert "memeff/lse_bwd_gluon" in names and "memeff/lse_bwd" not in names, names


_ROWS_CASES = [(f, 2085, False, jnp.bfloat16, 0.07) for f in ("lit", "qwen3", "lit_qwen3")] + [
    (f, 300, True, jnp.bfloat16, 0.05) for f in ("lit", "qwen3", "lit_qwen3")] + [
    ("lit", 700, False, jnp.bfloat16, 0.005)]


@pytest.mark.parametrize("family,b,masked,dtype,t", _ROWS_CASES, ids=[
    f"{c[0]}-{c[1]}-{jnp.dtype(c[3]).name}-t{c[4]}" for c in _ROWS_CASES])
def test_gluon_rows_in_forward_triton(monkeypatch, family, b, masked, dtype, t):
  # Algorithm.fwd_row_grad (the d = 512 default where jax-triton >= 0.4 runs on Hopper): a
  # one-sided block's rows' gradient from the forward's tiles (grad_gluon's kernel with the
  # bounded shift for every lse, backward.lse_fwd_rows), scaled by the cotangents in the
  # backward (tests/support/rows_forward.py says what is checked). LiT's rows, Qwen3's
  # queries (thresholds, q-q / d-d blocks as before), a batch of no whole tile, column
  # splits (300 rows), where=. The bounded result is taken (no exact forward runs),
  # except at t = 0.005, where LiT's unaligned rows (lse ~ 40 against a floor of ~85)
  # take the exact rerun.
  if not _compat.gluon_kernels(False):
    pytest.skip("no Gluon Hopper kernels with this GPU / jax-triton / Triton")
  d = 512
  cfg = launch.TritonBackend().default_config(d, dtype)
  assert cfg.algorithm.fwd_row_grad and cfg.bwd.gluon
  fam, arrays, w, ref_fn, names = _gluon_case(monkeypatch, family, b, d, masked, dtype)
  check_rows_in_forward(monkeypatch, fam, arrays, w, ref_fn, names, backend="triton",
                        cfg=cfg.evolve(budgets=dict(bwd_pair_max_batch=0)), t=t, dtype=dtype,
                        rerun=t < 0.01)
  assert "memeff/lse_fwd_rows_gluon" in names, names


_ROWS_TRITON_CASES = [(f, d, 2085, False, 0.07) for f in ("lit", "qwen3")
                      for d in (64, 128, 256, 512)] + [
    ("lit_qwen3", 128, 300, True, 0.05), ("qwen3", 256, 300, True, 0.05),
    ("lit", 200, 700, False, 0.005), ("lit", 1024, 2085, False, 0.07),
    ("lit_qwen3", 768, 300, True, 0.05), ("qwen3", 1024, 300, True, 0.05),
    ("lit", 1000, 700, False, 0.005)]


@pytest.mark.parametrize("family,d,b,masked,t", _ROWS_TRITON_CASES,
                         ids=[f"{c[0]}-d{c[1]}-{c[2]}-t{c[4]}" for c in _ROWS_TRITON_CASES])
def test_rows_in_forward_triton_kernel(monkeypatch, family, d, b, masked, t):
  # Algorithm.fwd_row_grad on the Triton kernels, on every stack (grad_bwd's
  # FlashAttention-shaped kernel with the sums of c, backward.lse_fwd_rows; not
  # grad_gluon's), bf16, each feature size on its own default tiles (TMA loads where
  # the defaults take them): LiT's rows and Qwen3's queries (thresholds, q-q / d-d
  # blocks) in a batch of no whole tile (2085), column splits and where= (300 rows), an
  # unaligned feature size whose LiT rows at t = 0.005 take the exact rerun
  # (tests/support/rows_forward.py says what is checked). Above d_pad = 512 the tiled
  # gradient's coefficient slabs form it (LiT's and LiT-Qwen3's rows, Qwen3's queries
  # with where=; also test_qwen3_triton and test_deterministic at d = 1024).
  dtype = jnp.bfloat16
  cfg = launch.TritonBackend().default_config(d, dtype).evolve(
      bwd=dict(gluon=False), algorithm=dict(fwd_row_grad=True),
      budgets=dict(bwd_pair_max_batch=0))
  fam, arrays, w, ref_fn, names = _gluon_case(monkeypatch, family, b, d, masked, dtype)
  check_rows_in_forward(monkeypatch, fam, arrays, w, ref_fn, names, backend="triton",
                        cfg=cfg, t=t, dtype=dtype, rerun=t < 0.01)
  name = "memeff/lse_fwd_rows" + ("_tiled" if d > 512 else "")
  assert name in names and "memeff/lse_fwd_rows_gluon" not in names, names


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3", "lit_qwen3"])
@pytest.mark.parametrize("d", [64, 128, 256, 512])
@pytest.mark.parametrize("b,masked,dtype", [(2085, False, jnp.bfloat16), (300, True, jnp.float16)])
def test_gluon_forward_triton(monkeypatch, family, d, b, masked, dtype):
  # The bounded forward as stats_gluon's warp-specialized kernel (the defaults at d = 64,
  # 128, 256 and 512 where jax-triton >= 0.4 runs on Hopper): the loss and its gradients against
  # the float64 reference, and with_stats' log-sum-exps of every kept row and column and
  # its in-batch accuracies (the maxima) against those of the Triton forward on the same
  # inputs (fwd_gluon=False: the same 16-bit rounding before the GEMM; only fp32 summation
  # order differs, 1e-4 in the lse). Every family's thresholds, q-q / d-d blocks and self
  # pairs, two-sided (CLIP) and one-sided, a batch of no whole tile (2085), column splits
  # (300 rows: 3 row tiles), where=, fp16; the loss alone (no maxima) too.
  if not _compat.gluon_kernels(False):
    pytest.skip("no Gluon Hopper kernels with this GPU / jax-triton / Triton")
  cfg = launch.TritonBackend().default_config(d, dtype)
  assert cfg.fwd.gluon
  fam, arrays, w, ref_fn, names = _gluon_case(monkeypatch, family, b, d, masked, dtype)

  run = lambda c, **k: fam.with_stats(*arrays, where=w, backend="triton", config=c,
                                      **fam.options, **k)
  compare(lambda *a, **k: fam.loss(*a, where=w, backend="triton", config=cfg, **fam.options,
                                   **k),
          ref_fn, arrays, dtype=dtype, label_smoothing=0.1)
  assert "memeff/lse_fwd_gluon" in names, names
  (loss, stats), (loss_t, stats_t) = (run(c) for c in (
      cfg, cfg.evolve(fwd=dict(gluon=False))))
  keep = slice(None) if w is None else w
  np.testing.assert_allclose(loss, loss_t, rtol=1e-5)
  assert (stats.lse_col is None) == (stats_t.lse_col is None) == (family != "clip")
  for got, want in ((stats.lse_row, stats_t.lse_row), (stats.lse_col, stats_t.lse_col)):
    if got is not None:
      np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(want)[keep], rtol=0, atol=1e-4)
  assert stats.accuracy_row == stats_t.accuracy_row
  assert stats.accuracy_col == stats_t.accuracy_col
