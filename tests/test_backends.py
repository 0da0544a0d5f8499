"""The backend seam: the Protocol every backend meets, the one registry of names, the
first-order guard generated from the Protocol, the block plan resolved once, the
blockwise backend's temporaries linear in the batch, the deprecated flat KernelConfig
spellings, and jax-triton launched with the warps a kernel was compiled for."""

import dataclasses
import hashlib
import inspect
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import types
import typing
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import memeff_jax as mj
from benchmarks import shard_tests
from memeff_jax import _compat, _core, _options, _validation, backends
from memeff_jax.backends import base, registry
from memeff_jax.backends.blockwise import BlockwiseBackend
from memeff_jax.backends.reference import ReferenceBackend
from memeff_jax.backends.triton import backend as triton_backend
from memeff_jax.config import (Algorithm, BlockwiseOptions, Budgets, BwdTiles, FwdTiles,
                               KernelConfig, default_config)
from tests.support import walk

# Every backend object: the registry's (interpret stands for the Triton family on
# CPU) and the unguarded Triton class.
OBJECTS = {"blockwise": lambda: backends.resolve("blockwise"),
           "reference": lambda: backends.resolve("reference"),
           "interpret": lambda: backends.resolve("interpret"),
           "triton_class": lambda: triton_backend.TritonBackend()}


def _keywords(fn):
  return [p.name for p in inspect.signature(fn).parameters.values()
          if p.name != "self"]


@pytest.mark.parametrize("which", OBJECTS)
def test_every_backend_meets_the_protocol(which):
  be = OBJECTS[which]()
  assert isinstance(be, backends.Backend)
  hash(be)   # BlockSpec holds it and keys the cached custom_vjp
  inner = getattr(be, "inner", be)
  for name in ("fwd_stats", "bwd", "bwd_pair", "fwd_grad", "fwd_rows"):   # _core's keywords
    assert _keywords(getattr(type(inner), name)) == _keywords(getattr(backends.Backend, name))
  assert be.name == (which if which != "triton_class" else "triton")


def test_protocol_methods_take_few_parameters():
  # A block's traced operands travel as one backends.Block (issue 35: <= ~8 parameters).
  for name in ("default_config", "fwd_floor", "pairs", "fuses", "fuses_rows") + base.LAUNCHING:
    assert len(_keywords(getattr(backends.Backend, name))) <= 7, name
  for name in base.LAUNCHING:
    assert list(inspect.signature(getattr(backends.Backend, name)).parameters)[1] == "block"


def test_block_transposed_swaps_rows_and_columns():
  x, y, xt, yt = jnp.ones((3, 4)), jnp.zeros((5, 4)), jnp.ones((2, 3)), jnp.zeros((2, 5))
  xm, ym = jnp.ones(3, bool), jnp.zeros(5, bool)
  blk = backends.Block(x, y, xt, yt, xm, ym, offsets=(6, 10))
  t = blk.transposed()
  assert t.x is y and t.y is x and t.x_tab is yt and t.y_tab is xt
  assert t.masks == (ym, xm) and t.offsets == (10, 6) and t.transposed() == blk
  assert backends.Block(x, y).masks is None and backends.Block(x, y).offsets == (0, 0)


def test_only_the_reference_computes_whole_losses():
  assert isinstance(backends.resolve("reference"), backends.DenseBackend)
  for name in ("blockwise", "interpret"):
    assert not isinstance(backends.resolve(name), backends.DenseBackend)


def test_backend_names_live_in_the_registry():
  # The Literal, the names the registry checks, and its factories ("auto" is a rule).
  assert typing.get_args(backends.BackendName) == registry.NAMES == ("auto",
                                                                     *registry.FACTORIES)
  assert registry.NAMES == ("auto", "triton", "interpret", "blockwise", "reference")
  with pytest.raises(ValueError, match="expected one of"):
    registry.check("xla")
  # Every public Literal is the registry's.
  assert _validation.Backend is backends.BackendName
  assert _options.OPTIONS["backend"].type is backends.BackendName   # the wrappers' field type
  assert inspect.signature(mj.clip_loss).parameters["backend"].annotation in (
      "Backend", backends.BackendName)


def test_guard_wraps_the_launching_methods_read_off_the_protocol():
  assert set(base.LAUNCHING) == {"fwd_stats", "bwd", "bwd_pair", "fwd_grad", "fwd_rows"}
  guarded = backends.resolve("interpret")
  assert isinstance(guarded, base.FirstOrderOnly)
  for name in base.LAUNCHING:   # the guard's own methods
    assert name in vars(base.FirstOrderOnly)
  for name in ("default_config", "fwd_floor", "pairs", "fuses", "fuses_rows"):   # inner's
    assert name not in vars(base.FirstOrderOnly)
  assert guarded.default_config(16, jnp.float32) == guarded.inner.default_config(16,
                                                                                 jnp.float32)


def test_guard_refuses_vmap_and_grad_of_grad_on_the_triton_family():
  x = jax.random.normal(jax.random.key(0), (6, 8))
  with pytest.raises(NotImplementedError, match="jax.vmap"):
    jax.vmap(lambda a: mj.clip_loss(a, a[::-1], backend="interpret"))(x[None])
  loss = lambda t: mj.clip_loss(x, x[::-1], temperature=t, backend="interpret")
  with pytest.raises(NotImplementedError, match="first-order gradients only"):
    jax.grad(jax.grad(loss))(jnp.float32(0.1))
  # The unguarded backends take both.
  for name in ("blockwise", "reference"):
    jax.grad(jax.grad(lambda t, n=name: mj.clip_loss(x, x[::-1], temperature=t,
                                                     backend=n)))(jnp.float32(0.1))


@pytest.mark.parametrize("backend", ["blockwise", "reference"])
def test_exports_at_concrete_sizes(backend):
  # jax.export of a jitted value-and-grad step: called, the step's loss and gradients.
  # (Serializing it needs the flatbuffers package, which jax does not install.)
  from jax import export   # pylint: disable=g-import-not-at-top
  x, y = (jax.random.normal(jax.random.key(i), (12, 16)) for i in (0, 1))
  step = jax.jit(jax.value_and_grad(lambda a, b, t: mj.clip_loss(a, b, temperature=t,
                                                                 backend=backend), (0, 1, 2)))
  exported = export.export(step)(x, y, jnp.float32(0.07))
  for got, want in zip(jax.tree.leaves(exported.call(x, y, jnp.float32(0.07))),
                       jax.tree.leaves(step(x, y, jnp.float32(0.07)))):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_symbolic_batch_exports_on_the_reference_alone(family):
  # jax.export with a symbolic batch: the tiling backends need concrete sizes and say
  # so, naming the way out (blockwise raised an InconclusiveDimensionOperation from
  # inside its tiling); the dense reference exports, and its loss at b = 10 is the
  # loss of a jit at that size.
  from jax import export   # pylint: disable=g-import-not-at-top
  fn = {"clip": mj.clip_loss, "siglip": mj.siglip_loss}[family]
  b, = export.symbolic_shape("b")
  spec = jax.ShapeDtypeStruct((b, 16), jnp.float32)
  for backend in ("auto", "blockwise", "interpret"):
    with pytest.raises(ValueError, match=f"backend='{backend}' needs concrete array sizes.*"
                       "symbolic size b.*backend='reference'"):
      export.export(jax.jit(lambda x, y: fn(x, y, backend=backend)))(spec, spec)
  exported = export.export(jax.jit(lambda x, y: fn(x, y, backend="reference")))(spec, spec)
  x, y = (jax.random.normal(jax.random.key(i), (10, 16)) for i in (0, 1))
  np.testing.assert_allclose(exported.call(x, y),
                             jax.jit(lambda x, y: fn(x, y, backend="blockwise"))(x, y),
                             rtol=1e-6)


