"""The loss families and the backends the CPU tests run, each listed once."""

from typing import Any, Callable, NamedTuple

import memeff_jax as mj
from memeff_jax import reference
from tests.support.data import features, qwen3_batch


class Family(NamedTuple):
  """One loss family: its public functions, its dense reference, and its names."""
  loss: Callable[..., Any]                   # mj.clip_loss
  with_stats: Callable[..., Any]             # mj.clip_loss_with_stats
  reference: Callable[..., Any]              # reference.clip_loss
  reference_with_stats: Callable[..., Any]   # reference.clip_loss_with_stats
  n_arrays: int        # 2 (x, y) or 3 (queries, documents, hard negatives [n, k, d])
  class_name: str      # nnx.<class_name>Loss, classes.MemoryEfficient<class_name>Loss
  # Non-default options exercising the family's own switches (Qwen3's extra negative
  # groups and margin), as the Matryoshka, where= and GPU tests pass them.
  options: dict[str, Any]


def _family(name, class_name, n_arrays, **options):
  return Family(getattr(mj, f"{name}_loss"), getattr(mj, f"{name}_loss_with_stats"),
                getattr(reference, f"{name}_loss"),
                getattr(reference, f"{name}_loss_with_stats"), n_arrays, class_name, options)


FAMILIES = {
    "clip": _family("clip", "CLIP", 2),
    "lit": _family("lit", "LiT", 2),
    "qwen3": _family("qwen3", "Qwen3", 3, use_qq_negatives=True, use_dd_negatives=True,
                     margin=0.05),
    "lit_qwen3": _family("lit_qwen3", "LiTQwen3", 3, use_qq_negatives=True, margin=0.05),
}

# The backends the CPU tests compare with the float64 reference: the pure-JAX
# blockwise backend and the Triton kernels under Triton's interpreter.
BACKENDS = ["blockwise", "interpret"]
# ... and the dense reference as a backend (backend="reference"), where the test is of
# the public API's behaviour (errors, NaNs, where=) rather than of the arithmetic.
ALL_BACKENDS = ["reference", *BACKENDS]


def eager_matryoshka(ref, dims, weights, **kw):
  """The eager wrapper (``mj.matryoshka``) over a ``*_with_stats`` reference: the fused
  loss in exact math (every prefix renormalized), and in 16-bit rounded as one block per
  dim rounds (each raw prefix normalized, then rounded), so its own 16-bit error bounds
  that path's."""
  def loss(*a, normalized_inputs=False, **k):
    del normalized_inputs   # unit inputs: their prefixes are renormalized either way
    return mj.matryoshka(lambda *b, **c: ref(*b, **c)[0], dims, weights)(*a, **kw, **k)
  return loss


# The options each family's shared-column case runs with (test_porting_triton).
SHARED_OPTIONS = {"clip": dict(label_smoothing=0.1), "lit": dict(label_smoothing=0.1),
                  "qwen3": dict(margin=0.05, use_dd_negatives=True),
                  "lit_qwen3": dict(margin=0.05)}


def shared_columns_case(family, b, d, dtype):
  """The GPU tests' shared-column case of ``family``: ``(ref, arrays, options)``: the
  dense reference, its queries and documents from ``qwen3_batch`` (seed b, 3 hard
  negatives drawn and unused) with 777 shared columns, and ``SHARED_OPTIONS``."""
  q, doc, _ = qwen3_batch(b, b, d, 3, dtype)
  arrays = [q, doc, features(d, [(777, d)], dtype)[0]]
  ref = lambda *a, **k: getattr(reference, f"{family}_loss")(*a[:2], shared_negatives=a[2],
                                                                **k)
  return ref, arrays, SHARED_OPTIONS[family]


def shared_columns_loss(family, config=None):
  """``family``'s loss on ``shared_columns_case``'s arrays, on the Triton backend with
  ``config`` (None: the backend's own tiles)."""
  return lambda *a, **k: getattr(mj, f"{family}_loss")(
      *a[:2], shared_negatives=a[2], backend="triton", config=config, **k)
