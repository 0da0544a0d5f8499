"""Version shims: JAX's varying-axis casts, jax-triton's triton_call, its TMA
descriptors and its launch width for warp-specialized kernels."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Any

import jax
from jax import lax


def to_varying(v, axis_name):
  """Mark device-invariant values (a pytree) as varying over ``axis_name``."""
  def one(a):
    if axis_name is None or axis_name in varying_axes(a):
      return a
    if hasattr(lax, "pcast"):
      return lax.pcast(a, axis_name, to="varying")
    return lax.pvary(a, axis_name)  # jax < 0.8
  return jax.tree.map(one, v)


def vary_like(v, *refs):
  """``v`` made varying over every manual axis any of ``refs`` varies over (so a
  fresh loop carry matches the values the loop body produces)."""
  axes = set()
  for r in jax.tree.leaves(refs):
    axes |= varying_axes(r)
  for axis in sorted(axes, key=str):
    v = to_varying(v, axis)
  return v


def varying_axes(v) -> frozenset:
  """The manual mesh axes over which ``v`` differs between devices."""
  aval = jax.typeof(v)
  mat = getattr(aval, "manual_axis_type", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", ()))


@functools.cache
def _triton_call_kwarg() -> str:
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  params = inspect.signature(jt.triton_call).parameters
  return "out_type" if "out_type" in params else "out_shape"  # renamed in jax-triton 0.4


@dataclasses.dataclass(frozen=True)
class Tiles:
  """A kernel argument: the row-major [n, d] array ``base`` read through a TMA tensor
  descriptor in blocks of ``block`` = (rows, features)."""

  base: Any
  block: tuple[int, int]


def arrays(args) -> list:
  """The arrays behind a launch's arguments: a ``Tiles``'s base, ints left out."""
  return [a.base if isinstance(a, Tiles) else a for a in args if not isinstance(a, int)]


@functools.cache
def tma_descriptors(interpret: bool) -> bool:
  """Whether ``Tiles`` arguments can be launched: under Triton's interpreter, or on a
  GPU of compute capability >= 9.0 with jax-triton >= 0.4 (host-side descriptors,
  ``jax_triton.TensorDescriptor``; 0.3.x has none)."""
  try:
    if interpret:
      import triton.tools.tensor_descriptor  # pylint: disable=g-import-not-at-top,unused-import
      return True
    import jax_triton as jt  # pylint: disable=g-import-not-at-top
    major = int(str(jax.devices()[0].compute_capability).split(".")[0])
  except (ImportError, AttributeError, RuntimeError, ValueError):
    return False
  return hasattr(jt, "TensorDescriptor") and major >= 9


def triton_call(*args, kernel, out_shapes, grid, name, num_warps, num_stages, **constexprs):
  """``jax_triton.triton_call`` across 0.3.x (``out_shape=``) and 0.4 (``out_type=``).

  Only ints are passed as Python scalars (both versions map them alike); float
  hyperparameters travel as fp32 arrays; ``Tiles`` become host-side descriptors.
  """
  import jax_triton as jt  # pylint: disable=g-import-not-at-top
  _launch_compiled_warps()
  assert not any(isinstance(a, float) for a in args), "pass floats as fp32 arrays"
  args = [jt.TensorDescriptor.from_array(a.base, a.block) if isinstance(a, Tiles) else a
          for a in args]
  return jt.triton_call(*args, kernel=kernel, grid=grid, name=name, num_warps=num_warps,
                        num_stages=num_stages, **{_triton_call_kwarg(): out_shapes},
                        **constexprs)


def compiled_warps(binary, num_warps: int) -> int:
  """The warps a kernel must be launched with: its PTX's ``.reqntid`` / 32 where the
  compiled kernel asks for a width of its own (a warp-specialized kernel counts every
  partition's warps: 4 asked, 12 compiled for a Hopper producer and two consumer
  warp groups), else ``num_warps``."""
  if isinstance(binary, str):
    found = re.search(r"^\s*\.reqntid\s+(\d+)", binary, re.MULTILINE)
    if found and int(found.group(1)) % 32 == 0:
      return int(found.group(1)) // 32
  return num_warps


class _CompiledWarps:
  """jaxlib's ``gpu_triton`` as jax-triton sees it, except that ``TritonKernel`` (name,
  num_warps, num_ctas, shared memory, binary, ...; 0.3.1 and 0.4 alike) launches with
  ``compiled_warps``: jax-triton passes the ``num_warps`` it was called with, which a
  warp-specialized kernel's launch must not use (CUDA refuses a launch narrower than
  ``.reqntid``). Every other kernel launches as before."""

  def __init__(self, lib):
    self._lib = lib

  def __getattr__(self, name):
    return getattr(self._lib, name)

  def TritonKernel(self, name, num_warps, *rest):  # pylint: disable=invalid-name
    return self._lib.TritonKernel(name, compiled_warps(rest[2], num_warps), *rest)


@functools.cache
def _launch_compiled_warps() -> None:
  """Route jax-triton's kernel construction through ``_CompiledWarps`` (in memory, once;
  jaxlib's own Pallas launches are left alone)."""
  from jax_triton import triton_lib  # pylint: disable=g-import-not-at-top
  lib = getattr(triton_lib, "triton_kernel_call_lib", None)
  if lib is not None and not isinstance(lib, _CompiledWarps):
    triton_lib.triton_kernel_call_lib = _CompiledWarps(lib)
