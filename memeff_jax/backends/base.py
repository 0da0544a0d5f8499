"""What a backend is: the ``Backend`` Protocol that ``_core`` and ``ring`` call, and
the first-order guard generated from it.

A backend computes one block's statistics and their gradient (docs/math.md §3; the
ring calls it once per hop, §9):
``fwd_stats`` the row (and column) log-sum-exps and maxima, ``bwd`` the rows'
gradient from them, ``bwd_pair`` both towers' from one pass where ``pairs`` says so,
``fwd_floor`` the lse above which a bounded forward is exact (None: exact only), and
``default_config`` the ``KernelConfig`` a call with ``config=None`` gets. The
methods marked ``@launches`` run kernels; ``first_order_only`` wraps exactly those.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

import jax


def launches(fn: Callable) -> Callable:
  """Marks a ``Backend`` method that launches kernels (the guard wraps it)."""
  fn.__launches__ = True
  return fn


@runtime_checkable
class Backend(Protocol):
  """One block's statistics and gradient; see ``_core`` for the contract (shapes,
  ``spec``, ``offsets``, ``masks``). Backends are frozen, hashable dataclasses: the
  ``BlockSpec`` that holds one keys the cached custom_vjp."""

  name: str

  def default_config(self, d: int, dtype) -> Any:
    """The KernelConfig a block of feature size ``d`` gets with ``config=None``."""

  def fwd_floor(self, x, scale, spec) -> jax.Array | None:
    """None where the forward is exact only; else the lse floor of ``bounded=True``."""

  def pairs(self, x, y, spec) -> bool:
    """Whether ``bwd_pair`` serves this block (when both towers need a gradient)."""

  @launches
  def fwd_stats(self, x, y, scale, *, row_thr, x_tab, y_tab, masks, offsets, spec,
                bounded=False) -> tuple:
    """``(lse_row, lse_col, max_row, max_col)`` of the block (column ones: two_sided)."""

  @launches
  def bwd(self, x, y, scale, *, row, col, x_tab, y_tab, masks, offsets, spec, want_cs,
          out_dtype) -> tuple:
    """``(dx, cs)``: the rows' gradient and (want_cs) their sums ``sum_j c_ij s_ij``."""

  @launches
  def bwd_pair(self, x, y, scale, *, row, col, x_tab, y_tab, masks, offsets, spec, want_cs,
               out_dtype) -> tuple:
    """``(dx, cs_x, dy, cs_y)`` from one set of coefficients; ``want_cs`` and
    ``out_dtype`` are pairs (x, y)."""


@runtime_checkable
class DenseBackend(Protocol):
  """A backend whose unit is a whole loss (``backend="reference"``): the chain hands
  it the validated call and the family's dense oracle instead of building the loss
  from block statistics."""

  def dense_loss(self, oracle: Callable, arrays, *, dims, weights, axis_name,
                 **options) -> tuple:
    """``(loss, stats)`` of ``oracle`` (a reference ``*_with_stats``) on ``arrays``."""


# The Protocol's kernel-launching methods, read off the Protocol (listed nowhere else).
LAUNCHING = tuple(k for k, v in vars(Backend).items() if getattr(v, "__launches__", False))


@dataclasses.dataclass(frozen=True)
class FirstOrderOnly:
  """A backend whose launches refuse ``vmap`` and forward-mode differentiation with a
  clear error: ``triton_call`` and the interpreter's ``pure_callback`` have neither
  rule. First-order ``jax.grad`` never needs one (the custom_vjp in ``_core`` calls the
  kernels on plain values); ``jax.vmap`` / ``jax.jacrev`` (batching) and grad-of-grad /
  ``jax.hessian`` (a JVP of the gradient kernels) would. Every other member is the
  inner backend's."""

  inner: Any

  def __getattr__(self, attr):
    if attr == "inner":   # (not set yet: copy / unpickling)
      raise AttributeError(attr)
    return getattr(self.inner, attr)


def _guarded(method: str):
  def call(self, *args, **kwargs):
    return _refuse_transforms(getattr(self.inner, method), self.inner.name, args, kwargs)
  call.__name__ = call.__qualname__ = method
  call.__doc__ = getattr(Backend, method).__doc__
  return call


for _method in LAUNCHING:
  setattr(FirstOrderOnly, _method, _guarded(_method))


def first_order_only(backend: Backend) -> FirstOrderOnly:
  """``backend`` with its ``LAUNCHING`` methods guarded (see ``FirstOrderOnly``)."""
  return FirstOrderOnly(backend)


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
