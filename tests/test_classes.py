"""memeff_jax.classes: every memeff class name equals the function it maps to.

The oracle is the public function itself (the functions are tested against the
dense reference elsewhere): a class must pass each option to it unchanged, so the
comparison is exact up to reduction order. Small shapes, blockwise backend only.
"""

import dataclasses
import functools
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import memeff_jax as mj
from memeff_jax import classes as C
from tests.support.data import towers

B, D, K = 8, 16, 2
DIMS, WEIGHTS = (8, 16), (1.0, 0.5)
BW = dict(backend="blockwise")


# queries, documents, hard negatives [B, K, D] and a per-row tau_plus.
_data = functools.partial(towers, B, D, noise=1.5, k=K, tau_max=0.3)


# name -> (function, number of arrays, constructor options = the function's options).
# The options are not defaults, so a dropped or renamed one shows (in the value, or for
# ``stable=``, which scales the gradients alone, in the gradients).
PLAIN = {
    "MemoryEfficientCLIPLoss": (
        mj.clip_loss, 2, dict(temperature=0.05, tau_plus=0.1, label_smoothing=0.1)),
    "MemoryEfficientLiTLoss": (
        mj.lit_loss, 2, dict(temperature=0.1, stable=False, label_smoothing=0.05)),
    "MemoryEfficientQwen3Loss": (
        mj.qwen3_loss, 3, dict(temperature=0.05, margin=0.2, use_qq_negatives=True,
                               use_dd_negatives=True, tau_plus=0.05)),
    "MemoryEfficientLiTQwen3Loss": (
        mj.lit_qwen3_loss, 3, dict(temperature=0.08, margin=0.05, use_qq_negatives=True,
                                   label_smoothing=0.1, stable=False)),
}
MRL = {name.replace("MemoryEfficient", "MemoryEfficientMatryoshka"): value
       for name, value in PLAIN.items()}


def _class_kwargs(name, opts):
  """The function's options in memeff's constructor names."""
  kw = dict(opts, **BW)
  if "Matryoshka" in name:
    kw.update(dims=DIMS, weights=WEIGHTS)
  return kw


def _fn_kwargs(name, opts):
  kw = dict(opts, **BW)
  if "Matryoshka" in name:
    kw.update(matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS)
  return kw


def test_nineteen_names():
  names = {n for n in dir(C) if "Loss" in n and not n.startswith("_")}
  assert names == set(C.__all__) and len(names) == 19
  from memeff_jax.classes import (  # noqa: F401  pylint: disable=g-multiple-import
      DistributedMemoryEfficientCLIPLoss, DistributedMemoryEfficientLiTLoss,
      DistributedMemoryEfficientLiTQwen3Loss, DistributedMemoryEfficientMatryoshkaCLIPLoss,
      DistributedMemoryEfficientMatryoshkaLiTLoss,
      DistributedMemoryEfficientMatryoshkaLiTQwen3Loss,
      DistributedMemoryEfficientMatryoshkaQwen3Loss, DistributedMemoryEfficientQwen3Loss,
      MatryoshkaLoss, MemoryEfficientCLIPLoss, MemoryEfficientLiTLoss,
      MemoryEfficientLiTQwen3Loss, MemoryEfficientMatryoshkaCLIPLoss,
      MemoryEfficientMatryoshkaLiTLoss, MemoryEfficientMatryoshkaLiTQwen3Loss,
      MemoryEfficientMatryoshkaQwen3Loss, MemoryEfficientQwen3Loss,
      StableMemoryEfficientCLIPLoss, StableMemoryEfficientLiTLoss)


@pytest.mark.parametrize("name", sorted(C.__all__))
def test_docstring_names_the_function(name):
  cls = getattr(C, name)
  fn = "matryoshka" if name == "MatryoshkaLoss" else (
      "lit_qwen3_loss" if "LiTQwen3" in name else "qwen3_loss" if "Qwen3" in name
      else "lit_loss" if "LiT" in name else "clip_loss")
  assert f":func:`memeff_jax.{fn}`" in cls.__doc__