@pytest.mark.parametrize("case", ["clip", "lit", "qwen3", "lit_qwen3", "siglip", "clip_mrl"])
def test_blockwise_temporaries_grow_linearly_in_the_batch(case):
  # The B x B similarities are never held: the compiled training step's temporaries
  # (value and every gradient, temperature included; where=; the four softmax families
  # with their own options, tau_plus and the z-loss) grow like B, not B^2. 4x the rows at
  # the default 512-column tile: about 4x the bytes (3.8-4.0x on the CPU); one B x B
  # buffer anywhere in the shared glue makes it about 16x, as backend="reference" does
  # (15.7-17.2x). Bound: 6x.
  from tests.support.families import FAMILIES
  d = 32
  if case in FAMILIES:
    fam = FAMILIES[case]
    fn, n_arrays, opts = fam.loss, fam.n_arrays, dict(fam.options, tau_plus=0.05,
                                                      lse_square_scale=1e-3)
  else:
    fn, n_arrays = (mj.siglip_loss, 2) if case == "siglip" else (mj.clip_loss, 2)
    opts = {} if case == "siglip" else dict(matryoshka_dims=(8, 16, 32))

  def temp_bytes(b):
    shapes = [jax.ShapeDtypeStruct((b, d), jnp.float32)] * 2
    if n_arrays == 3:
      shapes.append(jax.ShapeDtypeStruct((b, 2, d), jnp.float32))
    loss = lambda *a: fn(*a[:-1], temperature=a[-1], where=jnp.arange(b) % 5 != 0,
                         backend="blockwise", **opts)
    step = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(n_arrays + 1))))
    compiled = step.lower(*shapes, jax.ShapeDtypeStruct((), jnp.float32)).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(1024), temp_bytes(4096)
  assert large < 6 * small, (small, large)


@pytest.mark.parametrize("two_sided", [False, True])
def test_reference_blocks_materialize_what_blockwise_scans(two_sided):
  x, y = jax.random.normal(jax.random.key(1), (2, 37, 16))
  stats = lambda be: _core.block_lse(x, y, jnp.float32(3.0), spec=_core.BlockSpec(
      backend=be, two_sided=two_sided, exclude_self=True))
  for got, want in zip(stats(ReferenceBackend()), stats(BlockwiseBackend(tile=8))):
    if want is not None:
      np.testing.assert_allclose(got, want, rtol=1e-6)


def test_blockwise_tile_on_the_backend_or_the_config():
  x, y = jax.random.normal(jax.random.key(2), (2, 50, 16))
  spec = lambda be, cfg=None: _core.BlockSpec(backend=be, two_sided=True, config=cfg)
  a = _core.block_lse(x, y, jnp.float32(2.0), spec=spec(BlockwiseBackend(tile=16)))
  b = _core.block_lse(x, y, jnp.float32(2.0), spec=spec(
      BlockwiseBackend(), KernelConfig(blockwise=BlockwiseOptions(tile=16))))
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)


OLD_SPELLINGS = [
    (dict(fwd_block_m=128, fwd_num_warps=8), dict(fwd=FwdTiles(block_m=128, num_warps=8))),
    (dict(bwd_block_do=32, bwd_num_stages=3), dict(bwd=BwdTiles(block_do=32, num_stages=3))),
    (dict(matryoshka_per_dim=True), dict(algorithm=Algorithm(matryoshka_per_dim=True))),
    (dict(bwd_pair=True, precision="ieee"), dict(algorithm=Algorithm(bwd_pair=True,
                                                                     precision="ieee"))),
    (dict(slab_kib=1, bwd_pair_max_batch=7), dict(budgets=Budgets(slab_kib=1,
                                                                  bwd_pair_max_batch=7))),
    (dict(blockwise_tile=128), dict(blockwise=BlockwiseOptions(tile=128))),
]


@pytest.mark.parametrize("old,new", OLD_SPELLINGS)
def test_old_flat_spellings_warn_and_equal_the_new(old, new):
  with pytest.warns(DeprecationWarning, match="flat spellings are deprecated") as rec:
    cfg_old = KernelConfig(**old)
  assert rec[0].filename == __file__   # the warning points at the caller
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # the grouped spelling does not warn
    cfg_new = KernelConfig(**new)
    assert cfg_old == cfg_new and hash(cfg_old) == hash(cfg_new)
    for k, v in old.items():   # flat reads still work, silently
      assert getattr(cfg_new, k) == v
  with pytest.warns(DeprecationWarning) as rec:
    replaced = dataclasses.replace(KernelConfig(), **old)
  assert rec[0].filename == __file__ and replaced == cfg_new


def test_evolve_and_errors_name_both_spellings():
  cfg = default_config(128, jnp.bfloat16)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = cfg.evolve(fwd=dict(block_m=32), algorithm=dict(bwd_pair=True))
  assert got.fwd.block_m == 32 and got.algorithm.bwd_pair and got.bwd == cfg.bwd
  with pytest.raises(ValueError, match=r"FwdTiles.block_m \(KernelConfig.fwd_block_m\)"):
    FwdTiles(block_m=48)
  with pytest.raises(TypeError, match="fwd_blok_m"):
    KernelConfig(fwd_blok_m=64)
  with pytest.raises(TypeError, match="FwdTiles"):
    KernelConfig(fwd=BwdTiles())
  # evolve: a whole group replaces it; an unknown group, a flat name or a value of
  # another kind raise naming it (were an unchanged copy, silently, and a TypeError
  # from dataclasses naming no group).
  assert cfg.evolve(fwd=FwdTiles(block_m=32)).fwd == FwdTiles(block_m=32)
  for bad, pattern in [(dict(fwdd=dict(block_m=128)), r"unexpected group\(s\) \['fwdd'\]"),
                       (dict(fwd_block_m=128), r"unexpected group\(s\) \['fwd_block_m'\]"),
                       (dict(fwd=BwdTiles()), "fwd= must be a dict of FwdTiles's fields"),
                       (dict(fwd=dict(blok_m=32)), "blok_m")]:
    with pytest.raises(TypeError, match=pattern):
      cfg.evolve(**bad)


