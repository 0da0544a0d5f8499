"""The backends by name: the one place their public names live, and ``resolve``.

``BackendName`` is the ``backend=`` Literal of every public signature; ``NAMES`` is
derived from it. "auto" is a rule, not a backend: Triton on a GPU where jax-triton
imports, else blockwise (float64 features: blockwise). Every other name has a factory,
imported only when resolved, so ``import memeff_jax`` never imports ``triton`` or
``jax_triton`` (jax-triton 0.3.x raises on import without a GPU jaxlib).
"""

from __future__ import annotations

import functools
import os
import sys
import typing
import warnings
from typing import Callable, Literal

import jax
import jax.numpy as jnp

from memeff_jax.backends.base import Backend, first_order_only

BackendName = Literal["auto", "triton", "interpret", "blockwise", "reference"]
NAMES: tuple[str, ...] = typing.get_args(BackendName)


def _blockwise() -> Backend:
  from memeff_jax.backends.blockwise import BlockwiseBackend  # pylint: disable=g-import-not-at-top
  return BlockwiseBackend()


def _reference() -> Backend:
  from memeff_jax.backends.reference import ReferenceBackend  # pylint: disable=g-import-not-at-top
  return ReferenceBackend()


@functools.cache
def _triton(interpret: bool) -> Backend:
  # pylint: disable-next=g-import-not-at-top
  from memeff_jax.backends.triton.backend import TritonBackend
  return first_order_only(TritonBackend(interpret=interpret))


# name -> factory of its backend object (every name but "auto").
FACTORIES: dict[str, Callable[[], Backend]] = {
    "triton": lambda: _triton(False),
    "interpret": lambda: _triton(True),
    "blockwise": _blockwise,
    "reference": _reference,
}
assert set(FACTORIES) | {"auto"} == set(NAMES), "every name but 'auto' has a factory"


def check(backend) -> str:
  """``backend`` if it is one of ``NAMES``, else ValueError naming them."""
  if backend not in NAMES:
    raise ValueError(f"backend={backend!r}; expected one of {NAMES}")
  return backend


def _triton_interpreting() -> bool:
  import triton  # pylint: disable=g-import-not-at-top
  return bool(triton.knobs.runtime.interpret)


def _gpu_triton_error() -> str | None:
  """None if the triton backend can run here, else why not."""
  if jax.default_backend() != "gpu":
    return f"it needs a CUDA GPU; JAX's default backend is {jax.default_backend()!r}"
  try:
    from memeff_jax import _compat  # pylint: disable=g-import-not-at-top
    _compat.jax_triton()
  except ImportError as e:
    return f"jax-triton does not import ({e}); from the checkout: pip install -e '.[gpu]'"
  if _triton_interpreting():
    return "triton was imported with TRITON_INTERPRET=1 (interpreter mode)"
  return None


def _interpret_error() -> str | None:
  """None if the interpreter can run the kernels here, else why not. Sets
  TRITON_INTERPRET=1 where triton is not imported yet."""
  if "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")
  try:
    interpreting = _triton_interpreting()
    import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"backend='interpret' needs triton and torch (CPU build): {e}"
  if not interpreting:
    return "backend='interpret' needs TRITON_INTERPRET=1 set before triton is first imported"
  return None


@functools.cache
def _warn_auto_blockwise(why: str) -> None:
  """Once a process (a reason): "auto" on a GPU without the Triton kernels runs blockwise,
  several times slower, which a GPU user would not guess."""
  warnings.warn(f"backend='auto' runs the pure-JAX blockwise backend on this GPU, not the "
                f"Triton kernels: {why}. Pass backend='blockwise' to choose it (and silence "
                f"this), or backend='triton' to raise instead", RuntimeWarning)


def resolve(backend: str, dtype=jnp.float32, shape: tuple = ()) -> Backend:
  """The backend object for ``backend`` and input ``dtype``. The Triton kernels compute
  in fp16 / bf16 / fp32: for float64 "auto" is blockwise, and "triton" / "interpret"
  raise TypeError. A ``shape`` with a symbolic size (``jax.export``'s shape
  polymorphism) raises ValueError but on "reference": the others tile by the sizes."""
  check(backend)
  symbolic = [d for d in shape if not isinstance(d, int)]
  if symbolic and backend != "reference":
    raise ValueError(f"backend={backend!r} needs concrete array sizes to tile by, got the "
                     f"symbolic size {symbolic[0]} (jax.export shape polymorphism): export "
                     f"at concrete sizes, or pass backend='reference' (the dense loss, "
                     f"O(batch^2) memory)")
  wide = jnp.dtype(dtype) == jnp.float64
  if backend == "auto":
    why = None if wide else _gpu_triton_error()
    if why and jax.default_backend() == "gpu":
      _warn_auto_blockwise(why)
    return FACTORIES["blockwise" if wide or why else "triton"]()
  if backend in ("triton", "interpret") and wide:
    raise TypeError(f"backend={backend!r} computes in float16, bfloat16 or float32, got "
                    f"float64 features: use backend='blockwise' or 'reference' (or cast)")
  if backend == "triton":
    why = _gpu_triton_error()
    if why:
      raise ValueError(f"backend='triton' is unavailable: {why}")
  if backend == "interpret":
    # The same kernels and launch code under Triton's interpreter, on CPU.
    why = _interpret_error()
    if why:
      raise ValueError(why)
  return FACTORIES[backend]()
