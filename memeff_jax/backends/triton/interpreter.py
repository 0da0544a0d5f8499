"""Triton's interpreter as a launch target (``backend="interpret"``): the same kernel
and arguments, run on the host inside a ``jax.pure_callback`` on torch CPU tensors,
plus the interpreter's bf16 dot fix."""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from memeff_jax import _compat


def _to_torch(a):
  import torch  # pylint: disable=g-import-not-at-top
  a = np.array(a)   # a writable copy: torch refuses read-only buffers
  if a.dtype == jnp.bfloat16:
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(a)


def _from_torch(t, dtype):
  import torch  # pylint: disable=g-import-not-at-top
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(jnp.bfloat16)
  return t.numpy().astype(dtype, copy=False)


def _torch_dtype(dtype):
  import torch  # pylint: disable=g-import-not-at-top
  return {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.float16): torch.float16,
          jnp.dtype(jnp.bfloat16): torch.bfloat16}[jnp.dtype(dtype)]


@functools.cache
def _fix_interpreter_bf16_dot() -> None:
  """Triton's interpreter (3.6-3.9) multiplies bf16 dot operands as their raw uint16
  storage. Widen them to fp32 first: exact for bf16 values, and what the tensor
  cores do (exact products, fp32 accumulation). Other dtypes are untouched."""
  import triton.language as tl  # pylint: disable=g-import-not-at-top
  from triton.runtime import interpreter  # pylint: disable=g-import-not-at-top
  builder = type(interpreter.interpreter_builder)
  original = builder.create_dot

  def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
      a, b = (interpreter.TensorHandle(
          interpreter._convert_float(h.data, tl.bfloat16, tl.float32, None).view(np.float32),
          tl.float32) if h.dtype.scalar == tl.bfloat16 else h for h in (a, b))
    return original(self, a, b, d, input_precision, max_num_imprecise_acc)

  builder.create_dot = create_dot


# The interpreter patches triton.language globally while a kernel runs: one at a
# time (several host devices call back from several threads).
_INTERPRETER_LOCK = threading.Lock()


def interpret_call(kernel, args, out_shapes, grid, constexprs):
  """The same launch, run by Triton's interpreter on the host."""
  _fix_interpreter_bf16_dot()

  def host(*vals):
    import torch  # pylint: disable=g-import-not-at-top
    from triton.tools.tensor_descriptor import TensorDescriptor  # pylint: disable=g-import-not-at-top
    it = iter(vals)
    full = [a if isinstance(a, int) else _to_torch(next(it)) for a in args]
    full = [TensorDescriptor.from_tensor(t, list(a.block)) if isinstance(a, _compat.Tiles)
            else t for a, t in zip(args, full)]
    # Poisoned outputs: an element the kernel forgets to write shows up as NaN.
    outs = [torch.full(s.shape, float("nan"), dtype=_torch_dtype(s.dtype)) for s in out_shapes]
    with _INTERPRETER_LOCK:
      kernel[grid](*full, *outs, **constexprs)
    return tuple(_from_torch(o, s.dtype) for o, s in zip(outs, out_shapes))

  return jax.pure_callback(host, tuple(out_shapes), *_compat.arrays(args))