def test_numpy_integers_are_ints():
  # A tile read from a NumPy sweep (np.int64) is the Python int it equals, in every
  # spelling, so configs compare, hash and reach the kernels alike (was a TypeError:
  # "must be an int"); NumPy floats and bools stay refused.
  want = KernelConfig(fwd=FwdTiles(block_m=64, num_warps=4), budgets=Budgets(pair_block_cols=0))
  got = KernelConfig(fwd=FwdTiles(block_m=np.int64(64), num_warps=np.int32(4)),
                     budgets=Budgets(pair_block_cols=np.uint8(0)))
  evolved = KernelConfig().evolve(fwd=dict(block_m=np.int16(64), num_warps=np.int64(4)),
                                  budgets=dict(pair_block_cols=np.int64(0)))
  for cfg in (got, evolved):
    assert cfg == want and hash(cfg) == hash(want)
    assert type(cfg.fwd.block_m) is int and type(cfg.budgets.pair_block_cols) is int
  for bad, error in [(np.float32(64), TypeError), (np.bool_(True), TypeError),
                     (np.int64(48), ValueError), (np.int64(0), ValueError)]:
    with pytest.raises(error, match=r"FwdTiles.block_m"):
      FwdTiles(block_m=bad)


@pytest.mark.parametrize("dims", [None, (8, 24)])
def test_plan_resolved_once_per_block(dims):
  # The five per-block methods (fwd_floor, fwd_stats, pairs, bwd / bwd_pair) share one
  # plan: resolved once, then looked up.
  jax.clear_caches()   # (a cached trace would call no backend method)
  triton_backend.resolve_plan.cache_clear()
  x, y = jax.random.normal(jax.random.key(3), (2, 20, 24))
  cfg = default_config(24, jnp.float32, interpret=True)   # (one block with dims)
  jax.grad(lambda a, b, t: mj.clip_loss(a, b, temperature=t, backend="interpret",
                                        matryoshka_dims=dims, config=cfg),
           argnums=(0, 1, 2))(x, y, jnp.float32(0.1))
  info = triton_backend.resolve_plan.cache_info()
  assert info.misses == 1 and info.hits >= 3, info
  plan = triton_backend.TritonBackend(interpret=True).plan(
      _core.BlockSpec(backend=None, config=cfg, dims=dims), x)
  assert (plan.ladder is not None) == (dims is not None) and not plan.user_tiles
  with pytest.raises(dataclasses.FrozenInstanceError):
    plan.config = cfg   # immutable


def test_compiled_warps_read_the_ptx():
  # A feature loop under warp_specialize=True, compiled for sm_90 with 4 warps (Triton
  # >= 3.9, no GPU), is split into a producer and two consumer warp groups: Triton's
  # metadata reports 12 warps, and compiled_warps reads the same off the PTX. The same
  # loop unspecialized keeps the 4 it was passed.
  env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
  out = subprocess.run([sys.executable, "-m", "tests.support.ws_kernel"], capture_output=True,
                       text=True, env=env, check=True, cwd=pathlib.Path(__file__).parents[1])
  (ws_meta, ws_read), (plain_meta, plain_read) = json.loads(out.stdout.splitlines()[-1])
  assert ws_meta == ws_read == 12
  assert plain_meta == plain_read == 4


def test_jax_triton_kernels_launch_with_the_compiled_warps():
  # jax-triton builds TritonKernel(name, num_warps, num_ctas, shared memory, binary, ...)
  # with the num_warps it was called with; through _CompiledWarps a PTX that requires
  # more threads (.reqntid) gets its own count, anything else is passed on unchanged.
  calls = []

  class Lib:
    marker = object()

    def TritonKernel(self, *args):  # pylint: disable=invalid-name
      calls.append(args)

  lib = Lib()
  wrapped = _compat._CompiledWarps(lib)
  ptx = ".visible .entry k(\n\t.param .u64 k_param_0\n)\n.reqntid 384\n.maxnreg 168\n{\n}"
  wrapped.TritonKernel("k", 4, 1, 1024, ptx, "ttir", 90)
  wrapped.TritonKernel("k", 8, 1, 1024, ptx.replace("384", "256"), "ttir", 90)
  wrapped.TritonKernel("k", 8, 1, 1024, ".visible .entry k()\n{\n}", "ttir", 90)
  wrapped.TritonKernel("k", 4, 1, 1024, "/tmp/kernel.hsaco", "ttir", 90)
  assert [c[1] for c in calls] == [12, 8, 8, 4]
  assert calls[0] == ("k", 12, 1, 1024, ptx, "ttir", 90)
  assert wrapped.marker is lib.marker


def test_kernels_over_the_gpus_shared_memory_are_refused_when_built(monkeypatch):
  # jaxlib refuses a kernel whose shared memory exceeds the GPU's opt-in maximum only
  # when the step runs (an error inside XLA's custom call); _CompiledWarps refuses it
  # where jax-triton builds the kernel, at jit time, with a ValueError naming config. At
  # the limit the kernel is built; with the limit unknown (None: no CUDA driver) too.
  calls = []

  class Lib:
    def TritonKernel(self, *args):  # pylint: disable=invalid-name
      calls.append(args)

  # Another library's kernel (a name triton_call never launched) is left to jaxlib.
  h100 = 227 * 1024
  monkeypatch.setattr(_compat, "_OURS", {"_our_kernel"})
  wrapped = _compat._CompiledWarps(Lib(), smem_limit=lambda: h100)
  wrapped.TritonKernel("_our_kernel", 4, 1, h100, "ptx", "ttir", 90)
  with pytest.raises(ValueError, match=rf"^config: kernel _our_kernel needs {h100 + 1} "
                                       rf"bytes of shared memory a block, more than the "
                                       rf"{h100} "):
    wrapped.TritonKernel("_our_kernel", 4, 1, h100 + 1, "ptx", "ttir", 90)
  wrapped.TritonKernel("_their_kernel", 4, 1, 2 * h100, "ptx", "ttir", 90)
  _compat._CompiledWarps(Lib(), smem_limit=lambda: None).TritonKernel(
      "_our_kernel", 4, 1, 10 * h100, "ptx", "ttir", 90)
  assert [c[3] for c in calls] == [h100, 2 * h100, 10 * h100]


def _fake_jax_triton(monkeypatch, hook: bool = True):
  """A stand-in ``jax_triton`` (this machine's jax-triton needs a GPU jaxlib): its
  ``triton_lib`` with the Gluon compile hook ``_compat`` reroutes, or without it."""
  tlib = types.SimpleNamespace()
  if hook:
    tlib.compile_ttir_inplace = lambda *args: ("jax-triton's compile", args)
    tlib.CompilationResult = lambda **fields: ("result", fields)
  jt = types.ModuleType("jax_triton")
  jt.triton_lib, jt.TensorDescriptor = tlib, object
  monkeypatch.setitem(sys.modules, "jax_triton", jt)
  return tlib


def _jt03_call(*args, kernel, out_shape, grid, name="", num_warps=None, num_stages=None,
               enable_fp_fusion=None, **metaparams):
  """jax-triton 0.3.1's ``triton_call`` signature (FMA contraction a keyword, True by
  default there; None here, to see that it was passed)."""
  return dict(out_shape=out_shape, enable_fp_fusion=enable_fp_fusion, args=args, **metaparams)


def _jt04_call(*args, kernel, out_type=None, grid, name="", num_warps=None, num_stages=None,
               backend_options=None, **kwargs):
  """jax-triton 0.4.1's (Triton's options, FMA contraction among them, in a mapping)."""
  return dict(out_type=out_type, backend_options=backend_options, args=args, **kwargs)


@pytest.mark.parametrize("call,want", [
    (_jt03_call, dict(out_shape="shapes", enable_fp_fusion=True)),
    (_jt04_call, dict(out_type="shapes", backend_options={"enable_fp_fusion": True}))])
