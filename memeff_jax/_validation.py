"""Trace-time checks shared by every public loss.

Shapes, dtypes, flags, config, Python-number ranges, the ring axis. Shapes and config
raise ValueError, dtypes and types TypeError, naming the argument. The options table
(``_options``) says which check each option gets; values inside traced arrays are
``_checkify``'s.
"""

from __future__ import annotations

import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from memeff_jax._compat import varying_axes
from memeff_jax.backends import registry
from memeff_jax.backends.registry import BackendName
from memeff_jax.config import KernelConfig
from memeff_jax.config.kernel import is_int

# Input dtypes every backend computes in (float64 needs jax_enable_x64 and the
# blockwise or reference backend).
FLOATS = tuple(jnp.dtype(t) for t in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))


def _is_python_number(v) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, (np.ndarray, jax.Array))


def as_array(v):
  """numpy arrays become jax arrays here, all alike: with x64 off a float64 one is
  float32 then, whether or not jax.grad already converted its neighbour."""
  return jnp.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else v


def _check_float(name: str, v) -> None:
  if not jnp.issubdtype(v.dtype, jnp.floating):
    raise TypeError(f"{name} must be a floating array, got {name}.dtype={v.dtype}")
  if jnp.dtype(v.dtype) not in FLOATS:
    raise TypeError(f"{name} must be float16, bfloat16, float32 or float64 (with "
                    f"jax_enable_x64), got {name}.dtype={v.dtype}")


def check_towers(names: tuple[str, str], x, y) -> tuple[int, int]:
  """Both towers: rank 2, one (batch, feature) shape, one supported float dtype."""
  for name, v in zip(names, (x, y)):
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
      raise TypeError(f"{name} must be an array, got {type(v).__name__}")
    if v.ndim != 2:
      raise ValueError(f"{name} must be rank 2 [batch, features], got {name}.shape={v.shape}")
    _check_float(name, v)
  (nx, ny), (x_shape, y_shape) = names, (x.shape, y.shape)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"{nx} and {ny} must have the same batch size, got "
                     f"{nx}.shape={x_shape} and {ny}.shape={y_shape}")
  if x.shape[1] != y.shape[1]:
    raise ValueError(f"{nx} and {ny} must have the same feature dim, got "
                     f"{nx}.shape={x_shape} and {ny}.shape={y_shape}")
  if x.dtype != y.dtype:
    raise TypeError(f"{nx} and {ny} must have the same dtype, got {nx}.dtype={x.dtype} and "
                    f"{ny}.dtype={y.dtype}")
  if x.shape[0] < 1 or x.shape[1] < 1:
    raise ValueError(f"{nx} needs at least one row and one feature, got {nx}.shape={x_shape}")
  return x.shape[0], x.shape[1]


def check_devices(named) -> None:
  """The concrete arrays among ``named`` ((name, value) pairs) that are committed to
  devices (``jax.device_put`` with a device or sharding) share one device set: as a
  jitted call needs, but naming the arguments (JAX's error names the library's
  internals). Tracers and uncommitted arrays follow the others."""
  first = None
  for name, v in named:
    if (not isinstance(v, jax.Array) or isinstance(v, jax.core.Tracer)
        or not getattr(v, "committed", False)):
      continue
    devices = v.sharding.device_set
    if first is None:
      first = name, devices
    elif devices != first[1]:
      ids = lambda ds: sorted(d.id for d in ds)
      raise ValueError(f"{first[0]} and {name} are on different devices ({first[0]} on "
                       f"device ids {ids(first[1])}, {name} on {ids(devices)}); put them "
                       f"on the same device(s) (jax.device_put) or the same mesh")


def check_hard_negatives(h, n: int, d: int, dtype) -> None:
  if not hasattr(h, "shape") or not hasattr(h, "dtype"):
    raise TypeError(f"hard_negatives must be an array, got {type(h).__name__}")
  _check_float("hard_negatives", h)
  if h.ndim != 3 or h.shape[0] != n or h.shape[2] != d:
    raise ValueError(f"hard_negatives must be [batch={n}, k, features={d}], got "
                     f"hard_negatives.shape={h.shape}")
  if h.dtype != dtype:
    raise TypeError(f"hard_negatives must have the towers' dtype {dtype}, got "
                    f"hard_negatives.dtype={h.dtype}")


def check_shared_negatives(h, d: int, dtype) -> None:
  """Shared negative columns: [N, features] (N >= 0), the towers' dtype."""
  if not hasattr(h, "shape") or not hasattr(h, "dtype"):
    raise TypeError(f"shared_negatives must be an array, got {type(h).__name__}")
  _check_float("shared_negatives", h)
  if h.ndim != 2 or h.shape[1] != d:
    raise ValueError(f"shared_negatives must be [n_negatives, features={d}], got "
                     f"shared_negatives.shape={h.shape}")
  if h.dtype != dtype:
    raise TypeError(f"shared_negatives must have the towers' dtype {dtype}, got "
                    f"shared_negatives.dtype={h.dtype}")


