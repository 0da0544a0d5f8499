"""fwd+bwd time and loss-only memory of every loss: triton vs blockwise vs the dense
XLA reference, and memeff (PyTorch) side by side when it is installed.

  python benchmarks/bench_losses.py --losses clip,lit --batch 4096,16384 --dims 512 \
      --providers triton,blockwise,reference,memeff --out results.csv

Flop counts (one B x B x D similarity GEMM = 2 B^2 D): CLIP 5 (forward 1, each tower's
gradient pass recomputes it and multiplies: 2 + 2), LiT 3, Qwen3 5 (+3 for each of
q-q and d-d; hard negatives are O(B K D)).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

import memeff_jax as mj
from benchmarks._harness import (Result, Writer, compiled_extra_gib, guarded, summarize,
                                 time_jax, time_torch)

# name -> (public fn, reference fn, number of feature arrays, trainable argnums, kwargs, GEMMs)
LOSSES = {
    "clip": (mj.clip_loss, mj.reference.clip_loss, 2, (0, 1), {}, 5),
    "lit": (mj.lit_loss, mj.reference.lit_loss, 2, (0,), {}, 3),
    "qwen3": (mj.qwen3_loss, mj.reference.qwen3_loss, 2, (0, 1), {}, 5),
    "qwen3_qqdd": (mj.qwen3_loss, mj.reference.qwen3_loss, 2, (0, 1),
                   dict(use_qq_negatives=True, use_dd_negatives=True), 11),
    "qwen3_k7": (mj.qwen3_loss, mj.reference.qwen3_loss, 3, (0, 1, 2), {}, 5),
    "lit_qwen3": (mj.lit_qwen3_loss, mj.reference.lit_qwen3_loss, 2, (0,), {}, 3),
    # SigLIP: a row pass and one gradient pass per tower (3 GEMMs); its bias and
    # temperature learned (the last two inputs)
    "siglip": (mj.siglip_loss, mj.reference.siglip_loss, 2, (0, 1, 2, 3),
               dict(temperature="learned", bias="learned"), 3),
}


# Matryoshka, dims (d/8, d/4, d/2, d): fused with the default config (one plain block per
# dim on a GPU), fused in one block (_mrl_one: one pass over the features for every dim),
# and eager (memeff_jax.matryoshka: one whole loss per dim). Flop counts: the plain ones.
for _name in ("clip", "lit", "qwen3", "lit_qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_mrl"] = (_fn, _ref, _n, _arg, dict(_kw, matryoshka_dims="ladder"), _g)
  LOSSES[f"{_name}_mrl_one"] = (_fn, _ref, _n, _arg,
                                dict(_kw, matryoshka_dims="ladder", one_block=True), _g)
LOSSES["clip_mrl_eager"] = (mj.clip_loss, mj.reference.clip_loss, 2, (0, 1),
                            dict(matryoshka_eager="ladder"), 5)
# where=: the last tenth of the rows removed (a padded batch); the kernels read the mask.
for _name in ("clip", "qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_where"] = (_fn, _ref, _n, _arg, dict(_kw, where="tenth"), _g)

# Memory for speed: bwd_pair with coefficient slabs of 2048 / 4096 rows
# (docs/benchmarks.md, "Trading memory for speed"); LiT trains one tower, so its gradient
# is unchanged.
for _name in ("clip", "lit", "qwen3", "qwen3_qqdd", "siglip"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  for _rows in (2048, 4096):
    LOSSES[f"{_name}_rows{_rows}"] = (_fn, _ref, _n, _arg, dict(_kw, slab_rows=_rows), _g)

# The paired tiled gradient's slabs in column blocks (Budgets.pair_block_cols): the
# columns' fp32 gradient read and written once a slab of rows and block.
for _name in ("clip", "qwen3", "siglip"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  for _cols in (0, 4096, 8192, 16384):
    LOSSES[f"{_name}_cols{_cols}"] = (_fn, _ref, _n, _arg, dict(_kw, pair_cols=_cols), _g)

# SigLIP's fused gradient on its own plan's tiles (backend.resolve_plan: 128 x 256 with
# TMA, else 128 x 128; 8 warps, 3 stages) with slabs of KIB KiB in column blocks of COLS
# (0: every column); the plan's default is 512 MiB and 0.
for _kib, _cols in ((2**19, 0), (2**16, 0), (2**16, 8192), (2**19, 8192)):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES["siglip"]
  LOSSES[f"siglip_fused{_kib >> 10}m_cols{_cols}"] = (_fn, _ref, _n, _arg,
                                                       dict(_kw, fused_slab=(_kib, _cols)), _g)

# The paired gradient off (bwd_pair = False, bwd_pair_max_batch = 0): at d_pad <= 512 the
# FlashAttention-shaped (or Gluon) gradient passes at every batch; above, one slab pass
# per tower (Qwen3's queries: their rows' gradient from the forward).
for _name in ("clip", "qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_nopair"] = (_fn, _ref, _n, _arg, dict(_kw, nopair=True), _g)

# The rows' gradient formed in the forward (Algorithm.fwd_row_grad) where the defaults
# leave it off (d_pad > 512: the tiled gradient's slabs form it).
for _name in ("lit", "lit_qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_rowgrad"] = (_fn, _ref, _n, _arg, dict(_kw, rowgrad=True), _g)

# A learnable temperature (a traced scalar input with a gradient, as CLIP trains it): the
# gradient pass of x also sums c s for the temperature's gradient.
for _name in ("clip", "lit", "qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_tlearn"] = (_fn, _ref, _n, _arg + (_n,), dict(_kw, temperature="learned"), _g)

# The exact forward (fwd_bounded=False: maxima-shifted statistics) against the default
# bounded one, side by side.
for _name in ("clip", "lit", "qwen3"):
  _fn, _ref, _n, _arg, _kw, _g = LOSSES[_name]
  LOSSES[f"{_name}_exact"] = (_fn, _ref, _n, _arg, dict(_kw, exact=True), _g)


def ladder(d):
  return (d // 8, d // 4, d // 2, d)


def _with_ladder(fn, kw, d):
  """The loss with its keywords bound, Matryoshka resolved for feature size d."""
  kw = dict(kw)
  if kw.get("bias") == "learned":   # the last input is the bias
    kw.pop("bias")
    inner = _with_ladder(fn, kw, d)
    return lambda *a, **k: inner(*a[:-1], bias=a[-1], **k)
  if kw.get("temperature") == "learned":   # the last input is the temperature
    kw.pop("temperature")
    inner = _with_ladder(fn, kw, d)
    return lambda *a, **k: inner(*a[:-1], temperature=a[-1], **k)
  if kw.pop("matryoshka_eager", None):
    return mj.matryoshka(lambda *a, **k: fn(*a, **k, **kw), ladder(d))
  if kw.get("matryoshka_dims") == "ladder":
    kw["matryoshka_dims"] = ladder(d)
  # Matryoshka in one block (one_block) is the loss keyword; config overrides, on top of
  # the default config unless one is given: the paired gradient with taller slabs
  # (slab_rows), the exact forward (exact).
  if kw.pop("one_block", None):
    kw["matryoshka_per_dim"] = False
  tune = {}   # KernelConfig.evolve's groups
  group = lambda name: tune.setdefault(name, {})
  if kw.pop("exact", None):
    group("algorithm").update(fwd_bounded=False)
  if kw.pop("rowgrad", None):
    group("algorithm").update(fwd_row_grad=True)
  if kw.pop("nopair", None):
    group("algorithm").update(bwd_pair=False)
    group("budgets").update(bwd_pair_max_batch=0)
  if (rows := kw.pop("slab_rows", None)):
    # (fwd_row_grad off: else a one-sided block, Qwen3's, pairs by bwd_pair_max_batch only)
    group("algorithm").update(bwd_pair=True, fwd_row_grad=False)
    group("budgets").update(min_slab_rows=rows)
  if (cols := kw.pop("pair_cols", None)) is not None:
    group("budgets").update(pair_block_cols=cols)
  backend_default = None
  if (fused := kw.pop("fused_slab", None)):
    from memeff_jax.backends.triton.backend import TritonBackend  # pylint: disable=g-import-not-at-top
    backend_default = TritonBackend()
    group("bwd").update(block_m=128, block_n=256 if backend_default._tma() else 128,
                        num_warps=8, num_stages=3)
    group("budgets").update(slab_kib=fused[0], pair_block_cols=fused[1])
  if tune:
    def tuned(*a, config=None, **k):
      base = config or (mj.default_config(d, a[0].dtype) if backend_default is None
                        else backend_default.default_config(d, a[0].dtype))
      return fn(*a, **k, **kw, config=base.evolve(**tune))
    return tuned
  if kw.pop("where", None) == "tenth":
    kept = lambda b: jnp.arange(b) < b - b // 10
    return lambda *a, **k: fn(*a, **k, **kw, where=kept(a[0].shape[0]))
  return lambda *a, **k: fn(*a, **k, **kw)


def inputs(name, b, d, dtype, seed=0):
  n = LOSSES[name][2]
  keys = jax.random.split(jax.random.key(seed), n)
  shapes = [(b, d), (b, d), (b, 7, d)][:n]
  arrays = [jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(keys, shapes)]
  if LOSSES[name][4].get("temperature") == "learned":
    arrays.append(jnp.float32(0.07))
  if LOSSES[name][4].get("bias") == "learned":
    arrays.append(jnp.float32(-10.0))
  return arrays


def dense(x, y, two_sided, temperature=0.07):
  """The plain dense XLA loss a user would write (CLIP or LiT, no options): B x B logits."""
  x, y = (v / jnp.linalg.norm(v.astype(jnp.float32), axis=-1, keepdims=True).astype(v.dtype)
          for v in (x, y))
  logits = jnp.dot(x, y.T, preferred_element_type=jnp.float32) / temperature
  diag = jnp.diagonal(logits)
  loss = jnp.mean(jax.nn.logsumexp(logits, axis=1) - diag)
  if two_sided:
    loss = 0.5 * (loss + jnp.mean(jax.nn.logsumexp(logits, axis=0) - diag))
  return loss


def dense_siglip(x, y, temperature, bias):
  """big_vision's sigmoid loss as a user writes it: B x B logits, -sum log sigmoid / B."""
  x, y = (v / jnp.linalg.norm(v.astype(jnp.float32), axis=-1, keepdims=True).astype(v.dtype)
          for v in (x, y))
  logits = jnp.dot(x, y.T, preferred_element_type=jnp.float32) / temperature + bias
  labels = 2.0 * jnp.eye(x.shape[0]) - 1.0
  return -jnp.sum(jax.nn.log_sigmoid(labels * logits)) / x.shape[0]


