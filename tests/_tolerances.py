"""dtype -> (value rtol, gradient tolerance); every loosened entry says why.

Gradient errors are measured as max|g - g_ref| / max|g_ref| (errors relative to the
largest entry: a softmax gradient has many tiny entries whose relative error is
meaningless); values by a plain relative error.
"""

import jax.numpy as jnp
import numpy as np

TOL = {
    # fp32: blockwise uses HIGHEST-precision dots, the interpreter exact fp32 ones;
    # what remains is summation order over <= 1000 terms.
    jnp.dtype(jnp.float32): (2e-5, 2e-4),
    # fp16: inputs rounded to 11 bits; the gradient dot casts its coefficient tile
    # to fp16 (as memeff's FA path does) and gradients come back in fp16.
    jnp.dtype(jnp.float16): (2e-3, 1.5e-2),
    # bf16: 8-bit mantissa; the same casts as fp16 with 3 fewer bits.
    jnp.dtype(jnp.bfloat16): (8e-3, 6e-2),
}


def grad_err(g, ref) -> float:
  g, ref = np.asarray(g, np.float64), np.asarray(ref, np.float64)
  scale = np.max(np.abs(ref))
  return float(np.max(np.abs(g - ref)) / scale) if scale > 0 else float(np.max(np.abs(g)))


def rel_err(v, ref) -> float:
  v, ref = float(v), float(ref)
  return abs(v - ref) / max(abs(ref), 1e-6)