def check_partition(partition, use_qq: bool, use_dd: bool) -> str:
  """``partition``: "joint" or "per_direction"; the q-q and d-d groups have no softmax
  of their own, so "per_direction" takes neither."""
  if partition not in ("joint", "per_direction"):
    raise ValueError(f"partition must be 'joint' or 'per_direction', got "
                     f"partition={partition!r}")
  groups = [g for g, on in (("use_qq_negatives", use_qq), ("use_dd_negatives", use_dd)) if on]
  if partition == "per_direction" and groups:
    raise ValueError(f"partition='per_direction' has a q->d and a d->q softmax only; "
                     f"{' and '.join(groups)}=True need partition='joint'")
  return partition


def _known(v):
  """The value known at trace time: a Python float's, or a numpy number's or array's
  (checked as a Python number is); else None: a jax array's value is the
  computation's (NaN where out of range, as a traced one)."""
  if isinstance(v, float):
    return v
  return np.asarray(v, np.float64) if isinstance(v, (np.ndarray, np.generic)) else None


def _scalar(name: str, v):
  """A Python number stays one; anything else must be a 0-d floating array."""
  if isinstance(v, bool):
    raise TypeError(f"{name} must be a float or a 0-d float array, got {v!r}")
  if _is_python_number(v):
    return float(v)
  if not hasattr(v, "shape") or not hasattr(v, "dtype"):
    raise TypeError(f"{name} must be a float or a 0-d float array, got {type(v).__name__}")
  if v.shape != ():
    raise ValueError(f"{name} must be a scalar (0-d), got {name}.shape={v.shape}")
  if not jnp.issubdtype(v.dtype, jnp.floating):
    raise TypeError(f"{name} must be floating, got {name}.dtype={v.dtype}")
  return v


def check_temperature(t, dtype=jnp.float32):
  """A Python temperature must be > 0 and, with 1 / t, a normal number of ``dtype``
  (the glue's: fp32, fp64 for fp64 features); above 1 it warns (a logit scale?)."""
  t = _scalar("temperature", t)
  value = _known(t)
  if value is None:
    return t
  value = check_temperature_range(float(value), dtype)
  # the public loss: here <- the table's row <- _options.check <- the chain (2)
  warn_logit_scale(value, stacklevel=6)
  return t


def warn_logit_scale(t: float, stacklevel: int) -> None:
  """Warn of a temperature above 1 (a logit scale passed as one?) at the frame
  ``stacklevel`` up from the caller's."""
  if t > 1.0:
    warnings.warn(f"temperature={t} > 1 looks like a logit scale (OpenCLIP's "
                  f"logit_scale.exp(), sentence-transformers' scale=20): the logits are "
                  f"similarity / temperature, so pass temperature = 1 / scale "
                  f"(here {1.0 / t:.4g})", UserWarning, stacklevel=stacklevel + 1)


def check_temperature_range(t: float, dtype=jnp.float32) -> float:
  """A Python temperature > 0 that is, with 1 / t, a normal number of ``dtype`` (a
  loss's, or a loss module's initial value)."""
  if not t > 0:
    raise ValueError(f"temperature must be > 0, got temperature={t}")
  if not np.isfinite(t):
    raise ValueError(f"temperature must be finite, got temperature={t}")
  tiny = float(jnp.finfo(dtype).tiny)
  if not tiny <= t <= 1.0 / tiny:
    raise ValueError(f"temperature and 1 / temperature must be normal {jnp.dtype(dtype)} "
                     f"numbers, temperature in [{tiny:.4g}, {1.0 / tiny:.4g}], got "
                     f"temperature={t}")
  return t


def check_range(name: str, v, lo: float, hi: float | None, dtype=None):
  """Python and numpy numbers must lie in [lo, hi) (hi=None: no upper bound) and, given
  the compute ``dtype``, be finite in it (no float32 overflow of a Python float); jax
  arrays pass."""
  v = _scalar(name, v)
  value = _known(v)
  if value is not None and not np.all((value >= lo) & (hi is None or value < hi)):
    bound = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
    raise ValueError(f"{name} must be {bound}, got {name}={value}")
  _check_fits(name, value, dtype)
  return v


def check_finite(name: str, v, dtype=None):
  """A finite Python or numpy number (finite in the compute ``dtype`` too, given one),
  or a 0-d float jax array (its value unchecked)."""
  v = _scalar(name, v)
  value = _known(v)
  if value is not None and not np.isfinite(value):
    raise ValueError(f"{name} must be finite, got {name}={value}")
  _check_fits(name, value, dtype)
  return v