@pytest.mark.parametrize("name", sorted(PLAIN) + sorted(MRL))
def test_argument_errors_name_the_class(name):
  # Python's own call errors name each class, not the plain class whose call the
  # Matryoshka and Distributed twins used to inherit.
  x = _data()[0]
  for cls_name in (name, f"Distributed{name}"):
    kw = _class_kwargs(name, {}) | ({"axis_name": "batch"} if "Distributed" in cls_name else {})
    loss = getattr(C, cls_name)(**kw)
    with pytest.raises(TypeError, match=rf"^{cls_name}\.__call__\(\) got an unexpected "
                                        r"keyword argument 'shared_negatives'"):
      loss(x, x, shared_negatives=x)


@pytest.mark.parametrize("name", sorted(PLAIN) + sorted(MRL))
def test_equals_function(name):
  fn, n, opts = {**PLAIN, **MRL}[name]
  arrays = _data()[:n]
  tau = _data()[3]
  loss = getattr(C, name)(**_class_kwargs(name, opts))
  fkw = _fn_kwargs(name, opts)

  vg = lambda f: jax.value_and_grad(f, argnums=tuple(range(n)))

  @jax.jit
  def both(*a):
    # Constructor options; then a per-call per-row tau_plus overriding the constructor's.
    return (vg(loss)(*a), vg(lambda *b: fn(*b, **fkw))(*a),
            loss(*a, tau_plus=tau), fn(*a, **dict(fkw, tau_plus=tau)))

  (got, got_g), (want, want_g), got_tau, want_tau = both(*arrays)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for g, w in zip(got_g, want_g):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got_tau, want_tau, rtol=1e-6)
  assert got_tau != got   # the override took effect


@pytest.mark.parametrize("name", ["MemoryEfficientQwen3Loss",
                                  "MemoryEfficientMatryoshkaLiTQwen3Loss"])
def test_hard_negatives_by_memeff_keyword(name):
  # memeff's forward names them hard_negative_features; a ported call passes it so.
  fn, _, opts = {**PLAIN, **MRL}[name]
  q, d, h = _data()[:3]
  loss = getattr(C, name)(**_class_kwargs(name, opts))
  np.testing.assert_allclose(loss(q, d, hard_negative_features=h),
                             fn(q, d, h, **_fn_kwargs(name, opts)), rtol=1e-6)
  with pytest.raises(TypeError, match="hard_negatives"):
    loss(q, d, hard_negatives=h)


# Gradients through the ring for one plain and one Matryoshka class (the functions'
# ring gradients are tested in test_ring.py); values for every class.
WITH_GRAD = ("MemoryEfficientCLIPLoss", "MemoryEfficientMatryoshkaLiTLoss")


@pytest.mark.parametrize("name", sorted(PLAIN) + sorted(MRL))
def test_distributed_equals_single_device(name):
  # Inside jax.shard_map on 2 forced host devices: every device returns the global
  # loss (memeff: a per-rank share), and the gradient is the single-device one.
  fn, n, opts = {**PLAIN, **MRL}[name]
  arrays = _data()[:n]
  kw = _class_kwargs(name, opts)
  single = getattr(C, name)(**kw)
  dist = getattr(C, "Distributed" + name)(axis_name="batch", **kw)
  assert dist.axis_name == "batch"
  mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
  ring = jax.shard_map(dist, mesh=mesh, in_specs=(P("batch"),) * n, out_specs=P(),
                       check_vma=True)
  if name not in WITH_GRAD:
    np.testing.assert_allclose(jax.jit(ring)(*arrays), jax.jit(single)(*arrays), rtol=2e-6)
    return
  argnums = tuple(range(n))
  got = jax.jit(jax.value_and_grad(ring, argnums=argnums))(*arrays)
  want = jax.jit(jax.value_and_grad(single, argnums=argnums))(*arrays)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-6)
  for g, w in zip(got[1], want[1]):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_distributed_per_row_tau_stays_with_its_rows():
  q, d, _, tau = _data()
  dist = C.DistributedMemoryEfficientCLIPLoss(axis_name="batch", **BW)
  mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
  ring = jax.shard_map(lambda a, b, t: dist(a, b, tau_plus=t), mesh=mesh,
                       in_specs=(P("batch"),) * 3, out_specs=P(), check_vma=True)
  np.testing.assert_allclose(jax.jit(ring)(q, d, tau),
                             mj.clip_loss(q, d, tau_plus=tau, **BW), rtol=2e-6)


