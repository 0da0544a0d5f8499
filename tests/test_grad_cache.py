"""grad_cache vs plain jax.value_and_grad of the whole batch's loss.

The oracle (tests/support/towers.py: ``plain``): the embeddings of every chunk
concatenated (a Python loop over the chunks, each with its fold_in key), the loss of
the lot, and ``jax.value_and_grad`` through all of it. Tolerances: float64 1e-10 and float32 1e-5
(relative to the largest entry), as the gradient-caching issue states them; only the
summation order of the parameter gradients differs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import memeff_jax
from memeff_jax import grad_cache
from tests.support import towers
from tests.support.check import sampled
from tests.support.families import FAMILIES
from tests.support.towers import EMB, FEAT

TOL = {jnp.dtype(jnp.float64): 1e-10, jnp.dtype(jnp.float32): 1e-5}


def _compare(family, dtype, n, chunk, *, rng=jax.random.key(3), hard=None, batch=None,
             **loss_kw):
  hard = family in ("qwen3", "lit_qwen3") if hard is None else hard
  with jax.enable_x64(dtype == jnp.float64):
    params = towers.params(dtype)
    batch = towers.batch(n, dtype, hard) if batch is None else batch
    loss_fn = towers.loss(family, **loss_kw)
    got = jax.jit(grad_cache(towers.embed, loss_fn, chunk_size=chunk))(params, batch, rng)
    want = jax.jit(towers.plain(towers.embed, loss_fn, chunk))(params, batch, rng)
    towers.assert_close(got, want, TOL[jnp.dtype(dtype)])
    return got, want


# By default each family in one dtype, alternating (the rest: slow).
@pytest.mark.parametrize("family,dtype", sampled(
    [(f, dt) for f in FAMILIES for dt in ("f64", "f32")],
    lambda i, c: i % 2 == (list(FAMILIES).index(c[0]) % 2)))
def test_every_family_with_dropout_and_a_remainder(family, dtype):
  # 11 rows in chunks of 4: two full chunks and a remainder of 3; dropout in both towers.
  _compare(family, {"f64": jnp.float64, "f32": jnp.float32}[dtype], 11, 4)


@pytest.mark.parametrize("chunk", [1, 12, 5, 40, np.int64(4)])
def test_chunk_sizes(chunk):
  # chunk = 1, chunk = B, a remainder, one chunk larger than the batch, a NumPy int.
  _compare("clip", jnp.float64, 12, chunk)


def test_without_rng():
  # rng=None hands embed_fn None (here: no dropout), in both passes.
  _compare("qwen3", jnp.float64, 9, 4, rng=None)


def test_where_rides_along_as_a_bool_embedding():
  # A where= mask carried through embed_fn as a bool leaf (it has no gradient).
  with jax.enable_x64(True):
    batch = dict(towers.batch(10, jnp.float64), keep=jnp.arange(10) % 4 != 1)
  _compare("clip", jnp.float64, 10, 3, batch=batch)
  _compare("qwen3", jnp.float32, 10, 3, batch=dict(towers.batch(10, jnp.float32, True),
                                                   keep=jnp.arange(10) % 3 != 0))


@pytest.mark.parametrize("family", ["clip", "lit_qwen3"])
def test_matryoshka_dims(family):
  _compare(family, jnp.float64, 10, 4, matryoshka_dims=(2, 4, 8))


def test_interpret_backend():
  # The Triton kernels (interpreter) as the loss in the middle.
  _compare("clip", jnp.float32, 9, 4, backend="interpret")


def test_has_aux():
  def loss_fn(p, e):
    loss, stats = memeff_jax.clip_loss_with_stats(e["a"], e["b"], backend="blockwise",
                                                   temperature=jnp.exp(-p["log_scale"]))
    return loss, stats.accuracy_row
  with jax.enable_x64(True):
    params, batch = towers.params(jnp.float64), towers.batch(9, jnp.float64)
    rng = jax.random.key(4)
    (loss, acc), grads = grad_cache(towers.embed, loss_fn, chunk_size=4, has_aux=True)(
        params, batch, rng)
    (loss_ref, acc_ref), grads_ref = towers.plain(towers.embed, loss_fn, 4, True)(
        params, batch, rng)
    np.testing.assert_allclose(np.asarray(acc), np.asarray(acc_ref), rtol=0, atol=1e-12)
    towers.assert_close((loss, grads), (loss_ref, grads_ref), 1e-10)


@pytest.mark.parametrize("out", ["scalar", "3-tuple", "length-2 array"])
def test_has_aux_needs_a_loss_aux_tuple(out):
  # As jax.value_and_grad(has_aux=True) (checked here too): anything but a 2-tuple is
  # a TypeError at trace time (a scalar was an IndexError; a 3-tuple or a length-2
  # array was taken apart silently).
  def loss_fn(p, e):
    loss = memeff_jax.clip_loss(e["a"], e["b"], backend="blockwise")
    return {"scalar": loss, "3-tuple": (loss, loss, loss),
            "length-2 array": jnp.stack([loss, loss])}[out]
  params, batch = towers.params(jnp.float32), towers.batch(6, jnp.float32)
  with pytest.raises(TypeError, match="two-element tuple"):
    jax.value_and_grad(lambda p: loss_fn(p, towers.embed(p, batch, None)), has_aux=True)(
        params)
  with pytest.raises(TypeError, match=r"loss_fn must return a \(loss, aux\) tuple"):
    grad_cache(towers.embed, loss_fn, chunk_size=4, has_aux=True)(params, batch)


def test_no_recompilation_for_new_values():
  traces = []
  def embed(p, chunk, key):
    traces.append(1)
    return towers.embed(p, chunk, key)
  step = jax.jit(grad_cache(embed, towers.loss("clip"), chunk_size=4))
  params, batch = towers.params(jnp.float32), towers.batch(10, jnp.float32)
  step(params, batch, jax.random.key(0))
  n = len(traces)
  params2 = jax.tree.map(lambda v: v * 1.5, params)
  step(params2, jax.tree.map(lambda v: v + 1, batch), jax.random.key(1))
  assert len(traces) == n and step._cache_size() == 1


def test_locked_tower_is_not_embedded_again():
  # LiT: the loss's gradient for the locked tower's features is zero by construction,
  # so the gradient pass never runs that tower. The locked tower has its own hidden
  # width (13): its weight gradient would be a dot with a [.., 13] operand.
  def embed(p, chunk, key):
    return {"a": towers.mlp(p["a"], chunk["a"]), "b": towers.mlp(p["locked"], chunk["b"])}
  params = towers.params(jnp.float32, towers=("a",))
  params["locked"] = [jnp.ones((FEAT, 13)), jnp.ones((13, EMB))]
  batch = towers.batch(8, jnp.float32)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
  def hlo(family, ring):
    # ring: each of two devices chunks its 4 rows, the ring loss in the middle (there
    # the locked features' zero gradient comes cast to varying over the axis)
    step = grad_cache(embed, towers.loss(family, axis_name="data" if ring else None),
                      chunk_size=2 if ring else 4)
    if ring:
      step = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P())
    return jax.jit(step).lower(params, batch).compile().as_text()
  dots_13 = lambda text: sum(" dot(" in line and "13]" in line.split("=")[1].split(" dot(")[0]
                             for line in text.splitlines() if "=" in line)
  for ring in (False, True):
    # CLIP trains both towers: forward (2 dots) twice, and the gradient's dots.
    assert dots_13(hlo("clip", ring)) > 2, ring
    # LiT: the locked tower's two dots of the first pass only (f32[..,13] hidden output
    # and the [13, EMB] layer's input-side shapes do not recur in a gradient pass).
    assert dots_13(hlo("lit", ring)) <= 1, ring
  # Its gradients are still right (zero for the locked tower).
  with jax.enable_x64(False):
    got = grad_cache(embed, towers.loss("lit"), chunk_size=3)(params, batch)
    want = towers.plain(embed, towers.loss("lit"), 3)(params, batch)
  np.testing.assert_array_equal(np.asarray(got[1]["locked"][0]), 0)
  towers.assert_close((got[0], {k: v for k, v in got[1].items() if k != "locked"}),
                (want[0], {k: v for k, v in want[1].items() if k != "locked"}), 1e-5)


@pytest.mark.parametrize("family", ["clip", "qwen3"])
def test_shard_map_ring_equals_one_device(family):
  # Eight host devices, each chunking its own 5 rows (chunks of 2: a remainder), the
  # ring loss in the middle; equal to the plain step on the global batch on one device
  # (no dropout: per-device keys would differ from the one-device run's).
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  embed = functools.partial(towers.embed, dropout=False)
  hard = family == "qwen3"
  with jax.enable_x64(True):
    params, batch = towers.params(jnp.float64), towers.batch(40, jnp.float64, hard)
    ring_step = jax.shard_map(
        grad_cache(embed, towers.loss(family, axis_name="data"), chunk_size=2), mesh=mesh,
        in_specs=(P(), P("data")), out_specs=P(), check_vma=True)
    got = jax.jit(ring_step)(params, batch)
    want = jax.jit(towers.plain(embed, towers.loss(family), 40))(params, batch)
    towers.assert_close(got, want, 1e-10)


def test_shard_map_with_per_device_dropout():
  # Per-device dropout keys (fold_in of the device index): grad_cache equals the plain
  # step run in the same shard_map.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  def per_device(step):
    def run(params, batch, rng):
      return step(params, batch, jax.random.fold_in(rng, jax.lax.axis_index("data")))
    return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(P(), P("data"), P()),
                                 out_specs=P(), check_vma=True))
  loss_fn = towers.loss("clip", axis_name="data")
  with jax.enable_x64(True):
    args = towers.params(jnp.float64), towers.batch(24, jnp.float64), jax.random.key(5)
    got = per_device(grad_cache(towers.embed, loss_fn, chunk_size=2))(*args)
    want = per_device(towers.plain(towers.embed, loss_fn, 2))(*args)
    towers.assert_close(got, want, 1e-10)


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_shard_map_with_a_weight_sharded_like_the_batch(chunk):
  # FSDP: tower a's first weight is split over the devices and gathered in embed_fn
  # (that leaf varies over the axis), the other leaves replicated. Each leaf's gradient
  # is the plain step's in the same shard_map: the replicated ones summed over the
  # devices, the shard its own (6 rows a device: chunks of 2, a remainder of 2, one
  # short chunk of 6).
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))

  def embed(p, chunk_, key):
    a = [jax.lax.all_gather(p["a"][0], "data", tiled=True), p["a"][1]]
    return towers.embed({**p, "a": a}, chunk_, key, dropout=False)

  loss_fn = towers.loss("clip", axis_name="data")
  def per_device(step):
    spec = {"a": [P("data"), P()], "b": [P(), P()], "log_scale": P()}
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(spec, P("data")),
                                 out_specs=(P(), spec), check_vma=True))
  with jax.enable_x64(True):
    args = towers.params(jnp.float64), towers.batch(12, jnp.float64)
    got = per_device(grad_cache(embed, loss_fn, chunk_size=chunk))(*args)
    want = per_device(towers.plain(embed, loss_fn, chunk))(*args)
    towers.assert_close(got, want, 1e-10)


def test_compiled_memory_bound():
  # The bar: B = 16384, 4-layer MLP towers of width 1024, 256-d embeddings,
  # chunk 512: temporary memory of the compiled step <= 0.3x plain value_and_grad's.
  # The loss in the middle is the same in both: the blockwise backend on 128-column
  # tiles (its own temporaries, ~90 MiB here, count in both; at its default 512 they
  # take ~130 MiB and the ratio is 0.34).
  n, width, layers, emb = 16384, 1024, 4, 256
  shapes = [(width, width)] * (layers - 1) + [(width, emb)]
  params = {t: [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes] for t in ("a", "b")}
  params["log_scale"] = jax.ShapeDtypeStruct((), jnp.float32)
  batch = {t: jax.ShapeDtypeStruct((n, width), jnp.float32) for t in ("a", "b")}
  embed = lambda p, c, k: {t: towers.mlp(p[t], c[t]) for t in ("a", "b")}
  loss_fn = towers.loss("clip", config=memeff_jax.KernelConfig().evolve(
      blockwise=dict(tile=128)))
  temp = lambda step: jax.jit(step).lower(params, batch).compile().memory_analysis() \
      .temp_size_in_bytes
  cached = temp(grad_cache(embed, loss_fn, chunk_size=512))
  plain = temp(towers.plain(embed, loss_fn, n))
  assert cached <= 0.3 * plain, (cached / 2**20, plain / 2**20)


# Flax's BatchNorm writes its float32 running statistics from the float64 batch.
@pytest.mark.filterwarnings("ignore:scatter inputs have incompatible types:FutureWarning")
def test_nnx_step_with_dropout_batch_norm_and_a_learnable_temperature():
  # The NNX form against nnx.value_and_grad of the chunk-by-chunk embedding: same loss
  # and gradients (float64, 1e-10), and the same state afterwards (dropout's RNG
  # counts, batch statistics updated once per chunk).
  nnx = pytest.importorskip("flax.nnx")
  from memeff_jax import nnx as mnnx  # pylint: disable=g-import-not-at-top

  class DualEncoder(nnx.Module):
    def __init__(self, rngs):
      f64 = dict(dtype=jnp.float64, param_dtype=jnp.float64, rngs=rngs)
      self.image = nnx.Linear(FEAT, EMB, use_bias=False, **f64)   # BatchNorm follows
      self.norm = nnx.BatchNorm(EMB, **f64)
      self.text = nnx.Linear(FEAT, EMB, **f64)
      self.drop = nnx.Dropout(0.25, rngs=rngs)
      self.loss = mnnx.CLIPLoss(temperature=0.1, backend="blockwise")

  embed = lambda m, b: {"a": m.drop(m.norm(m.image(b["a"]))), "b": m.drop(m.text(b["b"]))}
  loss_fn = lambda m, e: m.loss(e["a"], e["b"])
  with jax.enable_x64(True):
    model = DualEncoder(nnx.Rngs(0, dropout=1))
    twin = nnx.clone(model)
    batch = towers.batch(11, jnp.float64)

    @nnx.jit
    def cached(m, b):
      return mnnx.grad_cache(embed, loss_fn, chunk_size=4)(m, b)

    @nnx.jit
    def plain(m, b):
      def whole(m):
        parts = [embed(m, jax.tree.map(lambda a: a[s:s + 4], b)) for s in range(0, 11, 4)]
        return loss_fn(m, jax.tree.map(lambda *v: jnp.concatenate(v), *parts))
      return nnx.value_and_grad(whole)(m)

    loss, grads = cached(model, batch)
    loss_ref, grads_ref = plain(twin, batch)
    towers.assert_close((loss, nnx.to_pure_dict(grads)), (loss_ref, nnx.to_pure_dict(grads_ref)),
                  1e-10, trained=("image", "kernel"))
    assert abs(float(grads["loss"]["logit_scale"][...])) > 0
    after, after_ref = (nnx.to_pure_dict(nnx.state(m, nnx.Not(nnx.Param))) for m in (model, twin))
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(after_ref)):
      a, b = (jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v
              for v in (a, b))
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=0)
    assert int(model.drop.rngs.count[...]) == 3 * 2   # 3 chunks x 2 dropout calls


@pytest.mark.filterwarnings("ignore:Using 'Module.sow:DeprecationWarning")
def test_nnx_sow_in_embed_fn_is_a_value_error():
  # Module.sow adds state on its first call: the chunks' loop could not carry it (a
  # scan's pytree error). A named ValueError instead; sowing from loss_fn, which runs
  # once, leaves the step's loss and gradients those of the step without it.
  nnx = pytest.importorskip("flax.nnx")
  from memeff_jax import nnx as mnnx  # pylint: disable=g-import-not-at-top

  class DualEncoder(nnx.Module):
    def __init__(self, rngs):
      self.image, self.text = nnx.Linear(FEAT, EMB, rngs=rngs), nnx.Linear(FEAT, EMB, rngs=rngs)
      self.loss = mnnx.CLIPLoss(temperature=0.1, backend="blockwise")

  def embed(m, b, sow=False):
    a = m.image(b["a"])
    if sow:
      m.sow(nnx.Intermediate, "norm", jnp.mean(jnp.linalg.norm(a, axis=-1)))
    return {"a": a, "b": m.text(b["b"])}

  def loss_fn(m, e, sow=False):
    if sow:
      m.sow(nnx.Intermediate, "mean", jnp.mean(e["a"]))
    return m.loss(e["a"], e["b"])

  batch = towers.batch(12, jnp.float32)
  step = lambda e, l: nnx.jit(mnnx.grad_cache(e, l, chunk_size=4))(
      DualEncoder(nnx.Rngs(0)), batch)
  with pytest.raises(ValueError, match="embed_fn changed the structure"):
    step(functools.partial(embed, sow=True), loss_fn)
  got, want = step(embed, functools.partial(loss_fn, sow=True)), step(embed, loss_fn)
  towers.assert_close((got[0], nnx.to_pure_dict(got[1])), (want[0], nnx.to_pure_dict(want[1])),
                      0.0, trained=("image", "kernel"))


@pytest.mark.parametrize("mesh_kind", ["Mesh", "make_mesh under set_mesh"])
def test_under_sharded_with_global_arrays(mesh_kind):
  # Global arrays through memeff_jax.sharded: the step closes over the (replicated)
  # params and takes the ring's axis_name from sharded (None when sharded probes the
  # global shapes), the batch is split over the mesh axis; equal to the plain step on
  # one device (no dropout). Also on jax.make_mesh's Explicit axes inside
  # jax.set_mesh, as sharded's docstring suggests (there pass 1's buffers, made with
  # the context's mesh, failed a ShardingTypeError against the embeddings).
  embed = functools.partial(towers.embed, dropout=False)
  with jax.enable_x64(True):
    params, batch = towers.params(jnp.float64), towers.batch(32, jnp.float64)
    want = jax.jit(towers.plain(embed, towers.loss("clip"), 32))(params, batch)

    def global_step(mesh):
      @jax.jit
      def step(params, batch):
        def per_shard(b, axis_name):
          step = grad_cache(embed, towers.loss("clip", axis_name=axis_name), chunk_size=3)
          return step(params, b)
        return memeff_jax.sharded(per_shard, mesh, "data")(batch)
      return step(params, batch)

    if mesh_kind == "Mesh":
      got = global_step(jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",)))
    else:
      mesh = jax.make_mesh((8,), ("data",))
      with jax.set_mesh(mesh):
        got = global_step(mesh)
    towers.assert_close(got, want, 1e-10)


@pytest.mark.parametrize("chunk", [2, 3])
def test_unplaced_inputs_under_set_mesh(chunk):
  # Inside jax.set_mesh (Explicit axes), inputs not placed on the mesh: equal to the
  # plain step run there (chunks that divide the batch, and a remainder). Without
  # dropout, whose random bits would carry the context's mesh into the embeddings.
  params, batch = towers.params(jnp.float32), towers.batch(10, jnp.float32)
  loss_fn = towers.loss("clip")
  with jax.set_mesh(jax.make_mesh((8,), ("data",))):
    got = jax.jit(grad_cache(towers.embed, loss_fn, chunk_size=chunk))(params, batch)
    want = jax.jit(towers.plain(towers.embed, loss_fn, chunk))(params, batch)
  towers.assert_close(got, want, 1e-5)