def _check_fits(name: str, value, dtype) -> None:
  if value is not None and dtype is not None and np.any(np.abs(value) > jnp.finfo(dtype).max):
    raise ValueError(f"{name} must be a finite {jnp.dtype(dtype)} number (the loss computes "
                     f"in it), got {name}={value}")


def check_loss(name: str, fn) -> None:
  """A loss function: anything callable."""
  if not callable(fn):
    raise TypeError(f"{name} must be a callable loss, got {type(fn).__name__} {name}={fn!r}")


def check_tau_plus(tau, n: int, dtype=jnp.float32):
  """None for the plain path (a Python 0.0), a float, or a 0-d / per-row [n] array
  (then in ``dtype``, the glue's: fp32, fp64 for fp64 features; no gradient)."""
  if _is_python_number(tau) and not isinstance(tau, bool):
    tau = check_range("tau_plus", tau, 0.0, 1.0)
    return None if tau == 0.0 else tau
  if not hasattr(tau, "shape") or not hasattr(tau, "dtype") or isinstance(tau, bool):
    raise TypeError(f"tau_plus must be a float or a [batch] array, got {type(tau).__name__}")
  if tau.shape not in ((n,), ()):
    raise ValueError(f"a per-row tau_plus must have shape (batch,)=({n},), got "
                     f"tau_plus.shape={tau.shape}")
  if not jnp.issubdtype(tau.dtype, jnp.floating):
    raise TypeError(f"tau_plus must be floating, got tau_plus.dtype={tau.dtype}")
  host = _known(tau)   # a numpy tau_plus is checked as a Python one
  if host is not None and not np.all((host >= 0.0) & (host < 1.0)):
    got = host if host.ndim == 0 else f"{host.min()} .. {host.max()} (per row)"
    raise ValueError(f"tau_plus must be [0.0, 1.0), got tau_plus={got}")
  return lax.stop_gradient(jnp.asarray(tau, dtype))


def check_where(where, n: int):
  """None, or a bool [batch] array (numpy or jax): the rows the loss keeps."""
  if where is None:
    return None
  where = as_array(where)
  if not hasattr(where, "shape") or not hasattr(where, "dtype"):
    raise TypeError(f"where must be a bool [batch] array or None, got {type(where).__name__}")
  if where.dtype != jnp.bool_:
    raise TypeError(f"where must be a bool array (True = keep the row), got "
                    f"where.dtype={where.dtype}")
  if where.shape != (n,):
    raise ValueError(f"where must have shape (batch,)=({n},), got where.shape={where.shape}")
  return where


def check_negatives(tau, n_neg: int, batch: int) -> None:
  """Debiasing estimates the negatives' distribution: it needs some."""
  if tau is not None and n_neg == 0:
    raise ValueError(f"tau_plus needs negatives, but at a global batch of {batch} a softmax of "
                     f"this loss has none (hard negatives join only the queries' softmax): "
                     f"pass tau_plus=0.0 or a larger batch")


def check_config(config, backend: str):
  """None or a KernelConfig; the dense reference runs no kernels, so none there."""
  if config is None:
    return None
  if not isinstance(config, KernelConfig):
    raise TypeError(f"config must be a memeff_jax.KernelConfig or None, got "
                    f"{type(config).__name__}: config={config!r}")
  if backend == "reference":
    raise ValueError("config has no effect with backend='reference' (the dense reference "
                     "runs no kernels); pass config=None")
  return config


def check_axis(axis_name, *arrays, mask=None) -> None:
  """axis_name (a mesh axis or a tuple of them) must be bound, i.e. we are inside
  shard_map over it with JAX's varying-axis checks on, and ``arrays`` ((name, array
  or None) pairs) must be this device's shard: varying over every named axis, not
  replicated. With a ``where`` ``mask``, an array counts as varying where its masked
  rows would (either does)."""
  if axis_name is None:
    return
  for axis in axis_name if isinstance(axis_name, tuple) else (axis_name,):
    try:
      index = lax.axis_index(axis)
    except NameError as e:
      raise ValueError(f"axis_name={axis_name!r} is not bound here: call the loss inside "
                       f"jax.shard_map over a mesh with that axis, or wrap it with "
                       f"memeff_jax.sharded") from e
    if axis not in varying_axes(index):   # shard_map(check_vma=False)
      raise ValueError(
          f"axis_name={axis_name!r} needs jax.shard_map(..., check_vma=True) (JAX's "
          f"default): with check_vma=False JAX does not track which values vary over "
          f"{axis!r}, and jax.grad would return each input's gradient times the "
          f"devices on the ring (the global loss's all-reduce transposes to another)")
    mask_axes = frozenset() if mask is None else varying_axes(mask)
    for name, v in arrays:
      if v is not None and axis not in varying_axes(v) | mask_axes:
        what = ("its own shard of the shared columns (the global set is every device's: a "
                "copy on each would count every column once a device)"
                if name == "shared_negatives" else "its own shard of the batch")
        raise ValueError(
            f"{name} is replicated over mesh axis {axis!r} (in_specs P(), or computed from "
            f"replicated values), but axis_name={axis_name!r} means each device holds "
            f"{what}: shard it (in_specs=P({axis_name!r})) or drop axis_name")