@pytest.mark.parametrize("name,fn", [("StableMemoryEfficientCLIPLoss", mj.clip_loss),
                                     ("StableMemoryEfficientLiTLoss", mj.lit_loss)])
def test_stable_aliases_warn(name, fn):
  q, d, _, _ = _data()
  with pytest.warns(DeprecationWarning, match=name):
    loss = getattr(C, name)(temperature=0.1, **BW)
  # Only memeff's two options: the rest are not fields.
  assert {f.name for f in dataclasses.fields(loss)} == {"temperature", "normalized_inputs",
                                                        "backend"}
  grad = jax.jit(jax.value_and_grad(loss))
  want = jax.jit(jax.value_and_grad(
      lambda a, b: fn(a, b, temperature=0.1, stable=True, **BW)))
  for g, w in zip(jax.tree.leaves(grad(q, d)), jax.tree.leaves(want(q, d))):
    np.testing.assert_allclose(g, w, rtol=1e-6)
  with warnings.catch_warnings():
    warnings.simplefilter("error")       # the plain classes do not warn
    getattr(C, name.removeprefix("Stable"))()


def test_matryoshka_loss_equals_the_wrapper():
  q, d, h, tau = _data()
  opts = dict(temperature=0.05, use_qq_negatives=True, **BW)
  eager = C.MatryoshkaLoss(C.MemoryEfficientQwen3Loss(**opts), dims=DIMS, weights=WEIGHTS)
  want = mj.matryoshka(functools.partial(mj.qwen3_loss, **opts), DIMS, WEIGHTS)

  @jax.jit
  def both(q, d, h, tau):
    return (eager(q, d, h, tau_plus=tau), want(q, d, h, tau_plus=tau),
            eager(q, d, hard_negative_features=h, tau_plus=tau))   # memeff's keyword

  got, ref, by_keyword = both(q, d, h, tau)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  np.testing.assert_allclose(by_keyword, ref, rtol=1e-6)
  # Any loss callable works as the base, functions included.
  base = functools.partial(mj.clip_loss, **BW)
  np.testing.assert_allclose(jax.jit(C.MatryoshkaLoss(base, [8, 16]))(q, d),
                             jax.jit(mj.matryoshka(base, (8, 16)))(q, d), rtol=1e-6)


def test_frozen_hashable_keyword_only():
  loss = C.MemoryEfficientMatryoshkaQwen3Loss(dims=[8, 16], weights=[1, 2], margin=0.2)
  assert loss.dims == (8, 16) and loss.weights == (1, 2)   # lists become tuples
  with pytest.raises(dataclasses.FrozenInstanceError):
    loss.margin = 0.3
  assert hash(loss) == hash(C.MemoryEfficientMatryoshkaQwen3Loss(dims=(8, 16),
                                                                  weights=(1, 2), margin=0.2))
  with pytest.raises(TypeError):
    C.MemoryEfficientCLIPLoss(0.05)   # pylint: disable=too-many-function-args
  with pytest.raises(TypeError):
    C.DistributedMemoryEfficientCLIPLoss()   # axis_name is required
  with pytest.raises(TypeError):
    C.MemoryEfficientLiTQwen3Loss(use_dd_negatives=True)   # not a LiT-Qwen3 option
