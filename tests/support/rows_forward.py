"""The check of ``Algorithm.fwd_row_grad`` (a one-sided block's rows' gradient formed in
its forward), shared by the GPU test (grad_gluon's kernel) and the CPU one (the
FlashAttention-shaped Triton kernel under the interpreter)."""

import jax
import jax.numpy as jnp
import numpy as np

from memeff_jax.backends.triton import backend as launch
from tests.support.check import compare
from tests.support.data import decisive_tau_plus


def check_rows_in_forward(monkeypatch, fam, arrays, w, ref_fn, names, *, backend, cfg, t,
                          dtype, rerun: bool):
  """With ``cfg`` (fwd_row_grad on): the forward's kernel ran ("memeff/lse_fwd_rows*" in
  ``names``), the exact forward ran (not merely traced) iff ``rerun``; the loss and every
  gradient (a learned temperature, label smoothing, tau_plus) against the float64
  ``ref_fn``; a differentiated call's loss, row lse and accuracies against
  fwd_row_grad=False on the same inputs (1e-5 relative; 1e-4 in the lse: fp32 summation
  order); where ``rerun``, the gradients too, within 4 eps of ``dtype`` (2^-5 for
  bfloat16) of the largest entry: the saved gradient's float16 rounding, each path's
  own output rounding, through the normalization's backward (one eps, 2^-7, is the
  spacing at the bottom of a binade; the interpreter shows 0.75% at d = 200, t =
  0.005)."""
  plain = cfg.evolve(algorithm=dict(fwd_row_grad=False))
  runs = []   # the exact forwards that run (not merely traced)
  fwd_stats = launch.TritonBackend.fwd_stats

  def recording(self, block, scale, *, bounded=False, **k):
    if not bounded:
      jax.debug.callback(lambda: runs.append("exact"))
    return fwd_stats(self, block, scale, bounded=bounded, **k)

  monkeypatch.setattr(launch.TritonBackend, "fwd_stats", recording)
  grad = lambda c: jax.grad(lambda *a: fam.loss(*a, where=w, backend=backend, config=c,
                                                temperature=t, **fam.options),
                            argnums=tuple(range(len(arrays))))(*arrays)
  fused = jax.block_until_ready(grad(cfg))
  jax.effects_barrier()
  assert any(n.startswith("memeff/lse_fwd_rows") for n in names), names
  assert bool(runs) == rerun, runs
  # (LiT's softmaxes clear of the debiased clamp: at t = 0.005, d = 512 tau_plus 0.05
  # leaves one within 3%, and the plain bf16 formula off by 0.43 of the largest entry)
  tau = 0.05 if fam.n_arrays == 3 else decisive_tau_plus(*arrays, t, 0.05, False, where=w)
  compare(lambda *a, **k: fam.with_stats(*a, where=w, backend=backend, config=cfg,
                                         **fam.options, **k)[0],
          ref_fn, arrays, dtype=dtype, temperature=t, label_smoothing=0.1, tau_plus=tau)
  # (the stats of a differentiated call: its forward is the fused one)
  run = lambda c: jax.value_and_grad(
      lambda x: fam.with_stats(x, *arrays[1:], where=w, backend=backend, config=c,
                               temperature=t, **fam.options), has_aux=True)(arrays[0])[0]
  (loss, stats), (loss_p, stats_p) = run(cfg), run(plain)
  np.testing.assert_allclose(loss, loss_p, rtol=1e-5)
  keep = slice(None) if w is None else w
  np.testing.assert_allclose(np.asarray(stats.lse_row)[keep], np.asarray(stats_p.lse_row)[keep],
                             rtol=0, atol=1e-4)
  assert stats.accuracy_row == stats_p.accuracy_row
  if rerun:
    tol = 4 * float(jnp.finfo(dtype).eps)
    for g, g_p in zip(fused, grad(plain)):
      g, g_p = np.asarray(g, np.float64), np.asarray(g_p, np.float64)
      err = np.max(np.abs(g - g_p)) / max(np.max(np.abs(g_p)), 1e-30)
      assert err <= tol, (err, tol)
