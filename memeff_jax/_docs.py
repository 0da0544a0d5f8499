"""Docstring pieces of the public losses: every option is documented here, once, and
each loss's ``Args:`` section is assembled from its signature (``args``)."""

from __future__ import annotations

import inspect
import textwrap

OPTIONS = {
    "temperature": """float > 0 or a traced 0-d float array (learnable: it gets a
      gradient, and a new value never recompiles). Default 0.07. A Python float
      above 1 warns: a logit scale s (OpenCLIP, sentence-transformers) is
      ``temperature = 1 / s``.""",
    "margin": """>= 0 (float or 0-d array), raw-cosine units: an entry of row i is
      dropped as a presumed false negative iff its similarity exceeds
      s(q_i, d_i) + margin + 2^-10 (a tie tolerance: an exact duplicate of the
      positive is kept), with row i's threshold on every group (docs/math.md §6).
      For unit-norm inputs margin >= 2 disables the mask. Default 0.1.""",
    "use_qq_negatives": """add the other queries to row i's candidates (q-q block).""",
    "use_dd_negatives": """add the other documents, compared with d_i, to row i's
      candidates (d-d block).""",
    "normalized_inputs": """skip the L2 normalization (done in the input dtype
      otherwise). Matryoshka prefixes are renormalized either way.""",
    "stable": """multiply the whole gradient (the temperature's too) by sqrt(B t), B
      the global batch, t held constant in the factor; the value is unchanged. Default
      True, as in memeff; ``stable=False`` gives ``jax.grad`` of the value
      (docs/math.md §7.5).""",
    "tau_plus": """debiasing prior in [0, 1) (Chuang et al.); a Python 0.0 is the
      plain loss; a [batch] array (numpy or jax) gives per-row priors and a 0-d array
      one traced prior, both always debias (docs/math.md §7.1). Needs negatives: a
      global batch of 1 without hard negatives raises.""",
    "label_smoothing": """in [0, 1): ``F.cross_entropy``'s smoothed targets over the
      softmax's nominal candidates (docs/math.md §7.2).""",
    "lse_square_scale": """z-loss weight >= 0: adds ``lse_square_scale * mean(lse^2)``,
      lse the natural log of each softmax's denominator (docs/math.md §7.3).""",
    "matryoshka_dims": """fused Matryoshka: strictly increasing positive ints ending
      at the feature size d (any ladder, e.g. (64, 128, 256, 512) or (16, 72, 200)).
      The loss becomes ``sum_k w_k L_k``, L_k this loss on the renormalized first
      m_k features (every prefix renormalized, the last too), every option applied
      per dim (docs/math.md §8): on a GPU as one plain block per dim, else in one
      pass over the features (``KernelConfig.matryoshka_per_dim``). None: off.""",
    "matryoshka_weights": """one float per Matryoshka dim (default 1.0 each; not
      normalized). Needs ``matryoshka_dims``.""",
    "where": """optional bool [batch] mask (numpy or jax; inside a ring this device's
      [local batch]): the rows to keep. A removed row is gone entirely: not an anchor,
      not a candidate, not in the mean nor in ``stable``'s B, so the loss equals the
      loss of the kept rows alone and the removed rows' gradients are exactly zero. For
      padded last batches under jit and uneven shards (:func:`memeff_jax.sharded`
      pads and masks by itself). Its ``lse_row`` / ``lse_col`` entries are 0; no kept
      row at all gives NaN.""",
    "axis_name": """inside ``jax.shard_map``: the mesh axis (or tuple of axes) the
      batch is sharded over. The arrays are this device's contiguous shard; every
      device returns the global loss, and the gradients are the local rows of the
      global loss's gradient (docs/math.md §9). :func:`memeff_jax.sharded` does this
      for global arrays.""",
    "backend": """"auto" (Triton on a GPU where jax-triton imports, else blockwise),
      "triton", "interpret" (the Triton kernels under Triton's CPU interpreter),
      "blockwise" (pure JAX, any platform) or "reference" (dense, O(B^2) memory).
      float64 features (with ``jax_enable_x64``) run in float64 on "blockwise" and
      "reference" ("auto" picks blockwise); the Triton kernels take fp16, bf16 and
      fp32, and have first-order gradients only (no ``vmap``, no grad-of-grad).""",
    "deterministic": """accepted for memeff parity: every backend is deterministic
      already (no atomics, fixed reduction orders).""",
    "config": """optional :class:`memeff_jax.KernelConfig` (tiles, precision of fp32
      dots); None picks :func:`memeff_jax.default_config`. Not with
      ``backend="reference"``, which runs no kernels.""",
}


def args(fn, arrays: dict[str, str]) -> str:
  """The ``Args:`` section of ``fn``: its arrays (docs given here), then each keyword
  option, documented in OPTIONS, in signature order."""
  lines = ["Args:"]
  for name in inspect.signature(fn).parameters:
    doc = arrays[name] if name in arrays else OPTIONS[name]
    lines.append(f"  {name}: " + textwrap.dedent("      " + doc).strip().replace(
        "\n", "\n    "))
  return "\n".join(lines)


RAISES = """Raises:
  ValueError: bad shapes, Python numbers out of range (``temperature <= 0`` or it or
    its inverse not a normal number of the compute dtype, ``tau_plus``,
    ``label_smoothing``, ``lse_square_scale`` (inf included), ``margin``), bad
    ``matryoshka_dims`` / ``matryoshka_weights``, an unknown backend, an unbound
    ``axis_name`` or replicated arrays with one, a ``config`` with
    ``backend="reference"``, ``tau_plus`` without negatives.
  TypeError: non-floating, unsupported (float8, ...) or mismatched dtypes, float64 on
    the Triton backends, non-bool flags, a ``config`` that is not a KernelConfig;
    forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``) but on the reference
    with float32 / float64 features.
  NotImplementedError: ``vmap`` / ``jacrev`` / grad-of-grad over the Triton backends.

Traced values cannot raise: a traced hyperparameter out of range or NaN
(``temperature <= 0``, ``margin < 0``, ``tau_plus``, ``label_smoothing`` outside
[0, 1), ``lse_square_scale < 0``) or a non-finite feature gives a NaN loss and NaN
gradients on every backend, never a finite value; traced inside
:func:`memeff_jax.checkify_checks`, ``jax.experimental.checkify.checkify`` also
returns an error naming the argument."""

RETURNS = """Returns:
  float32 scalar (float64 for float64 features): the mean loss (with
  ``matryoshka_dims``, the weighted sum over the dims), smoothing and z-loss included."""

STATS = """Returns ``(loss, stats)``: the loss of :func:`{name}` and its
:class:`memeff_jax.ContrastiveStats` (z-loss, log-normalizers, per-dim Matryoshka losses)."""
