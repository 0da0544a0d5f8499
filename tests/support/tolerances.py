"""Tolerances. Every comparison is against the float64 reference on the same inputs.

fp32: fixed bounds. fp16/bf16 (flash-attention's rule): the error may be up to 2x the
error of the plain low-precision jnp version (the reference run on the same 16-bit
inputs: 16-bit normalized vectors, fp32 accumulation) plus a small atol, because the
inputs' rounding, amplified by 1/t, dominates and varies from case to case.

Gradient errors are max|g - g_ref| / max|g_ref| (relative to the largest entry: a
softmax gradient has many tiny entries whose own relative error means nothing);
value errors are plain relative errors. A 16-bit gradient bound is capped (LOW's
third entry): where the plain 16-bit version is off by more, twice its error would let
a gradient with the wrong sign in its largest entries pass, so such a case's inputs
must change (a threshold or the debiased clamp within rounding of a candidate: see
tests/support/data.py's ``decisive_margin`` and ``decisive_tau_plus``).
"""

import jax.numpy as jnp
import numpy as np

FP32 = (2e-5, 2e-4)   # (value, gradient): summation order over <= 1000 terms, HIGHEST dots
LOW = {
    # (value atol, gradient atol) on top of 2x the plain 16-bit version's error: the
    # kernels also cast their coefficient tile to the input dtype for the gradient dot
    # (as memeff's FA path does), and gradients come back in the input dtype. Then the
    # gradient bound's cap, relative to the largest entry (where that entry is above
    # the floor; below it the error is rounding noise over the floor). The largest
    # errors seen (2026-12-06): the CPU suite (default and slow) bf16 0.040, fp16
    # 0.0093; the GPU cases the cap touches, on every tested pair, bf16 0.050 (LiT's
    # rows at t = 0.005, d = 200), fp16 0.005.
    jnp.dtype(jnp.float16): (1e-3, 1e-2, 0.05),
    jnp.dtype(jnp.bfloat16): (4e-3, 3e-2, 0.1),
}


def grad_err(g, ref, floor: float = 1e-6) -> float:
  """max|g - ref| / max(max|ref|, floor)."""
  g, ref = np.asarray(g, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(g - ref)) / max(np.max(np.abs(ref)), floor))


def rel_err(v, ref) -> float:
  v, ref = float(v), float(ref)
  return abs(v - ref) / max(abs(ref), 1e-6)