def test_triton_call_pins_fma_contraction_on_both_jax_tritons(monkeypatch, call, want):
  # Every build tested ran with FMA contraction on: jax-triton 0.3.1 passes it by default,
  # 0.4.1 leaves it to Triton (which warns in 3.9 and turns it off from 3.10). Through
  # _compat.triton_call both get it explicitly, with the output shapes under the name
  # each version takes, and the kernel's constexprs passed on as they are.
  jt = types.ModuleType("jax_triton")
  jt.triton_lib, jt.triton_call = types.SimpleNamespace(), call
  monkeypatch.setitem(sys.modules, "jax_triton", jt)
  # (its launch hook, cached once done, is left for the real jax-triton)
  monkeypatch.setattr(_compat, "_launch_compiled_warps", lambda: None)
  _compat._triton_call_kwargs.cache_clear()
  try:
    got = _compat.triton_call(1, 2, kernel=object(), out_shapes="shapes", grid=(1,), name="k",
                              num_warps=4, num_stages=2, BLOCK=64)
  finally:
    _compat._triton_call_kwargs.cache_clear()
  assert got == dict(want, args=(1, 2), BLOCK=64)


@pytest.mark.parametrize("cc,version,hook,interpret,want", [
    ("9.0", "3.9.0", True, False, True),     # an H100 / H200 on pip's stack
    ("10.0", "3.9.0", True, False, False),   # Blackwell: no wgmma
    ("8.0", "3.9.0", True, False, False),
    ("9.0", "3.8.0", True, False, False),    # the Gluon language as written needs 3.9
    ("9.0", "3.9.0", False, False, False),   # a jax-triton without the compile hook
    ("9.0", "3.9.0", True, True, False)])    # the interpreter
def test_gluon_kernels_only_on_hopper(monkeypatch, cc, version, hook, interpret, want):
  # The Gluon gradient (wgmma, Hopper's alone) is taken only on compute capability 9.x
  # with Triton >= 3.9 and a jax-triton whose compile of Gluon modules _compat reroutes.
  pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
  import triton  # pylint: disable=g-import-not-at-top
  _fake_jax_triton(monkeypatch, hook)
  monkeypatch.setattr(_compat, "tma_descriptors", lambda interpret: not interpret)
  monkeypatch.setattr(jax, "devices", lambda: [types.SimpleNamespace(compute_capability=cc)])
  monkeypatch.setattr(triton, "__version__", version)
  assert _compat.gluon_kernels.__wrapped__(interpret) is want


def test_gluon_modules_compile_through_gluons_own_lowering(monkeypatch):
  # jax-triton 0.4.1 lowers every module with Triton's make_ttir + make_ttgir, which
  # rewrite a Gluon kernel (a full wgmma wait after each wgmma); after _compile_hook a
  # Gluon module (its ttg.num-warps set) goes through gluon_ptx and comes back as
  # jax-triton's CompilationResult, and a Triton module compiles as before.
  tlib = _fake_jax_triton(monkeypatch)
  seen = []
  md = dict(name="k", shared=229632, tensordesc_meta=[], global_scratch_size=0,
            global_scratch_align=1)
  monkeypatch.setattr(_compat, "gluon_ptx", lambda module, backend, options, arch: seen.append(
      (module.warps, arch)) or dict(ptx="PTX", ttgir="TTGIR", llir="LLIR", md=md))
  _compat._compile_hook.__wrapped__()

  class Module:
    def __init__(self, warps):
      self.warps = warps

    def get_int_attr(self, name):
      return self.warps if name == "ttg.num-warps" else None

  backend = types.SimpleNamespace(gluon_to_ttgir=lambda *a: None)
  target = types.SimpleNamespace(arch=90)
  triton_module = Module(None)
  assert tlib.compile_ttir_inplace(triton_module, backend, "opts", target) == (
      "jax-triton's compile", (triton_module, backend, "opts", target))
  assert tlib.compile_ttir_inplace(Module(4), backend, "opts", target) == ("result", dict(
      binary="PTX", name="k", shared_mem_bytes=229632, ttgir="TTGIR", llir="LLIR",
      global_scratch_size=None, global_scratch_align=None, tensordesc_meta=[]))
  assert seen == [(4, 90)]


_ON = {"MEMEFF_JAX_KERNEL_CACHE": "1"}


@pytest.mark.parametrize("env,want", [
    ({}, "HOME/.cache/memeff_jax/kernels"),
    ({"MEMEFF_JAX_KERNEL_CACHE": ""}, "HOME/.cache/memeff_jax/kernels"),
    ({"MEMEFF_JAX_KERNEL_CACHE": "0"}, None),
    ({"MEMEFF_JAX_KERNEL_CACHE": "Off"}, None),
    (_ON, "HOME/.cache/memeff_jax/kernels"),
    (dict(_ON, XDG_CACHE_HOME="XDG"), "XDG/memeff_jax/kernels"),
    ({"MEMEFF_JAX_KERNEL_CACHE": "/kept"}, "/kept"),
    ({"MEMEFF_JAX_KERNEL_CACHE": "True"}, "HOME/.cache/memeff_jax/kernels"),
    ({"MEMEFF_JAX_KERNEL_CACHE": " yes "}, "HOME/.cache/memeff_jax/kernels"),
    ({"MEMEFF_JAX_KERNEL_CACHE": " 0 "}, None),
    ({"MEMEFF_JAX_KERNEL_CACHE": "~/kept"}, "HOME/kept"),
    (dict(_ON, TRITON_ALWAYS_COMPILE="1"), None),
    (dict(_ON, JAX_TRITON_DUMP_DIR="/dump"), None)])
def test_kernel_cache_folder(monkeypatch, env, want):
  # Where compiled kernels are kept (by default): a folder of memeff_jax's own, not
  # Triton's; none where turned off, nor where Triton is told to compile always or
  # jax-triton dumps its compiles. The switch's spellings are MEMEFF_JAX_CHECKIFY's
  # ("true" named a folder "true"); a named folder's ~ is the home.
  for name in ("MEMEFF_JAX_KERNEL_CACHE", "XDG_CACHE_HOME", "TRITON_ALWAYS_COMPILE",
               "JAX_TRITON_DUMP_DIR"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", "HOME")
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  got = _compat.kernel_cache_dir()
  assert (None if got is None else str(got)) == want


# What each jax-triton does to TRITON_CACHE_DIR as it is imported: 0.3.1 sets it to "";
# 0.4.1 deletes it; 0.3.1 without a GPU jaxlib sets it, then raises.
_IMPORT_ENV = {
    "0.3.1": 'os.environ["TRITON_CACHE_DIR"] = ""',
    "0.4.1": 'if "TRITON_CACHE_DIR" in os.environ:\n  del os.environ["TRITON_CACHE_DIR"]',
    "0.3.1 without a GPU": 'os.environ["TRITON_CACHE_DIR"] = ""\nraise ImportError("no GPU")'}


def _stand_in_jax_triton(monkeypatch, tmp_path, source: str) -> None:
  """A ``jax_triton`` package whose ``__init__`` is ``source``, first on sys.path, and
  not imported yet (monkeypatch puts sys.modules and sys.path back afterwards)."""
  (tmp_path / "jax_triton").mkdir()
  (tmp_path / "jax_triton" / "__init__.py").write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "jax_triton", raising=False)