def jax_step(name, provider, config=None, d=None):
  """jit(value_and_grad) of one provider: a backend name, "reference" (our dense
  reference with every option), "dense" (the plain dense XLA CLIP/LiT), or "ring1"
  (the triton backend through the ring on a one-device mesh: its overhead)."""
  fn, ref, _, argnums, kw, _ = LOSSES[name]
  fn, ref = _with_ladder(fn, kw, d), _with_ladder(ref, kw, d)
  kw = {}
  if provider == "dense":
    if name not in ("clip", "lit", "siglip"):
      raise ValueError("the plain dense provider covers clip, lit and siglip")
    loss = dense_siglip if name == "siglip" else (
        lambda x, y: dense(x, y, two_sided=name == "clip"))
  elif provider == "reference":
    loss = lambda *a: ref(*a, **kw)
  elif provider == "ring1":
    mesh = Mesh(np.array(jax.devices()[:1]), ("batch",))
    loss = mj.sharded(lambda *a, axis_name: fn(*a, axis_name=axis_name, backend="triton",
                                               config=config, **kw), mesh, "batch")
  else:
    loss = lambda *a: fn(*a, backend=provider, config=config, **kw)
  return jax.jit(jax.value_and_grad(loss, argnums=argnums))


def bench_jax(writer, name, provider, b, d, dtype, reps, config=None, label=None):
  r = Result(name, label or provider, b, d, jnp.dtype(dtype).name)

  def body():
    args = inputs(name, b, d, dtype)
    step = jax_step(name, provider, config, d)
    r.extra_gib = compiled_extra_gib(step, *args)
    times = time_jax(step, *args, reps=reps, warmup=1 if b >= 262144 else 2)
    val = float(step(*args)[0])
    if not np.isfinite(val):
      r.note = f"non-finite loss {val}"
    return summarize(r, times, LOSSES[name][5] * 2.0 * b * b * d)

  guarded(writer, r, body)


