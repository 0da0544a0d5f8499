"""``sharded`` however it is called equals one device: eagerly and under jit, with a
mesh axis or a tuple of them, on meshes from ``Mesh(...)`` and ``jax.make_mesh``
(Explicit or Auto axes), with global arrays sharded any way or not; numpy per-row
arrays are split like jax arrays; per-row statistics come back global."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import memeff_jax as mj
from tests.support.data import towers
from tests.support.tolerances import grad_err, rel_err

B, D = 8, 16
# x, y and a per-row tau_plus kept as numpy float64 (split like a jax array).
_data = functools.partial(towers, B, D, noise=0.5, tau_max=0.4, numpy_tau=True)


def _one_device(fn, x, y, **kw):
  return jax.value_and_grad(lambda a, b: fn(a, b, backend="blockwise", **kw), (0, 1))(x, y)


def _assert_same(got, want):
  (v, g), (rv, rg) = got, want
  assert rel_err(v, rv) <= 2e-6, (float(v), float(rv))
  for a, b in zip(g, rg):
    assert a.shape == b.shape and grad_err(a, b) <= 2e-5, grad_err(a, b)


def test_eager_equals_one_device():
  # No jit anywhere: sharded jits itself (an eager shard_map over custom_vjp with
  # symbolic zeros is not implemented in JAX).
  x, y, tau = _data()
  f = mj.sharded(mj.qwen3_loss, Mesh(np.array(jax.devices()[:4]), ("batch",)), "batch")
  got = jax.value_and_grad(lambda a, b: f(a, b, backend="blockwise", tau_plus=tau,
                                          use_qq_negatives=True), (0, 1))(x, y)
  _assert_same(got, _one_device(mj.qwen3_loss, x, y, tau_plus=jnp.asarray(tau, jnp.float32),
                                use_qq_negatives=True))


def test_eager_with_stats_and_matryoshka():
  # Per-row statistics come back global ([K, B] with Matryoshka: the batch axis is the
  # last one), per-dim losses replicated.
  x, y, _ = _data()
  kw = dict(backend="blockwise", matryoshka_dims=(4, D), lse_square_scale=1e-2)
  loss, stats = mj.sharded(mj.clip_loss_with_stats, Mesh(np.array(jax.devices()[:4]),
                                                         ("batch",)), "batch")(x, y, **kw)
  want, want_stats = mj.clip_loss_with_stats(x, y, **kw)
  np.testing.assert_allclose(loss, want, rtol=2e-6)
  for name in ("lse_row", "lse_col", "matryoshka_losses", "z_loss", "accuracy_row"):
    got, ref = getattr(stats, name), getattr(want_stats, name)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)


MESHES = {
    "Mesh": lambda: Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "fsdp")),
    "explicit": lambda: jax.make_mesh((2, 2), ("data", "fsdp"),
                                      axis_types=(AxisType.Explicit,) * 2),
    "auto": lambda: jax.make_mesh((2, 2), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2),
}


_FAST = {("Mesh", ("data", "fsdp"), None), ("auto", ("data", "fsdp"), "fsdp"),
         ("explicit", ("data", "fsdp"), None), ("explicit", ("data", "fsdp"), "both"),
         ("explicit", "data", "fsdp"), ("auto", "data", None)}
# The full product is marked slow; by default a sample that covers each mesh kind,
# each axis form and each layout runs.
LAYOUTS = {None: None, "both": P(("data", "fsdp")), "fsdp": P("fsdp")}
CASES = [pytest.param(m, a, l, marks=() if (m, a, l) in _FAST else pytest.mark.slow)
         for m in MESHES for a in [("data", "fsdp"), "data"] for l in LAYOUTS]


@pytest.mark.parametrize("mesh,axis,layout", CASES)
def test_meshes_axes_and_layouts(mesh, axis, layout):
  # FSDP-style: the batch split over both axes; or over one, replicated over the other.
  # Global arrays arrive unsharded, sharded like the loss wants, or sharded otherwise.
  m = MESHES[mesh]()
  x, y, tau = _data()
  want = _one_device(mj.clip_loss, x, y, tau_plus=jnp.asarray(tau, jnp.float32))
  if LAYOUTS[layout] is not None:
    x, y = (jax.device_put(v, NamedSharding(m, LAYOUTS[layout])) for v in (x, y))
  f = mj.sharded(mj.clip_loss, m, axis)
  g = jax.value_and_grad(lambda a, b: f(a, b, tau_plus=tau, backend="blockwise"), (0, 1))
  if mesh == "explicit":
    _assert_same(jax.jit(g)(x, y), want)
    # JAX itself needs the mesh set to differentiate eagerly over Explicit axes (even
    # jnp.sum would fail without it).
    with jax.set_mesh(m):
      _assert_same(g(x, y), want)
  else:
    _assert_same(g(x, y), want)


@pytest.mark.parametrize("case", ["siglip", "clip_matryoshka_bf16"])
def test_triton_kernels_under_set_mesh(case):
  # The kernels' outputs are built from shapes alone, on no mesh; under jax.set_mesh on
  # Explicit axes they meet loop carries jnp made on the mesh (SigLIP's summed slabs
  # and the 16-bit Matryoshka forward's raised a ShardingTypeError there). On one
  # device and through sharded, eagerly differentiated: the call with no mesh set
  # (one device: the same arithmetic; the ring: its own summation order, bf16
  # gradients within two bf16 ulps).
  x, y, _ = _data()
  fn, kw, tol = mj.siglip_loss, {}, 2e-5
  if case != "siglip":
    x, y = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
    fn, kw, tol = mj.clip_loss, dict(matryoshka_dims=(4, D)), 2**-7
  step = lambda f: jax.value_and_grad(lambda a, b: f(a, b, backend="interpret", **kw), (0, 1))
  want = step(fn)(x, y)
  m = MESHES["explicit"]()
  with jax.set_mesh(m):
    one = step(fn)(x, y)
    ring = step(mj.sharded(fn, m, ("data", "fsdp")))(x, y)
  for got, g_tol in ((one, 1e-6), (ring, tol)):
    assert rel_err(got[0], want[0]) <= 2e-6, (float(got[0]), float(want[0]))
    for a, b in zip(got[1], want[1]):
      assert a.dtype == b.dtype and grad_err(a, b) <= g_tol, grad_err(a, b)


def test_numpy_per_row_arrays_are_split():
  x, y, tau = _data()
  f = mj.sharded(mj.lit_loss, Mesh(np.array(jax.devices()[:2]), ("batch",)), "batch")
  got = f(x, y, tau_plus=tau, backend="blockwise")                  # numpy float64 [B]
  want = f(x, y, tau_plus=jnp.asarray(tau, jnp.float32), backend="blockwise")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(got, mj.lit_loss(x, y, tau_plus=tau, backend="blockwise"),
                             rtol=2e-6)


def test_static_keywords_compile_once():
  # Non-array keywords are static: the same ones reuse the compiled ring.
  x, y, _ = _data()
  calls = []
  f = mj.sharded(lambda a, b, *, axis_name, **kw: calls.append(1) or mj.clip_loss(
      a, b, axis_name=axis_name, **kw), Mesh(np.array(jax.devices()[:2]), ("batch",)), "batch")
  first = f(x, y, backend="blockwise", label_smoothing=0.1)
  traced = len(calls)
  second = f(x, y, backend="blockwise", label_smoothing=0.1)
  assert len(calls) == traced and first == second
  f(x, y, backend="blockwise", label_smoothing=0.2)
  assert len(calls) > traced
  f(x, y, backend="blockwise", matryoshka_dims=[4, D])      # unhashable: still runs


@pytest.mark.parametrize("family,axes", [("clip", 1), ("lit", 1), ("qwen3", 1),
                                         ("lit_qwen3", 1), ("qwen3", 2)])
def test_shared_negatives_with_where_on_the_ring(family, axes):
  # Shared negative columns travel the ring beside a where= mask, the caller's (8 rows
  # on 4 devices, row 1 removed) or the one sharded adds to an uneven batch (7 rows):
  # the loss and gradients of the kept rows on one device. axes = 2: the batch over
  # both axes of a 2 x 2 mesh.
  fn = getattr(mj, f"{family}_loss")
  x, y, _ = _data()
  cols = jax.random.normal(jax.random.key(3), (4, D), jnp.float32)
  kw = dict(backend="blockwise", temperature=0.1)
  f = (mj.sharded(fn, Mesh(np.array(jax.devices()[:4]), ("batch",)), "batch") if axes == 1
       else mj.sharded(fn, MESHES["auto"](), ("data", "fsdp")))
  keep = np.arange(B) != 1
  for rows, where in [(B, keep), (B - 1, None)]:
    a, b = x[:rows], y[:rows]
    extra = {} if where is None else dict(where=where)
    got = jax.value_and_grad(lambda a, b, c: f(a, b, shared_negatives=c, **extra, **kw),
                             (0, 1, 2))(a, b, cols)
    want = jax.value_and_grad(lambda a, b, c: fn(a, b, shared_negatives=c, **extra, **kw),
                              (0, 1, 2))(a, b, cols)
    _assert_same(got, want)


def test_positional_columns_and_array_dims():
  # shared_negatives passed positionally (qwen3_loss's fourth parameter) are columns, as
  # by keyword; Matryoshka dims and weights held as NumPy arrays are static, as the
  # losses take them.
  x, y, _ = _data()
  cols = jax.random.normal(jax.random.key(4), (4, D), jnp.float32)
  mesh = Mesh(np.array(jax.devices()[:4]), ("batch",))
  f = mj.sharded(mj.qwen3_loss, mesh, "batch")
  want = mj.qwen3_loss(x, y, None, cols, backend="blockwise")
  np.testing.assert_allclose(f(x, y, None, cols, backend="blockwise"), want, rtol=2e-6)
  kw = dict(backend="blockwise", matryoshka_dims=np.array([4, D]),
            matryoshka_weights=np.array([0.5, 1.0]))
  np.testing.assert_allclose(mj.sharded(mj.clip_loss, mesh, "batch")(x, y, **kw),
                             mj.clip_loss(x, y, **kw), rtol=2e-6)
  # Through the eager Matryoshka wrapper (which shows the loss's parameters) on a batch
  # that does not split evenly: the positional columns are still columns, not padded as
  # rows (padded, two zero rows joined every softmax).
  eager = mj.matryoshka(mj.qwen3_loss, (4, D))
  np.testing.assert_allclose(
      mj.sharded(eager, mesh, "batch")(x[:6], y[:6], None, cols, backend="blockwise"),
      eager(x[:6], y[:6], None, cols, backend="blockwise"), rtol=2e-6)