@pytest.mark.parametrize("users", ["/users/triton", None])
@pytest.mark.parametrize("version", list(_IMPORT_ENV))
def test_jax_triton_import_keeps_triton_cache_dir(monkeypatch, tmp_path, version, users):
  # A stand-in jax_triton package doing what each version does as it is imported; after
  # _compat imports it, TRITON_CACHE_DIR is what the user had (or still unset), so the
  # process's other Triton compiles keep their cache.
  _stand_in_jax_triton(monkeypatch, tmp_path,
                       f"import os\n{_IMPORT_ENV[version]}\nWHO = 'stand-in'\n")
  if users is None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
  else:
    monkeypatch.setenv("TRITON_CACHE_DIR", users)
  if "without" in version:
    with pytest.raises(ImportError, match="no GPU"):
      _compat.jax_triton()
  else:
    assert _compat.jax_triton().WHO == "stand-in"
  assert os.environ.get("TRITON_CACHE_DIR") == users


@pytest.mark.parametrize("jt_version,triton_version,warns", [
    ("0.3.1", "3.6.0", False), ("0.4.1", "3.9.0", False), ("0.3.1", "3.9.0", True),
    ("0.3.2", "3.10.1+git0a1b2c", True), ("0.4.1", "3.10.0", False)])
def test_slow_jax_triton_pair_warns(monkeypatch, tmp_path, jt_version, triton_version, warns):
  # The gpu extra allows jax-triton 0.3.1 and 0.4.1, Triton 3.6 and 3.9; pinning
  # jax-triton 0.3.1 alone gets Triton 3.9, a pair slower at D = 512 (no Gluon or TMA
  # kernels): jax_triton's first import warns, naming both versions and the way out.
  # The pairs that run at full speed import silently.
  import triton
  _stand_in_jax_triton(monkeypatch, tmp_path, f"__version__ = {jt_version!r}\n")
  monkeypatch.setattr(triton, "__version__", triton_version)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    _compat.jax_triton()
    _compat.jax_triton()   # (imported: no second warning)
  messages = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
  assert len(messages) == warns
  if warns:
    assert f"jax-triton {jt_version} with Triton {triton_version}" in messages[0]
    assert "triton==3.6" in messages[0] and "slower" in messages[0]


def test_gpu_extra_allows_the_tested_pairs_alone():
  # The gpu extra allows only what the GPU tests ran on: the jax-triton + Triton pairs it
  # admits among the released versions (jax-triton 0.4 itself needs Triton >= 3.7) are
  # the GPU rows of the README's "Tested" table, neither more nor fewer.
  import tomllib
  from packaging.requirements import Requirement
  from packaging.version import Version
  root = pathlib.Path(__file__).resolve().parents[1]
  extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
      "optional-dependencies"]["gpu"]
  spec = {r.name: r.specifier for r in map(Requirement, extra)}
  allowed = {(j, t) for j in ("0.3.1", "0.4.0", "0.4.1")
             for t in ("3.6.0", "3.7.0", "3.8.0", "3.9.0")
             if spec["jax-triton"].contains(j) and spec["triton"].contains(t)
             and (Version(j) < Version("0.4") or Version(t) >= Version("3.7"))}
  rows = shard_tests.tested_pairs()
  tested = set(rows)
  assert len(rows) == len(tested)   # (one row a pair)
  assert allowed == tested


def test_jax_triton_import_from_two_threads(monkeypatch, tmp_path):
  # Two threads asking for jax_triton at once: the one that finds the other's import
  # under way waits for it (a module half imported has no triton_call yet), and
  # TRITON_CACHE_DIR ends as the user had it.
  _stand_in_jax_triton(
      monkeypatch, tmp_path,
      f"import os, time\n{_IMPORT_ENV['0.3.1']}\ntime.sleep(0.5)\nWHO = 'stand-in'\n")
  monkeypatch.setenv("TRITON_CACHE_DIR", "/users/triton")
  got = []
  first = threading.Thread(target=lambda: got.append(_compat.jax_triton().WHO))
  try:
    first.start()
    deadline = time.monotonic() + 30
    while "jax_triton" not in sys.modules and time.monotonic() < deadline:
      time.sleep(0.001)   # (until the first thread's import has begun)
    got.append(_compat.jax_triton().WHO)
  finally:
    first.join()
  assert got == ["stand-in", "stand-in"]
  assert os.environ["TRITON_CACHE_DIR"] == "/users/triton"


@dataclasses.dataclass
class _Compiled:
  """jax-triton 0.3.1's CompilationResult."""
  binary: str
  name: str
  shared_mem_bytes: int
  ttgir: str
  llir: str


def _key(name: str) -> str:
  return hashlib.sha256(name.encode()).hexdigest()   # (a kernel's key: 64 hex digits)


