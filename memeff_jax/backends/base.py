"""What a backend is: the ``Backend`` Protocol that ``_core`` and ``ring`` call, and
the first-order guard generated from it.

A backend computes one block's statistics and their gradient (docs/math.md §3; the
ring calls it once per hop, §9), on the block's traced operands (``Block``) and its
static options (``_core.BlockSpec``):
``fwd_stats`` the row (and column) log-sum-exps and maxima, ``bwd`` the rows'
gradient from them, ``bwd_pair`` both towers' from one pass where ``pairs`` says so,
``fwd_grad`` the statistics and that gradient at once where ``fuses`` says so,
``fwd_rows`` the row statistics and the rows' gradient at once where ``fuses_rows`` says so,
``fwd_floor`` the lse above which a bounded forward is exact (None: exact only), and
``default_config`` the ``KernelConfig`` a call with ``config=None`` gets. The
methods marked ``@launches`` run kernels; ``first_order_only`` wraps exactly those.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp


def launches(fn: Callable) -> Callable:
  """Marks a ``Backend`` method that launches kernels (the guard wraps it)."""
  fn.__launches__ = True
  return fn


class Block(NamedTuple):
  """One block's operands as a backend sees them (one ring hop: this device's rows
  against the visiting columns). A pytree of arrays (None where absent), so the
  first-order guard passes it through like any argument.

  x: [n, d] rows; y: [m, d] columns (a symmetric block: y is x).
  x_tab / y_tab: Matryoshka inverse-norm tables [K, n] / [K, m], or None (plain block).
  x_mask / y_mask: ``where`` bool row masks [n] / [m], both or neither.
  offsets: the global index of the first row and of the first column (``exclude_self``
  compares them); ints, or int32 scalars inside a ring.
  bias: the reduction's 0-d logit bias (``Reduction.biased``: the sigmoid's), or None;
  with one, ``bwd`` also returns the rows' sums ``sum_j c_ij`` (its gradient).
  """

  x: jax.Array
  y: jax.Array
  x_tab: jax.Array | None = None
  y_tab: jax.Array | None = None
  x_mask: jax.Array | None = None
  y_mask: jax.Array | None = None
  offsets: tuple = (0, 0)
  bias: jax.Array | None = None

  @property
  def masks(self) -> tuple | None:
    """``(x_mask, y_mask)``, or None without ``where``."""
    return None if self.x_mask is None else (self.x_mask, self.y_mask)

  def transposed(self) -> "Block":
    """The same block with rows and columns swapped (the columns' gradient pass)."""
    return Block(self.y, self.x, self.y_tab, self.x_tab, self.y_mask, self.x_mask,
                 self.offsets[::-1], self.bias)


def scale_rows(dx, dtype) -> tuple:
  """A rows' gradient [n, d] (fp32) of inputs of ``dtype`` as ``Backend.fwd_rows`` saves
  it for the backward: ``(u, big)``, each row divided by its largest magnitude ``big``
  (fp32 [n, 1]; 1 for a row of zeros; a kernel may take a bound of it instead, a finite
  one, or the check reruns exactly), in float16 for 16-bit inputs, whose 11-bit
  significand makes this rounding a small fraction of the 16-bit one the gradient gets
  in the backward (bfloat16's 8 bits would double it), else in ``dtype``. A kernel may
  hand over chunks of its own: ``big`` [n, G] then scales chunk k, the features
  [k w, (k + 1) w), w the power of two >= d / G (``unscale_rows``)."""
  big = jnp.max(jnp.abs(dx), axis=1, keepdims=True)
  big = jnp.where(big > 0, big, 1.0)
  return (dx * (1.0 / big)).astype(rows_dtype(dtype)), big


def rows_dtype(dtype):
  """The dtype ``scale_rows`` saves a rows' gradient of inputs of ``dtype`` in."""
  return jnp.float16 if jnp.dtype(dtype).itemsize == 2 else jnp.dtype(dtype)


def unscale_rows(u, big):
  """The fp32 rows' gradient of ``scale_rows``' pair ``(u, big)`` (one fusion: no
  [n, d] buffer of the scales)."""
  d, chunks = u.shape[1], big.shape[1]
  width = 1 << (-(-d // chunks) - 1).bit_length()
  per_feature = jnp.repeat(big, width, axis=1, total_repeat_length=chunks * width)[:, :d]
  return u.astype(jnp.float32) * per_feature


class Side(NamedTuple):
  """One role's (rows' or columns') statistics for the gradient pass: the statistic as
  ``reduction.residual`` gives it (the softmax: log-normalizers with -inf replaced by
  +inf, so a fully masked softmax contributes exact zeros), cotangents, and thresholds
  (or None)."""

  lse: jax.Array                # the residual statistic (named for the softmax's)
  g: jax.Array
  thr: jax.Array | None


@runtime_checkable
class Backend(Protocol):
  """One block's statistics and gradient; see ``_core`` for the contract (shapes,
  ``spec``) and ``Block`` for the operands. Backends are frozen, hashable dataclasses:
  the ``BlockSpec`` that holds one keys the cached custom_vjp."""

  name: str

  def default_config(self, d: int, dtype) -> Any:
    """The KernelConfig a block of feature size ``d`` gets with ``config=None``."""

  def fwd_floor(self, x, scale, spec) -> jax.Array | None:
    """None where the forward is exact only; else the lse floor of ``bounded=True``."""

  def pairs(self, x, y, spec) -> bool:
    """Whether ``bwd_pair`` serves this block (when both towers need a gradient)."""

  @launches
  def fwd_stats(self, block: Block, scale, *, row_thr, spec, bounded=False) -> tuple:
    """``(lse_row, lse_col, max_row, max_col)`` of the block (column ones: two_sided):
    the statistics of ``spec.reduction`` (on the logits plus ``block.bias``) and the
    maxima of the unbiased logits; ``row_thr``: the rows' thresholds [n] ([K, n] with
    dims), or None."""

  @launches
  def bwd(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype) -> tuple:
    """``(dx, cs)``: the rows' gradient and (want_cs) their sums ``sum_j c_ij s_ij``,
    from the rows' and columns' ``Side`` statistics (either may be None); with a
    ``block.bias``, ``(dx, cs, csum)``, csum the rows' sums ``sum_j c_ij``."""

  def fuses(self, x, y, spec) -> bool:
    """Whether ``fwd_grad`` serves this block (``_core`` asks where the reduction is
    ``local``, on one device, with both towers training)."""

  @launches
  def fwd_grad(self, block: Block, scale, *, spec, want_cs) -> tuple:
    """``(lse_row, max_row, dx, cs, dy, csum)``: ``fwd_stats``'s row statistics and, from
    the same tiles, ``bwd_pair``'s gradients of both towers for a unit cotangent on
    every row, fp32 (cs where ``want_cs``, else None; csum: a biased block's rows' sums
    of c, else None)."""

  def fuses_rows(self, x, y, spec, *, y_trains: bool) -> bool:
    """Whether ``fwd_rows`` serves this block (``_core`` asks for a plain one-sided
    softmax block on one device whose rows train; ``y_trains``: its columns too, so
    that ``bwd_pair`` could serve both towers instead)."""

  @launches
  def fwd_rows(self, block: Block, scale, *, row_thr, spec, want_cs) -> tuple:
    """``(lse_row, max_row, dx, dx_big, cs, l)``: ``fwd_stats``'s row statistics,
    bounded (the caller checks ``fwd_floor``), and from the same tiles the rows'
    gradient for a unit cotangent on every row times l, ``l_i scale sum_j P_ij y_j``, as
    the pair ``(dx, dx_big)`` of ``scale_rows``; ``cs_i = l_i sum_j P_ij s_ij`` (fp32, None
    unless ``want_cs``), P the rows' softmax, l fp32 [n] > 0 for every row that keeps an
    entry (a kernel's unnormalized sums)."""

  @launches
  def bwd_pair(self, block: Block, scale, *, row, col, spec, want_cs, out_dtype) -> tuple:
    """``(dx, cs_x, dy, cs_y)`` from one set of coefficients; ``want_cs`` and
    ``out_dtype`` are pairs (x, y); with a ``block.bias``, ``(dx, cs_x, dy, cs_y,
    csum)``, csum the rows' sums ``sum_j c_ij``."""


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
