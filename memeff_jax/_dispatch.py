"""Backend resolution at trace time: "auto" | "triton" | "interpret" | "blockwise" |
"reference". The only module that imports the kernels, lazily."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp

from memeff_jax._validation import check_backend
from memeff_jax.blockwise import BlockwiseBackend


@functools.cache
def _triton_backend(interpret: bool):
  from memeff_jax.kernels import launch  # pylint: disable=g-import-not-at-top
  return _FirstOrderOnly(launch.TritonBackend(interpret=interpret))


@dataclasses.dataclass(frozen=True)
class _FirstOrderOnly:
  """A Triton backend whose launches refuse ``vmap`` and forward-mode differentiation
  with a clear error: ``triton_call`` and the interpreter's ``pure_callback`` have
  neither rule. First-order ``jax.grad`` never needs one (the custom_vjp in ``_core``
  calls the kernels on plain values); ``jax.vmap`` / ``jax.jacrev`` (batching) and
  grad-of-grad / ``jax.hessian`` (a JVP of the gradient kernels) would."""

  inner: Any

  @property
  def name(self) -> str:
    return self.inner.name

  def fwd_stats(self, *args, **kwargs):
    return _refuse_transforms(self.inner.fwd_stats, self.name, args, kwargs)

  def bwd(self, *args, **kwargs):
    return _refuse_transforms(self.inner.bwd, self.name, args, kwargs)

  def pairs(self, x, y, spec) -> bool:
    return self.inner.pairs(x, y, spec)

  def fwd_floor(self, x, scale, spec):
    return self.inner.fwd_floor(x, scale, spec)

  def default_config(self, d: int, dtype):
    return self.inner.default_config(d, dtype)

  def bwd_pair(self, *args, **kwargs):
    return _refuse_transforms(self.inner.bwd_pair, self.name, args, kwargs)


def _refuse_transforms(fn, name: str, args, kwargs):
  leaves, tree = jax.tree.flatten((args, kwargs))
  traced = [isinstance(v, jax.Array) for v in leaves]

  def call(*arrays):
    it = iter(arrays)
    a, k = jax.tree.unflatten(tree, [next(it) if t else v for v, t in zip(leaves, traced)])
    return fn(*a, **k)

  def no_vmap(*_):
    raise NotImplementedError(
        f"backend={name!r} cannot run under jax.vmap or jax.jacrev / jax.jacfwd (the "
        f"Triton launch has no batching rule): use backend='blockwise', or loop")

  def no_jvp(*_):
    raise NotImplementedError(
        f"backend={name!r} has first-order gradients only (jax.grad, jax.vjp): "
        f"grad-of-grad and jax.hessian need backend='blockwise' or 'reference'")

  batched = jax.custom_batching.custom_vmap(call)
  batched.def_vmap(no_vmap)
  guarded = jax.custom_jvp(batched)
  guarded.defjvp(no_jvp)
  return guarded(*[v for v, t in zip(leaves, traced) if t])


def _triton_interpreting() -> bool:
  import triton  # pylint: disable=g-import-not-at-top
  return bool(triton.knobs.runtime.interpret)


def _gpu_triton_error() -> str | None:
  """None if the triton backend can run here, else why not."""
  if jax.default_backend() != "gpu":
    return f"it needs a CUDA GPU; JAX's default backend is {jax.default_backend()!r}"
  try:
    import jax_triton  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"jax-triton does not import ({e}); from the checkout: pip install -e '.[gpu]'"
  if _triton_interpreting():
    return "triton was imported with TRITON_INTERPRET=1 (interpreter mode)"
  return None


def resolve(backend: str, dtype=jnp.float32):
  """The backend object for ``backend`` and input ``dtype``; None means the dense
  reference. The Triton kernels compute in fp16 / bf16 / fp32: for float64 "auto" is
  blockwise, and "triton" / "interpret" raise TypeError."""
  check_backend(backend)
  if backend == "reference":
    return None
  if backend == "blockwise" or (backend == "auto" and jnp.dtype(dtype) == jnp.float64):
    return BlockwiseBackend()
  if backend == "auto":
    return BlockwiseBackend() if _gpu_triton_error() else _triton_backend(False)
  if jnp.dtype(dtype) == jnp.float64:
    raise TypeError(f"backend={backend!r} computes in float16, bfloat16 or float32, got "
                    f"float64 features: use backend='blockwise' or 'reference' (or cast)")
  if backend == "triton":
    why = _gpu_triton_error()
    if why:
      raise ValueError(f"backend='triton' is unavailable: {why}")
    return _triton_backend(False)
  # "interpret": the same kernels and launch code under Triton's interpreter, on CPU.
  if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")
  try:
    interpreting = _triton_interpreting()
    import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ValueError(f"backend='interpret' needs triton and torch (CPU build): {e}") from e
  if not interpreting:
    raise ValueError("backend='interpret' needs TRITON_INTERPRET=1 set before triton is "
                     "first imported")
  return _triton_backend(True)
