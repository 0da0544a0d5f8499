"""Backend resolution at trace time: "auto" | "triton" | "interpret" | "blockwise" |
"reference". The only module that imports the kernels, lazily."""

from __future__ import annotations

import functools
import os
import sys

import jax

from memeff_jax._validation import check_backend
from memeff_jax.blockwise import BlockwiseBackend


@functools.cache
def _triton_backend(interpret: bool):
  from memeff_jax.kernels import launch  # pylint: disable=g-import-not-at-top
  return launch.TritonBackend(interpret=interpret)


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
    return f"jax-triton does not import ({e}); pip install 'memeff-jax[gpu]'"
  if _triton_interpreting():
    return "triton was imported with TRITON_INTERPRET=1 (interpreter mode)"
  return None


def resolve(backend: str):
  """The backend object for ``backend``; None means the dense reference."""
  check_backend(backend)
  if backend == "reference":
    return None
  if backend == "blockwise":
    return BlockwiseBackend()
  if backend == "auto":
    return BlockwiseBackend() if _gpu_triton_error() else _triton_backend(False)
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
