"""Public loss vs reference: values and gradients (every array input and the
temperature) under jax.jit, with the tolerances of tests.support.tolerances; the
slow-marker sampling rules; kernel-path configs; jaxpr walking."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from memeff_jax.config import RoleTiles, default_config

from tests.support.tolerances import FP32, LOW, grad_err, rel_err

# dtype name -> [largest value error, largest gradient error] seen in this test run
# (printed by conftest's terminal summary).
LARGEST = {}


def _value_and_grads(f, arrays, t, kwargs, check_dtypes=False):
  n = len(arrays)
  g = lambda *a: f(*a[:n], temperature=a[n], **kwargs)
  val, grads = jax.jit(jax.value_and_grad(g, argnums=tuple(range(n + 1))))(*arrays, t)
  if check_dtypes:   # cotangents come back in their primal's dtype
    assert [v.dtype for v in grads] == [a.dtype for a in arrays] + [jnp.float32], grads
  return np.asarray(val, np.float64), [np.asarray(v, np.float64) for v in grads]


def low_grad_bounds(low, want, dtype, floors):
  """compare's bound on each 16-bit gradient: 2x the error of the plain 16-bit version's
  (``low``, against the float64 ``want``) plus LOW's atol, at most LOW's cap where the
  largest entry of ``want`` passes its floor (tests.support.tolerances)."""
  _, atol, cap = LOW[jnp.dtype(dtype)]

  def bound(a, r, f):
    b = 2 * grad_err(a, r, f) + atol
    return b if np.max(np.abs(r)) < f else min(b, cap)
  return [bound(a, r, f) for a, r, f in zip(low, want, floors)]


def compare(fn, ref_fn, arrays, *, temperature=0.07, dtype=jnp.float32, grad_floor=1e-6,
            **kwargs):
  """Assert fn(*arrays, temperature=t, **kwargs) matches ref_fn in value and gradients.

  The oracle is ref_fn in float64 on the same (possibly 16-bit) inputs. For 16-bit
  inputs the bound is 2x the error of ref_fn run on the 16-bit inputs, plus LOW's atol
  (gradients: at most LOW's cap).
  grad_floor: the smallest max|g_ref| that gradient errors are divided by. With d = 1
  every unit vector is +-1: the tower gradients are exactly zero (normalization
  projects everything away), and the temperature's can be too; only rounding noise is
  left, so pass the natural size of these gradients, 1/t (the temperature's is a
  difference of terms s/t^2 weighted by probabilities).
  Returns (value error, [gradient errors]).
  """
  n = len(arrays)
  val = fn(*arrays, temperature=jnp.float32(temperature), **kwargs)
  assert val.dtype == jnp.float32 and val.shape == (), (val.dtype, val.shape)
  val, grads = _value_and_grads(fn, arrays, jnp.float32(temperature), kwargs, True)
  with jax.enable_x64(True):
    to64 = lambda v: jnp.asarray(np.asarray(v, np.float64)) if isinstance(v, jax.Array) else v
    ref_val, ref_grads = _value_and_grads(ref_fn, [to64(a.astype(jnp.float32)) for a in arrays],
                                          jnp.float64(temperature),
                                          {k: to64(v) for k, v in kwargs.items()})
  floors = [grad_floor] * (n + 1)
  if jnp.dtype(dtype) == jnp.float32:
    v_tol, g_tols = FP32[0], [FP32[1]] * (n + 1)
  else:   # the plain 16-bit version's own error sets the bound
    lp_val, lp_grads = _value_and_grads(ref_fn, arrays, jnp.float32(temperature), kwargs)
    v_tol = 2 * rel_err(lp_val, ref_val) + LOW[jnp.dtype(dtype)][0]
    g_tols = low_grad_bounds(lp_grads, ref_grads, dtype, floors)
  v_err = rel_err(val, ref_val)
  assert np.isfinite(val) and v_err <= v_tol, ("value", float(val), float(ref_val), v_err, v_tol)
  errs = []
  for i, (g, r) in enumerate(zip(grads, ref_grads)):
    assert np.all(np.isfinite(g)), f"gradient {i} is not finite"
    e = grad_err(g, r, floors[i])
    errs.append(e)
    assert e <= g_tols[i], (f"gradient {i}", e, g_tols[i])
  worst = LARGEST.setdefault(jnp.dtype(dtype).name, [0.0, 0.0])
  worst[0], worst[1] = max(worst[0], v_err), max([worst[1]] + errs)
  return v_err, errs


def sampled(cases, keep):
  """``cases`` (tuples) as pytest params: those with ``keep(index, case)`` run by
  default, the others carry the ``slow`` marker (the full product runs with -m slow).
  A fixed rule, so CI runs the same sample every time."""
  return [pytest.param(*c, marks=() if keep(i, c) else pytest.mark.slow)
          for i, c in enumerate(cases)]


def checkerboard(*picks, mod: int = 2, residue: int = 0) -> bool:
  """A fixed fraction of a product, as a checkerboard: ``picks`` are (value, values)
  pairs, and a case is picked when the sum of its indices is ``residue`` modulo
  ``mod`` (about 1 / mod of the cases). Every value of every factor stays in the
  sample as long as another factor has at least ``mod`` values."""
  return sum(list(values).index(v) for v, values in picks) % mod == residue


def kernel_path_config(path, d, dtype):
  """A config selecting one kernel path of the Triton backend under the interpreter:
  "partials" / "col_pass" (the sweep forward's two ways to the column statistics) or
  "tiled" (tiled forward and gradient, a pass per tower) or "tiled_col_pass" (the same,
  the forward's columns from a second pass over the swapped block) or "tiled_paired" (both
  towers' gradients from one set of coefficient slabs where both are needed;
  "tiled_paired_cols": slabs in column blocks), with tiles small enough that batches of a
  few dozen rows span several tiles and, tiled, several slabs; or "paired" (bwd_pair
  alone: the paired tiled gradient with its own default tiles where both towers train,
  FlashAttention-shaped elsewhere; 64-row slabs) or "epilogue_halves" /
  "epilogue_quarters" (tiled_paired on tiles whose sigmoid epilogue in the forward runs in
  2 / 4 column chunks) or "tma" (the FlashAttention-shaped gradient on 32 x 32 tiles,
  32 x 64 in passes of the rows' softmax alone, loaded through TMA descriptors, at a
  power-of-two d)."""
  cfg = default_config(d, dtype, interpret=True)
  # 1 KiB slabs: one row tile per slab; 32-feature chunks: ragged for d = 40.
  tiles = dict(fwd=dict(block_m=32, block_n=64, block_d=32),
               bwd=dict(block_m=32, block_n=32, block_d=32),
               budgets=dict(slab_kib=1, min_slab_rows=1))
  tiled = dict(fwd_tiled=True, fwd_bounded=True, bwd_tiled=True)
  return cfg.evolve(**{
      "partials": dict(algorithm=dict(fwd_col_pass=False), fwd=dict(block_m=32),
                       budgets=dict(max_programs=3)),
      "col_pass": dict(algorithm=dict(fwd_col_pass=True), fwd=dict(block_m=32)),
      "tiled": dict(tiles, algorithm=tiled),
      "tiled_col_pass": dict(tiles, algorithm=dict(tiled, fwd_col_pass=True)),
      # the same, both towers' gradients from one set of slabs (bwd_pair)
      "tiled_paired": dict(tiles, algorithm=dict(tiled, bwd_pair=True)),
      # the same, each slab of rows walking blocks of 64 columns (a narrower last one
      # where the batch is not a multiple of 64)
      "tiled_paired_cols": dict(tiles, algorithm=dict(tiled, bwd_pair=True),
                                budgets=dict(tiles["budgets"], pair_block_cols=64)),
      "paired": dict(algorithm=dict(bwd_pair=True),
                     budgets=dict(slab_kib=1, min_slab_rows=1)),
      # tiled_paired with tiles of 64 / 128 fp32 entries a thread (one warp): a sigmoid
      # block's epilogue in the forward then runs in 2 / 4 column chunks
      "epilogue_halves": dict(tiles, algorithm=dict(tiled, bwd_pair=True),
                              bwd=dict(block_m=32, block_n=64, block_d=32, num_warps=1)),
      "tma": dict(bwd=dict(block_m=32, block_n=32, tma=True,
                           row_role=RoleTiles(block_n=64, num_stages=1))),
      "epilogue_quarters": dict(tiles, algorithm=dict(tiled, bwd_pair=True),
                                bwd=dict(block_m=32, block_n=128, block_d=32, num_warps=1)),
  }[path])


def jaxpr_eqns(jaxpr):
  """Every equation of ``jaxpr``, those of nested jaxprs (jit, shard_map, scan, cond)
  included."""
  for e in jaxpr.eqns:
    yield e
    for sub in jax.extend.core.jaxprs_in_params(e.params):
      yield from jaxpr_eqns(sub)