def _kept(folder, name, size, used):
  """An entry of the kernel cache holding about ``size`` bytes, last used at ``used``."""
  _compat._cache_store(folder, _key(name), _Compiled(os.urandom(size // 2).hex(), name, 0, "",
                                                     ""))
  os.utime(folder / _key(name) / _compat._KERNEL_FILE, (used, used))


def _size(folder, name) -> int:
  return sum(f.stat().st_size for f in (folder / _key(name)).iterdir())


def _entries(folder) -> list:
  names = {_key(n): n for n in ["new", "writing", "crashed", "empty", "old"] +
           [f"k{i:02d}" for i in range(12)]}
  return sorted(names.get(e.name, e.name) for e in folder.iterdir())


@pytest.mark.parametrize("mib", ["", "0.5", "0.25", "0.01"])
def test_kernel_cache_drops_the_least_recently_used_past_its_bound(monkeypatch, tmp_path, mib):
  # Past MEMEFF_JAX_KERNEL_CACHE_MAX_MB (default 1024) a store removes the entries used
  # least recently (oldest mtime; a load marks its entry used) until the rest fill three
  # quarters of the bound; the entry just stored stays. Entries of about 50 KB.
  monkeypatch.setenv(_compat.KERNEL_CACHE_MAX_ENV, mib)
  limit = int(float(mib or _compat.KERNEL_CACHE_MAX_MB) * 2**20)
  assert _compat.kernel_cache_limit() == limit
  monkeypatch.setenv(_compat.KERNEL_CACHE_MAX_ENV, "1000")   # (no pruning while filling)
  for i in range(12):
    _kept(tmp_path, f"k{i:02d}", 100_000, used=1_000_000 + i)
  sizes = {name: _size(tmp_path, name) for name in _entries(tmp_path)}
  assert _compat._cache_load(tmp_path, _key("k00"), _Compiled).name == "k00"   # used now
  monkeypatch.setenv(_compat.KERNEL_CACHE_MAX_ENV, mib)
  _kept(tmp_path, "new", 100_000, used=500_000)   # (stored last; its mtime the oldest)
  sizes["new"] = _size(tmp_path, "new")
  left = _entries(tmp_path)
  if sum(sizes.values()) <= limit:
    assert len(left) == 13
    return
  # the oldest go first (k01, k02, ...), until what is left fits 3/4 of the bound
  want = set(sizes)
  for name in [f"k{i:02d}" for i in range(1, 12)] + ["k00"]:
    if sum(sizes[k] for k in want) <= limit - limit // 4:
      break
    want.discard(name)
  assert left == sorted(want)
  assert "new" in left and ("k00" in left) == (len(left) > 1)
  assert sum(sizes[k] for k in left) <= max(limit - limit // 4, sizes["new"])


@pytest.mark.parametrize("mib", ["0", "-5", "ten", "inf", "nan"])
def test_kernel_cache_bound_not_a_size_warns(monkeypatch, mib):
  # A MEMEFF_JAX_KERNEL_CACHE_MAX_MB that is no size in MiB > 0 warns, naming the
  # variable, and the default bound holds (the cache never stops a compile).
  monkeypatch.setenv(_compat.KERNEL_CACHE_MAX_ENV, mib)
  with pytest.warns(RuntimeWarning, match="MEMEFF_JAX_KERNEL_CACHE_MAX_MB"):
    assert _compat.kernel_cache_limit() == _compat.KERNEL_CACHE_MAX_MB * 2**20


def test_kernel_cache_prune_spares_a_write_under_way_and_other_files(tmp_path):
  # An entry holding only a fresh temporary file (another process writing it) counts
  # as used now; an empty entry and a crashed write's old leftovers go first. What is
  # not memeff_jax's (MEMEFF_JAX_KERNEL_CACHE may name any folder) neither counts nor goes.
  _kept(tmp_path, "old", 100_000, used=1_000_000)
  tmp = f"{_compat._KERNEL_FILE}.123.tmp"
  (tmp_path / _key("writing")).mkdir()
  (tmp_path / _key("writing") / tmp).write_bytes(b"x" * 100_000)
  (tmp_path / _key("crashed")).mkdir()
  (tmp_path / _key("crashed") / tmp).write_bytes(b"x" * 100_000)
  os.utime(tmp_path / _key("crashed") / tmp, (1_000_000, 999_000))
  (tmp_path / _key("empty")).mkdir()
  for other in ("theirs", _key("theirs")):   # a user's folders, old and large
    (tmp_path / other).mkdir()
    (tmp_path / other / "data.bin").write_bytes(b"x" * 1_000_000)
    os.utime(tmp_path / other / "data.bin", (1, 1))
  _kept(tmp_path, "new", 100_000, used=2_000_000)
  # a bound whose three quarters hold "writing" and "new" and half of "old"
  goal = _size(tmp_path, "writing") + _size(tmp_path, "new") + _size(tmp_path, "old") // 2
  _compat._cache_prune(tmp_path, goal * 4 // 3, keep=_key("new"))
  assert _entries(tmp_path) == sorted(["new", "writing", "theirs", _key("theirs")])
  assert all((tmp_path / d / "data.bin").stat().st_size == 1_000_000
             for d in ("theirs", _key("theirs")))


def test_kernel_cache_counts_its_folder_at_first_and_near_its_bound(monkeypatch, tmp_path):
  # A process lists the folder at its first store, then adds what it stores and lists it
  # again only when that sum would pass the bound; that count sees what other processes
  # stored meanwhile, and the prune brings the whole folder under the bound.
  counts = []
  listdir = _compat._listdir
  monkeypatch.setattr(_compat, "_listdir",
                      lambda d: (counts.append(d == tmp_path), listdir(d))[1])
  monkeypatch.setenv(_compat.KERNEL_CACHE_MAX_ENV, "1")   # 1 MiB: ~18 entries of 57 KB
  for i in range(4):
    _kept(tmp_path, f"k{i:02d}", 100_000, used=1_000_000 + i)
  assert sum(counts) == 1
  theirs = _key("old")   # another process's entry, 0.7 MiB, used long ago
  (tmp_path / theirs).mkdir()
  (tmp_path / theirs / _compat._KERNEL_FILE).write_bytes(os.urandom(700_000))
  os.utime(tmp_path / theirs / _compat._KERNEL_FILE, (1, 1))
  sizes = [_size(tmp_path, f"k{i:02d}") for i in range(4)]
  i = 4
  while sum(counts) == 1:   # (the folder may pass its bound until the next count)
    _kept(tmp_path, f"k{i:02d}", 100_000, used=1_000_000 + i)
    sizes.append(_size(tmp_path, f"k{i:02d}"))
    i += 1
    assert i < 40
  assert sum(sizes[:-1]) <= 2**20 < sum(sizes)   # (counted when its own sum passed)
  left = sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file())
  assert "old" not in _entries(tmp_path) and left <= 2**20 - 2**20 // 4


class _Ttir:
  """A TTIR module as the compile hook reads it: its text and attributes."""

  def __init__(self, name, body):
    self.text = f"module {{\n  tt.func public @{name}(%arg0: !tt.ptr<f32>) {{ {body} }}\n}}"

  def __str__(self):
    return self.text

  def get_int_attr(self, name):
    return None


def test_compiled_kernels_are_kept_for_the_next_process(monkeypatch, tmp_path):
  # jax-triton compiles every kernel afresh in each process (CLIP's step: 6 s of
  # lowering on an H100, fused Matryoshka's 26 s). _compile_hook keeps memeff_jax's
  # compiled kernels in MEMEFF_JAX_KERNEL_CACHE's folder, keyed by the TTIR and what
  # else the compile reads: a second process loads the first one's result instead of
  # compiling. Other options or another TTIR compile; another library's kernel is never
  # kept; MEMEFF_JAX_KERNEL_CACHE=0 keeps nothing; an unreadable entry is compiled again,
  # and a key that cannot be formed (no ptxas) leaves the kernel compiled, not kept.
  pytest.importorskip("triton._C.libtriton")
  monkeypatch.setenv(_compat.KERNEL_CACHE_ENV, str(tmp_path))
  for name in ("TRITON_ALWAYS_COMPILE", "JAX_TRITON_DUMP_DIR"):
    monkeypatch.delenv(name, raising=False)
  compiled = []

  def compile_ttir(ttir, backend, options, cc, platform):   # 0.3.1's signature
    compiled.append((str(ttir), options.hash()))
    return _Compiled(f"PTX of {ttir} for {options.hash()}", "_k", 1024, "TTGIR", "LLIR")

  tlib = types.SimpleNamespace(CompilationResult=_Compiled)
  jt = types.ModuleType("jax_triton")
  jt.triton_lib, jt.__version__ = tlib, "0.3.1"
  monkeypatch.setitem(sys.modules, "jax_triton", jt)
  monkeypatch.setattr(_compat, "_OURS", {"_k"})
  backend = types.SimpleNamespace(hash=lambda: "ptxas-12.8-90")
  warps = lambda w: types.SimpleNamespace(hash=lambda: f"num_warps-{w}")

  def process(ttir, options):   # a new process: jax-triton's compile, the hook anew
    tlib.compile_ttir_inplace = compile_ttir
    _compat._compile_hook.__wrapped__()
    return tlib.compile_ttir_inplace(ttir, backend, options, 90, "cuda")

  first = process(_Ttir("_k", "a"), warps(4))
  assert process(_Ttir("_k", "a"), warps(4)) == first and len(compiled) == 1
  assert first.binary == f"PTX of {_Ttir('_k', 'a')} for num_warps-4"
  assert process(_Ttir("_k", "a"), warps(8)) != first and len(compiled) == 2
  process(_Ttir("_k", "b"), warps(4))
  assert len(compiled) == 3
  entries = sorted(tmp_path.rglob(_compat._KERNEL_FILE))
  assert len(entries) == 3
  process(_Ttir("_theirs", "a"), warps(4))
  process(_Ttir("_theirs", "a"), warps(4))
  assert len(compiled) == 5 and sorted(tmp_path.rglob(_compat._KERNEL_FILE)) == entries
  for entry in entries:
    entry.write_bytes(b"not a kept kernel")
  assert process(_Ttir("_k", "a"), warps(4)) == first and len(compiled) == 6
  assert process(_Ttir("_k", "a"), warps(4)) == first and len(compiled) == 6

  def no_ptxas():
    raise OSError("no ptxas")

  backend.hash = no_ptxas   # a key it cannot form: compiled, nothing kept
  process(_Ttir("_k", "d"), warps(4))
  assert len(compiled) == 7 and len(list(tmp_path.rglob(_compat._KERNEL_FILE))) == 3
  backend.hash = lambda: "ptxas-12.8-90"
  monkeypatch.setenv(_compat.KERNEL_CACHE_ENV, "0")
  process(_Ttir("_k", "c"), warps(4))
  process(_Ttir("_k", "c"), warps(4))
  assert len(compiled) == 9 and len(list(tmp_path.rglob(_compat._KERNEL_FILE))) == 3


@pytest.mark.parametrize("d,chunks", [(200, 4), (512, 2), (96, 1), (33, 3)])
def test_saved_rows_gradient_round_trips(d, chunks):
  # backends.base.scale_rows / unscale_rows, the form a rows' gradient formed in the
  # forward is saved in: float16 for 16-bit inputs, each row over its largest magnitude
  # (1 for a zero row), back to fp32 within float16's rounding (2^-11 of the row's
  # largest entry); a kernel's chunk scales (chunk k: features [k w, (k + 1) w), w the
  # power of two >= d / chunks, the last chunk ragged) against an independent loop.
  rng = np.random.default_rng(d)
  dx = rng.standard_normal((6, d)).astype(np.float32) * np.float32(10.0) ** rng.integers(
      -30, 30, (6, 1))
  dx[2] = 0.0
  u, big = base.scale_rows(jnp.asarray(dx), jnp.bfloat16)
  assert u.dtype == jnp.float16 and big.shape == (6, 1)
  back = np.asarray(base.unscale_rows(u, big))
  top = np.abs(dx).max(axis=1, keepdims=True)
  assert np.all(np.abs(back - dx) <= 2.0 ** -11 * top)
  assert base.scale_rows(jnp.asarray(dx), jnp.float32)[0].dtype == jnp.float32
  width = 1 << (-(-d // chunks) - 1).bit_length()
  scales = rng.uniform(0.5, 4.0, (6, chunks)).astype(np.float32)
  want = np.empty((6, d), np.float32)
  for f in range(d):
    want[:, f] = dx[:, f] * scales[:, f // width]
  np.testing.assert_allclose(base.unscale_rows(jnp.asarray(dx), jnp.asarray(scales)), want,
                             rtol=1e-6)


@dataclasses.dataclass(frozen=True)
class _RowsInForward(BlockwiseBackend):
  """The blockwise backend with ``fwd_rows``, as a kernel would shape it: its statistics
  and its rows' gradient pass for unit cotangents, each row's times l_i = exp(lse_i - 3)
  (unnormalized sums), behind a bounded forward's ``floor`` (-1e30: always exact enough;
  1e30: never, so the exact fallback runs). The gradient passes that run (not those
  merely traced, as the rerun's loop body is) are recorded in ``_RUNS``."""

  floor: float = -1e30
  name: str = "blockwise"

  def fwd_floor(self, x, scale, spec):
    return jnp.asarray(self.floor, jnp.float32)

  def fuses_rows(self, x, y, spec, *, y_trains):
    return True

  def fwd_stats(self, block, scale, *, row_thr, spec, bounded=False):   # (exact either way)
    return super().fwd_stats(block, scale, row_thr=row_thr, spec=spec)

  def fwd_rows(self, block, scale, *, row_thr, spec, want_cs):
    lse, _, mx, _ = self.fwd_stats(block, scale, row_thr=row_thr, spec=spec)
    unit = base.Side(spec.reduction.residual(lse), jnp.ones_like(lse), row_thr)
    dx, cs = super().bwd(block, scale, row=unit, col=None, spec=spec, want_cs=want_cs,
                         out_dtype=jnp.float32)
    l = jnp.where(lse > -jnp.inf, jnp.exp(lse - 3.0), 0.0).astype(jnp.float32)
    return (lse, mx if spec.want_max else None, *base.scale_rows(dx * l[:, None], block.x.dtype),
            None if cs is None else cs * l, l)

  def bwd(self, block, scale, *, row, col, spec, want_cs, out_dtype):
    kind = "both" if (row is not None and col is not None) else "rows" if col is None else "cols"
    jax.debug.callback(lambda: _RUNS.append(kind))
    return super().bwd(block, scale, row=row, col=col, spec=spec, want_cs=want_cs,
                       out_dtype=out_dtype)


_RUNS = []


@pytest.mark.parametrize("family", ["lit", "qwen3", "lit_qwen3"])
@pytest.mark.parametrize("floor", [-1e30, 1e30], ids=["fused", "fallback"])
def test_rows_gradient_from_the_forward(monkeypatch, family, floor):
  # _core._fuses_rows: a backend that forms the rows' gradient in the forward
  # (Backend.fwd_rows, unnormalized by l) gives the loss, every gradient and the stats of
  # the float64 reference: LiT's rows, Qwen3's queries (thresholds; its documents from
  # the columns' pass; the q-q / d-d blocks as before), where=, a learned temperature,
  # label smoothing, tau_plus; and where the bounded check fails, the exact fallback.
  from tests.support.check import compare
  from tests.support.data import qwen3_batch, where_mask
  from tests.support.families import FAMILIES
  fam = FAMILIES[family]
  monkeypatch.setitem(registry.FACTORIES, "blockwise", lambda: _RowsInForward(floor=floor))
  b, d = 40, 16
  arrays = (list(qwen3_batch(b, b, d, 3, jnp.float32)) if "qwen3" in family else
            [jax.random.normal(k, (b, d)) for k in jax.random.split(jax.random.key(5), 2)])
  w = where_mask(b, seed=3)
  jax.clear_caches()
  grad = jax.grad(lambda *a: fam.loss(*a, where=w, backend="blockwise", **fam.options),
                  argnums=tuple(range(len(arrays))))
  _RUNS.clear()
  jax.block_until_ready(grad(*arrays))
  jax.effects_barrier()
  # No rows' pass but the fallback's; Qwen3's documents take the columns' one, its
  # symmetric q-q / d-d blocks their own (both roles).
  assert ("rows" in _RUNS) == (floor > 0), _RUNS
  assert ("cols" in _RUNS) == (family == "qwen3"), _RUNS
  compare(lambda *a, **k: fam.with_stats(*a, where=w, backend="blockwise", **fam.options,
                                         **k)[0],
          lambda *a, **k: fam.reference_with_stats(*[v[w] for v in a], **fam.options, **k)[0],
          arrays, label_smoothing=0.1, tau_plus=0.05)
  # A differentiated call's stats (lse, accuracies: from the fused forward) are those of
  # the plain one.
  stats = lambda: jax.grad(lambda x: fam.with_stats(
      x, *arrays[1:], where=w, backend="blockwise", temperature=0.07, **fam.options),
                           has_aux=True)(arrays[0])[1]
  fused = stats()
  monkeypatch.setitem(registry.FACTORIES, "blockwise", BlockwiseBackend)
  jax.clear_caches()
  plain = stats()
  for f, p in zip(jax.tree.leaves(fused), jax.tree.leaves(plain)):
    np.testing.assert_allclose(np.asarray(f, np.float64), np.asarray(p, np.float64),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family,t,tiled", [("lit", 0.07, False), ("qwen3", 0.07, False),
                                            ("lit_qwen3", 0.07, False), ("lit", 0.005, False),
                                            ("lit", 0.07, True), ("qwen3", 0.07, True),
                                            ("lit", 0.005, True)])
def test_rows_gradient_in_the_forward_interpreted(monkeypatch, family, t, tiled):
  # Algorithm.fwd_row_grad on the Triton kernels (Triton's interpreter): the
  # FlashAttention-shaped gradient kernel with the bounded shift for every lse also sums
  # each row's coefficients (and the largest kept s) in the forward
  # (backward.lse_fwd_rows); tests/support/rows_forward.py says what is checked. bf16,
  # where=, Qwen3's thresholds and q-q / d-d blocks, a batch of several tiles, two
  # feature chunks a program (the saved gradient's float16 rows scaled chunk by chunk);
  # at t = 0.005 LiT's unaligned rows fall below the bounded floor and the exact rerun
  # runs. tiled: the tiled gradient's coefficient slabs (Algorithm.bwd_tiled, the
  # defaults above d_pad = 512) form it instead, in slabs of 32 rows (each slab's rows
  # scaled to float16 as it is multiplied in).
  from memeff_jax.backends.triton import backward
  from tests.support.data import qwen3_batch, where_mask
  from tests.support.families import FAMILIES
  from tests.support.rows_forward import check_rows_in_forward
  fam, b, d, dtype = FAMILIES[family], 70, 32, jnp.bfloat16
  arrays = (list(qwen3_batch(b, b, d, 3, dtype)) if "qwen3" in family else
            [jax.random.normal(k, (b, d)).astype(dtype)
             for k in jax.random.split(jax.random.key(5), 2)])
  w = where_mask(b, seed=3)
  names = []
  call = backward.call
  monkeypatch.setattr(backward, "call", lambda *a, name, **k: names.append(name) or
                      call(*a, name=name, **k))
  jax.clear_caches()
  cfg = triton_backend.TritonBackend(interpret=True).default_config(d, dtype).evolve(
      algorithm=dict(fwd_row_grad=True, fwd_tiled=True, bwd_tiled=tiled),
      bwd=dict(block_m=32, block_n=32, block_do=16),
      budgets=dict(min_slab_rows=32, slab_kib=b * 32 * 2 // 1024 + 1) if tiled else {})
  check_rows_in_forward(
      monkeypatch, fam, arrays, w,
      lambda *a, **k: fam.reference_with_stats(*[v[w] for v in a], **fam.options, **k)[0],
      names, backend="interpret", cfg=cfg, t=t, dtype=dtype, rerun=t < 0.01)
  assert ("memeff/lse_fwd_rows_tiled" in names) == tiled, names


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (64, 64), (128, 64)])
def test_self_tiles_are_the_tiles_holding_self_pairs(block_m, block_n):
  # The Triton gradient walks [d0, d1) with the self pairs' test and the rest of the
  # split without it (grad_bwd, d <= 128): a tile with a self pair outside [d0, d1)
  # would keep its pair, and one inside it without any only costs the test. The walks:
  # the diagonal before, at the start of, inside, at the end of and past a split, ragged
  # ends, ring offsets either way.
  rng = np.random.default_rng(block_m * 1000 + block_n)
  cases = []
  for _ in range(160):
    m = int(rng.integers(1, 12 * block_n))
    cps = block_n * int(rng.integers(1, 8))
    j_lo = cps * int(rng.integers(0, -(-m // cps)))
    j_hi = min(m, j_lo + cps)
    row0 = block_m * int(rng.integers(0, 8))
    row_off, col_off = (int(v) for v in rng.integers(-4 * block_n, 4 * block_n, 2))
    if rng.random() < 0.3:   # the diagonal at a tile's edge
      col_off = row0 + row_off - j_lo - block_n * int(rng.integers(-2, 4))
    cases.append((row0, j_lo, j_hi, row_off, col_off))
  d0, d1 = walk.self_tiles_on(np.array(cases), block_m, block_n, interpret=True)
  for case, a, b in zip(cases, d0, d1):
    want = walk.tested_tiles(*case, block_m, block_n)
    got = list(range(case[1], case[2], block_n))
    got = [j0 for j0 in got if a <= j0 < b]
    assert got == want, (case, a, b)
    assert case[1] <= a <= b and (b - case[1]) % block_n == 0, (case, a, b)


_RETRACE = """
import jax, jax.numpy as jnp
import memeff_jax as mj
from memeff_jax.config.defaults import default_config
cfg = default_config(16, jnp.bfloat16)   # the GPU's: LiT's rows' gradient in the forward
f = lambda a, b, t: mj.lit_loss(a, b, temperature=t, backend="interpret", config=cfg)
full = lambda a, b, t: jax.value_and_grad(f, argnums=(0, 1, 2))(a, b, t)
t_only = lambda a, b, t: jax.lax.scan(
    lambda u, _: (u - jax.grad(f, argnums=2)(a, b, u), None), t, None, length=2)[0]
cond = lambda a, b, t: jax.value_and_grad(lambda *c: jax.lax.cond(
    c[2] > 0, lambda: f(*c), lambda: 0.0 * f(*c)), argnums=(0, 1, 2))(a, b, t)
arr, t = jax.ShapeDtypeStruct((64, 16), jnp.bfloat16), jax.ShapeDtypeStruct((), jnp.float32)
for g in (full, t_only, cond):
  jax.eval_shape(jax.jit(g), arr, arr, t)
"""


def test_one_block_op_traced_under_three_perturbation_patterns():
  # The same block op (its jit cached per spec, so one custom_vjp equation for every
  # trace of these shapes), linearized with x perturbed (LiT's rows' forward and its
  # residuals), then t alone (the plain forward's), then x again under a cond: JAX's
  # dead-code pass over that equation reads the residual layout of the last forward it
  # traced, not of the one it memoized for the pattern, so the residuals keep one
  # layout whatever is perturbed (the third trace failed: "foreach() argument 2 is
  # longer than argument 1"). In a fresh process, so no other test's traces share the
  # equation.
  env = dict(os.environ, TRITON_INTERPRET="1")
  out = subprocess.run([sys.executable, "-c", _RETRACE], env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
