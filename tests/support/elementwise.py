"""A Triton kernel applying one of ``_common``'s elementwise helpers to an array, so
that tests can check a helper against float64 on every backend that runs kernels."""

import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from memeff_jax.backends.triton._common import sigmoid_softplus
from memeff_jax.backends.triton.call import call, cdiv


@triton.jit
def sigmoid_softplus_kernel(u_ptr, n, sig_ptr, sp_ptr, BLOCK: tl.constexpr):
  """(sigmoid(u), softplus(u)) of the n entries of u (fp32)."""
  i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  sig, sp = sigmoid_softplus(tl.load(u_ptr + i, mask=i < n, other=0.0))
  tl.store(sig_ptr + i, sig, mask=i < n)
  tl.store(sp_ptr + i, sp, mask=i < n)


def sigmoid_softplus_errors(interpret: bool, tol: float) -> float:
  """The largest error of ``_common.sigmoid_softplus``'s sigmoid and softplus on fp32 u
  over [-120, 120] (dense where SigLIP's logits lie, near 0 and at the ends of e^-|u|'s
  range), +-inf and -0, against float64, as a multiple of ``tol + 2^-24 |u|`` relative
  (the second term: e^-|u| as 2^(-|u| log2(e)), whose rounded exponent costs 2^-24 |u|
  relative; the GPU's exponential is computed so); infinities must be exact, and any
  value below fp32's smallest normal is right where float64's is too."""
  u = np.concatenate([np.linspace(-120, 120, 48001), np.linspace(-1, 1, 20001),
                      np.geomspace(1e-30, 1, 2000), -np.geomspace(1e-30, 1, 2000),
                      [-np.inf, np.inf, -0.0]]).astype(np.float32)
  f32 = jnp.float32
  sig, sp = call(sigmoid_softplus_kernel, jnp.asarray(u), u.size,
                 out_shapes=[jnp.zeros(u.shape, f32)] * 2, grid=(cdiv(u.size, 1024),),
                 num_warps=4, num_stages=1, name="test/sigmoid_softplus", interpret=interpret,
                 BLOCK=1024)
  u64 = u.astype(np.float64)
  e = np.exp(-np.abs(u64))
  want_sig = np.where(u64 >= 0, 1 / (1 + e), e / (1 + e))
  want_sp = np.maximum(u64, 0) + np.log1p(e)
  tiny = 2.0**-126   # fp32's smallest normal
  fin = np.isfinite(u64)
  bound = tol + 2.0**-24 * np.abs(u64[fin])

  def err(got, want):
    got = np.asarray(got, np.float64)
    if not np.array_equal(got[~fin], want[~fin]):
      return np.inf
    got, want = got[fin], want[fin]
    rel = np.abs(got - want) / np.maximum(np.abs(want), tiny)
    return float(np.max(np.where((want < tiny) & (np.abs(got) < tiny), 0.0, rel / bound)))
  return max(err(sig, want_sig), err(sp, want_sp))
