"""Trace-time checks shared by every public loss: shapes, dtypes, Python-number ranges.

Shapes raise ValueError and dtypes TypeError, naming the argument and its shape.
Values inside traced arrays are never checked (that would need a host sync).
"""

from __future__ import annotations

import numbers
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np


def _is_python_number(v) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, (np.ndarray, jax.Array))


def check_towers(names: tuple[str, str], x, y) -> tuple[int, int]:
  """Both towers: rank 2, one (batch, feature) shape, one floating dtype."""
  for name, v in zip(names, (x, y)):
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
      raise TypeError(f"{name} must be an array, got {type(v).__name__}")
    if v.ndim != 2:
      raise ValueError(f"{name} must be rank 2 [batch, features], got {name}.shape={v.shape}")
    if not jnp.issubdtype(v.dtype, jnp.floating):
      raise TypeError(f"{name} must be a floating array, got {name}.dtype={v.dtype}")
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


def check_hard_negatives(h, n: int, d: int, dtype) -> None:
  if not hasattr(h, "shape") or not hasattr(h, "dtype"):
    raise TypeError(f"hard_negatives must be an array, got {type(h).__name__}")
  if h.ndim != 3 or h.shape[0] != n or h.shape[2] != d:
    raise ValueError(f"hard_negatives must be [batch={n}, k, features={d}], got "
                     f"hard_negatives.shape={h.shape}")
  if h.dtype != dtype:
    raise TypeError(f"hard_negatives must have the towers' dtype {dtype}, got "
                    f"hard_negatives.dtype={h.dtype}")


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


def check_temperature(t):
  t = _scalar("temperature", t)
  if isinstance(t, float) and not t > 0:
    raise ValueError(f"temperature must be > 0, got temperature={t}")
  return t


def check_range(name: str, v, lo: float, hi: float | None):
  """Python numbers must lie in [lo, hi) (hi=None: no upper bound); arrays pass."""
  v = _scalar(name, v)
  if isinstance(v, float) and not (v >= lo and (hi is None or v < hi)):
    bound = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
    raise ValueError(f"{name} must be {bound}, got {name}={v}")
  return v


def check_tau_plus(tau, n: int):
  """None for the plain path (a Python 0.0), a float, or a per-row fp32 [n] array."""
  if _is_python_number(tau) and not isinstance(tau, bool):
    tau = check_range("tau_plus", tau, 0.0, 1.0)
    return None if tau == 0.0 else tau
  if not hasattr(tau, "shape") or not hasattr(tau, "dtype") or isinstance(tau, bool):
    raise TypeError(f"tau_plus must be a float or a [batch] array, got {type(tau).__name__}")
  if tau.shape != (n,):
    raise ValueError(f"a per-row tau_plus must have shape (batch,)=({n},), got "
                     f"tau_plus.shape={tau.shape}")
  if not jnp.issubdtype(tau.dtype, jnp.floating):
    raise TypeError(f"tau_plus must be floating, got tau_plus.dtype={tau.dtype}")
  return jax.lax.stop_gradient(jnp.asarray(tau, jnp.float32))


Backend = Literal["auto", "triton", "interpret", "blockwise", "reference"]
BACKENDS = ("auto", "triton", "interpret", "blockwise", "reference")


def check_backend(backend) -> str:
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r}; expected one of {BACKENDS}")
  return backend


def check_flag(name: str, v) -> bool:
  """Flags are Python bools (a string such as "False" is truthy)."""
  if not isinstance(v, bool):
    raise TypeError(f"{name} must be a bool, got {name}={v!r}")
  return v


def check_dims(name: str, dims, d: int | None = None, *,
               last_equals_d: bool = False) -> tuple[int, ...]:
  """Matryoshka dims: a non-empty, strictly increasing sequence of positive ints whose
  last entry is the feature size d (fused) or at most it (the eager wrapper; d=None:
  not known yet)."""
  if isinstance(dims, (str, bytes)) or not hasattr(dims, "__len__"):
    raise TypeError(f"{name} must be a sequence of ints, got {name}={dims!r}")
  if not all(isinstance(m, numbers.Integral) and not isinstance(m, bool) for m in dims):
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


def check_weights(name: str, weights, k: int) -> tuple[float, ...]:
  """One finite Python number per Matryoshka dim (default 1.0 each; not normalized)."""
  if weights is None:
    return (1.0,) * k
  if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
    raise TypeError(f"{name} must be a sequence of floats, got {name}={weights!r}")
  try:
    weights = tuple(float(w) for w in weights)
  except (TypeError, jax.errors.ConcretizationTypeError) as e:
    raise TypeError(f"{name} must hold Python numbers (static weights), got {e}") from e
  if len(weights) != k:
    raise ValueError(f"{name} must have one entry per dim ({k}), got {len(weights)}: "
                     f"{name}={weights}")
  if not all(np.isfinite(weights)):
    raise ValueError(f"{name} must be finite, got {name}={weights}")
  return weights


def check_matryoshka(dims, weights, d: int):
  """The fused Matryoshka options: (dims or None, weights); one weight 1.0 without dims."""
  if dims is None:
    if weights is not None:
      raise ValueError(f"matryoshka_weights needs matryoshka_dims, got "
                       f"matryoshka_weights={weights!r} and matryoshka_dims=None")
    return None, (1.0,)
  dims = check_dims("matryoshka_dims", dims, d, last_equals_d=True)
  return dims, check_weights("matryoshka_weights", weights, len(dims))
