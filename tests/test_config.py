"""Kernel configuration: the default tile table's shared-memory budget on H100/H200 and
its fit to GPUs with less shared memory, and KernelConfig's own validation."""

import dataclasses
import itertools
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import memeff_jax as mj
from memeff_jax import classes
from memeff_jax.config import (KernelConfig, RoleTiles, default_config, fit_smem,
                               matryoshka_config, paired_config, smem_bytes)
from memeff_jax import _compat
from memeff_jax.backends.triton import backend as launch
from memeff_jax.backends.triton import backward, call
from tests.support.check import jaxpr_eqns, kernel_path_config

DIMS = [1, 16, 40, 72, 128, 200, 256, 384, 512, 768, 1024, 1152, 2048, 4096]
DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", DIMS)
def test_h100_table_fits_as_measured(d, dtype):
  # The table was measured on an H200 (227 KiB a block): fitting it changes nothing.
  cfg = default_config(d, dtype)
  itemsize = jnp.dtype(dtype).itemsize
  assert max(smem_bytes(cfg, d, itemsize)) <= 219 * 2**10
  assert default_config(d, dtype, smem_kib=227) == cfg


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("smem_kib", [163, 99, 96])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", DIMS)
def test_smaller_gpus_get_tiles_that_fit(d, dtype, smem_kib, tma):
  # (tma: with the role tiles of the descriptor defaults, which fit_smem drops where
  # they do not fit; smem_bytes counts every kind of gradient pass)
  cfg = default_config(d, dtype, smem_kib=smem_kib, tma=tma)
  assert max(smem_bytes(cfg, d, jnp.dtype(dtype).itemsize)) <= (smem_kib - 8) * 2**10


@pytest.mark.parametrize("d,dtype,error,match", [
    (-1, None, ValueError, "d must be >= 1"), (0, jnp.float32, ValueError, "d must be >= 1"),
    (64.0, jnp.float32, TypeError, "d must be an int"),
    (True, jnp.float32, TypeError, "d must be an int"),
    (64, None, TypeError, "dtype must be float16, bfloat16"),
    (64, jnp.int32, TypeError, "dtype must be float16, bfloat16"),
    (64, "features", TypeError, "dtype must be float16, bfloat16"),
    (64, jnp.float8_e4m3fn, TypeError, "dtype must be float16, bfloat16")])
