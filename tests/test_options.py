"""The options table (memeff_jax/_options.py) is the one source of every option's
default, check, traced range and docs: the public signatures, docstrings and wrappers
must agree with it."""

import dataclasses
import inspect
import os

import pytest

import memeff_jax as mj
from memeff_jax import _checkify, _options, classes, siglip

LOSSES = [mj.clip_loss, mj.clip_loss_with_stats, mj.lit_loss, mj.lit_loss_with_stats,
          mj.qwen3_loss, mj.qwen3_loss_with_stats, mj.lit_qwen3_loss,
          mj.lit_qwen3_loss_with_stats, mj.siglip_loss, mj.siglip_loss_with_stats]


def _shared(fn):
  """The shared keywords ``fn`` takes (SigLIP has no softmax options), in order."""
  return siglip.SIGLIP.shared if "siglip" in fn.__name__ else _options.SHARED


def _keywords(fn):
  return {name: p for name, p in inspect.signature(fn).parameters.items()
          if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize("fn", LOSSES, ids=lambda f: f.__name__)
def test_signature_defaults_match_the_table(fn):
  keywords = _keywords(fn)
  assert set(_shared(fn)) <= set(keywords)
  family = fn.__name__.replace("_with_stats", "")
  for name, p in keywords.items():
    assert name in _options.OPTIONS, f"{fn.__name__}: {name} has no row in the table"
    default = _options.defaults([name], family)[name]
    assert p.default == default, name
    assert type(p.default) is type(default), name


@pytest.mark.parametrize("fn", LOSSES, ids=lambda f: f.__name__)
def test_shared_keywords_in_signature_order(fn):
  keywords = [k for k in _keywords(fn) if k in _options.SHARED]
  assert tuple(keywords) == _shared(fn)


@pytest.mark.parametrize("fn", [mj.clip_loss, mj.lit_loss, mj.qwen3_loss, mj.lit_qwen3_loss,
                                mj.siglip_loss], ids=lambda f: f.__name__)
def test_docs_come_from_the_table(fn):
  doc = fn.__doc__
  for name in _keywords(fn):
    first = _options.OPTIONS[name].doc.split("\n")[0].strip()
    assert f"  {name}: {first}" in doc
  # the temperature's default as the signature has it (SigLIP's is 0.1: the docstring
  # said 0.07)
  t = _keywords(fn)["temperature"].default
  assert f"Default {t!r}." in doc and "{default}" not in doc
  raises = " ".join(doc[doc.index("Raises:"):].split())   # unwrapped
  assert ("``margin < 0``" in raises) == ("margin" in _keywords(fn))
  for name in _options.traced(list(_keywords(fn))):
    assert f"``{name}`` {_options.OPTIONS[name].traced.what}" in raises


def test_traced_ranges_are_the_table_rows():
  assert _options.traced(_options.SHARED + ("margin",)) == (
      "temperature", "tau_plus", "label_smoothing", "lse_square_scale", "margin")
  assert _checkify.OPTIONS is _options.OPTIONS


def test_every_row_is_used_by_some_loss():
  used = set().union(*(_keywords(fn) for fn in LOSSES))
  assert used == set(_options.OPTIONS)


def _fields(cls):
  return {f.name: f.default for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("name", sorted(n for n in classes.__all__ if n != "MatryoshkaLoss"))
def test_class_defaults_match_the_table(name):
  for field, default in _fields(getattr(classes, name)).items():
    if field in _options.OPTIONS and default is not dataclasses.MISSING:
      assert default == _options.OPTIONS[field].default, (name, field)


def test_class_constructor_parameters():
  # The fields, in order (memeff's constructors; a positional-free dataclass each).
  plain = ["temperature", "normalized_inputs", "stable", "tau_plus", "label_smoothing",
           "backend"]
  qwen3 = plain + ["margin", "use_qq_negatives", "use_dd_negatives"]
  want = {
      "MemoryEfficientCLIPLoss": plain,
      "MemoryEfficientLiTLoss": plain,
      "MemoryEfficientQwen3Loss": qwen3,
      "MemoryEfficientLiTQwen3Loss": qwen3[:-1],
      "StableMemoryEfficientCLIPLoss": ["temperature", "normalized_inputs", "backend"],
      "StableMemoryEfficientLiTLoss": ["temperature", "normalized_inputs", "backend"],
  }
  for base, fields in list(want.items())[:4]:
    mrl = base.replace("MemoryEfficient", "MemoryEfficientMatryoshka")
    want[mrl] = fields + ["dims", "weights"]
    want["Distributed" + base] = fields + ["axis_name"]
    want["Distributed" + mrl] = fields + ["dims", "weights", "axis_name"]
  for name, fields in want.items():
    assert list(_fields(getattr(classes, name))) == fields, name
  assert len(want) == 18


# The Flax modules: their loss options are the table's rows, with its defaults (the
# family's: SigLIP's temperature is 0.1); SigLIP has no softmax options.
_MODULE_FIELDS = ["temperature", "learnable", "max_logit_scale", "param_dtype",
                  "normalized_inputs", "stable", "tau_plus", "label_smoothing",
                  "lse_square_scale", "matryoshka_dims", "matryoshka_weights",
                  "matryoshka_per_dim", "axis_name", "backend", "deterministic", "config"]
_SOFTMAX_ONLY = ["tau_plus", "label_smoothing", "lse_square_scale"]
_PORTING = ["use_dq_negatives", "partition", "share_hard_negatives"]
_OWN = {"CLIPLoss": [], "LiTLoss": [], "Qwen3Loss": ["margin", "use_qq_negatives",
                                                     "use_dd_negatives"] + _PORTING,
        "LiTQwen3Loss": ["margin", "use_qq_negatives"] + _PORTING, "SigLIPLoss": ["bias"]}
_FUNCTIONS = {"CLIPLoss": "clip_loss", "LiTLoss": "lit_loss", "Qwen3Loss": "qwen3_loss",
              "LiTQwen3Loss": "lit_qwen3_loss", "SigLIPLoss": "siglip_loss"}


def _module_fields(name):
  """The module's fields (the NNX constructor's keywords), in order."""
  drop = _SOFTMAX_ONLY if name == "SigLIPLoss" else []
  return [f for f in _MODULE_FIELDS if f not in drop] + _OWN[name]


def _default(name, field):
  return _options.defaults([field], _FUNCTIONS[name])[field]


def test_siglip_module_fields():
  # Written out once, so that _module_fields' rule is checked too.
  assert _module_fields("SigLIPLoss") == [
      "temperature", "learnable", "max_logit_scale", "param_dtype", "normalized_inputs",
      "stable", "matryoshka_dims", "matryoshka_weights", "matryoshka_per_dim", "axis_name",
      "backend", "deterministic", "config", "bias"]
  assert _default("SigLIPLoss", "temperature") == 0.1
  assert _default("SigLIPLoss", "bias") == -10.0


@pytest.mark.parametrize("name", sorted(_OWN))
def test_linen_fields_and_defaults(name):
  pytest.importorskip("flax")
  from memeff_jax import linen  # pylint: disable=g-import-not-at-top
  fields = {f.name: f.default for f in dataclasses.fields(getattr(linen, name))}
  assert list(fields) == _module_fields(name) + ["parent", "name"]
  for field, default in fields.items():
    if field in _options.OPTIONS:
      assert default == _default(name, field), field
  module = getattr(linen, name)()
  for bad in ["bogus"] + [f for f in _MODULE_FIELDS if f not in _module_fields(name)]:
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{bad}'"):
      getattr(linen, name)(**{bad: 0.1})
  assert module.temperature == _default(name, "temperature")


@pytest.mark.parametrize("name", sorted(_OWN))
def test_nnx_constructor_and_defaults(name):
  pytest.importorskip("flax")
  from memeff_jax import nnx  # pylint: disable=g-import-not-at-top
  cls = getattr(nnx, name)
  params = inspect.signature(cls.__init__).parameters
  assert list(params)[1:] == _module_fields(name)
  for field in _module_fields(name):
    if field in _options.OPTIONS:
      assert params[field].default == _default(name, field), field
  module = cls()
  # The attributes: the options as given; the initial values live in the parameters.
  learned = cls._spec.params
  for field in _module_fields(name)[4:]:
    if field not in learned:
      assert getattr(module, field) == _default(name, field), field
  for field in learned:
    assert getattr(module, f"logit_{field}")[...] == _default(name, field), field
    assert not hasattr(module, field), field
  assert abs(float(module.current_temperature()) - _default(name, "temperature")) < 1e-7
  for bad in ["bogus"] + [f for f in _MODULE_FIELDS if f not in _module_fields(name)]:
    with pytest.raises(TypeError, match=f"{name}.__init__\\(\\) got an unexpected keyword "
                                        f"argument '{bad}'"):
      cls(**{bad: 0.1})


@pytest.mark.parametrize("name", sorted(_OWN))
def test_call_signatures_name_the_arrays(name):
  pytest.importorskip("flax")
  from memeff_jax import linen, nnx  # pylint: disable=g-import-not-at-top
  # The function's arrays; memeff's classes take them but the shared negative columns,
  # and the hard negatives by memeff's forward name.
  arrays = [p.name for p in inspect.signature(getattr(mj, _FUNCTIONS[name])).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD]
  keywords = ["where"] if name == "SigLIPLoss" else ["tau_plus", "where"]
  classes_cls = getattr(classes, "MemoryEfficient" + name, None)   # none for SigLIP
  for cls in filter(None, (getattr(nnx, name), getattr(linen, name), classes_cls)):
    memeff = {"hard_negatives": "hard_negative_features"} if cls is classes_cls else {}
    want = [memeff.get(a, a) for a in arrays
            if cls is not classes_cls or a != "shared_negatives"]
    for method in ("__call__", "with_stats"):
      if hasattr(cls, method):
        params = list(inspect.signature(getattr(cls, method)).parameters)
        assert params == ["self"] + want + keywords, (cls, method)


def test_siglip_call_takes_no_tau_plus():
  pytest.importorskip("flax")
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from memeff_jax import nnx  # pylint: disable=g-import-not-at-top
  x = jnp.ones((4, 8), jnp.float32) + jnp.eye(4, 8)
  module = nnx.SigLIPLoss(backend="blockwise")
  for method in (module, module.with_stats):
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau_plus'"):
      method(x, x, tau_plus=0.1)


@pytest.mark.parametrize("backend", ["blockwise", "reference"])
@pytest.mark.parametrize("t", [1e-39, 1e38])
def test_traced_temperature_outside_the_normal_range_is_nan(t, backend):
  # A traced t held to the Python range (t and 1 / t normal fp32 numbers): 1e-39 is
  # subnormal, 1 / 1e38 too. Both once gave Qwen3 a finite loss (0.0; 1.75) beside NaN
  # (or finite) gradients; now the loss and every gradient are NaN, as out of range.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(9), 3)
  x = jax.random.normal(keys[0], (4, 8), jnp.float32)
  noise = jax.random.normal(keys[1], (4, 8), jnp.float32)
  h = jax.random.normal(keys[2], (4, 2, 8), jnp.float32)
  f = lambda x, y, h, t: mj.qwen3_loss(x, y, h, temperature=t, backend=backend)
  for y in (x + 0.1 * noise, noise):   # positives far above every negative, or not
    with pytest.raises(ValueError, match="temperature"):   # the Python value: refused
      mj.qwen3_loss(x, y, h, temperature=t, backend=backend)
    loss, grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(x, y, h,
                                                                        jnp.float32(t))
    assert jnp.isnan(loss) and all(bool(jnp.all(jnp.isnan(g))) for g in grads), float(loss)


@pytest.mark.parametrize("backend", ["blockwise", "reference"])
def test_float64_options_leave_the_loss_in_the_features_dtype(backend):
  # Under x64, float64 options (temperature, a per-row tau_plus, label smoothing, the
  # z-loss's weight, SigLIP's bias), as jax arrays or numpy values, leave the loss and
  # its statistics float32 for float32 and 16-bit features (float64 for float64 ones),
  # and the value that of float32 options to 1e-6; each of them made them float64.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  x, y = jax.random.normal(jax.random.key(4), (2, 6, 8), jnp.float32)
  with jax.enable_x64(True):
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float64):
      want = jnp.float64 if dtype == jnp.float64 else jnp.float32
      softmax = dict(tau_plus=np.full(6, 0.05), label_smoothing=0.1, lse_square_scale=1e-3)
      for fn, opts in ((mj.clip_loss_with_stats, softmax),
                       (mj.qwen3_loss_with_stats, softmax),
                       (mj.siglip_loss_with_stats, dict(bias=-1.0))):
        got = {}
        for kind in ("jax", "numpy", "float32"):
          as_opt = {"jax": lambda v: jnp.asarray(v, jnp.float64),
                    "numpy": lambda v: np.asarray(v, np.float64)[()],   # np.float64 0-d
                    "float32": lambda v: jnp.asarray(v, jnp.float32)}[kind]
          o = {k: as_opt(v) for k, v in opts.items()}
          got[kind] = fn(x.astype(dtype), y.astype(dtype), backend=backend,
                         temperature=as_opt(0.07), **o)
        for kind in ("jax", "numpy"):
          loss, stats = got[kind]
          assert loss.dtype == want, (fn.__name__, kind, dtype, loss.dtype)
          for name, v in stats._asdict().items():
            if v is not None and "accuracy" not in name:
              assert v.dtype == want, (fn.__name__, kind, dtype, name, v.dtype)
          np.testing.assert_allclose(loss, got["float32"][0], rtol=1e-6)


@pytest.mark.parametrize("name,bad", [("temperature", -0.1), ("tau_plus", 1.5),
                                      ("label_smoothing", -0.5), ("lse_square_scale", -1.0),
                                      ("margin", -0.2)])
def test_traced_range_from_the_table(name, bad):
  # A Python value out of range raises naming the option; traced, the loss is NaN and
  # checkify's message says what the table's row says must hold.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental import checkify  # pylint: disable=g-import-not-at-top
  x = jnp.ones((4, 8), jnp.float32) + jnp.eye(4, 8)
  with pytest.raises(ValueError, match=name):
    mj.qwen3_loss(x, x, **{name: bad}, backend="blockwise")
  f = jax.jit(lambda v: mj.qwen3_loss(x, x, **{name: v}, backend="blockwise"))
  with mj.checkify_checks():
    err, loss = checkify.checkify(f)(jnp.float32(bad))
  assert jnp.isnan(loss)
  assert f"{name} must be {_options.OPTIONS[name].traced.what}" in err.get()


def test_checkify_environment_switch():
  # MEMEFF_JAX_CHECKIFY: the usual spellings of off are off ("false" turned the checks
  # on); anything else is on. A fresh process reads the variable as it imports.
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  off = [None, "", "0", "false", "FALSE", "no", "off", " Off "]
  on = ["1", "true", "yes", "on", "2"]
  assert [_checkify.env_switch(v) for v in off + on] == [False] * len(off) + [True] * len(on)
  env = {k: v for k, v in os.environ.items() if k != "MEMEFF_JAX_CHECKIFY"}
  got = [subprocess.run([sys.executable, "-c", "from memeff_jax import _checkify; "
                         "print(_checkify._enabled())"], env=dict(env, MEMEFF_JAX_CHECKIFY=v),
                        capture_output=True, text=True, check=True).stdout.strip()
         for v in ("false", "1")]
  assert got == ["False", "True"], got


def test_checkify_checks_is_per_thread():
  # An evaluation thread's block and a training thread's overlap (A enters, B enters,
  # A exits, B traces): B's trace still names the bad temperature, and once both have
  # left, a loss traced anywhere carries no check (as jax.config's context managers).
  import threading  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental import checkify  # pylint: disable=g-import-not-at-top
  x = jnp.ones((4, 8))
  checked = lambda: checkify.checkify(jax.jit(lambda t: mj.clip_loss(
      x, x, temperature=t, backend="blockwise")))(jnp.float32(-0.1))
  b_in, a_out, got = threading.Event(), threading.Event(), {}

  def a():
    with mj.checkify_checks():
      b_in.wait(60)
    a_out.set()

  def b():
    with mj.checkify_checks():
      b_in.set()
      a_out.wait(60)
      got["b"] = checked()[0].get()

  threads = [threading.Thread(target=a), threading.Thread(target=b)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert got["b"] is not None and "temperature must be" in got["b"], got
  err, loss = checked()
  assert err.get() is None and jnp.isnan(loss)
  outside = {}
  worker = threading.Thread(target=lambda: outside.update(err=checked()[0].get()))
  worker.start()
  worker.join(120)
  assert outside == {"err": None}, outside