def check_replicated(axis_name, hyper: dict) -> None:
  """The 0-d traced hyperparameters in ``hyper`` (name -> value) are one value on every
  device of the ring: a temperature that varies over ``axis_name`` defines no global
  loss (each device would scale its own logits, and its gradient would differ by
  device). Per-row arrays (``tau_plus`` [batch]) are shards, as the batch is."""
  if axis_name is None:
    return
  for axis in axis_name if isinstance(axis_name, tuple) else (axis_name,):
    for name, v in hyper.items():
      if isinstance(v, jax.Array) and v.ndim == 0 and axis in varying_axes(v):
        raise ValueError(
            f"{name} varies over mesh axis {axis!r}, but the ring's loss takes one {name} "
            f"on every device: pass it replicated (in_specs=P()) or reduce it first "
            f"(lax.pmean over {axis!r})")


Backend = BackendName   # the public names live in backends.registry


def check_backend(backend) -> str:
  return registry.check(backend)


def check_flag(name: str, v, *, allow_none: bool = False) -> bool | None:
  """Flags are Python bools (a string such as "False" is truthy); ``allow_none``: or
  None (the default decides)."""
  if allow_none and v is None:
    return None
  if not isinstance(v, bool):
    raise TypeError(f"{name} must be a bool{' or None' if allow_none else ''}, got "
                    f"{name}={v!r}")
  return v


def check_dims(name: str, dims, d: int | None = None, *,
               last_equals_d: bool = False) -> tuple[int, ...]:
  """Matryoshka dims: a non-empty, strictly increasing sequence of positive ints whose
  last entry is the feature size d (fused) or at most it (the eager wrapper; d=None:
  not known yet)."""
  if isinstance(dims, jax.core.Tracer):
    raise TypeError(f"{name} must be static (Python ints, or a numpy or concrete jax "
                    f"array): it sets the kernels' shapes; got a traced array")
  if isinstance(dims, (np.ndarray, jax.Array)):
    if dims.ndim != 1:
      raise TypeError(f"{name} must be a sequence of ints, got {name}.shape={dims.shape}")
    dims = np.asarray(dims).tolist()
  if isinstance(dims, (str, bytes)) or not hasattr(dims, "__len__"):
    raise TypeError(f"{name} must be a sequence of ints, got {name}={dims!r}")
  if not all(is_int(m) for m in dims):
    raise TypeError(f"{name} must hold ints, got {name}={tuple(dims)!r}")
  dims = tuple(int(m) for m in dims)
  if not dims:
    raise ValueError(f"{name} must not be empty, got {name}={dims}")
  if dims[0] < 1 or any(b <= a for a, b in zip(dims, dims[1:])):
    raise ValueError(f"{name} must be strictly increasing positive ints, got {name}={dims}")
  if d is None:
    return dims
  if last_equals_d and dims[-1] != d:
    raise ValueError(f"{name} must end at the feature size {d} (every prefix is a Matryoshka "
                     f"embedding, the last the whole vector), got {name}={dims}")
  if dims[-1] > d:
    raise ValueError(f"{name} must not exceed the feature size {d}, got {name}={dims}")
  return dims


def check_weights(name: str, weights, k: int, dtype=None) -> tuple[float, ...]:
  """One finite Python number per Matryoshka dim (default 1.0 each; not normalized),
  finite in the compute ``dtype`` too, given one."""
  if weights is None:
    return (1.0,) * k
  if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
    raise TypeError(f"{name} must be a sequence of floats, got {name}={weights!r}")
  if any(isinstance(w, (bool, np.bool_, str, bytes)) for w in weights):
    raise TypeError(f"{name} must hold numbers, got {name}={tuple(weights)!r}")
  try:
    weights = tuple(float(w) for w in weights)
  except (TypeError, jax.errors.ConcretizationTypeError) as e:
    raise TypeError(f"{name} must hold Python numbers (static weights), got {e}") from e
  if len(weights) != k:
    raise ValueError(f"{name} must have one entry per dim ({k}), got {len(weights)}: "
                     f"{name}={weights}")
  if not all(np.isfinite(weights)):
    raise ValueError(f"{name} must be finite, got {name}={weights}")
  _check_fits(name, np.asarray(weights), dtype)
  return weights