def bench_memeff(writer, name, b, d, reps):
  import torch  # pylint: disable=g-import-not-at-top
  import memeff  # pylint: disable=g-import-not-at-top
  r = Result(name, "memeff", b, d, "bfloat16")
  kw = dict(LOSSES[name][4])
  if any(k in kw for k in ("one_block", "where", "slab_rows", "nopair", "rowgrad",
                           "temperature", "pair_cols", "fused_slab")):
    r.note = ("memeff has no counterpart (one-block Matryoshka, where=, slab budget or "
              "column blocks, pairing or the rows' forward toggled, learnable temperature)")
    writer.add(r)
    return
  base = name.replace("_mrl", "").replace("_eager", "")
  cls = {"clip": memeff.MemoryEfficientCLIPLoss, "lit": memeff.MemoryEfficientLiTLoss,
         "qwen3": memeff.MemoryEfficientQwen3Loss, "qwen3_qqdd": memeff.MemoryEfficientQwen3Loss,
         "qwen3_k7": memeff.MemoryEfficientQwen3Loss,
         "lit_qwen3": memeff.MemoryEfficientLiTQwen3Loss}[base]
  mrl_cls = {"clip": "MemoryEfficientMatryoshkaCLIPLoss", "lit": "MemoryEfficientMatryoshkaLiTLoss",
             "qwen3": "MemoryEfficientMatryoshkaQwen3Loss",
             "lit_qwen3": "MemoryEfficientMatryoshkaLiTQwen3Loss"}.get(base)

  def body():
    if kw.pop("matryoshka_eager", None):   # memeff's eager wrapper
      loss_fn = memeff.MatryoshkaLoss(cls(temperature=0.07, **kw), dims=ladder(d))
    elif kw.pop("matryoshka_dims", None):   # memeff's fused Matryoshka loss
      loss_fn = getattr(memeff, mrl_cls)(dims=ladder(d), temperature=0.07, **kw)
    else:
      loss_fn = cls(temperature=0.07, **kw)
    g = torch.Generator(device="cuda").manual_seed(0)
    n = LOSSES[name][2]
    shapes = [(b, d), (b, d), (b, 7, d)][:n]
    xs = [torch.randn(s, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
          .requires_grad_(i in LOSSES[name][3]) for i, s in enumerate(shapes)]
    times, _, before, peak = time_torch(loss_fn, xs, reps=reps)
    r.extra_gib = (peak - before) / 2**30
    xs.clear()
    torch.cuda.empty_cache()
    return summarize(r, times, LOSSES[name][5] * 2.0 * b * b * d)

  guarded(writer, r, body)


def main(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument("--losses", default="clip,lit")
  p.add_argument("--batch", default="4096,16384,65536,262144")
  p.add_argument("--dims", default="128,512,1024")
  p.add_argument("--providers", default="triton,blockwise,reference,memeff")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--max-dense-batch", type=int, default=65536,
                 help="reference/blockwise above this batch are skipped (O(B^2) memory/time)")
  p.add_argument("--max-memeff-batch", type=int, default=65536)
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  writer = Writer(a.out)
  dtype = jnp.dtype(a.dtype)
  for name in a.losses.split(","):
    for d in map(int, a.dims.split(",")):
      for b in map(int, a.batch.split(",")):
        for prov in a.providers.split(","):
          if prov in ("reference", "blockwise", "dense") and b > a.max_dense_batch:
            continue
          if prov == "memeff":
            if b <= a.max_memeff_batch:
              bench_memeff(writer, name, b, d, a.reps)
          else:
            bench_jax(writer, name, prov, b, d, dtype, a.reps)
  return writer


if __name__ == "__main__":
  main()