def test_default_config_refuses_what_no_features_have(d, dtype, error, match):
  # A size no features have, or a dtype no backend computes in, named (d = -1 and
  # dtype None returned a float64 config).
  with pytest.raises(error, match=match):
    default_config(d, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", DIMS)
def test_b200_tiles_fit(d, dtype):
  # A B200 has an H100's 227 KiB, but its 16-bit gradient with resident rows holds one
  # more column tile (config.smem.TCGEN05_ARCHS): 64 x 64 tiles at d_pad = 512 take
  # 192 + 64 KiB, so the gradient is tiled there; everything else keeps the H100's
  # tiles (they fit with the extra tile), and so does an H100 named by its arch.
  h100 = default_config(d, dtype)
  b200 = default_config(d, dtype, smem_kib=227, arch=10)
  itemsize = jnp.dtype(dtype).itemsize
  assert max(smem_bytes(b200, d, itemsize, arch=10)) <= 219 * 2**10
  assert default_config(d, dtype, smem_kib=227, arch=9) == h100
  assert default_config(d, dtype, arch=10) == b200
  if itemsize < 4 and 256 < d <= 512:
    assert smem_bytes(h100, d, itemsize, arch=10)[1] == 256 * 2**10
    assert b200.bwd_tiled and not h100.bwd_tiled
    assert b200.evolve(bwd=h100.bwd, algorithm=dict(bwd_tiled=False)) == h100
  else:
    assert b200 == h100


BAD_ARCH = [("10", TypeError, "arch must be None or an int"), (9.0, TypeError, "arch must be None"),
            (True, TypeError, "arch must be None"), (0, ValueError, "arch must be >= 1")]
BAD_SMEM = [("227", TypeError, "smem_kib must be None or an int"),
            (227.0, TypeError, "smem_kib must be None or an int"),
            (False, TypeError, "smem_kib must be None or an int"),
            (8, ValueError, "smem_kib must be > 8"), (-1, ValueError, "smem_kib must be > 8")]
# Every public function that fits to a GPU, called with that GPU's arch and shared memory.
FITTERS = {
    "default_config": lambda arch, kib: default_config(512, jnp.bfloat16, smem_kib=kib,
                                                       arch=arch),
    "default_config_interpret": lambda arch, kib: default_config(
        512, jnp.bfloat16, interpret=True, smem_kib=kib, arch=arch),
    "fit_smem": lambda arch, kib: fit_smem(default_config(512, jnp.bfloat16), 512, 2, kib,
                                           arch),
    "smem_bytes": lambda arch, kib: smem_bytes(default_config(512, jnp.bfloat16), 512, 2,
                                               arch=arch),
    "paired_config": lambda arch, kib: paired_config(default_config(512, jnp.bfloat16), 512,
                                                     2, kib),
    "matryoshka_config": lambda arch, kib: matryoshka_config(
        default_config(512, jnp.bfloat16), (64, 512), 2, kib),
}


@pytest.mark.parametrize("fitter", ["default_config", "default_config_interpret", "fit_smem",
                                    "smem_bytes"])
@pytest.mark.parametrize("arch,error,match", BAD_ARCH)
def test_fitting_refuses_an_arch_no_gpu_has(fitter, arch, error, match):
  # A string or float arch is in no tuple of majors: it fitted silently as sm_90. Every
  # function that takes an arch refuses it, default_config before its interpreter return.
  with pytest.raises(error, match=match):
    FITTERS[fitter](arch, 227)
  assert FITTERS[fitter](10, 227) is not None   # (a B200's fits: the check is the arch's)


@pytest.mark.parametrize("fitter", ["default_config", "default_config_interpret", "fit_smem",
                                    "paired_config", "matryoshka_config"])
@pytest.mark.parametrize("smem_kib,error,match", BAD_SMEM)
def test_fitting_refuses_shared_memory_no_gpu_has(fitter, smem_kib, error, match):
  # A string failed on a comparison with no name in it; 8 KiB or less left no bytes
  # past Triton's scratch, and fitting returned a config that fits nothing.
  with pytest.raises(error, match=match):
    FITTERS[fitter](None, smem_kib)
  assert FITTERS[fitter](None, 9) is not None


def test_a100_gradient_at_512_is_tiled():
  # The H200's FlashAttention-shaped (64, 64, 2 stages) gradient tile at d = 512 holds
  # 192 KiB: over an A100's 163 KiB, so the gradient switches to the tiled kernel.
  h100 = default_config(512, jnp.bfloat16)
  a100 = default_config(512, jnp.bfloat16, smem_kib=163)
  assert not h100.bwd_tiled and smem_bytes(h100, 512, 2)[1] == 192 * 2**10
  assert a100.bwd_tiled and a100.fwd_tiled == h100.fwd_tiled


def test_estimate_agrees_with_h200_launches():
  # Launches measured on the H200 (benchmarks/NOTES.md): a (64, 64) gradient tile
  # with 3 stages at D = 512 and a (128, 64) forward sweep with 2 stages failed
  # ("Shared memory requested (262144+ b) exceeds device resources (232448 b)");
  # the shipped (64, 64, 2 stages) gradient and (128, 32, 2 stages) sweep ran.
  base = default_config(512, jnp.bfloat16)
  failed_bwd = base.evolve(bwd=dict(num_stages=3))
  failed_fwd = base.evolve(algorithm=dict(fwd_tiled=False),
                           fwd=dict(block_m=128, block_n=64, block_d=512, num_stages=2))
  ran_fwd = failed_fwd.evolve(fwd=dict(block_n=32))
  assert smem_bytes(failed_bwd, 512, 2)[1] > 232448
  assert smem_bytes(failed_fwd, 512, 2)[0] > 232448
  assert smem_bytes(base, 512, 2)[1] <= 232448 and smem_bytes(ran_fwd, 512, 2)[0] <= 232448
  # fit_smem drops the failed gradient's third stage (the shipped tile), and tiles a
  # gradient that no stage count fits.
  assert fit_smem(failed_bwd, 512, 2, 227) == base
  assert fit_smem(base.evolve(bwd=dict(block_m=128)), 512, 2, 227).bwd_tiled


def test_fit_smem_drops_role_tiles_that_do_not_fit():
  # A pass of the rows' softmax alone on 256-column tiles holds (64 + 256) x 512 bf16
  # = 320 KiB at D = 512: over an H200's 227, so fit_smem drops those tiles and keeps
  # the rest (the two-role tiles' 192 KiB fit; the columns' role keeps pointer loads).
  cfg = default_config(512, jnp.bfloat16, tma=True).evolve(
      bwd=dict(row_role=RoleTiles(block_n=256, num_stages=1)))
  assert smem_bytes(cfg, 512, 2)[1] == 320 * 2**10
  fitted = fit_smem(cfg, 512, 2, 227)
  assert fitted == cfg.evolve(bwd=dict(row_role=RoleTiles()))
  assert fitted.bwd.col_role == RoleTiles(tma=False) and not fitted.algorithm.bwd_tiled


@pytest.mark.parametrize("d", [128, 256, 512, 1024])
def test_one_sided_warps(d):
  # The 16-bit defaults: the tiled forward with 4 warps; one-sided blocks keep 8 only at
  # d_pad = 512 (measured on an H200, config.py). Matryoshka's retiled forward (64 x 64
  # tiles, 4 warps, one- or two-sided) drops the override.
  cfg = default_config(d, jnp.bfloat16)
  assert cfg.fwd_tiled and cfg.fwd_num_warps == 4
  assert cfg.fwd_one_sided_warps == (8 if d == 512 else None)
  mrl = matryoshka_config(cfg, (d // 4, d // 2, d), 2)
  assert mrl.fwd_num_warps == 4 and mrl.fwd_one_sided_warps is None
  assert default_config(d, jnp.float32).fwd_one_sided_warps is None


@pytest.mark.parametrize("bounded,want_max", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize("dims", [None, (32, 64)])
def test_tiled_forward_slabs_fit_slab_kib(two_sided, dims, bounded, want_max):
  # One slab's kernel outputs (the log-sum-exp or sum partials of every tile, per dim,
  # and the max partials unless bounded without them) stay within slab_kib, and use at
  # least half of it.
  n, d, kib = 2048, 64, 256
  cfg = KernelConfig().evolve(algorithm=dict(fwd_tiled=True),
                              fwd=dict(block_m=64, block_n=64, block_d=32),
                              budgets=dict(slab_kib=kib, min_slab_rows=1))
  x = jnp.zeros((n, d), jnp.bfloat16)
  prefix = None
  if dims is not None:
    tab = jnp.ones((len(dims), n), jnp.float32)
    prefix = (tab, tab, launch.Ladder.of(dims, 32))
  jaxpr = jax.make_jaxpr(lambda a, b: launch.lse_fwd(
      a, b, jnp.float32(1.0), None, (0, 0), two_sided=two_sided, exclude_self=False,
      config=cfg, interpret=True, prefix=prefix, bounded=bounded, want_max=want_max))(x, x)
  # The interpreted kernel launches (one-sided: [1] placeholders not counted).
  launches = [sum(v.aval.size * v.aval.dtype.itemsize for v in e.outvars if v.aval.size > 1)
              for e in jaxpr_eqns(jaxpr.jaxpr) if e.primitive.name == "pure_callback"]
  assert launches and all(kib * 2**9 < b <= kib * 2**10 for b in launches), launches


@pytest.mark.parametrize("kib,rows", [(1024, 512), (768, 384), (100, 64)])
def test_tiled_gradient_slabs_fit_slab_kib(kib, rows):
  # The paired tiled gradient's coefficient slabs ([rows, m] in the input dtype) take
  # as many rows as slab_kib holds (at least one tile): 1 MiB at m = 1024 in bf16 is two
  # whole slabs of 512 rows, and no slab exceeds the budget unless one tile does.
  n, d = 1024, 64
  cfg = default_config(d, jnp.float32, interpret=True).evolve(
      algorithm=dict(bwd_tiled=True, bwd_pair=True), bwd=dict(block_m=64, block_n=64,
                                                              block_d=32),
      budgets=dict(slab_kib=kib, min_slab_rows=1))
  x = jnp.zeros((n, d), jnp.bfloat16).at[:, 0].set(1.0)
  jaxpr = jax.make_jaxpr(jax.grad(lambda a, b: mj.clip_loss(a, b, backend="interpret",
                                                            config=cfg), argnums=(0, 1)))(x, x)
  slabs = [v.aval for e in jaxpr_eqns(jaxpr.jaxpr) if e.primitive.name == "pure_callback"
           for v in e.outvars if v.aval.dtype == jnp.bfloat16 and v.aval.ndim == 3]
  assert slabs and all(a.shape == (1, rows, n) for a in slabs), slabs
  assert rows * n * 2 <= max(kib * 2**10, 64 * n * 2)


@pytest.mark.parametrize("cols,blocks", [(0, [1000]), (256, [256, 256, 256, 232]),
                                         (300, [256, 256, 256, 232]), (5000, [1000])])
def test_paired_slabs_in_column_blocks(cols, blocks):
  # Budgets.pair_block_cols: the paired tiled gradient's slabs span whole column tiles
  # of at most that many columns (the last block what is left), and the budget then
  # counts a block's columns: 1 MiB of bf16 is 2048 rows of 256 columns, or all 1000
  # rows; 0 (or more than the batch): every column at once, 512-row slabs.
  n, d = 1000, 64
  cfg = default_config(d, jnp.float32, interpret=True).evolve(
      algorithm=dict(bwd_tiled=True, bwd_pair=True), bwd=dict(block_m=64, block_n=64,
                                                              block_d=32),
      budgets=dict(slab_kib=1024, min_slab_rows=1, pair_block_cols=cols))
  x = jnp.zeros((n, d), jnp.bfloat16).at[:, 0].set(1.0)
  jaxpr = jax.make_jaxpr(jax.grad(lambda a, b: mj.clip_loss(a, b, backend="interpret",
                                                            config=cfg), argnums=(0, 1)))(x, x)
  slabs = [v.aval.shape for e in jaxpr_eqns(jaxpr.jaxpr) if e.primitive.name == "pure_callback"
           for v in e.outvars if v.aval.dtype == jnp.bfloat16 and v.aval.ndim == 3]
  rows = 1024 if len(blocks) > 1 else 512   # (the 1000 rows padded to whole tiles)
  assert sorted(set(slabs)) == sorted({(1, rows, w) for w in blocks}), slabs


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("d", [16, 200, 512, 1152])
def test_matryoshka_per_dim_defaults(d, dtype):
  # One block per dim in the GPU defaults (and fitted to a smaller GPU), but for fp32
  # above d_pad = 256; the interpreter's defaults and a bare KernelConfig keep the
  # one-block path.
  want = dtype != jnp.float32 or d <= 256
  assert default_config(d, dtype).matryoshka_per_dim == want
  assert default_config(d, dtype, smem_kib=99).matryoshka_per_dim == want
  assert not default_config(d, dtype, interpret=True).matryoshka_per_dim
  assert not KernelConfig().matryoshka_per_dim


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("d", [16, 512, 1152])
def test_bounded_forward_defaults(d, dtype):
  # The bounded forward rounds its exponent arguments at ~96 (docs/math.md §3): on by
  # default for 16-bit inputs only, on the GPU and under the interpreter alike.
  want = jnp.dtype(dtype).itemsize < 4
  assert default_config(d, dtype).fwd_bounded == want
  assert default_config(d, dtype, smem_kib=99).fwd_bounded == want
  assert default_config(d, dtype, interpret=True).fwd_bounded == want


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_measured_tiles(dtype):
  # Tiles chosen from H200 timings (config.py, benchmarks/NOTES.md, f70b363): the
  # 16-bit gradient at d_pad = 128 on 64 x 128 with 4 warps (at 64: 128 x 64; fp32
  # keeps 128 x 64 with 8 warps), and one-block Matryoshka's forward on 128 x 64 with 4
  # warps for 16-bit inputs, 64 x 64 for fp32 (128 x 64 spills there).
  wide = jnp.dtype(dtype).itemsize == 4
  grad = {128: (128, 64, 8) if wide else (64, 128, 4), 64: (128, 64, 8 if wide else 4)}
  for d, want in grad.items():
    cfg = default_config(d, dtype)
    assert (cfg.bwd_block_m, cfg.bwd_block_n, cfg.bwd_num_warps) == want
  mrl = matryoshka_config(default_config(512, dtype), (64, 128, 256, 512),
                          jnp.dtype(dtype).itemsize)
  assert (mrl.fwd_block_m, mrl.fwd_block_n, mrl.fwd_num_warps) == ((64 if wide else 128), 64, 4)


@pytest.mark.parametrize("smem_kib", [None, 227, 99])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [40, 512, 1152])
def test_paired_config(d, dtype, smem_kib):
  # bwd_pair on a FlashAttention-shaped config gets the tiled gradient's tiles, on a
  # chunk of at most 64 (fp32: 32) features, fitting the GPU's shared memory; a tiled
  # config keeps its own. Paired in the defaults where the gradient is tiled (16-bit,
  # d_pad > 512) and nowhere else.
  itemsize = jnp.dtype(dtype).itemsize
  cfg = default_config(d, dtype).evolve(algorithm=dict(bwd_tiled=False, bwd_pair=True))
  got = paired_config(cfg, d, itemsize, smem_kib)
  assert got.bwd_tiled and (got.bwd_block_m, got.bwd_block_n) == (64, 128)
  assert got.bwd_block_d == min(cfg.bwd_block_d, 64 if itemsize < 4 else 32)
  assert smem_bytes(got, d, itemsize)[1] <= ((smem_kib or 227) - 8) * 2**10
  tiled = cfg.evolve(algorithm=dict(bwd_tiled=True))
  assert paired_config(tiled, d, itemsize, smem_kib) == tiled
  assert default_config(d, dtype).bwd_pair == (itemsize < 4 and d > 512)
  by_size = itemsize < 4 and 256 < d <= 512
  assert default_config(d, dtype).bwd_pair_max_batch == (16384 if by_size else 0)


def _record_gradient_paths(monkeypatch):
  """A list that gets (launcher, paired?) for every gradient launcher call: the tiled
  (``_lse_bwd_tiled``) or the FlashAttention-shaped (``_lse_bwd_fa``) one."""
  calls = []
  for name in ("_lse_bwd_tiled", "_lse_bwd_fa"):
    real = getattr(backward, name)
    monkeypatch.setattr(backward, name, lambda *a, _r=real, _n=name, **k: (
        calls.append((_n, k.get("pair") is not None)), _r(*a, **k))[1])
  return calls


@pytest.mark.parametrize("family,paired", [("clip", True), ("lit", False), ("qwen3", True)])
def test_bwd_pair_takes_tiled_gradient_where_both_towers_train(monkeypatch, family, paired):
  # bwd_pair without bwd_tiled: a block whose two towers need a gradient goes to the
  # paired tiled gradient, LiT's (one tower) stays FlashAttention-shaped.
  calls = _record_gradient_paths(monkeypatch)
  fn = dict(clip=mj.clip_loss, lit=mj.lit_loss, qwen3=mj.qwen3_loss)[family]
  cfg = default_config(64, jnp.float32, interpret=True).evolve(algorithm=dict(bwd_pair=True))
  x = jnp.zeros((8, 64), jnp.float32).at[:, 0].set(1.0)
  jax.make_jaxpr(jax.grad(lambda a, b: fn(a, b, backend="interpret", config=cfg),
                          argnums=(0, 1)))(x, x)
  assert calls and all(c == (("_lse_bwd_tiled", True) if paired else ("_lse_bwd_fa", False))
                       for c in calls), calls


@pytest.mark.parametrize("path,conds", [("paired", 1), ("default", 3)])
def test_tiled_gradient_needs_no_cond(path, conds):
  # The paired (tiled) gradient picks its shared exponential tile by tile: a CLIP step
  # traces one lax.cond (the bounded forward's exact rerun; a GPU copies its predicate
  # to the host and waits); the FlashAttention-shaped gradient adds one per tower's
  # pass (each checks the whole block).
  cfg = (default_config(16, jnp.float32, interpret=True) if path == "default" else
         kernel_path_config(path, 16, jnp.float32))
  cfg = cfg.evolve(algorithm=dict(fwd_tiled=True, fwd_bounded=True))
  x, y = jax.random.normal(jax.random.key(0), (2, 40, 16))
  jaxpr = jax.make_jaxpr(jax.value_and_grad(
      lambda a, b: mj.clip_loss(a, b, backend="interpret", config=cfg), argnums=(0, 1)))(x, y)
  names = [e.primitive.name for e in jaxpr_eqns(jaxpr.jaxpr)]
  assert "pure_callback" in names and names.count("cond") == conds, names


@pytest.mark.parametrize("m,paired", [(8, True), (9, False)])
def test_bwd_pair_max_batch_pairs_small_blocks(monkeypatch, m, paired):
  # bwd_pair off, bwd_pair_max_batch = 8: a CLIP block of 8 columns takes the paired
  # tiled gradient, one of 9 a FlashAttention-shaped pass per tower.
  calls = _record_gradient_paths(monkeypatch)
  cfg = default_config(64, jnp.float32, interpret=True).evolve(
      budgets=dict(bwd_pair_max_batch=8))
  x = jnp.zeros((m, 64), jnp.float32).at[:, 0].set(1.0)
  jax.make_jaxpr(jax.grad(lambda a, b: mj.clip_loss(a, b, backend="interpret", config=cfg),
                          argnums=(0, 1)))(x, x)
  want = ("_lse_bwd_tiled", True) if paired else ("_lse_bwd_fa", False)
  assert calls and all(c == want for c in calls), calls


@pytest.mark.parametrize("n", [1, 63, 64, 4100, 65536, 65537])
@pytest.mark.parametrize("budget_rows,min_rows", [(2048, 1), (1, 512), (64, 1), (10**6, 1)])
def test_slab_rows_even_out(n, budget_rows, min_rows):
  # The slab height: a multiple of block_m, no taller than the budget (or min_rows),
  # as few slabs as that height allows, and less than one block_m of padding a slab.
  bm, row_bytes = 64, 1024
  cfg = KernelConfig().evolve(budgets=dict(slab_kib=budget_rows, min_slab_rows=min_rows))
  rows = call.slab_rows(n, bm, row_bytes, cfg, min_rows=min_rows)
  cap = max(budget_rows // bm * bm, -(-min_rows // bm) * bm, bm)
  slabs = -(-n // rows)
  assert rows % bm == 0 and rows <= cap
  assert slabs == -(-n // min(cap, n))
  assert slabs * rows - n < slabs * bm


@pytest.mark.parametrize("family", ["clip", "lit", "qwen3"])
def test_loss_functions_skip_the_maxima(monkeypatch, family):
  # A loss function asks the kernels for no maxima (its stats are dropped; the tiled
  # forward then runs bounded without them); the *_with_stats function asks for them.
  # The loss is bitwise the same either way. memeff's class names call the loss function.
  jax.clear_caches()   # the block op is jitted: a trace cached by another test calls nothing
  calls = []
  real = launch.lse_fwd
  monkeypatch.setattr(launch, "lse_fwd", lambda *a, **k: (
      calls.append((k.get("bounded", False), k.get("want_max", True))), real(*a, **k))[1])
  fn = dict(clip=mj.clip_loss, lit=mj.lit_loss, qwen3=mj.qwen3_loss)[family]
  stats_fn = getattr(mj, f"{fn.__name__}_with_stats")
  cfg = default_config(16, jnp.float32, interpret=True).evolve(
      algorithm=dict(fwd_tiled=True, fwd_bounded=True))
  x, y = jax.random.normal(jax.random.key(0), (2, 40, 16))
  loss = fn(x, y, backend="interpret", config=cfg)
  # (the exact rerun is traced too: lax.cond)
  assert set(calls) == {(True, False), (False, False)}, calls
  calls.clear()
  with_stats, stats = stats_fn(x, y, backend="interpret", config=cfg)
  assert set(calls) == {(True, True), (False, True)} and stats.accuracy_row is not None, calls
  assert float(loss) == float(with_stats)
  calls.clear()
  name = dict(clip="CLIP", lit="LiT", qwen3="Qwen3")[family]
  wrapper = getattr(classes, f"MemoryEfficient{name}Loss")(backend="interpret")
  assert float(wrapper(x, y)) == float(fn(x, y, backend="interpret"))
  assert calls and all(not want for _, want in calls), calls


@pytest.mark.parametrize("driver,kib", [(232448, 227), (166912, 163), (101376, 99),
                                        (65536, 64), (None, 227)])
def test_the_gpus_shared_memory_comes_from_the_driver(monkeypatch, driver, kib):
  # The opt-in maximum CUDA reports (H100/H200, A100, consumer Ampere/Ada, T4), in KiB,
  # is what the default tiles are fitted to; with no driver (None) the compute
  # capability's table decides, and the CPU's device has none: the H100's 227.
  monkeypatch.setattr(_compat, "max_shared_bytes", lambda: driver)
  launch._device_smem_kib.cache_clear()
  try:
    assert launch._device_smem_kib() == kib
  finally:
    launch._device_smem_kib.cache_clear()


# The GPUs fit_smem fits to: (compute capability, KiB of shared memory one block may
# use), the A100's, a consumer Ampere GPU's (RTX 3090; Ada and Blackwell consumer
# parts have the same 99 KiB; sm_120 compiles as sm_86 does) and a B200's (as much as
# an H100, but its 16-bit gradient holds one more tile: config.smem.TCGEN05_ARCHS).
OTHER_GPUS = [(80, 163), (86, 99), (100, 227)]
_SMEM_CASES = list(itertools.product(["clip", "lit", "clip_mrl", "siglip"],
                                     [64, 128, 200, 384, 512, 1024, 1152],
                                     [jnp.bfloat16, jnp.float32]))


def _launches(monkeypatch, family, d, dtype, smem_kib, arch=None):
  """Every Triton launch of a training step of ``family`` at feature size d (batches of
  300 and 65536) on a GPU with ``smem_kib`` KiB a block and compute capability major
  ``arch``, as (kernel module, kernel name, signature, constexprs, warps, stages): the
  backend's own config choice and the launchers' own arguments (both branches of their
  conds), recorded instead of run."""
  seen = set()

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    ptr = lambda a: "*" + {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                           "int32": "i32"}[jnp.dtype(a.dtype).name]
    sig = tuple("i32" if isinstance(a, int) else ptr(a) for a in (*args, *out_shapes))
    seen.add((kernel.fn.__module__, kernel.fn.__name__, sig, tuple(sorted(constexprs.items())),
              num_warps, num_stages))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  monkeypatch.setattr(_compat, "triton_call", record)
  monkeypatch.setattr(launch, "_device_smem_kib", lambda: smem_kib)
  monkeypatch.setattr(launch, "_device_arch", lambda: arch)
  monkeypatch.setattr(mj.backends.registry, "_gpu_triton_error", lambda: None)
  jax.clear_caches()   # (a cached trace would launch nothing)
  kw = dict(backend="triton")
  if family == "clip_mrl":   # one block: its own forward and gradient tiles
    kw.update(matryoshka_dims=(d // 4, d // 2, d), matryoshka_per_dim=False)
  fn = {"lit": mj.lit_loss, "siglip": mj.siglip_loss}.get(family, mj.clip_loss)
  step = jax.grad(lambda a, b, t: fn(a, b, temperature=t, **kw), argnums=(0, 1, 2))
  for b in (300, 65536):   # (shapes only) small blocks pair their gradient, large do not
    x = jax.ShapeDtypeStruct((b, d), dtype)
    jax.eval_shape(step, x, x, jax.ShapeDtypeStruct((), jnp.float32))
  return seen


@pytest.mark.parametrize("cases", [
    pytest.param(_SMEM_CASES[::4], id="sample", marks=pytest.mark.smallgpu),
    pytest.param(_SMEM_CASES, id="all", marks=pytest.mark.slow)])
@pytest.mark.parametrize("cc,smem_kib", OTHER_GPUS)
def test_fitted_tiles_compile_within_other_gpus(monkeypatch, cc, smem_kib, cases):
  # The kernels a step launches there, compiled for that GPU by the installed Triton
  # (no GPU needed; in a process of its own, as this one runs Triton's interpreter):
  # the shared memory the compiler reports is at most the GPU's, i.e. fit_smem's
  # estimate (made from H200 launches, with the B200's extra tile) holds for that
  # compiler and architecture. (On sm_100 the H200's 16-bit gradient tile at d = 512
  # took 262,688 bytes, over the 227 KiB, before the fit knew of it.)
  pytest.importorskip("triton.backends.nvidia")
  launches = set()
  for family, d, dtype in cases:
    found = _launches(monkeypatch, family, d, dtype, smem_kib, arch=cc // 10)
    assert found, (family, d, dtype)   # (the step did reach the kernels)
    launches |= found
  specs = sorted(launches, key=repr)
  env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
  out = subprocess.run([sys.executable, "-m", "tests.support.compiled_smem", str(cc)],
                       input=json.dumps([[*s[:3], dict(s[3]), *s[4:]] for s in specs]),
                       capture_output=True, text=True, env=env, check=True,
                       cwd=pathlib.Path(__file__).parents[1])
  shared = json.loads(out.stdout.splitlines()[-1])
  over = [(s[1], s[3], s[4], s[5], b) for s, b in zip(specs, shared) if b > smem_kib * 2**10]
  assert len(shared) == len(specs) and not over, over


def _stand_in_hopper(monkeypatch, record, *, tma=True, gluon=False, arch=9, smem_kib=227):
  """An H100/H200 stood in for (or another GPU: ``arch``, ``smem_kib``), jax-triton's
  TMA descriptors (``tma``) and Gluon kernels (``gluon``) launchable or not: every
  launch goes to ``record``."""
  monkeypatch.setattr(_compat, "triton_call", record)
  monkeypatch.setattr(_compat, "tma_descriptors", lambda interpret: tma and not interpret)
  monkeypatch.setattr(_compat, "gluon_kernels", lambda interpret: gluon and not interpret)
  monkeypatch.setattr(launch, "_device_smem_kib", lambda: smem_kib)
  monkeypatch.setattr(launch, "_device_arch", lambda: arch)
  monkeypatch.setattr(mj.backends.registry, "_gpu_triton_error", lambda: None)
  jax.clear_caches()
  launch.resolve_plan.cache_clear()


@pytest.mark.parametrize("tma", [False, True])
def test_tma_loads_where_the_defaults_take_them(monkeypatch, tma):
  # With descriptors available (jax-triton >= 0.4 on Hopper, stood in for here), a
  # default training step's FlashAttention-shaped gradient takes them at d_pad = 256
  # and 512 (not at 128), except in a pass of the columns' softmax alone (Qwen3's
  # documents) at 512; a pass of the rows' alone (LiT's, Qwen3's queries) at 512
  # streams 128-column tiles in one stage; without descriptors, none of this. Shapes
  # only (the launches are recorded).
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    if "TMA" in constexprs and kernel.fn.__name__ == "_lse_bwd_kernel":
      tiles = [a.block for a in args if isinstance(a, _compat.Tiles)]
      assert len(tiles) == (2 if constexprs["TMA"] else 0), tiles
      seen.append((constexprs["D"], constexprs["HAS_ROW"], constexprs["HAS_COL"],
                   constexprs["TMA"], constexprs["BLOCK_N"], num_stages))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, tma=tma)
  for fn, d in itertools.product((mj.clip_loss, mj.lit_loss, mj.qwen3_loss), (128, 256, 512)):
    step = jax.grad(lambda a, b, f=fn: f(a, b, backend="triton"), argnums=(0, 1))
    x = jax.ShapeDtypeStruct((65536, d), jnp.bfloat16)
    jax.eval_shape(step, x, x)
  launch.resolve_plan.cache_clear()
  base = {128: (128, 3), 256: (64, 2), 512: (64, 2)}   # (block_n, stages) of the table
  want = set()
  for d, (row, col) in itertools.product((128, 256, 512), [(1, 1), (1, 0), (0, 1)]):
    rows_alone = tma and d == 512 and not col
    want.add((d, bool(row), bool(col), tma and d > 128 and not (d == 512 and not row),
              *((128, 1) if rows_alone else base[d])))
  assert set(seen) == want, sorted(set(seen))


@pytest.mark.parametrize("arch,smem_kib", [(10, 227), (12, 99), (8, 163)])
def test_other_gpus_default_to_pointer_loads(monkeypatch, arch, smem_kib):
  # Descriptors launchable (jax-triton >= 0.4, stood in for) on a GPU that is no Hopper
  # (a B200, a consumer Blackwell, an A100): the default tiles keep pointer loads (the
  # TMA tiles were measured on Hopper alone), and on the B200 the 16-bit gradient at
  # d = 512 is tiled (config.smem.TCGEN05_ARCHS), at d = 256 it keeps the H100's tile.
  # Shapes only (the launches are recorded).
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    seen.append((kernel.fn.__name__, constexprs.get("D"), constexprs.get("BLOCK_N"),
                 num_stages, any(isinstance(a, _compat.Tiles) for a in args)))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, arch=arch, smem_kib=smem_kib)
  backend = launch.TritonBackend()
  assert not backend._tma() and backend._arch() == arch   # pylint: disable=protected-access
  for fn, d in itertools.product((mj.clip_loss, mj.lit_loss, mj.siglip_loss), (256, 512)):
    step = jax.grad(lambda a, b, f=fn: f(a, b, backend="triton"), argnums=(0, 1))
    x = jax.ShapeDtypeStruct((65536, d), jnp.bfloat16)
    jax.eval_shape(step, x, x)
  launch.resolve_plan.cache_clear()
  assert seen and not any(tiles for *_, tiles in seen), seen
  fa = {(d, bn, st) for k, d, bn, st, _ in seen if k == "_lse_bwd_kernel"}
  if arch == 10:
    assert fa == {(256, 64, 2)}, fa


def test_the_gpus_arch_comes_from_its_compute_capability(monkeypatch):
  # The CPU's device has no compute capability: no arch (the H100's fit, no TMA tiles).
  class Device:
    compute_capability = "10.0"
  assert launch._device_arch() is None   # pylint: disable=protected-access
  launch._device_arch.cache_clear()   # pylint: disable=protected-access
  monkeypatch.setattr(jax, "devices", lambda: [Device()])
  try:
    assert launch._device_arch() == 10   # pylint: disable=protected-access
  finally:
    launch._device_arch.cache_clear()   # pylint: disable=protected-access


@pytest.mark.parametrize("gluon", [False, True])
def test_gluon_gradient_where_the_defaults_take_it(monkeypatch, gluon):
  # Where the Gluon Hopper kernels can be launched (stood in for here), a default training
  # step's FlashAttention-shaped gradient passes at d = 512 (16-bit) are grad_gluon's
  # kernel, on its 64 x 128 tiles of 128 features through descriptors with Gluon's
  # layout: every pass of CLIP, LiT and Qwen3; none at d = 256, in fp32, for SigLIP, a
  # Matryoshka block in one launch, or where a pass's RoleTiles turn it off; without the
  # kernels, none. Shapes only (the launches are recorded).
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    if name.startswith("memeff/lse_bwd"):
      tiles = [(a.block, a.gluon) for a in args if isinstance(a, _compat.Tiles)]
      seen.append((name, constexprs["HAS_ROW"], constexprs["HAS_COL"], tuple(tiles)))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, gluon=gluon)

  def step(fn, d, dtype=jnp.bfloat16, **kw):
    seen.clear()
    grad = jax.grad(lambda a, b: fn(a, b, backend="triton", **kw), argnums=(0, 1))
    x = jax.ShapeDtypeStruct((65536, d), dtype)
    jax.eval_shape(grad, x, x)
    return list(seen)

  on = ((64, 128), True), ((128, 128), True)
  for fn, passes in ((mj.clip_loss, {(1, 1)}), (mj.lit_loss, {(1, 0)}),
                     (mj.qwen3_loss, {(1, 0), (0, 1)})):
    got = step(fn, 512)
    assert {(r, c) for _, r, c, _ in got} == passes, got
    assert all((n == "memeff/lse_bwd_gluon") == gluon for n, *_ in got), got
    assert all(t == on for n, *_, t in got if n == "memeff/lse_bwd_gluon"), got
  off = lambda got: got and all(n == "memeff/lse_bwd" for n, *_ in got)
  assert off(step(mj.clip_loss, 256))
  assert off(step(mj.clip_loss, 512, jnp.float32))
  assert not any(n == "memeff/lse_bwd_gluon" for n, *_ in step(mj.siglip_loss, 512))
  assert off(step(mj.clip_loss, 512, matryoshka_dims=(128, 512), matryoshka_per_dim=False))
  if gluon:   # the documents' pass of Qwen3 turned off by its RoleTiles
    cfg = launch.TritonBackend().default_config(512, jnp.bfloat16)
    cfg = cfg.evolve(bwd=dict(col_role=dataclasses.replace(cfg.bwd.col_role, gluon=False)))
    got = step(mj.qwen3_loss, 512, config=cfg)
    assert {(n, r, c) for n, r, c, _ in got} == {("memeff/lse_bwd_gluon", 1, 0),
                                                  ("memeff/lse_bwd", 0, 1)}, got
  launch.resolve_plan.cache_clear()


@pytest.mark.parametrize("gluon", [False, True])
def test_gluon_forward_where_the_defaults_take_it(monkeypatch, gluon):
  # Where the Gluon Hopper kernels can be launched (stood in for here), a default step's
  # bounded forward at d = 64, 128, 256 and 512 (16-bit) is stats_gluon's kernel, on 128 x 128
  # tiles of 64 features through descriptors with Gluon's layout, both sides (CLIP) or
  # the rows' (LiT, Qwen3), the maxima only where the stats are asked for; the exact
  # forward it falls back to stays the Triton kernel; every dim's of a fused Matryoshka
  # loss run per dim (dims 64 to 512). None at d = 32 or 1024, in fp32, for SigLIP, for a
  # Matryoshka block in one launch, with fwd_gluon=False; without the kernels, none.
  # Shapes only (the launches are recorded).
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    if "fwd" in name:
      tiles = tuple((a.block, a.gluon) for a in args if isinstance(a, _compat.Tiles))
      seen.append((name, constexprs.get("BOUNDED", True), constexprs["TWO_SIDED"],
                   constexprs.get("WANT_MAX"), tiles))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, gluon=gluon)

  def step(fn, d, dtype=jnp.bfloat16, **kw):
    seen.clear()
    x = jax.ShapeDtypeStruct((65536, d), dtype)
    jax.eval_shape(lambda a, b: fn(a, b, backend="triton", **kw), x, x)
    return list(seen)

  on = (((128, 64), True), ((128, 64), True))
  for d, (fn, two, stats) in itertools.product(
      (64, 128, 256, 512), ((mj.clip_loss, True, False), (mj.lit_loss, False, False),
                   (mj.qwen3_loss, False, False), (mj.clip_loss_with_stats, True, True))):
    bounded = {(n, two_sided, want_max, tiles) for n, b, two_sided, want_max, tiles
               in step(fn, d) if b}
    want = {("memeff/lse_fwd_gluon", two, stats, on)} if gluon else {
        ("memeff/tile_lse_fwd", two, stats, ())}
    assert bounded == want, (d, fn, bounded)
  off = lambda got: got and all(n == "memeff/tile_lse_fwd" for n, *_ in got)
  assert off(step(mj.clip_loss, 32)) and off(step(mj.clip_loss, 1024))
  assert not any(n == "memeff/lse_fwd_gluon" for n, *_ in step(mj.clip_loss, 512, jnp.float32))
  assert not any(n == "memeff/lse_fwd_gluon" for n, *_ in step(mj.siglip_loss, 512))
  assert off(step(mj.clip_loss, 512, matryoshka_dims=(128, 512), matryoshka_per_dim=False))
  # one plain block per dim (the 16-bit default): each dim's forward, d = 64 included
  # (traced afresh: the plain steps above left each dim's block in jit's caches)
  jax.clear_caches()
  per_dim = [n for n, b, *_ in step(mj.clip_loss, 512, matryoshka_dims=(64, 128, 256, 512))
             if b]
  assert per_dim == ["memeff/lse_fwd_gluon" if gluon else "memeff/tile_lse_fwd"] * 4, per_dim
  cfg = launch.TritonBackend().default_config(512, jnp.bfloat16)
  assert off(step(mj.clip_loss, 512, config=cfg.evolve(fwd=dict(gluon=False))))
  launch.resolve_plan.cache_clear()


@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "no_gluon"])
def test_rows_gradient_in_the_forward_where_the_defaults_take_it(monkeypatch, gluon):
  # Algorithm.fwd_row_grad, on in the 16-bit defaults: a default training step's
  # one-sided bfloat16 block forms its rows' gradient in the forward
  # (backward.lse_fwd_rows: the FlashAttention-shaped gradient kernel with the sums of c,
  # and their maxima for the stats; grad_gluon's at d = 512 where the Gluon Hopper
  # kernels can be launched, stood in for; the tiled gradient's slabs at d = 1024), and
  # its backward has no rows' pass: LiT none at all, Qwen3 its documents' only (at
  # d = 1024 too, where the defaults pair two-sided blocks: TritonBackend.fuses_rows
  # weighs the pairing). Not CLIP (two-sided), not float16, not with fwd_row_grad=False
  # (Qwen3 at d = 1024 then pairs), not Qwen3 within bwd_pair_max_batch (paired), while
  # LiT (its columns locked) still is there. Launch names and flags only.
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    seen.append((name, constexprs.get("HAS_ROW"), constexprs.get("HAS_COL"),
                 constexprs.get("WANT_SUM"), constexprs.get("WANT_MAX")))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, gluon=gluon)

  def step(fn, d, stats=False, dtype=jnp.bfloat16, b=65536, **kw):
    seen.clear()
    loss = lambda *a: fn(*a, backend="triton", **kw)[0] if stats else fn(*a, backend="triton",
                                                                         **kw)
    x = jax.ShapeDtypeStruct((b, d), dtype)   # (b = 65536: > bwd_pair_max_batch)
    jax.eval_shape(jax.grad(loss, argnums=(0, 1)), x, x)
    return list(seen)

  fused = lambda got: [k for k in got if k[0].startswith("memeff/lse_fwd_rows")]
  for d in (64, 128, 256, 512):
    suffix = "_gluon" if gluon and d == 512 else ""
    grad_name = "memeff/lse_bwd" + suffix
    rows_pass = lambda got: [k for k in got if k[0] == grad_name and k[1:3] == (True, False)]
    for fn, stats in ((mj.lit_loss, False), (mj.lit_loss_with_stats, True),
                      (mj.qwen3_loss, False)):
      got = step(fn, d, stats)
      assert fused(got) == [("memeff/lse_fwd_rows" + suffix, True, False, True, stats)], got
      # (the exact fallback's rows' pass is traced in the loop of at most one trip)
      assert len(rows_pass(got)) == 1, got
      cols = [k for k in got if k[0] == grad_name and k[1:3] == (False, True)]
      assert len(cols) == (fn is mj.qwen3_loss), got
  tiles = lambda got, role: [k for k in got if k[0] == "memeff/tile_coef_bwd" and
                             k[1:3] == role]
  for fn, stats in ((mj.lit_loss, False), (mj.lit_loss_with_stats, True),
                    (mj.qwen3_loss, False)):
    got = step(fn, 1024, stats)
    assert fused(got) == [("memeff/lse_fwd_rows_tiled", True, False, True, stats)], got
    # (the exact fallback's rows' gradient: the tiled gradient's slabs, in the loop of at
    # most one trip; Qwen3's documents: the columns' slabs, unpaired)
    assert len(tiles(got, (True, False))) == 1, got
    assert len(tiles(got, (False, True))) == (fn is mj.qwen3_loss), got
  assert not fused(step(mj.clip_loss, 512))
  cfg = launch.TritonBackend().default_config(1024, jnp.bfloat16)
  unfused = step(mj.qwen3_loss, 1024, config=cfg.evolve(algorithm=dict(fwd_row_grad=False)))
  # (paired: the rows' role serves both towers, no columns' one; in column blocks the
  # first block's launch and the loop's over the others are traced)
  blocked = 0 < cfg.budgets.pair_block_cols < 65536
  assert not fused(unfused) and len(tiles(unfused, (True, False))) == 1 + blocked, unfused
  assert not tiles(unfused, (False, True)), unfused
  bound = launch.TritonBackend().default_config(512, jnp.bfloat16).budgets.bwd_pair_max_batch
  assert bound >= 4096
  small = step(mj.qwen3_loss, 512, b=bound)   # (paired: the rows' role's tiles, both towers)
  assert not fused(small) and len(tiles(small, (True, False))) == 1, small
  assert fused(step(mj.lit_loss, 512, b=bound)), bound
  assert not fused(step(mj.lit_loss, 512, dtype=jnp.float16))   # (bfloat16 only)
  assert not fused(step(mj.lit_loss, 256, dtype=jnp.float32))
  for d in (128, 512, 1024):
    cfg = launch.TritonBackend().default_config(d, jnp.bfloat16)
    assert cfg.algorithm.fwd_row_grad
    assert not fused(step(mj.lit_loss, d, config=cfg.evolve(algorithm=dict(fwd_row_grad=False))))
  launch.resolve_plan.cache_clear()


@pytest.mark.parametrize("tma", [False, True])
def test_siglip_fused_tiles_by_stack(monkeypatch, tma):
  # SigLIP's gradient from its forward (the tiled kernel's FWD epilogue, coefficient
  # slabs): 128 x 256 tiles where the defaults count on TMA (jax-triton 0.4, Triton >=
  # 3.7; stood in for), 128 x 128 elsewhere; 8 warps, 3 stages, 64-feature chunks either
  # way. Launch flags only.
  seen = []

  def record(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
    if name == "memeff/tile_coef_bwd" and constexprs.get("FWD"):
      seen.append((constexprs["BLOCK_M"], constexprs["BLOCK_N"], constexprs["BLOCK_K"],
                   num_warps, num_stages))
    return [jnp.zeros(s.shape, s.dtype) for s in out_shapes]

  _stand_in_hopper(monkeypatch, record, tma=tma)

  def step(**kw):
    seen.clear()
    x = jax.ShapeDtypeStruct((65536, 512), jnp.bfloat16)
    jax.eval_shape(jax.grad(lambda a, b: mj.siglip_loss(a, b, backend="triton", **kw),
                            argnums=(0, 1)), x, x)
    return set(seen)

  assert step() == {(128, 256 if tma else 128, 64, 8, 3)}
  launch.resolve_plan.cache_clear()


# The flag sets of the gradient passes a default step launches at d = 512 (CLIP's both
# roles, on one shift or two; LiT's and Qwen3's one-role passes with the thresholds,
# self pairs dropped), plus where= and fp16; the forwards' at d = 128 and 512 (two-sided
# and one-sided with the thresholds, the maxima of the stats, where=, fp16).
_GRAD = dict(D=512, HAS_ROW=False, HAS_COL=False, ROW_THR=False, COL_THR=False,
             EXCLUDE_SELF=True, WANT_CS=False, HAS_MASK=False, SHARED=False)
_FWD = dict(D=512, ROW_THR=False, EXCLUDE_SELF=True, TWO_SIDED=False, HAS_MASK=False,
            WANT_MAX=False)
_GLUON_KERNELS = [
    ("gradient", "bfloat16", dict(_GRAD, HAS_ROW=True, HAS_COL=True, SHARED=True,
                                  WANT_CS=True)),
    ("gradient", "bfloat16", dict(_GRAD, HAS_ROW=True, HAS_COL=True)),
    ("gradient", "bfloat16", dict(_GRAD, HAS_ROW=True, ROW_THR=True, WANT_CS=True)),
    ("gradient", "bfloat16", dict(_GRAD, HAS_COL=True, COL_THR=True)),
    ("gradient", "float16", dict(_GRAD, HAS_ROW=True, HAS_COL=True, SHARED=True,
                                 WANT_CS=True, HAS_MASK=True)),
    ("gradient", "bfloat16", dict(_GRAD, HAS_ROW=True, ROW_THR=True, WANT_CS=True,
                                  HAS_MASK=True, WANT_SUM=True, WANT_MAX=True,
                                  SCALED=True)),   # fwd_rows
    # the single loop (grad_gluon.SELF_SPLIT off; every build above splits: three loops)
    ("gradient", "bfloat16", dict(_GRAD, HAS_ROW=True, HAS_COL=True, SHARED=True,
                                  WANT_CS=True, SPLIT=False)),
    ("forward", "bfloat16", dict(_FWD, TWO_SIDED=True)),
    ("forward", "bfloat16", dict(_FWD, D=128, TWO_SIDED=True)),
    ("forward", "bfloat16", dict(_FWD, ROW_THR=True)),
    ("forward", "float16", dict(_FWD, D=128, TWO_SIDED=True, WANT_MAX=True, HAS_MASK=True)),
]


@pytest.mark.smallgpu
def test_gluon_kernels_compile_for_hopper():
  # grad_gluon's and stats_gluon's kernels compiled for sm_90 by the installed Triton, as
  # _compat has jax-triton compile them (Gluon's own lowering, no GPU; in a process of
  # its own, as this one runs Triton's interpreter): a TMA producer warp and two consumer
  # warp groups (12 warps in the PTX's .reqntid, which _compat launches with) within the
  # H100's 227 KiB, each consumer's wgmma left in flight (a full wait at the gradient
  # tile's S and P @ y only: 4 a loop, so 12 in the three loops of SPLIT, its default
  # with self pairs; at the forward tile's S, 2; Triton's make_ttgir on the same module
  # waits after every one).
  pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
  specs = [list(k) for k in _GLUON_KERNELS]
  env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
  out = subprocess.run([sys.executable, "-m", "tests.support.gluon_compiled"],
                       input=json.dumps(specs), capture_output=True, text=True, env=env,
                       check=True, cwd=pathlib.Path(__file__).parents[1])
  reports = json.loads(out.stdout.splitlines()[-1])
  assert len(reports) == len(specs)
  for spec, r in zip(specs, reports):
    assert (r["reqntid_warps"], r["partitioned"], r["ptxas_rc"]) == (12, True, 0), (spec, r)
    split = spec[0] == "gradient" and spec[2]["EXCLUDE_SELF"] and spec[2].get("SPLIT", True)
    waits = {"gradient": 4, "forward": 2}[spec[0]] * (3 if split else 1)
    assert r["shared_kib"] <= 227 and r["wgmma"] > 0 and r["wait_group0"] == waits, (spec, r)
